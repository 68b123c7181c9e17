"""`dlrm-scale simulate`: what a plan costs per rank, phase and step, before running it.

The embedding part is exactly what the planner optimised (planner.views.scoring with the same cost
model); the dense part adds the MLPs' compute and DDP's gradient all-reduce
(planner.cost.cost_model.dense_compute_ms, value_passes_ms, dense_update_ms, all_reduce_ms), the host's framework
work, and what of the replicas' all-reduce the sharded backward hides (hidden_all_reduce_ms).
Each rank's time is split into the phases the trainer times (dlrm_scale.training.phases),
grouped as PHASE_GROUPS says, so a prediction and a run's metrics.jsonl compare phase by phase.
A step waits for the busiest rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

from dlrm_scale.run_config import ModelConfig, TrainConfig
from dlrm_scale.run_record import COLLECTIVE_GROUPS, PHASE_GROUPS
from planner.cost.cost_model import AnalyticCostModel, CostModel, all_reduce_ms, dense_compute_ms, dense_overhead_ms, dense_update_ms, embedding_collectives_ms, hidden_all_reduce_ms, host_overhead_ms, replica_all_reduces, replica_update_ms, value_passes_ms
from planner.plan.document import Plan
from planner.views.scoring import costed_options
from planner.spec.specs import GIB, TableSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import TIERS, Storage

@dataclass(frozen=True)
class RankSimulation:
    rank: int
    phases_ms: dict[str, float]  # by PHASE_GROUPS key
    memory: Storage

    @property
    def step_ms(self) -> float:
        return sum(self.phases_ms.values())


class BackwardOverlap(NamedTuple):
    """The two sides of the overlap cost_model.hidden_all_reduce_ms prices, kept apart so a fit
    can tell which side bounds it."""

    replica_all_reduce_ms: float  # the replicas' gradient all-reduce (every rank's)
    sharded_backward_ms: tuple[float, ...]  # per rank: its sharded lookups' backward

    @property
    def hidden_ms(self) -> float:
        return hidden_all_reduce_ms(self.replica_all_reduce_ms, self.sharded_backward_ms)


@dataclass(frozen=True)
class Simulation:
    ranks: tuple[RankSimulation, ...]  # each rank's all_reduce net of overlap.hidden_ms
    global_batch: int
    overlap: BackwardOverlap

    @property
    def step_ms(self) -> float:
        """Each collective is a barrier, so every phase group waits for its slowest rank."""
        return sum(max(r.phases_ms[g] for r in self.ranks) for g in PHASE_GROUPS)

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_ms * 1e3

    def to_dict(self) -> dict:
        return {
            "step_ms": self.step_ms,
            "samples_per_s": self.samples_per_s,
            "ranks": [{"rank": r.rank, "step_ms": r.step_ms, "phases_ms": r.phases_ms, "memory_bytes": r.memory.as_dict()}
                      for r in self.ranks],
        }

    def format(self) -> str:
        lines = [f"{'rank':>5} {'step ms':>9} " + " ".join(f"{g:>10}" for g in PHASE_GROUPS) + " "
                 + " ".join(f"{t + ' GiB':>9}" for t in TIERS)]
        for r in self.ranks:
            lines.append(f"{r.rank:>5} {r.step_ms:>9.3f} " + " ".join(f"{r.phases_ms[g]:>10.3f}" for g in PHASE_GROUPS) + " "
                         + " ".join(f"{r.memory.of_tier(t) / GIB:>9.3f}" for t in TIERS))
        lines.append(f"predicted step {self.step_ms:.3f} ms, {self.samples_per_s:,.0f} samples/s (global batch {self.global_batch})")
        return "\n".join(lines)


def simulate(plan: Plan, problem: PlanningProblem, model: ModelConfig, dense_optimizer: str = TrainConfig.dense_optimizer,
             cost_model: CostModel | None = None) -> Simulation:
    cluster, training = problem.cluster, problem.training
    cost_model = cost_model or AnalyticCostModel(cluster, training)
    world = plan.world_size
    phases = [dict.fromkeys(PHASE_GROUPS, 0.0) for _ in range(world)]
    storage = [Storage() for _ in range(world)]
    replica_reduce, backward = 0.0, [0.0] * world
    for name, option in costed_options(plan, problem, cost_model):
        replica = plan.tables[name].sharding_type == "data_parallel"
        shared = option.every_rank  # collective work only (cost_model.exchange_shares)
        if replica:  # every rank holds it alike and all-reduces its gradient once
            replica_reduce += option.shards[0].perf.bwd_comms_ms
        for p in phases:
            p["input_dist"] += shared.input_dist_ms
            p["a2a_fwd"] += shared.fwd_comms_ms
            p["a2a_bwd"] += shared.bwd_comms_ms
        for rank, shard, g in zip(plan.tables[name].ranks, option.shards, option.geometries):
            p, perf = phases[rank], shard.perf
            p["input_dist"] += perf.input_dist_ms
            p["a2a_fwd"] += perf.fwd_comms_ms
            p["embedding"] += perf.compute_ms
            if replica:
                update = replica_update_ms(g.rows, g.cols, training.embedding_optimizer, cluster)
                p["embedding"] -= update
                p["dense"] += update
                p["all_reduce"] += perf.bwd_comms_ms
            else:
                p["a2a_bwd"] += perf.bwd_comms_ms
                backward[rank] += perf.bwd_compute_ms
            storage[rank] = storage[rank] + shard.storage
    dense = dense_cost(problem.tables, model)
    compute = (dense_compute_ms(dense.flops_per_sample * training.batch_size_per_rank, cluster.costs.dense_gflops)
               + value_passes_ms(dense.interaction_values_per_sample * training.batch_size_per_rank, cluster.costs.interaction_value_ns)
               + dense_update_ms(dense.params, 1, dense_optimizer, cluster.costs.tier_gb_per_s(cluster.device_tier), cluster.costs.dense_update_ns)
               + dense_overhead_ms(cluster))
    reduce = all_reduce_ms(4.0 * dense.params, cluster.world_size, cluster)
    host = host_overhead_ms(len(problem.tables), cluster)
    regroup = value_passes_ms(training.batch_size_per_rank * sum(t.outputs_per_sample * t.embedding_dim for t in problem.tables), cluster.costs.pooled_value_ns)
    # the embeddings' three collectives once per sharding type; DDP's all-reduce, and the replicas' own
    types = [t.sharding_type for t in plan.tables.values()]
    fixed = dict(zip((g for g in COLLECTIVE_GROUPS if g != "all_reduce"), embedding_collectives_ms(types, cluster)))  # in its order
    overlap = BackwardOverlap(replica_reduce, tuple(backward))
    for p in phases:
        p["dense"] += compute
        p["all_reduce"] += reduce + (1 + replica_all_reduces(types)) * cluster.costs.collective_latency_ms - overlap.hidden_ms
        p["other"] += host
        for group, ms in fixed.items():
            p[group] += ms
        p["a2a_fwd"] += regroup  # the timers charge SparseArch's regrouping to the all-to-all it ends
        p["a2a_bwd"] += regroup
    ranks = tuple(RankSimulation(r, phases[r], storage[r]) for r in range(world))
    return Simulation(ranks, training.batch_size_per_rank * cluster.world_size, overlap)


class DenseCost(NamedTuple):
    flops_per_sample: float  # training FLOPs: forward and twice that backward
    params: int
    interaction_values_per_sample: int  # the interaction's input: the dense vector and each pooled embedding


def dense_cost(tables: Sequence[TableSpec], config: ModelConfig) -> DenseCost:
    """The dense part's work (bottom MLP, interaction and top MLP, as build_model lays them out)."""
    dim = tables[0].embedding_dim
    bottom = [config.num_dense_features, *config.dense_arch] + ([] if config.dense_arch[-1] == dim else [dim])
    features = len(tables) + 1
    if config.arch == "dlrm":
        interaction_flops = 2 * dim * features * (features - 1) // 2
        top_in = dim + features * (features - 1) // 2
        cross_params = 0
    else:
        top_in = dim * features
        cross_params = config.dcn_num_layers * (2 * top_in * config.dcn_low_rank_dim + top_in)
        interaction_flops = 2 * cross_params
    top = [top_in, *config.over_arch]
    mlp = sum(a * b for a, b in zip(bottom, bottom[1:])) + sum(a * b for a, b in zip(top, top[1:]))
    params = mlp + sum(bottom[1:]) + sum(top[1:]) + cross_params
    return DenseCost(3.0 * (2 * mlp + interaction_flops), params, features * dim)

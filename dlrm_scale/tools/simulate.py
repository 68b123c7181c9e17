"""`dlrm-scale simulate`: what a plan costs per rank and per step, before running it.

The embedding part is exactly what the planner optimised (planner.scoring with the same cost
model); the dense part adds the MLPs' compute and DDP's gradient all-reduce
(planner.cost_model.dense_compute_ms, all_reduce_ms). A step waits for the busiest rank.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from dlrm_scale.run_config import ModelConfig
from planner.cost_model import AnalyticCostModel, all_reduce_ms, dense_compute_ms, framework_overhead_ms
from planner.plan import Plan
from planner.scoring import rank_breakdown
from planner.specs import GIB, PlanningProblem, TableSpec
from planner.types import TIERS, Perf, Storage


@dataclass(frozen=True)
class RankSimulation:
    rank: int
    embedding: Perf
    dense_compute_ms: float
    dense_all_reduce_ms: float
    overhead_ms: float
    memory: Storage

    @property
    def step_ms(self) -> float:
        return self.embedding.total_ms + self.dense_compute_ms + self.dense_all_reduce_ms + self.overhead_ms


@dataclass(frozen=True)
class Simulation:
    ranks: tuple[RankSimulation, ...]
    global_batch: int

    @property
    def step_ms(self) -> float:
        return max(r.step_ms for r in self.ranks)

    @property
    def samples_per_s(self) -> float:
        return self.global_batch / self.step_ms * 1e3

    def to_dict(self) -> dict:
        return {
            "step_ms": self.step_ms,
            "samples_per_s": self.samples_per_s,
            "ranks": [
                {
                    "rank": r.rank,
                    "step_ms": r.step_ms,
                    "embedding_ms": {"fwd_compute": r.embedding.fwd_compute_ms, "bwd_compute": r.embedding.bwd_compute_ms,
                                     "fwd_comms": r.embedding.fwd_comms_ms, "bwd_comms": r.embedding.bwd_comms_ms},
                    "dense_compute_ms": r.dense_compute_ms,
                    "dense_all_reduce_ms": r.dense_all_reduce_ms,
                    "overhead_ms": r.overhead_ms,
                    "memory_bytes": r.memory.as_dict(),
                }
                for r in self.ranks
            ],
        }

    def format(self) -> str:
        lines = [f"{'rank':>5} {'step ms':>9} {'emb fwd':>8} {'emb bwd':>8} {'a2a fwd':>8} {'a2a bwd':>8} {'dense':>8} {'allred':>8} {'other':>8} "
                 + " ".join(f"{t + ' GiB':>9}" for t in TIERS)]
        for r in self.ranks:
            e = r.embedding
            lines.append(
                f"{r.rank:>5} {r.step_ms:>9.3f} {e.fwd_compute_ms:>8.3f} {e.bwd_compute_ms:>8.3f} {e.fwd_comms_ms:>8.3f} "
                f"{e.bwd_comms_ms:>8.3f} {r.dense_compute_ms:>8.3f} {r.dense_all_reduce_ms:>8.3f} {r.overhead_ms:>8.3f} "
                + " ".join(f"{r.memory.of_tier(t) / GIB:>9.3f}" for t in TIERS)
            )
        lines.append(f"predicted step {self.step_ms:.3f} ms, {self.samples_per_s:,.0f} samples/s (global batch {self.global_batch})")
        return "\n".join(lines)


def simulate(plan: Plan, problem: PlanningProblem, model: ModelConfig) -> Simulation:
    cluster, training = problem.cluster, problem.training
    perf, storage = rank_breakdown(plan, problem, AnalyticCostModel(cluster, training))
    flops_per_sample, params = dense_cost(problem.tables, model)
    compute = dense_compute_ms(flops_per_sample * training.batch_size_per_rank, cluster.dense_gflops)
    reduce = all_reduce_ms(4.0 * params, cluster.world_size, cluster)
    other = framework_overhead_ms(len(problem.tables), cluster)
    ranks = tuple(RankSimulation(r, perf[r], compute, reduce, other, storage[r]) for r in range(plan.world_size))
    return Simulation(ranks, training.batch_size_per_rank * cluster.world_size)


def dense_cost(tables: Sequence[TableSpec], config: ModelConfig) -> tuple[float, int]:
    """Training FLOPs per sample (forward and twice that backward) and parameter count of the
    dense part: bottom MLP, interaction and top MLP, as build_model lays them out."""
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
    return 3.0 * (2 * mlp + interaction_flops), params

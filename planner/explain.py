"""Why a plan is what it is: the critical rank and its breakdown, and for each table its
chosen option against the best alternatives, each forced into the plan with every other table
left where it is (`dlrm-scale explain`).

Forcing an alternative removes the table's shards from their ranks and places the
alternative's as the planner would (every rank, one node's ranks, or longest shard first onto
the least-loaded rank with room); the figure is the busiest rank of the plan that results, or
the tier that runs out of memory. Options the config's constraints forbid are forced too, and
say which constraint forbids them: the price of that constraint.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from planner.assignment import RankLoads, rank_capacities
from planner.candidates import enumerate_options
from planner.constraints import Constraints
from planner.cost_model import CostModel
from planner.greedy import lpt_into
from planner.plan import Plan
from planner.report import rank_list
from planner.scoring import costed_options
from planner.specs import ClusterSpec, PlanningProblem
from planner.types import TIERS, Placement, ShardingOption

ALTERNATIVES_SHOWN = 4


@dataclass(frozen=True)
class Forced:
    """The plan with one table's option replaced."""

    option: ShardingOption
    ranks: list[int] | None  # where the planner would put its shards; None: it does not fit
    max_rank_ms: float | None
    binds: str  # what limits it: the busiest rank, or the tier that overflows


@dataclass(frozen=True)
class TableExplanation:
    name: str
    chosen: ShardingOption
    ranks: list[int]
    on_critical_rank_ms: float  # the chosen shards' time on the plan's busiest rank
    alternatives: list[Forced]  # best first


@dataclass(frozen=True)
class Explanation:
    max_rank_ms: float
    critical_rank: int
    critical_breakdown: dict[str, float]  # ms by phase on the critical rank
    critical_tables: list[tuple[str, float]]  # the critical rank's largest contributors, ms
    tables: list[TableExplanation]

    def format(self) -> str:
        lines = [f"busiest rank {self.critical_rank}: {self.max_rank_ms:.4f} ms/step ("
                 + ", ".join(f"{k} {v:.4f}" for k, v in self.critical_breakdown.items()) + ")",
                 "  its largest tables: " + ", ".join(f"{n} {ms:.4f} ms" for n, ms in self.critical_tables)]
        for t in self.tables:
            lines.append(f"{t.name}: {t.chosen.label} ({t.chosen.compute_kernel}, {t.chosen.tier}) on ranks "
                         f"{rank_list(t.ranks)}; {t.on_critical_rank_ms:.4f} ms on the busiest rank")
            for f in t.alternatives:
                effect = (f"busiest rank {f.max_rank_ms:.4f} ms ({f.max_rank_ms - self.max_rank_ms:+.4f})"
                          if f.max_rank_ms is not None else "does not fit")
                where = f"on {rank_list(f.ranks)}" if f.ranks is not None else ""
                lines.append(f"    instead {f.option.label:<24} {f.option.compute_kernel:<18} {where:<10} {effect}; {f.binds}")
            if not t.alternatives:
                lines.append("    no other option for this table")
        return "\n".join(lines)


def same_layout(a: ShardingOption, b: ShardingOption) -> bool:
    return (a.sharding_type, a.compute_kernel, a.tier, len(a.shards), a.cache_fraction) == \
        (b.sharding_type, b.compute_kernel, b.tier, len(b.shards), b.cache_fraction)


def place_one(option: ShardingOption, loads: RankLoads, caps: np.ndarray, cluster: ClusterSpec) -> list[int] | None:
    """Ranks for `option`'s shards given the other tables' loads, as the planner places them."""
    world, local = cluster.world_size, cluster.ranks_per_node
    if option.placement is Placement.EVERY_RANK:
        ranks = list(range(world))
        return ranks if np.all(loads.bytes[ranks] + option.shard_bytes <= caps) else None
    nodes = sorted(range(cluster.num_nodes), key=lambda n: (loads.ms[n * local:(n + 1) * local].sum(), n))
    if option.placement is Placement.NODE_RANKS:
        for node in nodes:
            ranks = [node * local + i for i in range(len(option.shards))]
            if np.all(loads.bytes[ranks] + option.shard_bytes <= caps):
                return ranks
        return None
    if option.placement is Placement.ONE_NODE:
        for node in nodes:
            ranks = lpt_into(option, list(range(node * local, (node + 1) * local)), loads, caps)
            if ranks is not None:
                return ranks
        return None
    return lpt_into(option, list(range(world)), loads, caps)


def force(option: ShardingOption, others: RankLoads, caps: np.ndarray, cluster: ClusterSpec) -> Forced:
    ranks = place_one(option, others, caps, cluster)
    if ranks is None:
        after = others.bytes.sum(axis=0) + option.shard_bytes.sum(axis=0)
        short = [t for i, t in enumerate(TIERS) if after[i] > caps[i] * cluster.world_size] or [
            t for i, t in enumerate(TIERS) if option.shard_bytes[:, i].max() > 0]
        return Forced(option, None, None, f"{short[0] if short else 'memory'} has no room for its shards")
    ms = others.ms.copy()
    np.add.at(ms, ranks, option.shard_ms)
    busiest = int(ms.argmax())
    return Forced(option, ranks, float(ms.max()), f"binds on rank {busiest}")


def forbidden_or(forced: Forced, constraints: Constraints | None, table: str) -> Forced:
    """`forced`, saying which constraint forbids its option where one does."""
    rule = constraints.forbidding(table, forced.option) if constraints is not None else None
    return forced if rule is None else replace(forced, binds=f"forbidden by {rule.describe()}")


def explain(plan: Plan, problem: PlanningProblem, cost_model: CostModel, table: str | None = None) -> Explanation:
    cluster = problem.cluster
    costed = dict(costed_options(plan, problem, cost_model))
    loads = RankLoads.empty(plan.world_size)
    for name, option in costed.items():
        loads.add(option, plan.tables[name].ranks)
    critical = int(loads.ms.argmax())
    phases = {"fwd_compute": 0.0, "fwd_comms": 0.0, "bwd_compute": 0.0, "bwd_comms": 0.0}
    on_critical: dict[str, float] = {}
    for name, option in costed.items():
        for rank, shard in zip(plan.tables[name].ranks, option.shards):
            if rank == critical:
                on_critical[name] = on_critical.get(name, 0.0) + shard.perf.total_ms
                for key in phases:
                    phases[key] += getattr(shard.perf, f"{key}_ms")
    caps = rank_capacities(cluster)
    names = [table] if table is not None else list(plan.tables)
    # every option, those the constraints forbid included: forcing one shows what the constraint costs
    options = enumerate_options(replace(problem, constraints=None), cost_model)
    explained = []
    for name in names:
        chosen, ranks = costed[name], plan.tables[name].ranks
        others = RankLoads(loads.ms.copy(), loads.bytes.copy())
        others.add(chosen, ranks, sign=-1)
        # every option, the chosen one included: re-placed, it shows whether the table sits well
        forced = [forbidden_or(force(o, others, caps, cluster), problem.constraints, name) for o in options[name]]
        forced = [f for f in forced if not (same_layout(f.option, chosen) and f.ranks == ranks)]
        forced.sort(key=lambda f: (f.max_rank_ms is None, f.max_rank_ms or 0.0))
        explained.append(TableExplanation(name, chosen, ranks, on_critical.get(name, 0.0), forced[:ALTERNATIVES_SHOWN]))
    top = sorted(on_critical.items(), key=lambda kv: -kv[1])[:5]
    return Explanation(float(loads.ms.max()), critical, phases, top, explained)

"""Why a plan is what it is: the critical rank and its breakdown, and for each table its
chosen option against the best alternatives, each forced into the plan with every other table
left where it is (`dlrm-scale explain`).

Forcing an alternative removes the table's shards from their ranks and places the
alternative's as the planner would (every rank, one node's ranks, or longest shard first onto
the least-loaded rank with room); the figure is the busiest rank of the plan that results, or
the tier that runs out of memory. Options the config's constraints forbid are forced too, and
say which constraint forbids them: the price of that constraint (they are placed ignoring the
table's constraints; the others keep to its pins, keep-apart groups and co-located tables).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from planner.search.assignment import RankLoads, rank_capacities
from planner.search.candidates import enumerate_options
from planner.spec.constraints import Constraints
from planner.cost.cost_model import CostModel
from planner.search.greedy import place_one
from planner.spec.placement_rules import RankRules
from planner.plan.document import Plan
from planner.views.report import rank_list
from planner.views.scoring import costed_options
from planner.spec.specs import ClusterSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import TIERS, ShardingOption

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


def force(option: ShardingOption, others: RankLoads, caps: np.ndarray, cluster: ClusterSpec,
          admits: Callable[[int], bool] = lambda rank: True) -> Forced:
    ranks = place_one(option, others, caps, cluster, admits)
    if ranks is None:
        after = others.bytes.sum(axis=0) + option.shard_bytes.sum(axis=0)
        short = [t for i, t in enumerate(TIERS) if after[i] > caps[i] * cluster.world_size] or [
            t for i, t in enumerate(TIERS) if option.shard_bytes[:, i].max() > 0]
        return Forced(option, None, None, f"{short[0] if short else 'memory'} has no room for its shards")
    ms = others.ms + option.every_rank_ms
    np.add.at(ms, ranks, option.shard_ms)
    busiest = int(ms.argmax())
    return Forced(option, ranks, float(ms.max()), f"binds on rank {busiest}")


def force_table(option: ShardingOption, others: RankLoads, caps: np.ndarray, cluster: ClusterSpec,
                constraints: Constraints | None, table: str, admits: Callable[[int], bool]) -> Forced:
    """`option` forced for `table`: where its constraints forbid it, placed as if they did not
    and saying which forbids it; otherwise kept to the ranks `admits`."""
    rule = constraints.forbidding(table, option) if constraints is not None else None
    if rule is None:
        return force(option, others, caps, cluster, admits)
    return replace(force(option, others, caps, cluster), binds=f"forbidden by {rule.describe()}")


def _admitting(plan: Plan, constraints: Constraints | None, rules: RankRules, table: str) -> Callable[[int], bool]:
    """The ranks `table` may move to with every other table where the plan has it."""
    if constraints is None:
        return lambda rank: True
    occupancy = rules.occupancy({n: t.ranks for n, t in plan.tables.items() if n != table})
    group = next((g for g in constraints.colocate if g.applies_to(table)), None)
    mates = {r for n in group.tables if n != table for r in plan.tables[n].ranks} if group else None
    return lambda rank: occupancy.admits(table, rank) and (mates is None or rank in mates)


def explain(plan: Plan, problem: PlanningProblem, cost_model: CostModel, table: str | None = None) -> Explanation:
    cluster = problem.cluster
    costed = dict(costed_options(plan, problem, cost_model))
    loads = RankLoads.empty(plan.world_size)
    for name, option in costed.items():
        loads.add(option, plan.tables[name].ranks)
    critical = int(loads.ms.argmax())
    phases = {"input_dist": 0.0, "fwd_compute": 0.0, "fwd_comms": 0.0, "bwd_compute": 0.0, "bwd_comms": 0.0}
    on_critical: dict[str, float] = {}
    for name, option in costed.items():
        on_rank = [shard.perf for rank, shard in zip(plan.tables[name].ranks, option.shards) if rank == critical]
        for perf in on_rank + ([option.every_rank] if option.every_rank_ms else []):
            on_critical[name] = on_critical.get(name, 0.0) + perf.total_ms
            for key in phases:
                phases[key] += getattr(perf, f"{key}_ms")
    caps = rank_capacities(cluster)
    names = [table] if table is not None else list(plan.tables)
    # every option, those the constraints forbid included: forcing one shows what the constraint costs
    options = enumerate_options(replace(problem, constraints=None), cost_model)
    rules = problem.constraints.rank_rules(list(plan.tables)) if problem.constraints is not None else RankRules()
    explained = []
    for name in names:
        chosen, ranks = costed[name], plan.tables[name].ranks
        others = RankLoads(loads.ms.copy(), loads.bytes.copy())
        others.add(chosen, ranks, sign=-1)
        # every option, the chosen one included: re-placed, it shows whether the table sits well
        admits = _admitting(plan, problem.constraints, rules, name)
        forced = [force_table(o, others, caps, cluster, problem.constraints, name, admits) for o in options[name]]
        forced = [f for f in forced if not (same_layout(f.option, chosen) and f.ranks == ranks)]
        forced.sort(key=lambda f: (f.max_rank_ms is None, f.max_rank_ms or 0.0))
        explained.append(TableExplanation(name, chosen, ranks, on_critical.get(name, 0.0), forced[:ALTERNATIVES_SHOWN]))
    top = sorted(on_critical.items(), key=lambda kv: -kv[1])[:5]
    return Explanation(float(loads.ms.max()), critical, phases, top, explained)

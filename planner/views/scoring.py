"""Price any plan (ours, TorchRec's, hand-written) per rank under any cost model."""

from __future__ import annotations

import numpy as np

from planner.spec.access_stats import table_access
from planner.cost.step import rank_perf_storage
from planner.cost.cost_model import CostModel, OptionRequest, cached_request
from planner.plan.document import Plan
from planner.spec.problem import PlanningProblem
from planner.spec.types import Perf, ShardGeometry, ShardingOption, ShardingType, Storage


def costed_options(plan: Plan, problem: PlanningProblem, cost_model: CostModel) -> list[tuple[str, ShardingOption]]:
    """Each table's option as the plan lays it out, costed by `cost_model`."""
    names = list(plan.tables)
    requests = []
    for name in names:
        t = plan.tables[name]
        table = problem.tables_by_name[name]
        geometries = tuple(ShardGeometry(s.row_offset, s.col_offset, s.rows, s.cols) for s in t.shards)
        if t.cached:
            requests.append(cached_request(table, ShardingType(t.sharding_type), geometries, t.shards[0].tier,
                                           t.cache_load_factor, table_access(table, problem), problem.tiering.policy))
            continue
        requests.append(
            OptionRequest(
                table=table,
                sharding_type=ShardingType(t.sharding_type),
                compute_kernel=t.compute_kernel,
                tier=t.shards[0].tier or problem.cluster.device_tier,
                geometries=geometries,
            )
        )
    return list(zip(names, cost_model.estimate(requests)))


def rank_times_ms(plan: Plan, problem: PlanningProblem, cost_model: CostModel) -> np.ndarray:
    """Per-rank step time of `plan`, each shard costed by `cost_model` where the plan puts it."""
    per_rank = np.zeros(plan.world_size)
    for name, option in costed_options(plan, problem, cost_model):
        np.add.at(per_rank, plan.tables[name].ranks, option.shard_ms)
        per_rank += option.every_rank_ms
    return per_rank


def rank_breakdown(plan: Plan, problem: PlanningProblem, cost_model: CostModel) -> tuple[list[Perf], list[Storage]]:
    """Per-rank time by phase and bytes per tier of `plan` under `cost_model`."""
    return rank_perf_storage(((option, plan.tables[name].ranks) for name, option in costed_options(plan, problem, cost_model)),
                             plan.world_size)

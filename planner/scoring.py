"""Price any plan (ours, TorchRec's, hand-written) per rank under any cost model."""

from __future__ import annotations

import numpy as np

from planner.cost_model import CostModel, OptionRequest
from planner.plan import Plan
from planner.specs import PlanningProblem
from planner.types import ShardGeometry, ShardingType


def rank_times_ms(plan: Plan, problem: PlanningProblem, cost_model: CostModel) -> np.ndarray:
    """Per-rank step time of `plan`, each shard costed by `cost_model` where the plan puts it."""
    names = list(plan.tables)
    requests = []
    for name in names:
        t = plan.tables[name]
        requests.append(
            OptionRequest(
                table=problem.tables_by_name[name],
                sharding_type=ShardingType(t.sharding_type),
                compute_kernel=t.compute_kernel,
                tier=t.shards[0].tier or problem.cluster.device_tier,
                geometries=tuple(ShardGeometry(s.row_offset, s.col_offset, s.rows, s.cols) for s in t.shards),
            )
        )
    per_rank = np.zeros(plan.world_size)
    for name, option in zip(names, cost_model.estimate(requests)):
        np.add.at(per_rank, plan.tables[name].ranks, option.shard_ms)
    return per_rank

"""The planner's one entry point: specs in, plan out."""

from __future__ import annotations

import time
from dataclasses import replace
from planner.candidates import enumerate_options
from planner.capacity import check_capacity
from planner.cost_model import AnalyticCostModel, CostModel
from planner.errors import InfeasiblePlanError
from planner.plan import Plan
from planner.solver import SolverConfig, solve
from planner.specs import PlanningProblem

# The solver always gets at least this share of the time limit, however long costing took.
MIN_SOLVER_SHARE = 0.2


def make_plan(problem: PlanningProblem, cost_model: CostModel | None = None, config: SolverConfig | None = None) -> Plan:
    """Cost every candidate, then solve; `config.time_limit_s` bounds the two together.

    Cached options are offered to the solver only when the tables do not fit with every row
    in device memory: a cached shard is never faster than the same shard uncached, so they
    matter only for memory, and without them the search space stays as small as it can be.
    """
    start = time.monotonic()
    config = config or SolverConfig()
    cost_model = cost_model or AnalyticCostModel(problem.cluster, problem.training)
    attempts = [problem]
    if problem.tiering.enabled:  # costing cached options takes time too: only when needed
        attempts.insert(0, replace(problem, tiering=replace(problem.tiering, enabled=False)))
    for i, attempt in enumerate(attempts):
        try:
            options = enumerate_options(attempt, cost_model)
            left = max(config.time_limit_s - (time.monotonic() - start), MIN_SOLVER_SHARE * config.time_limit_s)
            solution = solve(options, problem.cluster, config, deadline_s=time.monotonic() + left)
            break
        except InfeasiblePlanError:
            if i == len(attempts) - 1:
                raise
    plan = Plan.from_solution(solution, problem.cluster, [t.name for t in problem.tables], cost_model.name)
    check_capacity([r.memory for r in plan.ranks], problem.cluster)
    return plan

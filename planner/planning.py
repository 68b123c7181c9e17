"""The planner's one entry point: specs in, plan out."""

from __future__ import annotations

from planner.candidates import enumerate_options
from planner.cost_model import AnalyticCostModel, CostModel
from planner.plan import Plan
from planner.solver import SolverConfig, solve
from planner.specs import PlanningProblem


def make_plan(problem: PlanningProblem, cost_model: CostModel | None = None, config: SolverConfig | None = None) -> Plan:
    cost_model = cost_model or AnalyticCostModel(problem.cluster, problem.training)
    options = enumerate_options(problem, cost_model)
    solution = solve(options, problem.cluster, config or SolverConfig())
    return Plan.from_solution(solution, problem.cluster, [t.name for t in problem.tables], cost_model.name)

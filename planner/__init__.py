"""dlrm-scale's sharding planner: specs in, plan out. Imports numpy and OR-Tools only."""

from planner.api import config_document, plan_tables, planning_problem
from planner.spec.config import load_problem
from planner.spec.errors import ConfigError, InfeasiblePlanError, PlanFormatError, PlannerError
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.specs import ClusterSpec, TableSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.views.report import format_plan

__all__ = [
    "ClusterSpec", "ConfigError", "InfeasiblePlanError", "Plan", "PlanFormatError", "PlannerError",
    "PlanningProblem", "SolverConfig", "format_plan", "TableSpec", "TrainingSpec", "load_problem", "make_plan", "plan_tables",
    "planning_problem", "config_document",
]

"""dlrm-scale's sharding planner: specs in, plan out. Imports numpy and OR-Tools only."""

from planner.config import load_problem
from planner.errors import ConfigError, InfeasiblePlanError, PlanFormatError, PlannerError
from planner.plan import Plan
from planner.planning import make_plan
from planner.solver import SolverConfig
from planner.specs import ClusterSpec, PlanningProblem, TableSpec, TrainingSpec

__all__ = [
    "ClusterSpec", "ConfigError", "InfeasiblePlanError", "Plan", "PlanFormatError", "PlannerError",
    "PlanningProblem", "SolverConfig", "TableSpec", "TrainingSpec", "load_problem", "make_plan",
]

"""The planning problem: every spec the planner takes, and the user's constraints on them."""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.spec.constraints import Constraints
from planner.spec.errors import ConfigError
from planner.spec.specs import ClusterSpec, TableSpec, TieringSpec, TrainingSpec


@dataclass(frozen=True)
class PlanningProblem:
    """Everything the planner needs: specs in, plan out."""

    tables: tuple[TableSpec, ...]
    cluster: ClusterSpec
    training: TrainingSpec
    tiering: TieringSpec = TieringSpec()
    access: dict = field(default_factory=dict, repr=False, compare=False)  # table name -> access_stats.TableAccess
    constraints: Constraints | None = None  # the user's (planner.spec.constraints); None: none
    tables_by_name: dict[str, TableSpec] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.tables:
            raise ConfigError("no tables to plan: give tables in the config or with --tables FILE.csv")
        by_name: dict[str, TableSpec] = {}
        for t in self.tables:
            if t.name in by_name:
                raise ConfigError(f"table '{t.name}' is defined twice: table names must be unique")
            by_name[t.name] = t
        object.__setattr__(self, "tables_by_name", by_name)

"""The planner from Python, torch-free: tables and a cluster in, a `Plan` out.

    from planner import TableSpec, plan_tables

    tables = [TableSpec("user_id", 50_000_000, 128), TableSpec("item_id", 2_000_000, 128, pooling_factor=1.0),
              TableSpec("history", 2_000_000, 64, pooling_factor=20.0, pooled=False)]
    plan = plan_tables(tables, hardware="h100_dgx", world_size=16, batch_size_per_rank=1024)
    plan.save("plan.json")  # then: dlrm-scale explain plan.json, dlrm-scale diff ...

Settings are the config file's sections as dictionaries (`cluster`, `training`, `tiering`,
`constraints`, in the units and keys of docs/planner.md) and go through the reader
`dlrm-scale plan` uses, so the same tables and settings give the same plan either way.
"""

from __future__ import annotations

from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any, Iterable, Mapping

from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.config import DEFAULT_HARDWARE, problem_from_doc
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec

WHERE = "planner.plan_tables"  # what the one-line errors name
DEFAULT_TABLE = {f.name: f.default for f in fields(TableSpec) if f.default is not MISSING}  # left out of a config's tables


def config_document(
    tables: Iterable[TableSpec],
    hardware: str = DEFAULT_HARDWARE,
    *,
    world_size: int | None = None,
    ranks_per_node: int | None = None,
    batch_size_per_rank: int | None = None,
    cluster: Mapping[str, Any] | None = None,
    training: Mapping[str, Any] | None = None,
    tiering: Mapping[str, Any] | None = None,
    constraints: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The config file holding these settings, as a document (yaml.safe_dump writes it)."""
    shape = {k: v for k, v in (("world_size", world_size), ("ranks_per_node", ranks_per_node)) if v is not None}
    batch = {"batch_size_per_rank": batch_size_per_rank} if batch_size_per_rank is not None else {}
    doc: dict[str, Any] = {
        "hardware": hardware,
        "cluster": {**(cluster or {}), **shape},
        "training": {**(training or {}), **batch},
        "tables": [{k: v for k, v in asdict(t).items() if v != DEFAULT_TABLE.get(k, MISSING)} for t in tables],
    }
    if tiering is not None:
        doc["tiering"] = dict(tiering)
    if constraints is not None:
        doc["constraints"] = dict(constraints)
    return doc


def planning_problem(tables: Iterable[TableSpec], hardware: str = DEFAULT_HARDWARE, *, stats: str | Path | None = None,
                     **settings: Any) -> PlanningProblem:
    """The problem `dlrm-scale plan` builds from a config of these settings (`config_document`),
    priced with the hardware profile `hardware` (a name or a .yaml path); `stats` is a file of
    `dlrm-scale profile`."""
    return problem_from_doc(config_document(tables, hardware, **settings), WHERE, Path.cwd(), stats_path=stats)


def plan_tables(tables: Iterable[TableSpec], hardware: str = DEFAULT_HARDWARE, *, time_limit_s: float = 10.0,
                gap: float = SolverConfig.target_gap, seed: int = 0, **settings: Any) -> Plan:
    """Plan `tables` (see `planning_problem` for the settings) within `time_limit_s` seconds,
    stopping once the plan is proven within `gap` of its lower bound."""
    return make_plan(planning_problem(tables, hardware, **settings),
                     config=SolverConfig(time_limit_s=time_limit_s, target_gap=gap, seed=seed))

"""A finished training run read back for its measurements: what it trained (the run record at
the head of metrics.jsonl), its plan.json, and each rank's time per phase group.

Only JSON is read, each field checked; any problem is one line naming the file and the fix.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field, replace
from pathlib import Path

from dlrm_scale.run_config import RunConfig
from dlrm_scale.run_record import PHASE_GROUPS, PHASES, run_from_document
from planner.spec.config import with_access_stats
from planner.spec.errors import ConfigError, PlannerError
from planner.plan.document import Plan, check_plan_tables

WARM_UP_WINDOWS = 1  # the first window pays for first-touch pages and the allocator's growth


@dataclass(frozen=True)
class MeasuredRun:
    directory: Path
    run: RunConfig
    plan: Plan
    phases_ms: tuple[dict[str, float], ...]  # per rank, ms per step by PHASE_GROUPS key (median over windows)
    step_ms: float  # median over windows: the slowest rank's sum of phases
    windows: int
    window_steps_ms: tuple[float, ...] = ()  # each window's step, as step_ms takes them
    # per table whose windows measured it, (its pooling factor as configured, as measured: the
    # median over windows); `run.problem` prices the measured one
    pooling: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def spread(self) -> float:
        """How far the windows' steps stray from one another: their interquartile range, relative
        to their median (a window a checkpoint or a neighbour slowed does not count)."""
        steps = self.window_steps_ms
        if len(steps) < 2 or self.step_ms <= 0:
            return 0.0
        q1, _, q3 = statistics.quantiles(steps, n=4)
        return (q3 - q1) / self.step_ms


def load_run(directory: str | Path, hardware: str | None = None, stats: str | Path | None = None) -> MeasuredRun:
    """The run in `directory`, priced with `hardware` (default: the profile it was trained with),
    the access statistics `stats` (a `dlrm-scale profile` stats.json; default: the tables'
    Zipf laws) and the pooling factors its windows measured (a table that grew hot is priced as it ran)."""
    directory = Path(directory)
    fix = "give the --out-dir of a finished 'dlrm-scale train' run"
    metrics = directory / "metrics.jsonl"
    if not metrics.is_file() or not (directory / "plan.json").is_file():
        raise ConfigError(f"run {directory}: no metrics.jsonl and plan.json in it; {fix}")
    record, windows = None, []
    for number, line in enumerate(metrics.read_text().splitlines(), 1):
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{metrics}:{number} is not JSON; the file is damaged, re-run the training") from None
        if not isinstance(entry, dict):
            raise ConfigError(f"{metrics}:{number} is not a record; the file is damaged, re-run the training")
        if "run" in entry:  # a resumed run starts a new record: measure what follows the last
            record, windows = entry["run"], []
        elif "phase_ms" in entry:
            windows.append((number, entry))
    if record is None:
        raise ConfigError(f"{metrics} has no run record (written since dlrm-scale records runs); re-run the training")
    run = run_from_document(record, f"{metrics}: run record", hardware)
    if stats is not None:
        run = replace(run, problem=with_access_stats(run.problem, stats))
    try:
        plan = Plan.load(directory / "plan.json")
        check_plan_tables(plan, run.problem)
    except PlannerError as e:
        raise ConfigError(f"run {directory}: {e}") from None
    world = plan.world_size
    if len(windows) <= WARM_UP_WINDOWS:
        raise ConfigError(f"{metrics}: {len(windows)} logging windows; measuring needs more than {WARM_UP_WINDOWS} "
                          f"(train more steps or log more often)")
    measured = windows[WARM_UP_WINDOWS:]
    per_window = [_window_groups(metrics, number, entry, world) for number, entry in measured]
    phases = tuple({g: statistics.median(w[r][g] for w in per_window) for g in PHASE_GROUPS} for r in range(world))
    steps = tuple(max(sum(rank.values()) for rank in w) for w in per_window)
    pooling = _measured_pooling(metrics, measured, run)
    tables = tuple(replace(t, pooling_factor=pooling[t.name][1]) if t.name in pooling else t for t in run.problem.tables)
    run = replace(run, problem=replace(run.problem, tables=tables))
    return MeasuredRun(directory, run, plan, phases, statistics.median(steps), len(per_window), steps, pooling)


def _measured_pooling(metrics: Path, windows: list[tuple[int, dict]], run: RunConfig) -> dict[str, tuple[float, float]]:
    """(configured, measured) pooling factor of each table, from windows that record them (a run
    of an older version has none); a table no id of which was looked up keeps its configured one."""
    tables = run.problem.tables_by_name
    seen: dict[str, list[float]] = {}
    for number, entry in windows:
        factors = entry.get("pooling_factors")
        if factors is None:
            continue
        if not isinstance(factors, dict) or set(factors) != set(tables) or not _non_negative_numbers(factors.values()):
            raise ConfigError(f"{metrics}:{number}: pooling_factors must give every table of the run a number >= 0; the file is damaged")
        for name, value in factors.items():
            seen.setdefault(name, []).append(float(value))
    measured = {name: statistics.median(values) for name, values in seen.items()}
    return {name: (tables[name].pooling_factor, value) for name, value in measured.items() if value > 0}


def _non_negative_numbers(values) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in values)


def _window_groups(metrics: Path, number: int, entry: dict, world: int) -> list[dict[str, float]]:
    phase_ms = entry["phase_ms"]
    where = f"{metrics}:{number}: phase_ms"
    if not isinstance(phase_ms, dict) or set(phase_ms) != set(PHASES):
        raise ConfigError(f"{where} does not name the phases {', '.join(PHASES)}; re-run the training with this version")
    for name, values in phase_ms.items():
        if not isinstance(values, list) or len(values) != world or not _non_negative_numbers(values):
            raise ConfigError(f"{where}.{name} must list {world} non-negative times, one per rank; the file is damaged")
    return [{g: sum(phase_ms[p][r] for p in members) for g, members in PHASE_GROUPS.items()} for r in range(world)]

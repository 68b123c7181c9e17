"""Which stages of a search stopped on the wall clock rather than on their own work budget.

Each stage's work budget (CP-SAT's deterministic time, the configuration LP's rounds, a search
that runs until it finds nothing better) makes its result a function of its input alone. Its
wall-clock limit, a share of the time limit, is a safety net on a slow or busy machine; a stage
that limit stops ends wherever the machine had got to, so the same inputs may plan differently
on another machine or at a busier moment. make_plan records those stages in the plan
(`Plan.solver`, "... [wall clock: probes, repair]"), so that two plans that differ say why.

The stages note themselves here rather than returning it up every call: the record is of one
make_plan call (`recorded`), and a stage outside one records nothing.
"""

from __future__ import annotations

import contextlib
import time
from contextvars import ContextVar
from typing import Iterator

_stops: ContextVar[list[str] | None] = ContextVar("wall_clock_stops", default=None)


def note(stage: str) -> None:
    """`stage` stopped on the wall clock."""
    stops = _stops.get()
    if stops is not None and stage not in stops:
        stops.append(stage)


def passed(deadline_s: float, stage: str) -> bool:
    """Whether the wall-clock ceiling `deadline_s` is reached, where `stage` would go on (noted when it is)."""
    if time.monotonic() < deadline_s:
        return False
    note(stage)
    return True


def note_cpsat(solver, stage: str) -> None:
    """`stage`'s CP-SAT solve (just returned) stopped on its wall-clock limit: it ran that long
    with deterministic time left."""
    params = solver.parameters
    if solver.wall_time >= 0.95 * params.max_time_in_seconds and solver.deterministic_time < 0.99 * params.max_deterministic_time:
        note(stage)


@contextlib.contextmanager
def recorded() -> Iterator[list[str]]:
    """The stages the wall clock stopped within this block, in the order they stopped."""
    stops: list[str] = []
    token = _stops.set(stops)
    try:
        yield stops
    finally:
        _stops.reset(token)


def described(method: str, stops: list[str]) -> str:
    """A plan's solver, with the stages the wall clock stopped."""
    return f"{method} [wall clock: {', '.join(stops)}]" if stops else method

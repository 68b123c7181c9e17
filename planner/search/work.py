"""The greedy stages' work, counted rather than timed: a clock that ticks once per candidate a
search examines (a shard placed by `pack`, a move or swap weighed by `local_search`), the same
count on any machine under any load. A stage given a share of the time limit stops when its
share of WORK_PER_S x time limit has been counted; the wall clock stays a ceiling above it
(planner/search/wall_clock.py records where it was reached first).
"""

from __future__ import annotations

from planner.search import wall_clock

# Ticks per second of the time limit: what the warm starts of the planner benchmark's workloads
# counted per second on a 2-core AMD EPYC (family 26), 2026-12-05: 2.0M on median, 1.0-3.0M
# (1,000 ranks the slowest), so a budget of N seconds spends about N seconds there.
WORK_PER_S = 2_000_000

_ticks = 0


def tick(n: int) -> None:
    """`n` candidates examined."""
    global _ticks
    _ticks += n


def now() -> int:
    """The count so far: a deadline in work is `now() + budget(seconds)`."""
    return _ticks


def budget(seconds: float) -> int:
    return int(seconds * WORK_PER_S)


def stop(work_until: int | None, deadline_s: float, stage: str) -> bool:
    """Whether `stage` stops here: its work spent (`work_until`, None: no budget of its own), or
    the wall-clock ceiling `deadline_s` reached first (recorded)."""
    return (work_until is not None and _ticks >= work_until) or wall_clock.passed(deadline_s, stage)

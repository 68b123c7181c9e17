"""Where a search stands (its best plan's busiest rank and its proven bound), for a person
watching: `dlrm-scale plan` shows it on a terminal while it searches.

Stages report here rather than return it up every call, as they note wall-clock stops
(planner/search/wall_clock.py); a search nobody watches reports to nobody.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar
from typing import Callable, Iterator

Listener = Callable[[str, float, float], None]  # (stage, best plan's busiest rank ms, proven bound ms)

_listener: ContextVar[Listener | None] = ContextVar("search_progress", default=None)


def report(stage: str, best_ms: float, bound_ms: float) -> None:
    listener = _listener.get()
    if listener is not None:
        listener(stage, best_ms, bound_ms)


@contextlib.contextmanager
def watched(listener: Listener | None) -> Iterator[None]:
    """Searches within this block report to `listener` (None: to nobody)."""
    token = _listener.set(listener)
    try:
        yield
    finally:
        _listener.reset(token)


@contextlib.contextmanager
def bound_at_most(bound_ms: float) -> Iterator[None]:
    """Searches within this block report at most `bound_ms` as their bound: a search over part of
    the options proves a bound on its own problem only, not on the whole one."""
    outer = _listener.get()
    with watched(None if outer is None else lambda stage, best_ms, bound: outer(stage, best_ms, min(bound, bound_ms))):
        yield

"""Python's cycle collector paused while the planner builds and searches its options."""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off inside, as it was found after (on failure too); usable as a
    decorator. Costing builds millions of objects (a row-wise option on 1,024 ranks has 1,024
    shard blocks), none of them cyclic, and the collector's passes over them as they pile up
    cost more than building them: 2.5 of 3.8 s of 2,000 tables' option requests on 1,024 ranks,
    and about a tenth of the warm start's time after (2-core Zen 3). Planning's peak memory is
    the same either way."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()

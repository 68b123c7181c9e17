"""Lower bounds on the busiest rank's step time, valid for any plan over the same options."""

from __future__ import annotations

import math
from typing import Mapping, Sequence

from planner.types import ShardingOption


def lower_bound_ms(options_by_table: Mapping[str, Sequence[ShardingOption]], world_size: int) -> float:
    """The larger of two bounds no placement can beat:

    - work: every table adds at least its cheapest option's summed shard time, and the
      busiest rank carries at least the mean, so sum(min total) / W;
    - granularity: some rank holds each table's largest shard, so max over tables of the
      smallest largest-shard among its options.
    Memory capacities are ignored, which keeps the bound valid (only weaker).
    """
    work = sum(min(o.total_ms for o in opts) for opts in options_by_table.values()) / world_size
    granularity = max(min(o.max_shard_ms for o in opts) for opts in options_by_table.values())
    return max(work, granularity)


def shard_limited_bound_ms(options_by_table: Mapping[str, Sequence[ShardingOption]], world_size: int) -> float:
    """The two bounds above taken together, and never below either: a plan whose busiest rank
    is T uses only options whose largest shard is at most T, so T is at least the mean work
    of each table's cheapest such option. The answer is the least T where that holds.

    Why it matters: a table too large for one rank at the target must be split, and its
    split options cost more in total than its cheapest one (26 MLPerf tables on 16 ranks:
    +3% over the work bound). Found by one sweep over the options in order of largest shard,
    along which the mean work of the options allowed so far only falls."""
    events = sorted((o.max_shard_ms, table, o.total_ms) for table, opts in options_by_table.items() for o in opts)
    cheapest: dict[str, float] = {}
    work_ms = 0.0  # sum over tables of their cheapest option with largest shard <= the sweep's T
    for i, (shard_ms, table, total_ms) in enumerate(events):
        if total_ms < cheapest.get(table, math.inf):
            work_ms += total_ms - cheapest.get(table, 0.0)
            cheapest[table] = total_ms
        next_ms = events[i + 1][0] if i + 1 < len(events) else math.inf
        if len(cheapest) == len(options_by_table) and next_ms > shard_ms:
            least = max(shard_ms, work_ms / world_size)
            if least < next_ms:  # T in [shard_ms, next_ms) allows these options only
                return least
    return 0.0  # no options at all

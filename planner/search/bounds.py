"""Lower bounds on the busiest rank's time and on the step, valid for any plan over the same options."""

from __future__ import annotations

import itertools
import math
from typing import Callable, Iterable, Mapping, Sequence

from planner.spec.types import ShardingOption


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


def step_lower_bound_ms(options_by_table: Mapping[str, Sequence[ShardingOption]], world_size: int, rank_bound_ms: float,
                        types_ms: Callable[[Iterable], float]) -> float:
    """A bound on the step the planner minimises (each phase waiting for its busiest rank, plus
    `types_ms`: the fixed cost of the collectives a plan's set of sharding types runs).

    A plan using exactly the types U takes at least its busiest rank plus types_ms(U), and its
    busiest rank is at least `rank_bound_ms` (a bound over all plans) and the shard-limited bound
    of the options of U alone. The bound is the least of that over every U: each U with the
    first term alone, single types with both (a single type is where a plan's fixed cost is
    least, and its own bound can be far above the general one: all data-parallel on two ranks
    carries every table on both)."""
    kinds = {frozenset(o.sharding_type for o in opts) for opts in options_by_table.values()}  # few distinct ones
    types = sorted(frozenset().union(*kinds), key=lambda t: t.value)
    best = math.inf
    for size in range(1, len(types) + 1):
        for subset in itertools.combinations(types, size):
            if not all(kind.intersection(subset) for kind in kinds):
                continue  # a table with no option of these types: no plan uses exactly them
            rank_ms = rank_bound_ms
            if size == 1:
                only = {t: [o for o in opts if o.sharding_type == subset[0]] for t, opts in options_by_table.items()}
                rank_ms = max(rank_bound_ms, shard_limited_bound_ms(only, world_size))
            best = min(best, rank_ms + types_ms(subset))
    return best

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
                        types_ms: Callable[[Iterable], float], proven: Mapping[frozenset, float] | None = None) -> float:
    """A bound on the step the planner minimises (each phase waiting for its busiest rank, plus
    `types_ms`: the fixed cost of the collectives a plan's set of sharding types runs).

    A plan using exactly the types U takes at least its busiest rank plus types_ms(U), and its
    busiest rank is at least `rank_bound_ms` (a bound over all plans), `proven`'s bound for any
    set of types holding U (a search over those types' options proved it: every plan using types
    within the set is one of that search's), and the shard-limited bound of U's options alone
    (one type: all data-parallel on two ranks carries every table on both; two: Criteo-1TB on 8
    ranks column-wise and data-parallel, 3.7% above every option's). The bound is the least of
    that over every U; the shard-limited bound, a sweep over the options, only for the sets whose
    other terms are under the least so far."""
    kinds = {frozenset(o.sharding_type for o in opts) for opts in options_by_table.values()}  # few distinct ones
    types = sorted(frozenset().union(*kinds), key=lambda t: t.value)
    sets = []  # (bound without the sweep, rank part of it, U)
    for size in range(1, len(types) + 1):
        for subset in itertools.combinations(types, size):
            if not all(kind.intersection(subset) for kind in kinds):
                continue  # a table with no option of these types: no plan uses exactly them
            rank_ms = max([rank_bound_ms, *(ms for within, ms in (proven or {}).items() if within.issuperset(subset))])
            sets.append((rank_ms + types_ms(subset), rank_ms, subset))
    best = math.inf
    for without_sweep_ms, rank_ms, subset in sorted(sets, key=lambda s: s[0]):
        if without_sweep_ms >= best:
            break
        only = {t: [o for o in opts if o.sharding_type in subset] for t, opts in options_by_table.items()}
        best = min(best, without_sweep_ms + max(0.0, shard_limited_bound_ms(only, world_size) - rank_ms))
    return best

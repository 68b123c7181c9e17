"""A proven floor under every replan (`plan --from`): no plan that moves at most B bytes from
the old plan has its busiest rank below `MoveFloor.ms(B)`, whatever a search finds.

A plan whose busiest rank is T uses, for each table, an option whose every shard costs at most
T, whose shards together add the table's work to the cluster (so the cheapest such options'
work, over the ranks, is at most T), and whose shards keep on their ranks at most what those
ranks held before. What a shard keeps, over every relabelling of the ranks (bytes as `diff`
counts them, the shard's overlap with what its rank held):
- each shard on whichever rank of the new world held most of it, and
- each old rank keeping at most the shards that fit under T beside each other (one for an
  option whose shards go to distinct ranks: row-wise, data-parallel, table-row-wise), its
  largest overlaps first;
the smaller of the two. Both count a shard or a rank more than once where a real plan cannot,
so what must move is never overstated. The floor is the least T where the cheapest options
under T fit the work and the least moves of options under T fit the budget; both only ease as
T grows, so it is found by bisection, and the value returned is one where they fail.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate
from typing import Mapping, Sequence

from planner.cost_model import rows_bytes
from planner.diff import shared_block
from planner.plan import TablePlan
from planner.types import Placement, ShardingOption


@dataclass(frozen=True)
class Keeping:
    """What one option could keep of the old plan's bytes, precomputed for every T."""

    overlap_bytes: int  # bytes of the option's shards that some old rank of the new world held
    best_rank_each: int  # each shard on the rank that held most of it
    by_rank: tuple[tuple[int, ...], ...]  # per old rank, running sums of its overlaps, largest first
    distinct_ranks: bool  # shards always on different ranks
    min_shard_ms: float

    def least_moved(self, t_ms: float) -> int:
        """Bytes that every placement moves where no rank carries more than `t_ms`."""
        if self.distinct_ranks:
            per_rank = 1
        elif self.min_shard_ms > 0:
            per_rank = max(1, int(t_ms // self.min_shard_ms))
        else:
            per_rank = math.inf
        by_rank = sum(sums[min(per_rank, len(sums)) - 1] for sums in self.by_rank)
        return self.overlap_bytes - min(self.best_rank_each, by_rank)


def option_keeping(option: ShardingOption, layouts: Sequence[tuple[TablePlan | None, TablePlan]], world_size: int,
                   optimizer: str) -> Keeping:
    """`layouts`: (old layout or None for a new table, new layout with any ranks) per real
    table behind the option (several for a co-located group). A new table starts from its
    initial weights and a replica is on every old rank (rank 0 too): neither moves anything."""
    overlap = best = 0
    held_by_rank: dict[int, list[int]] = {}
    moving = [(before, after) for before, after in layouts if before is not None and before.sharding_type != "data_parallel"]
    for i in range(len(option.shards)):  # a co-located group: its members' one shards are one
        held: dict[int, int] = {}
        for before, after in moving:
            for source in before.shards:
                rows, cols = shared_block(after.shards[i], source)
                if rows and cols and source.rank < world_size:
                    held[source.rank] = held.get(source.rank, 0) + rows_bytes(rows, cols, optimizer)
        overlap += sum(held.values())
        best += max(held.values(), default=0)
        for rank, size in held.items():
            held_by_rank.setdefault(rank, []).append(size)
    running = tuple(tuple(accumulate(sorted(sizes, reverse=True))) for sizes in held_by_rank.values())
    distinct = option.placement in (Placement.EVERY_RANK, Placement.NODE_RANKS)
    return Keeping(overlap, best, running, distinct, float(option.shard_ms.min()))


class MoveFloor:
    """The floor for any budget, over the search's options (each co-located group one table)."""

    def __init__(self, options_by_table: Mapping[str, Sequence[ShardingOption]], keeps: Mapping[str, Sequence[Keeping]],
                 world_size: int, bound_ms: float) -> None:
        self.options, self.keeps, self.world, self.bound_ms = options_by_table, keeps, world_size, bound_ms

    def _admits(self, t_ms: float, budget_bytes: float) -> bool:
        work_ms = moved = 0.0
        for table, opts in self.options.items():
            under = [k for k, o in enumerate(opts) if o.max_shard_ms <= t_ms]
            if not under:
                return False
            work_ms += min(opts[k].total_ms for k in under)
            moved += min(self.keeps[table][k].least_moved(t_ms) for k in under)
        return work_ms / self.world <= t_ms and moved <= budget_bytes

    def ms(self, budget_bytes: float, high_ms: float, tolerance: float = 1e-4) -> float:
        """The floor for `budget_bytes`, searched between the problem's proven bound and
        `high_ms` (a plan within the budget reaches it, so the floor is at most that)."""
        low = self.bound_ms
        if self._admits(low, budget_bytes):
            return low
        while high_ms - low > tolerance * low:
            mid = (low + high_ms) / 2
            if self._admits(mid, budget_bytes):
                high_ms = mid
            else:
                low = mid
        return low


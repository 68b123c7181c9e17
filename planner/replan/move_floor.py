"""A proven floor under every replan (`plan --from`): no plan that moves at most B bytes from
the old plan has its busiest rank below `MoveFloor.ms(B)`, whatever a search finds.

A plan whose busiest rank is T uses, for each table, an option whose every shard costs at most
T, whose shards together add the table's work to the cluster (so the cheapest such options'
work, over the ranks, is at most T), and whose shards keep on their ranks at most what those
ranks held before. What a shard keeps, over every relabelling of the ranks (bytes as `diff`
counts them, the shard's overlap with what its rank held), is bounded three ways:
- each shard on whichever rank of the new world held most of it;
- each old rank keeping at most the shards that fit under T beside each other (one for an
  option whose shards go to distinct ranks: row-wise, data-parallel, table-row-wise), its
  largest overlaps first;
- what is kept lies on old ranks, each carrying at most T: for any price p of a millisecond on
  a set of old ranks, kept bytes <= p x their count x T + the sum over shards of the most each
  keeps less p x its time where it is kept on a priced rank (a Lagrangian relaxation). Prices
  are tried on all old ranks at once (without it, a plan keeping 8 ranks' tables in place could,
  to the floor, spread their work over 16) and on each of the busiest old ranks alone (a rank
  holding three large tables keeps at most what fits under T of them).
Each counts a shard, a rank or a millisecond more than once where a real plan cannot, so what
must move is never overstated. The floor is the least T where the cheapest options under T fit
the work and the least moves of options under T fit the budget; both only ease as T grows, so it
is found by bisection, and the value returned is one where they fail.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Mapping, Sequence

import numpy as np

from planner.cost.cost_model import rows_bytes
from planner.views.diff import shared_block
from planner.plan.document import TablePlan
from planner.spec.types import Placement, ShardingOption


@dataclass(frozen=True, eq=False)  # hashed by identity, for the cache of kept_at_most
class Keeping:
    """What one option could keep of the old plan's bytes, precomputed for every T."""

    held: dict[int, np.ndarray]  # per old rank of the new world, the bytes of each shard it held
    shard_ms: np.ndarray
    distinct_ranks: bool  # shards always on different ranks

    @cached_property
    def overlap_bytes(self) -> int:
        return int(sum(h.sum() for h in self.held.values()))

    @cached_property
    def most_kept_bytes(self) -> np.ndarray:
        """Per shard, the most one old rank held of it."""
        return np.max(list(self.held.values()), axis=0) if self.held else np.zeros(len(self.shard_ms))

    @cached_property
    def _running(self) -> list[np.ndarray]:
        return [np.cumsum(np.sort(h[h > 0])[::-1]) for h in self.held.values() if h.any()]

    def kept_at_most(self, t_ms: float) -> int:
        """Bytes kept in place by any placement where no rank carries more than `t_ms`."""
        least_ms = float(self.shard_ms.min())
        if self.distinct_ranks:
            per_rank = 1
        elif least_ms > 0:
            per_rank = max(1, int(t_ms // least_ms))
        else:
            per_rank = len(self.shard_ms)
        return self._kept_with_at_most(per_rank)

    @lru_cache(maxsize=None)
    def _kept_with_at_most(self, per_rank: int) -> int:
        """`per_rank`: shards of the option one old rank may keep."""
        by_rank = sum(int(sums[min(per_rank, len(sums)) - 1]) for sums in self._running)
        return min(int(self.most_kept_bytes.sum()), by_rank)

    def kept_beyond_time(self, prices: np.ndarray, priced_rank: int | None = None) -> np.ndarray:
        """Per price of a millisecond on the old ranks (all of them, or `priced_rank` alone):
        the most kept bytes less that price of the time the shards kept on priced ranks take,
        each shard kept where it pays most, or not at all."""
        ms = self.shard_ms[:, None]
        if priced_rank is None:
            return np.maximum(0.0, self.most_kept_bytes[:, None] - prices[None, :] * ms).sum(axis=0)
        own = self.held.get(priced_rank, np.zeros(len(self.shard_ms)))
        others = [h for r, h in self.held.items() if r != priced_rank]
        elsewhere = np.max(others, axis=0) if others else np.zeros(len(self.shard_ms))
        return np.maximum(elsewhere[:, None], own[:, None] - prices[None, :] * ms).clip(min=0.0).sum(axis=0)


def option_keeping(option: ShardingOption, layouts: Sequence[tuple[TablePlan | None, TablePlan]], world_size: int,
                   optimizer: str) -> Keeping:
    """`layouts`: (old layout or None for a new table, new layout with any ranks) per real
    table behind the option (several for a co-located group). A new table starts from its
    initial weights and a replica is on every old rank (rank 0 too): neither moves anything."""
    held: dict[int, np.ndarray] = {}
    moving = [(before, after) for before, after in layouts if before is not None and before.sharding_type != "data_parallel"]
    for i in range(len(option.shards)):  # a co-located group: its members' one shards are one
        for before, after in moving:
            for source in before.shards:
                rows, cols = shared_block(after.shards[i], source)
                if rows and cols and source.rank < world_size:
                    held.setdefault(source.rank, np.zeros(len(option.shards)))[i] += rows_bytes(rows, cols, optimizer)
    return Keeping(held, option.shard_ms, option.placement in (Placement.EVERY_RANK, Placement.NODE_RANKS))


class MoveFloor:
    """The floor for any budget, over the search's options (each co-located group one table).
    `old_ranks`: how many ranks of the new world held anything; `priced_alone`: the old ranks
    also priced one at a time (any choice is valid; the busiest bind)."""

    PRICES = 24  # prices of a millisecond tried, spread over the shards' bytes per ms

    def __init__(self, options_by_table: Mapping[str, Sequence[ShardingOption]], keeps: Mapping[str, Sequence[Keeping]],
                 world_size: int, old_ranks: int, priced_alone: Sequence[int], bound_ms: float) -> None:
        self.keeps, self.world, self.bound_ms = keeps, world_size, bound_ms
        ratios = np.concatenate([k.most_kept_bytes / np.maximum(k.shard_ms, 1e-12) for ks in keeps.values() for k in ks] or [np.zeros(1)])
        ratios = ratios[ratios > 0]
        self.prices = np.concatenate([[0.0], np.geomspace(ratios.min(), ratios.max(), self.PRICES)]) if len(ratios) else np.zeros(1)
        self.times = {t: (np.array([o.max_shard_ms for o in opts]), np.array([o.total_ms for o in opts])) for t, opts in options_by_table.items()}
        self.overlap = {t: np.array([k.overlap_bytes for k in ks], dtype=float) for t, ks in keeps.items()}
        self.most_kept = {t: np.array([k.most_kept_bytes.sum() for k in ks]) for t, ks in keeps.items()}
        self.old_ranks = old_ranks
        self.beyond = {t: np.array([k.kept_beyond_time(self.prices) for k in ks]) for t, ks in keeps.items()}
        # a rank priced alone changes only what tables with bytes there keep
        self.alone = {r: {t: np.array([k.kept_beyond_time(self.prices, r) for k in ks])
                          for t, ks in keeps.items() if any(r in k.held for k in ks)} for r in priced_alone}

    def _admits(self, t_ms: float, budget_bytes: float) -> bool:
        work_ms, kept = 0.0, {}  # kept: per table, its options under t_ms and the most each keeps
        for table, (max_shard_ms, total_ms) in self.times.items():
            under = max_shard_ms <= t_ms
            if not under.any():
                return False
            work_ms += float(total_ms[under].min())
            kept[table] = under, np.array([k.kept_at_most(t_ms) if u else 0 for k, u in zip(self.keeps[table], under)], dtype=float)
        if work_ms / self.world > t_ms:
            return False

        def least(table: str, beyond: np.ndarray) -> np.ndarray:
            under, most = kept[table]
            return (self.overlap[table][under, None] - np.minimum(most[under, None], beyond[under])).min(axis=0)

        moved = sum(least(t, self.beyond[t]) for t in kept)
        if float((moved - self.prices * self.old_ranks * t_ms).max()) > budget_bytes:
            return False
        unpriced = {t: float(least(t, self.most_kept[t][:, None]).min()) for t in kept}  # what each moves at least, no time priced
        everywhere = sum(unpriced.values())
        for tables in self.alone.values():
            moved = everywhere + sum(least(t, b) - unpriced[t] for t, b in tables.items())
            if float((moved - self.prices * t_ms).max()) > budget_bytes:
                return False
        return True

    def ms(self, budget_bytes: float, high_ms: float, tolerance: float = 1e-3) -> float:
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

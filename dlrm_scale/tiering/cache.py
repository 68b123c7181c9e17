"""Which rows of a shard sit in its cache, and where: a set-associative index, LRU or LFU.

The index holds no data. For a batch's distinct ids it decides which are hits, which slot
each miss takes and which cached row that slot's old occupant was (to be written back).
Rows a batch uses are locked for that batch: they are never chosen as victims. A set with
more of the batch's rows than ways sends the rest to an overflow region that is emptied at
the next batch (`take_overflow`), so a batch never fails for an unlucky hash.

Everything is vectorised over the batch (torch ops, no Python loop per id), as FBGEMM's
`lxu_cache` kernels are on a GPU. A row is found by comparing its set's tags, as FBGEMM does:
the index costs 8 bytes a slot (an int32 tag and an int32 clock), none per row of the shard
(LFU adds a 1-byte request count a row, and its copy a slot). A dense row -> slot map would
make finding a row one gather, for 4 more bytes a row: most of tiering's resident overhead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from planner.spec.specs import CACHE_POLICIES

EMPTY = -1
MAX_ROWS = 2**31 - 1  # tags are int32
CLOCK_MAX = 2**31 - 1  # clocks are int32: at this batch they are rebased (`tick`)
FREQUENCY_MAX = 2**8 - 1  # LFU's request counts saturate here (uint8)
_HASH = 0x9E3779B97F4A7C15 - 2**64  # Fibonacci hashing spreads consecutive (hot) ids over sets


class CacheTooSmallError(RuntimeError):
    """A batch needs more distinct rows than the cache and its overflow region hold."""


@dataclass
class SlotAssignment:
    """What one batch does to the cache. Slots index the cache's rows, 0..capacity-1."""

    slots: torch.Tensor  # slot of each requested id, in the order given
    load_ids: torch.Tensor  # misses: read these rows from the backing store ...
    load_slots: torch.Tensor  # ... into these slots
    evict_ids: torch.Tensor  # rows pushed out of the cache: write them back if dirty ...
    evict_slots: torch.Tensor  # ... from these slots (before the loads overwrite them)


@dataclass
class CacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    overflow: int = 0

    def add(self, hits: int, misses: int, evictions: int, overflow: int) -> None:
        self.hits += hits
        self.misses += misses
        self.evictions += evictions
        self.overflow += overflow

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions, "overflow": self.overflow}


def split_capacity(cache_rows: int, ways: int) -> tuple[int, int, int]:
    """(sets, ways, overflow rows) for a cache of `cache_rows`: about 1/32 of it (at least one
    set's worth when there is room) serves overflow, the rest is whole sets."""
    if cache_rows < 2:
        raise ValueError(f"a row cache needs at least 2 rows, got {cache_rows}")
    ways = max(1, min(ways, cache_rows // 2))
    overflow = max(ways, cache_rows // 32)
    sets = max(1, (cache_rows - overflow) // ways)
    return sets, ways, cache_rows - sets * ways


class SetAssociativeCache:
    def __init__(self, cache_rows: int, num_rows: int, ways: int = 32, policy: str = "lru") -> None:
        if policy not in CACHE_POLICIES:
            raise ValueError(f"cache policy {policy!r} is not one of {CACHE_POLICIES}")
        self.sets, self.ways, self.overflow_rows = split_capacity(cache_rows, ways)
        self.capacity = cache_rows
        self.policy = policy
        if num_rows > MAX_ROWS:
            raise ValueError(f"a cached shard holds at most {MAX_ROWS:,} rows, got {num_rows:,}")
        self.num_rows = num_rows
        self.tags = torch.full((self.sets, self.ways), EMPTY, dtype=torch.int32)
        self.last_used = torch.zeros((self.sets, self.ways), dtype=torch.int32)
        # LFU ranks rows by how often they were ever requested (as FBGEMM's LFU cache does),
        # counting to FREQUENCY_MAX, one byte a row (the resident overhead per row is what
        # tiering must keep small): rows requested in that many batches compete by recency, as
        # small saturating counters do in TinyLFU-style caches. On a Zipf law those rows are a
        # sliver of a shard (1.05, 2M rows, 16k ids a batch: ~0.2M after 100k batches, a 10%
        # cache's worth); below 255 batches nothing saturates.
        self.frequency = torch.zeros(num_rows, dtype=torch.uint8) if policy == "lfu" else None
        # and each way's row's count beside its tag (1 byte a slot): a victim is chosen from
        # its set's counts, not from 32 rows' entries scattered over the shard's
        self.way_frequency = torch.zeros((self.sets, self.ways), dtype=torch.uint8) if policy == "lfu" else None
        self.overflow_ids = torch.empty(0, dtype=torch.int64)
        self.clock = 0
        self.counters = CacheCounters()

    def set_of(self, ids: torch.Tensor) -> torch.Tensor:
        return ((ids * _HASH) >> 20).remainder(self.sets)

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """Slot of each id, or -1 if not cached (overflow rows count as cached). Read-only."""
        sets = self.set_of(ids)
        match = self.tags[sets] == ids[:, None]
        slots = torch.where(match.any(1), sets * self.ways + match.byte().argmax(1), EMPTY)
        if len(self.overflow_ids):  # sorted
            at = torch.searchsorted(self.overflow_ids, ids).clamp(max=len(self.overflow_ids) - 1)
            slots = torch.where(self.overflow_ids[at] == ids, self.sets * self.ways + at, slots)
        return slots

    def tick(self) -> int:
        """The next batch's clock. Past CLOCK_MAX the clocks are renumbered by rank, which
        keeps their order, so that every later decision is the one an int64 clock makes."""
        if self.clock == CLOCK_MAX:
            _, order = torch.unique(self.last_used, return_inverse=True)
            self.last_used.copy_(order)
            self.clock = int(order.max())
        self.clock += 1
        return self.clock

    def take_overflow(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The previous batch's overflow rows and their slots, now leaving the cache."""
        ids = self.overflow_ids
        self.overflow_ids = torch.empty(0, dtype=torch.int64)
        return ids, self.sets * self.ways + torch.arange(len(ids))

    def assign(self, ids: torch.Tensor) -> SlotAssignment:
        """Make the distinct `ids` (sorted, as torch.unique gives them) resident; call
        take_overflow() first. Returns where each lives and what moves."""
        self.tick()
        W = self.ways
        slots = self.lookup(ids)
        hit = slots >= 0
        self.last_used.view(-1)[slots[hit]] = self.clock
        if self.frequency is not None:
            counts = self.frequency[ids]
            counts = torch.where(counts < FREQUENCY_MAX, counts + 1, counts)
            self.frequency[ids] = counts
            self.way_frequency.view(-1)[slots[hit]] = counts[hit]

        miss = ~hit
        miss_ids = ids[miss]
        miss_sets = self.set_of(miss_ids)
        n_miss = len(miss_ids)
        self.counters.hits += int(hit.sum())
        self.counters.misses += n_miss
        empty = torch.empty(0, dtype=torch.int64)
        if n_miss == 0:
            return SlotAssignment(slots, empty, empty, empty, empty)

        touched, miss_group = torch.unique(miss_sets, return_inverse=True)
        order, available = self._victims(touched)

        # k-th miss of a set takes the set's k-th victim
        by_set = torch.argsort(miss_group, stable=True)
        grouped = miss_group[by_set]
        starts = torch.searchsorted(grouped, grouped, right=False)
        rank = torch.empty_like(by_set)
        rank[by_set] = torch.arange(n_miss) - starts
        fits = rank < available[miss_group]

        way = order[miss_group[fits], rank[fits]]
        victim_sets = touched[miss_group[fits]]
        old = self.tags[victim_sets, way].long()
        placed_ids = miss_ids[fits]
        self.tags[victim_sets, way] = placed_ids.to(torch.int32)
        self.last_used[victim_sets, way] = self.clock
        if self.frequency is not None:
            self.way_frequency[victim_sets, way] = self.frequency[placed_ids]
        placed_slots = victim_sets * W + way
        miss_slots = torch.empty(n_miss, dtype=torch.int64)
        miss_slots[fits] = placed_slots

        spill = miss_ids[~fits]
        if len(spill) > self.overflow_rows:
            raise CacheTooSmallError(self.too_small(len(ids), len(spill)))
        self.overflow_ids = spill  # sorted, since ids are
        miss_slots[~fits] = self.sets * W + torch.arange(len(spill))
        self.counters.overflow += len(spill)
        slots[miss] = miss_slots

        evicted = old >= 0
        self.counters.evictions += int(evicted.sum())
        return SlotAssignment(slots, miss_ids, miss_slots, old[evicted], placed_slots[evicted])

    def too_small(self, distinct: int, spilled: int) -> str:
        return (f"a batch needs {distinct} distinct rows and {spilled} found no way in their set "
                f"(the cache holds {self.capacity}, of which {self.overflow_rows} for such rows); raise the cache load factor")

    def _victims(self, sets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per set: its ways in eviction order (empty first, then by the policy; ways hit this
        batch are locked and come last) and how many ways are not locked."""
        tags = self.tags[sets]
        if self.frequency is not None:
            freq = torch.where(tags >= 0, self.way_frequency[sets].to(torch.int64), -1)
            priority = (freq << 32) + self.last_used[sets]
        else:
            priority = self.last_used[sets].long()
        priority[tags == EMPTY] = -1
        locked = self.last_used[sets] == self.clock
        priority[locked] = torch.iinfo(torch.int64).max
        return torch.argsort(priority, dim=1, stable=True), self.ways - locked.sum(1)

    def cached_ids(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Every cached row and its slot (overflow included)."""
        flat = self.tags.reshape(-1)
        present = flat >= 0
        slots = torch.arange(len(flat))[present]
        ids, over_slots = self.overflow_ids, self.sets * self.ways + torch.arange(len(self.overflow_ids))
        return torch.cat([flat[present].long(), ids]), torch.cat([slots, over_slots])

    def clear(self) -> None:
        """Forget every row (after the backing store was replaced, e.g. by a checkpoint)."""
        self.tags.fill_(EMPTY)
        self.last_used.zero_()
        self.overflow_ids = torch.empty(0, dtype=torch.int64)
        if self.frequency is not None:
            self.frequency.zero_()
            self.way_frequency.zero_()

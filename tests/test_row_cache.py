"""The set-associative row cache against a brute-force model of the same policy."""

from __future__ import annotations

import pytest
import torch

from dlrm_scale.tiering.cache import CLOCK_MAX, CacheTooSmallError, SetAssociativeCache


def batches(rows, ids, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = torch.arange(1, rows + 1, dtype=torch.float64) ** -1.0
    return [torch.unique(torch.multinomial(weights, ids, replacement=True, generator=g)) for _ in range(n)]


def check_invariants(cache, ids, a):
    assert len(torch.unique(a.slots)) == len(ids)  # one slot per row
    assert int(a.slots.min()) >= 0 and int(a.slots.max()) < cache.capacity
    assert torch.equal(cache.lookup(ids), a.slots)  # every row of the batch is resident where it was put
    assert not torch.isin(a.evict_ids, ids).any()  # rows the batch uses are never evicted for it
    assert torch.equal(torch.sort(a.load_slots[torch.isin(a.load_slots, a.evict_slots)]).values,
                       torch.sort(a.evict_slots).values)  # each victim's slot is refilled


def test_lru_matches_per_set_brute_force():
    """One row per batch, so recency has no ties: each set must behave as an exact LRU list."""
    cache = SetAssociativeCache(cache_rows=64, num_rows=2000, ways=4, policy="lru")
    model = {s: [] for s in range(cache.sets)}  # per set, rows from least to most recent
    g = torch.Generator().manual_seed(0)
    weights = torch.arange(1, 2001, dtype=torch.float64) ** -0.8
    for x in torch.multinomial(weights, 3000, replacement=True, generator=g).tolist():
        ids = torch.tensor([x])
        cache.take_overflow()
        s = int(cache.set_of(ids))
        hit = x in model[s]
        before = cache.counters.hits
        a = cache.assign(ids)
        check_invariants(cache, ids, a)
        assert cache.counters.hits - before == hit
        evicted = [] if hit or len(model[s]) < cache.ways else [model[s][0]]
        assert a.evict_ids.tolist() == evicted
        model[s] = [r for r in model[s] if r != x and r not in evicted] + [x]


def test_batches_keep_every_invariant():
    cache = SetAssociativeCache(cache_rows=256, num_rows=2000, ways=8, policy="lru")
    for ids in batches(2000, 100, 60):
        cache.take_overflow()
        check_invariants(cache, ids, cache.assign(ids))
    assert cache.counters.evictions > 0


def test_lfu_keeps_the_most_requested_rows():
    cache = SetAssociativeCache(cache_rows=512, num_rows=5000, ways=16, policy="lfu")
    for ids in batches(5000, 300, 80):
        cache.take_overflow()
        check_invariants(cache, ids, cache.assign(ids))
    hot = torch.arange(100)  # the Zipf head: requested in nearly every batch
    assert (cache.lookup(hot) >= 0).float().mean() > 0.95


def test_a_set_with_more_rows_than_ways_spills_to_overflow_then_writes_back():
    cache = SetAssociativeCache(cache_rows=64, num_rows=100_000, ways=4, policy="lru")
    same_set = [i for i in range(100_000) if int(cache.set_of(torch.tensor([i]))) == 0][:7]
    ids = torch.tensor(same_set)
    a = cache.assign(ids)
    check_invariants(cache, ids, a)
    assert cache.counters.overflow == 3
    spilled, slots = cache.take_overflow()
    assert len(spilled) == 3 and bool((slots >= cache.sets * cache.ways).all())
    assert bool((cache.lookup(spilled) < 0).all())  # gone from the cache once taken


def test_a_batch_larger_than_the_cache_is_a_clear_error():
    cache = SetAssociativeCache(cache_rows=32, num_rows=1000, ways=4)
    with pytest.raises(CacheTooSmallError, match="raise the cache load factor"):
        cache.assign(torch.arange(200))


def test_clear_forgets_everything():
    cache = SetAssociativeCache(cache_rows=64, num_rows=1000, ways=4, policy="lfu")
    cache.assign(torch.arange(20))
    cache.clear()
    assert bool((cache.lookup(torch.arange(20)) < 0).all()) and len(cache.cached_ids()[0]) == 0


@pytest.mark.parametrize("policy", ["lru", "lfu"])
def test_clocks_past_their_int32_range_are_renumbered_without_changing_a_decision(policy):
    """A cache whose clock reaches CLOCK_MAX (its clocks shifted up by as much) decides every
    later batch as one that started at zero."""
    plain, late = (SetAssociativeCache(cache_rows=128, num_rows=2000, ways=4, policy=policy) for _ in range(2))
    trace = batches(2000, 60, 40, seed=3)
    for ids in trace[:10]:
        for c in (plain, late):
            c.take_overflow()
            c.assign(ids)
    shift = CLOCK_MAX - plain.clock
    late.last_used[late.last_used > 0] += shift
    late.clock = CLOCK_MAX
    for ids in trace[10:]:
        plain.take_overflow(), late.take_overflow()
        a, b = plain.assign(ids), late.assign(ids)
        assert torch.equal(a.slots, b.slots) and torch.equal(a.evict_ids, b.evict_ids)
        assert int(late.last_used.max()) <= late.clock < CLOCK_MAX  # renumbered, not wrapped
    assert torch.equal(plain.tags, late.tags) and plain.counters == late.counters and plain.counters.evictions > 0


def test_the_index_costs_nothing_per_row_of_the_shard_beyond_lfu_counts():
    lru = SetAssociativeCache(cache_rows=1000, num_rows=1_000_000, ways=32, policy="lru")
    lfu = SetAssociativeCache(cache_rows=1000, num_rows=1_000_000, ways=32, policy="lfu")
    for c in (lru, lfu):
        c.assign(torch.arange(0, 1_000_000, 1250))
    held = lambda c: sum(t.numel() * t.element_size() for t in vars(c).values() if isinstance(t, torch.Tensor))  # noqa: E731
    assert held(lru) <= 8 * 1000 and held(lfu) <= 10 * 1000 + 2 * 1_000_000  # tags and clocks a slot; LFU's counts a slot and a row
    with pytest.raises(ValueError, match="at most 2,147,483,647 rows"):
        SetAssociativeCache(cache_rows=1000, num_rows=2**31, ways=32)

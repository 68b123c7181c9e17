"""The CPU tiering layer's single-process parts: resident layout, store checks, a shard's cache."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from dlrm_scale.tiering.cache import FREQUENCY_MAX, SetAssociativeCache
from dlrm_scale.tiering.store import FileRowStore, MemoryRowStore
from dlrm_scale.bridge.resident import resident_plan, resident_tables
from dlrm_scale.tiering.runtime import TieredShard, check_store_directory
from planner.plan.document import Plan, table_layout
from planner.spec.specs import TableSpec
from planner.spec.types import ShardingType


def test_resident_plan_shards_each_cached_table_as_its_cache():
    big, small = TableSpec("big", 10_000, 16), TableSpec("small", 100, 16)
    plan = Plan(2, 2, {"big": table_layout(big, ShardingType.COLUMN_WISE, [1, 0], "ssd", 0.3),
                       "small": table_layout(small, ShardingType.TABLE_WISE, [1], "ddr")}, (), 0.0, 0.0)
    resident = resident_plan(plan)
    b = resident.tables["big"]
    assert b.compute_kernel == "fused" and b.num_embeddings == 3000
    assert [(s.rank, s.rows, s.cols, s.col_offset) for s in b.shards] == [(1, 3000, 8, 0), (0, 3000, 8, 8)]
    assert resident.tables["small"] == plan.tables["small"]
    assert [t.num_embeddings for t in resident_tables([big, small], plan)] == [3000, 100]


def test_store_directory_check_passes_for_a_writable_directory_with_room(tmp_path):
    t = TableSpec("a", 1000, 16)
    plan = Plan(2, 2, {"a": table_layout(t, ShardingType.TABLE_WISE, [1], "ssd", 0.1)}, (), 0.0, 0.0)
    check_store_directory(plan, [1], tmp_path, "rowwise_adagrad")
    check_store_directory(plan, [0], None, "rowwise_adagrad")  # rank 0 keeps nothing on SSD
    check_store_directory(plan, [1], tmp_path, "rowwise_adagrad", io="direct")
    assert not list(tmp_path.iterdir())  # the probe file is gone


def shard(rows=1000, cache_rows=64, cols=4, reader=None, compiled=True, store=None, policy="lru", ways=4):
    weights, momentum = torch.zeros(cache_rows, cols), torch.zeros(cache_rows)
    store = store or MemoryRowStore(rows, cols, 1)
    store.fill(0, torch.cat([torch.arange(rows, dtype=torch.float32)[:, None].expand(rows, cols),
                             torch.zeros(rows, 1)], 1))
    cache = SetAssociativeCache(cache_rows, rows, ways, policy)
    return TieredShard("t", weights, [momentum], store, cache, reader, compiled), weights, momentum


both_passes = pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "torch"])


@both_passes
def test_install_puts_each_row_in_its_slot_and_writes_updates_back_on_eviction(compiled):
    s, weights, momentum = shard(compiled=compiled)
    updates = torch.zeros(1000)  # how often each row was "trained"
    g = torch.Generator().manual_seed(0)
    for _ in range(40):
        ids = torch.randint(0, 1000, (30,), generator=g)
        slots = s.install(ids, training=True)
        assert torch.equal(weights[slots, 0], ids.float() + updates[ids])  # the row's newest value, wherever it was
        rows, first = torch.unique(ids), torch.unique(slots)
        updates[rows] += 1  # "train": every looked-up row goes up by one, as the fused optimizer would
        weights[first] += 1.0
        momentum[first] += 1.0
    records = s.records()
    assert torch.equal(records[:, 0], torch.arange(1000).float() + updates)
    assert torch.equal(records[:, 4], updates)
    assert s.counters.written_back_rows > 0


def test_the_compiled_pass_times_its_parts_within_the_install(tmp_path):
    s, _, _ = shard(rows=20_000, cache_rows=4096, store=FileRowStore(20_000, 4, 1, tmp_path / "rows.f32"), ways=32)
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        s.install(torch.randint(0, 20_000, (1000,), generator=g), training=True)
    c = s.counters
    assert min(c.index_ns, c.move_ns, c.append_ns) > 0  # every part ran: lookups, rows moved, the log appended to
    assert c.index_ns + c.move_ns + c.append_ns <= c.install_us * 1000  # parts of the install, never more


@both_passes
@pytest.mark.parametrize("threaded", [False, True])
def test_prefetched_rows_are_used_and_never_stale(tmp_path, threaded, compiled):
    store = FileRowStore(1000, 4, 1, tmp_path / "t.f32")  # read with pread: read ahead with or without a thread
    s, weights, _ = shard(cache_rows=256, reader=ThreadPoolExecutor(1) if threaded else None, compiled=compiled, store=store)
    first = torch.arange(0, 50)
    s.install(first, training=True)
    weights[s.cache.lookup(first)] += 100.0  # the batch updates its rows
    nxt = torch.arange(25, 75)
    s.prefetch(nxt)
    slots = s.install(nxt, training=True)
    assert s.counters.prefetched_rows == 25  # rows 50..74 came from the read-ahead
    assert torch.equal(weights[slots[:25], 0], torch.arange(25, 50).float() + 100.0)  # cached ones kept their update
    assert torch.equal(weights[slots[25:], 0], torch.arange(50, 75).float())


@pytest.mark.parametrize("kind", ["ddr", "ssd_mapped"])
def test_rows_the_pass_copies_directly_are_read_ahead_only_in_the_background(tmp_path, kind):
    for reader, ahead in ((None, 0), (ThreadPoolExecutor(1), 25)):
        store = FileRowStore(1000, 4, 1, tmp_path / f"{ahead}.f32", io="mapped") if kind == "ssd_mapped" else None
        s, weights, _ = shard(cache_rows=256, reader=reader, store=store)
        assert s.store.addressable and s.reads_ahead == (reader is not None)
        s.install(torch.arange(0, 50), training=True)
        weights[s.cache.lookup(torch.arange(0, 50))] += 100.0
        s.prefetch(torch.arange(25, 75))
        slots = s.install(torch.arange(25, 75), training=True)
        assert s.counters.prefetched_rows == ahead and s.counters.loaded_rows == 75
        assert torch.equal(weights[slots, 0], torch.arange(25, 75).float() + 100.0 * (torch.arange(25, 75) < 50))


@both_passes
def test_evaluation_batches_do_not_dirty_rows(compiled):
    s, _, _ = shard(cache_rows=256, compiled=compiled)
    s.install(torch.arange(0, 60), training=False)
    s.install(torch.arange(100, 160), training=False)
    assert s.counters.written_back_rows == 0


@pytest.mark.parametrize("policy,ways", [("lru", 4), ("lfu", 4), ("lru", 12)])
@pytest.mark.parametrize("kind", ["ddr", "ssd", "ssd_direct", "ssd_mapped"])
def test_the_compiled_pass_decides_and_moves_exactly_as_the_torch_pass(tmp_path, policy, ways, kind):
    """Same slots, index, dirty bits and counters after every batch, and the same records at the
    end, with overflowing sets, prefetches, evaluation batches and a log too small for a batch
    (the compiled pass reading with O_DIRECT, through the page cache, or from the mappings;
    finding rows by eight tags at a time and one by one: 12 ways)."""
    def make(compiled):
        io = {"ssd_direct": "direct", "ssd_mapped": "mapped"}.get(kind, "pread") if compiled else "pread"
        store = FileRowStore(2000, 4, 1, tmp_path / f"{compiled}.f32", log_rows=40, io=io) if kind != "ddr" else None
        return shard(rows=2000, cache_rows=96, compiled=compiled, store=store, policy=policy, ways=ways)

    (c, cw, cm), (t, tw, tm) = make(True), make(False)
    assert c._kernels is not None and t._kernels is None
    if policy == "lfu":  # the hottest rows' request counts reach the ceiling and stay there
        for s in (c, t):
            s.cache.frequency[:3] = FREQUENCY_MAX - 5
    g = torch.Generator().manual_seed(1)
    zipf = torch.arange(1, 2001, dtype=torch.float64) ** -1.0
    for step in range(60):
        ids = torch.multinomial(zipf, 70, replacement=True, generator=g)
        training = step % 7 != 3
        if step % 3 == 0:
            c.prefetch(ids)
            t.prefetch(ids)
        sc, st = c.install(ids, training), t.install(ids, training)
        assert torch.equal(sc, st)
        for name in ("tags", "last_used", "overflow_ids", "frequency", "way_frequency"):
            a, b = getattr(c.cache, name), getattr(t.cache, name)
            assert (a is None and b is None) or torch.equal(a, b), name
        assert torch.equal(c.dirty, t.dirty) and c.cache.counters == t.cache.counters
        assert c.counters.loaded_rows == t.counters.loaded_rows and c.counters.written_back_rows == t.counters.written_back_rows
        # a pass that copies from memory or a mapping reads nothing ahead (without a thread)
        assert c.counters.prefetched_rows == (0 if c.store.addressable else t.counters.prefetched_rows)
        for w, m in ((cw, cm), (tw, tm)):  # "train" the batch's rows
            w[torch.unique(sc)] += 0.5
            m[torch.unique(sc)] += 1.0
    assert c.cache.counters.overflow > 0 and c.counters.written_back_rows > 40
    if policy == "lfu":
        assert int(c.cache.frequency.max()) == FREQUENCY_MAX and int(c.cache.frequency.min()) >= 0
    assert torch.equal(c.records(), t.records())


@pytest.mark.parametrize("policy", ["lru", "lfu"])
@pytest.mark.parametrize("tier", ["ssd", "ddr"])
def test_the_planner_counts_the_cache_index_the_cpu_runtime_holds(tmp_path, policy, tier):
    from planner.cost.cost_model import cache_index_bytes

    rows, cache_rows, dim = 100_000, 4_000, 8
    store = FileRowStore(rows, dim, 1, tmp_path / "rows.f32") if tier == "ssd" else MemoryRowStore(rows, dim, 1)
    cache = SetAssociativeCache(cache_rows, rows, 32, policy)
    shard = TieredShard("t", torch.zeros(cache_rows, dim), [torch.zeros(cache_rows)], store, cache, None)
    shard.install(torch.arange(0, rows, 50), training=True)
    # the cache's tensors, the shard's dirty flags and (a file store) each row's log location
    index = [t for t in vars(cache).values() if isinstance(t, torch.Tensor)] + [shard.dirty]
    index += [store.location] if tier == "ssd" else []
    held = sum(t.numel() * t.element_size() for t in index)
    planned = cache_index_bytes(rows, cache_rows, policy, tier, "cpu")
    # the planner counts tags and clocks for every slot; overflow slots (1/32) hold none
    assert held <= planned <= held + 11 * cache.overflow_rows
    if tier == "ssd":
        store.close()

"""Cached tables on CPU: rows in DDR or on SSD behind a row cache, inside TorchRec's sharded model.

FBGEMM's caching kernels (`fused_uvm_caching`, `key_value`) are CUDA-only, so on CPU a cached
table is trained like this:
- TorchRec shards a *resident* table of the plan's cache rows (`resident_plan`), computed
  with the ordinary fused TBE kernel and its fused optimizer;
- the logical rows and their optimizer state live in a row store (`dlrm_scale.tiering.store`: a
  host tensor, or memory-mapped files), one per shard this rank holds;
- a forward pre-hook on the TBE maps each batch's ids to cache slots (`TieredShard.install`),
  first writing evicted dirty rows back and loading missed ones, so the TBE and its fused
  optimizer only ever see resident slots;
- with the pipeline, where a store is read with pread or O_DIRECT, the next batch's missed rows
  are read as soon as its ids reach this rank, while the current batch trains
  (`PrefetchingPipeline`; in a background thread with `TieringRuntime.prefetch_thread`); a DDR
  or mapped store is copied from directly by the install (`TieredShard.reads_ahead`).
TorchRec routes ids to shards before the hook sees them, so ids are never rewritten across
ranks; row-wise schemes, which bucketize ids by the rows TorchRec holds, cannot be cached here.
"""

from __future__ import annotations

import os
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from torchrec.distributed.batched_embedding_kernel import BaseBatchedEmbeddingBag

from dlrm_scale.bridge.resident import embedding_kernels
from dlrm_scale.kernels.cpu_extension import built, load
from dlrm_scale.tiering.cache import MAX_ROWS, CacheTooSmallError, SetAssociativeCache
from dlrm_scale.tiering.store import FileRowStore, MemoryRowStore, open_direct
from planner.cost.cost_model import slow_tier_bytes
from planner.spec.errors import ConfigError
from planner.plan.document import Plan, PlannedShard

CACHE_WAYS = 32  # as FBGEMM's set-associative caches
FREE_DISK_MARGIN = 1.05  # room for the store files plus 5% (checkpoints copy them elsewhere)
_NO_IDS = torch.empty(0, dtype=torch.int64)
_NO_RECORDS = torch.empty(0, 0, dtype=torch.float32)
_NO_FREQUENCY = torch.empty(0, dtype=torch.uint8)


def store_file(directory: Path, table: str, shard: PlannedShard) -> Path:
    return directory / f"{table}.rows{shard.row_offset}.cols{shard.col_offset}.rank{shard.rank}.f32"


def check_store_directory(plan: Plan, ranks: list[int], directory: Path | None, optimizer: str, io: str = "pread") -> None:
    """Before training: the SSD directory exists, is writable (and reads with O_DIRECT, for
    `io` "direct") and has room for the files of the shards of `ranks` kept there (their logs
    full), so that a disk filling up never stops a run midway. One line naming the
    directory and the fix otherwise."""
    needed = sum(
        slow_tier_bytes(s.rows, s.cols, optimizer, "ssd", "cpu")
        for t in plan.tables.values() if t.cached for s in t.shards if s.tier == "ssd" and s.rank in ranks
    )
    if needed == 0:
        return
    if directory is None:
        raise ConfigError(f"the plan keeps rows on SSD ({needed:,} bytes of store files) but no store directory is set; pass --store-dir DIR")
    if directory.exists() and not directory.is_dir():
        raise ConfigError(f"store directory {directory} is a file, not a directory; pass a directory as --store-dir")
    if not directory.is_dir():
        raise ConfigError(f"store directory {directory} does not exist; create it or pass another --store-dir")
    probe = directory / f".dlrm_scale_probe_{os.getpid()}"
    try:  # os.access says yes to root on a read-only mount; creating a file tells
        probe.touch()
    except OSError:
        raise ConfigError(f"store directory {directory} is not writable; fix its permissions or pass another --store-dir") from None
    try:
        if io == "direct":
            os.close(open_direct(probe))
    finally:
        probe.unlink()
    free = shutil.disk_usage(directory).free
    if free < needed * FREE_DISK_MARGIN:
        raise ConfigError(
            f"store directory {directory} has {free:,} bytes free but the plan's SSD store files need {int(needed * FREE_DISK_MARGIN):,}; "
            f"free space or pass another --store-dir"
        )


def check_row_cache_rows(plan: Plan) -> None:
    """Before training on CPU: every cached table's rows fit the row cache's int32 tags."""
    for name, t in plan.tables.items():
        if t.cached and t.num_embeddings > MAX_ROWS:
            raise ConfigError(f"cached table '{name}' has {t.num_embeddings:,} rows, more than a row cache indexes "
                              f"({MAX_ROWS:,}); hash its ids to fewer rows, or plan without tiering (tiering: {{enabled: false}})")


# ---- one cached shard -----------------------------------------------------------------------
@dataclass
class ShardCounters:
    loaded_rows: int = 0
    prefetched_rows: int = 0  # of the loaded rows, those read ahead in the background
    written_back_rows: int = 0
    install_us: int = 0  # time the forward waited on the cache (lookup, write-back, loads)
    # of it, in the compiled pass: finding the ids and choosing victims, moving rows in and out
    # of the cache, and appending the written-back rows to the store's log (one write a batch)
    index_ns: int = 0
    move_ns: int = 0
    append_ns: int = 0


class TieredShard:
    """The cache slots of one shard in the TBE (weights and optimizer-state views) and the
    store behind them."""

    def __init__(self, name: str, weights: torch.Tensor, states: list[torch.Tensor], store: MemoryRowStore,
                 cache: SetAssociativeCache, reader: ThreadPoolExecutor | None, compiled: bool = True) -> None:
        """`compiled`: the per-batch pass in C++ (row_cache_cpu.cpp) where it builds and the
        views are contiguous fp32, else in torch ops (same decisions, several times slower)."""
        self.name = name
        self.weights, self.states = weights, states
        self.store, self.cache = store, cache
        self.dirty = torch.zeros(weights.shape[0], dtype=torch.bool)
        self.counters = ShardCounters()
        self._reader = reader
        self._staged: tuple[torch.Tensor, Future] | None = None
        self._next_batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        views = [weights, *states]
        self._kernels = load() if compiled and all(v.is_contiguous() and v.dtype == torch.float32 for v in views) and built() else None

    # records: weights then each optimizer state, flattened per row
    def _gather(self, slots: torch.Tensor) -> torch.Tensor:
        parts = [self.weights.index_select(0, slots)]
        parts += [s.index_select(0, slots).reshape(len(slots), -1) for s in self.states]
        return torch.cat(parts, dim=1)

    def _scatter(self, slots: torch.Tensor, records: torch.Tensor) -> None:
        cols = self.weights.shape[1]
        self.weights.index_copy_(0, slots, records[:, :cols])
        at = cols
        for s in self.states:
            width = s[0].numel()
            s.index_copy_(0, slots, records[:, at:at + width].reshape((len(slots), *s.shape[1:])))
            at += width

    def _write_back(self, ids: torch.Tensor, slots: torch.Tensor) -> None:
        dirty = self.dirty[slots]
        if dirty.any():
            if self._staged is not None:
                # the read ahead finishes first (a write may compact the files under it), and
                # drops rows about to be written: its copies of them would be stale
                staged_ids, future = self._staged
                keep = ~torch.isin(staged_ids, ids[dirty])
                self._staged = (staged_ids[keep], _done(future.result()[keep]))
            self.store.write(ids[dirty], self._gather(slots[dirty]))
            self.counters.written_back_rows += int(dirty.sum())
            self.dirty[slots] = False

    @property
    def reads_ahead(self) -> bool:
        """Whether `prefetch` reads anything: not for a store the compiled pass copies from
        directly (memory, a mapped file) unless in the background, where reading ahead would
        only copy each row twice."""
        return self._kernels is None or self._reader is not None or not self.store.addressable

    def prefetch(self, ids: torch.Tensor) -> None:
        """Read the rows of `ids` that are not cached now (where the shard `reads_ahead`): in
        the background when the shard has a reader thread, else right away (while the current
        batch is between its forward and backward: with one core per rank a thread only
        competes for it)."""
        if not self.reads_ahead:
            return
        if self._kernels is not None:
            missing = self._kernels.row_cache_missing(ids, self.cache.tags, self.cache.num_rows)
            b = self.store.backing()
            read = lambda rows: self._kernels.row_store_read(rows, *b)  # noqa: E731
        else:
            uniq, inverse = torch.unique(ids, return_inverse=True)
            self._next_batch = (ids, uniq, inverse)  # install() reuses the deduplication
            missing, read = uniq[self.cache.lookup(uniq) < 0], self.store.read
        if not len(missing):
            self._staged = None
        elif self._reader is None:
            self._staged = (missing, _done(read(missing)))
        else:
            self._staged = (missing, self._reader.submit(read, missing))

    def install(self, ids: torch.Tensor, training: bool) -> torch.Tensor:
        """Make `ids` resident; returns the cache slot of each. Rows a training batch touches
        are dirty (its fused optimizer will update them) and get written back on eviction."""
        start = time.perf_counter()
        slots = self._install_compiled(ids, training) if self._kernels is not None else self._install_torch(ids, training)
        self._staged = None
        self.counters.install_us += int((time.perf_counter() - start) * 1e6)
        return slots

    def _install_compiled(self, ids: torch.Tensor, training: bool) -> torch.Tensor:
        cache, store = self.cache, self.store
        staged_ids, staged_records = _NO_IDS, _NO_RECORDS
        if self._staged is not None:
            staged_ids, future = self._staged
            staged_records = future.result()  # before any write: the read must not race one
        store.reserve_log(len(cache.overflow_ids) + len(ids))
        slots, overflow, stats = self._kernels.row_cache_install(
            ids, cache.tags, cache.last_used, *((_NO_FREQUENCY, _NO_FREQUENCY) if cache.frequency is None else (cache.frequency, cache.way_frequency)),
            cache.num_rows,
            cache.tick(), cache.overflow_ids, cache.overflow_rows, self.weights, self.states, self.dirty, *store.backing(),
            store.log_used, staged_ids, staged_records, training)
        hits, misses, evictions, spilled, loaded, prefetched, written, store.log_used, index_ns, move_ns, append_ns = stats.tolist()
        if spilled > cache.overflow_rows:
            raise ConfigError(f"cached table '{self.name}': {cache.too_small(len(torch.unique(ids)), spilled)} (in its plan)")
        cache.overflow_ids = overflow
        cache.counters.add(hits, misses, evictions, spilled)
        self.counters.loaded_rows += loaded
        self.counters.prefetched_rows += prefetched
        self.counters.written_back_rows += written
        self.counters.index_ns += index_ns
        self.counters.move_ns += move_ns
        self.counters.append_ns += append_ns
        return slots

    def _install_torch(self, ids: torch.Tensor, training: bool) -> torch.Tensor:
        over_ids, over_slots = self.cache.take_overflow()
        if len(over_ids):
            self._write_back(over_ids, over_slots)
        if self._next_batch is not None and torch.equal(self._next_batch[0], ids):
            _, uniq, inverse = self._next_batch
        else:
            uniq, inverse = torch.unique(ids, return_inverse=True)
        self._next_batch = None
        try:
            a = self.cache.assign(uniq)
        except CacheTooSmallError as e:
            raise ConfigError(f"cached table '{self.name}': {e} (in its plan)") from None
        if len(a.evict_ids):
            self._write_back(a.evict_ids, a.evict_slots)
        if len(a.load_ids):
            self._scatter(a.load_slots, self._read(a.load_ids))
            self.dirty[a.load_slots] = False
            self.counters.loaded_rows += len(a.load_ids)
        if training:
            self.dirty[a.slots] = True
        self.store.release()  # the torch ops read and wrote the store's mappings
        return a.slots[inverse]

    def _read(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows from the prefetched batch where it has them, the rest from the store."""
        if self._staged is None:
            return self.store.read(ids)
        staged_ids, future = self._staged
        records = future.result()
        if len(staged_ids) == 0:
            return self.store.read(ids)
        pos = torch.searchsorted(staged_ids, ids).clamp(max=len(staged_ids) - 1)
        found = staged_ids[pos] == ids
        out = torch.empty(len(ids), self.store.width, dtype=records.dtype)
        out[found] = records[pos[found]]
        if (~found).any():
            out[~found] = self.store.read(ids[~found])
        self.counters.prefetched_rows += int(found.sum())
        return out

    def flush(self) -> None:
        """Write every dirty cached row back, so the store alone holds the shard."""
        ids, slots = self.cache.cached_ids()
        if len(ids):
            self._write_back(ids, slots)
        self.store.flush()

    def invalidate(self) -> None:
        """Forget the cache (its rows are stale after the store was replaced)."""
        self.cache.clear()
        self.dirty.zero_()
        self._staged = self._next_batch = None

    def records(self) -> torch.Tensor:
        """Every row's record (weights, then optimizer state), the cache written back first."""
        self.flush()
        return self.store.read(torch.arange(self.store.num_rows))

    def initialise(self, weights_of) -> None:
        """Every row's weights from weights_of(start, stop), optimizer state 0, the cache empty."""
        self.invalidate()
        self.store.initialise(weights_of)

    def set_weights(self, weights: torch.Tensor) -> None:
        """Start over from these weights and a zero optimizer state (to compare runs)."""
        self.initialise(lambda start, stop: weights[start:stop])


def _done(value) -> Future:
    f: Future = Future()
    f.set_result(value)
    return f


# ---- all cached shards of a rank ------------------------------------------------------------
class _TBEGroup:
    """The cached tables of one TBE, and the hook that maps their ids to cache slots."""

    def __init__(self, tbe: torch.nn.Module, shards: dict[int, TieredShard]) -> None:
        self.shards = shards
        self.feature_table_map = list(tbe.feature_table_map)

    def _segments(self, offsets: torch.Tensor, table: int) -> list[tuple[int, int]]:
        features = len(self.feature_table_map)
        batch = (len(offsets) - 1) // features
        return [(int(offsets[f * batch]), int(offsets[(f + 1) * batch]))
                for f, t in enumerate(self.feature_table_map) if t == table]

    def remap(self, module, args, kwargs):
        indices, offsets = kwargs["indices"], kwargs["offsets"]
        new = indices.clone()
        training = module.training and torch.is_grad_enabled()
        for table, shard in self.shards.items():
            segments = self._segments(offsets, table)
            ids = torch.cat([indices[a:b] for a, b in segments]).long()
            with torch.no_grad():  # moving rows in and out of the TBE's tensors is not part of the graph
                slots = shard.install(ids, training).to(indices.dtype)
            at = 0
            for a, b in segments:
                new[a:b] = slots[at:at + b - a]
                at += b - a
        kwargs["indices"] = new
        return args, kwargs

    def prefetch(self, indices: torch.Tensor, offsets: torch.Tensor) -> None:
        for table, shard in self.shards.items():
            shard.prefetch(torch.cat([indices[a:b] for a, b in self._segments(offsets, table)]).long())


@dataclass(frozen=True)
class TieringRuntime:
    """Where SSD rows go and how the caches behave on this rank."""

    store_dir: Path | None = None
    policy: str = "lru"
    ways: int = CACHE_WAYS
    prefetch_thread: bool = False  # read ahead in a thread: worth it only with a spare core per rank
    store_io: str = "pread"  # the SSD store's reads (dlrm_scale.run_config.STORE_IO)


class TieredEmbeddings:
    """Attaches a store and a cache to every cached shard of a sharded model on this rank."""

    def __init__(self, model: torch.nn.Module, plan: Plan, rank: int, runtime: TieringRuntime) -> None:
        """The stores start at zero: dlrm_scale.training.initial_weights or a checkpoint fills them."""
        self.plan, self.rank, self.runtime = plan, rank, runtime
        self.shards: dict[tuple[str, int], TieredShard] = {}  # (table, col_offset) -> shard
        self._groups: dict[int, _TBEGroup] = {}
        self._hooks = []
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="row-prefetch") if runtime.prefetch_thread else None
        for module in embedding_kernels(model):
            self._attach(module)
        missing = [(n, s.col_offset) for n, t in plan.tables.items() if t.cached
                   for s in t.shards if s.rank == rank and (n, s.col_offset) not in self.shards]
        if missing:
            raise ConfigError(f"cached table '{missing[0][0]}' has no fused kernel on rank {rank}; the model was not sharded with resident_plan()")

    def _attach(self, module: BaseBatchedEmbeddingBag) -> None:
        tbe = module.emb_module
        weights = tbe.split_embedding_weights()
        states = tbe.split_optimizer_states() if hasattr(tbe, "split_optimizer_states") else [[] for _ in weights]
        shards = {}
        for j, table in enumerate(module.config.embedding_tables):
            tp = self.plan.tables.get(table.name)
            if tp is None or not tp.cached:
                continue
            col = table.local_metadata.shard_offsets[1] if table.local_metadata is not None else 0
            planned = next(s for s in tp.shards if s.rank == self.rank and s.col_offset == col)
            table_states = list(states[j]) if j < len(states) else []
            state_cols = sum(s[0].numel() for s in table_states)
            if planned.tier == "ssd":
                store = FileRowStore(tp.num_embeddings, planned.cols, state_cols, store_file(self.runtime.store_dir, table.name, planned),
                                     io=self.runtime.store_io)
            else:
                store = MemoryRowStore(tp.num_embeddings, planned.cols, state_cols)
            cache = SetAssociativeCache(weights[j].shape[0], tp.num_embeddings, self.runtime.ways, self.runtime.policy)
            shard = TieredShard(table.name, weights[j], table_states, store, cache, self._reader)
            shards[j] = self.shards[(table.name, col)] = shard
        if shards:
            group = _TBEGroup(tbe, shards)
            self._groups[id(module)] = group
            self._hooks.append(tbe.register_forward_pre_hook(group.remap, with_kwargs=True))

    def prefetch(self, sharded_module: torch.nn.Module, dist_input) -> None:
        """Start reading the rows the next batch's local ids (after input distribution) miss.

        Splits each sharding type's ids over its TBEs the way TorchRec's own prefetch does
        (GroupedPooledEmbeddingsLookup.prefetch, whose kernel check excludes our fused TBEs).
        """
        for lookup, features in zip(getattr(sharded_module, "_lookups", []), dist_input):
            emb_modules = getattr(lookup, "_emb_modules", None)
            if emb_modules is None:
                continue
            for emb_op, f in zip(emb_modules, features.split(lookup._feature_splits)):
                group = self._groups.get(id(emb_op))
                if group is not None:
                    group.prefetch(f.values(), f.offsets())

    @property
    def reads_ahead(self) -> bool:
        """Whether any cached shard reads the next batch's misses ahead (the pipeline then
        waits for that batch's ids early, to start the reads)."""
        return any(s.reads_ahead for s in self.shards.values())

    def counters(self) -> dict[str, int]:
        out = {"cache_hits": 0, "cache_misses": 0, "cache_evictions": 0, "cache_overflow": 0,
               "rows_loaded": 0, "rows_prefetched": 0, "rows_written_back": 0, "cache_install_us": 0,
               "cache_index_us": 0, "cache_move_us": 0, "cache_append_us": 0}
        for s in self.shards.values():
            c = s.cache.counters
            out["cache_hits"] += c.hits
            out["cache_misses"] += c.misses
            out["cache_evictions"] += c.evictions
            out["cache_overflow"] += c.overflow
            out["rows_loaded"] += s.counters.loaded_rows
            out["rows_prefetched"] += s.counters.prefetched_rows
            out["rows_written_back"] += s.counters.written_back_rows
            out["cache_install_us"] += s.counters.install_us
            out["cache_index_us"] += s.counters.index_ns // 1000
            out["cache_move_us"] += s.counters.move_ns // 1000
            out["cache_append_us"] += s.counters.append_ns // 1000
        return out

    def flush(self) -> None:
        for s in self.shards.values():
            s.flush()

    # checkpoints hold a copy of every store, taken after the caches are written back
    def _checkpoint_file(self, checkpoint_dir: Path, name: str, col: int) -> Path:
        return checkpoint_dir / f"tiered.{name}.cols{col}.rank{self.rank}.f32"

    def save(self, checkpoint_dir: Path) -> None:
        self.flush()
        for (name, col), s in self.shards.items():
            s.store.save(self._checkpoint_file(checkpoint_dir, name, col))

    def load(self, checkpoint_dir: Path) -> None:
        for (name, col), s in self.shards.items():
            path = self._checkpoint_file(checkpoint_dir, name, col)
            if not path.exists():
                raise ConfigError(f"checkpoint {checkpoint_dir} has no rows for cached table '{name}' (columns from {col}) on rank "
                                  f"{self.rank}; resume with the plan and world size it was saved with")
            s.invalidate()
            s.store.load(path)

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        if self._reader is not None:
            self._reader.shutdown(wait=True)
        for s in self.shards.values():
            s.store.close()

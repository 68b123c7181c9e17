"""Timing a cached table's row store as training uses it: for `calibrate`'s store constants
(planner.cost.cost_model.cache_miss_ms, cache_lookup_ms) and for the choice of how the SSD store
reads (`cpu_kernels.store_io`, dlrm_scale.tools.kernel_choice)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

_EVICTING_FLOATS = 64 << 20  # 256 MiB: more than this machine class's last-level cache


def timed_cold(fn) -> float:
    """Seconds `fn` takes after the processor's caches were filled with other data."""
    buffer = torch.ones(_EVICTING_FLOATS)
    buffer.add_(1.0)
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def read_ahead_and_install(shard, ids: torch.Tensor) -> None:
    """A batch as the pipeline trains a cached table: its misses read ahead (where the store
    reads ahead), then installed."""
    shard.prefetch(ids)
    shard.install(ids, training=True)


def store_miss_samples(directory: Path, dims: tuple[int, ...] = (16, 128), rows: int = 2_000_000, batches: int = 20,
                       io: str = "pread") -> list[dict]:
    """Times of a table kept on SSD (dlrm_scale.tiering.runtime: row cache in front of the
    log-structured file store in `directory`, read the `io` way), one sample per embedding
    dim: batches of uniform ids, most missing, into a full cache, and the last batch
    again, all hits (the cost every id pays). The table is as large as the ones tiering is for
    (2M rows, a quarter cached, batches of ~31k ids): a miss's cost grows with the index and
    the store it walks (a 1M-row table with a tenth cached priced misses ~35% cheaper here). Each batch is read ahead, then installed, as the
    pipeline does; between batches a buffer larger than the processor's caches is written, as
    a training step's other work does: the cache's index and rows start cold."""
    from dlrm_scale.training.initial_weights import initial_rows
    from dlrm_scale.tiering.cache import SetAssociativeCache
    from dlrm_scale.tiering.store import FileRowStore
    from dlrm_scale.tiering.runtime import TieredShard

    samples = []
    for dim in dims:
        with tempfile.TemporaryDirectory(dir=directory) as d:
            store = FileRowStore(rows, dim, 1, Path(d) / "rows.f32", io=io)
            store.initialise(lambda start, stop: initial_rows(0, "calibration", rows, dim, start, stop))
            cache_rows, batch = rows // 4, rows // 64
            shard = TieredShard("calibration", torch.zeros(cache_rows, dim), [torch.zeros(cache_rows)], store,
                                SetAssociativeCache(cache_rows, rows), None)
            g = torch.Generator().manual_seed(1)
            # fill the cache first, with twice as many distinct rows as it holds: then every set is
            # full, every miss timed also evicts and writes back, and the log is partly used, as
            # in steady training (uniform batches alone fill a quarter-cache only after ~20 of them)
            for chunk in torch.randperm(rows, generator=g)[:2 * cache_rows].split(batch):
                shard.install(chunk, training=True)
            before, seconds, hit_seconds = shard.cache.counters.as_dict(), 0.0, 0.0
            for _ in range(batches):
                ids = torch.randint(0, rows, (batch,), generator=g)
                seconds += timed_cold(lambda: read_ahead_and_install(shard, ids))
            for _ in range(batches):
                hit_seconds += timed_cold(lambda: read_ahead_and_install(shard, ids))
            after = shard.cache.counters.as_dict()
            samples.append({"dim": dim, "ids": batches * batch, "misses": after["misses"] - before["misses"],
                            "evictions": after["evictions"] - before["evictions"], "seconds": seconds, "hit_seconds": hit_seconds})
            store.close()
    return samples


def store_samples_on_ranks(directory: Path, nproc: int, rows: int = 2_000_000, io: str = "pread") -> list[dict]:
    """store_miss_samples on `nproc` processes at once, as a job's ranks share the machine's
    memory and disk; per dim, the slowest rank's sample."""
    from dlrm_scale.tools.launch import run_on_ranks

    return run_on_ranks(_store_samples_on_rank, nproc, str(directory), rows, io)


def _store_samples_on_rank(rank: int, world: int, directory: str, rows: int, io: str) -> list[dict]:
    import torch.distributed as dist

    mine = store_miss_samples(Path(directory), rows=rows, io=io)
    every: list[list[dict] | None] = [None] * world
    dist.all_gather_object(every, mine)
    return [max((ranks[i] for ranks in every), key=lambda s: s["seconds"]) for i in range(len(mine))]

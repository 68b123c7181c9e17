"""Which CPU kernels are faster on this machine: measured, never assumed.

A kernel tuned on one VM can lose on the next (CPU model, kernel version, THP mode, neighbours),
so `dlrm-scale calibrate` times each pair here, alternated and repeated, on the shapes that
dominate an embedding-bound step, and records the winners in the hardware profile's
`cpu_kernels`; the trainer runs them unless a flag says otherwise.
- embeddings: FBGEMM's row-wise Adagrad backward on plain pages (TorchRec's way) against ours
  with the table on huge pages (dlrm_scale.kernels.cpu_adagrad, dlrm_scale.kernels.huge_pages); forward and
  backward of a 2M x 64 table at 32 Zipf ids per sample, batch 2,048.
- interaction: TorchRec's InteractionArch against dlrm_scale.interaction.DotInteraction,
  forward and backward for 26 tables of dim 64, batch 1,024.
- store_io: the SSD store read with pread against copied from its files kept mapped
  (dlrm_scale.tiering.store), a cached table of 500k rows of dim 64 whose batches mostly
  miss, in a folder of the machine's (the page cache serves both; the disk would be O_DIRECT's).
"""

from __future__ import annotations

import itertools
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from dlrm_scale.tools.store_timing import store_miss_samples
from dlrm_scale.training.data import DEFAULT_ZIPF, ZipfIds


def time_ms(fn, repeats: int) -> float:
    """Mean ms per call of `fn` over `repeats` calls, after one warm-up call (first-touch
    allocation and caches)."""
    fn()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats * 1e3


def _embedding_step(ours: bool, rows: int, dim: int, pooling: int, batch: int):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from dlrm_scale.kernels.huge_pages import back_with_huge_pages

    tbe = SplitTableBatchedEmbeddingBagsCodegen([(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)],
                                                optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01)
    if ours:
        back_with_huge_pages(tbe)
    rng = np.random.default_rng(0)
    zipf = ZipfIds(rows, DEFAULT_ZIPF, seed=1)
    # a fresh batch each call, as in training: the same ids again would find their rows cached
    batches = [torch.from_numpy(zipf.sample(batch * pooling, rng).astype(np.int64)) for _ in range(4)]
    offsets = torch.arange(0, batch * pooling + 1, pooling)
    ids = itertools.cycle(batches)

    def step():
        out = tbe(next(ids), offsets)
        out.backward(torch.ones_like(out))

    return step


def time_embeddings(repeats: int = 3, rows: int = 2_000_000, dim: int = 64, pooling: int = 32, batch: int = 2048) -> dict[str, list[float]]:
    """Each kernel's table is made once (making one is most of the time: allocating and drawing
    half a GiB, collapsing it into huge pages) and timed `repeats` times, alternated."""
    from dlrm_scale.kernels.cpu_adagrad import install

    theirs, ours = _embedding_step(False, rows, dim, pooling, batch), _embedding_step(True, rows, dim, pooling, batch)
    times = {"fbgemm": [], "dlrm_scale": []}
    for _ in range(repeats):
        times["fbgemm"].append(time_ms(theirs, 8))
        kernel = install("rowwise_adagrad")
        if kernel is None:  # it did not build here: FBGEMM's is the only choice
            return {"fbgemm": times["fbgemm"]}
        with kernel:
            times["dlrm_scale"].append(time_ms(ours, 8))
    return times


def time_interactions(repeats: int = 3, tables: int = 26, dim: int = 64, batch: int = 1024) -> dict[str, list[float]]:
    from torchrec.models.dlrm import InteractionArch

    from dlrm_scale.kernels.interaction import DotInteraction

    dense = torch.randn(batch, dim, requires_grad=True)
    sparse = torch.randn(batch, tables, dim, requires_grad=True)
    modules = {"torchrec": InteractionArch(tables), "dlrm_scale": DotInteraction(tables)}
    times = {name: [] for name in modules}

    def step(module):
        out = module(dense, sparse)
        out.backward(torch.ones_like(out))

    for _ in range(repeats):
        for name, module in modules.items():
            times[name].append(time_ms(lambda: step(module), 20))
    return times


def time_store_reads(directory: Path, repeats: int = 3, rows: int = 500_000, batches: int = 8) -> dict[str, list[float]]:
    """ms per batch of a cached SSD table read each way (store_miss_samples: read ahead and
    installed, caches cold), alternated."""
    times = {"pread": [], "mapped": []}
    for _ in range(repeats):
        for io in times:
            sample, = store_miss_samples(directory, dims=(64,), rows=rows, batches=batches, io=io)
            times[io].append(sample["seconds"] / batches * 1e3)
    return times


# the kinds timed in memory, without the SSD store's folder
TIMERS = {"embeddings": time_embeddings, "interaction": time_interactions}


def choose_cpu_kernels(repeats: int = 3, store_directory: Path | None = None,
                       kinds: tuple[str, ...] = tuple(TIMERS)) -> tuple[dict[str, str], dict[str, dict[str, list[float]]]]:
    """The faster of each pair of `kinds` (of TIMERS) by median time, and every time measured (ms
    per call); also the SSD store's reads, timed in `store_directory` (None: not chosen)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a torchrun rank's share of a CPU
    try:
        measured = {kind: TIMERS[kind](repeats) for kind in kinds}
        if store_directory is not None:
            measured["store_io"] = time_store_reads(store_directory, repeats)
    finally:
        torch.set_num_threads(threads)
    chosen = {kind: min(times, key=lambda name: statistics.median(times[name])) for kind, times in measured.items()}
    return chosen, measured

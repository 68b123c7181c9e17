"""Batches produced ahead of the step that consumes them: all before the loop where they fit a
memory budget (`materialise`, as a reader of preprocessed data holds its data), else in a worker
thread (`Prefetcher`).

The producer (synthetic sampling, Criteo parsing, KJT building) runs mostly in numpy and torch
kernels that release the GIL, so it overlaps the training step's own kernels and its waits in
collectives; the step only takes a finished batch from a bounded queue. Order is kept (one
producer), so batches stay a function of (seed, rank, step). The wait for a batch is the
step's `data` phase (dlrm_scale.training.phases).
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from typing import Iterator

from torchrec.datasets.utils import Batch

_END = object()


class Prefetcher:
    def __init__(self, source: Iterator, depth: int = 4) -> None:
        self._source = source
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name="dlrm-scale-prefetch", daemon=True)
        self._thread.start()

    def _produce(self) -> None:
        try:
            for item in self._source:
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
            self._queue.put(_END)
        except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
            self._queue.put(e)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        item = self._queue.get()
        if item is _END:
            self._queue.put(_END)  # a later next() ends too
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        """Stop the worker (it may be blocked on a full queue) and drop what it made."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()
            except queue.Empty:
                pass
            self._thread.join(timeout=0.05)


def batch_bytes(batch: Batch) -> int:
    kjt = batch.sparse_features
    tensors = (batch.dense_features, batch.labels, kjt.values(), kjt.lengths())
    return sum(t.numel() * t.element_size() for t in tensors)


def materialise(source: Iterator[Batch], num_steps: int, budget_bytes: int) -> tuple[Iterator[Batch], bool]:
    """Every one of the `num_steps` batches made now, when the first one times `num_steps` fits
    in `budget_bytes`; otherwise the source as it was (nothing lost). Says which."""
    first = next(source, None)
    if first is None:
        return iter(()), True
    if batch_bytes(first) * num_steps > budget_bytes:
        return itertools.chain([first], source), False
    return iter([first, *source]), True


@contextlib.contextmanager
def batch_source(batches: Iterator[Batch], count: int, materialise_mib: int, prefetch_batches: int, rank: int = 0):
    """`count` batches made before the loop where they fit `materialise_mib` per rank, else
    `prefetch_batches` ahead by a worker thread (stopped on exit), else inline."""
    held = False
    if materialise_mib:
        started = time.perf_counter()
        batches, held = materialise(batches, count, materialise_mib << 20)
        if held and rank == 0:
            print(f"rank 0: made the run's {count} batches in {time.perf_counter() - started:.1f} s", flush=True)
    if held or not prefetch_batches:
        yield batches
        return
    prefetcher = Prefetcher(batches, prefetch_batches)
    try:
        yield prefetcher
    finally:
        prefetcher.close()

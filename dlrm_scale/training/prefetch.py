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
from typing import Iterable, Iterator

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


def materialise(source: Iterator[Batch], num_steps: int, budget_bytes: int) -> tuple[Iterable[Batch], bool]:
    """Every one of the `num_steps` batches made now (a list), when the first one times
    `num_steps` fits in `budget_bytes`; otherwise the source as it was (nothing lost). Says which."""
    first = next(source, None)
    if first is None:
        return [], True
    if batch_bytes(first) * num_steps > budget_bytes:
        return itertools.chain([first], source), False
    return [first, *source], True


class HeldBatches:
    """The batches a job made before its loop, from step `first` to its last. A step's batch
    depends on the seed, the rank and the step, never on the plan, so a job that moves to
    another plan (dlrm_scale.tuning) goes on from these instead of making the rest again."""

    def __init__(self) -> None:
        self.first, self._batches = 0, []

    def covers(self, first: int, count: int) -> bool:
        return bool(self._batches) and self.first <= first and first + count == self.first + len(self._batches)

    def keep(self, first: int, batches: list[Batch]) -> Iterator[Batch]:
        self.first, self._batches = first, batches
        return iter(batches)

    def since(self, step: int) -> Iterator[Batch]:
        """The batches of `step` on; those before it, trained on, are let go."""
        self._batches, self.first = self._batches[step - self.first:], step
        return iter(self._batches)


@contextlib.contextmanager
def batch_source(batches: Iterator[Batch], count: int, materialise_mib: int, prefetch_batches: int, rank: int = 0,
                 held: HeldBatches | None = None, first_step: int = 0):
    """`count` batches from `first_step` on: taken from `held` where it covers them (a trainer
    before this one made them); else made before the loop where they fit `materialise_mib` per
    rank (and kept in `held`), else `prefetch_batches` ahead by a worker thread (stopped on exit),
    else inline."""
    if held is not None and held.covers(first_step, count):
        yield held.since(first_step)
        return
    made = False
    if materialise_mib:
        started = time.perf_counter()
        batches, made = materialise(batches, count, materialise_mib << 20)
        if made:
            if rank == 0:
                print(f"rank 0: made the run's {count} batches in {time.perf_counter() - started:.1f} s", flush=True)
            batches = held.keep(first_step, batches) if held is not None else iter(batches)
    if made or not prefetch_batches:
        yield batches
        return
    prefetcher = Prefetcher(batches, prefetch_batches)
    try:
        yield prefetcher
    finally:
        prefetcher.close()

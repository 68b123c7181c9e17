"""Synthetic recommendation data: Zipf-skewed multi-hot ids and labels from a hidden model.

Each table's ids follow a Zipf law over a fixed random permutation of its rows (so hot rows
are spread over row-wise shards, as hashed production ids are). With `drift_at_step`, every
table's permutation changes from that step on: the hot set moves, as production traffic's does,
and a cache sized for the old one misses; or, with `drift_grows` (table, factor), that table's
bags grow that many times longer from then on: a table grows hot, and the rank that holds it
does that much more of the work. Labels come from a hidden
logistic model of the dense features and of a fixed per-row score of every looked-up id, so
a model that learns its embeddings reaches an AUC clearly above 0.5.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from planner.spec.specs import TableSpec

DEFAULT_ZIPF = 1.05
MAX_POOLING = 256
# Samples drawn from one generator: the unit a global batch is cut into (a rank draws the
# chunks its slice overlaps; fewer, larger chunks keep numpy's per-call cost off small batches).
CHUNK_SAMPLES = 1024


def feature_name(table: str) -> str:
    return f"f_{table}"


def _row_scores(num_rows: int, table_index: int) -> np.ndarray:
    """The hidden model's fixed score of every row (a standard normal per row)."""
    return np.random.default_rng(10_007 + table_index).standard_normal(num_rows).astype(np.float32)


class ZipfIds:
    """Ids of one table: Zipf-distributed popularity ranks mapped through a fixed random
    permutation of the rows (so hot rows are spread, as hashed production ids are).

    Ranks are drawn by rejection-inversion (Hoermann and Derflinger, 1996): exact for the
    bounded law P(rank k) ~ k^-s, k = 1..N, at a few exp/log per id and ~1 retry per 10 ids,
    where inverting the tabulated CDF costs a 21-level binary search over 16 MB for N = 2M
    (~130 ns an id here: most of a training step's data time)."""

    def __init__(self, num_rows: int, exponent: float, seed: int, drifted_seed: int | None = None) -> None:
        self.num_rows, self.s = num_rows, exponent
        self.perm = np.random.default_rng(seed).permutation(num_rows)
        self.drifted = np.random.default_rng(drifted_seed).permutation(num_rows) if drifted_seed is not None else self.perm
        self._area_first = self._H(1.5) - 1.0  # the first rank's box, under the hat
        self._area_end = self._H(num_rows + 0.5)
        self._squeeze = 2.0 - self._H_inverse(self._H(2.5) - 2.0 ** -exponent)

    def _H(self, x):
        """The integral of t^-s over [1, x]; expm1 keeps it exact for s near 1."""
        return np.log(x) if self.s == 1.0 else np.expm1((1.0 - self.s) * np.log(x)) / (1.0 - self.s)

    def _H_inverse(self, y):
        return np.exp(y) if self.s == 1.0 else np.exp(np.log1p(np.maximum(-1.0, y * (1.0 - self.s))) / (1.0 - self.s))

    def ranks(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """n popularity ranks in 0..N-1 (0 the hottest)."""
        out = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while len(todo):
            u = self._area_end + rng.random(len(todo)) * (self._area_first - self._area_end)
            x = self._H_inverse(u)
            k = np.clip(np.floor(x + 0.5), 1, self.num_rows)
            accept = k - x <= self._squeeze  # most ids; the exact test only for the rest
            rest = np.flatnonzero(~accept)
            kr = k[rest]
            accept[rest] = u[rest] >= self._H(kr + 0.5) - kr ** -self.s
            out[todo[accept]] = k[accept].astype(np.int64) - 1
            todo = todo[~accept]
        return out

    def sample(self, n: int, rng: np.random.Generator, drifted: bool = False) -> np.ndarray:
        return (self.drifted if drifted else self.perm)[self.ranks(n, rng)]


@dataclass
class _TableSampler:
    ids: ZipfIds
    scores: np.ndarray
    pooling_factor: float
    drifted_pooling_factor: float  # from the drift step on


class SyntheticData:
    """Deterministic batches for one rank, independent of the world size: the global batch of
    a step is a function of (seed, step, global batch size) only, and rank r of `world` gets
    its r-th contiguous slice. The global batch is drawn in chunks of CHUNK_SAMPLES samples,
    each from its own generator, so a rank draws only the chunks its slice overlaps."""

    def __init__(self, tables: Sequence[TableSpec], num_dense: int, global_batch: int, seed: int, rank: int = 0,
                 world: int = 1, drift_at_step: int = 0, drift_grows: tuple[str, float] | None = None) -> None:
        if global_batch <= 0 or global_batch % world or not 0 <= rank < world:
            raise ValueError(f"a global batch of {global_batch} does not split evenly over {world} ranks for rank {rank}")
        self.tables = list(tables)
        self.num_dense = num_dense
        self.global_batch, self.batch_size = global_batch, global_batch // world
        self.first = rank * self.batch_size  # this rank's first sample in the global batch
        self.seed, self.drift_at_step = seed, drift_at_step  # 0: the data never drifts
        moves = drift_at_step and drift_grows is None  # the hot ids move at the drift
        self.samplers = []
        for i, t in enumerate(self.tables):
            s = DEFAULT_ZIPF if t.zipf_exponent is None else t.zipf_exponent
            ids = ZipfIds(t.num_embeddings, s, 20_011 + i, 50_021 + i if moves else None)
            drifted = t.pooling_factor * drift_grows[1] if drift_grows is not None and drift_grows[0] == t.name else t.pooling_factor
            self.samplers.append(_TableSampler(ids, _row_scores(t.num_embeddings, i), t.pooling_factor, drifted))
        hidden = np.random.default_rng(30_013)
        self.dense_weights = hidden.standard_normal(num_dense).astype(np.float32) / np.sqrt(num_dense)
        self.keys = [feature_name(t.name) for t in self.tables]

    def _chunk(self, step: int, chunk: int) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """Chunk `chunk` of step `step`'s global batch: dense, labels, and per table lengths and ids."""
        rng = np.random.default_rng([self.seed, step, chunk])
        b = min(CHUNK_SAMPLES, self.global_batch - chunk * CHUNK_SAMPLES)
        dense = rng.standard_normal((b, self.num_dense)).astype(np.float32)
        logit = dense @ self.dense_weights
        lengths, values = [], []
        drifted = 0 < self.drift_at_step <= step
        for sampler in self.samplers:
            # lengths: 1 + Poisson(p - 1) keeps every bag non-empty with mean p
            p = sampler.drifted_pooling_factor if drifted else sampler.pooling_factor
            n = np.minimum(1 + rng.poisson(max(p - 1.0, 0.0), size=b), MAX_POOLING)
            ids = sampler.ids.sample(int(n.sum()), rng, drifted)
            bag = np.repeat(np.arange(b), n)
            logit += np.bincount(bag, weights=sampler.scores[ids], minlength=b).astype(np.float32) / n
            lengths.append(n)
            values.append(ids)
        logit = logit * (2.0 / np.sqrt(1 + len(self.samplers)))
        labels = (rng.random(b) < 1.0 / (1.0 + np.exp(-logit))).astype(np.float32)
        return dense, labels, lengths, values

    def batch(self, step: int) -> Batch:
        first_chunk = self.first // CHUNK_SAMPLES
        last_chunk = (self.first + self.batch_size - 1) // CHUNK_SAMPLES
        chunks = [self._chunk(step, c) for c in range(first_chunk, last_chunk + 1)]
        a = self.first - first_chunk * CHUNK_SAMPLES  # the slice, within the drawn chunks
        b = a + self.batch_size
        dense = np.concatenate([c[0] for c in chunks])[a:b]
        labels = np.concatenate([c[1] for c in chunks])[a:b]
        lengths, values = [], []
        for t in range(len(self.samplers)):
            n = np.concatenate([c[2][t] for c in chunks])
            ids = np.concatenate([c[3][t] for c in chunks])
            ends = np.cumsum(n)
            lo = int(ends[a - 1]) if a else 0
            lengths.append(n[a:b])
            values.append(ids[lo:int(ends[b - 1])])
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=self.keys,
            values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
            lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
        )
        return Batch(dense_features=torch.from_numpy(dense), sparse_features=kjt, labels=torch.from_numpy(labels))

    def batches(self, first_step: int, num_steps: int) -> Iterator[Batch]:
        for step in range(first_step, first_step + num_steps):
            yield self.batch(step)

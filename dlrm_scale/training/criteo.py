"""Criteo click logs: the raw Kaggle/Terabyte TSV format and TorchRec's preprocessed .npy days.

TSV lines are `label \\t 13 integer fields \\t 26 hex categorical fields`, empty fields meaning
missing. Dense values become log(1 + max(x, 0)); categorical values are hashed into each
table's cardinality (hex value modulo num_embeddings; missing is 0). The lines (or rows) of a
split are dealt to the ranks in turn, so ranks read disjoint parts of the same files and the
global batch of a step holds the same lines at any world size (while the first epoch lasts and
no line is malformed: a malformed line is skipped by the rank it falls to).

Malformed lines are skipped, each with a warning naming its file and line; once more than
`max_bad_fraction` of the lines read so far are bad (after the first 1,000), reading stops
with an error naming the last bad line.
"""

from __future__ import annotations

import glob
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from torchrec.datasets.utils import Batch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from dlrm_scale.training.data import feature_name
from planner.spec.errors import ConfigError
from planner.spec.specs import TableSpec

NUM_DENSE = 13
NUM_SPARSE = 26
MIN_LINES_BEFORE_THRESHOLD = 1000
log = logging.getLogger("dlrm_scale.training.criteo")


class CriteoDataError(ConfigError):
    """The data is unreadable or too broken to train on."""


@dataclass
class ReadStats:
    lines: int = 0
    bad: int = 0


def _check_tables(tables: Sequence[TableSpec], num_dense: int) -> None:
    if len(tables) != NUM_SPARSE or num_dense != NUM_DENSE:
        raise ConfigError(
            f"Criteo data has {NUM_DENSE} dense and {NUM_SPARSE} categorical features, but the config has "
            f"{num_dense} dense and {len(tables)} tables; use configs/criteo_kaggle.yaml or criteo_terabyte.yaml"
        )


def parse_line(line: str, sizes: Sequence[int]) -> tuple[float, list[float], list[int]] | None:
    """(label, dense, sparse ids) of one TSV line, or None when it is malformed."""
    fields = line.rstrip("\n").split("\t")
    if len(fields) != 1 + NUM_DENSE + NUM_SPARSE:
        return None
    try:
        label = int(fields[0])
        if label not in (0, 1):
            return None
        dense = [math.log1p(max(int(x), 0)) if x else 0.0 for x in fields[1 : 1 + NUM_DENSE]]
        sparse = [int(h, 16) % n if h else 0 for h, n in zip(fields[1 + NUM_DENSE :], sizes)]
    except ValueError:
        return None
    return float(label), dense, sparse


def tsv_files(path: str | Path) -> list[Path]:
    p = Path(path)
    files = sorted(Path(f) for f in glob.glob(str(p / "*.tsv")) + glob.glob(str(p / "*.txt"))) if p.is_dir() else [p]
    if not files or not all(f.is_file() for f in files):
        raise CriteoDataError(f"no Criteo TSV data at {path}: give a .tsv/.txt file or a folder of them with --data-path")
    return files


def _batch(labels, dense, sparse, keys) -> Batch:
    ids = np.asarray(sparse, dtype=np.int64)  # (batch, 26), one id per table
    b = ids.shape[0]
    return Batch(
        dense_features=torch.tensor(np.asarray(dense, dtype=np.float32)),
        sparse_features=KeyedJaggedTensor.from_lengths_sync(
            keys=keys, values=torch.from_numpy(ids.T.reshape(-1).copy()), lengths=torch.ones(b * len(keys), dtype=torch.int32)
        ),
        labels=torch.tensor(np.asarray(labels, dtype=np.float32)),
    )


class _Rows:
    """Common batching: full batches from a cycling stream of (label, dense, sparse) rows."""

    keys: list[str]
    batch_size: int

    def rows(self) -> Iterator[tuple]:
        raise NotImplementedError

    def batches(self, first_step: int, num_steps: int) -> Iterator[Batch]:
        """Batches first_step .. first_step + num_steps - 1, wrapping around the data (epochs)."""
        stream = self._cycle()
        for step in range(first_step + num_steps):
            rows = [next(stream) for _ in range(self.batch_size)]
            if step >= first_step:
                labels, dense, sparse = zip(*rows)
                yield _batch(labels, dense, sparse, self.keys)

    def _cycle(self) -> Iterator[tuple]:
        while True:
            empty = True
            for row in self.rows():
                empty = False
                yield row
            if empty:
                raise CriteoDataError(f"no usable rows for rank {self.rank} in {self.source}; check --data-path")


class CriteoTSV(_Rows):
    """Raw Criteo TSV files for one rank. `split` is "train", or "eval" for the held-out
    1 in `holdout_every` of the rank's lines."""

    def __init__(self, path, tables: Sequence[TableSpec], num_dense: int, batch_size: int, rank: int, world: int,
                 split: str = "train", holdout_every: int = 20, max_bad_fraction: float = 0.01) -> None:
        _check_tables(tables, num_dense)
        self.files = tsv_files(path)
        self.source = path
        self.sizes = [t.num_embeddings for t in tables]
        self.keys = [feature_name(t.name) for t in tables]
        self.batch_size, self.rank, self.world = batch_size, rank, world
        self.split, self.holdout_every = split, holdout_every
        self.max_bad_fraction = max_bad_fraction
        self.stats = ReadStats()

    def _record_bad(self, file: Path, line_no: int) -> None:
        self.stats.bad += 1
        log.warning("skipping malformed Criteo line %s:%d", file, line_no)
        if self.stats.lines >= MIN_LINES_BEFORE_THRESHOLD and self.stats.bad > self.max_bad_fraction * self.stats.lines:
            raise CriteoDataError(
                f"{self.stats.bad} of {self.stats.lines} lines read are malformed (last: {file}:{line_no}), over the "
                f"{self.max_bad_fraction:.1%} allowed; fix the data or raise max_bad_fraction"
            )

    def rows(self) -> Iterator[tuple]:
        # Lines are held out by their index in the files, then the split's lines are dealt to
        # the ranks in turn: the global batch of a step is the same lines at any world size.
        index = position = 0
        for file in self.files:
            try:
                handle = open(file, encoding="utf-8", errors="replace")
            except OSError as e:
                raise CriteoDataError(f"cannot read {file}: {e.strerror}; check the path and its permissions") from None
            with handle:
                for line_no, line in enumerate(handle, start=1):
                    held_out, index = index % self.holdout_every == self.holdout_every - 1, index + 1
                    if held_out != (self.split == "eval"):
                        continue
                    mine, position = position % self.world == self.rank, position + 1
                    if not mine:
                        continue
                    self.stats.lines += 1
                    parsed = parse_line(line, self.sizes)
                    if parsed is None:
                        self._record_bad(file, line_no)
                        continue
                    yield parsed


class CriteoNpy(_Rows):
    """TorchRec's preprocessed layout: day_{i}_dense.npy (already log-transformed, float32),
    day_{i}_sparse.npy and day_{i}_labels.npy. The last day is the held-out split."""

    def __init__(self, path, tables: Sequence[TableSpec], num_dense: int, batch_size: int, rank: int, world: int,
                 split: str = "train") -> None:
        _check_tables(tables, num_dense)
        folder = Path(path)
        days = sorted(folder.glob("day_*_dense.npy"), key=lambda p: int(p.name.split("_")[1]))
        if len(days) < 2:
            raise CriteoDataError(f"need at least two day_*_dense.npy files in {folder} (the last is held out); point --data-path at TorchRec's preprocessed folder")
        self.days = days[-1:] if split == "eval" else days[:-1]
        self.source = path
        self.sizes = np.array([t.num_embeddings for t in tables], dtype=np.int64)
        self.keys = [feature_name(t.name) for t in tables]
        self.batch_size, self.rank, self.world = batch_size, rank, world

    def rows(self) -> Iterator[tuple]:
        position = 0  # rows are dealt to the ranks in turn across days, as one stream
        for dense_file in self.days:
            stem = dense_file.name[: -len("dense.npy")]
            try:
                dense = np.load(dense_file, mmap_mode="r")
                sparse = np.load(dense_file.with_name(stem + "sparse.npy"), mmap_mode="r")
                labels = np.load(dense_file.with_name(stem + "labels.npy"), mmap_mode="r")
            except (OSError, ValueError) as e:
                raise CriteoDataError(f"cannot read the {stem}* files in {dense_file.parent}: {e}") from None
            first, position = (self.rank - position) % self.world, position + len(labels)
            for i in range(first, len(labels), self.world):
                yield float(labels[i].reshape(-1)[0]), np.asarray(dense[i], dtype=np.float32), np.asarray(sparse[i], dtype=np.int64) % self.sizes


def criteo_data(path, tables, num_dense, batch_size, rank, world, split):
    """The reader for what lies at `path`: a folder of .npy days, else TSV files."""
    if Path(path).is_dir() and any(Path(path).glob("day_*_dense.npy")):
        return CriteoNpy(path, tables, num_dense, batch_size, rank, world, split)
    return CriteoTSV(path, tables, num_dense, batch_size, rank, world, split)

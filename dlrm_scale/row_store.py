"""Where a cached shard's rows and optimizer state live: host memory (DDR) or a file (SSD).

One fp32 record per row: the row's weights followed by its optimizer state, so a miss is
one read and a write-back one write. The SSD store memory-maps its file; pages it touched
are handed back to the kernel after every batch (`release`), so they sit in the page cache,
not in the trainer's resident memory.
"""

from __future__ import annotations

import mmap
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from planner.errors import ConfigError

RECORD_DTYPE = torch.float32
INIT_CHUNK_ROWS = 1 << 18  # rows initialised at a time: bounds memory while writing a large file


class RowStore:
    """Rows [num_rows, cols + state_cols] of fp32, in DDR (`path` None) or in a file at `path`."""

    def __init__(self, num_rows: int, cols: int, state_cols: int, path: Path | None = None) -> None:
        self.num_rows, self.cols, self.state_cols = num_rows, cols, state_cols
        self.width = cols + state_cols
        self.path = path
        self._mmap = None
        if path is None:
            self.data = torch.zeros(num_rows, self.width, dtype=RECORD_DTYPE)
        else:
            size = num_rows * self.width * 4
            with open(path, "a+b") as f:
                f.truncate(size)
            self._fd = os.open(path, os.O_RDWR)
            self._mmap = mmap.mmap(self._fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            self.data = torch.from_numpy(np.frombuffer(self._mmap, dtype=np.float32).reshape(num_rows, self.width))

    @property
    def tier(self) -> str:
        return "ddr" if self.path is None else "ssd"

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.width * 4

    def initialise(self, generator: torch.Generator, bound: float) -> None:
        """Weights uniform in [-bound, bound] (TorchRec's default init for a table), state 0."""
        for start in range(0, self.num_rows, INIT_CHUNK_ROWS):
            stop = min(self.num_rows, start + INIT_CHUNK_ROWS)
            block = torch.zeros(stop - start, self.width, dtype=RECORD_DTYPE)
            block[:, : self.cols].uniform_(-bound, bound, generator=generator)
            self.data[start:stop] = block
            self.release()  # a file larger than memory never becomes resident

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        return self.data.index_select(0, ids)

    def write(self, ids: torch.Tensor, records: torch.Tensor) -> None:
        self.data.index_copy_(0, ids, records)

    def release(self) -> None:
        """Drop the mapping's pages from this process (the page cache keeps them; a shared
        mapping's dirty pages are written back by the kernel, so nothing is lost)."""
        if self._mmap is not None:
            self._mmap.madvise(mmap.MADV_DONTNEED)

    def flush(self) -> None:
        """Make the file durable (before it is copied into a checkpoint)."""
        if self._mmap is not None:
            self._mmap.flush()

    def save(self, path: Path) -> None:
        """A copy of every record at `path` (a checkpoint's own file, never the live one)."""
        if self.path is None:
            with open(path, "wb") as f:
                for start in range(0, self.num_rows, INIT_CHUNK_ROWS):
                    f.write(self.data[start:start + INIT_CHUNK_ROWS].numpy().tobytes())
        else:
            self.flush()
            shutil.copyfile(self.path, path)  # read(2)/write(2): the copy never maps into this process

    def load(self, path: Path) -> None:
        size = os.path.getsize(path)
        if size != self.nbytes:
            raise ConfigError(f"checkpoint file {path} holds {size:,} bytes but this shard needs {self.nbytes:,}; resume with the plan it was saved with")
        with open(path, "rb") as f:
            for start in range(0, self.num_rows, INIT_CHUNK_ROWS):
                stop = min(self.num_rows, start + INIT_CHUNK_ROWS)
                block = np.frombuffer(f.read((stop - start) * self.width * 4), dtype=np.float32)
                self.data[start:stop] = torch.from_numpy(block.copy()).reshape(stop - start, self.width)
                self.release()

    def close(self) -> None:
        if self._mmap is not None:
            self.data = None
            self._mmap.flush()
            self._mmap.close()
            os.close(self._fd)
            self._mmap = None

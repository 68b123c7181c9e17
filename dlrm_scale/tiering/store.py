"""Where a cached shard's rows and optimizer state live: host memory (DDR) or files (SSD).

One fp32 record per row: the row's weights followed by its optimizer state, so a miss is
one read and a write-back one write.

The SSD store is log-structured, as SSD key-value stores are (FBGEMM's uses RocksDB): rows
start in a base file; written-back rows are appended to a log file and an index remembers
where each row's newest record is. Writing rows in place would dirty a 4 KiB page per
260-byte row, and the kernel then throttles the trainer to the disk's random-write speed;
appending dirties only the bytes written, sequentially. When the log is full its newest
records are folded into the base file (compaction). The compiled cache pass writes the files
with pwrite and reads them (`backing`) with pread (`io="pread"`: a batch maps no page),
with O_DIRECT (`"direct"`), or by copying from their mappings (`"mapped"`: no system call a
row; the pages stay mapped, so they count in the trainer's RSS, though they are the same page
cache). The files' disk blocks are allocated when they are created, and the log's pages are
brought into the page cache then too (below, `_warm`). Bulk work
(initialisation, compaction, checkpoints) and the torch fallback go through
the mappings; except when mapped, their pages are handed back to the kernel afterwards
(`release`): they sit in the page cache, not in the trainer's resident memory.
"""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import torch

from dlrm_scale.run_config import STORE_IO
from planner.cost.cost_model import CPU_SSD_LOG_RECORDS_PER_ROW
from planner.spec.errors import ConfigError

RECORD_DTYPE = torch.float32
CHUNK_ROWS = 1 << 18  # rows initialised, saved or loaded at a time: bounds memory for large files
_NO_MEMORY = torch.empty(0, 0, dtype=RECORD_DTYPE)
_NO_LOCATION = torch.empty(0, dtype=torch.int32)
_NO_FILES = [-1, -1, -1, -1]
MADV_POPULATE_READ = 22  # Linux >= 5.14; Python's mmap module may not name it
WARM_CHUNK_BYTES = 64 << 20  # a multiple of the page size


class Backing(NamedTuple):
    """A store as the compiled cache pass (dlrm_scale/kernels/csrc/row_cache_cpu.cpp) reads
    and writes it: records in memory, or files (base, log, and the two opened for reads)."""

    memory: torch.Tensor
    fds: list[int]
    direct: bool
    location: torch.Tensor  # newest record's log slot per row, -1: the base file
    width: int
    log_rows: int
    maps: list[torch.Tensor]  # the base and log files' mappings to read from, or none: read the files


class MemoryRowStore:
    """Records [num_rows, width] of fp32 in host memory (the DDR tier)."""

    tier = "ddr"
    log_used = 0  # records appended to a log (the file store's; this one writes in place)
    addressable = True  # the compiled pass copies records from where they are (no read needed)

    def __init__(self, num_rows: int, cols: int, state_cols: int) -> None:
        self.num_rows, self.cols, self.width = num_rows, cols, cols + state_cols
        self.data = torch.zeros(num_rows, self.width, dtype=RECORD_DTYPE)

    @property
    def nbytes(self) -> int:
        return self.num_rows * self.width * 4

    def initialise(self, weights_of: Callable[[int, int], torch.Tensor]) -> None:
        """Rows' weights from weights_of(start, stop) (dlrm_scale.training.initial_weights), state 0."""
        for start in range(0, self.num_rows, CHUNK_ROWS):
            stop = min(self.num_rows, start + CHUNK_ROWS)
            block = torch.zeros(stop - start, self.width, dtype=RECORD_DTYPE)
            block[:, : self.cols] = weights_of(start, stop)
            self.fill(start, block)
        self.flush()

    def fill(self, start: int, records: torch.Tensor) -> None:
        """Set the records of rows start.. in bulk (initialisation, checkpoint loads)."""
        self.data[start:start + len(records)] = records

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        return self.data.index_select(0, ids)

    def write(self, ids: torch.Tensor, records: torch.Tensor) -> None:
        self.data.index_copy_(0, ids, records)

    def backing(self) -> Backing:
        return Backing(self.data, _NO_FILES, False, _NO_LOCATION, self.width, 0, [])

    def reserve_log(self, records: int) -> None:
        """Make room to append `records` (a batch's write-backs) where the store has a log."""

    def release(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def save(self, path: Path) -> None:
        """Every record, in row order, to `path` (a checkpoint's own file)."""
        self.flush()
        with open(path, "wb") as f:
            for start in range(0, self.num_rows, CHUNK_ROWS):
                f.write(self.read(torch.arange(start, min(self.num_rows, start + CHUNK_ROWS))).numpy().tobytes())
                self.release()

    def load(self, path: Path) -> None:
        size = os.path.getsize(path)
        if size != self.nbytes:
            raise ConfigError(f"checkpoint file {path} holds {size:,} bytes but this shard needs {self.nbytes:,}; "
                              f"resume with the plan it was saved with")
        with open(path, "rb") as f:
            for start in range(0, self.num_rows, CHUNK_ROWS):
                stop = min(self.num_rows, start + CHUNK_ROWS)
                block = np.frombuffer(f.read((stop - start) * self.width * 4), dtype=np.float32).reshape(stop - start, self.width)
                self.fill(start, torch.from_numpy(block.copy()))
        self.flush()

    def close(self) -> None:
        pass


def open_direct(path: Path) -> int:
    """A read-only descriptor that bypasses the page cache (O_DIRECT); one line if the file
    system has none (tmpfs, some overlays)."""
    try:
        return os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as e:
        raise ConfigError(f"store directory {path.parent} cannot read with O_DIRECT ({e.strerror}); "
                          f"use another --store-dir or --store-io pread") from None


def _map(path: Path, rows: int, width: int) -> tuple[int, mmap.mmap, torch.Tensor]:
    size = rows * width * 4
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _reserve(fd, size, path)
    except BaseException:
        os.close(fd)
        raise
    mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return fd, mm, torch.from_numpy(np.frombuffer(mm, dtype=np.float32).reshape(rows, width))


def _warm(mm: mmap.mmap) -> None:
    """Put a new file's pages in the page cache now, then unmap them from this process.

    The log is appended to a batch at a time; each append's first write into a page the page
    cache never held costs the page's allocation, which on a VM whose balloon hands freed memory
    back to the host (these machines) means a host fault per page: a 3 MB append took 5.7-7.1 ms
    into new pages against 0.35-0.43 ms into pages brought in first (README, Memory tiers). The
    log fills once in its first ~2M written-back rows, so every append of a shorter run met new
    pages; after a compaction the log is rewritten from its start into pages it holds. Reading
    the fallocated (unwritten) blocks through the mapping makes zero pages without disk reads,
    clean, so nothing is written back for them. A store read with O_DIRECT (larger than the
    page cache) is left alone."""
    for start in range(0, len(mm), WARM_CHUNK_BYTES):  # a chunk at a time: RSS never holds the whole file
        length = min(WARM_CHUNK_BYTES, len(mm) - start)
        try:
            mm.madvise(MADV_POPULATE_READ, start, length)
        except OSError as e:  # the appends then fault the pages in as they go
            if e.errno in (errno.EINVAL, errno.ENOMEM):  # a kernel before 5.14; no memory to spare
                return
            raise
        mm.madvise(mmap.MADV_DONTNEED, start, length)  # the page cache keeps them


def _reserve(fd: int, size: int, path: Path) -> None:
    """The file at `size` bytes with its disk blocks allocated now, not as its pages are first
    written: a disk that fills up later (another job, the checkpoints) then cannot fail a log
    append mid-step, nor kill the trainer with SIGBUS on a write through the mapping into a
    hole (what a full disk does to a mapped sparse file). A full disk is one line, before
    training."""
    try:
        os.ftruncate(fd, size)
        try:
            os.posix_fallocate(fd, 0, size)
        except OSError as e:  # a file system that cannot reserve keeps the sparse file
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT):
            raise ConfigError(f"store file {path} needs {size:,} bytes but its disk has no room for them "
                              f"({os.strerror(e.errno)}); free space or pass another --store-dir") from None
        raise


class FileRowStore(MemoryRowStore):
    """Records in a base file plus an append-only log of written-back rows (the SSD tier).

    `log_rows` bounds the log (default: planner.cost.cost_model.CPU_SSD_LOG_RECORDS_PER_ROW records a
    row, which the planner and the store directory's check count on disk); the index costs 4
    bytes per row in memory.
    """

    tier = "ssd"

    def __init__(self, num_rows: int, cols: int, state_cols: int, path: Path, log_rows: int | None = None,
                 io: str = "pread") -> None:
        if io not in STORE_IO:
            raise ConfigError(f"store io {io!r} is not one of {', '.join(STORE_IO)}")
        self.num_rows, self.cols, self.width = num_rows, cols, cols + state_cols
        self.path, self.log_path = path, path.with_name(path.name + ".log")
        self.log_rows = max(1, log_rows or num_rows * CPU_SSD_LOG_RECORDS_PER_ROW)
        self.io = io
        self._fd, self._mm, self.base = _map(self.path, num_rows, self.width)
        self._log_fd, self._log_mm, self.log = _map(self.log_path, self.log_rows, self.width)
        self._read_fd, self._log_read_fd = self._fd, self._log_fd
        if io == "direct":
            self._read_fd, self._log_read_fd = open_direct(self.path), open_direct(self.log_path)
        else:
            _warm(self._log_mm)
        self.location = torch.full((num_rows,), -1, dtype=torch.int32)  # newest record's log slot, -1: base file
        self.log_used = 0
        self.compactions = 0

    def read(self, ids: torch.Tensor) -> torch.Tensor:
        where = self.location.index_select(0, ids)
        in_log = where >= 0
        out = self.base.index_select(0, ids)
        if in_log.any():
            out[in_log] = self.log.index_select(0, where[in_log].long())
        return out

    def write(self, ids: torch.Tensor, records: torch.Tensor) -> None:
        """Append the records to the log (compacting first when it has no room)."""
        at = 0
        while at < len(ids):
            if self.log_used == self.log_rows:
                self.compact()
            n = min(len(ids) - at, self.log_rows - self.log_used)
            self.log[self.log_used:self.log_used + n] = records[at:at + n]
            self.location[ids[at:at + n]] = torch.arange(self.log_used, self.log_used + n, dtype=torch.int32)
            self.log_used += n
            at += n

    @property
    def addressable(self) -> bool:
        return self.io == "mapped"

    def backing(self) -> Backing:
        return Backing(_NO_MEMORY, [self._fd, self._log_fd, self._read_fd, self._log_read_fd], self.io == "direct",
                       self.location, self.width, self.log_rows, [self.base, self.log] if self.io == "mapped" else [])

    def reserve_log(self, records: int) -> None:
        # the pass writes what finds no room in place, which is correct, only slower
        if self.log_used and self.log_used + records > self.log_rows:
            self.compact()

    def fill(self, start: int, records: torch.Tensor) -> None:
        self.base[start:start + len(records)] = records
        self.location[start:start + len(records)] = -1
        self.release()  # a file larger than memory never becomes resident

    def compact(self) -> None:
        """Fold the log's newest records into the base file, in row order, and empty the log.

        Nothing is synced: between checkpoints the store is scratch (a crash resumes from the
        checkpoint's copy, never from these files), and the page cache serves every later read
        and write coherently. Syncing here waited for the base file's dirty pages to reach the
        disk in the middle of a step (folding 1M records into a 2M-row file: 0.56 s with the
        sync, 0.37 s without, on this machine class); `flush` syncs before a checkpoint copies
        the files."""
        ids = torch.nonzero(self.location >= 0).flatten()
        for start in range(0, len(ids), CHUNK_ROWS):
            chunk = ids[start:start + CHUNK_ROWS]
            self.base.index_copy_(0, chunk, self.log.index_select(0, self.location[chunk].long()))
            self.release()
        self.location.fill_(-1)
        self.log_used = 0
        self.compactions += 1

    def release(self) -> None:
        """Drop the mappings' pages from this process (the page cache keeps them; a shared
        mapping's dirty pages are written out by the kernel, so nothing is lost); a mapped
        store keeps them, as its reads would only fault them in again."""
        if self.io == "mapped":
            return
        self._mm.madvise(mmap.MADV_DONTNEED)
        self._log_mm.madvise(mmap.MADV_DONTNEED)

    def flush(self) -> None:
        """The base file alone holds every row, durably (before it is copied into a checkpoint)."""
        if self.log_used:
            self.compact()
        self._mm.flush()

    def close(self) -> None:
        self.flush()
        self.base = self.log = None  # drop the views before unmapping
        for mm, fd in ((self._mm, self._fd), (self._log_mm, self._log_fd)):
            try:
                mm.close()
            except BufferError:  # a view is still alive somewhere; the mapping goes with it
                pass
            os.close(fd)
        if self.io == "direct":
            os.close(self._read_fd)
            os.close(self._log_read_fd)

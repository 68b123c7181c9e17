"""Checkpoints with torch.distributed.checkpoint: written whole or not at all, verified before
they are trusted, resharded on load.

Layout of a checkpoint directory:
    .lock                  held by the job that trains into this directory (one job per directory)
    step_000000120/        one complete checkpoint (renamed into place only once complete)
        .metadata, *.distcp    the sharded model and optimizer state (DCP)
        rank{r}.pt            each rank's RNG state
        meta.json             step, world size, plan digest
        MANIFEST.json         every other file's size and SHA-256: all of them, nothing else
        COMPLETE              written last, before the rename
    .step_000000130.tmp/   a save in progress (or one a crash interrupted: removed by the next job)

Nothing read back is trusted blindly: a checkpoint is resumed only once every file matches its
manifest; DCP's metadata is unpickled through an allow-list of DCP's own classes and its byte
items with torch's weights-only loader, so a crafted file is refused instead of run. Resuming
takes the newest checkpoint that verifies, saying which it skipped and why.

Loading goes through DCP, which maps saved shards onto whatever sharding the current plan
gives, so a checkpoint saved under one plan (schemes, world size) loads under another.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import logging
import json
import os
import pickle
import shutil
import time
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed._shard.sharded_tensor import ShardedTensor
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import get_element, set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner
from torch.distributed.checkpoint.metadata import StorageMeta

from dlrm_scale.training.checkpoint_layout import MARKER, PREFIX, CheckpointError, complete_checkpoints, step_dir
from dlrm_scale.training.table_optimizer import STATE_SUFFIX
from planner.plan.document import Plan
from planner.spec.errors import PlannerError
from planner.spec.schemes import COLUMN_SCHEMES

log = logging.getLogger("dlrm_scale.training.checkpoint")
# DCP's CheckpointException derives from BaseException, not Exception
LOAD_ERRORS = (Exception, dcp.api.CheckpointException)

MANIFEST = "MANIFEST.json"
LOCK = ".lock"
HASH_CHUNK_BYTES = 8 << 20


def plan_digest(plan_dict: dict) -> str:
    return hashlib.sha256(json.dumps(plan_dict["tables"], sort_keys=True).encode()).hexdigest()[:16]


# ---- one job per directory ----------------------------------------------------------------
class JobLock:
    """An exclusive lock on a checkpoint (or store) directory for this job's life. The kernel
    drops it when the process dies, however it dies, so a crashed job never blocks the next."""

    PROBE_GRACE_S = 2.0  # how long a probe (`check_free`, a launcher's preflight) can hold it

    def __init__(self, directory: Path, what: str = "checkpoint directory") -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._file = open(directory / LOCK, "a+")
        give_up = time.monotonic() + self.PROBE_GRACE_S
        while not _locked(self._file, fcntl.LOCK_EX):
            if time.monotonic() > give_up:
                self._file.close()
                raise _in_use(directory, what)
            time.sleep(0.05)
        self._file.seek(0)
        self._file.truncate()
        self._file.write(str(os.getpid()))
        self._file.flush()
        for stale in directory.glob(f".{PREFIX}*.tmp"):  # saves a dead job left behind: ours to remove now
            shutil.rmtree(stale, ignore_errors=True)

    @staticmethod
    def check_free(directory: Path, what: str = "checkpoint directory") -> None:
        """One line if a job holds `directory` now. A shared lock, taken and dropped at once: the
        launchers of a multi-node job probe one shared directory together, and none of them
        may look like a job to the others."""
        if not (directory / LOCK).exists():
            return
        with open(directory / LOCK, "a+") as f:
            if not _locked(f, fcntl.LOCK_SH):
                raise _in_use(directory, what)

    def release(self) -> None:
        if not self._file.closed:
            fcntl.flock(self._file, fcntl.LOCK_UN)
            self._file.close()


def _locked(f, mode: int) -> bool:
    try:
        fcntl.flock(f, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _in_use(directory: Path, what: str) -> CheckpointError:
    holder = (directory / LOCK).read_text().strip() or "unknown"
    return CheckpointError(f"{what} {directory} is in use by another job (pid {holder}); wait for it to end or choose another directory")


# ---- integrity ---------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> list[str]:
    """The files a manifest covers, as paths relative to the checkpoint."""
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and p.name not in (MANIFEST, MARKER))


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def _mine(names: list[str]) -> list[str]:
    """This rank's share of the files to hash: the work is split over the ranks (one process: all)."""
    return names[dist.get_rank()::dist.get_world_size()] if _distributed() else names


def _gather(local: dict) -> dict:
    if not _distributed():
        return local
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, local)
    return {k: v for part in parts for k, v in part.items()}


def _write_manifest(directory: Path) -> None:
    """All ranks: hash the checkpoint's files (split over the ranks); rank 0 writes the manifest."""
    names = _files(directory)
    entries = _gather({n: {"bytes": (directory / n).stat().st_size, "sha256": _sha256(directory / n)} for n in _mine(names)})
    if dist.get_rank() == 0:
        (directory / MANIFEST).write_text(json.dumps({"files": entries}, indent=0, sort_keys=True))


def _damage(directory: Path, name: str, expected: dict) -> str | None:
    path = directory / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected.get("bytes"):
        return f"{name} is {size} bytes, not {expected.get('bytes')}"
    if _sha256(path) != expected.get("sha256"):
        return f"{name} does not match its SHA-256"
    return None


def verify(path: Path, split: bool = True) -> str | None:
    """All ranks (or one process; `split=False`: this rank alone, hashing every file): why the
    checkpoint at `path` cannot be trusted, or None when its manifest is closed (`unlisted`) and
    every file matches it."""
    try:
        files = json.loads((path / MANIFEST).read_text())["files"]
        if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
            raise ValueError
    except FileNotFoundError:
        files, problem = {}, f"it has no {MANIFEST}"
    except (OSError, ValueError, KeyError, TypeError):
        files, problem = {}, f"its {MANIFEST} is unreadable"
    else:
        problem = unlisted(path, files)
    names = sorted(files)
    if problem is not None:
        found = {}
    elif split:
        found = _gather({n: _damage(path, n, files[n]) for n in _mine(names)})
    else:
        found = {n: _damage(path, n, files[n]) for n in names}
    damaged = [f"{n}: {found[n]}" for n in names if found.get(n)]
    return problem or (damaged[0] if damaged else None)


def unlisted(path: Path, files: dict) -> str | None:
    """What makes a manifest other than closed: a name that is not a plain file inside the
    checkpoint, a symlink anywhere in it, a file the loader reads that it does not list (DCP's
    `.metadata`, meta.json, each rank's data and RNG state), or a file on disk it does not list.
    Anything a manifest leaves out would be read unverified; anything it names outside, verified
    but read from elsewhere."""
    for name in sorted(files):
        parts = Path(name).parts
        if Path(name).is_absolute() or not parts or ".." in parts or name != str(Path(*parts)):
            return f"its {MANIFEST} names {name!r}, not a file inside the checkpoint"
    links = sorted(str(p.relative_to(path)) for p in path.rglob("*") if p.is_symlink())
    if links:
        return f"{links[0]} is a symlink; a checkpoint holds plain files only"
    on_disk = set(_files(path))
    listed = set(files)
    required = {".metadata", "meta.json"}
    try:
        world = int(json.loads((path / "meta.json").read_text())["world_size"]) if "meta.json" in on_disk else 0
    except (OSError, ValueError, KeyError, TypeError):
        return "its meta.json is unreadable"
    required |= {f"rank{r}.pt" for r in range(world)}
    missing = sorted(required - listed) + [f"__{r}_*.distcp" for r in range(world)
                                          if not any(n.startswith(f"__{r}_") and n.endswith(".distcp") for n in listed)]
    if missing:
        return f"its {MANIFEST} does not list {missing[0]}, which resuming reads"
    extra = sorted(on_disk - listed)
    if extra:
        return f"{extra[0]} is not in its {MANIFEST}"
    return None


class _MetadataUnpickler(pickle.Unpickler):
    """DCP's .metadata through an allow-list of the classes DCP writes there."""

    ALLOWED = {
        ("torch.distributed.checkpoint.metadata", name) for name in (
            "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
            "ChunkStorageMetadata", "BytesStorageMetadata", "_MEM_FORMAT_ENCODING")
    } | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
         ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
         ("collections", "OrderedDict")}

    def find_class(self, module: str, name: str):
        if (module, name) in self.ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise CheckpointError(f"refusing {module}.{name}: DCP's metadata holds no such class")


class _SafeReader(FileSystemReader):
    def read_metadata(self, *args, **kwargs):
        path = self._get_metadata_path(kwargs.get("rank"))
        with open(path, "rb") as f:
            metadata = _MetadataUnpickler(io.BytesIO(f.read())).load()
        metadata.storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class _SafePlanner(DefaultLoadPlanner):
    """DCP's planner, but byte items (non-tensor state) go through torch's weights-only loader."""

    def load_bytes(self, read_item, value) -> None:
        loaded = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
        else:
            self.state_dict[read_item.dest_index.fqn] = loaded


class _OwnBytesPlanner(DefaultSavePlanner):
    """DCP's planner, but a tensor that is a view into a larger buffer goes to the writer as a
    tensor of its own bytes, the same memory: FBGEMM keeps a kernel's tables in one buffer, and
    DCP copies such a view whole before writing it (on the retune benchmark's mix 4, 2.5 of a
    save's 8.5 s for a GiB a rank)."""

    def resolve_data(self, write_item):
        data = super().resolve_data(write_item)
        if isinstance(data, torch.Tensor) and data.is_cpu and data.is_contiguous() and data.untyped_storage().nbytes() != data.nbytes:
            as_bytes = torch.from_numpy(data.detach().reshape(-1).view(torch.uint8).numpy())  # numpy owns no copy: a view
            return as_bytes.view(data.dtype).view(data.shape)
        return data


def dcp_save(state: dict, path: Path, no_dist: bool = False) -> None:
    """DCP's save without torch.save's CRC-32 of each record: the manifest's SHA-256 of every
    file is what verifies a checkpoint, and the CRC is another pass over its bytes. `no_dist`:
    this process alone, whatever the process group."""
    crc = torch.serialization.get_crc32_options()
    torch.serialization.set_crc32_options(False)
    try:
        dcp.save(state, checkpoint_id=str(path), planner=_OwnBytesPlanner(), no_dist=no_dist)
    finally:
        torch.serialization.set_crc32_options(crc)


def dcp_load(state: dict, path: Path, no_dist: bool = False) -> None:
    """DCP's load, through the allow-list reader and the weights-only planner."""
    dcp.load(state, storage_reader=_SafeReader(str(path)), planner=_SafePlanner(), no_dist=no_dist)


ROUND_TRIP_PROBE_BYTES = 128 << 20


def round_trip_s_per_gib(directory: Path, probe_bytes: int = ROUND_TRIP_PROBE_BYTES) -> float:
    """Seconds per GiB of state that a checkpoint in `directory` takes to save, hash, verify and
    load back, from `probe_bytes` sent through that same path by this process alone: what a move
    through a checkpoint costs per GiB of the model, besides rebuilding the job. The probe's
    memory is fresh, as the pages a save writes and a rebuilt model loads into are: on a machine
    that backs memory at its first touch (a VM's), those pages cost more than the disk does."""
    probe = directory / ".round_trip_probe"
    shutil.rmtree(probe, ignore_errors=True)
    directory.mkdir(parents=True, exist_ok=True)
    saved = torch.empty(probe_bytes // 4).uniform_()
    loaded = {"probe": torch.empty_like(saved)}
    started = time.perf_counter()
    try:
        dcp_save({"probe": saved}, probe, no_dist=True)
        files = [probe / name for name in _files(probe)]
        digests = [_sha256(f) for f in files]  # the save's manifest
        if [_sha256(f) for f in files] != digests:  # the load's verification
            raise CheckpointError(f"checkpoint directory {directory}: a file changed while it was read back; choose another "
                                  f"--checkpoint-dir")
        dcp_load(loaded, probe, no_dist=True)
        seconds = time.perf_counter() - started
    except (OSError, dcp.api.CheckpointException) as e:  # DCP reports a failed write as its CheckpointException
        raise CheckpointError(f"checkpoint directory {directory}: {probe_bytes >> 20} MiB of a move's checkpoint could not be "
                              f"written and read back ({first_line(e)}); free space there, choose another --checkpoint-dir "
                              f"or drop --retune") from None
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return seconds * (1 << 30) / probe_bytes


# ---- save and choose -------------------------------------------------------------------------
def save(directory: Path, step: int, model: torch.nn.Module, optimizer, meta: dict, keep: int,
         write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write a checkpoint of `step` atomically: all ranks write into a temporary directory
    (DCP state, RNG, and whatever `write_extra` adds, e.g. cached tables' stores), hash what
    they wrote into the manifest, then rank 0 marks it complete, renames it into place and
    prunes to the newest `keep`. The caller holds the directory's JobLock.

    A full disk never ends in a traceback or a partial save: first the room is checked against
    the last checkpoint's size (`make_room`), and a save that still fills the disk is removed,
    each ending in CheckpointError on every rank, naming the newest good checkpoint."""
    rank = dist.get_rank()
    tmp = directory / f".{PREFIX}{step:09d}.tmp"
    final = step_dir(directory, step)
    short = None
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crash mid-save
        short = make_room(directory, keep, step)
        if short is None:
            tmp.mkdir()
    _agree_or_raise(short)

    def state() -> None:
        dcp_save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, tmp)
        torch.save({"torch_rng": torch.get_rng_state()}, tmp / f"rank{rank}.pt")
        if write_extra is not None:
            write_extra(tmp)

    def meta_file() -> None:
        if rank == 0:
            (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "world_size": dist.get_world_size()}))

    # each part on every rank, then the ranks agree (which orders the parts: meta.json exists before it is hashed)
    for part in (state, meta_file, lambda: _write_manifest(tmp)):
        failed = _written(part)
        _agree_or_raise(_full(directory, step, failed) if failed else None, cleanup=tmp)
    if rank == 0:
        (tmp / MARKER).write_text("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in complete_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def _written(part: Callable[[], None]) -> str | None:
    """Run one part of a save: None when it wrote, what happened when the disk filled up; any
    other failure raised as it is."""
    try:
        part()
        return None
    except LOAD_ERRORS as e:
        if not _disk_full(e):
            raise
        return "the disk filled up while saving"


def _disk_full(e: BaseException) -> bool:
    """ENOSPC (or a quota's EDQUOT), directly or as DCP reports a rank's failed write."""
    if isinstance(e, dcp.api.CheckpointException):
        return any(_disk_full(err) for errors in e.failures.values() for err in (errors if isinstance(errors, list) else [errors])
                   if isinstance(err, BaseException))
    return isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) or (e.__cause__ is not None and _disk_full(e.__cause__))


def _bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def make_room(directory: Path, keep: int, step: int) -> str | None:
    """Rank 0, before a save: room for one more checkpoint as large as the newest, freed by
    removing the oldest checkpoints while more than the newest one that verifies is kept (and
    `keep` allows more than one); else why not, in one line."""
    found = complete_checkpoints(directory)
    if not found:
        return None
    need = _bytes(found[-1][1])
    good = None
    while shutil.disk_usage(directory).free < need:
        good = good or next((p for _, p in reversed(found) if verify(p, split=False) is None), None)
        removable = [p for _, p in found if p != good]
        if keep < 2 or not removable:
            return _full(directory, step, f"it needs about {need:,} bytes")
        shutil.rmtree(removable[0], ignore_errors=True)
        log.warning("removed %s to make room for the next checkpoint in %s", removable[0], directory)
        found = complete_checkpoints(directory)
    return None


def _full(directory: Path, step: int, why: str) -> str:
    found = complete_checkpoints(directory)
    return (f"checkpoint of step {step} in {directory}: {why}, and {shutil.disk_usage(directory).free:,} bytes are free; "
            f"the newest checkpoint is {found[-1][1] if found else 'none'}; free space and resume with --resume")


def _agree_or_raise(problem: str | None, cleanup: Path | None = None) -> None:
    """All ranks: the first rank's problem, if any rank has one, raised on every rank (rank 0
    removing `cleanup`, a save that cannot complete)."""
    problems = [problem]
    if _distributed():
        problems = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first is None:
        return
    if cleanup is not None and dist.get_rank() == 0:
        shutil.rmtree(cleanup, ignore_errors=True)
    raise CheckpointError(first)


def read_meta(path: Path) -> dict:
    if not (path / MARKER).exists():
        raise CheckpointError(f"checkpoint {path} is partial (no {MARKER} marker); remove it or resume from another")
    try:
        meta = json.loads((path / "meta.json").read_text())
        int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} has an unreadable meta.json; it is corrupted, resume from another") from None
    return meta


def first_line(e: BaseException) -> str:
    """What went wrong, in one line; for DCP's per-rank report, the first rank's own error."""
    if isinstance(e, dcp.api.CheckpointException) and e.failures:
        e = next(iter(e.failures.values()))[0]
    text = str(e).strip()
    return text.splitlines()[0][:200] if text else type(e).__name__


def load(path: Path, model: torch.nn.Module, optimizer, plan: Plan | None = None) -> dict:
    """Load model and optimizer state (resharding as needed) and, on the same world size, each
    rank's RNG state. Returns the checkpoint's meta (its step among others). The caller has
    verified the checkpoint; `plan` is the one the job runs under.

    Tables and optimizer state always reshard. Row-wise Adagrad keeps one value per row and
    column shard (FBGEMM's kernel, under column-wise schemes), so where a table's column split
    differs from the checkpoint's, its state is regrouped (`regroup_row_state`).
    """
    meta = read_meta(path)
    model_state = {"model": model.state_dict()}
    try:
        dcp_load(model_state, path)
    except LOAD_ERRORS as e:  # foreign files, or a class outside the allow-list
        if isinstance(e, dcp.api.CheckpointException) and any(isinstance(f[0], CheckpointError) for f in e.failures.values()):
            raise CheckpointError(f"checkpoint {path}: {first_line(e)}; it was not written by dlrm-scale, do not resume it") from None
        raise CheckpointError(f"checkpoint {path} cannot be loaded into this model ({first_line(e)}); it is corrupted or for another model") from None
    model.load_state_dict(model_state["model"])
    optim_state = {"optimizer": optimizer.state_dict()}
    saved_plan = _saved_plan(meta)
    regrouped = _stand_in_for_regrouped(optim_state, saved_plan, plan) if plan is not None and saved_plan is not None else {}
    try:
        dcp_load(optim_state, path)
    except LOAD_ERRORS as e:
        if dist.get_rank() == 0:
            log.warning("optimizer state of %s does not map onto this plan (%s); it starts fresh", path, first_line(e))
    else:
        for where, (current, saved_cols, cols) in regrouped.items():
            stand_in = get_element(optim_state, where)
            set_element(optim_state, where, fill_row_state(current, regroup_row_state(stand_in, saved_cols, cols)))
        optimizer.load_state_dict(optim_state["optimizer"])
    rank_file = path / f"rank{dist.get_rank()}.pt"
    if meta.get("world_size") == dist.get_world_size() and rank_file.exists():
        torch.set_rng_state(torch.load(rank_file, weights_only=True)["torch_rng"])
    return meta


def _saved_plan(meta: dict) -> Plan | None:
    """The layout a checkpoint was saved under, where its meta holds a readable one (without it,
    optimizer state loads as saved, and a layout that does not fit it starts fresh)."""
    try:
        return Plan.from_dict(meta["plan"], "the checkpoint's plan") if isinstance(meta.get("plan"), dict) else None
    except PlannerError:
        return None


def state_columns(plan: Plan, table: str) -> tuple[int, ...]:
    """The column widths a table's row-wise optimizer state is kept per: its column blocks',
    left to right, under a scheme that splits columns (FBGEMM's state is per shard); its width
    otherwise."""
    t = plan.tables[table]
    if t.sharding_type in COLUMN_SCHEMES:
        return tuple(cols for _, cols in sorted({(s.col_offset, s.cols) for s in t.shards}))
    return (t.embedding_dim,)


def _stand_in_for_regrouped(optim_state: dict, saved: Plan, current: Plan) -> dict:
    """Put a plain tensor of the checkpoint's shape (the whole state, read on every rank) where a
    table's row-wise state was split otherwise when saved; {path in the state: (the current
    state, the saved split, the current split)}."""
    flat, paths = flatten_state_dict(optim_state)
    out = {}
    for fqn, value in flat.items():
        leaf = paths[fqn][-1]
        table = leaf.removesuffix(STATE_SUFFIX) if isinstance(leaf, str) and leaf.endswith(STATE_SUFFIX) else None
        if not (table in current.tables and table in saved.tables and isinstance(value, torch.Tensor) and value.dim() == 1):
            continue  # not a row-wise state (Adagrad's is per weight, SGD has none)
        saved_cols, cols = state_columns(saved, table), state_columns(current, table)
        if saved_cols != cols:
            out[paths[fqn]] = (value, saved_cols, cols)
            set_element(optim_state, paths[fqn], torch.empty(len(saved_cols) * current.tables[table].num_embeddings, dtype=value.dtype))
    return out


def regroup_row_state(saved: torch.Tensor, saved_cols: tuple[int, ...], cols: tuple[int, ...]) -> torch.Tensor:
    """Row-wise Adagrad's state, kept per row and column shard (`saved_cols` wide, shard after
    shard), for the column shards `cols`. The state is a running sum of each step's mean squared
    gradient over the shard's columns, so the whole row's is the width-weighted mean of its
    shards': exact out of a column split. Each new shard gets the whole row's: into a column
    split, the shards' own sums were never kept, and they start from the row's."""
    per_shard = saved.view(len(saved_cols), -1)
    widths = torch.tensor(saved_cols, dtype=saved.dtype)
    whole = (per_shard * widths[:, None]).sum(0) / widths.sum()
    return whole.repeat(len(cols))


def fill_row_state(current, values: torch.Tensor):
    """`current` (a ShardedTensor, or a replica's tensor) with each of its local pieces taken
    from `values` at the piece's offset."""
    if isinstance(current, ShardedTensor):
        for shard in current.local_shards():
            offset = shard.metadata.shard_offsets[0]
            shard.tensor.copy_(values[offset:offset + shard.tensor.numel()])
    else:
        current.copy_(values)
    return current

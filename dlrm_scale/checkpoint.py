"""Checkpoints with torch.distributed.checkpoint: written whole or not at all, resharded on load.

Layout of a checkpoint directory:
    step_000000120/        one complete checkpoint (renamed into place only once complete)
        .metadata, *.distcp    the sharded model and optimizer state (DCP)
        rank{r}.pt            each rank's RNG state
        meta.json             step, world size, plan digest
        COMPLETE              written last, before the rename
    .step_000000130.tmp/   a save in progress (or one a crash interrupted: ignored, then replaced)

Loading goes through DCP, which maps saved shards onto whatever sharding the current plan
gives, so a checkpoint saved under one plan (schemes, world size) loads under another.
"""

from __future__ import annotations

import hashlib
import logging
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from planner.errors import PlannerError

log = logging.getLogger("dlrm_scale.checkpoint")
# DCP's CheckpointException derives from BaseException, not Exception
LOAD_ERRORS = (Exception, dcp.api.CheckpointException)

PREFIX = "step_"
MARKER = "COMPLETE"


class CheckpointError(PlannerError):
    """A checkpoint directory is unusable: missing, partial, corrupted or for another model."""


@dataclass(frozen=True)
class CheckpointConfig:
    directory: Path | None = None
    every_steps: int = 0  # 0: only at the end
    keep: int = 3

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise CheckpointError(f"--checkpoint-every must be >= 0, got {self.every_steps}")
        if self.keep < 1:
            raise CheckpointError(f"--keep-checkpoints must be >= 1, got {self.keep}")


def step_dir(directory: Path, step: int) -> Path:
    return directory / f"{PREFIX}{step:09d}"


def complete_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint, oldest first; partial ones are skipped."""
    if not directory.is_dir():
        return []
    found = []
    for p in directory.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and (p / MARKER).exists():
            try:
                found.append((int(p.name[len(PREFIX):]), p))
            except ValueError:
                continue
    return sorted(found)


def plan_digest(plan_dict: dict) -> str:
    return hashlib.sha256(json.dumps(plan_dict["tables"], sort_keys=True).encode()).hexdigest()[:16]


def save(directory: Path, step: int, model: torch.nn.Module, optimizer, meta: dict, keep: int,
         write_extra: Callable[[Path], None] | None = None) -> Path:
    """Write a checkpoint of `step` atomically: all ranks write into a temporary directory
    (DCP state, RNG, and whatever `write_extra` adds, e.g. cached tables' stores), rank 0
    marks it complete and renames it into place, then prunes to the newest `keep`."""
    rank = dist.get_rank()
    tmp = directory / f".{PREFIX}{step:09d}.tmp"
    final = step_dir(directory, step)
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)  # left by a crash mid-save
        tmp.mkdir()
    dist.barrier()
    dcp.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=str(tmp))
    torch.save({"torch_rng": torch.get_rng_state()}, tmp / f"rank{rank}.pt")
    if write_extra is not None:
        write_extra(tmp)
    dist.barrier()
    if rank == 0:
        (tmp / "meta.json").write_text(json.dumps({**meta, "step": step, "world_size": dist.get_world_size()}))
        (tmp / MARKER).write_text("")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for _, old in complete_checkpoints(directory)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def read_meta(path: Path) -> dict:
    if not (path / MARKER).exists():
        raise CheckpointError(f"checkpoint {path} is partial (no {MARKER} marker); remove it or resume from another")
    try:
        meta = json.loads((path / "meta.json").read_text())
        int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"checkpoint {path} has an unreadable meta.json; it is corrupted, resume from another") from None
    return meta


def _first_line(e: Exception) -> str:
    return str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__


def load(path: Path, model: torch.nn.Module, optimizer) -> dict:
    """Load model and optimizer state (resharding as needed) and, on the same world size, each
    rank's RNG state. Returns the checkpoint's meta (its step among others).

    Tables always reshard. Optimizer state reshards too, except where the layouts keep
    different state: row-wise Adagrad keeps one value per row and column shard, so moving a
    table into or out of column-wise sharding restarts its optimizer state (with a warning).
    """
    meta = read_meta(path)
    model_state = {"model": model.state_dict()}
    try:
        dcp.load(model_state, checkpoint_id=str(path))
    except LOAD_ERRORS as e:  # damaged or foreign files
        raise CheckpointError(f"checkpoint {path} cannot be loaded into this model ({_first_line(e)}); it is corrupted or for another model") from None
    model.load_state_dict(model_state["model"])
    optim_state = {"optimizer": optimizer.state_dict()}
    try:
        dcp.load(optim_state, checkpoint_id=str(path))
    except LOAD_ERRORS as e:
        if dist.get_rank() == 0:
            log.warning("optimizer state of %s does not map onto this plan (%s); it starts fresh", path, _first_line(e))
    else:
        optimizer.load_state_dict(optim_state["optimizer"])
    rank_file = path / f"rank{dist.get_rank()}.pt"
    if meta.get("world_size") == dist.get_world_size() and rank_file.exists():
        torch.set_rng_state(torch.load(rank_file, weights_only=True)["torch_rng"])
    return meta

"""Where a checkpoint directory keeps its checkpoints (dlrm_scale/training/checkpoint.py says what
each holds): torch-free, so that `dlrm-scale train` checks a resume before it launches."""

from __future__ import annotations

import json
from pathlib import Path

from planner.spec.errors import PlannerError

PREFIX = "step_"
MARKER = "COMPLETE"


class CheckpointError(PlannerError):
    """A checkpoint directory is unusable: missing, partial, corrupted or for another model."""


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


def candidates(directory: Path, resume_from: str | None = None) -> list[tuple[int, Path]]:
    """The checkpoints a resume may use, newest first: all complete ones, or the one
    `resume_from` names (a step number or a checkpoint's path)."""
    if not directory.is_dir():
        raise CheckpointError(f"--checkpoint-dir {directory} does not exist; check the path, or drop --resume to start afresh")
    found = complete_checkpoints(directory)
    if resume_from is None:
        return found[::-1]
    if resume_from.isdigit():
        chosen = [(s, p) for s, p in found if s == int(resume_from)]
        if not chosen:
            have = ", ".join(str(s) for s, _ in found) or "none"
            raise CheckpointError(f"--resume-from {resume_from}: no complete checkpoint of that step in {directory} (steps: {have})")
        return chosen
    path = Path(resume_from)
    chosen = [(s, p) for s, p in found if p.resolve() == path.resolve()]
    if not chosen:
        raise CheckpointError(f"--resume-from {resume_from} is not a complete checkpoint in {directory}; "
                              f"give a step number or one of its step_* folders")
    return chosen


def saved_tables(path: Path) -> dict[str, tuple[int, int]] | None:
    """The tables (rows, dim) a checkpoint's plan held, from its meta.json; None where it cannot
    be read (the trainer then skips it as damaged, saying why)."""
    try:
        tables = json.loads((path / "meta.json").read_text())["plan"]["tables"]
        return {name: (int(t["num_embeddings"]), int(t["embedding_dim"])) for name, t in tables.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None

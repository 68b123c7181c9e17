"""Where a checkpoint directory keeps its checkpoints (dlrm_scale/training/checkpoint.py says what
each holds): torch-free, so that `dlrm-scale train` checks a resume before it launches."""

from __future__ import annotations

import json
from pathlib import Path

PREFIX = "step_"
MARKER = "COMPLETE"


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


def saved_tables(path: Path) -> dict[str, tuple[int, int]] | None:
    """The tables (rows, dim) a checkpoint's plan held, from its meta.json; None where it cannot
    be read (the trainer then skips it as damaged, saying why)."""
    try:
        tables = json.loads((path / "meta.json").read_text())["plan"]["tables"]
        return {name: (int(t["num_embeddings"]), int(t["embedding_dim"])) for name, t in tables.items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None

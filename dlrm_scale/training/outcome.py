"""How a job's end reaches whoever launched it. Under `dlrm-scale train`, torchrun's output and the
workers' stderr go to OUT_DIR/launcher.log, and a worker's error (a user error on any rank, a peer
that stopped answering) is written once, by the first rank to fail, to OUT_DIR/error.json: the
launcher prints that as the job's one line and exits with its code. Torch-free."""

from __future__ import annotations

import json
import os
from pathlib import Path

ERROR = "error.json"
LOG = "launcher.log"
LAUNCHED = "DLRM_SCALE_LAUNCHED"  # set by `dlrm-scale train` in the workers' environment


def report(out_dir: Path | None, rank: int, line: str, code: int) -> None:
    """A worker's error, kept only if no rank reported one first."""
    if out_dir is None:
        return
    try:
        fd = os.open(out_dir / ERROR, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return  # another rank was first, or the folder is gone: its line stays
    with os.fdopen(fd, "w") as f:
        json.dump({"rank": rank, "line": line, "code": code}, f)


def clear(out_dir: Path) -> None:
    """Before a launch: a former run's error is not this one's."""
    (out_dir / ERROR).unlink(missing_ok=True)


def reported(out_dir: Path) -> dict | None:
    try:
        doc = json.loads((out_dir / ERROR).read_text())
        return doc if isinstance(doc, dict) and isinstance(doc.get("line"), str) and isinstance(doc.get("code"), int) else None
    except (OSError, ValueError):
        return None

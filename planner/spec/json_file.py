"""JSON documents the tools write and read back (plans, access statistics)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_atomic(path: str | Path, doc: Any) -> None:
    """Write through a temporary file and a rename: a crash mid-write never leaves half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1) + "\n")
    tmp.replace(path)


def read(path: str | Path, what: str, missing_fix: str, command: str, error: type[Exception]) -> Any:
    """The parsed document; a missing or malformed file is one line (`error`) naming it and the
    fix: `missing_fix` when it does not exist, re-running `command` when it is not JSON."""
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise error(f"{what} {path} does not exist; {missing_fix}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{what} {path} is not valid JSON ({e}); re-run '{command}'") from None

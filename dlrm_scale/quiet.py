"""Third-party warnings checked and found harmless, each with its reason, kept off the terminal
at our entry points. Anything not listed here still shows. What is kept off is not lost: with a
log file (the trainer's `OUT_DIR/third_party_rankN.log`) every one is written there."""

from __future__ import annotations

import logging
import re
import warnings
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Checked:
    source: str  # a warning's category name, or the logger that logs it
    pattern: str  # the start of its message, a regular expression
    reason: str  # why it is harmless here

    def matches(self, source: str, message: str) -> bool:
        return source == self.source and re.match(self.pattern, message) is not None


CHECKED = (
    Checked("torchrec.distributed.utils", r"Sharding Type is data_parallel, caching params will be ignored",
            "TorchRec logs it for every data-parallel table, cached or not; a plan never caches a replicated table"),
    Checked("torchrec.distributed.utils", r"Compute Kernel is dense, caching params will be ignored",
            "as above, for the dense kernel of data-parallel tables"),
    Checked("FutureWarning", r"`broadcast_buffers` is deprecated",
            "TorchRec 1.8 builds its DDP wrappers with broadcast_buffers; torch 2.13 still honours it, and our "
            "modules have no buffers to broadcast"),
    Checked("UserWarning", r"fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered",
            "FBGEMM's CPU build registers the data-parallel tables' dense lookup without an autograd kernel and "
            "runs its backward through torch's fallback; tests/test_plan_invariance.py trains those tables to the "
            "same weights as sharded ones, so the gradient it computes is the right one"),
    Checked("torch.fx._symbolic_trace", r"is_fx_tracing will return true",
            "a deprecation notice torch logs once when TorchRec asks whether it is being traced"),
)


def checked(source: str, message: str) -> Checked | None:
    return next((c for c in CHECKED if c.matches(source, message)), None)


class _LogFilter(logging.Filter):
    def __init__(self, log: Path | None) -> None:
        super().__init__()
        self.log = log

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if checked(record.name, message) is None:
            return True
        _append(self.log, f"{record.name}: {message}")
        return False


def _append(log: Path | None, line: str) -> None:
    if log is not None:
        with open(log, "a", encoding="utf-8") as f:
            f.write(line + "\n")


def install(log: Path | None = None) -> None:
    """Keep the checked warnings off the terminal from here on (to `log` where given)."""
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if checked(category.__name__, str(message)) is None:
            shown(message, category, filename, lineno, file, line)
        else:
            _append(log, f"{category.__name__} at {filename}:{lineno}: {message}")

    warnings.showwarning = show
    for name in {c.source for c in CHECKED if "." in c.source}:
        logger = logging.getLogger(name)
        for old in [f for f in logger.filters if isinstance(f, _LogFilter)]:
            logger.removeFilter(old)
        logger.addFilter(_LogFilter(log))

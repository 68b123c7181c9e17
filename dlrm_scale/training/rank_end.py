"""How a rank's process ends once its work is done and saved: a barrier, the process groups
destroyed, output flushed, then out without the interpreter's teardown.

Why not a plain return: gloo's worker threads free a finished collective after it has returned
to Python (and a barrier holds the works queued before it until the barrier itself is freed).
Freeing a collective frees its tensors, whose Python objects need the GIL; a worker thread that
asks for it while the interpreter finalizes is unwound by pthread_exit through a noexcept
destructor: std::terminate ("terminate called without an active exception"), SIGABRT, and a
job that fails after a complete run. Seen here in 1 of 69 runs of a 2-rank test (the core:
`~AsyncBarrierWork` -> `~AsyncAllgatherWork` -> tensor decref -> `take_gil` -> `pthread_exit`).
Destroying every group first would join those threads, but DDP keeps the default group alive
from C++ after `destroy_process_group`, so the teardown is skipped instead. What a rank writes
(checkpoints, metrics) is closed and synced before this, by its owners.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import torch.distributed as dist


def end_rank(code: int = 0) -> NoReturn:
    """Wait for every rank, destroy the process groups, flush, and exit with `code`."""
    dist.barrier()
    dist.destroy_process_group()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)

"""Stopping when a cluster asks: SIGTERM or SIGINT to a worker (from `dlrm-scale train`, from
torchrun as it shuts down, from a scheduler) ends the job at an agreed step with a checkpoint of
that step, so a preempted job loses no step and resumes with `--resume` as if never stopped.

A signal only sets a flag; every CHECK_STEPS steps the ranks agree (the flag's max over ranks,
one small collective) so that all stop after the same step. Each worker records its pid where
the launcher finds it (`OUT_DIR/.workers/`), and rank 0 what it saved (`OUT_DIR/stopped.json`),
which the launcher reports. The launcher exits with EXIT_CODE after such a stop. Torch-free but
for the agreement itself, so that the launcher reads it without importing torch."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path

SIGNALS = (signal.SIGTERM, signal.SIGINT)
CHECK_STEPS = 10  # at most this many steps pass between a signal and the stop: one collective of 8 bytes each time
EXIT_CODE = 128 + signal.SIGTERM  # what `dlrm-scale train` exits with after a stop: a job ended by SIGTERM
STOPPED = "stopped.json"
PR_SET_PDEATHSIG = 1  # linux/prctl.h
WORKERS = ".workers"


def die_with_parent(signum: int) -> None:
    """Ask the kernel to send this process `signum` when its parent dies, however it dies
    (PR_SET_PDEATHSIG, Linux); a parent gone before the request took effect ends it now."""
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:
            os._exit(1)


def pid_file(out_dir: Path, rank: int) -> Path:
    """Where a worker records its pid: per host, so that a launcher signals only its own node's workers."""
    return out_dir / WORKERS / f"{socket.gethostname()}-rank{rank}.pid"


class Preemption:
    def __init__(self, out_dir: Path, rank: int) -> None:
        self.out_dir, self.rank, self.signal_name = out_dir, rank, None
        if threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, self._requested)
        pid_file(out_dir, rank).parent.mkdir(parents=True, exist_ok=True)
        pid_file(out_dir, rank).write_text(str(os.getpid()))

    def _requested(self, signum: int, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self, step: int) -> bool:
        """Every CHECK_STEPS steps (all ranks call it at the same steps): whether any rank was asked to stop."""
        if step % CHECK_STEPS:
            return False
        import torch
        import torch.distributed as dist

        from dlrm_scale.training.host_group import host_group

        flag = torch.tensor([1 if self.signal_name else 0], dtype=torch.int64)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=host_group())
        return bool(flag.item())

    def record(self, step: int, checkpoint: Path | None) -> None:
        """Rank 0: what the stop saved, for the launcher to report."""
        if self.rank == 0:
            doc = {"step": step, "signal": self.signal_name or "a peer's signal", "checkpoint": str(checkpoint) if checkpoint else None}
            (self.out_dir / STOPPED).write_text(json.dumps(doc))

    def close(self) -> None:
        pid_file(self.out_dir, self.rank).unlink(missing_ok=True)


def signal_workers(out_dir: Path, signum: int) -> int:
    """The launcher's side: pass `signum` to this host's workers of a job writing into `out_dir`
    (only live processes of dlrm_scale.train: a pid reused since is left alone). How many."""
    sent = 0
    for path in sorted((out_dir / WORKERS).glob(f"{socket.gethostname()}-rank*.pid")):
        try:
            pid = int(path.read_text())
            if b"dlrm_scale.train" in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signum)
                sent += 1
        except (OSError, ValueError):
            continue  # gone already, or not a pid
    return sent


def stop_report(out_dir: Path) -> dict | None:
    """What rank 0 recorded of a stop (the launcher clears it before it launches), or None."""
    try:
        return json.loads((out_dir / STOPPED).read_text())
    except (OSError, ValueError):
        return None

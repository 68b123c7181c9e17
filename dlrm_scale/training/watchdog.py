"""A rank that stops making progress (stopped, hung, or dead) ends the job within the collective
timeout (`--collective-timeout`, default 300 s rather than gloo's 30 minutes), with one line
naming the rank and the step.

When a collective times out or loses its peer, each rank still running says so in the job's store
(it lives in torchrun's agent, so it answers while a rank is stopped) and, a moment later, reads
who did not: those are the ranks that fell behind. torchrun's `--max-restarts` with `--resume`
then restarts the job from its newest checkpoint."""

from __future__ import annotations

import re
import time

EXIT_CODE = 124  # as timeout(1) exits: the job stopped waiting
ANSWER_S = 3.0  # how long the ranks still running have to say so
# gloo's words for a peer gone quiet or away ("Timed out waiting 5000ms for recv", "Application
# timeout caused pair closure", "Connection closed by peer", ...)
_PEER_FAILURE = re.compile(r"timed out|timeout|connection closed by peer|connection reset by peer|broken pipe", re.IGNORECASE)

_store = None
_rank, _world, _timeout_s = 0, 1, 0.0


def init(store, rank: int, world: int, timeout_s: float) -> None:
    """Once per rank, with the job's store, after the process group is up."""
    global _store, _rank, _world, _timeout_s
    _store, _rank, _world, _timeout_s = store, rank, world, timeout_s


def peer_failure(error: BaseException) -> bool:
    return isinstance(error, RuntimeError) and _PEER_FAILURE.search(str(error)) is not None


def describe(step: int) -> str:
    """The line a running rank says when its peers stopped answering at `step`."""
    silent = []
    if _store is not None:
        _store.set(f"waiting/{_rank}", str(step))
        time.sleep(ANSWER_S)
        silent = [r for r in range(_world) if not _store.check([f"waiting/{r}"])]
    who = f"rank{'s' if len(silent) > 1 else ''} {', '.join(map(str, silent))}, which stopped answering" if silent else "a peer"
    return (f"rank {_rank} waited {_timeout_s:g} s at step {step} for {who}; the job stops "
            f"(resume with --resume; --collective-timeout sets the wait)")

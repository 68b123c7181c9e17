"""The process group for the small host tensors the ranks agree on: a bad loss, the window's loss
and phase times, the memory peak, evaluation's logits, cache counters.

On CUDA the default group is NCCL, which refuses CPU tensors (seen on an H200), and TorchRec takes
its sharding's device from the default group (a "cpu:gloo,cuda:nccl" one would read as CPU), so
the default group stays NCCL and these go over a gloo group of their own. On CPU the default
group is gloo already.
"""

from __future__ import annotations

import torch.distributed as dist

_group: dist.ProcessGroup | None = None


def init_host_group(cuda: bool, timeout=None) -> None:
    """Every rank calls this once, after the default group is up (`timeout`: its collectives', as the default group's)."""
    global _group
    _group = dist.new_group(backend="gloo", timeout=timeout) if cuda else None


def host_group() -> dist.ProcessGroup | None:
    """The group for host tensors (None: the default group, itself gloo)."""
    return _group

"""Whole embedding tables from a sharded model, for checks, reports and resharding."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

from dlrm_scale.model import EMBEDDING_MODULE_PATH


def full_tables(model: torch.nn.Module, dst: int = 0) -> dict[str, torch.Tensor]:
    """Every embedding table gathered whole on rank `dst` (an empty dict elsewhere).

    All ranks must call it. Data-parallel tables are plain replicated tensors already.
    """
    prefix = EMBEDDING_MODULE_PATH + ".embedding_bags."
    out = {}
    rank = dist.get_rank()
    for key, value in model.state_dict().items():
        if not (key.startswith(prefix) and key.endswith(".weight")):
            continue
        name = key[len(prefix) : -len(".weight")]
        if isinstance(value, ShardedTensor):
            full = torch.empty(value.size(), dtype=value.dtype) if rank == dst else None
            value.gather(dst=dst, out=full)
            if rank == dst:
                out[name] = full
        elif rank == dst:
            out[name] = value.detach().clone()
    return out


def local_shard_blocks(model: torch.nn.Module) -> dict[str, list[tuple[int, int, int, int]]]:
    """(row_offset, col_offset, rows, cols) of the shards this rank holds, per table."""
    prefix = EMBEDDING_MODULE_PATH + ".embedding_bags."
    out: dict[str, list[tuple[int, int, int, int]]] = {}
    for key, value in model.state_dict().items():
        if key.startswith(prefix) and key.endswith(".weight"):
            name = key[len(prefix) : -len(".weight")]
            if isinstance(value, ShardedTensor):
                out[name] = sorted(
                    (m.shard_offsets[0], m.shard_offsets[1], m.shard_sizes[0], m.shard_sizes[1])
                    for m in (s.metadata for s in value.local_shards())
                )
            else:
                out[name] = [(0, 0, value.shape[0], value.shape[1])]
    return out

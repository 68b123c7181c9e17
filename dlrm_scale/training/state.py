"""Whole embedding tables from a sharded model, for checks, reports and resharding."""

from __future__ import annotations

from typing import Callable

import torch
import torch.distributed as dist
from torch.distributed._shard.sharded_tensor import ShardedTensor

from dlrm_scale.bridge.resident import embedding_kernels

from dlrm_scale.training.model import table_of_key


def full_tables(model: torch.nn.Module, dst: int = 0, tiered=None) -> dict[str, torch.Tensor]:
    """Every embedding table gathered whole on rank `dst` (an empty dict elsewhere).

    All ranks must call it. Data-parallel tables are plain replicated tensors already. Cached
    tables (a dlrm_scale.tiering.TieredEmbeddings) are read from their stores.
    """
    out = {}
    rank = dist.get_rank()
    cached = {}
    for (name, col), shard in (tiered.shards.items() if tiered is not None else []):
        cached[(name, col)] = shard.records()[:, : shard.weights.shape[1]].clone()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, cached)
    shards = sorted(((k, v) for part in gathered for k, v in part.items()), key=lambda kv: kv[0])
    cached_names = {name for (name, _), _ in shards}
    for (name, col), weights in shards if rank == dst else ():
        out[name] = weights if name not in out else torch.cat([out[name], weights], dim=1)
    for key, value in model.state_dict().items():
        name = table_of_key(key)
        if name is None or name in cached_names:
            continue
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
    out: dict[str, list[tuple[int, int, int, int]]] = {}
    for key, value in model.state_dict().items():
        name = table_of_key(key)
        if name is not None:
            if isinstance(value, ShardedTensor):
                out[name] = sorted(
                    (m.shard_offsets[0], m.shard_offsets[1], m.shard_sizes[0], m.shard_sizes[1])
                    for m in (s.metadata for s in value.local_shards())
                )
            else:
                out[name] = [(0, 0, value.shape[0], value.shape[1])]
    return out


def local_shard_state(
    model: torch.nn.Module, tiered=None, initial: Callable[[str], torch.Tensor] | None = None
) -> dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]]:
    """(weights, optimizer state) of every fused-kernel shard on this rank, by (table, first
    column); cached shards (a dlrm_scale.tiering.TieredEmbeddings) are read from their stores.
    With `initial` (table name -> whole table), each shard's weights are first set from it:
    runs to be compared then start from the same tables. State is one row per table row."""
    out = {}
    for (name, col), shard in (tiered.shards.items() if tiered is not None else []):
        cols = shard.weights.shape[1]
        if initial is not None:
            shard.set_weights(initial(name)[:, col:col + cols])
        records = shard.records()
        out[(name, col)] = (records[:, :cols], records[:, cols:])
    for kernel in embedding_kernels(model):
        weights = kernel.emb_module.split_embedding_weights()
        states = kernel.emb_module.split_optimizer_states()
        for j, t in enumerate(kernel.config.embedding_tables):
            col = t.local_metadata.shard_offsets[1]
            if (t.name, col) in out:
                continue
            if initial is not None:
                with torch.no_grad():
                    weights[j].copy_(initial(t.name)[:, col:col + weights[j].shape[1]])
            state = torch.cat([s.reshape(len(weights[j]), -1) for s in states[j]], 1) if states else torch.empty(0)
            out[(t.name, col)] = (weights[j].detach().clone(), state.detach().clone())
    return out

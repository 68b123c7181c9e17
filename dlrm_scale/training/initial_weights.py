"""Initial embedding weights that depend on (seed, table, row) only, never on the plan.

TorchRec initialises each shard from its rank's random generator, so the same table starts
from different weights under every scheme, world size and rank layout. Here row r of table T
is drawn from a generator keyed by (seed, T, r // BLOCK_ROWS): each rank generates only the
blocks its shards cover (no rank materialises a whole large table), and any shard, cache
store or replica of the table holds the same values. The law is TorchRec's default for a
table: uniform in [-sqrt(1/rows), sqrt(1/rows)].
"""

from __future__ import annotations

import zlib
from typing import Callable

import numpy as np
import torch

from dlrm_scale.bridge.resident import embedding_kernels

BLOCK_ROWS = 4096  # rows drawn from one generator
FILL_ROWS = 1 << 16  # rows generated at a time when filling a shard: bounds the memory it takes


def init_bound(num_rows: int) -> float:
    return (1.0 / num_rows) ** 0.5


def initial_rows(seed: int, table: str, num_rows: int, dim: int, start: int, stop: int) -> torch.Tensor:
    """Rows start..stop-1 of `table`'s initial weights, [stop - start, dim] float32."""
    if not 0 <= start <= stop <= num_rows:
        raise ValueError(f"rows {start}..{stop} are outside table '{table}' of {num_rows} rows")
    if stop == start:
        return torch.empty(0, dim)
    key = zlib.crc32(table.encode())
    bound = np.float32(init_bound(num_rows))
    parts = []
    for block in range(start // BLOCK_ROWS, (stop - 1) // BLOCK_ROWS + 1):
        first = block * BLOCK_ROWS
        rows = min(BLOCK_ROWS, num_rows - first)
        u = np.random.default_rng([seed, key, block]).random((rows, dim), dtype=np.float32)
        parts.append(u[max(start - first, 0): min(stop - first, rows)])
    values = np.concatenate(parts)
    return torch.from_numpy((values * np.float32(2.0) - np.float32(1.0)) * bound)


def fill_shard(target: torch.Tensor, rows_of: Callable[[int, int], torch.Tensor], row_offset: int, col_offset: int) -> None:
    """Copy the initial values of a shard (rows row_offset.., columns col_offset..) into `target`."""
    rows, cols = target.shape
    with torch.no_grad():
        for start in range(0, rows, FILL_ROWS):
            stop = min(rows, start + FILL_ROWS)
            target[start:stop].copy_(rows_of(row_offset + start, row_offset + stop)[:, col_offset:col_offset + cols])


def initialise_embeddings(model: torch.nn.Module, tables: dict[str, tuple[int, int]], seed: int, tiered=None) -> None:
    """Set every embedding shard on this rank (fused kernels, data-parallel replicas and the
    stores of cached shards, a dlrm_scale.tiering.TieredEmbeddings) to its initial weights.
    `tables`: name -> (rows, dim) of the whole table."""
    def rows_of(name: str) -> Callable[[int, int], torch.Tensor]:
        num_rows, dim = tables[name]
        return lambda start, stop: initial_rows(seed, name, num_rows, dim, start, stop)

    cached = set(tiered.shards) if tiered is not None else set()
    for kernel in embedding_kernels(model):
        weights = kernel.emb_module.split_embedding_weights()
        for j, t in enumerate(kernel.config.embedding_tables):
            offsets = t.local_metadata.shard_offsets if t.local_metadata is not None else (0, 0)
            if (t.name, offsets[1]) not in cached:
                fill_shard(weights[j], rows_of(t.name), offsets[0], offsets[1])
    for (name, col), shard in (tiered.shards.items() if tiered is not None else []):
        shard.initialise(lambda start, stop, name=name, col=col, cols=shard.weights.shape[1]:
                         rows_of(name)(start, stop)[:, col:col + cols])

"""Shard geometry of each sharding scheme: which rows and columns every shard holds.

Row splits follow TorchRec's rule (blocks of ceil(rows / n), trailing shards may be empty)
so that a plan converts to TorchRec's `ShardingPlan` and back unchanged.
"""

from __future__ import annotations

from planner.specs import ClusterSpec, TableSpec
from planner.types import ShardGeometry, ShardingType

# FBGEMM's table-batched kernels need every shard's width to be a multiple of this.
COLUMN_ALIGNMENT = 4


def row_blocks(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """(offset, rows) of `num_shards` row blocks of ceil(num_rows / num_shards) rows each."""
    block = -(-num_rows // num_shards)
    blocks = []
    for i in range(num_shards):
        start = min(i * block, num_rows)
        blocks.append((start, min(block, num_rows - start)))
    return blocks


def column_split_counts(embedding_dim: int, max_shards: int) -> list[int]:
    """Numbers k >= 2 of equal column shards a table of this width can be cut into."""
    return [
        k
        for k in range(2, min(max_shards, embedding_dim // COLUMN_ALIGNMENT) + 1)
        if embedding_dim % k == 0 and (embedding_dim // k) % COLUMN_ALIGNMENT == 0
    ]


def shard_geometry(table: TableSpec, sharding_type: ShardingType, num_shards: int) -> list[ShardGeometry]:
    """The shards of `table` under `sharding_type`; `num_shards` is the replica count for DP."""
    rows, cols = table.num_embeddings, table.embedding_dim
    if sharding_type in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL):
        return [ShardGeometry(0, 0, rows, cols)] * (1 if sharding_type is ShardingType.TABLE_WISE else num_shards)
    if sharding_type in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
        if cols % num_shards or (cols // num_shards) % COLUMN_ALIGNMENT:
            raise ValueError(f"table '{table.name}': {cols} columns do not split into {num_shards} aligned shards")
        width = cols // num_shards
        return [ShardGeometry(0, i * width, rows, width) for i in range(num_shards)]
    if sharding_type in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        return [ShardGeometry(off, 0, n, cols) for off, n in row_blocks(rows, num_shards)]
    raise ValueError(f"unknown sharding type {sharding_type!r}")


def shard_counts(
    table: TableSpec, sharding_type: ShardingType, cluster: ClusterSpec, int8_comms: bool = False
) -> list[int]:
    """The shard counts worth considering for this table and scheme on this cluster.

    With int8 comms the row-wise schemes are left out: FBGEMM 1.8's int8 codec fails inside
    TorchRec's reduce-scatter, so such a plan could not train.
    """
    world, local = cluster.world_size, cluster.ranks_per_node
    if int8_comms and sharding_type in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        return []
    if sharding_type is ShardingType.TABLE_WISE:
        return [1]
    if sharding_type in (ShardingType.DATA_PARALLEL, ShardingType.ROW_WISE):
        return [world] if world > 1 else []
    if sharding_type is ShardingType.COLUMN_WISE:
        return column_split_counts(table.embedding_dim, world)
    # The hierarchical schemes only differ from their flat twins on more than one node.
    if cluster.num_nodes == 1 or local == 1:
        return []
    if sharding_type is ShardingType.TABLE_ROW_WISE:
        return [local]
    if sharding_type is ShardingType.TABLE_COLUMN_WISE:
        return column_split_counts(table.embedding_dim, local)
    raise ValueError(f"unknown sharding type {sharding_type!r}")

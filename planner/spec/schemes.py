"""The rules of the sharding schemes, each written once: which rows and columns every shard
holds, which kernel runs it, which shards may be cached, and which comm precisions, devices
and optimizers each combination can train with.

Row splits follow TorchRec's rule (blocks of ceil(rows / n), trailing shards may be empty)
so that a plan converts to TorchRec's `ShardingPlan` and back unchanged.
"""

from __future__ import annotations

import math
from functools import partial
from itertools import repeat

from planner.spec.errors import ConfigError
from planner.spec.specs import ClusterSpec, TableSpec
from planner.spec.types import ShardGeometry, ShardingType

# FBGEMM's table-batched kernels need every shard's width to be a multiple of this.
COLUMN_ALIGNMENT = 4

# Row blocks over one node's ranks, their partial sums reduce-scattered there, then an all-to-all
# across nodes: table_row_wise cuts the whole table so; grid_shard cuts it into column blocks
# first, each on a node of its own (EMBark's 3D sharding, TorchRec's GRID_SHARD).
NODE_ROW_SCHEMES = (ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)
ROW_SCHEMES = (ShardingType.ROW_WISE, *NODE_ROW_SCHEMES)
COLUMN_SCHEMES = (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE, ShardingType.GRID_SHARD)
# The schemes whose shards send their pooled sums, and take their ids, by all-to-all: row blocks
# reduce-scatter partial sums instead, and replicas all-reduce (every rank pays those alike).
ALL_TO_ALL_SCHEMES = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)

# TorchRec's compute kernel names. Replicas train with the dense kernel, shards with fused
# TBE; a cached shard keeps its rows in host DDR behind a device cache (fused_uvm_caching)
# or in a key-value store on SSD (key_value).
KERNELS = ("dense", "fused", "fused_uvm_caching", "key_value")
CACHED_KERNELS = ("fused_uvm_caching", "key_value")

# Schemes whose shards may be cached. On CUDA, FBGEMM caches any TBE shard. On CPU our tiered
# store remaps ids after TorchRec's input distribution, which bucketizes row-wise tables by
# the rows it holds, so those stay uncached; replicas (data_parallel) are never cached.
CACHEABLE = {
    "cuda": (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE,
             *ROW_SCHEMES),
    "cpu": (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE),
}

# Embedding optimizers the trainer runs (FBGEMM's fused ones); the planner also prices others
# (specs.OPTIMIZER_STATE), for what-ifs.
TRAINABLE_EMBEDDING_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")

# FBGEMM's fp8 codec fails on gloo and CPU tensors with a shape error (seen with fbgemm 1.8);
# its CUDA codec is the one FBGEMM ships for NCCL.
DEVICE_UNSUPPORTED_PRECISIONS = {
    "cpu": {"fp8": "FBGEMM's fp8 comm codec fails on CPU with a shape error in 1.8; use fp16, bf16 or int8"},
}


def compute_kernel_for(sharding_type: ShardingType) -> str:
    """The kernel of a shard whose rows all live in the device tier."""
    return "dense" if sharding_type is ShardingType.DATA_PARALLEL else "fused"


def cached_kernel_for(tier: str) -> str:
    """The kernel of a shard whose rows live in `tier` (ddr or ssd) behind a device cache."""
    return "fused_uvm_caching" if tier == "ddr" else "key_value"


def cache_rows(rows: int, cache_fraction: float) -> int:
    """Rows of a shard's cache: the fraction rounded up, at least one, at most the shard."""
    return min(rows, max(1, math.ceil(rows * cache_fraction))) if rows else 0


def int8_allows(sharding_type: ShardingType | str) -> bool:
    """FBGEMM 1.8's int8 codec needs a quantization context that TorchRec's reduce-scatter
    (used by the row-wise schemes) does not pass: it fails there with 'Unexpected None'."""
    return ShardingType(sharding_type) not in ROW_SCHEMES


def check_precisions_trainable(plan_schemes: dict[str, str], fwd: str, bwd: str, device: str) -> None:
    """Refuse, in one line, comm precisions that cannot train on `device` or with a table's
    scheme (`plan_schemes`: table name -> sharding type)."""
    for p in (fwd, bwd):
        why = DEVICE_UNSUPPORTED_PRECISIONS.get(device, {}).get(p)
        if why:
            raise ConfigError(f"--comm-precision: {p} is refused on {device.upper()}: {why}")
    if "int8" in (fwd, bwd):
        rw = [n for n, st in plan_schemes.items() if not int8_allows(st)]
        if rw:
            raise ConfigError(
                f"int8 comms cannot run with row-wise table '{rw[0]}' (FBGEMM's int8 codec fails in TorchRec's "
                f"reduce-scatter); use --comm-precision fwd=fp16,bwd=bf16, or a plan without row-wise tables"
            )


def row_group(sharding_type: ShardingType, world_size: int, ranks_per_node: int) -> int:
    """The ranks whose row blocks share each id of a table (hashed evenly over them): every rank
    under row_wise, a node's under the node-row schemes, one otherwise."""
    if sharding_type is ShardingType.ROW_WISE:
        return world_size
    return ranks_per_node if sharding_type in NODE_ROW_SCHEMES else 1


def row_blocks(num_rows: int, num_shards: int) -> list[tuple[int, int]]:
    """(offset, rows) of `num_shards` row blocks of ceil(num_rows / num_shards) rows each: the
    full blocks, what is left (maybe nothing), then empty blocks. Without a Python loop over
    the blocks: a row-wise option on 1,024 ranks has 1,024 of them."""
    block = -(-num_rows // num_shards)
    full = min(num_shards, num_rows // block) if block else 0
    blocks = list(zip(range(0, full * block, block or 1), repeat(block, full)))
    if full < num_shards:
        blocks.append((full * block, num_rows - full * block))
        blocks.extend(repeat((num_rows, 0), num_shards - full - 1))
    return blocks


# ShardGeometry(*fields) without the named tuple's Python-level __new__ per shard
_GEOMETRY = partial(tuple.__new__, ShardGeometry)


def _row_block_geometries(num_rows: int, num_shards: int, col_offset: int, cols: int) -> list[ShardGeometry]:
    offsets, rows = zip(*row_blocks(num_rows, num_shards))
    return list(map(_GEOMETRY, zip(offsets, repeat(col_offset), rows, repeat(cols))))


def column_split_counts(embedding_dim: int, max_shards: int) -> list[int]:
    """Numbers k >= 2 of equal column shards a table of this width can be cut into."""
    return [
        k
        for k in range(2, min(max_shards, embedding_dim // COLUMN_ALIGNMENT) + 1)
        if embedding_dim % k == 0 and (embedding_dim // k) % COLUMN_ALIGNMENT == 0
    ]


def column_blocks(table: TableSpec, num_blocks: int) -> list[tuple[int, int]]:
    """(offset, width) of `num_blocks` equal column blocks, each a multiple of COLUMN_ALIGNMENT wide."""
    cols = table.embedding_dim
    if cols % num_blocks or (cols // num_blocks) % COLUMN_ALIGNMENT:
        raise ValueError(f"table '{table.name}': {cols} columns do not split into {num_blocks} aligned shards")
    width = cols // num_blocks
    return [(i * width, width) for i in range(num_blocks)]


def shard_geometry(table: TableSpec, sharding_type: ShardingType, num_shards: int, ranks_per_node: int = 0) -> list[ShardGeometry]:
    """The shards of `table` under `sharding_type`; `num_shards` is the replica count for DP.
    A grid's shards are its column blocks' row blocks, block by block, `ranks_per_node` a block."""
    rows, cols = table.num_embeddings, table.embedding_dim
    if sharding_type in (ShardingType.TABLE_WISE, ShardingType.DATA_PARALLEL):
        return [ShardGeometry(0, 0, rows, cols)] * (1 if sharding_type is ShardingType.TABLE_WISE else num_shards)
    if sharding_type is ShardingType.GRID_SHARD:
        if ranks_per_node < 1 or num_shards % ranks_per_node:
            raise ValueError(f"table '{table.name}': a grid of {num_shards} shards is not whole column blocks of "
                             f"{ranks_per_node} row blocks (one a rank of a node)")
        return [g for c0, width in column_blocks(table, num_shards // ranks_per_node)
                for g in _row_block_geometries(rows, ranks_per_node, c0, width)]
    if sharding_type in COLUMN_SCHEMES:
        return [ShardGeometry(0, c0, rows, width) for c0, width in column_blocks(table, num_shards)]
    if sharding_type in ROW_SCHEMES:
        return _row_block_geometries(rows, num_shards, 0, cols)
    raise ValueError(f"unknown sharding type {sharding_type!r}")


# What TorchRec's EmbeddingCollectionSharder shards an unpooled table with.
UNPOOLED_SCHEMES = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)


def shard_counts(
    table: TableSpec, sharding_type: ShardingType, cluster: ClusterSpec, int8_comms: bool = False
) -> list[int]:
    """The shard counts worth considering for this table and scheme on this cluster.

    With int8 comms the schemes int8 cannot train with are left out (`int8_allows`).
    """
    world, local = cluster.world_size, cluster.ranks_per_node
    if int8_comms and not int8_allows(sharding_type):
        return []
    if not table.pooled and sharding_type not in UNPOOLED_SCHEMES:
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
    if sharding_type is ShardingType.GRID_SHARD:  # a column block a node
        return [k * local for k in column_split_counts(table.embedding_dim, cluster.num_nodes)]
    raise ValueError(f"unknown sharding type {sharding_type!r}")

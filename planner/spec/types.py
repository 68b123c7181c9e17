"""Value objects of the planner: costs and storage that add up, shards and options.

Modelled on TorchRec's planner types (`Perf`, `Storage`, `Shard`, `ShardingOption`), but
free of torch so that the planner runs anywhere numpy and OR-Tools do.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from typing import NamedTuple, Sequence

import numpy as np


class ShardingType(str, Enum):
    """Sharding schemes, spelt as TorchRec spells them so a plan can run unchanged."""

    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"


class Placement(str, Enum):
    """How the shards of an option may be put on ranks."""

    ANY_RANK = "any_rank"  # each shard independently on any rank (TW, CW)
    ONE_NODE = "one_node"  # each shard on any rank of one chosen node (TWCW)
    EVERY_RANK = "every_rank"  # shard i on rank i (RW, DP)
    NODE_RANKS = "node_ranks"  # column block c's row block i on local rank i of the c-th of distinct chosen nodes (TWRW: one block, grid)


PLACEMENT_OF = {
    ShardingType.TABLE_WISE: Placement.ANY_RANK,
    ShardingType.COLUMN_WISE: Placement.ANY_RANK,
    ShardingType.TABLE_COLUMN_WISE: Placement.ONE_NODE,
    ShardingType.ROW_WISE: Placement.EVERY_RANK,
    ShardingType.DATA_PARALLEL: Placement.EVERY_RANK,
    ShardingType.TABLE_ROW_WISE: Placement.NODE_RANKS,
    ShardingType.GRID_SHARD: Placement.NODE_RANKS,
}


@dataclass(frozen=True)
class Perf:
    """Per-step time of one shard, or of a rank (the sum of its shards), in milliseconds."""

    fwd_compute_ms: float = 0.0
    fwd_comms_ms: float = 0.0  # the pooled embeddings' collective
    bwd_compute_ms: float = 0.0
    bwd_comms_ms: float = 0.0  # their gradients' collective (a replica's: its gradient all-reduce)
    input_dist_ms: float = 0.0  # routing the ids to the shard

    @property
    def compute_ms(self) -> float:
        return self.fwd_compute_ms + self.bwd_compute_ms

    @property
    def comms_ms(self) -> float:
        return self.input_dist_ms + self.fwd_comms_ms + self.bwd_comms_ms

    @property
    def total_ms(self) -> float:
        return self.compute_ms + self.comms_ms

    def __add__(self, other: Perf) -> Perf:
        return Perf(
            self.fwd_compute_ms + other.fwd_compute_ms,
            self.fwd_comms_ms + other.fwd_comms_ms,
            self.bwd_compute_ms + other.bwd_compute_ms,
            self.bwd_comms_ms + other.bwd_comms_ms,
            self.input_dist_ms + other.input_dist_ms,
        )

    def comms_scaled(self, factor: float) -> Perf:
        """Only the collectives' parts, times `factor`."""
        return Perf(0.0, self.fwd_comms_ms * factor, 0.0, self.bwd_comms_ms * factor, self.input_dist_ms * factor)


TIERS = ("hbm", "ddr", "ssd")


@dataclass(frozen=True)
class Storage:
    """Bytes held in each memory tier by a shard, or by a rank."""

    hbm_bytes: int = 0
    ddr_bytes: int = 0
    ssd_bytes: int = 0

    def __add__(self, other: Storage) -> Storage:
        return Storage(
            self.hbm_bytes + other.hbm_bytes,
            self.ddr_bytes + other.ddr_bytes,
            self.ssd_bytes + other.ssd_bytes,
        )

    def of_tier(self, tier: str) -> int:
        return getattr(self, f"{tier}_bytes")

    def as_dict(self) -> dict[str, int]:
        return {tier: self.of_tier(tier) for tier in TIERS}


class ShardGeometry(NamedTuple):
    """The block of a table a shard holds: rows [row_offset, row_offset+rows) and likewise cols.

    A named tuple, not a dataclass: a row-wise option on 1,024 ranks has 1,024 of them.
    """

    row_offset: int
    col_offset: int
    rows: int
    cols: int


@dataclass(frozen=True)
class ShardCost:
    """A shard's estimated step time and storage; shards of equal shape share one."""

    perf: Perf
    storage: Storage


@dataclass(frozen=True)
class ShardingOption:
    """One way to shard one table: its scheme, kernel, tier and the costed shards."""

    table: str
    sharding_type: ShardingType
    compute_kernel: str
    tier: str
    geometries: tuple[ShardGeometry, ...]
    shards: tuple[ShardCost, ...]  # the cost of each shard, in the order of `geometries`
    cache_fraction: float = 1.0  # < 1: rows live in `tier`, this fraction cached in the device tier
    # What the option costs every one of `ranks_sharing` ranks wherever its shards are: on a host,
    # the other ranks' part of its shards' collectives (cost_model.exchange_shares); none by default.
    every_rank: Perf = Perf()
    ranks_sharing: int = 0
    placement: Placement = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "placement", PLACEMENT_OF[self.sharding_type])
        if len(self.geometries) != len(self.shards):
            raise ValueError(f"option for '{self.table}': {len(self.geometries)} shards but {len(self.shards)} costs")

    @cached_property
    def _distinct_shards(self) -> tuple[list[ShardCost], np.ndarray]:
        """The distinct shard costs (usually one or two) and each shard's index among them: a
        row-wise option on 1,024 ranks has 1,024 shards, so the loops over them stay in C."""
        ids = list(map(id, self.shards))
        distinct = dict(zip(ids, self.shards))
        index = dict(zip(distinct, range(len(distinct))))
        return list(distinct.values()), np.fromiter(map(index.__getitem__, ids), dtype=np.intp, count=len(ids))

    def _per_shard(self, value, dtype) -> np.ndarray:
        """`value` of each shard, computed once per distinct cost."""
        distinct, index = self._distinct_shards
        return np.array(list(map(value, distinct)), dtype=dtype)[index]

    @cached_property
    def shard_ms(self) -> np.ndarray:
        """Step time of each shard, as an array for fast load arithmetic."""
        return self._per_shard(lambda s: s.perf.total_ms, np.float64)

    @cached_property
    def shard_bytes(self) -> np.ndarray:
        """Bytes of each shard per tier (rows: shards, columns: TIERS)."""
        return self._per_shard(lambda s: [s.storage.of_tier(t) for t in TIERS], np.int64)

    @cached_property
    def shard_ms_list(self) -> list[float]:
        """`shard_ms` as Python floats, for loops that take one shard at a time."""
        return self.shard_ms.tolist()

    @cached_property
    def shard_bytes_list(self) -> list[list[int]]:
        """`shard_bytes` as Python ints, for loops that take one shard at a time."""
        return self.shard_bytes.tolist()

    @cached_property
    def every_rank_ms(self) -> float:
        """Time the option adds to every rank, beside its shards' own (`every_rank`)."""
        return self.every_rank.total_ms

    @cached_property
    def total_ms(self) -> float:
        """Summed time over all shards and the ranks sharing their cost: the work this option adds to the cluster."""
        return float(self.shard_ms.sum()) + self.ranks_sharing * self.every_rank_ms

    @cached_property
    def max_shard_ms(self) -> float:
        """Time of the costliest shard with what every rank carries: no rank holding it can finish sooner."""
        return float(self.shard_ms.max()) + self.every_rank_ms

    @cached_property
    def nodes_taken(self) -> int:
        """The nodes a node-ranks option takes: one per column block (table-row-wise one, grid
        its column shards), whose row blocks are alike on each."""
        return len({g.col_offset for g in self.geometries})

    def ranks_on_nodes(self, nodes: Sequence[int], ranks_per_node: int) -> list[int]:
        """A node-ranks option's shard ranks with column block c on `nodes[c]`: its row block i
        on that node's local rank i."""
        per_node = len(self.shards) // self.nodes_taken
        return [n * ranks_per_node + i for n in nodes for i in range(per_node)]

    @property
    def label(self) -> str:
        n = len(self.shards)
        label = self.sharding_type.value if n == 1 else f"{self.sharding_type.value}x{n}"
        return label if self.cache_fraction >= 1.0 else f"{label}@{self.tier}+cache{self.cache_fraction:g}"

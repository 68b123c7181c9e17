"""A solution in progress: the option chosen for each table and the rank of each shard."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.specs import ClusterSpec
from planner.types import TIERS, ShardingOption


@dataclass
class Assignment:
    choice: dict[str, ShardingOption] = field(default_factory=dict)
    shard_ranks: dict[str, list[int]] = field(default_factory=dict)

    def copy(self) -> Assignment:
        return Assignment(dict(self.choice), {t: list(r) for t, r in self.shard_ranks.items()})


@dataclass
class RankLoads:
    """Per-rank step time (ms) and bytes per tier (rows: ranks, columns: TIERS)."""

    ms: np.ndarray
    bytes: np.ndarray

    @classmethod
    def empty(cls, world_size: int) -> RankLoads:
        return cls(np.zeros(world_size), np.zeros((world_size, len(TIERS)), dtype=np.int64))

    def add(self, option: ShardingOption, ranks: list[int], sign: int = 1) -> None:
        np.add.at(self.ms, ranks, sign * option.shard_ms)
        np.add.at(self.bytes, ranks, sign * option.shard_bytes)

    @classmethod
    def of(cls, assignment: Assignment, world_size: int) -> RankLoads:
        loads = cls.empty(world_size)
        for table, option in assignment.choice.items():
            loads.add(option, assignment.shard_ranks[table])
        return loads


def rank_capacities(cluster: ClusterSpec) -> np.ndarray:
    return np.array([cluster.capacity_bytes_per_rank(t) for t in TIERS], dtype=np.int64)

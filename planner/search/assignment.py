"""A solution in progress: the option chosen for each table and the rank of each shard."""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import chain

import numpy as np

from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS, ShardingOption


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
        if option.every_rank_ms:
            self.ms += sign * option.every_rank_ms
        if len(set(ranks)) == len(ranks):  # the common case, and np.add.at costs microseconds a call
            self.ms[ranks] += sign * option.shard_ms
            self.bytes[ranks] += sign * option.shard_bytes
        else:  # shards sharing a rank
            np.add.at(self.ms, ranks, sign * option.shard_ms)
            np.add.at(self.bytes, ranks, sign * option.shard_bytes)

    @classmethod
    def of(cls, assignment: Assignment, world_size: int) -> RankLoads:
        """Every table's shards added at once (in table order, so the sums are those of adding
        the tables one by one)."""
        loads = cls.empty(world_size)
        if assignment.choice:
            count = sum(len(o.shards) for o in assignment.choice.values())
            ranks = np.fromiter(chain.from_iterable(assignment.shard_ranks[t] for t in assignment.choice), dtype=np.int64, count=count)
            loads.ms = np.bincount(ranks, weights=np.concatenate([o.shard_ms for o in assignment.choice.values()]), minlength=world_size)
            shard_bytes = np.concatenate([o.shard_bytes for o in assignment.choice.values()])
            for tier in range(shard_bytes.shape[1]):  # sums of integers under 2**53: exact in float64, and far faster than np.add.at
                loads.bytes[:, tier] = np.bincount(ranks, weights=shard_bytes[:, tier], minlength=world_size)
            loads.ms += sum(o.every_rank_ms for o in assignment.choice.values())
        return loads


def rank_capacities(cluster: ClusterSpec) -> np.ndarray:
    return np.array([cluster.capacity_bytes_per_rank(t) for t in TIERS], dtype=np.int64)

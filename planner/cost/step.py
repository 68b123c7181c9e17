"""The step as the collectives make it, from what each rank carries: each phase waits for its
busiest rank. Priced here once, for the search, the plan's summary and its views."""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from planner.spec.types import Perf, ShardingOption, Storage

# The phases a step waits in, as the trainer times them: ids routed, lookups (forward and
# backward), pooled embeddings out, their gradients back. A replica's gradient all-reduce is a
# phase of its own on the machine, but the same on every rank, so adding it to the gradients'
# phase changes no phase's busiest rank.
PHASES = ("input_dist", "compute", "fwd_comms", "bwd_comms")


def perf_phase_ms(perf: Perf) -> list[float]:
    """A shard's or a rank's time in each of PHASES; they sum to its time."""
    return [perf.input_dist_ms, perf.compute_ms, perf.fwd_comms_ms, perf.bwd_comms_ms]


def shard_phase_ms(option: ShardingOption) -> np.ndarray:
    """Each shard's time in each of PHASES (rows: shards)."""
    return np.array([perf_phase_ms(s.perf) for s in option.shards])


def step_ms(loads: np.ndarray) -> float:
    """The embeddings' part of a step from each rank's time per phase (rows: ranks, columns:
    PHASES): each phase's busiest rank, summed."""
    return float(loads.max(axis=0).sum())


def rank_step_ms(rank_perfs: Sequence[Perf]) -> float:
    """step_ms from each rank's time."""
    return step_ms(np.array([perf_phase_ms(p) for p in rank_perfs]))


def rank_perf_storage(placed: Iterable[tuple[ShardingOption, Sequence[int]]], world_size: int) -> tuple[list[Perf], list[Storage]]:
    """Each rank's time by phase and bytes by tier: the sums of the shards on it, and of what
    every chosen option costs every rank (ShardingOption.every_rank)."""
    perf = [Perf() for _ in range(world_size)]
    storage = [Storage() for _ in range(world_size)]
    for option, ranks in placed:
        if option.every_rank_ms:
            perf = [p + option.every_rank for p in perf]
        for shard, rank in zip(option.shards, ranks):
            perf[rank] = perf[rank] + shard.perf
            storage[rank] = storage[rank] + shard.storage
    return perf, storage

"""Lower bounds on the busiest rank's step time, valid for any plan over the same options."""

from __future__ import annotations

from typing import Mapping, Sequence

from planner.types import ShardingOption


def lower_bound_ms(options_by_table: Mapping[str, Sequence[ShardingOption]], world_size: int) -> float:
    """The larger of two bounds no placement can beat:

    - work: every table adds at least its cheapest option's summed shard time, and the
      busiest rank carries at least the mean, so sum(min total) / W;
    - granularity: some rank holds each table's largest shard, so max over tables of the
      smallest largest-shard among its options.
    Memory capacities are ignored, which keeps the bound valid (only weaker).
    """
    work = sum(min(o.total_ms for o in opts) for opts in options_by_table.values()) / world_size
    granularity = max(min(o.max_shard_ms for o in opts) for opts in options_by_table.values())
    return max(work, granularity)

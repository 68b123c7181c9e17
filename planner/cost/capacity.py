"""The last line of defence: every rank's bytes in every tier against its capacity.

Every search path already constrains memory; this check runs on the plan itself, after the
search and before anyone writes it, so a bug in one path can never become a plan that promises
to fit and does not (on a GPU: an out-of-memory crash an hour into a job).
"""

from __future__ import annotations

from typing import Sequence

from planner.spec.errors import PlannerBugError
from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS, Storage


def capacity_violation(memory_per_rank: Sequence[Storage], cluster: ClusterSpec) -> str | None:
    """The first rank and tier whose bytes exceed its capacity, in words; None if all fit.

    Host tiers (DDR, SSD) are a node's, split evenly between its ranks (as the trainer's
    processes share them), so the per-rank limit also bounds every node's total.
    """
    for rank, memory in enumerate(memory_per_rank):
        for tier in TIERS:
            need, have = memory.of_tier(tier), cluster.capacity_bytes_per_rank(tier)
            if need > have:
                return f"rank {rank} holds {need:,} bytes of {tier} but has {have:,}"
    return None


def check_capacity(memory_per_rank: Sequence[Storage], cluster: ClusterSpec) -> None:
    """Raise PlannerBugError, one line, when a plan overfills any tier of any rank."""
    violation = capacity_violation(memory_per_rank, cluster)
    if violation is not None:
        raise PlannerBugError(f"planner bug: the plan overfills memory ({violation}); no plan written, please report it with the config")

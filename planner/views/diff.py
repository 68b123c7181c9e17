"""What changes from one plan to another (`dlrm-scale diff`): per table its layout before and
after, and the bytes of weights and optimizer state that would move to make the change, from a
rank on the same node or from another node.

A rank needs the part of each new shard it does not already hold; in the old plan that part
lies on other ranks (a data-parallel table lies on every rank of the old plan, so only a rank
the old plan did not have needs it, from the same node when one there holds it).
Bytes are counted where they arrive, rows x columns of fp32 weights plus the optimizer's state
for those rows (planner.cost.cost_model.rows_bytes).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.cost_model import rows_bytes
from planner.plan.document import Plan, PlannedShard, TablePlan
from planner.views.report import rank_list


@dataclass(frozen=True)
class TableChange:
    name: str
    before: str  # "" when the table is new
    after: str  # "" when the table is gone
    intra_node_bytes: int
    inter_node_bytes: int


@dataclass(frozen=True)
class PlanDiff:
    changes: list[TableChange]  # changed tables only
    unchanged: int
    before_ms: float
    after_ms: float

    @property
    def intra_node_bytes(self) -> int:
        return sum(c.intra_node_bytes for c in self.changes)

    @property
    def inter_node_bytes(self) -> int:
        return sum(c.inter_node_bytes for c in self.changes)

    def format(self) -> str:
        lines = [f"{len(self.changes)} tables change, {self.unchanged} stay; busiest rank {self.before_ms:.4f} -> "
                 f"{self.after_ms:.4f} ms/step; {self.intra_node_bytes / 2**30:.3f} GiB move within nodes, "
                 f"{self.inter_node_bytes / 2**30:.3f} GiB across nodes"]
        for c in self.changes:
            lines.append(f"{c.name:<24} {c.before or '(new)':<40} -> {c.after or '(gone)':<40} "
                         f"{c.intra_node_bytes / 2**20:>10.1f} MiB in node {c.inter_node_bytes / 2**20:>10.1f} MiB across")
        return "\n".join(lines)


def layout(t: TablePlan) -> str:
    return f"{t.sharding_type} {t.compute_kernel} on {rank_list(t.ranks)}"


def shared_block(a: PlannedShard, b: PlannedShard) -> tuple[int, int]:
    """Rows and columns of the block two shards share."""
    rows = min(a.row_offset + a.rows, b.row_offset + b.rows) - max(a.row_offset, b.row_offset)
    cols = min(a.col_offset + a.cols, b.col_offset + b.cols) - max(a.col_offset, b.col_offset)
    return max(rows, 0), max(cols, 0)


def arrivals(shard: PlannedShard, old: TablePlan, old_ranks_per_node: int, new_ranks_per_node: int,
             optimizer: str) -> tuple[int, int]:
    """(within-node, across-node) bytes that arrive at `shard.rank` for it to hold `shard`,
    given the table's `old` layout."""
    intra = inter = 0
    if old.sharding_type == "data_parallel":  # every old rank holds the whole table
        if shard.rank in old.ranks:
            return 0, 0
        size = rows_bytes(shard.rows, shard.cols, optimizer)
        same_node = shard.rank // new_ranks_per_node in {s.rank // old_ranks_per_node for s in old.shards}
        return (size, 0) if same_node else (0, size)
    for source in old.shards:
        if source.rank == shard.rank:
            continue
        rows, cols = shared_block(shard, source)
        if rows and cols:
            size = rows_bytes(rows, cols, optimizer)
            if source.rank // old_ranks_per_node == shard.rank // new_ranks_per_node:
                intra += size
            else:
                inter += size
    return intra, inter


def moved_bytes(old: TablePlan, new: TablePlan, old_ranks_per_node: int, new_ranks_per_node: int,
                optimizer: str) -> tuple[int, int]:
    """(within-node, across-node) bytes that arrive at ranks to turn `old` into `new`."""
    moved = [arrivals(shard, old, old_ranks_per_node, new_ranks_per_node, optimizer) for shard in new.shards]
    return sum(m[0] for m in moved), sum(m[1] for m in moved)


def diff_plans(before: Plan, after: Plan, optimizer: str, before_ms: float | None = None, after_ms: float | None = None) -> PlanDiff:
    """`before_ms`/`after_ms`: the busiest rank re-costed under one model (default: each plan's own)."""
    changes, unchanged = [], 0
    for name in list(before.tables) + [n for n in after.tables if n not in before.tables]:
        old, new = before.tables.get(name), after.tables.get(name)
        if old is not None and new is not None and old == new:
            unchanged += 1
            continue
        if old is None or new is None:  # a new table starts from its initial weights: nothing moves
            changes.append(TableChange(name, "" if old is None else layout(old), "" if new is None else layout(new), 0, 0))
            continue
        intra, inter = moved_bytes(old, new, before.ranks_per_node, after.ranks_per_node, optimizer)
        changes.append(TableChange(name, layout(old), layout(new), intra, inter))
    return PlanDiff(changes, unchanged, before.max_rank_ms if before_ms is None else before_ms,
                    after.max_rank_ms if after_ms is None else after_ms)

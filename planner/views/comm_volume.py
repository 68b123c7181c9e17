"""Bytes each rank sends per step in the embedding collectives of a plan.

What the trainer reports next to its fp32 equivalent. It counts the same collectives the
cost model charges (cost_model.py): pooled outputs forward, their gradients backward, at the
chosen precisions. Data-parallel tables are left out: their gradients go through the dense
all-reduce, which the embedding codecs do not touch. Input ids (int64) are not counted.
"""

from __future__ import annotations

import numpy as np

from planner.cost.cost_model import row_comm_bytes
from planner.plan.document import Plan


def embedding_comm_bytes(plan: Plan, batch_size_per_rank: int, fwd_precision: str, bwd_precision: str) -> np.ndarray:
    """Per-rank bytes sent per step (forward plus backward).

    Table- and column-wise shards: the owner sends every other rank its samples' pooled rows
    ((W-1)/W of B rows forward); backward, each other rank sends the owner its b rows of
    gradient. Row-wise over a group of g ranks: a reduce-scatter forward and an all-gather
    backward, (g-1)/g of B rows each; table-row-wise then all-to-alls its 1/L share of B rows.
    """
    world, local = plan.world_size, plan.ranks_per_node
    b = batch_size_per_rank
    big_b = b * world
    sent = np.zeros(world)
    for table in plan.tables.values():
        st = table.sharding_type
        if st == "data_parallel":
            continue
        for s in table.shards:
            if st in ("row_wise", "table_row_wise"):
                g = world if st == "row_wise" else local
                rows = big_b * (g - 1) / g
                sent[s.rank] += row_comm_bytes(rows, s.cols, fwd_precision) + row_comm_bytes(rows, s.cols, bwd_precision)
                if st == "table_row_wise":
                    out = big_b / local * (world - 1) / world
                    sent[s.rank] += row_comm_bytes(out, s.cols, fwd_precision) + row_comm_bytes(out, s.cols, bwd_precision)
            else:
                sent[s.rank] += row_comm_bytes(big_b * (world - 1) / world, s.cols, fwd_precision)
                for r in range(world):
                    if r != s.rank:
                        sent[r] += row_comm_bytes(b, s.cols, bwd_precision)
    return sent

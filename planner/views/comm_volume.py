"""Bytes each rank sends per step in the embedding collectives of a plan, within its node and
to other nodes.

What the trainer reports next to what it measured (dlrm_scale/training/comm_meter.py). It
counts the collectives TorchRec runs for each scheme: pooled outputs forward, their gradients
backward, at the chosen precisions. Data-parallel tables are left out: their gradients go
through the dense all-reduce, which the embedding codecs do not touch. Input ids are not
counted. Ranks are numbered node by node (torchrun's order): rank r is on node r // L.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.cost.cost_model import row_comm_bytes
from planner.plan.document import Plan
from planner.spec.schemes import NODE_ROW_SCHEMES


@dataclass(frozen=True)
class CommBytes:
    """Per-rank bytes sent per step (forward plus backward), to ranks of the same node and to
    ranks of other nodes."""

    within_node: np.ndarray
    across_nodes: np.ndarray

    @property
    def total(self) -> np.ndarray:
        return self.within_node + self.across_nodes


def embedding_comm_bytes(plan: Plan, batch_size_per_rank: int, fwd_precision: str, bwd_precision: str) -> CommBytes:
    """Table- and column-wise shards (an all-to-all over every rank): the owner sends every other
    rank its b samples' pooled rows forward; backward, each other rank sends the owner its b rows
    of gradient. Row-wise over a group of ranks: the shard's partial sums for the whole batch are
    reduce-scattered forward, each member getting its slice, and the gradients all-gathered
    backward, as many bytes. Over every rank (row-wise) a slice is b samples. Over the node
    (table-row-wise, and each column block of a grid) it is the b samples of every node's rank
    of the member's local index, and an all-to-all among those ranks follows: forward the
    shard's rank sends each other node its b; backward, that node's rank sends it their b rows
    of gradient."""
    world, local = plan.world_size, plan.ranks_per_node
    b = batch_size_per_rank
    node = np.arange(world) // local
    within, across = np.zeros(world), np.zeros(world)

    def send(src: int, dst: int, rows: float, cols: int, precision: str) -> None:
        if src != dst:
            (within if node[src] == node[dst] else across)[src] += row_comm_bytes(rows, cols, precision)

    for table in plan.tables.values():
        st = table.sharding_type
        if st == "data_parallel":
            continue
        node_rows = st in NODE_ROW_SCHEMES
        for s in table.shards:
            if st == "row_wise" or node_rows:
                if st == "row_wise":
                    group, slice_rows = range(world), b
                else:  # the node's ranks; each gets its local index's samples of every node
                    group, slice_rows = range(node[s.rank] * local, (node[s.rank] + 1) * local), b * (world // local)
                for r in group:  # each member's slice of the partial sums out, of the gradients in
                    send(s.rank, r, slice_rows, s.cols, fwd_precision)
                    send(s.rank, r, slice_rows, s.cols, bwd_precision)
                if node_rows:
                    for r in range(s.rank % local, world, local):  # the same local index on the other nodes
                        send(s.rank, r, b, s.cols, fwd_precision)
                        send(r, s.rank, b, s.cols, bwd_precision)
            else:
                for r in range(world):
                    send(s.rank, r, b, s.cols, fwd_precision)
                    send(r, s.rank, b, s.cols, bwd_precision)
    return CommBytes(within, across)

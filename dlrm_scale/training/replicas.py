"""2D sparse parallelism on TorchRec (the plan: planner/plan/replication.py): R replicas of one
sharding group's plan, each sharded over G ranks, their tables kept 1D's by syncing rows.

Built from TorchRec's own 2D parts, as `DMPCollection` builds them: its device mesh of
("replicate", "shard") ranks, its `ShardingEnv2D` (which TorchRec's sharding code switches on)
and its rank layout (sharding group g: ranks g, g+R, g+2R, ...; a replica group: R consecutive
ranks). `DMPCollection` itself refuses every device but CUDA and MTIA, and its plan remapping
gives CPU shards a device index CPU tensors never carry, so the job makes the same model here on
every device: DistributedModelParallel over the `ShardingEnv2D`, the group's plan placed on the
job's ranks (bridge.sharding_plan). Dense layers and data-parallel tables stay data-parallel over
all W ranks (DDP on the global group, as in `DMPCollection`), so they never need a sync.

The sync is not `DMPCollection`'s average. Averaging replicas that each stepped on their own
half of the batch moves a row only one replica's samples touched half as far as 1D does, and
doubles its Adagrad state's growth. Here each replica's gradient of a sharded table is 1/R of
its own (`share_gradients`: the replicas' gradients add up to 1D's), so a row that one replica
alone looked up since they last agreed has that replica's update and state: 1D's. The replicas
part from 1D only where one reads a row another changed, or two change one row, so neither is
left for later. Before each lookup the replicas exchange the rows each is about to read (the ids
the kernel is given) and sync first every row one of them changed that another is about to read
(`_before_lookup`): every replica reads 1D's rows. After the step, the rows two of them looked up
in it are synced from their gradients, each recovered from its one update and the state after
it, 1D's update and state made from their sum (`after_step`). Every N steps, and before a
checkpoint or an evaluation, the rows one replica changed are synced too (`sync`). So 2D trains
the 1D model whatever N (to rounding); N only sets how long a row one replica changed waits
while no other reads it. Only rows looked up move: a sync passes over none of the others. Each
rank keeps the copy its replicas last agreed on, as large as its shards, and which replica
changed each row since (the planner prices both, and the rows each step exchanges).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.types import ShardingEnv2D

from dlrm_scale.bridge.resident import embedding_kernels
from dlrm_scale.training.table_optimizer import fused_update, gradient_of_update
from planner.plan.document import Plan
from planner.plan.replication import sharding_groups

# Rows and states below this are summed several to an all-reduce (one call each would cost
# its latency many times over); larger ones alone, in place, with no copy.
COALESCE_BYTES = 16 << 20
# A sync copies the rows it syncs out of the shards and their agreed copy, and back, this many
# bytes of weights at a time: all of a shard's rows changed since the last sync would be a third
# and fourth copy of it (the embedding-bound benchmark model: 1.6 GB a rank, on 2 ranks a node).
SYNC_BLOCK_BYTES = 64 << 20


class ReplicaGroups:
    """This rank's sharding group and replica group (created collectively: every rank builds one)."""

    def __init__(self, plan: Plan, device_type: str, optimizer: str) -> None:
        """`optimizer`: the embedding optimizer's name."""
        rep = plan.replication
        self.optimizer, self.device = optimizer, torch.device(device_type)
        self.replicas, self.sync_every_steps = rep.replicas, rep.sync_every_steps
        self.mesh = DeviceMesh(device_type, sharding_groups(rep), mesh_dim_names=("replicate", "shard"))
        self.sharding_pg, self.replica_pg = self.mesh.get_group("shard"), self.mesh.get_group("replicate")
        self.job_ranks = dist.get_process_group_ranks(self.sharding_pg)  # group rank k -> job rank
        # node-local sub-groups of a sharding group (table-row-wise, grid): its ranks on one node
        self.node_group_size = plan.ranks_per_node
        self.replicated_tables = {n for n, t in plan.tables.items() if t.sharding_type == "data_parallel"}

    def env(self) -> ShardingEnv2D:
        return ShardingEnv2D(sharding_pg=self.sharding_pg, replica_pg=self.replica_pg, global_pg=dist.group.WORLD,
                             device_mesh=self.mesh, node_group_size=self.node_group_size)

    def due(self, steps_done: int) -> bool:
        return steps_done % self.sync_every_steps == 0

    def share_gradients(self, model: torch.nn.Module, feature_tables: dict[str, str]) -> None:
        """Scale this replica's gradient of every sharded table by 1/R, so that the replicas'
        gradients add up to the gradient of the global batch's mean loss, as in 1D (data-parallel
        tables and dense layers are averaged over all W ranks already). `feature_tables`: each
        sparse feature's table."""
        sparse_arch = next(m for name, m in model.named_modules() if name.endswith("model.sparse_arch"))
        share = torch.tensor([1.0 if feature_tables[f] in self.replicated_tables else 1.0 / self.replicas
                              for f in sparse_arch._sparse_feature_names]).view(-1, 1)  # noqa: SLF001 - SparseArch's feature order

        def hook(_module, _inputs, output):
            nonlocal share
            if isinstance(output, torch.Tensor) and output.requires_grad:  # [batch, feature, dim]
                share = share.to(output.device)  # once: then a no-op, not a copy to the device every step
                output.register_hook(lambda grad: grad * share)

        sparse_arch.register_forward_hook(hook)

    def _sharded_kernels(self, model: torch.nn.Module) -> list:
        """The TBE kernels of this rank's shards of sharded tables, in an order every replica shares
        (data-parallel tables are all-reduced every step with the dense layers)."""
        return [k for k in embedding_kernels(model) if not {t.name for t in k.config.embedding_tables} <= self.replicated_tables]

    def _shards(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weights, optimizer state or None) of this rank's shard of every sharded table."""
        shards = []
        for kernel in self._sharded_kernels(model):
            weights = kernel.emb_module.split_embedding_weights()
            states = kernel.emb_module.split_optimizer_states() or [[]] * len(weights)  # SGD: none
            shards += [(w, state[0] if state else None) for w, state in zip(weights, states, strict=True)]
        return shards

    def watch_lookups(self, model: torch.nn.Module) -> None:
        """Before each training lookup of this rank's kernels, the replicas exchange the rows each
        is about to read and sync those another changed (`_before_lookup`). Evaluation (no
        gradient) reads rows after a sync and changes none: not watched."""
        self._sent = 0  # bytes exchanged since the last after_step
        first = 0
        for kernel in self._sharded_kernels(model):
            feature_tables = list(kernel.emb_module.feature_table_map)  # each feature's table (a shard of it here)

            def hook(_module, args, kwargs, first=first, feature_tables=feature_tables):
                if torch.is_grad_enabled():
                    self._before_lookup(first, feature_tables, kwargs["indices"] if "indices" in kwargs else args[0],
                                        kwargs["offsets"] if "offsets" in kwargs else args[1])

            kernel.emb_module.register_forward_pre_hook(hook, with_kwargs=True)
            first += max(feature_tables) + 1

    @torch.no_grad()
    def _before_lookup(self, first: int, feature_tables: list[int], indices: torch.Tensor, offsets: torch.Tensor) -> None:
        """A kernel (its shards `first`, `first + 1`, ...) is about to read `indices`: every replica's
        distinct rows of each shard gathered, and the rows one replica changed that another is about
        to read synced first, so that every replica reads 1D's rows."""
        per_feature = (offsets.numel() - 1) // len(feature_tables)  # the batch: one bag per sample and feature
        starts = offsets[::per_feature].tolist()
        per_table: list[list[torch.Tensor]] = [[] for _ in range(max(feature_tables) + 1)]
        for f, table in enumerate(feature_tables):
            per_table[table].append(indices[starts[f]:starts[f + 1]])
        everyone, sent = self._gather([torch.unique(torch.cat(ids)) for ids in per_table])
        chosen = {}
        for t in range(len(per_table)):
            looked_up = [ids[t] for ids in everyone]
            if first + t in self._step_rows:  # its rows' changes would span two lookups: neither synced as one step's
                raise RuntimeError("2D: a kernel looked up twice in one training step; the replicas' sync needs one lookup a step")
            self._step_rows[first + t] = looked_up
            chosen[first + t] = RowsToSync(self._none, read_after_another(self.changed_by[first + t], looked_up))
        self._sent += sent + self._sync_rows(chosen, lr=1.0)  # changes of one replica alone: no learning rate in them

    @torch.no_grad()
    def agree(self, model: torch.nn.Module) -> None:
        """The replicas hold the same tables (the start, a resume): their updates count from here."""
        self.held = self._shards(model)  # views of the kernels' weights and state, as every sync reads them
        self.agreed = [(w.clone(), None if s is None else s.clone()) for w, s in self.held]
        # which replica changed each row since they agreed: -1 none (a row two look up is synced at once)
        self.changed_by = [torch.full((w.shape[0],), -1, dtype=torch.int16, device=w.device) for w, _ in self.agreed]
        self._none = torch.empty(0, dtype=torch.int64, device=self.device)
        self._step_rows: dict[int, list[torch.Tensor]] = {}  # shard -> each replica's rows looked up this step

    @torch.no_grad()
    def after_step(self, lr: float, due: bool) -> int:
        """After each step: the rows two replicas looked up in it, synced from their gradients, and
        on a `due` step (every N) every row one of them changed (see the module's docstring); `lr`:
        the step's embedding learning rate. Returns the bytes this rank gathered and all-reduced in
        the step."""
        chosen = {}
        for k, changed_by in enumerate(self.changed_by):
            fresh = looked_up_together(changed_by, self._step_rows.pop(k, []))
            chosen[k] = RowsToSync(fresh, changed_alone(changed_by) if due else self._none)
        sent, self._sent = self._sent + self._sync_rows(chosen, lr), 0
        return sent

    @torch.no_grad()
    def sync(self) -> int:
        """Every row a replica changed since they last agreed, synced: before a checkpoint or an
        evaluation, which then read one model. Returns the bytes all-reduced."""
        return self._sync_rows({k: RowsToSync(self._none, changed_alone(c)) for k, c in enumerate(self.changed_by)}, lr=1.0)

    def _sync_rows(self, chosen: dict[int, RowsToSync], lr: float) -> int:
        """Sync the `chosen` rows of shards, in blocks of at most SYNC_BLOCK_BYTES of weights (each
        copied out, synced and copied back: a sync never holds a third copy of the shards).
        Returns the bytes all-reduced."""
        shards = self.held
        sent, block, block_bytes = 0, [], 0
        for k, rows in chosen.items():
            w = shards[k][0]
            row_bytes = w.shape[1] * w.element_size()
            step = max(1, SYNC_BLOCK_BYTES // row_bytes)
            for kind, kind_rows in zip(rows._fields, rows):
                for i in range(0, kind_rows.numel(), step):
                    block.append((k, kind, kind_rows[i:i + step]))
                    block_bytes += min(step, kind_rows.numel() - i) * row_bytes
                    if block_bytes >= SYNC_BLOCK_BYTES:
                        sent += self._sync_block(shards, block, lr)
                        block, block_bytes = [], 0
        return sent + (self._sync_block(shards, block, lr) if block else 0)

    def _sync_block(self, shards, block: list, lr: float) -> int:
        copies, parts = [], []
        for k, kind, rows in block:
            (w, s), (w0, s0) = shards[k], self.agreed[k]
            copies.append((w[rows], None if s is None else s[rows], w0[rows], None if s0 is None else s0[rows]))
            parts.append(self._own_parts(kind, *copies[-1]))
        sent = self._sum([t for p in parts for t in p])
        for (k, kind, rows), copy, summed in zip(block, copies, parts):
            self._agree_on(kind, *copy, summed, lr)
            (w, s), (w0, s0) = shards[k], self.agreed[k]
            for whole, part in zip((w, s, w0, s0), copy):
                if whole is not None:
                    whole.index_copy_(0, rows, part)
        return sent

    def _gather(self, looked_up: list[torch.Tensor]) -> tuple[list[list[torch.Tensor]], int]:
        """Every replica's `looked_up` (per shard, the rows of this rank's place in the group), and
        the bytes gathered: how many of each shard, then the rows, padded to the longest."""
        counts = torch.tensor([t.numel() for t in looked_up], dtype=torch.int64, device=self.device)
        all_counts = [torch.empty_like(counts) for _ in range(self.replicas)]
        dist.all_gather(all_counts, counts, group=self.replica_pg)
        longest = max(int(c.sum()) for c in all_counts)
        mine = torch.zeros(longest, dtype=torch.int32, device=self.device)
        if looked_up:
            mine[:int(counts.sum())] = torch.cat(looked_up).to(torch.int32)
        gathered = [torch.empty_like(mine) for _ in range(self.replicas)]
        dist.all_gather(gathered, mine, group=self.replica_pg)
        everyone = [list(torch.split(flat[:int(c.sum())].to(torch.int64), c.tolist())) for flat, c in zip(gathered, all_counts)]
        return everyone, self.replicas * (counts.numel() * counts.element_size() + longest * mine.element_size())

    def _own_parts(self, kind: str, w, s, w0, s0) -> list[torch.Tensor]:
        """What this replica brings to a sync of these rows of a `kind` (RowsToSync), made from its
        copies of them (`w`, `s` its rows, `w0`, `s0` as agreed) in place: its change since they
        agreed and its state's (`alone`, and SGD's), or the gradient its one step's change amounts
        to at the state after it, learning rate in it (`fresh`)."""
        w.sub_(w0)
        if s is None:
            return [w]
        if kind == "alone":
            return [w, s.sub_(s0)]
        return [gradient_of_update(self.optimizer, w, s, 1.0)]

    def _agree_on(self, kind: str, w, s, w0, s0, summed: list[torch.Tensor], lr: float) -> None:
        """From the replicas' parts `summed` (see _own_parts): 1D's update of the agreed rows `w0`,
        `s0`, in place, and this replica's `w`, `s` made them: changes added up (one replica's
        change is 1D's, SGD's changes add up to 1D's), or the summed gradient of the step just done
        (`lr`: its learning rate) applied at the state its square makes."""
        if s is None or kind == "alone":
            w0.add_(summed[0])
            if s is not None:
                s0.add_(summed[1])
        else:  # the summed gradient carries the learning rate: 1D's update of it
            fused_update(self.optimizer, w0, s0, summed[0].div_(lr), lr)
        w.copy_(w0)
        if s is not None:
            s.copy_(s0)

    def _sum(self, tensors: list[torch.Tensor]) -> int:
        """Sum each of `tensors` over the replica group, in place: small ones several to an
        all-reduce, large ones alone. Returns their bytes."""
        batch, batch_bytes, sent = [], 0, 0
        for t in tensors:
            size = t.numel() * t.element_size()
            sent += size
            if size >= COALESCE_BYTES:
                dist.all_reduce(t, group=self.replica_pg)
                continue
            if batch and (batch[0].dtype != t.dtype or batch_bytes >= COALESCE_BYTES):
                self._sum_batch(batch)
                batch, batch_bytes = [], 0
            batch.append(t)
            batch_bytes += size
        if batch:
            self._sum_batch(batch)
        return sent

    def _sum_batch(self, tensors: list[torch.Tensor]) -> None:
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.replica_pg)
        offset = 0
        for t in tensors:
            t.copy_(flat[offset:offset + t.numel()].view_as(t))
            offset += t.numel()


def read_after_another(changed_by: torch.Tensor, looked_up: list[torch.Tensor]) -> torch.Tensor:
    """The rows of one shard that a replica is about to read and another changed since they agreed
    (`looked_up[i]`: the distinct rows replica i is about to read; `changed_by`: which replica
    changed each row, -1 none), marked as agreed in `changed_by`: the caller syncs them."""
    by = [changed_by[ids] for ids in looked_up]
    rows = torch.unique(torch.cat([ids[(b >= 0) & (b != i)] for i, (ids, b) in enumerate(zip(looked_up, by))]))
    changed_by[rows] = -1
    return rows


def looked_up_together(changed_by: torch.Tensor, looked_up: list[torch.Tensor]) -> torch.Tensor:
    """After a step: the rows of one shard two replicas looked up in it (read as agreed, each
    changed by the step alone: the caller syncs them); the rows one looked up marked as its
    change in `changed_by`."""
    if not looked_up:
        return changed_by.new_empty(0, dtype=torch.int64)
    distinct, times = torch.unique(torch.cat(looked_up), return_counts=True)
    for i, ids in enumerate(looked_up):
        changed_by[ids] = i
    together = distinct[times > 1]
    changed_by[together] = -1
    return together


def changed_alone(changed_by: torch.Tensor) -> torch.Tensor:
    """The rows one replica changed since they agreed (its change is 1D's); `changed_by` cleared."""
    rows = (changed_by >= 0).nonzero().squeeze(1)
    changed_by.fill_(-1)
    return rows


class RowsToSync(NamedTuple):
    """A shard's rows to sync: those the replicas that looked them up each changed in one step
    (`fresh`), and those one replica changed alone (`alone`). The fields' names are the kinds of
    rows ReplicaGroups._own_parts and _agree_on sync."""

    fresh: torch.Tensor
    alone: torch.Tensor

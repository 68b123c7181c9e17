"""2D sparse parallelism on TorchRec (the plan: planner/plan/replication.py): R replicas of one
sharding group's plan, each sharded over G ranks, their tables brought together every N steps.

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
alone looked up since they last agreed has that replica's update and state, 1D's. A row two
replicas look up is where they would part from 1D, so it is not left for later: after each step
the replicas exchange the rows each looked up (from the ids the kernels were given) and sync at
once every row two of them looked up since they last agreed (`after_step`). One both looked up
in this step and not before is synced exactly: each replica's gradient recovered from its update
and the state after it, 1D's update and state made from their sum. One a replica changed earlier
and others look up now gets that replica's change (1D's, for the steps only it looked the row
up), then the others' gradients of this step applied at the state its change and their sum's
square make: 1D's, but for the others having read the row as it was. Every N steps every row one
replica changed is synced too, and before a checkpoint or an evaluation (`sync`). Synced every step, 2D
trains the 1D model; every N > 1 steps, what is left of 1D's difference is that a replica that
looks up a row another changed reads it as it was, once, before they sync it. Only rows looked
up move: a sync passes over none of the others. Each rank keeps the copy its replicas last
agreed on, as large as its shards, and which replica changed each row since (the planner
prices both, and the rows each step exchanges).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.types import ShardingEnv2D

from dlrm_scale.bridge.resident import embedding_kernels
from dlrm_scale.training.table_optimizer import gradient_of_update, step_size
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
        self.replica_rank = self.mesh.get_local_rank("replicate")  # this rank's replica, in its replica group's order
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
        """Keep the ids each training forward gives this rank's kernels (rows of their shards), for
        `after_step`. Evaluation (no gradient) looks rows up without changing them: not kept."""
        self._lookups: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        self._feature_tables: list[list[int]] = []  # per kernel: each feature's table (a shard of it)

        for kernel in self._sharded_kernels(model):
            kept: list[tuple[torch.Tensor, torch.Tensor]] = []

            def hook(_module, args, kwargs, kept=kept):
                if torch.is_grad_enabled():
                    kept.append((kwargs["indices"] if "indices" in kwargs else args[0], kwargs["offsets"] if "offsets" in kwargs else args[1]))

            kernel.emb_module.register_forward_pre_hook(hook, with_kwargs=True)
            self._lookups.append(kept)
            self._feature_tables.append(list(kernel.emb_module.feature_table_map))

    def _looked_up(self) -> list[torch.Tensor]:
        """The distinct rows of each shard the kept forwards looked up (forgotten once read)."""
        rows: list[list[torch.Tensor]] = []
        for kept, feature_tables in zip(self._lookups, self._feature_tables, strict=True):
            per_table: list[list[torch.Tensor]] = [[] for _ in range(max(feature_tables) + 1)]
            for indices, offsets in kept:
                per_feature = (offsets.numel() - 1) // len(feature_tables)  # the batch: one bag per sample and feature
                starts = offsets[::per_feature].tolist()
                for f, table in enumerate(feature_tables):
                    per_table[table].append(indices[starts[f]:starts[f + 1]])
            kept.clear()
            rows += [torch.unique(torch.cat(ids)) if ids else torch.empty(0, dtype=torch.int64, device=self.device) for ids in per_table]
        return rows

    @torch.no_grad()
    def agree(self, model: torch.nn.Module) -> None:
        """The replicas hold the same tables (the start, a resume): their updates count from here."""
        self.agreed = [(w.clone(), None if s is None else s.clone()) for w, s in self._shards(model)]
        # which replica changed each row since they agreed: -1 none (or several: synced after the step)
        self.changed_by = [torch.full((w.shape[0],), -1, dtype=torch.int16, device=w.device) for w, _ in self.agreed]
        if hasattr(self, "_lookups"):
            self._looked_up()

    @torch.no_grad()
    def after_step(self, model: torch.nn.Module, lr: float, due: bool) -> int:
        """After each step: the rows two replicas looked up since they last agreed, synced now, and
        on a `due` step (every N) every row one of them changed (see the module's docstring);
        `lr`: the step's embedding learning rate. Returns the bytes this rank gathered and
        all-reduced."""
        everyone, sent = self._gather(self._looked_up())
        chosen = []
        for k, changed_by in enumerate(self.changed_by):
            rows, owners = shared_rows(changed_by, [ids[k] for ids in everyone])
            fresh = owners < 0
            chosen.append(RowsToSync(rows[fresh], rows[~fresh], owners[~fresh], _changed_alone(changed_by) if due else rows[:0]))
        return sent + self._sync_rows(model, chosen, lr)

    @torch.no_grad()
    def sync(self, model: torch.nn.Module, lr: float) -> int:
        """Every row a replica changed since they last agreed, synced: before a checkpoint or an
        evaluation, which then read one model. Returns the bytes all-reduced."""
        none = torch.empty(0, dtype=torch.int64, device=self.device)
        return self._sync_rows(model, [RowsToSync(none, none, none, _changed_alone(changed_by)) for changed_by in self.changed_by], lr)

    def _sync_rows(self, model: torch.nn.Module, chosen: list[RowsToSync], lr: float) -> int:
        """Sync the `chosen` rows of each shard, in blocks of at most SYNC_BLOCK_BYTES of weights
        (each copied out, synced and copied back: a sync never holds a third copy of the shards).
        Returns the bytes all-reduced."""
        shards = self._shards(model)
        sent, block, block_bytes = 0, [], 0
        for k, rows in enumerate(chosen):
            w = shards[k][0]
            row_bytes = w.shape[1] * w.element_size()
            step = max(1, SYNC_BLOCK_BYTES // row_bytes)
            for kind, kind_rows, owners in (("fresh", rows.fresh, None), ("owned", rows.owned, rows.owners), ("alone", rows.alone, None)):
                for i in range(0, kind_rows.numel(), step):
                    block.append((k, kind, kind_rows[i:i + step], None if owners is None else owners[i:i + step]))
                    block_bytes += min(step, kind_rows.numel() - i) * row_bytes
                    if block_bytes >= SYNC_BLOCK_BYTES:
                        sent += self._sync_block(shards, block, lr)
                        block, block_bytes = [], 0
        return sent + (self._sync_block(shards, block, lr) if block else 0)

    def _sync_block(self, shards, block: list, lr: float) -> int:
        copies, parts = [], []
        for k, kind, rows, owners in block:
            (w, s), (w0, s0) = shards[k], self.agreed[k]
            copies.append((w[rows], None if s is None else s[rows], w0[rows], None if s0 is None else s0[rows]))
            parts.append(self._own_parts(kind, *copies[-1], owners))
        sent = self._sum([t for p in parts for t in p])
        for (k, kind, rows, _), copy, summed in zip(block, copies, parts):
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

    def _own_parts(self, kind: str, w, s, w0, s0, owners) -> list[torch.Tensor]:
        """What this replica brings to a sync of these rows of a `kind` (RowsToSync), made from its
        copies of them (`w`, `s` its rows, `w0`, `s0` as agreed) in place: its change since they
        agreed, for a row it alone changed (and SGD's); for the others, the gradient a one-step
        change amounts to at the state after it (learning rate in it: what `_agree_on` needs to
        make 1D's update and state), and the owner's change and state's increment apart."""
        w.sub_(w0)
        if s is None or kind == "alone":
            return [w] if s is None else [w, s.sub_(s0)]
        if kind == "fresh":
            return [gradient_of_update(self.optimizer, w, s, 1.0)]
        mine = owners == self.replica_rank
        change = w * mine.unsqueeze(1)
        gradient_of_update(self.optimizer, w, s, 1.0).mul_(~mine.unsqueeze(1))
        increment = s.sub_(s0).mul_(mine if s.dim() == 1 else mine.unsqueeze(1))
        return [change, w, increment]

    def _agree_on(self, kind: str, w, s, w0, s0, summed: list[torch.Tensor], lr: float) -> None:
        """From the replicas' parts `summed` (see _own_parts): 1D's update of the agreed rows `w0`,
        `s0`, in place, and this replica's `w`, `s` made them. The gradients are of the step just
        done (`lr`: its learning rate), applied after the owner's change, at a state that grew by
        the owner's increment and by their sum's square."""
        if s is None or kind == "alone":  # one replica's change (1D's), and SGD's changes, add up to 1D's
            w0.add_(summed[0])
            if s is not None:
                s0.add_(summed[1])
        else:
            change, gradient, increment = (None, summed[0], None) if kind == "fresh" else summed
            squared = (gradient / lr).square()
            s0.add_(squared.mean(dim=1) if self.optimizer == "rowwise_adagrad" else squared)
            if increment is not None:
                s0.add_(increment)
                w0.add_(change)
            w0.sub_(gradient.mul_(step_size(self.optimizer, s0, 1.0)))
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


def shared_rows(changed_by: torch.Tensor, looked_up: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of one shard to sync after a step: those two replicas looked up in it, and those one
    looked up that another had changed since they agreed; `looked_up[i]`: the distinct rows
    replica i looked up. Also, for each, the replica that had changed it (-1: none, every
    replica's change is the step's). `changed_by` (which replica changed each row since they
    agreed, -1 none) is updated in place: the rows returned are about to be agreed on, the others
    looked up are the one replica's that looked them up."""
    before = [changed_by[ids] for ids in looked_up]
    distinct, times = torch.unique(torch.cat(looked_up), return_counts=True)
    after_another = [ids[(b >= 0) & (b != i)] for i, (ids, b) in enumerate(zip(looked_up, before))]
    rows = torch.unique(torch.cat([distinct[times > 1], *after_another]))
    owners = changed_by[rows].clone()
    for i, ids in enumerate(looked_up):
        changed_by[ids] = i
    changed_by[rows] = -1
    return rows, owners


def _changed_alone(changed_by: torch.Tensor) -> torch.Tensor:
    """The rows one replica changed since they agreed (its change is 1D's); `changed_by` cleared."""
    rows = (changed_by >= 0).nonzero().squeeze(1)
    changed_by.fill_(-1)
    return rows


class RowsToSync(NamedTuple):
    """A shard's rows to sync, by what the replicas' changes of them are: one step's of every
    replica that looked each up (`fresh`), one replica's since they agreed and this step's of
    the others (`owned`, and that replica, `owners`), or one replica's alone (`alone`)."""

    fresh: torch.Tensor
    owned: torch.Tensor
    owners: torch.Tensor
    alone: torch.Tensor

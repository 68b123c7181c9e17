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
its own (`share_gradients`: the replicas' gradients add up to 1D's). Synced every step, each
replica's gradient is recovered from its one update and the state after it, and 1D's update is
made from their sum (`_sync_one_step`): 2D trains the 1D model. Every N > 1 steps (`sync`) each
replica's change since they last agreed is turned into the gradient it amounts to at the state
it ended with (for one step, its gradient exactly); their sum is applied at the state 1D would
hold, whose increments (sums of squares) add up as the square of the sum of their roots: 1D's
where the replicas' gradients of a row point alike, never less than their sum of squares. A row
one replica touched gets that replica's update and state; a hot row that every replica pushed
alike moves as far as 1D moves it (exactly from an empty state, and in the limit of a large
one), where the plain sum of the updates would move it up to R times as far. SGD's updates add
up to 1D's as they are. Between those syncs the replicas do not see each other's updates: another
optimizer (docs/benchmarks.md measures it). Each rank keeps the copy its replicas last agreed
on, as large as its shards (the planner prices it).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.types import ShardingEnv2D

from dlrm_scale.bridge.resident import embedding_kernels
from dlrm_scale.training.table_optimizer import fused_update, gradient_of_update, step_size
from planner.plan.document import Plan
from planner.plan.replication import exact_every_step, sharding_groups

# Shards and states below this are summed several to an all-reduce (one call each would cost
# its latency many times over); larger ones alone, in place, with no copy.
COALESCE_BYTES = 16 << 20


class ReplicaGroups:
    """This rank's sharding group and replica group (created collectively: every rank builds one)."""

    def __init__(self, plan: Plan, device_type: str, optimizer: str) -> None:
        """`optimizer`: the embedding optimizer's name."""
        rep = plan.replication
        self.optimizer = optimizer
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

    def _shards(self, model: torch.nn.Module) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """(weights, optimizer state or None) of this rank's shard of every sharded table, in an
        order every replica shares."""
        shards = []
        for kernel in embedding_kernels(model):
            if {t.name for t in kernel.config.embedding_tables} <= self.replicated_tables:
                continue  # data-parallel: all-reduced every step with the dense layers
            weights = kernel.emb_module.split_embedding_weights()
            states = kernel.emb_module.split_optimizer_states() or [[]] * len(weights)  # SGD: none
            shards += [(w, state[0] if state else None) for w, state in zip(weights, states, strict=True)]
        return shards

    @torch.no_grad()
    def agree(self, model: torch.nn.Module) -> None:
        """The replicas hold the same tables (the start, a resume): their updates count from here."""
        self.agreed = [(w.clone(), None if s is None else s.clone()) for w, s in self._shards(model)]

    @torch.no_grad()
    def sync(self, model: torch.nn.Module, lr: float) -> int:
        """Bring the replicas together (see the module's docstring); `lr`: the embedding learning
        rate of the step just done. Returns the bytes this rank all-reduced."""
        shards = self._shards(model)
        if exact_every_step(self.optimizer, self.sync_every_steps):
            return self._sync_one_step(shards, lr)
        for (w, s), (w0, _) in zip(shards, self.agreed, strict=True):
            w.sub_(w0)  # this replica's update since they agreed, in place: no copy
            if s is not None:  # as the gradient it amounts to at the state it ended with (learning rates in it)
                gradient_of_update(self.optimizer, w, s, 1.0)
        roots = [s.sub_(s0).sqrt_() for (_, s), (_, s0) in zip(shards, self.agreed) if s is not None]
        sent = self._sum([w for w, _ in shards] + roots)
        for (w, s), (w0, s0) in zip(shards, self.agreed):
            if s is None:  # SGD: the updates' sum is 1D's
                w0.add_(w)
            else:  # increments of a sum of squares: the square of their roots' sum; the summed gradient at it
                s0.add_(s.square_())
                w0.sub_(w.mul_(step_size(self.optimizer, s0, 1.0)))
                s.copy_(s0)
            w.copy_(w0)
        return sent

    def _sync_one_step(self, shards: list[tuple[torch.Tensor, torch.Tensor]], lr: float) -> int:
        """Each replica's gradient, from its one update and the state after it, summed (1D's
        gradient), and 1D's update made from where the replicas agreed, on the rows any replica
        touched (the others are as agreed in every replica). In place: each shard holds its
        update, then its gradient, until the agreed rows and the new ones are copied back."""
        touched = []
        for (w, s), (w0, _) in zip(shards, self.agreed, strict=True):
            touched.append(w.sub_(w0).any(dim=1))
            gradient_of_update(self.optimizer, w, s, lr)
        sent = self._sum([w for w, _ in shards])
        for (g, s), (w0, s0), mine in zip(shards, self.agreed, touched):
            rows = (mine | g.any(dim=1)).nonzero().squeeze(1)
            new_w, new_s = w0[rows], s0[rows]
            fused_update(self.optimizer, new_w, new_s, g[rows], lr)
            w0.index_copy_(0, rows, new_w)
            s0.index_copy_(0, rows, new_s)
            g.copy_(w0)
            s.copy_(s0)
        return sent

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

"""2D sparse parallelism on TorchRec (the plan: planner/plan/replication.py): R replicas of one
sharding group's plan, each sharded over G ranks, their tables averaged every N steps.

Built from TorchRec's own 2D parts, as `DMPCollection` builds them: its device mesh of
("replicate", "shard") ranks, its `ShardingEnv2D` (which TorchRec's sharding code switches on)
and its rank layout (sharding group g: ranks g, g+R, g+2R, ...; a replica group: R consecutive
ranks). `DMPCollection` itself refuses every device but CUDA and MTIA, and its plan remapping
gives CPU shards a device index CPU tensors never carry, so the job makes the same model here on
every device: DistributedModelParallel over the `ShardingEnv2D`, the group's plan placed on the
job's ranks (bridge.sharding_plan), and `sync` doing what `DMPCollection.sync` does under the
default strategy: an average over the replica group of every sharded table's weights and
optimizer state. Dense layers and data-parallel tables stay data-parallel over all W ranks
(DDP on the global group, as in `DMPCollection`), so they never need a sync.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torchrec.distributed.types import ShardingEnv2D

from dlrm_scale.bridge.resident import embedding_kernels
from planner.plan.document import Plan
from planner.plan.replication import sharding_groups

# Shards and states below this are averaged several to an all-reduce (one call each would cost
# its latency many times over); larger ones alone, in place, with no copy.
COALESCE_BYTES = 16 << 20


class ReplicaGroups:
    """This rank's sharding group and replica group (created collectively: every rank builds one)."""

    def __init__(self, plan: Plan, device_type: str) -> None:
        rep = plan.replication
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

    @torch.no_grad()
    def sync(self, model: torch.nn.Module) -> int:
        """Average this rank's shards of every sharded table, and their optimizer state, with its
        replicas' (the same shards in every replica group). Returns the bytes this rank contributed."""
        synced, batch, batch_bytes = 0, [], 0
        for kernel in embedding_kernels(model):
            if {t.name for t in kernel.config.embedding_tables} <= self.replicated_tables:
                continue  # data-parallel: all-reduced every step with the dense layers
            module = kernel.emb_module
            for t in (*module.split_embedding_weights(), *(s for states in module.split_optimizer_states() for s in states)):
                size = t.numel() * t.element_size()
                synced += size
                if size >= COALESCE_BYTES:
                    self._average([t])  # in place: a large shard is as large as a rank's spare memory allows
                    continue
                if batch and (batch[0].dtype != t.dtype or batch_bytes >= COALESCE_BYTES):
                    self._average(batch)
                    batch, batch_bytes = [], 0
                batch.append(t)
                batch_bytes += size
        if batch:
            self._average(batch)
        return synced

    def _average(self, tensors: list[torch.Tensor]) -> None:
        """One all-reduce for `tensors` (of one dtype), each averaged in place."""
        flat = tensors[0] if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, group=self.replica_pg)  # a sum: gloo has no average
        flat /= self.replicas
        if len(tensors) > 1:
            offset = 0
            for t in tensors:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()

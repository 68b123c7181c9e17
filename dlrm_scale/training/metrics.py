"""What a run reports: one JSON record per line in metrics.jsonl (and TensorBoard) on rank 0,
and per logging window the loss, samples/s, comm bytes, memory and every rank's phases."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterator, Sequence

import torch
import torch.distributed as dist
from torchrec.datasets.utils import Batch

from dlrm_scale.training.comm_meter import CommMeter
from dlrm_scale.training.host_group import host_group
from dlrm_scale.run_record import PHASES
from dlrm_scale.training.phases import PhaseTimer
from planner.views.comm_volume import embedding_comm_bytes
from planner.plan.document import Plan
from planner.plan.replication import group_ranks, sync_bytes_per_rank
from planner.spec.specs import TableSpec, TrainingSpec


def resident_bytes() -> tuple[int, int]:
    """This process's resident memory and its anonymous part (the rest is mapped files), bytes."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields.get("VmRSS", 0), fields.get("RssAnon", 0)


class MetricsLog:
    """metrics.jsonl and TensorBoard scalars, written by rank 0 only."""

    def __init__(self, out_dir: Path, rank: int) -> None:
        self.file = open(out_dir / "metrics.jsonl", "a") if rank == 0 else None
        self.tensorboard = None
        if rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(out_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        if self.file:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, record["step"])

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.tensorboard.close()


class PoolingMeter:
    """Each table's ids per sample in the batches the loop took since the last window: its
    pooling factor as the data has it (a table that grows hot shows here; the cost model prices
    the config's). The pipeline takes a batch or two ahead, which a window of many steps does not notice."""

    def __init__(self, features: Sequence[str]) -> None:
        self.features = list(features)
        self.ids = torch.zeros(len(self.features), dtype=torch.float64)
        self.samples = 0
        self.last = torch.zeros_like(self.ids)

    def counting(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        for batch in batches:
            kjt = batch.sparse_features
            per_key = dict(zip(kjt.keys(), kjt.length_per_key()))
            self.ids += torch.tensor([per_key[f] for f in self.features], dtype=torch.float64)
            self.samples += kjt.stride()
            yield batch

    def take(self) -> torch.Tensor:
        """Ids per sample of each feature since the last take (the last take's where no batch was
        taken since: the pipeline may have taken the last window's batches before it began)."""
        if self.samples:
            self.last = self.ids / self.samples
            self.ids, self.samples = torch.zeros_like(self.ids), 0
        return self.last


class WindowReport:
    """The record of a logging window. Its time is its training steps' (the slowest rank's sum
    of phases), so evaluation and checkpoints between windows never count."""

    def __init__(self, plan: Plan, training: TrainingSpec, tables: Sequence[TableSpec], timer: PhaseTimer, meter: CommMeter, rank: int,
                 world: int) -> None:
        self.timer, self.meter, self.rank, self.world = timer, meter, rank, world
        self.tables = [t.name for t in tables]
        self.samples_per_step = training.batch_size_per_rank * world
        b, fwd, bwd = training.batch_size_per_rank, training.fwd_comm_precision, training.bwd_comm_precision
        self.predicted = embedding_comm_bytes(plan, b, fwd, bwd)
        self.predicted_fp32 = embedding_comm_bytes(plan, b, "fp32", "fp32")
        # 2D: the plan is one sharding group's; job rank r does what the plan's rank plan_rank[r] does
        rep = plan.replication
        self.plan_rank = group_ranks(rep) if rep is not None else list(range(world))
        self.sync_predicted = None
        if rep is not None:
            exchanged = sync_bytes_per_rank(plan, tables, training.batch_size_per_rank, training.embedding_optimizer,
                                            rep.replicas, rep.sync_every_steps)
            self.sync_predicted = [exchanged[k].per_step(rep.sync_every_steps) for k in self.plan_rank]
        self.samples_per_s = 0.0

    def record(self, step: int, losses: torch.Tensor, pooling: torch.Tensor, synced_bytes: int = 0) -> dict:
        """The window's record; `pooling`: this rank's ids per sample of each table (PoolingMeter);
        `synced_bytes`: what this rank exchanged with its replicas (2D)."""
        n = len(losses)
        phases = self.timer.take()
        sent = [b / n for b in self.meter.reset()]  # embeddings, of them to other nodes, ids: bytes per step
        stats = torch.cat([torch.tensor([float(losses.mean()), *(phases[p] * 1e3 / n for p in PHASES), *sent, synced_bytes / n],
                                        dtype=torch.float64), pooling])
        gathered = [torch.empty_like(stats) for _ in range(self.world)]
        with self.meter.paused():  # bookkeeping, not the embeddings' traffic
            dist.all_gather(gathered, stats, group=host_group())
        per_rank = torch.stack(gathered)
        step_ms = float(per_rank[:, 1:1 + len(PHASES)].sum(dim=1).max())
        memory = torch.tensor(resident_bytes(), dtype=torch.int64)
        dist.all_reduce(memory, op=dist.ReduceOp.MAX, group=host_group())
        self.samples_per_s = self.samples_per_step * 1e3 / step_ms
        emb, across, ids, synced = (per_rank[:, 1 + len(PHASES) + i] for i in range(4))
        pooling_factors = per_rank[:, 1 + len(PHASES) + 4:].mean(dim=0)  # after the four above; every rank's batch is as large

        def ints(values) -> list[int]:
            return [int(v) for v in values]

        def per_job_rank(planned) -> list[int]:
            return [int(planned[k]) for k in self.plan_rank]

        replicas = {} if self.sync_predicted is None else {  # 2D: bytes exchanged with the replicas, per step
            "replica_sync_bytes": ints(synced), "replica_sync_bytes_predicted": ints(self.sync_predicted)}
        return {
            "step": step, "loss": float(per_rank[:, 0].mean()), "samples_per_s": self.samples_per_s,
            # per step, sent by each rank (index = rank): embeddings and their gradients, those of them
            # that went to other nodes, and ids; then the plan's count (planner.views.comm_volume)
            "comm_bytes": ints(emb), "comm_bytes_across_nodes": ints(across), "id_bytes": ints(ids),
            "comm_bytes_predicted": per_job_rank(self.predicted.total),
            "comm_bytes_across_nodes_predicted": per_job_rank(self.predicted.across_nodes),
            "comm_bytes_fp32_predicted": per_job_rank(self.predicted_fp32.total), **replicas,
            # the largest rank's resident memory now, and its anonymous part
            "rss_bytes": int(memory[0]), "rss_anon_bytes": int(memory[1]),
            "step_ms": step_ms,
            # each table's ids per sample over the window, as the data had them
            "pooling_factors": {t: round(float(p), 4) for t, p in zip(self.tables, pooling_factors)},
            # per phase, ms per step on each rank (index = rank); the slowest rank's add up to step_ms
            "phase_ms": {p: [round(float(v), 4) for v in per_rank[:, 1 + i]] for i, p in enumerate(PHASES)},
        }

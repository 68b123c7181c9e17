"""The training loop: DMP over our plan, fused embedding optimizers, pipeline, metrics."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from tqdm import tqdm
import torch.distributed as dist
from torchmetrics.functional.classification import binary_auroc
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dlrm_scale.training import checkpoint as ckpt
from dlrm_scale.training.comm_meter import CommMeter
from dlrm_scale.kernels.cpu_adagrad import install as install_cpu_adagrad
from dlrm_scale.training.criteo import criteo_data
from dlrm_scale.training.data import SyntheticData
from dlrm_scale.kernels.huge_pages import back_with_huge_pages
from dlrm_scale.training.initial_weights import initialise_embeddings
from dlrm_scale.training.model import EMBEDDING_MODULE_PATH, ModelConfig, build_model, table_of_key
from dlrm_scale.bridge.qcomms import qcomm_codecs_registry
from dlrm_scale.bridge.sharders import WideEmbeddingBagCollectionSharder
from dlrm_scale.bridge.sharding import to_sharding_plan
from dlrm_scale.training.table_optimizer import ReplicatedTables, fused_optimizer
from dlrm_scale.training.phases import PHASES, PhaseTimer, TimedPipeline, instrument
from dlrm_scale.training.prefetch import Prefetcher, materialise
from dlrm_scale.tiering.runtime import PrefetchingPipeline, TieredEmbeddings, TieringRuntime, resident_plan, resident_tables
from planner.comm_volume import embedding_comm_bytes
from planner.errors import PlannerError
from planner.plan import Plan
from planner.specs import PlanningProblem

def resident_bytes() -> tuple[int, int]:
    """This process's resident memory and its anonymous part (the rest is mapped files), bytes."""
    fields = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                fields[key] = int(value.split()[0]) * 1024
    return fields.get("VmRSS", 0), fields.get("RssAnon", 0)


class TrainingError(PlannerError):
    """Training cannot go on (a non-finite loss, say); the message says what is kept."""


NO_BAD_STEP = 2**62

EVAL_SEED_OFFSET = 1_000_003


def sharder_for(fwd: str, bwd: str, store_dir: str | None = None, shard_widths: tuple[int, ...] = ()) -> WideEmbeddingBagCollectionSharder:
    """The sharder: quantized comms when asked (dlrm_scale.bridge.qcomms); on CUDA, FBGEMM's SSD
    kernel (`key_value`) keeps its files in `store_dir`."""
    registry = qcomm_codecs_registry(fwd, bwd, shard_widths)
    fused = {"ssd_storage_directory": store_dir} if store_dir else None
    return WideEmbeddingBagCollectionSharder(fused_params=fused, qcomm_codecs_registry=registry)


def build_sharded_model(problem: PlanningProblem, plan: Plan, model_config: ModelConfig, lr: float, device: torch.device,
                        store_dir: str | None = None, interaction: str = "torchrec"):
    """DMP over `plan`. On CPU, cached tables are sharded as their resident caches (see
    dlrm_scale.tiering.runtime); on CUDA they keep FBGEMM's caching kernels."""
    tables = problem.tables
    if device.type == "cpu":
        tables, plan = resident_tables(tables, plan), resident_plan(plan)
    model = build_model(tables, model_config, device, interaction=interaction)
    optimizer_cls, kwargs = fused_optimizer(problem.training.embedding_optimizer, lr)
    apply_optimizer_in_backward(optimizer_cls, model.model.sparse_arch.parameters(), kwargs)
    tr = problem.training
    return DistributedModelParallel(
        model,
        device=device,
        plan=to_sharding_plan(plan, device.type, EMBEDDING_MODULE_PATH),
        sharders=[sharder_for(tr.fwd_comm_precision, tr.bwd_comm_precision, store_dir if device.type == "cuda" else None,
                              tuple(s.cols for t in plan.tables.values() for s in t.shards))],
    )


class Trainer:
    def __init__(self, problem, plan, model_config, config, device, rank, world, out_dir: Path, data_path=None,
                 checkpoint: ckpt.CheckpointConfig | None = None, resume: bool = False) -> None:
        self.problem, self.plan, self.config = problem, plan, config
        self.checkpoint = checkpoint or ckpt.CheckpointConfig()
        self.resume = resume
        if config.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.device, self.rank, self.world, self.out_dir = device, rank, world, out_dir
        torch.manual_seed(config.seed)
        ours_on_cpu = device.type == "cpu" and config.cpu_embeddings == "dlrm_scale"
        self.cpu_kernel = install_cpu_adagrad(problem.training.embedding_optimizer) if ours_on_cpu else None
        self.model = build_sharded_model(problem, plan, model_config, config.embedding_lr, device, config.store_dir,
                                         config.interaction)
        self.timer = PhaseTimer()
        instrument(self.model, self.timer)
        self.tiered = None
        if device.type == "cpu" and any(t.cached for t in plan.tables.values()):
            runtime = TieringRuntime(Path(config.store_dir) if config.store_dir else None, problem.tiering.policy,
                                     prefetch_thread=config.prefetch_thread)
            self.tiered = TieredEmbeddings(self.model, plan, rank, runtime)
        # a resume loads every table from the checkpoint: writing their initial rows first would be wasted
        if not (resume and self.checkpoint.directory and ckpt.complete_checkpoints(self.checkpoint.directory)):
            initialise_embeddings(self.model, {t.name: (t.num_embeddings, t.embedding_dim) for t in problem.tables},
                                  config.seed, self.tiered)
        if ours_on_cpu:
            on_huge, large = back_with_huge_pages(self.model)
            if rank == 0 and large:
                print(f"rank 0: {on_huge / 2**30:.2f} of {large / 2**30:.2f} GiB of tables and optimizer state on huge pages", flush=True)
        dense_cls = torch.optim.Adagrad if config.dense_optimizer == "adagrad" else torch.optim.SGD
        unfused = dict(in_backward_optimizer_filter(self.model.named_parameters()))
        replicated = {k: (table_of_key(k), p) for k, p in unfused.items() if table_of_key(k) is not None}
        dense = KeyedOptimizerWrapper({k: p for k, p in unfused.items() if k not in replicated},
                                      lambda params: dense_cls(params, lr=config.dense_lr))
        optimizers = [self.model.fused_optimizer, dense]
        if replicated:  # data-parallel tables: the embedding optimizer's update, after the all-reduce
            optimizers.append(ReplicatedTables(replicated, problem.training.embedding_optimizer, config.embedding_lr))
        self.optimizer = CombinedOptimizer(optimizers)
        self.base_lrs = [g["lr"] for g in self.optimizer.param_groups]
        nd = model_config.num_dense_features
        if data_path is None:
            global_batch = config.batch_size * world
            self.data = SyntheticData(problem.tables, nd, global_batch, config.seed, rank, world)
            self.eval_data = SyntheticData(problem.tables, nd, global_batch, config.seed + EVAL_SEED_OFFSET, rank, world)
        else:
            self.data = criteo_data(data_path, problem.tables, nd, config.batch_size, rank, world, "train")
            self.eval_data = criteo_data(data_path, problem.tables, nd, config.batch_size, rank, world, "eval")
        tr = problem.training
        self.predicted_bytes = embedding_comm_bytes(plan, config.batch_size, tr.fwd_comm_precision, tr.bwd_comm_precision)
        self.predicted_bytes_fp32 = embedding_comm_bytes(plan, config.batch_size, "fp32", "fp32")
        self.meter = CommMeter()
        self.metrics = open(out_dir / "metrics.jsonl", "a") if rank == 0 else None
        self.tensorboard = None
        if rank == 0:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(out_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        if self.metrics:
            self.metrics.write(json.dumps(record) + "\n")
            self.metrics.flush()
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tensorboard.add_scalar(key, value, record["step"])

    def set_lr(self, step: int) -> None:
        factor = self.config.lr_factor(step)
        for group, base in zip(self.optimizer.param_groups, self.base_lrs):
            group["lr"] = base * factor

    def run(self) -> None:
        locks = []
        if self.rank == 0:  # one job per directory: a second job's saves or rows would interleave with ours
            if self.checkpoint.directory:
                locks.append(ckpt.JobLock(self.checkpoint.directory))
            if self.config.store_dir and self.tiered is not None:
                locks.append(ckpt.JobLock(Path(self.config.store_dir), "store directory"))
        try:
            start = self.restore() if self.resume else 0
            with self.meter.attached():
                self._run(start)
        finally:
            if self.cpu_kernel is not None:
                self.cpu_kernel.close()
            for lock in locks:
                lock.release()

    def restore(self) -> int:
        """Load the newest checkpoint that verifies (or the one --resume-from names); the step
        to go on from (0 when the directory holds none yet). A damaged checkpoint is skipped
        with a line saying why; when none verifies, nothing is resumed."""
        directory = self.checkpoint.directory
        found = ckpt.candidates(directory, self.checkpoint.resume_from)
        if not found:
            if self.rank == 0:
                print(f"no complete checkpoint in {directory} to resume from; starting at step 0", flush=True)
            return 0
        for step, path in found:
            damage = ckpt.verify(path)
            if damage is None:
                break
            if self.checkpoint.resume_from is not None:
                raise ckpt.CheckpointError(f"checkpoint {path} is damaged ({damage}); choose another with --resume-from")
            if self.rank == 0:
                print(f"skipping checkpoint {path}: it is damaged ({damage})", flush=True)
        else:
            raise ckpt.CheckpointError(f"no checkpoint in {directory} verifies (the newest, {found[0][1].name}, is damaged); "
                                       f"nothing was resumed: restore the directory or start afresh without --resume")
        if step > self.config.steps:
            raise ckpt.CheckpointError(f"checkpoint {path} is at step {step}, past --steps {self.config.steps}; "
                                       f"raise --steps to train on")
        meta = ckpt.load(path, self.model, self.optimizer)
        if self.tiered is not None:
            self.tiered.load(path)
        if self.rank == 0:
            print(f"resumed from {path} (step {meta['step']})", flush=True)
        return int(meta["step"])

    def _first_bad_step(self, local_bad: int) -> int:
        flag = torch.tensor([local_bad], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return int(flag[0])

    def _stop_on_bad_loss(self, bad_step: int) -> None:
        found = ckpt.complete_checkpoints(self.checkpoint.directory) if self.checkpoint.directory else []
        kept = f"the newest good checkpoint is {found[-1][1]} (step {found[-1][0]})" if found else "no checkpoint was written"
        raise TrainingError(f"loss is not finite at step {bad_step}; training stopped and {kept}; lower the learning rates")

    def save_checkpoint(self, step: int) -> None:
        meta = {"plan_digest": ckpt.plan_digest(self.plan.to_dict()), "seed": self.config.seed}
        path = ckpt.save(self.checkpoint.directory, step, self.model, self.optimizer, meta, self.checkpoint.keep,
                         self.tiered.save if self.tiered is not None else None)
        self.log({"step": step, "checkpoint": str(path)})

    def _run(self, start_step: int) -> None:
        cfg = self.config
        self.model.train()
        batches = self.data.batches(start_step, cfg.steps - start_step)
        held = False
        if cfg.materialise_mib:
            started = time.perf_counter()
            batches, held = materialise(batches, cfg.steps - start_step, cfg.materialise_mib << 20)
            if held and self.rank == 0:
                print(f"rank 0: made the run's {cfg.steps - start_step} batches in {time.perf_counter() - started:.1f} s", flush=True)
        if not held and cfg.prefetch_batches:
            batches = Prefetcher(batches, cfg.prefetch_batches)
        try:
            self._loop(start_step, batches)
        finally:
            if isinstance(batches, Prefetcher):
                batches.close()

    def _step(self, pipeline, batches) -> torch.Tensor:
        """One training step; the loss, detached and not read (reading it would be a host sync on a GPU)."""
        if pipeline is not None:
            return pipeline.progress(batches)[0]  # DLRMTrain's (loss, logits, labels), detached
        timer = self.timer
        timer.lap("rest")
        batch = next(batches).to(self.device)
        timer.lap("data")
        loss, _ = self.model(batch)
        timer.lap("dense_fwd")
        self.optimizer.zero_grad()
        timer.lap("rest")
        loss.backward()
        timer.lap("dense_allreduce")
        self.optimizer.step()
        timer.lap("optimizer")
        return loss.detach()

    def _loop(self, start_step: int, batches) -> None:
        cfg = self.config
        bad_step = NO_BAD_STEP
        pipeline = None
        if cfg.pipeline:
            pipeline = (PrefetchingPipeline(self.model, self.optimizer, self.device, self.timer, self.tiered) if self.tiered is not None
                        else TimedPipeline(self.model, self.optimizer, self.device, self.timer))
        cache_before = self.tiered.counters() if self.tiered is not None else {}
        window_losses: list[torch.Tensor] = []
        window_first = start_step
        self.timer.skip()
        # a progress bar on rank 0 when it has a terminal (tqdm stays quiet in logs)
        progress = tqdm(total=cfg.steps, initial=start_step, unit="step", disable=None if self.rank == 0 else True, mininterval=1.0)
        for step in range(start_step, cfg.steps):
            self.set_lr(step)
            window_losses.append(self._step(pipeline, batches))
            progress.update(1)
            last = step == cfg.steps - 1
            due_checkpoint = self.checkpoint.directory is not None and (
                last or (self.checkpoint.every_steps and (step + 1) % self.checkpoint.every_steps == 0)
            )
            due_log = (step + 1) % cfg.log_every == 0 or last
            due_eval = (cfg.eval_every and (step + 1) % cfg.eval_every == 0) or last
            if not (due_checkpoint or due_log or due_eval):
                continue
            if due_checkpoint or due_log:
                losses = torch.stack(window_losses).float()
                finite = torch.isfinite(losses)
                if bad_step == NO_BAD_STEP and not bool(finite.all()):
                    bad_step = window_first + int((~finite).nonzero()[0, 0]) + 1
                first_bad = self._first_bad_step(bad_step)
                if first_bad != NO_BAD_STEP:
                    self._stop_on_bad_loss(first_bad)
            if due_log:
                self._log_window(step + 1, losses)
                if self.tiered is not None:  # every rank's caches, summed over the window
                    now = self.tiered.counters()
                    summed = torch.tensor([now[k] - cache_before[k] for k in now], dtype=torch.int64)
                    dist.all_reduce(summed)
                    window = dict(zip(now, summed.tolist()))
                    requests = window["cache_hits"] + window["cache_misses"]
                    self.log({"step": step + 1, **window, "cache_hit_rate": window["cache_hits"] / requests if requests else 1.0})
                    cache_before = now
                progress.set_postfix(samples_per_s=f"{self._last_rate:,.0f}")
                window_losses, window_first = [], step + 1
            if due_checkpoint:
                self.save_checkpoint(step + 1)
            if due_eval:
                if pipeline is not None:
                    pipeline.detach()  # the pipeline rewires forward; evaluation needs the plain one
                with self.meter.paused():
                    self.evaluate(step + 1)
                self.model.train()
                if pipeline is not None and not last:
                    pipeline.attach()
            self.timer.skip()  # logging, saving and evaluating are not training: no window counts them
        progress.close()
        if self.tiered is not None:
            self.tiered.flush()
        if self.metrics:
            self.metrics.close()
            self.tensorboard.close()

    def _log_window(self, step: int, losses: torch.Tensor) -> None:
        """One metrics record for the window ending at `step`: mean loss over ranks, samples/s,
        comm bytes, memory, and every rank's ms per step in each phase (dlrm_scale.training.phases).
        The window's time is its training steps' (the slowest rank's sum of phases)."""
        cfg, n = self.config, len(losses)
        phases = self.timer.take()
        stats = torch.tensor([float(losses.mean()), *(phases[p] * 1e3 / n for p in PHASES)], dtype=torch.float64)
        gathered = [torch.empty_like(stats) for _ in range(self.world)]
        with self.meter.paused():  # bookkeeping, not the embeddings' traffic
            dist.all_gather(gathered, stats)
        per_rank = torch.stack(gathered)
        loss_mean = float(per_rank[:, 0].mean())
        step_ms = float(per_rank[:, 1:].sum(dim=1).max())
        memory = torch.tensor(resident_bytes(), dtype=torch.int64)
        dist.all_reduce(memory, op=dist.ReduceOp.MAX)
        self._last_rate = cfg.batch_size * self.world * 1e3 / step_ms
        emb_bytes, id_bytes = self.meter.reset()
        record = {
            "step": step, "loss": loss_mean, "samples_per_s": self._last_rate,
            # measured on this rank, per step: embeddings and their gradients, and ids
            "comm_bytes": emb_bytes // n, "id_bytes": id_bytes // n,
            # the plan's count (planner.comm_volume), at this precision and at fp32
            "comm_bytes_predicted": int(self.predicted_bytes[self.rank]),
            "comm_bytes_fp32_predicted": int(self.predicted_bytes_fp32[self.rank]),
            # the largest rank's resident memory now, and its anonymous part
            "rss_bytes": int(memory[0]), "rss_anon_bytes": int(memory[1]),
            "step_ms": step_ms,
            # per phase, ms per step on each rank (index = rank); the slowest rank's add up to step_ms
            "phase_ms": {p: [round(float(v), 4) for v in per_rank[:, 1 + i]] for i, p in enumerate(PHASES)},
        }
        self.log(record)
        if self.rank == 0:
            tqdm.write(f"step {step}/{cfg.steps} loss {loss_mean:.4f} {self._last_rate:,.0f} samples/s")

    @torch.no_grad()
    def evaluate(self, step: int) -> dict:
        self.model.eval()
        logits, labels = [], []
        for batch in self.eval_data.batches(0, self.config.eval_batches):
            _, (_, lg, lb) = self.model(batch.to(self.device))
            logits.append(lg.float().cpu())
            labels.append(lb.float().cpu())
        local = torch.stack([torch.cat(logits), torch.cat(labels)])
        gathered = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(gathered, local)
        all_ = torch.cat(gathered, dim=1)
        probs = torch.sigmoid(all_[0])
        auc = float(binary_auroc(probs, all_[1].long()))
        logloss = float(torch.nn.functional.binary_cross_entropy(probs.clamp(1e-7, 1 - 1e-7), all_[1]))
        record = {"step": step, "auc": auc, "logloss": logloss}
        self.log(record)
        if self.rank == 0:
            print(f"eval at step {step}: AUC {auc:.4f} logloss {logloss:.4f}", flush=True)
        return record

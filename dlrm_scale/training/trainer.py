"""The training loop: the parts built for the plan (training.build), then steps, windows of
metrics, checkpoints and evaluation on their schedules."""

from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.distributed as dist
from tqdm import tqdm

from dlrm_scale.run_config import RunConfig
from dlrm_scale.run_record import run_document
from dlrm_scale.training import checkpoint as ckpt
from dlrm_scale.training.build import build_parts
from dlrm_scale.training.comm_meter import CommMeter
from dlrm_scale.training.evaluation import evaluate
from dlrm_scale.training.host_group import host_group
from dlrm_scale.training.lr_schedule import LRSchedule, lr_factor
from dlrm_scale.training.data import feature_name
from dlrm_scale.training.metrics import MetricsLog, PoolingMeter, WindowReport
from dlrm_scale.training.phases import step_runner
from dlrm_scale.training.preemption import Preemption
from dlrm_scale.training.prefetch import HeldBatches, batch_source
from dlrm_scale.training.resume import NO_BAD_STEP, Checkpoints
from planner.plan.document import Plan


class Trainer:
    """One plan's training. With a `tuner` (dlrm_scale.tuning.tuner), it may stop at a window's end
    with a checkpoint of that step and `next_plan` set: the job goes on under that plan."""

    def __init__(self, run: RunConfig, plan: Plan, device: torch.device, rank: int, world: int, out_dir: Path,
                 data_path: str | None = None, resume: bool = False, tuner=None, held: HeldBatches | None = None) -> None:
        began = time.monotonic()
        train = self.config = run.train
        self.plan, self.device, self.rank, self.world, self.resume = plan, device, rank, world, resume
        if train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        torch.manual_seed(train.seed)
        # a resume loads every table from the checkpoint: writing their initial rows first would be wasted
        directory = run.checkpoint.directory
        initialise = not (resume and directory and ckpt.complete_checkpoints(directory))
        parts = build_parts(run, plan, device, rank, world, data_path, initialise)
        self.model, self.timer, self.tiered, self.optimizer = parts.model, parts.timer, parts.tiered, parts.optimizer
        self.data, self.eval_data, self.cpu_kernel = parts.data, parts.eval_data, parts.cpu_kernel
        self.replicas, self.synced_at, self.synced_bytes = parts.replicas, 0, 0
        self.lr_schedule = LRSchedule(self.optimizer, train)
        self.meter = CommMeter(run.problem.cluster.ranks_per_node)
        self.metrics = MetricsLog(out_dir, rank)
        self.run_record = run_document(run)
        self.window = WindowReport(plan, run.problem.training, run.problem.tables, self.timer, self.meter, rank, world)
        self.pooling = PoolingMeter([feature_name(t.name) for t in run.problem.tables])
        self.checkpoints = Checkpoints(run.checkpoint, self.model, self.optimizer, self.tiered, plan,
                                       run.problem.training.embedding_optimizer, train.seed, rank)
        self.preemption = Preemption(out_dir, rank)
        self.step = 0  # the step in progress, for a line that names it
        self.tuner, self.next_plan, self.stopped_at = tuner, None, 0
        self.held = held or HeldBatches()  # the batches made before the loop: a trainer after a move goes on from them
        self.build_s = time.monotonic() - began - parts.initialise_s  # as a move rebuilds it: loading its tables instead

    def run(self) -> None:
        locks = []
        if self.rank == 0:  # one job per directory: a second job's saves or rows would interleave with ours
            if self.checkpoints.config.directory:
                locks.append(ckpt.JobLock(self.checkpoints.config.directory))
            if self.config.store_dir and self.tiered is not None:
                locks.append(ckpt.JobLock(Path(self.config.store_dir), "store directory"))
        try:
            began = time.monotonic()
            start = self.checkpoints.restore(self.config.steps) if self.resume else 0
            self.metrics.log({"step": start, "run": self.run_record})  # what the windows after it measured
            if self.tuner is not None:
                moved = self.tuner.started(start, self.build_s, time.monotonic() - began)
                if moved is not None:
                    self.metrics.log(moved)
            with self.meter.attached():
                self._run(start)
        finally:
            self.preemption.close()
            if self.cpu_kernel is not None:
                self.cpu_kernel.close()
            for lock in locks:
                lock.release()

    def _run(self, start_step: int) -> None:
        cfg = self.config
        self.model.train()
        if self.replicas is not None:
            self.replicas.agree(self.model)  # the tables as initialised or restored: one in every replica
            self.synced_at = start_step
        count = cfg.steps - start_step
        with batch_source(self.data.batches(start_step, count), count, cfg.materialise_mib, cfg.prefetch_batches,
                          self.rank, self.held, start_step) as batches:
            self._loop(start_step, self.pooling.counting(batches))

    def _loop(self, start_step: int, batches) -> None:
        cfg = self.config
        pipeline = step_runner(cfg.pipeline, self.model, self.optimizer, self.device, self.timer, self.tiered)
        self._cache_before = self.tiered.counters() if self.tiered is not None else {}
        losses: list[torch.Tensor] = []
        first, bad_step = start_step, NO_BAD_STEP
        self.timer.skip()
        # a progress bar on rank 0 when it has a terminal (tqdm stays quiet in logs)
        progress = tqdm(total=cfg.steps, initial=start_step, unit="step", disable=None if self.rank == 0 else True, mininterval=1.0)
        for step in range(start_step, cfg.steps):
            self.step = step
            self.lr_schedule.step(step)
            losses.append(pipeline.progress(batches)[0])  # the loss, detached and not read (a host sync on a GPU)
            progress.update(1)
            done, last = step + 1, step == cfg.steps - 1
            due_checkpoint = self.checkpoints.due(done, last)
            due_log = done % cfg.log_every == 0 or last
            due_eval = (cfg.eval_every and done % cfg.eval_every == 0) or last
            self._sync_replicas(done, scheduled=True)
            if due_checkpoint or due_log:
                window = torch.stack(losses).float()
                bad_step = bad_step if bad_step != NO_BAD_STEP else first_bad_step(window, first)
                self.checkpoints.stop_on_bad_loss(bad_step)
            move_to = None
            if due_log:
                record = self._log_window(done, window, progress)
                losses, first = [], done
                if self.tuner is not None:
                    move_to = self.tuner.after_window(done, record["step_ms"], cfg.steps, self.metrics.log, self.run_record)
            if due_checkpoint or move_to is not None:  # a move goes on from a checkpoint of this step
                self.metrics.log({"step": done, "checkpoint": str(self._save(done))})
            if move_to is not None:
                self.next_plan, self.stopped_at = move_to, done
                break
            if due_eval:
                self._evaluate(done, pipeline, resume_training=not last)
            if due_checkpoint or due_log or due_eval:
                self.timer.skip()  # logging, saving and evaluating are not training: no window counts them
            if not last and self.preemption.agreed(done):
                if losses:  # never a checkpoint of a model gone bad
                    bad_step = bad_step if bad_step != NO_BAD_STEP else first_bad_step(torch.stack(losses).float(), first)
                    self.checkpoints.stop_on_bad_loss(bad_step)
                self._stop(done, saved=due_checkpoint)
                break
        progress.close()
        if self.tiered is not None:
            self.tiered.flush()
        self.metrics.close()

    def _stop(self, step: int, saved: bool) -> None:
        """A signal asked the job to stop: the step just done is checkpointed (unless it was), so
        that a resume loses nothing."""
        path = None
        if self.checkpoints.config.directory is not None and (saved or self.config.checkpoint_on_signal):
            path = ckpt.step_dir(self.checkpoints.config.directory, step) if saved else self._save(step)
        self.metrics.log({"step": step, "stopped_by": self.preemption.signal_name or "a peer's signal",
                          "checkpoint": str(path) if path else None})
        self.preemption.record(step, path)

    def _sync_replicas(self, step: int, scheduled: bool = False) -> None:
        """2D: after each step (`scheduled`), the rows two replicas looked up, and every N steps every
        row one changed: the step's work, whose time counts as its `rest` and whose bytes count in
        the window. Before a checkpoint or an evaluation (which then read one model), every row one
        changed since the last sync: left out with what it precedes."""
        if self.replicas is None:
            return
        if scheduled:
            due = self.replicas.due(step)
            lr = self.config.embedding_lr * lr_factor(self.config, step - 1)  # the embedding rate of the step just done
            self.synced_bytes += self.replicas.after_step(lr, due)
            if due:
                self.synced_at = step
            self.timer.lap("rest")
        elif self.synced_at != step:
            self.replicas.sync()
            self.synced_at = step

    def _save(self, step: int) -> Path:
        self._sync_replicas(step)
        return self.checkpoints.save(step)

    def _log_window(self, step: int, losses: torch.Tensor, progress) -> dict:
        record = self.window.record(step, losses, self.pooling.take(), self.synced_bytes)
        self.synced_bytes = 0
        self.metrics.log(record)
        if self.tiered is not None:  # every rank's caches, summed over the window
            now = self.tiered.counters()
            summed = torch.tensor([now[k] - self._cache_before[k] for k in now], dtype=torch.int64)
            dist.all_reduce(summed, group=host_group())
            window = dict(zip(now, summed.tolist()))
            requests = window["cache_hits"] + window["cache_misses"]
            self.metrics.log({"step": step, **window, "cache_hit_rate": window["cache_hits"] / requests if requests else 1.0})
            self._cache_before = now
        progress.set_postfix(samples_per_s=f"{record['samples_per_s']:,.0f}")
        if self.rank == 0:
            tqdm.write(f"step {step}/{self.config.steps} loss {record['loss']:.4f} {record['samples_per_s']:,.0f} samples/s")
        return record

    def _evaluate(self, step: int, pipeline, resume_training: bool) -> dict:
        self._sync_replicas(step)
        pipeline.detach()  # the pipeline rewires forward; evaluation needs the plain one
        with self.meter.paused():
            record = {"step": step, **evaluate(self.model, self.eval_data, self.config.eval_batches, self.device, self.world)}
        self.metrics.log(record)
        if self.rank == 0:
            print(f"eval at step {step}: AUC {record['auc']:.4f} logloss {record['logloss']:.4f}", flush=True)
        self.model.train()
        if resume_training:
            pipeline.attach()
        return record


def first_bad_step(losses: torch.Tensor, first: int) -> int:
    """The 1-based step of the window's first non-finite loss (the window starts after step
    `first`), or NO_BAD_STEP."""
    finite = torch.isfinite(losses)
    return NO_BAD_STEP if bool(finite.all()) else first + int((~finite).nonzero()[0, 0]) + 1

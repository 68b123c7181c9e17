"""The trainer's flags and every check of them, torch-free: `dlrm-scale train` runs these
before torchrun starts, and each rank again before it joins a process group, so a mistake
is one line, not a traceback from every rank after minutes of start-up."""

from __future__ import annotations

import argparse
import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from dlrm_scale import options
from dlrm_scale.training.checkpoint_layout import candidates, saved_tables
from dlrm_scale.run_config import CheckpointConfig, Overrides, RetuneConfig, RunConfig, load_run_config
from planner.spec.errors import ConfigError
from planner.plan.document import Plan, check_plan_inputs, check_plan_tables
from planner.plan.inputs import PlanInputs
from planner.plan.replication import planned_problem
from planner.spec.schemes import TRAINABLE_EMBEDDING_OPTIMIZERS, check_precisions_trainable

DESCRIPTION = """Training entry point, launched with torchrun:

    torchrun --nproc_per_node 2 -m dlrm_scale.train --config configs/tiny.yaml --steps 100

Dense layers are data-parallel, embeddings model-parallel through TorchRec's
DistributedModelParallel with the plan from `--plan` (or planned on rank 0 and broadcast).
The plan never changes the model: initial tables, each table's optimizer and the global batch
of every step depend on the config and seed only, not on the plan or the world size. A 2D plan
(`dlrm-scale plan --sync-every N`) shards the tables over groups of G ranks, each group's
replica trained on its own samples; a row one replica changed is synced before another reads
it, a row two changed after the step, the rest every N steps: 1D's model whatever N.
Embedding optimizers are fused into the backward pass (FBGEMM); input distribution of the
next batch overlaps the current one (TrainPipelineSparseDist).
"""


TRAIN_FLAGS = ("--plan", "--ignore-plan-inputs", "--planner", "--steps", "--batch-size", "--comm-precision", "--embedding-optimizer",
               "--data", "--data-path", "--out-dir", "--seed", "--eval-every", "--no-pipeline", "--checkpoint-dir",
               "--checkpoint-every", "--keep-checkpoints", "--resume", "--resume-from", "--deterministic", "--no-checkpoint-on-signal", "--collective-timeout", "--store-dir",
               "--store-io", "--interaction", "--cpu-embeddings", "--retune", "--retune-warmup", "--retune-window", "--retune-times",
               "--retune-drift", "--drift-at", "--drift-grows")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dlrm_scale.train", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add(p, "--config", required=True)
    options.add_all(p, *TRAIN_FLAGS)
    return p.parse_args(argv)

@dataclass(frozen=True)
class TrainJob:
    """A checked training job: its run config and what the flags say beyond it."""

    run: RunConfig
    overrides: Overrides
    config_path: str
    plan_path: str | None
    planner: str
    data_path: str | None  # Criteo data; None: synthetic
    out_dir: Path
    resume: bool
    ignore_plan_inputs: bool = False
    collective_timeout_s: float = 300.0

    def on_cluster(self, world_size: int, ranks_per_node: int, device: str) -> RunConfig:
        """The run config on the job's real cluster (torchrun's ranks, torch's device)."""
        given = replace(self.overrides, world_size=world_size, ranks_per_node=ranks_per_node, device=device)
        return replace(load_run_config(self.config_path, given, self.run.checkpoint), retune=self.run.retune)


# What the trainer says to do with a plan made for other inputs.
PLAN_INPUTS_FIX = "re-plan for it with 'dlrm-scale plan', or pass --ignore-plan-inputs to train it anyway"


def check_given_plan(plan: Plan, job: TrainJob, run: RunConfig) -> str | None:
    """`--plan` against the run: its tables and world size always, the inputs it was made for
    unless --ignore-plan-inputs, which returns what differs (None: nothing) for the caller to say."""
    problem = planned_problem(run.problem, plan)  # a 2D plan's: one sharding group's
    if plan.replication is not None and run.retune.enabled:
        raise ConfigError(f"plan {job.plan_path} is 2D and --retune replans over every rank: drop --retune, or train a 1D plan")
    if not job.ignore_plan_inputs:
        check_plan_inputs(plan, problem, f"plan {job.plan_path}", PLAN_INPUTS_FIX)
        return None
    check_plan_tables(plan, problem)
    return plan.inputs.mismatch(PlanInputs.of(problem)) if plan.inputs is not None else None


def writable_dir(flag: str, path: Path) -> None:
    """Make `path` (a directory the job writes into) and prove it takes a file, before any work."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be written ({e.strerror}); choose another {flag}") from None


def local_device() -> str:
    import torch  # only to ask; the checks themselves need no torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_job(args: argparse.Namespace, device: str | None = None) -> TrainJob:
    """Every flag and config value the trainer reads, validated where it is read."""
    overrides = Overrides.from_args(args)
    resume = args.resume or args.resume_from is not None
    checkpoint = _checkpoint_config(args, resume)
    retune = _retune_config(args)
    if retune.enabled and checkpoint.directory is None:  # a move goes through a checkpoint; only a move writes one
        checkpoint = replace(checkpoint, directory=Path(args.out_dir) / "checkpoints", keep=1, final=False)
        writable_dir("--out-dir", checkpoint.directory)
    run = replace(load_run_config(args.config, overrides, checkpoint), retune=retune)
    if resume:
        check_resumable(run)
    training = run.problem.training
    check_precisions_trainable({}, training.fwd_comm_precision, training.bwd_comm_precision, device or local_device())
    run.model.embedding_dim(run.problem.tables)  # here, not once torchrun has started every rank
    unpooled = [t.name for t in run.problem.tables if not t.pooled]
    if unpooled:
        raise ConfigError(f"table {unpooled[0]!r} is unpooled (pooled: false, an EmbeddingCollection's); dlrm-scale train "
                          f"builds DLRM, whose tables are pooled: plan it with 'dlrm-scale plan' and train it in your own TorchRec code")
    shared = [t.name for t in run.problem.tables if t.outputs_per_sample != 1]
    if shared:
        raise ConfigError(f"table {shared[0]!r} has outputs_per_sample {run.problem.tables_by_name[shared[0]].outputs_per_sample:g}; "
                          f"dlrm-scale train builds DLRM, one feature per table: drop it, or train in your own TorchRec code")
    if training.embedding_optimizer not in TRAINABLE_EMBEDDING_OPTIMIZERS:
        raise ConfigError(f"training: embedding_optimizer must be one of {', '.join(TRAINABLE_EMBEDDING_OPTIMIZERS)} to train")
    if args.data == "criteo" and not args.data_path:
        raise ConfigError("--data criteo needs --data-path")
    if retune.enabled and retune.window_steps < 3 * run.train.log_every:
        raise ConfigError(f"--retune-window {retune.window_steps} covers fewer than 3 logging windows of {run.train.log_every} steps "
                          f"(train: log_every); raise --retune-window to {3 * run.train.log_every} or log more often")
    if args.data == "criteo" and args.drift_at is not None:
        raise ConfigError("--drift-at moves the hot ids of synthetic data; drop it with --data criteo")
    grows = run.train.drift_grows
    if grows is not None and grows[0] not in {t.name for t in run.problem.tables}:
        raise ConfigError(f"--drift-grows names table {grows[0]!r}, which the config does not have; name one of "
                          f"{', '.join(t.name for t in run.problem.tables[:5])}{', ...' if len(run.problem.tables) > 5 else ''}")
    if args.data_path is not None and not Path(args.data_path).exists():
        raise ConfigError(f"--data-path {args.data_path} does not exist; check the path")
    if args.plan is not None:
        Plan.load(args.plan)
    if not (math.isfinite(args.collective_timeout) and args.collective_timeout > 0):
        raise ConfigError(f"--collective-timeout must be a positive number of seconds, got {args.collective_timeout}")
    writable_dir("--out-dir", Path(args.out_dir))
    return TrainJob(run, overrides, args.config, args.plan, args.planner, args.data_path if args.data == "criteo" else None,
                    Path(args.out_dir), resume, args.ignore_plan_inputs, args.collective_timeout)


def check_resumable(run: RunConfig) -> None:
    """Before any rank starts: the checkpoint a resume takes holds this config's tables, by name
    and shape (the plan and world size may differ: loading reshards)."""
    found = candidates(run.checkpoint.directory, run.checkpoint.resume_from)  # newest first
    saved = saved_tables(found[0][1]) if found else None
    if saved is None:
        return
    here = {t.name: (t.num_embeddings, t.embedding_dim) for t in run.problem.tables}
    differ = [n for n in sorted(set(saved) | set(here)) if saved.get(n) != here.get(n)]
    if differ:
        n = differ[0]
        what = (f"table {n!r} is not in it" if n not in saved else f"it has table {n!r}, which this config lacks" if n not in here
                else f"table {n!r} is {saved[n][0]:,} x {saved[n][1]} there, {here[n][0]:,} x {here[n][1]} here")
        raise ConfigError(f"checkpoint {found[0][1]} cannot be resumed under this config: {what}; resume under the config it was "
                          f"saved with, or start afresh without --resume")


def _retune_config(args: argparse.Namespace) -> RetuneConfig:
    given = [f for f in ("warmup", "window", "times", "drift") if getattr(args, f"retune_{f}") != options.FLAGS[f"--retune-{f}"]["default"]]
    if given and not args.retune:
        raise ConfigError(f"--retune-{given[0]} applies with --retune; add --retune or drop it")
    return RetuneConfig(args.retune, args.retune_warmup, args.retune_window, args.retune_times, args.retune_drift)


def _checkpoint_config(args: argparse.Namespace, resume: bool) -> CheckpointConfig:
    if resume and not args.checkpoint_dir:
        raise ConfigError(f"{'--resume-from' if args.resume_from else '--resume'} needs --checkpoint-dir")
    if resume and not Path(args.checkpoint_dir).is_dir():
        raise ConfigError(f"--checkpoint-dir {args.checkpoint_dir} does not exist, so there is nothing to resume; "
                          f"check the path, or create it (a job restarted by torchrun resumes from it)")
    if args.checkpoint_dir:
        writable_dir("--checkpoint-dir", Path(args.checkpoint_dir))
    return CheckpointConfig(Path(args.checkpoint_dir) if args.checkpoint_dir else None, args.checkpoint_every,
                            args.keep_checkpoints, args.resume_from)

"""The trainer's flags and every check of them, torch-free: `dlrm-scale train` runs these
before torchrun starts, and each rank again before it joins a process group, so a mistake
is one line, not a traceback from every rank after minutes of start-up."""

from __future__ import annotations

import argparse
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from dlrm_scale.run_config import CPU_EMBEDDINGS, INTERACTIONS, STORE_IO, CheckpointConfig, Overrides, RunConfig, load_run_config
from planner.errors import ConfigError
from planner.plan import Plan, check_plan_inputs, check_plan_tables
from planner.plan_inputs import PlanInputs
from planner.schemes import TRAINABLE_EMBEDDING_OPTIMIZERS, check_precisions_trainable

DESCRIPTION = """Training entry point, launched with torchrun:

    torchrun --nproc_per_node 2 -m dlrm_scale.train --config configs/tiny.yaml --steps 100

Dense layers are data-parallel, embeddings model-parallel through TorchRec's
DistributedModelParallel with the plan from `--plan` (or planned on rank 0 and broadcast).
The plan never changes the model: initial tables, each table's optimizer and the global batch
of every step depend on the config and seed only, not on the plan or the world size.
Embedding optimizers are fused into the backward pass (FBGEMM); input distribution of the
next batch overlaps the current one (TrainPipelineSparseDist).
"""


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dlrm_scale.train", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (tables, training, model, train sections)")
    p.add_argument("--plan", help="plan JSON from 'dlrm-scale plan'; default: plan on rank 0 at start")
    p.add_argument("--ignore-plan-inputs", action="store_true",
                   help="train --plan though it was made for other inputs (another batch, precision or profile), e.g. to "
                        "compare precisions on one layout; what differs is printed (its tables and world size must still fit)")
    p.add_argument("--planner", choices=["ours", "torchrec"], default="ours",
                   help="who plans at start when no --plan is given (torchrec: its EmbeddingShardingPlanner)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int,
                   help="per rank; the global batch (this x ranks) of step s is a function of (seed, s) only, "
                        "so the same samples at any world size")
    p.add_argument("--comm-precision", help="e.g. fwd=fp16,bwd=bf16 (fp32, fp16, bf16, int8)")
    p.add_argument("--embedding-optimizer", choices=TRAINABLE_EMBEDDING_OPTIMIZERS)
    p.add_argument("--data", choices=["synthetic", "criteo"], default="synthetic")
    p.add_argument("--data-path", help="Criteo: a TSV file, a folder of TSV files, or TorchRec's preprocessed .npy folder")
    p.add_argument("--out-dir", default="out/train")
    p.add_argument("--seed", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--no-pipeline", action="store_true", help="plain forward/backward instead of TrainPipelineSparseDist")
    p.add_argument("--checkpoint-dir", help="where checkpoints go (one subfolder per saved step)")
    p.add_argument("--checkpoint-every", type=int, default=0, help="steps between checkpoints (0: only at the end)")
    p.add_argument("--keep-checkpoints", type=int, default=3)
    p.add_argument("--resume", action="store_true",
                   help="go on from the newest checkpoint in --checkpoint-dir (an existing directory) that verifies; "
                        "damaged ones are skipped, saying why")
    p.add_argument("--resume-from", metavar="STEP|PATH", help="go on from this checkpoint (a step, or a step_* folder) only")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels; log every step's exact loss (plans that sum in the same order give "
                        "bitwise equal losses, other plans and world sizes agree to about 1e-5)")
    p.add_argument("--store-dir", help="directory for the rows of tables the plan keeps on SSD (CPU tiering)")
    p.add_argument("--store-io", choices=STORE_IO,
                   help="the SSD store's reads: through the page cache with pread, copied from the files kept mapped "
                        "(mapped: no system call a row; the pages count in RSS), or O_DIRECT from the device "
                        "(default: the faster of pread and mapped on this machine, as calibrate measured)")
    p.add_argument("--interaction", choices=INTERACTIONS,
                   help="DLRM's dot interaction: dlrm_scale's symmetric backward or TorchRec's InteractionArch "
                        "(default: the faster on this machine, as calibrate measured)")
    p.add_argument("--cpu-embeddings", choices=CPU_EMBEDDINGS,
                   help="on CPU, dlrm_scale's row-wise Adagrad kernel and huge-page tables, or FBGEMM's kernel as TorchRec runs it "
                        "(default: the faster on this machine, as calibrate measured)")
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

    def on_cluster(self, world_size: int, ranks_per_node: int, device: str) -> RunConfig:
        """The run config on the job's real cluster (torchrun's ranks, torch's device)."""
        given = replace(self.overrides, world_size=world_size, ranks_per_node=ranks_per_node, device=device)
        return load_run_config(self.config_path, given, self.run.checkpoint)


# What the trainer says to do with a plan made for other inputs.
PLAN_INPUTS_FIX = "re-plan for it with 'dlrm-scale plan', or pass --ignore-plan-inputs to train it anyway"


def check_given_plan(plan: Plan, job: TrainJob, run: RunConfig) -> str | None:
    """`--plan` against the run: its tables and world size always, the inputs it was made for
    unless --ignore-plan-inputs, which returns what differs (None: nothing) for the caller to say."""
    if not job.ignore_plan_inputs:
        check_plan_inputs(plan, run.problem, f"plan {job.plan_path}", PLAN_INPUTS_FIX)
        return None
    check_plan_tables(plan, run.problem)
    return plan.inputs.mismatch(PlanInputs.of(run.problem)) if plan.inputs is not None else None


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
    run = load_run_config(args.config, overrides, checkpoint)
    training = run.problem.training
    check_precisions_trainable({}, training.fwd_comm_precision, training.bwd_comm_precision, device or local_device())
    if training.embedding_optimizer not in TRAINABLE_EMBEDDING_OPTIMIZERS:
        raise ConfigError(f"training: embedding_optimizer must be one of {', '.join(TRAINABLE_EMBEDDING_OPTIMIZERS)} to train")
    if args.data == "criteo" and not args.data_path:
        raise ConfigError("--data criteo needs --data-path")
    if args.data_path is not None and not Path(args.data_path).exists():
        raise ConfigError(f"--data-path {args.data_path} does not exist; check the path")
    if args.plan is not None:
        Plan.load(args.plan)
    writable_dir("--out-dir", Path(args.out_dir))
    return TrainJob(run, overrides, args.config, args.plan, args.planner, args.data_path if args.data == "criteo" else None,
                    Path(args.out_dir), resume, args.ignore_plan_inputs)


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

"""Training entry point, launched with torchrun:

    torchrun --nproc_per_node 2 -m dlrm_scale.train --config configs/tiny.yaml --steps 100

Dense layers are data-parallel, embeddings model-parallel through TorchRec's
DistributedModelParallel with the plan from `--plan` (or planned on rank 0 and broadcast).
The plan never changes the model: initial tables, each table's optimizer and the global batch
of every step depend on the config and seed only, not on the plan or the world size.
Embedding optimizers are fused into the backward pass (FBGEMM); input distribution of the
next batch overlaps the current one (TrainPipelineSparseDist).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import os
import signal
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist

from dlrm_scale.training.checkpoint import CheckpointConfig
from dlrm_scale.kernels.interaction import INTERACTIONS
from dlrm_scale.training.model import ModelConfig
from dlrm_scale.tiering.runtime import check_store_directory, resident_plan
from planner.config import DEFAULT_HARDWARE, hardware_path, load_problem, read_yaml, section_dataclass
from planner.errors import ConfigError, PlanFormatError, PlannerError
from planner.plan import Plan
from planner.planning import make_plan
from planner.specs import PRECISION_ELEMENT_BYTES, PlanningProblem

EMBEDDING_OPTIMIZERS = ("rowwise_adagrad", "adagrad", "sgd")
DENSE_OPTIMIZERS = ("adagrad", "sgd")
# dlrm_scale: our row-wise Adagrad kernel (dlrm_scale.kernels.cpu_adagrad), tables on huge pages
# (dlrm_scale.kernels.huge_pages); fbgemm: FBGEMM's kernel and plain pages, as TorchRec runs it.
CPU_EMBEDDINGS = ("dlrm_scale", "fbgemm")
# FBGEMM's fp8 codec fails on gloo and CPU tensors with a shape error (seen with fbgemm 1.8);
# its CUDA codec is the one FBGEMM ships for NCCL.
CPU_UNSUPPORTED_PRECISIONS = {"fp8": "FBGEMM's fp8 comm codec fails on CPU with a shape error in 1.8; use fp16, bf16 or int8"}


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
    batch_size: int = 256  # per rank
    embedding_lr: float = 0.05
    dense_lr: float = 0.05
    dense_optimizer: str = "adagrad"
    warmup_steps: int = 0
    decay_start_step: int = 0  # 0: no decay
    decay_steps: int = 0
    log_every: int = 10
    eval_every: int = 0  # 0: only at the end
    eval_batches: int = 8
    seed: int = 0
    pipeline: bool = True
    deterministic: bool = False  # deterministic kernels, every step's exact loss logged
    store_dir: str | None = None  # where cached tables planned on SSD keep their rows (CPU)
    prefetch_thread: bool = False  # read the next batch's missed rows in a thread (needs a spare core per rank)
    # batches made before the loop when the run's fit in this many MiB per rank (0: never), as a
    # reader of preprocessed data holds them; else made ahead by a worker thread, this many at a
    # time (0: inline, on the critical path)
    materialise_mib: int = 1024
    prefetch_batches: int = 4
    # CPU kernels: None takes what `dlrm-scale calibrate` measured faster on this machine (the
    # hardware profile's cpu_kernels), TorchRec's own where the profile has no measurement
    cpu_embeddings: str | None = None  # one of CPU_EMBEDDINGS
    interaction: str | None = None  # one of INTERACTIONS

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "log_every", "eval_batches"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"train: {name} must be positive, got {getattr(self, name)}")
        for name in ("warmup_steps", "decay_start_step", "decay_steps", "eval_every"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train: {name} must be >= 0, got {getattr(self, name)}")
        if self.dense_optimizer not in DENSE_OPTIMIZERS:
            raise ConfigError(f"train: dense_optimizer {self.dense_optimizer!r} is not one of {', '.join(DENSE_OPTIMIZERS)}")
        if self.cpu_embeddings is not None and self.cpu_embeddings not in CPU_EMBEDDINGS:
            raise ConfigError(f"train: cpu_embeddings {self.cpu_embeddings!r} is not one of {', '.join(CPU_EMBEDDINGS)}")
        if self.interaction is not None and self.interaction not in INTERACTIONS:
            raise ConfigError(f"train: interaction {self.interaction!r} is not one of {', '.join(INTERACTIONS)}")
        for name in ("prefetch_batches", "materialise_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"train: {name} must be an integer >= 0, got {value!r}")
        if not (self.embedding_lr > 0 and self.dense_lr > 0):
            raise ConfigError("train: learning rates must be > 0")

    def lr_factor(self, step: int) -> float:
        """MLPerf DLRM's schedule: linear warm-up, constant, then polynomial (power 2) decay."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        if self.decay_steps and step >= self.decay_start_step:
            done = min(step - self.decay_start_step, self.decay_steps)
            return (1 - done / self.decay_steps) ** 2
        return 1.0


def parse_comm_precision(text: str) -> tuple[str, str]:
    """'fwd=fp16,bwd=bf16' or 'fp16' (both directions); each direction given at most once."""
    parts: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        key, _, value = part.rpartition("=") if "=" in part else ("both", "", part)
        if key not in ("fwd", "bwd", "both"):
            raise ConfigError(f"--comm-precision: {key!r} is not a direction; write fwd=P,bwd=P or one precision for both")
        if key in parts or (key == "both" and parts) or (key != "both" and "both" in parts):
            raise ConfigError(f"--comm-precision {text!r} gives a direction twice; write fwd=P,bwd=P or one precision for both")
        parts[key] = value
    fwd = parts.get("fwd", parts.get("both", "fp32"))
    bwd = parts.get("bwd", parts.get("both", "fp32"))
    for p in (fwd, bwd):
        if p not in PRECISION_ELEMENT_BYTES:
            raise ConfigError(f"--comm-precision: {p!r} is not one of {', '.join(PRECISION_ELEMENT_BYTES)}")
    return fwd, bwd


def check_precision_device(fwd: str, bwd: str, device: str) -> None:
    for p in (fwd, bwd):
        if device == "cpu" and p in CPU_UNSUPPORTED_PRECISIONS:
            raise ConfigError(f"--comm-precision: {p} is refused on CPU: {CPU_UNSUPPORTED_PRECISIONS[p]}")


ROW_WISE_SCHEMES = ("row_wise", "table_row_wise")


def check_precision_supported(plan: Plan, fwd: str, bwd: str) -> None:
    """FBGEMM 1.8's int8 codec needs a quantization context that TorchRec's reduce-scatter
    (used by the row-wise schemes) does not pass: it fails with 'Unexpected None'."""
    if "int8" in (fwd, bwd):
        rw = [n for n, t in plan.tables.items() if t.sharding_type in ROW_WISE_SCHEMES]
        if rw:
            raise ConfigError(
                f"int8 comms cannot run with row-wise table '{rw[0]}' (FBGEMM's int8 codec fails in TorchRec's "
                f"reduce-scatter); use --comm-precision fwd=fp16,bwd=bf16, or a plan without row-wise tables"
            )


def check_plan_matches(plan: Plan, problem: PlanningProblem, world_size: int) -> None:
    if plan.world_size != world_size:
        raise PlanFormatError(f"plan is for {plan.world_size} ranks but the job has {world_size}; re-plan with --world-size {world_size}")
    for t in problem.tables:
        tp = plan.tables.get(t.name)
        if tp is None:
            raise PlanFormatError(f"plan has no table '{t.name}'; re-plan for this config")
        if (tp.num_embeddings, tp.embedding_dim) != (t.num_embeddings, t.embedding_dim):
            raise PlanFormatError(
                f"plan's table '{t.name}' is {tp.num_embeddings}x{tp.embedding_dim} but the model's is "
                f"{t.num_embeddings}x{t.embedding_dim}; re-plan for this config"
            )
    extra = set(plan.tables) - set(problem.tables_by_name)
    if extra:
        raise PlanFormatError(f"plan has table '{sorted(extra)[0]}' that the model lacks; re-plan for this config")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dlrm_scale.train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="YAML config (tables, training, model, train sections)")
    p.add_argument("--plan", help="plan JSON from 'dlrm-scale plan'; default: plan on rank 0 at start")
    p.add_argument("--planner", choices=["ours", "torchrec"], default="ours",
                   help="who plans at start when no --plan is given (torchrec: its EmbeddingShardingPlanner)")
    p.add_argument("--steps", type=int)
    p.add_argument("--batch-size", type=int,
                   help="per rank; the global batch (this x ranks) of step s is a function of (seed, s) only, "
                        "so the same samples at any world size")
    p.add_argument("--comm-precision", help="e.g. fwd=fp16,bwd=bf16 (fp32, fp16, bf16, int8)")
    p.add_argument("--embedding-optimizer", choices=EMBEDDING_OPTIMIZERS)
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
    p.add_argument("--interaction", choices=INTERACTIONS,
                   help="DLRM's dot interaction: dlrm_scale's symmetric backward or TorchRec's InteractionArch "
                        "(default: the faster on this machine, as calibrate measured)")
    p.add_argument("--cpu-embeddings", choices=CPU_EMBEDDINGS,
                   help="on CPU, dlrm_scale's row-wise Adagrad kernel and huge-page tables, or FBGEMM's kernel as TorchRec runs it "
                        "(default: the faster on this machine, as calibrate measured)")
    return p.parse_args(argv)


# Where a hardware profile has no measured choice: the kernels TorchRec runs.
UNMEASURED_CPU_KERNELS = {"embeddings": "fbgemm", "interaction": "torchrec"}
CPU_KERNEL_CHOICES = {"embeddings": CPU_EMBEDDINGS, "interaction": INTERACTIONS}


def measured_cpu_kernels(doc: dict) -> dict[str, str]:
    """The CPU kernels `dlrm-scale calibrate` measured faster on this machine (the hardware
    profile's `cpu_kernels`), TorchRec's own for any it did not measure."""
    path = hardware_path(str(doc.get("hardware", DEFAULT_HARDWARE)))
    measured = read_yaml(path, "hardware profile").get("cpu_kernels") or {}
    if not isinstance(measured, dict) or any(k not in CPU_KERNEL_CHOICES or v not in CPU_KERNEL_CHOICES[k] for k, v in measured.items()):
        raise ConfigError(f"hardware profile {path}: cpu_kernels must map embeddings to one of {', '.join(CPU_EMBEDDINGS)} "
                          f"and interaction to one of {', '.join(INTERACTIONS)}; re-run dlrm-scale calibrate --kernels-only")
    return {**UNMEASURED_CPU_KERNELS, **measured}


def load_train_config(doc: dict, args: argparse.Namespace, batch_size: int) -> TrainConfig:
    config = section_dataclass(doc, "train", TrainConfig, "config", batch_size=batch_size)
    overrides = {k: v for k, v in (("steps", args.steps), ("batch_size", args.batch_size), ("seed", args.seed),
                                   ("eval_every", args.eval_every), ("store_dir", args.store_dir),
                                   ("cpu_embeddings", args.cpu_embeddings), ("interaction", args.interaction)) if v is not None}
    if args.no_pipeline:
        overrides["pipeline"] = False
    if args.deterministic:
        overrides.update(deterministic=True, log_every=1)
    config = replace(config, **overrides)
    if config.cpu_embeddings is None or config.interaction is None:
        measured = measured_cpu_kernels(doc)
        config = replace(config, cpu_embeddings=config.cpu_embeddings or measured["embeddings"],
                         interaction=config.interaction or measured["interaction"])
    return config


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def die_with_launcher() -> None:
    """torchrun starts each worker in a process group of its own, so killing the launcher's
    group would leave the workers training, and writing checkpoints, on their own: ask the
    kernel to kill this worker when its parent (torchrun's agent) dies."""
    if sys.platform.startswith("linux"):
        parent = os.getppid()
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the agent died before the request took effect
            os._exit(1)


def init_distributed() -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ:
        raise ConfigError("not started by torchrun: use 'torchrun --nproc_per_node N -m dlrm_scale.train ...' or 'dlrm-scale train'")
    die_with_launcher()
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent hosts the store; otherwise rank 0 does. Keys live under the restart
    # round, so workers restarted by --max-restarts never read the dead round's addresses.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=datetime.timedelta(minutes=10))
    round_prefix = f"dlrm_scale/round{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    dist.init_process_group(backend="nccl" if cuda else "gloo", store=dist.PrefixStore(round_prefix, store),
                            rank=rank, world_size=world)
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return rank, dist.get_world_size(), device


@dataclass(frozen=True)
class RunSettings:
    """Everything the flags and the config say, checked before any process group or long work."""

    doc: dict
    training_overrides: dict
    model: ModelConfig
    train: TrainConfig
    checkpoint: CheckpointConfig
    resume: bool


def _writable_dir(flag: str, path: Path) -> None:
    """Make `path` (a directory the job writes into) and prove it takes a file, before any work."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {path} cannot be written ({e.strerror}); choose another {flag}") from None


def check_settings(args: argparse.Namespace) -> RunSettings:
    """Every flag and config value the trainer reads, validated where it is read: a mistake is
    one line here, not a traceback from every rank after minutes of start-up."""
    doc = read_yaml(Path(args.config), "config")
    training_overrides = {}
    if args.batch_size is not None:
        if args.batch_size <= 0:
            raise ConfigError(f"--batch-size must be a positive integer, got {args.batch_size}")
        training_overrides["batch_size_per_rank"] = args.batch_size
    if args.embedding_optimizer:
        training_overrides["embedding_optimizer"] = args.embedding_optimizer
    if args.comm_precision is not None:
        fwd, bwd = parse_comm_precision(args.comm_precision)
        training_overrides.update(fwd_comm_precision=fwd, bwd_comm_precision=bwd)
    problem = load_problem(args.config, training_overrides=training_overrides)  # the sections' own checks
    check_precision_device(problem.training.fwd_comm_precision, problem.training.bwd_comm_precision,
                           "cuda" if torch.cuda.is_available() else "cpu")
    if problem.training.embedding_optimizer not in EMBEDDING_OPTIMIZERS:
        raise ConfigError(f"training: embedding_optimizer must be one of {', '.join(EMBEDDING_OPTIMIZERS)} to train")
    model = section_dataclass(doc, "model", ModelConfig, "config")
    train = load_train_config(doc, args, problem.training.batch_size_per_rank)
    if args.data == "criteo" and not args.data_path:
        raise ConfigError("--data criteo needs --data-path")
    if args.data_path is not None and not Path(args.data_path).exists():
        raise ConfigError(f"--data-path {args.data_path} does not exist; check the path")
    if args.plan is not None:
        Plan.load(args.plan)
    _writable_dir("--out-dir", Path(args.out_dir))
    resume = args.resume or args.resume_from is not None
    if resume and not args.checkpoint_dir:
        raise ConfigError(f"{'--resume-from' if args.resume_from else '--resume'} needs --checkpoint-dir")
    if resume and not Path(args.checkpoint_dir).is_dir():
        raise ConfigError(f"--checkpoint-dir {args.checkpoint_dir} does not exist, so there is nothing to resume; "
                          f"check the path, or create it (a job restarted by torchrun resumes from it)")
    if args.checkpoint_dir:
        _writable_dir("--checkpoint-dir", Path(args.checkpoint_dir))
    checkpoint = CheckpointConfig(Path(args.checkpoint_dir) if args.checkpoint_dir else None, args.checkpoint_every,
                                  args.keep_checkpoints, args.resume_from)
    return RunSettings(doc, training_overrides, model, train, checkpoint, resume)


def main(argv: list[str] | None = None) -> int:
    try:
        from dlrm_scale.training.trainer import Trainer

        args = parse_args(argv)
        settings = check_settings(args)
        rank, world, device = init_distributed()
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        problem = load_problem(
            args.config,
            cluster_overrides={"world_size": world, "ranks_per_node": local, "device": device.type},
            training_overrides=settings.training_overrides,
        )
        train_config = settings.train
        plan = obtain_plan(args.plan, args.planner, problem, rank, world)
        check_precision_supported(plan, problem.training.fwd_comm_precision, problem.training.bwd_comm_precision)
        if device.type == "cpu":
            resident_plan(plan)  # a cached table that cannot be cached on CPU is one line, here
            check_store_directory(plan, [rank], Path(train_config.store_dir) if train_config.store_dir else None,
                                  problem.training.embedding_optimizer)
        out_dir = Path(args.out_dir)
        if rank == 0:
            out_dir.mkdir(parents=True, exist_ok=True)
            plan.save(out_dir / "plan.json")
        trainer = Trainer(problem, plan, settings.model, train_config, device, rank, world, out_dir,
                          data_path=args.data_path if args.data == "criteo" else None, checkpoint=settings.checkpoint,
                          resume=settings.resume)
        trainer.run()
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except PlannerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def obtain_plan(path: str | None, planner: str, problem: PlanningProblem, rank: int, world: int) -> Plan:
    """The given plan, validated against the model; or one made on rank 0 and broadcast."""
    if path:
        plan = Plan.load(path)
    else:
        box = [None]
        if rank == 0:
            if planner == "torchrec":
                from dlrm_scale.bridge.torchrec_cost import torchrec_planner_plan

                box[0] = torchrec_planner_plan(problem)[0].to_dict()
            else:
                box[0] = make_plan(problem).to_dict()
        dist.broadcast_object_list(box, src=0)
        plan = Plan.from_dict(box[0], source="broadcast plan")
    check_plan_matches(plan, problem, world)
    return plan


if __name__ == "__main__":
    sys.exit(main())

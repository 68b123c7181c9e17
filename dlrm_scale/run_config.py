"""The run's configuration: one torch-free reader of a YAML config and of every entry point's
flags, so each setting has one home and one check.

A config's sections, each owned by one validated dataclass:
  hardware, cluster, training, tables | tables_csv, tiering -> the planner's PlanningProblem
      (planner.spec.config); the per-rank batch size lives in training.batch_size_per_rank only
  model -> ModelConfig;  train -> TrainConfig
Flags come in as `Overrides`, merged once, here. A key no section reads is refused.
"""

from __future__ import annotations

import math
import platform
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from planner.spec.config import PLANNER_SECTIONS, hardware_path, problem_from_doc, profile_file, read_yaml, section_dataclass
from planner.spec.config import load_problem as planner_load_problem
from planner.spec.errors import ConfigError
from planner.spec.specs import GIB, PRECISION_ELEMENT_BYTES, TieringSpec, check_keys
from planner.spec.problem import PlanningProblem

RUN_SECTIONS = ("model", "train")
ARCHS = ("dlrm", "dcnv2")
DENSE_OPTIMIZERS = ("adagrad", "sgd")
# dlrm_scale: our row-wise Adagrad kernel and tables on huge pages (dlrm_scale.kernels);
# fbgemm: FBGEMM's kernel and plain pages, as TorchRec runs it.
CPU_EMBEDDINGS = ("dlrm_scale", "fbgemm")
INTERACTIONS = ("dlrm_scale", "torchrec")  # DLRM's dot interaction: ours (kernels.interaction) or TorchRec's
# The SSD store's reads: from the page cache with pread, or copied from the files kept mapped
# (the same page cache without a system call a row; the mapped pages count in the trainer's
# RSS), both measured by calibrate; or O_DIRECT from the device (figures of the disk itself).
STORE_IO = ("pread", "mapped", "direct")
CPU_KERNEL_CHOICES = {"embeddings": CPU_EMBEDDINGS, "interaction": INTERACTIONS, "store_io": ("pread", "mapped")}
# Where a hardware profile has no measured choice: the kernels TorchRec runs, and pread (the
# store's pages never count as the trainer's memory).
UNMEASURED_CPU_KERNELS = {"embeddings": "fbgemm", "interaction": "torchrec", "store_io": "pread"}


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "dlrm"
    num_dense_features: int = 13
    dense_arch: tuple[int, ...] = (512, 256, 64)
    over_arch: tuple[int, ...] = (512, 256, 1)
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 512

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ConfigError(f"model: arch {self.arch!r} is not one of {', '.join(ARCHS)}")
        if self.num_dense_features <= 0:
            raise ConfigError("model: num_dense_features must be positive")
        if not self.dense_arch or not self.over_arch or any(x <= 0 for x in (*self.dense_arch, *self.over_arch)):
            raise ConfigError("model: dense_arch and over_arch need positive layer sizes")
        if self.over_arch[-1] != 1:
            raise ConfigError(f"model: over_arch must end in 1 (one logit), got {list(self.over_arch)}")
        object.__setattr__(self, "dense_arch", tuple(self.dense_arch))
        object.__setattr__(self, "over_arch", tuple(self.over_arch))

    def embedding_dim(self, tables) -> int:
        """The one embedding dimension the model's interaction takes, or one line: DLRM's
        interaction (and DCN's cross layers) pair every table's pooled vector with the dense one."""
        dims = {t.embedding_dim for t in tables}
        if len(dims) != 1:
            raise ConfigError(f"model: DLRM's interaction needs one embedding_dim for all tables, got {sorted(dims)}")
        return dims.pop()


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 100
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
    checkpoint_on_signal: bool = True  # SIGTERM/SIGINT: stop at an agreed step with a checkpoint of it (when there is a directory)
    store_dir: str | None = None  # where cached tables planned on SSD keep their rows (CPU)
    prefetch_thread: bool = False  # read the next batch's missed rows in a thread (needs a spare core per rank)
    store_io: str | None = None  # one of STORE_IO: how the SSD store reads rows (None: as cpu_kernels says)
    # batches made before the loop when the run's fit in this many MiB per rank (0: never), as a
    # reader of preprocessed data holds them; else made ahead by a worker thread, this many at a
    # time (0: inline, on the critical path)
    materialise_mib: int = 1024
    prefetch_batches: int = 4
    # CPU kernels: None takes what `dlrm-scale calibrate` measured faster on this machine (the
    # hardware profile's cpu_kernels), TorchRec's own where the profile has no measurement
    cpu_embeddings: str | None = None  # one of CPU_EMBEDDINGS
    interaction: str | None = None  # one of INTERACTIONS
    drift_at_step: int = 0  # synthetic data: from this step on every table's hot ids move (0: never)
    # synthetic data, from drift_at_step on: (table, factor) whose bags grow that many times longer,
    # in place of the hot ids moving (a table that grows hot)
    drift_grows: tuple[str, float] | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "log_every", "eval_batches"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"train: {name} must be positive, got {getattr(self, name)}")
        for name in ("warmup_steps", "decay_start_step", "decay_steps", "eval_every", "drift_at_step"):
            if getattr(self, name) < 0:
                raise ConfigError(f"train: {name} must be >= 0, got {getattr(self, name)}")
        if self.dense_optimizer not in DENSE_OPTIMIZERS:
            raise ConfigError(f"train: dense_optimizer {self.dense_optimizer!r} is not one of {', '.join(DENSE_OPTIMIZERS)}")
        if self.cpu_embeddings is not None and self.cpu_embeddings not in CPU_EMBEDDINGS:
            raise ConfigError(f"train: cpu_embeddings {self.cpu_embeddings!r} is not one of {', '.join(CPU_EMBEDDINGS)}")
        if self.interaction is not None and self.interaction not in INTERACTIONS:
            raise ConfigError(f"train: interaction {self.interaction!r} is not one of {', '.join(INTERACTIONS)}")
        if self.store_io is not None and self.store_io not in STORE_IO:
            raise ConfigError(f"train: store_io {self.store_io!r} is not one of {', '.join(STORE_IO)}")
        for name in ("prefetch_batches", "materialise_mib"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"train: {name} must be an integer >= 0, got {value!r}")
        if not (self.embedding_lr > 0 and self.dense_lr > 0):
            raise ConfigError("train: learning rates must be > 0")
        if self.drift_grows is not None:
            grows = self.drift_grows
            if not (isinstance(grows, (tuple, list)) and len(grows) == 2 and isinstance(grows[0], str)
                    and isinstance(grows[1], (int, float)) and not isinstance(grows[1], bool) and math.isfinite(grows[1]) and grows[1] > 0):
                raise ConfigError(f"train: drift_grows must be [TABLE, FACTOR > 0] (the flag: --drift-grows TABLE=FACTOR), got {grows!r}")
            if not self.drift_at_step:
                raise ConfigError(f"--drift-grows {grows[0]}={grows[1]:g} applies at --drift-at STEP; add --drift-at")


@dataclass(frozen=True)
class RetuneConfig:
    """The job measures itself, refits its profile, replans and reshards (dlrm_scale.tuning):
    after `warmup_steps`, `window_steps` are measured; the next measurement starts when a
    window's step drifts more than `drift` from the refitted prediction; at most `times`
    decisions in a run."""

    enabled: bool = False
    warmup_steps: int = 20
    window_steps: int = 100
    times: int = 3
    drift: float = 0.15

    def __post_init__(self) -> None:
        for name in ("warmup_steps", "window_steps", "times"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < (0 if name == "warmup_steps" else 1):
                raise ConfigError(f"--retune-{name.split('_')[0]}: must be a whole number >= {0 if name == 'warmup_steps' else 1}, got {value!r}")
        if not (isinstance(self.drift, (int, float)) and 0 < self.drift < 10):
            raise ConfigError(f"--retune-drift must be a fraction > 0 such as 0.15, got {self.drift!r}")


@dataclass(frozen=True)
class CheckpointConfig:
    directory: Path | None = None
    every_steps: int = 0  # 0: only at the end
    keep: int = 3
    resume_from: str | None = None  # a step or a checkpoint path; None: the newest that verifies
    final: bool = True  # a checkpoint of the last step (False: only the moves of --retune write one)

    def __post_init__(self) -> None:
        if self.every_steps < 0:
            raise ConfigError(f"--checkpoint-every must be >= 0, got {self.every_steps}")
        if self.keep < 1:
            raise ConfigError(f"--keep-checkpoints must be >= 1, got {self.keep}")


def parse_drift_grows(text: str) -> tuple[str, float]:
    """'TABLE=FACTOR' (--drift-grows): the table and how many times longer its bags grow."""
    table, _, factor = text.rpartition("=")
    try:
        value = float(factor)
    except ValueError:
        value = float("nan")
    if not table or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--drift-grows takes TABLE=FACTOR with a factor > 0, such as t0=8; got {text!r}")
    return table, value


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


# Overrides' fields whose argparse dest differs from the field's name.
_FLAG_DEST = {"tables_csv": "tables"}


@dataclass(frozen=True)
class Overrides:
    """What an entry point's flags say about the config (None, False: not given)."""

    tables_csv: str | None = None
    hardware: str | None = None
    stats: str | None = None
    world_size: int | None = None
    ranks_per_node: int | None = None
    hbm_gb: float | None = None
    device: str | None = None
    batch_size: int | None = None  # per rank
    comm_precision: str | None = None
    embedding_optimizer: str | None = None
    steps: int | None = None
    seed: int | None = None
    eval_every: int | None = None
    store_dir: str | None = None
    store_io: str | None = None
    cpu_embeddings: str | None = None
    interaction: str | None = None
    no_pipeline: bool = False
    deterministic: bool = False
    no_checkpoint_on_signal: bool = False
    drift_at: int | None = None
    drift_grows: str | None = None  # TABLE=FACTOR

    @classmethod
    def from_args(cls, args: Any, **given: Any) -> Overrides:
        """The flags an argparse namespace has (a command has only some), and `given` on top."""
        values = {f.name: getattr(args, _FLAG_DEST.get(f.name, f.name), None) for f in fields(cls)}
        values = {k: v for k, v in values.items() if v is not None}
        return cls(**{**values, **given})

    def __post_init__(self) -> None:
        if self.batch_size is not None and self.batch_size <= 0:
            raise ConfigError(f"--batch-size must be a positive integer, got {self.batch_size}")
        if self.hbm_gb is not None and not (math.isfinite(self.hbm_gb) and 0 < self.hbm_gb <= 2**20):
            raise ConfigError(f"--hbm-gb must be a positive number of GiB, got {self.hbm_gb}")
        if self.comm_precision is not None:
            parse_comm_precision(self.comm_precision)
        if self.drift_grows is not None:
            parse_drift_grows(self.drift_grows)

    def cluster(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("world_size", "ranks_per_node", "device") if getattr(self, k) is not None}
        if self.hbm_gb is not None:
            out["hbm_bytes_per_rank"] = int(self.hbm_gb * GIB)
        return out

    def training(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.batch_size is not None:
            out["batch_size_per_rank"] = self.batch_size
        if self.embedding_optimizer is not None:
            out["embedding_optimizer"] = self.embedding_optimizer
        if self.comm_precision is not None:
            out["fwd_comm_precision"], out["bwd_comm_precision"] = parse_comm_precision(self.comm_precision)
        return out

    def train(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in ("steps", "seed", "eval_every", "store_dir", "store_io", "cpu_embeddings", "interaction")
               if getattr(self, k) is not None}
        if self.no_pipeline:
            out["pipeline"] = False
        if self.deterministic:
            out.update(deterministic=True, log_every=1)
        if self.no_checkpoint_on_signal:
            out["checkpoint_on_signal"] = False
        if self.drift_at is not None:
            out["drift_at_step"] = self.drift_at
        if self.drift_grows is not None:
            out["drift_grows"] = parse_drift_grows(self.drift_grows)
        return out


@dataclass(frozen=True)
class RunConfig:
    """Everything a run is: what to plan, the model, how to train it, where checkpoints go."""

    problem: PlanningProblem  # hardware, cluster, training (the batch size), tables, tiering
    model: ModelConfig = ModelConfig()
    train: TrainConfig = TrainConfig()
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profile: Path | None = None  # the hardware profile file it is priced with (None: a problem built in code)
    retune: RetuneConfig = RetuneConfig()
    # the CPU kernel kinds (of CPU_KERNEL_CHOICES) no flag or config named: the profile's choice
    kernels_from_profile: tuple[str, ...] = ()

    @property
    def tiering(self) -> TieringSpec:
        return self.problem.tiering

    @property
    def batch_size_per_rank(self) -> int:
        return self.problem.training.batch_size_per_rank


def load_run_config(config_path: str | Path | None, overrides: Overrides = Overrides(),
                    checkpoint: CheckpointConfig = CheckpointConfig()) -> RunConfig:
    """The run a config file (optional with --tables) and flags describe, every section checked.

    Precedence: flags over the config's sections over the hardware profile."""
    doc: dict[str, Any] = {}
    where, base = "flags", Path.cwd()
    if config_path is not None:
        doc = read_yaml(Path(config_path), "config")
        where, base = f"config {config_path}", Path(config_path).parent
        check_keys(doc, PLANNER_SECTIONS + RUN_SECTIONS, where)
    problem = problem_from_doc(doc, where, base, overrides.tables_csv, overrides.hardware, overrides.cluster(),
                               overrides.training(), overrides.stats)
    model = section_dataclass(doc, "model", ModelConfig, "config")
    profile = profile_file(doc, where, overrides.hardware)
    train, from_profile = train_config(doc, overrides, profile)
    return RunConfig(problem, model, train, checkpoint, profile, kernels_from_profile=from_profile)


# each kind of CPU_KERNEL_CHOICES: the TrainConfig field that runs it
KERNEL_FIELDS = {"embeddings": "cpu_embeddings", "interaction": "interaction", "store_io": "store_io"}


def train_config(doc: dict[str, Any], overrides: Overrides, profile: Path) -> tuple[TrainConfig, tuple[str, ...]]:
    """The train section with flags over it, each CPU kernel no flag or config named taken from
    the profile (measured_cpu_kernels); and those kinds."""
    section = doc.get("train")
    if isinstance(section, dict) and "batch_size" in section:
        raise ConfigError("config: train: batch_size has one home, training: {batch_size_per_rank: N}; move it there")
    config = replace(section_dataclass(doc, "train", TrainConfig, "config"), **overrides.train())
    unset = tuple(kind for kind, name in KERNEL_FIELDS.items() if getattr(config, name) is None)
    if unset:
        measured = measured_cpu_kernels(profile)
        config = replace(config, **{KERNEL_FIELDS[kind]: measured[kind] for kind in unset})
    return config, unset


def measured_cpu_kernels(hardware: Any) -> dict[str, str]:
    """The CPU kernels `dlrm-scale calibrate` measured faster on this machine (the hardware
    profile's `cpu_kernels`), TorchRec's own for any it did not measure."""
    path = hardware_path(str(hardware))
    measured = read_yaml(path, "hardware profile").get("cpu_kernels") or {}
    if not isinstance(measured, dict) or any(k not in CPU_KERNEL_CHOICES or v not in CPU_KERNEL_CHOICES[k] for k, v in measured.items()):
        raise ConfigError(f"hardware profile {path}: cpu_kernels must map embeddings to one of {', '.join(CPU_EMBEDDINGS)}, "
                          f"interaction to one of {', '.join(INTERACTIONS)} and store_io to one of "
                          f"{', '.join(CPU_KERNEL_CHOICES['store_io'])}; re-run dlrm-scale calibrate --kernels-only")
    return {**UNMEASURED_CPU_KERNELS, **measured}


def this_cpu() -> str:
    """This machine's CPU as a calibrated profile records it (`measured_on`): /proc/cpuinfo's model
    name with its family and model numbers (a VM's model name can be as bare as "Intel(R) Xeon(R)
    Processor"), else what `platform` knows."""
    try:
        first = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in first.splitlines())}
    name = info.get("model name") or platform.processor() or platform.machine()
    return f"{name} (family {info['cpu family']}, model {info['model']})" if "cpu family" in info and "model" in info else name


def measured_on(hardware: Any) -> str | None:
    """The CPU a hardware profile records it was measured on (its `measured_on`; None: not recorded)."""
    value = read_yaml(hardware_path(str(hardware)), "hardware profile").get("measured_on")
    return None if value is None else str(value)


def measured_here(hardware: Any) -> bool:
    """Whether a hardware profile records this CPU as the one it was measured on."""
    return measured_on(hardware) == this_cpu()


def measured_elsewhere(hardware: Any) -> str | None:
    """Where a hardware profile was measured on another CPU than this one (its `measured_on`), what
    to say: its CPU kernels and constants are that machine's (FBGEMM's embedding kernel, chosen on
    an AMD EPYC, took 3.4x ours on an Intel Xeon). None where the same or not recorded."""
    where, here = measured_on(hardware), this_cpu()
    if where is None or where == here:
        return None
    path = hardware_path(str(hardware))
    return (f"hardware profile {path} was measured on {where}, this machine is {here}: its cpu_kernels and "
            f"constants may not hold here; run 'dlrm-scale calibrate --kernels-only --out {path}' (or a full calibrate)")


def load_problem(config_path: str | Path | None = None, tables_csv: str | Path | None = None, hardware: str | None = None,
                 cluster_overrides: dict[str, Any] | None = None, training_overrides: dict[str, Any] | None = None,
                 stats_path: str | Path | None = None) -> PlanningProblem:
    """The planner's problem of a dlrm-scale config (planner.spec.config.load_problem, with this
    module's sections allowed beside the planner's): for benchmarks and notebooks."""
    return planner_load_problem(config_path, tables_csv, hardware, cluster_overrides, training_overrides, stats_path,
                                other_sections=RUN_SECTIONS)

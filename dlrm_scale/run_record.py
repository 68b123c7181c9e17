"""What a run records, torch-free: the trainer's phase names, the cost model's groups of them,
and the run itself as a document (the first line of metrics.jsonl), read back by the analysis
tools (`fit`, `simulate --measured`, `calibrate --from-runs`) on machines without torch.
What each phase holds is told where it is timed (dlrm_scale/training/phases.py)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from dlrm_scale.run_config import RUN_SECTIONS, ModelConfig, Overrides, RunConfig, train_config
from planner.spec.config import PLANNER_SECTIONS, problem_from_doc, profile_file, section_dataclass
from planner.spec.errors import ConfigError
from planner.spec.specs import check_keys

PHASES = ("data", "input_dist", "emb_fwd", "a2a_fwd", "dense_fwd", "dense_bwd", "a2a_bwd", "emb_bwd_opt",
          "dense_allreduce", "optimizer", "tiering", "rest")

# What the cost model predicts, by the trainer's phases it is measured in. A data-parallel
# table trains as TorchRec trains it, as a dense parameter: its update runs with the dense
# optimizer and its gradient joins DDP's all-reduce, so those parts of its cost count there.
PHASE_GROUPS = {
    "input_dist": ("input_dist",),
    "embedding": ("emb_fwd", "emb_bwd_opt", "tiering"),
    "a2a_fwd": ("a2a_fwd",),
    "a2a_bwd": ("a2a_bwd",),
    "dense": ("dense_fwd", "dense_bwd", "optimizer"),
    "all_reduce": ("dense_allreduce",),
    "other": ("data", "rest"),
}
COLLECTIVE_GROUPS = ("input_dist", "a2a_fwd", "a2a_bwd", "all_reduce")  # batched collectives: once a step per sharding type (all-reduce: once)


RUN_RECORD_SCHEMA = "dlrm-scale/run/v1"


def run_document(run: RunConfig) -> dict[str, Any]:
    """The run as a config document (what metrics.jsonl records at its start), so a run can be
    re-costed later (`calibrate --from-runs`, `simulate --measured`) through the same reader
    and checks as a config file."""
    problem = run.problem
    tables = [{k: v for k, v in asdict(t).items() if v is not None} for t in problem.tables]
    return {
        "schema": RUN_RECORD_SCHEMA,
        "hardware": problem.cluster.name,
        "cluster": {"world_size": problem.cluster.world_size, "ranks_per_node": problem.cluster.ranks_per_node},
        "training": asdict(problem.training),
        "tiering": _as_section(problem.tiering),
        "model": _as_section(run.model),
        "train": {"cpu_embeddings": run.train.cpu_embeddings, "interaction": run.train.interaction, "store_io": run.train.store_io},
        "tables": tables,
    }


def _as_section(spec: Any) -> dict[str, Any]:
    """A frozen dataclass as its config section would write it (tuples as lists, as JSON has)."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(spec).items()}


def run_from_document(doc: Any, where: str, hardware: str | None = None) -> RunConfig:
    """A run recorded by `run_document`, checked as a config file is; priced with `hardware`
    (a profile name or .yaml path), else the profile it recorded."""
    if not isinstance(doc, dict) or doc.get("schema") != RUN_RECORD_SCHEMA:
        raise ConfigError(f"{where}: not a {RUN_RECORD_SCHEMA} record; it was written by another version, re-run the training")
    doc = {k: v for k, v in doc.items() if k != "schema"}
    check_keys(doc, PLANNER_SECTIONS + RUN_SECTIONS, where)
    problem = problem_from_doc(doc, where, Path.cwd(), hardware=hardware)
    model = section_dataclass(doc, "model", ModelConfig, where)
    profile = profile_file(doc, where, hardware)
    train, _ = train_config(doc, Overrides(hardware=hardware), profile)
    return RunConfig(problem, model, train, profile=profile)

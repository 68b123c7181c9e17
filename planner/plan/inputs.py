"""What a plan was made for: the inputs that priced it, recorded in the plan and checked by
the trainer, as TorchRec's PlanLoader checks a hash of its planner's inputs.

The hardware digest covers the profile's cost constants (`ClusterSpec.costs`: bandwidths,
latencies, per-id costs), not its topology or capacities: a `--hbm-gb` given at plan time is a planning choice the plan's
own capacity check already honoured, while a re-calibrated profile prices every option anew.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, fields
from importlib import metadata
from typing import Any

from planner.spec.errors import PlanFormatError
from planner.spec.specs import ClusterSpec
from planner.spec.problem import PlanningProblem

def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def hardware_digest(cluster: ClusterSpec) -> str:
    return _digest(asdict(cluster.costs))


def tables_digest(problem: PlanningProblem) -> str:
    """The tables as the cost model sees them: shapes, pooling and skew, in order."""
    return _digest([[t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor, t.zipf_exponent] + ([] if t.pooled else ["unpooled"])
                    + ([] if t.outputs_per_sample == 1 else [t.outputs_per_sample]) for t in problem.tables])


def planner_version() -> str:
    try:
        return metadata.version("dlrm-scale")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"


@dataclass(frozen=True)
class PlanInputs:
    hardware: str  # the profile's name
    hardware_digest: str
    device: str
    batch_size_per_rank: int
    embedding_optimizer: str
    fwd_comm_precision: str
    bwd_comm_precision: str
    tables_digest: str
    planner_version: str

    @classmethod
    def of(cls, problem: PlanningProblem) -> PlanInputs:
        c, t = problem.cluster, problem.training
        return cls(c.name, hardware_digest(c), c.device, t.batch_size_per_rank, t.embedding_optimizer,
                   t.fwd_comm_precision, t.bwd_comm_precision, tables_digest(problem), planner_version())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: dict, source: str) -> PlanInputs:
        expected = {f.name: (int if f.type == "int" else str) for f in fields(cls)}
        for key, kind in expected.items():
            value = doc.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise PlanFormatError(f"{source}: inputs.{key} must be {'an integer' if kind is int else 'a string'}; re-plan to record it")
        extra = sorted(set(doc) - set(expected))
        if extra:
            raise PlanFormatError(f"{source}: inputs has unknown key {extra[0]!r}")
        return cls(**{k: doc[k] for k in expected})

    def mismatch(self, run: PlanInputs) -> str | None:
        """The first input that differs from the run's, in words; None when the plan fits."""
        if self.tables_digest != run.tables_digest:
            return "the config's tables (pooling factors or skew) differ from those it was made for"
        if (self.hardware, self.hardware_digest) != (run.hardware, run.hardware_digest):
            same = self.hardware == run.hardware
            return (f"it was priced with hardware profile '{self.hardware}'"
                    + (" as it was before a re-calibration or edit" if same else f", this run uses '{run.hardware}'"))
        for key in ("device", "batch_size_per_rank", "embedding_optimizer", "fwd_comm_precision", "bwd_comm_precision"):
            if getattr(self, key) != getattr(run, key):
                return f"it was made for {key} {getattr(self, key)}, this run has {getattr(run, key)}"
        return None

"""Frozen, validated descriptions of what to plan: tables, cluster and training.

Every spec validates itself on construction and raises `ConfigError` with one line that
names the field and the fix, so bad input never reaches the cost model or the solver.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, fields, replace
from enum import Enum
from typing import Iterable

from planner.spec.errors import ConfigError



class CommPrecision(str, Enum):
    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    FP8 = "fp8"
    INT8 = "int8"


# Bytes per element sent, and extra bytes per row (FBGEMM's row-wise int8 codec carries an
# fp32 scale and an fp32 bias with each row; fp8 carries one fp32 scale).
PRECISION_ELEMENT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1}
PRECISION_ROW_OVERHEAD_BYTES = {"fp32": 0, "fp16": 0, "bf16": 0, "fp8": 4, "int8": 8}

# Optimizer state kept per table row, as multiples of (rows, cols) and of rows.
# row-wise Adagrad keeps one fp32 per row; Adagrad one fp32 per weight; Adam two.
OPTIMIZER_STATE = {
    "sgd": (0, 0),
    "rowwise_adagrad": (0, 1),
    "adagrad": (1, 0),
    "adam": (2, 0),
}

DEVICES = ("cuda", "cpu")

GIB = 1024**3  # configs and profiles speak in GiB; specs hold bytes
DEFAULT_BATCH_SIZE_PER_RANK = 512  # where neither the config nor --batch-size gives one


# Past this every id is the hottest row (the second is 2^-10 as likely); larger and infinite
# exponents only overflow the samplers.
MAX_ZIPF_EXPONENT = 10.0


def _positive(owner: str, name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 < value <= MAX_COUNT:
        raise ConfigError(f"{owner}: '{name}' must be a positive number up to 2^40, got {short_repr(value)}")


# The largest count any setting may take: 2^40 rows is 100x the largest production table, and
# products of such counts (bytes, FLOPs) stay exact in int64 and float64.
MAX_COUNT = 2**40


def _positive_int(owner: str, name: str, value: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{owner}: '{name}' must be a positive integer, got {short_repr(value)}")
    if value > MAX_COUNT:
        raise ConfigError(f"{owner}: '{name}' must be at most 2^40, got {short_repr(value)}")


def short_repr(value) -> str:
    """A value for a one-line message: thousands of digits are not."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"


def check_keys(given: Iterable[str], allowed: Iterable[str], where: str) -> None:
    """Refuse the first key of `given` not in `allowed`, suggesting the closest one."""
    allowed = list(allowed)
    for key in given:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"valid keys: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown key {str(key)!r}; {hint}")  # repr: a key may hold a newline


@dataclass(frozen=True)
class TableSpec:
    """One embedding table and how it is read per sample."""

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling_factor: float = 1.0  # ids looked up per sample, on average
    zipf_exponent: float | None = None  # access skew, when known
    # False: an EmbeddingCollection's table (sequence features): each id's row is an output of
    # its own, not summed into its sample's; TorchRec shards these table-, column-, row-wise or
    # replicated only.
    pooled: bool = True
    # Pooled sums each sample gets from the table: one per feature that reads it (a table shared
    # by two features of an EmbeddingBagCollection sends two). An unpooled table's outputs are
    # its ids (pooling_factor), so it keeps 1.
    outputs_per_sample: float = 1.0

    def __post_init__(self) -> None:
        owner = f"table '{self.name}'"
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError("a table has no name: give every table a non-empty 'name'")
        _positive_int(owner, "num_embeddings", self.num_embeddings)
        _positive_int(owner, "embedding_dim", self.embedding_dim)
        if self.embedding_dim % 4:
            raise ConfigError(
                f"{owner}: embedding_dim {self.embedding_dim} is not a multiple of 4, "
                f"which FBGEMM's kernels need; use {self.embedding_dim + 4 - self.embedding_dim % 4}"
            )
        _positive(owner, "pooling_factor", self.pooling_factor)
        if not isinstance(self.pooled, bool):
            raise ConfigError(f"{owner}: 'pooled' must be true or false, got {self.pooled!r}")
        _positive(owner, "outputs_per_sample", self.outputs_per_sample)
        if not self.pooled and self.outputs_per_sample != 1:
            raise ConfigError(f"{owner}: an unpooled table sends a row per id (its pooling_factor); drop 'outputs_per_sample'")
        if self.zipf_exponent is not None and (
            not isinstance(self.zipf_exponent, (int, float)) or isinstance(self.zipf_exponent, bool)
            or not 0 <= self.zipf_exponent <= MAX_ZIPF_EXPONENT
        ):
            raise ConfigError(f"{owner}: 'zipf_exponent' must be a number in [0, {MAX_ZIPF_EXPONENT}], got {self.zipf_exponent!r}")

    @property
    def num_parameters(self) -> int:
        return self.num_embeddings * self.embedding_dim


BANDWIDTHS = ("hbm_gb_per_s", "ddr_gb_per_s", "ssd_gb_per_s", "intra_node_gb_per_s", "inter_node_gb_per_s")  # > 0


@dataclass(frozen=True)
class CostConstants:
    """What a machine was measured to cost: bandwidths in GB/s (1e9 B/s), and the per-unit and
    fixed costs the cost model prices with (planner/cost/cost_model.py says what each prices).
    A hardware profile's fitted part: `dlrm-scale calibrate` measures and fits these."""

    hbm_gb_per_s: float  # device memory bandwidth seen by the embedding kernels
    ddr_gb_per_s: float  # host memory as seen from the device (over PCIe on a GPU)
    ssd_gb_per_s: float
    intra_node_gb_per_s: float  # per rank, one direction
    inter_node_gb_per_s: float  # per rank, one direction
    kernel_launch_ms: float = 0.0  # fixed cost of each shard's kernel per pass
    collective_latency_ms: float = 0.0  # fixed cost of one collective (paid a few times per step)
    collective_peer_us: float = 0.0  # a collective's latency per further rank it exchanges with (all-to-all messages, ring steps)
    comm_shard_ms: float = 0.0  # host work per shard in each embedding collective (its feature's splits and copies)
    comm_byte_ns: float = 0.0  # host work per byte a shard puts into or takes out of an embedding collective (copies)
    lookup_fwd_ns: float = 0.0  # fixed cost per id looked up, beyond its bytes and adds
    lookup_bwd_ns: float = 0.0  # same for the backward with the fused optimizer
    lookup_bwd_row_ns: float = 0.0  # the backward's fixed cost per distinct row updated (the optimizer's math)
    lookup_fwd_weight_ns: float = 0.0  # cost per weight of each row looked up (the pooled sum's adds; CPU)
    lookup_bwd_weight_ns: float = 0.0  # same for the backward (each id's gradient gathered into its row's; CPU)
    input_id_ns: float = 0.0  # host-side handling of each id routed to its shard (input distribution)
    bucketize_id_ns: float = 0.0  # splitting each id of a row-wise table by row block before it is routed (CPU)
    reduce_byte_ns: float = 0.0  # summing each byte a reduce-scatter or all-reduce receives, on the host (CPU)
    dense_update_ns: float = 0.0  # fixed cost per weight of a replica's dense optimizer step (CPU)
    dense_grad_ns: float = 0.0  # fixed cost per weight of a replica's dense gradient in the backward (CPU)
    replica_table_ms: float = 0.0  # fixed cost per replicated table per step (its optimizer and DDP work; CPU)
    dense_gflops: float = 0.0  # dense MLP throughput per rank, for step-time simulation
    interaction_value_ns: float = 0.0  # cost per value of the interaction's input (features x dim per sample)
    pooled_value_ns: float = 0.0  # cost per pooled embedding value regrouped for the dense part (local batch x every table's dim)
    column_permute_value_ns: float = 0.0  # cost per pooled value of a column-split table put back in column order
    step_overhead_ms: float = 0.0  # framework time per step outside the kernels (simulation)
    dense_overhead_ms: float = 0.0  # fixed time per step of the dense layers' passes and optimizer (simulation)
    table_overhead_ms: float = 0.0  # the same per embedding table (input splitting, bookkeeping)
    ddr_latency_us: float = 0.0  # per row fetched from the tier, amortised over its parallel requests
    ssd_latency_us: float = 0.0
    cache_id_ns: float = 0.0  # host work per id looked up in a cached table (dedup, slot lookup; CPU)

    def tier_gb_per_s(self, tier: str) -> float:
        return {"hbm": self.hbm_gb_per_s, "ddr": self.ddr_gb_per_s, "ssd": self.ssd_gb_per_s}[tier]

    def tier_latency_us(self, tier: str) -> float:
        return {"hbm": 0.0, "ddr": self.ddr_latency_us, "ssd": self.ssd_latency_us}[tier]

    def check(self, owner: str) -> None:
        """Bandwidths > 0; every other constant (ms, ns, us per unit of work, a throughput) >= 0."""
        for name in BANDWIDTHS:
            _positive(owner, name, getattr(self, name))
        for name in (f.name for f in fields(self) if f.name not in BANDWIDTHS):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value >= 0:
                raise ConfigError(f"{owner}: '{name}' must be >= 0")


@dataclass(frozen=True)
class ClusterSpec:
    """What the machine is: nodes of identical ranks and their memory tiers; and `costs`, what it
    was measured to cost (a hardware profile holds both)."""

    num_nodes: int
    ranks_per_node: int
    device: str
    hbm_bytes_per_rank: int  # device memory given to embeddings (unused on a CPU cluster)
    ddr_bytes_per_node: int
    ssd_bytes_per_node: int
    costs: CostConstants
    name: str = "custom"

    def __post_init__(self) -> None:
        owner = f"cluster '{self.name}'"
        for name in ("name", "device"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"{owner}: '{name}' must be a string, got {getattr(self, name)!r}")
        _positive_int(owner, "num_nodes", self.num_nodes)
        _positive_int(owner, "ranks_per_node", self.ranks_per_node)
        if self.device not in DEVICES:
            raise ConfigError(f"{owner}: device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if self.device == "cuda":
            _positive_int(owner, "hbm_bytes_per_rank", self.hbm_bytes_per_rank)
        elif self.ddr_bytes_per_node <= 0:
            raise ConfigError(f"{owner}: a cpu cluster computes from DDR; give 'ddr_bytes_per_node' > 0")
        for name in ("hbm_bytes_per_rank", "ddr_bytes_per_node", "ssd_bytes_per_node"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{owner}: '{name}' must be a non-negative integer, got {value!r}")
        self.costs.check(owner)

    def with_costs(self, **changes: float) -> ClusterSpec:
        """The same machine with some cost constants changed (a what-if, a refit)."""
        return replace(self, costs=replace(self.costs, **changes))

    @property
    def world_size(self) -> int:
        return self.num_nodes * self.ranks_per_node

    @property
    def device_tier(self) -> str:
        """The tier a rank computes from: HBM on a GPU, the rank's DDR share on a CPU."""
        return "hbm" if self.device == "cuda" else "ddr"

    def capacity_bytes_per_rank(self, tier: str) -> int:
        """What one rank may hold in `tier`; host tiers are shared evenly by a node's ranks."""
        if tier == "hbm":
            return self.hbm_bytes_per_rank if self.device == "cuda" else 0
        if tier == "ddr":
            return self.ddr_bytes_per_node // self.ranks_per_node
        if tier == "ssd":
            return self.ssd_bytes_per_node // self.ranks_per_node
        raise ValueError(f"unknown memory tier {tier!r}")

    @property
    def backing_tiers(self) -> tuple[str, ...]:
        """Tiers slower than the device's that have room: where cached tables may keep their rows."""
        slower = ("ddr", "ssd") if self.device == "cuda" else ("ssd",)
        return tuple(t for t in slower if self.capacity_bytes_per_rank(t) > 0)

    def node_of(self, rank: int) -> int:
        return rank // self.ranks_per_node


@dataclass(frozen=True)
class TrainingSpec:
    """How the model is trained: batch per rank, optimizer and communication precisions.

    The per-rank batch lives here only: it prices the plan and sizes the trainer's batches."""

    batch_size_per_rank: int = DEFAULT_BATCH_SIZE_PER_RANK
    embedding_optimizer: str = "rowwise_adagrad"
    fwd_comm_precision: str = "fp32"
    bwd_comm_precision: str = "fp32"

    def __post_init__(self) -> None:
        _positive_int("training", "batch_size_per_rank", self.batch_size_per_rank)
        for name in ("embedding_optimizer", "fwd_comm_precision", "bwd_comm_precision"):
            if not isinstance(getattr(self, name), str):
                raise ConfigError(f"training: '{name}' must be a string, got {getattr(self, name)!r}")
        if self.embedding_optimizer not in OPTIMIZER_STATE:
            raise ConfigError(
                f"training: unknown embedding_optimizer {self.embedding_optimizer!r}; "
                f"use one of {', '.join(OPTIMIZER_STATE)}"
            )
        for name in ("fwd_comm_precision", "bwd_comm_precision"):
            if getattr(self, name) not in PRECISION_ELEMENT_BYTES:
                raise ConfigError(
                    f"training: {name} {getattr(self, name)!r} is not one of "
                    f"{', '.join(PRECISION_ELEMENT_BYTES)}"
                )


CACHE_POLICIES = ("lru", "lfu")


@dataclass(frozen=True)
class TieringSpec:
    """Whether and how the planner may keep a table's rows in a slower tier behind a cache.

    A cached option is tried for each load factor (cache rows / shard rows) and each slower
    tier with room, for tables whose rows would take more than `min_table_fraction` of a
    rank's device memory: small tables never gain from it.
    """

    enabled: bool = True
    policy: str = "lru"
    load_factors: tuple[float, ...] = (0.05, 0.1, 0.2, 0.4)
    min_table_fraction: float = 0.02

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ConfigError(f"tiering: 'enabled' must be true or false, got {self.enabled!r}")
        if self.policy not in CACHE_POLICIES:
            raise ConfigError(f"tiering: policy {self.policy!r} is not one of {', '.join(CACHE_POLICIES)}")
        factors = self.load_factors
        if isinstance(factors, (int, float)):
            factors = (factors,)
        if not isinstance(factors, (list, tuple)) or not factors or any(
            not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f < 1 for f in factors
        ):
            raise ConfigError(f"tiering: load_factors must be a list of fractions in (0, 1), got {self.load_factors!r}")
        object.__setattr__(self, "load_factors", tuple(float(f) for f in factors))
        if not isinstance(self.min_table_fraction, (int, float)) or not 0 <= self.min_table_fraction <= 1:
            raise ConfigError(f"tiering: min_table_fraction must be in [0, 1], got {self.min_table_fraction!r}")

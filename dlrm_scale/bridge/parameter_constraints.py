"""TorchRec's per-table `ParameterConstraints`, and the sharders' capabilities, as our specs.

Each field is honoured or refused in one line naming the table and the field (docs/torchrec.md
has the table of them):
- what the planner prices: pooling_factors, num_poolings, batch_sizes and feature_names make
  the table's ids and pooled sums per sample; is_weighted must match the collection (priced
  alike: a weight is one multiply beside the add);
- what it may choose: sharding_types, compute_kernels, min_partition, cache_params' load_factor
  and algorithm, enforce_hbm become constraint rules and tiering settings (as a config's
  `constraints:` and `tiering:` sections say them);
- what FBGEMM runs with: cache_params, enforce_hbm, stochastic_rounding, bounds_check_mode,
  key_value_params go into TorchRec's ParameterSharding as given, as TorchRec's planner puts them;
- refused: a cache in another precision or with reserved memory, an output dtype other than
  fp32, another device_group, virtual tables.
"""

from __future__ import annotations

import dataclasses
import glob
from typing import Any, Mapping

import torch
from torchrec.distributed.embedding_types import EmbeddingComputeKernel
from torchrec.distributed.planner.constants import POOLING_FACTOR
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.types import ModuleSharder, ShardingType
from torchrec.modules.embedding_configs import DataType

from dlrm_scale.bridge.module_tables import ModuleTable, first_conflict
from planner.spec.errors import ConfigError
from planner.spec.schemes import KERNELS, UNPOOLED_SCHEMES, cached_kernel_for, compute_kernel_for
from planner.spec.specs import PRECISION_ELEMENT_BYTES, TableSpec, TieringSpec
from planner.spec.types import ShardingType as OurShardingType

# Every field of ParameterConstraints, by what becomes of it; a field not listed (a newer
# TorchRec's) is refused where it is set.
PRICED_FIELDS = ("pooling_factors", "num_poolings", "batch_sizes", "feature_names", "is_weighted")
CHOICE_FIELDS = ("sharding_types", "compute_kernels", "min_partition", "cache_params", "enforce_hbm")
# Passed to TorchRec's ParameterSharding as the user gave them: FBGEMM runs with them.
RUNTIME_FIELDS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype", "key_value_params")
REFUSED_FIELDS = ("device_group", "use_virtual_table")  # unless at their defaults (or the topology's device)
KNOWN_FIELDS = set(PRICED_FIELDS + CHOICE_FIELDS + RUNTIME_FIELDS + REFUSED_FIELDS)
TORCHREC_SCHEMES = tuple(s.value for s in ShardingType)
TORCHREC_KERNELS = tuple(k.value for k in EmbeddingComputeKernel)
DTYPE_PRECISIONS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def _ours_for(scheme: str) -> set[str]:
    """The kernels dlrm-scale plans `scheme` with."""
    st = OurShardingType(scheme)
    return {compute_kernel_for(st)} if st is OurShardingType.DATA_PARALLEL else {compute_kernel_for(st), cached_kernel_for("ddr"), cached_kernel_for("ssd")}


def _per_feature(values: Any, n: int, features: list[str], where: str, field: str) -> list[float]:
    if len(values) != n:
        raise ConfigError(f"{where}.{field} has {len(values)} values for the table's {n} features ({', '.join(features)}); "
                          f"give one per feature")
    if any(not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0 for v in values):
        raise ConfigError(f"{where}.{field} must be positive numbers, got {list(values)}")
    return [float(v) for v in values]


def table_spec(t: ModuleTable, pc: ParameterConstraints | None, batch_size: int) -> TableSpec:
    """The table as the cost model sees it: ids and pooled sums per sample over its features,
    each feature's at its own batch size where batch_sizes gives them."""
    features = list(t.config.feature_names)
    n, where = len(features), f"constraints['{t.name}']"
    pooling, poolings, batches = [1.0] * n, [1.0] * n, [float(batch_size)] * n
    if pc is not None:
        _check_known(pc, where)
        if pc.feature_names is not None and sorted(pc.feature_names) != sorted(features):
            raise ConfigError(f"{where}.feature_names {list(pc.feature_names)} are not the table's features {features}; give those")
        if not (n > 1 and list(pc.pooling_factors) == [POOLING_FACTOR]):  # TorchRec's default: one per feature
            pooling = _per_feature(pc.pooling_factors, n, features, where, "pooling_factors")
        if pc.num_poolings is not None:
            if not t.pooled:
                raise ConfigError(f"{where}.num_poolings counts pooled sums, but '{t.name}' is an EmbeddingCollection's table "
                                  f"(a row per id): drop num_poolings")
            poolings = _per_feature(pc.num_poolings, n, features, where, "num_poolings")
        if pc.batch_sizes is not None:
            batches = _per_feature(pc.batch_sizes, n, features, where, "batch_sizes")
        if pc.is_weighted and not t.weighted:
            raise ConfigError(f"{where}.is_weighted is true but module '{t.path}' is not weighted; drop is_weighted")
    ids = sum(p * b for p, b in zip(pooling, batches)) / batch_size
    sums = sum(p * b for p, b in zip(poolings, batches)) / batch_size
    return TableSpec(t.name, t.config.num_embeddings, t.config.embedding_dim, ids, pooled=t.pooled,
                     outputs_per_sample=sums if t.pooled else 1.0)


def _check_known(pc: ParameterConstraints, where: str) -> None:
    for f in dataclasses.fields(pc):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if f.name not in KNOWN_FIELDS and getattr(pc, f.name) != default:
            raise ConfigError(f"{where}.{f.name}: dlrm-scale does not read it yet; drop it, or plan with TorchRec's planner")


def _allowed(given: list[str] | None, known: tuple[str, ...], offered: list[str], where: str, field: str) -> list[str]:
    if given is None:
        return offered
    unknown = [v for v in given if v not in known]
    if unknown:
        raise ConfigError(f"{where}.{field}: {unknown[0]!r} is not one of TorchRec's ({', '.join(known)})")
    left = [v for v in offered if v in given]
    if not left:
        raise ConfigError(f"{where}.{field} {list(given)}: none of them is one its sharder runs and dlrm-scale plans "
                          f"({', '.join(offered)}); allow one of those")
    return left


def table_rule(t: ModuleTable, pc: ParameterConstraints | None, device: str) -> dict[str, Any] | None:
    """A rule of the config's `constraints: tables:` for the table, or None where neither its
    sharder nor its constraints remove an option."""
    where = f"constraints['{t.name}']"
    runnable = {st: kernels for st, kernels in t.runnable.items() if kernels}
    schemes = _allowed(pc.sharding_types if pc else None, TORCHREC_SCHEMES, list(runnable), where, "sharding_types")
    kernels = _allowed(pc.compute_kernels if pc else None, TORCHREC_KERNELS,
                       sorted({k for st in schemes for k in runnable[st]}, key=KERNELS.index), where, "compute_kernels")
    for st in schemes:  # a rule allows schemes x kernels: a sharder that pairs them otherwise cannot be said
        missing = (set(kernels) & _ours_for(st)) - set(runnable[st])
        if missing:
            raise ConfigError(f"table '{t.name}': its sharder {type(t.sharder).__name__} runs {st} without {sorted(missing)[0]}, which "
                              f"it runs other schemes with; restrict compute_kernels in its ParameterConstraints")
    rule: dict[str, Any] = {}
    if set(schemes) != {s.value for s in (OurShardingType if t.pooled else UNPOOLED_SCHEMES)}:
        rule["schemes"] = schemes
    if set(kernels) != set(KERNELS):
        rule["kernels"] = kernels
    if pc is not None:
        rule.update(_choice_fields(t, pc, device, where))
    return {"match": glob.escape(t.name), **rule} if rule else None


def _choice_fields(t: ModuleTable, pc: ParameterConstraints, device: str, where: str) -> dict[str, Any]:
    rule: dict[str, Any] = {}
    if pc.min_partition is not None:
        if not isinstance(pc.min_partition, int) or not 0 < pc.min_partition <= t.config.embedding_dim:
            raise ConfigError(f"{where}.min_partition must be a whole number of columns in 1..{t.config.embedding_dim}, "
                              f"got {pc.min_partition!r}")
        rule["min_shard_cols"] = pc.min_partition
    cache = pc.cache_params
    if cache is not None:
        if cache.reserved_memory:
            raise ConfigError(f"{where}.cache_params.reserved_memory: dlrm-scale sizes caches by load factor; drop reserved_memory")
        if cache.precision is not None and cache.precision != DataType.FP32:
            raise ConfigError(f"{where}.cache_params.precision {cache.precision.name}: dlrm-scale plans fp32 caches; drop precision")
        if cache.load_factor is not None:
            rule["cache_load_factors"] = [cache.load_factor]
    if pc.enforce_hbm:
        if device != "cuda":
            raise ConfigError(f"{where}.enforce_hbm keeps a table in GPU memory; the topology is {device}: drop enforce_hbm")
        rule["tiers"] = ["hbm"]
    if pc.output_dtype is not None and pc.output_dtype != DataType.FP32:
        raise ConfigError(f"{where}.output_dtype {pc.output_dtype.name}: dlrm-scale prices fp32 outputs; drop it and give the "
                          f"sharders qcomm codecs to send fewer bytes")
    if pc.device_group is not None and pc.device_group != device:
        raise ConfigError(f"{where}.device_group {pc.device_group!r}: dlrm-scale plans every table on the topology's "
                          f"{device}; drop device_group")
    if pc.use_virtual_table:
        raise ConfigError(f"{where}.use_virtual_table: dlrm-scale plans tables of fixed rows; drop use_virtual_table")
    return rule


def tiering_section(constraints: Mapping[str, ParameterConstraints]) -> dict[str, Any] | None:
    """The config's `tiering:` section the tables' cache_params ask for: their load factors
    offered beside the defaults, and their cache algorithm (one for all)."""
    caches = {name: pc.cache_params for name, pc in constraints.items() if pc.cache_params is not None}
    factors = sorted({c.load_factor for c in caches.values() if c.load_factor is not None})
    algorithms = {name: c.algorithm.name.lower() for name, c in caches.items() if c.algorithm is not None}
    conflict = first_conflict(algorithms)
    if conflict:
        (a, pa), (b, pb) = conflict
        raise ConfigError(f"constraints['{a}'].cache_params.algorithm is {pa.upper()} but '{b}''s is {pb.upper()}; "
                          f"dlrm-scale caches with one policy: give them one")
    section: dict[str, Any] = {}
    if factors:
        section["load_factors"] = sorted(set(TieringSpec().load_factors) | set(factors))
    if algorithms:
        section["policy"] = next(iter(algorithms.values()))
    return section or None


def runtime_fields(pc: ParameterConstraints | None) -> dict[str, Any]:
    """What TorchRec's ParameterSharding carries for FBGEMM, as the user gave it."""
    return {f: getattr(pc, f) for f in RUNTIME_FIELDS if pc is not None and getattr(pc, f) is not None}


def _precision(codec: Any, where: str) -> str:
    if codec is None:
        return "fp32"
    spelt = getattr(getattr(codec, "_comm_precision", None), "value", None)
    if spelt in PRECISION_ELEMENT_BYTES:
        return spelt
    if codec.quantized_dtype in DTYPE_PRECISIONS:
        return DTYPE_PRECISIONS[codec.quantized_dtype]
    raise ConfigError(f"{where}: a {type(codec).__name__} sending {codec.quantized_dtype}; dlrm-scale prices "
                      f"{', '.join(PRECISION_ELEMENT_BYTES)}: use TorchRec's QCommsConfig")


def comm_precisions(sharders: list[ModuleSharder]) -> tuple[str, str]:
    """(forward, backward) precisions of the embeddings' collectives, read from the sharders'
    qcomm codecs (fp32 without); every sharder must send at the same ones."""
    found: dict[str, tuple[str, str]] = {}
    for sharder in sharders:
        registry = getattr(sharder, "qcomm_codecs_registry", None) or {}
        if not registry:
            found[f"sharder {type(sharder).__name__}"] = ("fp32", "fp32")
        for op, codecs in registry.items():
            where = f"sharder {type(sharder).__name__} ({op})"
            found[where] = (_precision(codecs.forward, where), _precision(codecs.backward, where))
    conflict = first_conflict(found)
    if conflict:
        (a, pa), (b, pb) = conflict
        raise ConfigError(f"{a} sends {'/'.join(pa)} but {b} {'/'.join(pb)}; dlrm-scale prices one pair of comm precisions: "
                          f"give every sharder the same QCommsConfig")
    return next(iter(found.values()), ("fp32", "fp32"))


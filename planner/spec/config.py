"""Loading specs from YAML configs, hardware profiles and table CSVs, with one-line errors.

The planner owns a config's `hardware`, `cluster`, `training`, `tables` | `tables_csv` and
`tiering` sections and rejects unknown keys in them with the closest valid spelling. A
config that also holds sections others own (the trainer's `model` and `train`) is read whole
by dlrm_scale.run_config, which names them; `load_problem` alone refuses them unless told.
"""

from __future__ import annotations

import csv
import math
import os
import re
import sys
from dataclasses import MISSING, fields, replace
from pathlib import Path
from typing import Any, Iterable

import yaml

from planner.spec.errors import ConfigError
from planner.spec.access_stats import load_stats
from planner.spec.constraints import RESERVE_KEY, Constraints, Shape
from planner.spec.specs import GIB, MAX_COUNT, check_keys, short_repr, ClusterSpec, CostConstants, TableSpec, TieringSpec, TrainingSpec
from planner.spec.problem import PlanningProblem

# The named profiles that come with dlrm-scale: configs/hardware in a checkout (an editable
# install too), and where a wheel puts them (pyproject.toml's data-files) when installed.
_CHECKOUT_HARDWARE = Path(__file__).resolve().parents[2] / "configs" / "hardware"
HARDWARE_DIR = _CHECKOUT_HARDWARE if _CHECKOUT_HARDWARE.is_dir() else Path(sys.prefix) / "share" / "dlrm-scale" / "hardware"
# Where `dlrm-scale calibrate --name NAME` writes a machine's own profile; searched after HARDWARE_DIR.
USER_HARDWARE_ENV = "DLRM_SCALE_HARDWARE_DIR"
DEFAULT_HARDWARE = "a100_zionex"

PLANNER_SECTIONS = ("hardware", "cluster", "training", "tables", "tables_csv", "tiering", "constraints")
TABLE_KEYS = ("name", "num_embeddings", "embedding_dim", "pooling_factor", "zipf_exponent")
# A config's tables may also say `pooled: false` (an EmbeddingCollection's table); a CSV holds numbers only.
CONFIG_TABLE_KEYS = TABLE_KEYS + ("pooled", "outputs_per_sample")
# Hardware profiles and the cluster section speak in GiB; the specs hold bytes.
PROFILE_KEYS = {
    "name": "name",
    "device": "device",
    "ranks_per_node": "ranks_per_node",
    "num_nodes": "num_nodes",
    "world_size": None,
    "hbm_gib_per_rank": "hbm_bytes_per_rank",
    "ddr_gib_per_node": "ddr_bytes_per_node",
    "ssd_gib_per_node": "ssd_bytes_per_node",
    "hbm_gb_per_s": "hbm_gb_per_s",
    "ddr_gb_per_s": "ddr_gb_per_s",
    "ssd_gb_per_s": "ssd_gb_per_s",
    "intra_node_gb_per_s": "intra_node_gb_per_s",
    "inter_node_gb_per_s": "inter_node_gb_per_s",
    "kernel_launch_ms": "kernel_launch_ms",
    "collective_latency_ms": "collective_latency_ms",
    "collective_peer_us": "collective_peer_us",
    "lookup_fwd_ns": "lookup_fwd_ns",
    "lookup_bwd_ns": "lookup_bwd_ns",
    "lookup_bwd_row_ns": "lookup_bwd_row_ns",
    "lookup_fwd_weight_ns": "lookup_fwd_weight_ns",
    "lookup_bwd_weight_ns": "lookup_bwd_weight_ns",
    "input_id_ns": "input_id_ns",
    "bucketize_id_ns": "bucketize_id_ns",
    "reduce_byte_ns": "reduce_byte_ns",
    "replica_table_ms": "replica_table_ms",
    "dense_update_ns": "dense_update_ns",
    "dense_grad_ns": "dense_grad_ns",
    "dense_gflops": "dense_gflops",
    "interaction_value_ns": "interaction_value_ns",
    "pooled_value_ns": "pooled_value_ns",
    "column_permute_value_ns": "column_permute_value_ns",
    "step_overhead_ms": "step_overhead_ms",
    "dense_overhead_ms": "dense_overhead_ms",
    "comm_shard_ms": "comm_shard_ms",
    "comm_byte_ns": "comm_byte_ns",
    "table_overhead_ms": "table_overhead_ms",
    "ddr_latency_us": "ddr_latency_us",
    "ssd_latency_us": "ssd_latency_us",
    "cache_id_ns": "cache_id_ns",
    "source": None,
    "calibrated": None,
    "fitted_on": None,  # what `dlrm-scale calibrate` fitted the constants on, and its residuals
    "fit_residuals": None,
    "cpu_kernels": None,  # the trainer's measured kernel choice (dlrm_scale.train); not the planner's
    "measured_on": None,  # the CPU `dlrm-scale calibrate` measured on (dlrm_scale.run_config.measured_elsewhere)
}
TRAINING_KEYS = tuple(f.name for f in fields(TrainingSpec))


def mapping(value: Any, where: str) -> dict[str, Any]:
    """A config section: a mapping (or absent), never anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be a mapping of keys to values, not a {type(value).__name__}")
    return value


def section_dataclass(doc: dict[str, Any], key: str, cls: type, where: str, **defaults: Any) -> Any:
    """A config section (`model`, `train`, ...) as the frozen dataclass that owns it: unknown
    keys get a did-you-mean, values of the wrong type one line naming the section."""
    section = mapping(doc.get(key), f"{where}: {key}")
    check_keys(section, [f.name for f in fields(cls)], f"{where}: {key}")
    kinds = {f.name: SCALAR_KINDS.get(str(f.type)) for f in fields(cls)}
    for name, value in section.items():
        kind = kinds[name]
        if kind is not None and not _is_kind(value, kind):
            raise ConfigError(f"{where}: {key}: {name} must be {kind[0]}, got {short_repr(value)}")
    try:
        return cls(**{**defaults, **section})
    except TypeError:
        raise ConfigError(f"{where}: {key} has a value of the wrong type; check the numbers and lists in it") from None


# Scalar field annotations of the config dataclasses: what a YAML value must be for each.
SCALAR_KINDS = {
    "int": ("an integer up to 2^40", int), "bool": ("true or false", bool), "float": ("a number", float),
    "str": ("a string", str), "str | None": ("a string", str),
}


def _is_kind(value: Any, kind: tuple[str, type]) -> bool:
    if kind[1] is bool:
        return isinstance(value, bool)
    if kind[1] is int:
        return isinstance(value, int) and not isinstance(value, bool) and abs(value) <= MAX_COUNT
    if kind[1] is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return isinstance(value, str)


def read_text(path: Path, what: str) -> str:
    """A UTF-8 text file (a byte-order mark allowed), or one line saying why not."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist; check the path") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a directory; give the file in it") from None
    except OSError as e:
        raise ConfigError(f"{what} {path} cannot be read ({e.strerror}); check its permissions") from None
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{what} {path} is not UTF-8 text (byte {e.start} is 0x{data[e.start]:02x}); save it as UTF-8") from None


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, reading 1e3 and 1.0e300 as numbers as YAML 1.2 does (1.1 wants 1.0e+300)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def read_yaml(path: Path, what: str) -> dict[str, Any]:
    text = read_text(path, what)
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{what} {path} is not valid YAML{at}; fix the syntax there") from None
    except RecursionError:
        raise ConfigError(f"{what} {path} nests too deeply to read; a config is a few levels of mappings and lists") from None
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{what} {path} must be a mapping of keys to values, not a {type(doc).__name__}")
    return doc


def user_hardware_dir() -> Path:
    """The folder of profiles calibrated on the user's machines: $DLRM_SCALE_HARDWARE_DIR, else
    ~/.config/dlrm-scale/hardware."""
    return Path(os.environ.get(USER_HARDWARE_ENV) or Path.home() / ".config" / "dlrm-scale" / "hardware")


def hardware_path(name_or_path: str) -> Path:
    """A profile by name (the shipped ones first, then the user's) or a .yaml path."""
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml"):
        return path
    folders = (HARDWARE_DIR, user_hardware_dir())
    found = next((f / f"{name_or_path}.yaml" for f in folders if (f / f"{name_or_path}.yaml").is_file()), None)
    if found is None:
        known = sorted({p.stem for f in folders if f.is_dir() for p in f.glob("*.yaml")})
        raise ConfigError(f"unknown hardware profile '{name_or_path}'; use one of {', '.join(known)} or a .yaml path "
                          f"('dlrm-scale calibrate --name NAME' measures this machine into one)")
    return found


def cluster_fields(section: dict[str, Any], where: str) -> dict[str, Any]:
    """Translate profile-style keys (GiB, world_size) into ClusterSpec fields."""
    check_keys(mapping(section, where), PROFILE_KEYS, where)
    out: dict[str, Any] = {}
    for key, value in section.items():
        target = PROFILE_KEYS[key]
        if target is None:
            continue
        if key.endswith("_gib_per_rank") or key.endswith("_gib_per_node"):
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= MAX_COUNT:
                raise ConfigError(f"{where}: '{key}' must be a non-negative number of GiB up to 2^40, got {short_repr(value)}")
            value = int(value * GIB)
        out[target] = value
    if "world_size" in section:
        out["world_size"] = section["world_size"]
    return out


def build_cluster(profile: dict[str, Any], overrides: dict[str, Any]) -> ClusterSpec:
    merged = {**profile, **overrides}
    world = merged.pop("world_size", None)
    if world is not None:
        if not isinstance(world, int) or isinstance(world, bool) or world <= 0:
            raise ConfigError(f"cluster: world_size must be a positive integer, got {world!r}")
        local = merged.get("ranks_per_node", world)
        if not isinstance(local, int) or isinstance(local, bool) or local <= 0:
            raise ConfigError(f"cluster: ranks_per_node must be a positive integer, got {local!r}")
        if world < local:
            local = world  # fewer ranks than one node holds: a single partial node
            merged["ranks_per_node"] = local
        if world % local:
            raise ConfigError(f"cluster: world_size {world} is not a multiple of ranks_per_node {local}; change either")
        merged["num_nodes"] = world // local
    merged.setdefault("num_nodes", 1)
    merged.setdefault("hbm_bytes_per_rank", 0)
    merged.setdefault("ddr_bytes_per_node", 0)
    merged.setdefault("ssd_bytes_per_node", 0)
    costs = {f.name: merged.pop(f.name) for f in fields(CostConstants) if f.name in merged}
    missing = [f.name for f in (*fields(ClusterSpec), *fields(CostConstants))
               if f.name not in merged and f.name not in costs and f.name != "costs" and f.default is MISSING]
    if missing:
        raise ConfigError(f"cluster: the hardware profile lacks {', '.join(missing)}; add them to the profile")
    return ClusterSpec(**merged, costs=CostConstants(**costs))


def load_tables_csv(path: str | Path) -> list[TableSpec]:
    """Tables from a CSV with header name,num_embeddings,embedding_dim,pooling_factor[,zipf_exponent]."""
    path = Path(path)
    text = read_text(path, "table file")
    reader = csv.reader(text.splitlines())
    header = [h.strip() for h in next(reader, [])]
    where = f"table file {path}"
    duplicated = sorted({h for h in header if header.count(h) > 1})
    if duplicated:
        raise ConfigError(f"{where}: column {duplicated[0]!r} appears twice in the header; keep one")
    missing = [k for k in ("name", "num_embeddings", "embedding_dim") if k not in header]
    if missing:
        raise ConfigError(f"{where}: header lacks {', '.join(missing)}; expected {','.join(TABLE_KEYS[:4])}")
    check_keys(header, TABLE_KEYS, where)
    tables = []
    for line, values in enumerate(reader, start=2):
        if not values:
            continue
        if len(values) != len(header):
            raise ConfigError(f"{where}, line {line}: {len(values)} values for {len(header)} columns; give one per column")
        row = {k: v.strip() for k, v in zip(header, values)}
        try:
            tables.append(TableSpec(
                name=row["name"],
                num_embeddings=_csv_number(row["num_embeddings"], int),
                embedding_dim=_csv_number(row["embedding_dim"], int),
                pooling_factor=_csv_number(row.get("pooling_factor") or "1", float),
                zipf_exponent=_csv_number(row["zipf_exponent"], float) if row.get("zipf_exponent") else None,
            ))
        except ValueError as e:
            raise ConfigError(f"{where}, line {line}: {e}; fix the numbers on that line") from None
    return tables


def _csv_number(text: str, kind: type) -> int | float:
    """A CSV cell as an int (digits only, at most 20) or a finite float."""
    if kind is int:
        if not text.isdigit() or len(text) > 20:
            raise ValueError(f"{text[:30]!r} is not a whole number")
        return int(text)
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text[:30]!r} is not a finite number")
    return value


def tables_from_config(entries: Any, where: str) -> list[TableSpec]:
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: 'tables' must be a list of tables")
    tables = []
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise ConfigError(f"{where}: tables[{i}] must be a mapping with name, num_embeddings, embedding_dim")
        check_keys(entry, CONFIG_TABLE_KEYS, f"{where}: tables[{i}]")
        try:
            tables.append(TableSpec(**entry))
        except TypeError as e:
            raise ConfigError(f"{where}: tables[{i}]: {e}") from None
    return tables


def load_problem(
    config_path: str | Path | None = None,
    tables_csv: str | Path | None = None,
    hardware: str | None = None,
    cluster_overrides: dict[str, Any] | None = None,
    training_overrides: dict[str, Any] | None = None,
    stats_path: str | Path | None = None,
    other_sections: Iterable[str] = (),
) -> PlanningProblem:
    """Specs from a config file (optional), a table CSV (optional), access statistics
    (optional, from `dlrm-scale profile`) and flag overrides. `other_sections`: top-level
    keys of the config that someone else reads.

    Precedence: flags over the config's sections over the hardware profile.
    """
    config: dict[str, Any] = {}
    where, base = "flags", Path.cwd()
    if config_path is not None:
        config = read_yaml(Path(config_path), "config")
        where, base = f"config {config_path}", Path(config_path).parent
        check_keys(config, PLANNER_SECTIONS + tuple(other_sections), where)
    return problem_from_doc(config, where, base, tables_csv, hardware, cluster_overrides, training_overrides, stats_path)


def profile_file(config: dict[str, Any], where: str, hardware: str | None = None) -> Path:
    """The hardware profile a config document is priced with: `hardware` (a flag's), else the
    document's own, else the default."""
    name = hardware or config.get("hardware", DEFAULT_HARDWARE)
    if not isinstance(name, str):
        raise ConfigError(f"{where}: 'hardware' must be a profile name or a .yaml path")
    return hardware_path(name)


def problem_from_doc(
    config: dict[str, Any],
    where: str,
    base: Path,
    tables_csv: str | Path | None = None,
    hardware: str | None = None,
    cluster_overrides: dict[str, Any] | None = None,
    training_overrides: dict[str, Any] | None = None,
    stats_path: str | Path | None = None,
) -> PlanningProblem:
    """The planner's sections of a config document (`where` names it in errors; `base` is the
    folder its relative paths start from); the caller checked its top-level keys."""
    path = profile_file(config, where, hardware)
    profile = cluster_fields(read_yaml(path, "hardware profile"), f"hardware profile {path}")
    cluster_section = mapping(config.get("cluster"), f"{where}: cluster")
    cluster = build_cluster(
        profile, {**cluster_fields(cluster_section, f"{where}: cluster"), **(cluster_overrides or {})}
    )
    training_section = dict(mapping(config.get("training"), f"{where}: training"))
    check_keys(training_section, TRAINING_KEYS, f"{where}: training")
    training = TrainingSpec(**{**training_section, **(training_overrides or {})})
    tables = _tables(config, where, base, tables_csv)
    tiering = section_dataclass(config, "tiering", TieringSpec, where)
    problem = PlanningProblem(tuple(tables), cluster, training, tiering)
    if stats_path is not None:
        problem = with_access_stats(problem, stats_path)
    return constrain(problem, config["constraints"]) if config.get("constraints") is not None else problem


def with_access_stats(problem: PlanningProblem, stats_path: str | Path) -> PlanningProblem:
    """The problem with the measured access statistics of `dlrm-scale profile` (hit-rate
    curves, pooling) in place of its tables' Zipf laws."""
    access = load_stats(stats_path)
    unknown = sorted(set(access) - {t.name for t in problem.tables})
    if unknown:
        raise ConfigError(f"stats file {stats_path} describes table {unknown[0]!r} that the config does not have; profile this config")
    for table in problem.tables:
        stats = access.get(table.name)
        if stats is not None and stats.distinct_ids > table.num_embeddings:
            raise ConfigError(f"stats file {stats_path}: table {table.name!r} has {stats.distinct_ids:,} distinct ids but "
                              f"{table.num_embeddings:,} rows; profile this config's data")
    return replace(problem, access=access)


def _tables(config: dict[str, Any], where: str, base: Path, tables_csv: str | Path | None) -> list[TableSpec]:
    """The tables: a CSV given by flag, else the config's `tables_csv` or `tables`."""
    if tables_csv is not None:
        return load_tables_csv(tables_csv)
    if "tables_csv" in config:
        if not isinstance(config["tables_csv"], str):
            raise ConfigError(f"{where}: 'tables_csv' must be a path")
        return load_tables_csv(base / config["tables_csv"])
    if "tables" in config:
        return tables_from_config(config["tables"], where)
    raise ConfigError(f"{where}: no tables; add a 'tables' list or 'tables_csv', or pass --tables FILE.csv")


def constrain(problem: PlanningProblem, section: Any) -> PlanningProblem:
    """`problem` under a config's `constraints:` section: its rules kept for the candidates,
    its reserve taken off each rank's capacity (once: this is the one place that does)."""
    cluster = problem.cluster
    constraints = Constraints.parse(section, [t.name for t in problem.tables], Shape(cluster.world_size, cluster.ranks_per_node))
    for tier, reserve in constraints.reserve_bytes_per_rank.items():
        have = cluster.capacity_bytes_per_rank(tier)
        if reserve > have:
            raise ConfigError(f"constraints: {RESERVE_KEY}: {tier} {reserve / GIB:g} GiB is more than a rank has ({have / GIB:.1f} GiB)")
        if tier == "hbm":
            cluster = replace(cluster, hbm_bytes_per_rank=cluster.hbm_bytes_per_rank - reserve)
        else:  # host tiers are a node's, shared evenly by its ranks
            key = f"{tier}_bytes_per_node"
            cluster = replace(cluster, **{key: getattr(cluster, key) - reserve * cluster.ranks_per_node})
    return replace(problem, cluster=cluster, constraints=constraints)

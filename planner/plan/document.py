"""The plan: what every consumer reads (`dlrm-scale/plan/v1` JSON).

Loading validates the document fully and raises PlanFormatError with one line that names
the field, so a hand-edited plan never fails deep inside training. A plan records the inputs
it was made for (`PlanInputs`), and `check_plan_inputs` refuses it for a run with others, as
TorchRec's PlanLoader refuses a plan whose planner inputs hash differently. This module knows
the format only: planning.py builds a plan from the search's solution.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

from planner.spec import json_file
from planner.spec.errors import PlanFormatError
from planner.plan.inputs import PlanInputs
from planner.spec.schemes import CACHED_KERNELS, COLUMN_ALIGNMENT, KERNELS, cache_rows, cached_kernel_for, compute_kernel_for, row_blocks, shard_geometry
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec
from planner.spec.types import TIERS, Perf, ShardingType, Storage

SCHEMA = "dlrm-scale/plan/v1"


@dataclass(frozen=True)
class PlannedShard:
    rank: int
    row_offset: int
    col_offset: int
    rows: int
    cols: int
    tier: str  # where the shard's rows live
    cache_rows: int = 0  # rows cached in the device tier (cached kernels only)


@dataclass(frozen=True)
class TablePlan:
    sharding_type: str
    compute_kernel: str
    num_embeddings: int
    embedding_dim: int
    shards: tuple[PlannedShard, ...]
    cache_load_factor: float | None = None  # cached kernels: cache rows / shard rows

    @property
    def cached(self) -> bool:
        return self.compute_kernel in CACHED_KERNELS

    @property
    def ranks(self) -> list[int]:
        return [s.rank for s in self.shards]


@dataclass(frozen=True)
class RankPlan:
    rank: int
    perf: Perf
    memory: Storage

    @property
    def predicted_ms(self) -> float:
        return self.perf.total_ms


# dlrm_scale.training.replicas: a row one replica changed synced before another reads it, a row two
# changed after the step, the rows one changed every sync_every_steps
REPLICA_STRATEGY = "shared_rows"


@dataclass(frozen=True)
class Replication:
    """2D sparse parallelism (planner/plan/replication.py): the plan is one sharding group's, of
    `group_size` ranks; the job runs `replicas` of it, synced every `sync_every_steps`."""

    group_size: int
    replicas: int
    sync_every_steps: int
    sync_ms: float  # every N steps, the rows one replica changed synced, predicted
    shared_ms: float  # each step, the rows looked up exchanged and those read after another's change or two changed synced, predicted
    strategy: str = REPLICA_STRATEGY

    @property
    def sync_ms_per_step(self) -> float:
        return self.sync_ms / self.sync_every_steps + self.shared_ms

    @property
    def job_world_size(self) -> int:
        return self.group_size * self.replicas

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    world_size: int
    ranks_per_node: int
    tables: dict[str, TablePlan]
    ranks: tuple[RankPlan, ...]
    max_rank_ms: float
    lower_bound_ms: float
    cost_model: str = "ours"
    solver: str = ""
    solve_seconds: float = 0.0
    inputs: PlanInputs | None = None  # what it was made for; None for a plan written by hand
    # The search's objective and its proven bound (ms): the step as the collectives make it,
    # each phase waiting for its busiest rank, plus the fixed cost of the plan's sharding types.
    # None for a plan the search did not make (by hand, TorchRec's, a replan's).
    step: tuple[float, float] | None = None
    replication: Replication | None = None  # 2D: world_size and ranks_per_node are then one group's

    @property
    def gap(self) -> float:
        """The busiest rank's distance from its proven bound."""
        return self.max_rank_ms / self.lower_bound_ms - 1 if self.lower_bound_ms > 0 else 0.0

    @property
    def step_gap(self) -> float | None:
        """The objective's distance from its proven bound: how far the search may be from the best plan."""
        return None if self.step is None else self.step[0] / self.step[1] - 1

    # ---- JSON -----------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "world_size": self.world_size,
            "ranks_per_node": self.ranks_per_node,
            "cost_model": self.cost_model,
            "tables": {name: _table_dict(t) for name, t in self.tables.items()},
            "ranks": [
                {
                    "rank": r.rank,
                    "predicted_ms": r.predicted_ms,
                    "breakdown_ms": {
                        "fwd_compute": r.perf.fwd_compute_ms, "fwd_comms": r.perf.fwd_comms_ms,
                        "bwd_compute": r.perf.bwd_compute_ms, "bwd_comms": r.perf.bwd_comms_ms,
                        "input_dist": r.perf.input_dist_ms,
                    },
                    "memory_bytes": r.memory.as_dict(),
                }
                for r in self.ranks
            ],
            "predicted": {
                "max_rank_ms": self.max_rank_ms,
                "lower_bound_ms": self.lower_bound_ms,
                "gap": self.gap,
                **({"step_ms": self.step[0], "step_lower_bound_ms": self.step[1], "step_gap": self.step_gap}
                   if self.step is not None else {}),
                "solver": self.solver,
                "solve_seconds": self.solve_seconds,
            },
            **({"inputs": self.inputs.to_dict()} if self.inputs is not None else {}),
            **({"replication": self.replication.to_dict()} if self.replication is not None else {}),
        }

    def save(self, path: str | Path) -> None:
        json_file.write_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        doc = json_file.read(path, "plan file", f"create one with 'dlrm-scale plan --out {path}'", "dlrm-scale plan", PlanFormatError)
        return cls.from_dict(doc, source=str(path))

    @classmethod
    def from_dict(cls, doc: Any, source: str = "plan") -> Plan:
        reader = _Reader(source)
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise PlanFormatError(f"{source}: not a {SCHEMA} document (schema is {doc.get('schema') if isinstance(doc, dict) else None!r})")
        world = reader.need(doc, "world_size", int, "plan")
        local = reader.need(doc, "ranks_per_node", int, "plan")
        if world < 1 or local < 1 or world % local:
            raise PlanFormatError(f"{source}: world_size {world} must be a positive multiple of ranks_per_node {local}")
        tables = {name: reader.table(name, t, world, local) for name, t in reader.need(doc, "tables", dict, "plan").items()}
        ranks = [reader.rank(i, r) for i, r in enumerate(reader.need(doc, "ranks", list, "plan") if "ranks" in doc else [])]
        predicted = reader.need(doc, "predicted", dict, "plan") if "predicted" in doc else {}
        for key in ("max_rank_ms", "lower_bound_ms", "solve_seconds", "step_ms", "step_lower_bound_ms"):
            if key in predicted:
                reader.number(predicted, key, "plan.predicted")
        step = None
        if "step_ms" in predicted or "step_lower_bound_ms" in predicted:
            step = (reader.number(predicted, "step_ms", "plan.predicted"), reader.number(predicted, "step_lower_bound_ms", "plan.predicted"))
            if step[1] <= 0:
                raise PlanFormatError(f"{source}: plan.predicted.step_lower_bound_ms is {step[1]}, not a positive number")
        inputs = PlanInputs.from_dict(reader.need(doc, "inputs", dict, "plan"), source) if "inputs" in doc else None
        replication = reader.replication(reader.need(doc, "replication", dict, "plan"), world) if "replication" in doc else None
        return cls(
            world_size=world,
            ranks_per_node=local,
            tables=tables,
            ranks=tuple(ranks),
            max_rank_ms=float(predicted.get("max_rank_ms", 0.0)),
            lower_bound_ms=float(predicted.get("lower_bound_ms", 0.0)),
            cost_model=str(doc.get("cost_model", "ours")),
            solver=str(predicted.get("solver", "")),
            solve_seconds=float(predicted.get("solve_seconds", 0.0)),
            inputs=inputs,
            step=step,
            replication=replication,
        )


class _Reader:
    """Typed reads of one plan document's fields, each failure one line naming the field."""

    def __init__(self, source: str) -> None:
        self.source = source

    def need(self, obj: Any, key: str, kind: type | tuple, where: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise PlanFormatError(f"{self.source}: {where} has no '{key}'")
        value = obj[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise PlanFormatError(f"{self.source}: {where}.{key} has the wrong type ({type(value).__name__})")
        return value

    def number(self, obj: Any, key: str, where: str, default: float | None = None) -> float:
        """A finite number (a prediction, a byte count) as a float."""
        if default is not None and (not isinstance(obj, dict) or key not in obj):
            return default
        value = self.need(obj, key, (int, float), where)
        if isinstance(value, int) and abs(value) > 2**63 or not math.isfinite(value):
            raise PlanFormatError(f"{self.source}: {where}.{key} is {str(value)[:20]}, not a finite number")
        return float(value)

    def replication(self, r: Any, world: int) -> Replication:
        where = "plan.replication"
        group, replicas, every = (self.need(r, k, int, where) for k in ("group_size", "replicas", "sync_every_steps"))
        if group != world or replicas < 2 or every < 1:
            raise PlanFormatError(f"{self.source}: {where} must name the plan's world size {world} as group_size, "
                                  f"replicas >= 2 and sync_every_steps >= 1 (got {group}, {replicas}, {every})")
        strategy = self.need(r, "strategy", str, where)
        if strategy != REPLICA_STRATEGY:
            raise PlanFormatError(f"{self.source}: {where}.strategy {strategy!r} is not {REPLICA_STRATEGY!r} (the one dlrm-scale plans)")
        return Replication(group, replicas, every, self.number(r, "sync_ms", where), self.number(r, "shared_ms", where), strategy)

    def table(self, name: str, t: Any, world: int, local: int) -> TablePlan:
        source, where = self.source, f"tables[{name!r}]"
        st = self.need(t, "sharding_type", str, where)
        if st not in {s.value for s in ShardingType}:
            raise PlanFormatError(f"{source}: {where}.sharding_type {st!r} is not one of {[s.value for s in ShardingType]}")
        kernel = self.need(t, "compute_kernel", str, where)
        if kernel not in KERNELS:
            raise PlanFormatError(f"{source}: {where}.compute_kernel {kernel!r} is not one of {list(KERNELS)}")
        shards = [self.shard(f"{where}.shards[{i}]", s, kernel, world) for i, s in enumerate(self.need(t, "shards", list, where))]
        if not shards:
            raise PlanFormatError(f"{source}: {where} has no shards")
        load_factor = None
        if kernel in CACHED_KERNELS:
            load_factor = self.need(t, "cache_load_factor", (int, float), where)
            if not 0 < load_factor <= 1:
                raise PlanFormatError(f"{source}: {where}.cache_load_factor {load_factor} must be in (0, 1]")
        rows = self.need(t, "num_embeddings", int, where) if "num_embeddings" in t else max(s.row_offset + s.rows for s in shards)
        cols = self.need(t, "embedding_dim", int, where) if "embedding_dim" in t else max(s.col_offset + s.cols for s in shards)
        if rows < 1 or cols < 1:
            raise PlanFormatError(f"{source}: {where} is {rows}x{cols}; a table needs at least one row and column")
        table = TablePlan(st, kernel, rows, cols, tuple(shards), load_factor)
        check_geometry(name, table, source)
        check_torchrec_shape(name, table, source)
        check_placement(name, table, world, local, source)
        return table

    def shard(self, where: str, s: Any, kernel: str, world: int) -> PlannedShard:
        vals = [self.need(s, k, int, where) for k in ("rank", "row_offset", "col_offset", "rows", "cols")]
        if not 0 <= vals[0] < world or min(vals[1:]) < 0:
            raise PlanFormatError(f"{self.source}: {where} has rank {vals[0]} outside 0..{world - 1} or a negative size")
        tier = self.need(s, "tier", str, where)
        if tier not in TIERS:
            raise PlanFormatError(f"{self.source}: {where}.tier {tier!r} is not one of {list(TIERS)}")
        cache = 0
        if kernel in CACHED_KERNELS:
            cache = self.need(s, "cache_rows", int, where)
            if not 0 < cache <= max(1, vals[3]):
                raise PlanFormatError(f"{self.source}: {where}.cache_rows {cache} must be in 1..{vals[3]} (the shard's rows)")
        return PlannedShard(*vals, tier, cache)

    def rank(self, i: int, r: Any) -> RankPlan:
        where = f"ranks[{i}]"
        b = self.need(r, "breakdown_ms", dict, where) if isinstance(r, dict) and "breakdown_ms" in r else {}
        perf = Perf(*(self.number(b, k, f"{where}.breakdown_ms", 0.0) for k in ("fwd_compute", "fwd_comms", "bwd_compute", "bwd_comms", "input_dist")))
        if not b:
            perf = Perf(fwd_compute_ms=self.number(r, "predicted_ms", where))
        mem = self.need(r, "memory_bytes", dict, where)
        return RankPlan(self.need(r, "rank", int, where), perf,
                        Storage(*(int(self.number(mem, t, f"{where}.memory_bytes", 0.0)) for t in TIERS)))


def _table_dict(t: TablePlan) -> dict[str, Any]:
    def shard(s: PlannedShard) -> dict[str, Any]:
        out = {"rank": s.rank, "row_offset": s.row_offset, "col_offset": s.col_offset, "rows": s.rows, "cols": s.cols, "tier": s.tier}
        if t.cached:
            out["cache_rows"] = s.cache_rows
        return out

    out = {"sharding_type": t.sharding_type, "compute_kernel": t.compute_kernel,
           "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim}
    if t.cached:
        out["cache_load_factor"] = t.cache_load_factor
    out["shards"] = [shard(s) for s in t.shards]
    return out


def table_layout(table: TableSpec, sharding_type: ShardingType, ranks: Sequence[int], tier: str,
                 cache_load_factor: float | None = None, ranks_per_node: int = 0) -> TablePlan:
    """A table laid out by hand (tests, benchmarks, hand-written plans): `sharding_type` cut into
    len(ranks) shards (replicas for data_parallel), shard i on ranks[i] (a grid's in
    shard_geometry's order, on nodes of `ranks_per_node`); with a cache load factor, rows in
    `tier` behind a cache of that fraction of each shard's rows."""
    geometries = shard_geometry(table, sharding_type, len(ranks), ranks_per_node)
    cached = cache_load_factor is not None
    shards = tuple(
        PlannedShard(r, g.row_offset, g.col_offset, g.rows, g.cols, tier, cache_rows(g.rows, cache_load_factor) if cached else 0)
        for r, g in zip(ranks, geometries)
    )
    kernel = cached_kernel_for(tier) if cached else compute_kernel_for(sharding_type)
    return TablePlan(sharding_type.value, kernel, table.num_embeddings, table.embedding_dim, shards, cache_load_factor)


def uniform_plan(problem: PlanningProblem, sharding_type: ShardingType) -> Plan:
    """Every table laid out the same way in the device tier (the baselines a planner is measured
    against): table-wise tables dealt round the ranks, the other schemes over every rank."""
    world, tier = problem.cluster.world_size, problem.cluster.device_tier
    tables = {t.name: table_layout(t, sharding_type, [i % world] if sharding_type is ShardingType.TABLE_WISE else list(range(world)), tier)
              for i, t in enumerate(problem.tables)}
    return Plan(world, problem.cluster.ranks_per_node, tables, (), 0.0, 0.0)


def check_placement(name: str, table: TablePlan, world: int, local: int, source: str = "plan") -> None:
    """The rank layouts TorchRec's row-wise schemes assume: row block i on rank i (row_wise),
    or on local rank i of one node (table_row_wise, and each column block of a grid_shard on a
    node of its own); data_parallel replicas on every rank."""
    ranks = [s.rank for s in sorted(table.shards, key=lambda s: s.row_offset)]
    st = table.sharding_type
    if st == ShardingType.GRID_SHARD.value:
        blocks = [[s.rank for s in block] for block in _column_blocks(table)]
        nodes = [block[0] // local for block in blocks]
        if len(set(nodes)) != len(blocks) or any(block != [n * local + i for i in range(local)] for n, block in zip(nodes, blocks)):
            raise PlanFormatError(f"{source}: grid_shard table {name!r} must put each column block's row block i on local "
                                  f"rank i of a node, one node a block")
    if st in ("row_wise", "data_parallel") and sorted(ranks) != list(range(world)):
        raise PlanFormatError(f"{source}: {st} table {name!r} must have one shard on every one of the {world} ranks")
    if st == "row_wise" and ranks != list(range(world)):
        raise PlanFormatError(f"{source}: row_wise table {name!r} must put row block i on rank i, as TorchRec does")
    if st == "table_row_wise":
        node = ranks[0] // local
        if ranks != [node * local + i for i in range(len(ranks))] or len(ranks) != local:
            raise PlanFormatError(f"{source}: table_row_wise table {name!r} must put row block i on local rank i of one node")


def check_torchrec_shape(name: str, table: TablePlan, source: str = "plan") -> None:
    """The shapes TorchRec's sharders assume of each scheme, which a plan that merely covers
    its table can break (TorchRec would clamp ids or fail deep in sharding): one whole shard
    (table-wise), row blocks of ceil(rows / shards) in order (row-wise, as its bucketizer cuts
    them), full-height column shards a multiple of COLUMN_ALIGNMENT wide (column-wise)."""
    st, rows, cols = table.sharding_type, table.num_embeddings, table.embedding_dim
    shards = sorted(table.shards, key=lambda s: (s.row_offset, s.col_offset))
    if st == ShardingType.TABLE_WISE.value and len(shards) != 1:
        raise PlanFormatError(f"{source}: table_wise table {name!r} must be one shard, not {len(shards)}; use row_wise or column_wise to split it")
    if st in (ShardingType.ROW_WISE.value, ShardingType.TABLE_ROW_WISE.value):
        want = row_blocks(rows, len(shards))
        got = [(s.row_offset, s.rows) for s in shards]
        if any(s.cols != cols for s in shards) or got != want:
            raise PlanFormatError(f"{source}: {st} table {name!r} must be cut into full-width row blocks of "
                                  f"{want[0][1]} rows (ceil of {rows} / {len(shards)}), as TorchRec cuts them; got {[r for _, r in got]}")
    if st == ShardingType.GRID_SHARD.value:
        blocks = _column_blocks(table)
        want = row_blocks(rows, len(blocks[0]))
        got = [[(s.row_offset, s.rows) for s in block] for block in blocks]
        if any(g != want for g in got) or any(s.cols % COLUMN_ALIGNMENT for s in shards):
            raise PlanFormatError(f"{source}: grid_shard table {name!r} must be cut into column blocks a multiple of "
                                  f"{COLUMN_ALIGNMENT} wide, each into row blocks of {want[0][1]} rows (ceil of {rows} / "
                                  f"{len(blocks[0])}), as TorchRec cuts them")
    if st in (ShardingType.COLUMN_WISE.value, ShardingType.TABLE_COLUMN_WISE.value):
        if any(s.rows != rows for s in shards):
            raise PlanFormatError(f"{source}: {st} table {name!r} must be cut into full-height column shards")
        widths = [s.cols for s in shards]
        if any(w < 1 or w % COLUMN_ALIGNMENT for w in widths):
            raise PlanFormatError(f"{source}: {st} table {name!r} has column shards {widths} wide; TorchRec needs each a positive "
                                  f"multiple of {COLUMN_ALIGNMENT}")


def _column_blocks(table: TablePlan) -> list[list[PlannedShard]]:
    """A grid's shards by column block, left to right, each block's in row order."""
    blocks: dict[int, list[PlannedShard]] = {}
    for s in sorted(table.shards, key=lambda s: (s.col_offset, s.row_offset)):
        blocks.setdefault(s.col_offset, []).append(s)
    return list(blocks.values())


def check_geometry(name: str, table: TablePlan, source: str = "plan") -> None:
    """Every (row, column) of the table is covered exactly once, or once per rank for DP."""
    rows, cols = table.num_embeddings, table.embedding_dim
    if table.sharding_type == ShardingType.DATA_PARALLEL.value:
        bad = [s for s in table.shards if (s.row_offset, s.col_offset, s.rows, s.cols) != (0, 0, rows, cols)]
        if bad or len({s.rank for s in table.shards}) != len(table.shards):
            raise PlanFormatError(f"{source}: data_parallel table {name!r} must list one full replica per rank")
        return
    area = 0
    for s in table.shards:
        if s.row_offset + s.rows > rows or s.col_offset + s.cols > cols:
            raise PlanFormatError(f"{source}: a shard of {name!r} reaches past its {rows}x{cols} table")
        area += s.rows * s.cols
    blocks = [(s.row_offset, s.col_offset, s.rows, s.cols) for s in table.shards if s.rows and s.cols]
    if all(b[3] == cols for b in blocks) or all(b[2] == rows for b in blocks):
        axis = 0 if all(b[3] == cols for b in blocks) else 1  # stripes: a 1-D interval check
        spans = sorted((b[axis], b[axis] + b[axis + 2]) for b in blocks)
        overlap = any(nxt[0] < cur[1] for cur, nxt in zip(spans, spans[1:]))
    else:
        overlap = any(
            b[0] < a[0] + a[2] and a[0] < b[0] + b[2] and b[1] < a[1] + a[3] and a[1] < b[1] + b[3]
            for i, a in enumerate(blocks) for b in blocks[i + 1:]
        )
    if overlap:
        raise PlanFormatError(f"{source}: shards of {name!r} overlap")
    if area != rows * cols:
        raise PlanFormatError(f"{source}: shards of {name!r} cover {area} of its {rows * cols} weights")


def check_plan_tables(plan: Plan, problem: PlanningProblem) -> None:
    """The plan covers exactly the problem's tables, at their shapes, on its world size."""
    world = problem.cluster.world_size
    if plan.world_size != world:
        raise PlanFormatError(f"plan is for {plan.world_size} ranks but the job has {world}; re-plan with --world-size {world}")
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


def check_plan_inputs(plan: Plan, problem: PlanningProblem, source: str = "plan", fix: str = "re-plan for it with 'dlrm-scale plan'") -> None:
    """check_plan_tables, then the inputs the plan records against the run's (a plan written by
    hand records none): a plan priced for another run is refused, naming what differs."""
    check_plan_tables(plan, problem)
    if plan.inputs is None:
        return
    why = plan.inputs.mismatch(PlanInputs.of(problem))
    if why:
        raise PlanFormatError(f"{source} does not fit this run: {why}; {fix}")

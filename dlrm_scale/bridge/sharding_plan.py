"""Plan <-> TorchRec `ShardingPlan`: the only place that knows both formats. On CPU the plan
TorchRec shards is the resident one (bridge.resident), whoever asks."""

from __future__ import annotations

from typing import Sequence

from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
from torchrec.distributed.planner.utils import placement
from torchrec.distributed.types import CacheParams, EmbeddingModuleShardingPlan, KeyValueParams, ParameterSharding, ShardingPlan

from dlrm_scale.bridge.resident import resident_plan
from planner.plan.document import Plan, PlannedShard, TablePlan
from planner.spec.schemes import CACHED_KERNELS, cache_rows

DEFAULT_CACHE_LOAD_FACTOR = 0.2  # what TorchRec's planner assumes when a caching plan gives none


def parameter_sharding(table: TablePlan, device: str, ranks_per_node: int, store_dir: str | None = None,
                       job_ranks: Sequence[int] | None = None) -> ParameterSharding:
    """TorchRec's sharding of one table. Cached tables keep their kernel (FBGEMM's UVM cache or
    SSD key-value store, CUDA-only) with the plan's load factor, and an SSD table its files in
    `store_dir` (per table: FBGEMM's other kernels refuse the SSD parameters); on CPU
    to_sharding_plan shards their resident caches instead. `job_ranks[k]`: the job's rank that
    holds the plan's rank k (a 2D plan is one sharding group's; `ranks_per_node` is then the job's)."""
    job_rank = (lambda k: k) if job_ranks is None else job_ranks.__getitem__
    ranks = [job_rank(k) for k in table.ranks]
    if table.sharding_type == "data_parallel":
        return ParameterSharding(sharding_type="data_parallel", compute_kernel=table.compute_kernel, ranks=ranks)
    spec = EnumerableShardingSpec(
        [
            ShardMetadata(
                shard_offsets=[s.row_offset, s.col_offset],
                shard_sizes=[s.rows, s.cols],
                placement=placement(device, job_rank(s.rank), ranks_per_node),  # cuda: the rank's local GPU
            )
            for s in table.shards
        ]
    )
    cache = CacheParams(load_factor=table.cache_load_factor) if table.cached else None
    ssd = KeyValueParams(ssd_storage_directory=store_dir) if table.compute_kernel == "key_value" and store_dir else None
    return ParameterSharding(
        sharding_type=table.sharding_type, compute_kernel=table.compute_kernel, ranks=ranks, sharding_spec=spec,
        cache_params=cache, key_value_params=ssd,
    )


def to_sharding_plan(plan: Plan, device: str = "cpu", module_path: str = "", store_dir: str | None = None,
                     job_ranks: Sequence[int] | None = None, ranks_per_node: int | None = None) -> ShardingPlan:
    """TorchRec's plan for one EmbeddingBagCollection at `module_path` (e.g.
    "model.sparse_arch.embedding_bag_collection"); FBGEMM's SSD tables keep their files in `store_dir`.
    A 2D plan's group ranks are placed on `job_ranks` (dlrm_scale.training.replicas), numbered on
    nodes of `ranks_per_node`, as TorchRec's 2D sharding reads them: job ranks, the group's
    process group."""
    if device == "cpu":
        plan = resident_plan(plan)
    local = ranks_per_node or plan.ranks_per_node
    per_table = EmbeddingModuleShardingPlan({name: parameter_sharding(t, device, local, store_dir, job_ranks)
                                             for name, t in plan.tables.items()})
    return ShardingPlan({module_path: per_table})


def shard_tier(compute_kernel: str, device: str) -> str:
    """The tier TorchRec's kernels keep a shard's rows in."""
    if compute_kernel == "key_value":
        return "ssd"
    if compute_kernel.startswith("fused_uvm") or device == "cpu":
        return "ddr"
    return "hbm"


def from_sharding_plan(
    sharding_plan: ShardingPlan,
    shapes: dict[str, tuple[int, int]],
    world_size: int,
    ranks_per_node: int,
    device: str,
    module_path: str = "",
) -> Plan:
    """Our plan's table section from TorchRec's plan (rank costs are not part of a ShardingPlan)."""
    tables = {}
    for name, ps in sharding_plan.plan[module_path].items():
        rows, cols = shapes[name]
        tier = shard_tier(ps.compute_kernel, device)
        if ps.sharding_spec is None:
            shards = [PlannedShard(r, 0, 0, rows, cols, tier) for r in ps.ranks]
        else:
            load_factor = ps.cache_params.load_factor if ps.cache_params is not None else None
            cached = ps.compute_kernel in CACHED_KERNELS
            if cached and load_factor is None:
                load_factor = DEFAULT_CACHE_LOAD_FACTOR
            shards = [
                PlannedShard(
                    m.placement.rank(), m.shard_offsets[0], m.shard_offsets[1], m.shard_sizes[0], m.shard_sizes[1], tier,
                    cache_rows(m.shard_sizes[0], load_factor) if cached else 0,
                )
                for m in ps.sharding_spec.shards
            ]
        tables[name] = TablePlan(ps.sharding_type, ps.compute_kernel, rows, cols, tuple(shards), load_factor if ps.compute_kernel in CACHED_KERNELS else None)
    return Plan(world_size=world_size, ranks_per_node=ranks_per_node, tables=tables, ranks=(), max_rank_ms=0.0, lower_bound_ms=0.0)

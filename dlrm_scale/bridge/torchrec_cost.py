"""TorchRec's own estimators behind our interfaces, and TorchRec's planner as a baseline.

- `TorchRecCostModel` implements planner.cost.cost_model.CostModel with TorchRec's
  EmbeddingPerfEstimator and EmbeddingStorageEstimator, so our search and TorchRec's can be
  compared on equal terms (`dlrm-scale plan --cost-model torchrec`).
- `torchrec_planner_plan` runs TorchRec's EmbeddingShardingPlanner on the same inputs.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Sequence

import torch
import torchrec.distributed.planner.constants as torchrec_constants
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.planner.enumerators import get_partition_by_type
from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.distributed.planner.types import Shard as TRShard
from torchrec.distributed.planner.types import ShardingOption as TRShardingOption
from torchrec.distributed.planner.utils import build_sharder_data_map, sharder_name
from torchrec.distributed.types import CacheParams
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm_scale.bridge.sharders import WideEmbeddingBagCollectionSharder
from dlrm_scale.bridge.sharding_plan import from_sharding_plan
from planner.cost.cost_model import OptionRequest
from planner.plan.document import Plan
from planner.plan.inputs import PlanInputs
from planner.spec.errors import ConfigError
from planner.spec.specs import ClusterSpec, CostConstants, TableSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import Perf, ShardCost, ShardingOption, Storage

GB_PER_S_TO_BYTES_PER_MS = 1e9 / 1e3

# TorchRec's planner logs a long report at INFO and warns about topologies built by hand.
for _name in ("torchrec.distributed.planner", "torchrec.distributed.planner.types", "root"):
    logging.getLogger(_name).setLevel(logging.ERROR)


def torchrec_topology(cluster: ClusterSpec) -> Topology:
    """TorchRec's Topology with the bandwidths and capacities of our cluster spec."""
    return Topology(
        world_size=cluster.world_size,
        compute_device=cluster.device,
        local_world_size=cluster.ranks_per_node,
        hbm_cap=cluster.capacity_bytes_per_rank("hbm") if cluster.device == "cuda" else None,
        ddr_cap=cluster.capacity_bytes_per_rank("ddr"),
        hbm_mem_bw=cluster.costs.hbm_gb_per_s * GB_PER_S_TO_BYTES_PER_MS,
        ddr_mem_bw=cluster.costs.ddr_gb_per_s * GB_PER_S_TO_BYTES_PER_MS,
        intra_host_bw=cluster.costs.intra_node_gb_per_s * GB_PER_S_TO_BYTES_PER_MS,
        inter_host_bw=cluster.costs.inter_node_gb_per_s * GB_PER_S_TO_BYTES_PER_MS,
    )


def torchrec_default_cluster(world_size: int, ranks_per_node: int = 8) -> ClusterSpec:
    """A CUDA cluster with TorchRec's own default topology constants (its planner's `Topology()`
    without arguments: 32 GiB HBM and 128 GiB DDR per rank, its HBM, DDR, intra- and
    inter-node bandwidths), for comparing searches on TorchRec's terms."""
    local = min(ranks_per_node, world_size)
    gb_per_s = lambda bytes_per_ms: bytes_per_ms / GB_PER_S_TO_BYTES_PER_MS  # noqa: E731
    return ClusterSpec(
        num_nodes=max(1, world_size // local), ranks_per_node=local, device="cuda",
        hbm_bytes_per_rank=torchrec_constants.HBM_CAP, ddr_bytes_per_node=torchrec_constants.DDR_CAP * local,
        ssd_bytes_per_node=torchrec_constants.SSD_CAP * local,
        costs=CostConstants(hbm_gb_per_s=gb_per_s(torchrec_constants.HBM_MEM_BW), ddr_gb_per_s=gb_per_s(torchrec_constants.DDR_MEM_BW),
                            ssd_gb_per_s=gb_per_s(torchrec_constants.SSD_MEM_BW),
                            intra_node_gb_per_s=gb_per_s(torchrec_constants.INTRA_NODE_BANDWIDTH),
                            inter_node_gb_per_s=gb_per_s(torchrec_constants.CROSS_NODE_BANDWIDTH)),
        name="torchrec_default",
    )


def meta_collection(tables: Sequence[TableSpec]) -> EmbeddingBagCollection:
    configs = [
        EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings, feature_names=[f"f_{t.name}"])
        for t in tables
    ]
    return EmbeddingBagCollection(tables=configs, device=torch.device("meta"))


def constraints_for(tables: Sequence[TableSpec]) -> dict[str, ParameterConstraints]:
    return {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in tables}


class TorchRecEstimates:
    """TorchRec's perf and storage estimators for one problem, over a meta-device collection."""

    def __init__(self, problem: PlanningProblem) -> None:
        unpooled = [t.name for t in problem.tables if not t.pooled]
        if unpooled:  # its collection here is an EmbeddingBagCollection: it would price the table as pooled
            raise ConfigError(f"table {unpooled[0]!r} is unpooled: TorchRec's estimators are asked here for pooled tables only; "
                              f"plan it with --cost-model ours, without --compare torchrec")
        self.problem = problem
        self.topology = torchrec_topology(problem.cluster)
        self.constraints = constraints_for(problem.tables)
        self.collection = meta_collection(problem.tables)
        sharder = WideEmbeddingBagCollectionSharder()
        self.sharder_data_map = build_sharder_data_map({sharder_name(type(self.collection)): sharder})
        self.perf = EmbeddingPerfEstimator(topology=self.topology, constraints=self.constraints)
        self.storage = EmbeddingStorageEstimator(topology=self.topology, constraints=self.constraints)

    def option(self, table: TableSpec, sharding_type: str, compute_kernel: str, blocks: Sequence[tuple[int, int, int, int, int | None]],
               cache_load_factor: float | None = None) -> TRShardingOption:
        """A TorchRec ShardingOption; blocks are (row_offset, col_offset, rows, cols, rank)."""
        return TRShardingOption(
            name=table.name,
            tensor=self.collection.embedding_bags[table.name].weight,
            module=("", self.collection),
            input_lengths=[table.pooling_factor],
            batch_size=self.problem.training.batch_size_per_rank,
            sharding_type=sharding_type,
            partition_by=get_partition_by_type(sharding_type),
            compute_kernel=compute_kernel,
            shards=[TRShard(size=[r, c], offset=[ro, co], rank=rank) for ro, co, r, c, rank in blocks],
            is_pooled=True,
            cache_params=CacheParams(load_factor=cache_load_factor) if cache_load_factor is not None else None,
        )

    def estimate(self, options: list[TRShardingOption]) -> None:
        self.perf.estimate(options, sharder_data_map=self.sharder_data_map)
        self.storage.estimate(options, sharder_data_map=self.sharder_data_map)


def _perf(p) -> Perf:
    # Same total as TorchRec's Perf.total: input-dist comms are not part of it there either.
    return Perf(p.fwd_compute + p.prefetch_compute, p.fwd_comms, p.bwd_compute, p.bwd_comms)


def _storage(s) -> Storage:
    return Storage(int(s.hbm), int(s.ddr), int(s.ssd))


class TorchRecCostModel:
    """CostModel backed by TorchRec's estimators (same topology, batch and pooling factors)."""

    name = "torchrec"

    def __init__(self, problem: PlanningProblem) -> None:
        self.estimates = TorchRecEstimates(problem)

    def estimate(self, requests: Sequence[OptionRequest]) -> list[ShardingOption]:
        tr_options = [
            self.estimates.option(
                req.table, req.sharding_type.value, req.compute_kernel,
                [(g.row_offset, g.col_offset, g.rows, g.cols, None) for g in req.geometries],
                req.cache_fraction if req.cached else None,
            )
            for req in requests
        ]
        self.estimates.estimate(tr_options)
        out = []
        for req, tro in zip(requests, tr_options):
            shards = tuple(ShardCost(_perf(s.perf), _storage(s.storage)) for s in tro.shards)
            out.append(ShardingOption(req.table.name, req.sharding_type, req.compute_kernel, req.tier, req.geometries, shards,
                                      req.cache_fraction))
        return out


def torchrec_planner_plan(problem: PlanningProblem) -> tuple[Plan, float]:
    """TorchRec's EmbeddingShardingPlanner on the same inputs; returns its plan and seconds taken."""
    estimates = TorchRecEstimates(problem)
    planner = EmbeddingShardingPlanner(
        topology=estimates.topology,
        batch_size=problem.training.batch_size_per_rank,
        constraints=estimates.constraints,
    )
    start = time.perf_counter()
    # TorchRec as users get it: its stock sharder (no row-wise schemes on CPU).
    sharding_plan = planner.plan(estimates.collection, [EmbeddingBagCollectionSharder()])
    seconds = time.perf_counter() - start
    shapes = {t.name: (t.num_embeddings, t.embedding_dim) for t in problem.tables}
    cluster = problem.cluster
    plan = from_sharding_plan(sharding_plan, shapes, cluster.world_size, cluster.ranks_per_node, cluster.device)
    return replace(plan, inputs=PlanInputs.of(problem)), seconds

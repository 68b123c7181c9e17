"""Candidate sharding options per table: every scheme and shard count worth trying, costed.

Tables with the same shape and access pattern are costed once (a model often has hundreds
of look-alike tables), and options whose largest shard cannot fit on any rank are dropped.
"""

from __future__ import annotations

from dataclasses import replace

from planner.cost_model import CostModel, OptionRequest
from planner.errors import InfeasiblePlanError
from planner.schemes import shard_counts, shard_geometry
from planner.specs import ClusterSpec, PlanningProblem, TableSpec
from planner.types import TIERS, ShardingOption, ShardingType


def compute_kernel_for(sharding_type: ShardingType) -> str:
    """TorchRec's kernel names: replicas train with the dense kernel, shards with fused TBE."""
    return "dense" if sharding_type is ShardingType.DATA_PARALLEL else "fused"


def option_requests(table: TableSpec, cluster: ClusterSpec, int8_comms: bool = False) -> list[OptionRequest]:
    requests = []
    for sharding_type in ShardingType:
        for n in shard_counts(table, sharding_type, cluster, int8_comms):
            requests.append(
                OptionRequest(
                    table=table,
                    sharding_type=sharding_type,
                    compute_kernel=compute_kernel_for(sharding_type),
                    tier=cluster.device_tier,
                    geometries=tuple(shard_geometry(table, sharding_type, n)),
                )
            )
    return requests


def _signature(table: TableSpec) -> tuple:
    return (table.num_embeddings, table.embedding_dim, table.pooling_factor, table.zipf_exponent)


def fits_one_rank(option: ShardingOption, cluster: ClusterSpec) -> bool:
    largest = option.shard_bytes.max(axis=0)
    return all(int(largest[i]) <= cluster.capacity_bytes_per_rank(tier) for i, tier in enumerate(TIERS))


def enumerate_options(problem: PlanningProblem, cost_model: CostModel) -> dict[str, list[ShardingOption]]:
    """Costed options per table name, in the order of `problem.tables`.

    Raises InfeasiblePlanError naming the first table none of whose options fits on a rank.
    """
    cluster = problem.cluster
    int8 = "int8" in (problem.training.fwd_comm_precision, problem.training.bwd_comm_precision)
    representative: dict[tuple, TableSpec] = {}
    for table in problem.tables:
        representative.setdefault(_signature(table), table)
    requests, owners = [], []
    for sig, table in representative.items():
        for req in option_requests(table, cluster, int8):
            requests.append(req)
            owners.append(sig)
    costed: dict[tuple, list[ShardingOption]] = {sig: [] for sig in representative}
    for sig, option in zip(owners, cost_model.estimate(requests)):
        costed[sig].append(option)

    result = {}
    for table in problem.tables:
        options = [o for o in costed[_signature(table)] if fits_one_rank(o, cluster)]
        if not options:
            _raise_too_large(table, costed[_signature(table)], cluster)
        result[table.name] = [o if o.table == table.name else replace(o, table=table.name) for o in options]
    return result


def _raise_too_large(table: TableSpec, options: list[ShardingOption], cluster: ClusterSpec) -> None:
    tier = cluster.device_tier
    smallest = min(options, key=lambda o: max(s.storage.of_tier(tier) for s in o.shards))
    need = max(s.storage.of_tier(tier) for s in smallest.shards)
    have = cluster.capacity_bytes_per_rank(tier)
    raise InfeasiblePlanError(
        f"table '{table.name}' does not fit: its smallest shard ({smallest.label}) needs {need:,} bytes of "
        f"{tier} but a rank has {have:,}; add ranks (--world-size), give more memory per rank, "
        f"or reduce num_embeddings/embedding_dim"
    )

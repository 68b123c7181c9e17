"""Candidate sharding options per table: every scheme and shard count worth trying, costed.

Tables with the same shape and access pattern are costed once (a model often has hundreds
of look-alike tables), and options whose largest shard cannot fit on any rank are dropped.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Iterable, Mapping, Sequence

from planner.search.collector import collector_paused
from planner.spec.access_stats import TableAccess, table_access
from planner.cost.cost_model import CostModel, OptionRequest, cached_request, rows_bytes
from planner.spec.errors import InfeasiblePlanError
from planner.spec.schemes import CACHEABLE, compute_kernel_for, row_group, shard_counts, shard_geometry
from planner.spec.specs import ClusterSpec, TableSpec, TieringSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import TIERS, ShardingOption, ShardingType

MIN_CACHE_BATCHES = 2  # smaller caches evict rows the same batch needs (and overflow)


def worth_caching(table: TableSpec, problem: PlanningProblem) -> bool:
    """Whether cached options are offered for `table`: tiering is on, a slower tier exists, and
    the table is large against device memory or its constraints keep its rows off the device."""
    cluster, tiering = problem.cluster, problem.tiering
    if not (tiering.enabled and cluster.backing_tiers):
        return False
    if problem.constraints is not None and problem.constraints.excludes_tier(table.name, cluster.device_tier):
        return True
    fast = cluster.capacity_bytes_per_rank(cluster.device_tier)
    size = rows_bytes(table.num_embeddings, table.embedding_dim, problem.training.embedding_optimizer)
    return size > tiering.min_table_fraction * fast


def option_requests(
    table: TableSpec,
    cluster: ClusterSpec,
    int8_comms: bool = False,
    access: TableAccess | None = None,
    tiering: TieringSpec | None = None,
    batch_size_per_rank: int = 0,
    schemes: Iterable[ShardingType] = ShardingType,
) -> list[OptionRequest]:
    """Every scheme (of `schemes`) and shard count with all rows in the device tier; and, given
    `access` and `tiering`, each cacheable one again per backing tier and cache load factor,
    when the cache holds MIN_CACHE_BATCHES steps' distinct rows."""
    problem_batch = batch_size_per_rank * cluster.world_size
    requests = []
    for sharding_type in schemes:
        for n in shard_counts(table, sharding_type, cluster, int8_comms):
            geometries = tuple(shard_geometry(table, sharding_type, n, cluster.ranks_per_node))
            requests.append(OptionRequest(table, sharding_type, compute_kernel_for(sharding_type), cluster.device_tier, geometries))
            if access is None or tiering is None or sharding_type not in CACHEABLE[cluster.device]:
                continue
            # ids one shard sees per step; a cache must hold a step's distinct rows twice over
            ids = problem_batch * table.pooling_factor / row_group(sharding_type, cluster.world_size, cluster.ranks_per_node)
            for tier in cluster.backing_tiers:
                for fraction in tiering.load_factors:
                    if fraction * min(g.rows for g in geometries) < MIN_CACHE_BATCHES * ids * access.unique_ratio:
                        continue
                    requests.append(cached_request(table, sharding_type, geometries, tier, fraction, access, tiering.policy))
    return requests


def grid_shard_counts(table: TableSpec, options: Sequence[ShardingOption], work_ms: float, problem: PlanningProblem,
                      int8_comms: bool) -> set[int]:
    """The grids a table is offered, as shard counts: every one where its constraints name
    grid_shard; else, where it is too hot for one node's row blocks (its table-row-wise shard
    above `work_ms`, the mean work per rank of every table's cheapest option, which no plan's
    busiest rank is under), the one of fewest column blocks that brings its shards under that
    (each block's node takes all of the table's ids, so more blocks only add work), or its
    finest; none elsewhere, where a grid only adds work and options to search."""
    counts = shard_counts(table, ShardingType.GRID_SHARD, problem.cluster, int8_comms)
    if problem.constraints is not None and problem.constraints.names_scheme(table.name, ShardingType.GRID_SHARD.value):
        return set(counts)
    node_rows = [o.max_shard_ms for o in options if o.sharding_type is ShardingType.TABLE_ROW_WISE and o.cache_fraction >= 1.0]
    if not counts or not node_rows or not work_ms > 0 or min(node_rows) <= work_ms:
        return set()
    blocks = math.ceil(min(node_rows) / work_ms)
    local = problem.cluster.ranks_per_node
    return {next((n for n in counts if n // local >= blocks), counts[-1])}


def _signature(table: TableSpec, access: TableAccess | None) -> tuple:
    return (table.num_embeddings, table.embedding_dim, table.pooling_factor, table.zipf_exponent, table.pooled,
            table.outputs_per_sample, access)


def fits_one_rank(option: ShardingOption, cluster: ClusterSpec) -> bool:
    largest = option.shard_bytes.max(axis=0)
    return all(int(largest[i]) <= cluster.capacity_bytes_per_rank(tier) for i, tier in enumerate(TIERS))


@collector_paused()
def enumerate_options(problem: PlanningProblem, cost_model: CostModel) -> dict[str, list[ShardingOption]]:
    """Costed options per table name, in the order of `problem.tables`. Grids only as
    `grid_shard_counts` says, costed in a second round once the other options give the work bound.

    Raises InfeasiblePlanError naming the first table none of whose options fits on a rank.
    """
    cluster = problem.cluster
    int8 = "int8" in (problem.training.fwd_comm_precision, problem.training.bwd_comm_precision)
    accesses = {t.name: table_access(t, problem) if worth_caching(t, problem) else None for t in problem.tables}
    sigs = {t.name: _signature(t, accesses[t.name]) for t in problem.tables}
    representative: dict[tuple, TableSpec] = {}
    for table in problem.tables:
        representative.setdefault(sigs[table.name], table)
    costed: dict[tuple, list[ShardingOption]] = {sig: [] for sig in representative}

    def cost(tables: Mapping[tuple, TableSpec], schemes: Iterable[ShardingType], keep=lambda sig, req: True) -> None:
        requests, owners = [], []
        for sig, table in tables.items():
            for req in option_requests(table, cluster, int8, sig[-1], problem.tiering, problem.training.batch_size_per_rank, schemes):
                if keep(sig, req):
                    requests.append(req)
                    owners.append(sig)
        for sig, option in zip(owners, cost_model.estimate(requests) if requests else []):
            costed[sig].append(option)

    cost(representative, [st for st in ShardingType if st is not ShardingType.GRID_SHARD])
    work_ms = sum(min((o.total_ms for o in costed[sigs[t.name]]), default=0.0) for t in problem.tables) / cluster.world_size
    grids = {t.name: grid_shard_counts(t, costed[sigs[t.name]], work_ms, problem, int8) for t in problem.tables}
    wanted: dict[tuple, set[int]] = {}
    for name, counts in grids.items():
        wanted.setdefault(sigs[name], set()).update(counts)
    cost({sig: table for sig, table in representative.items() if wanted.get(sig)}, [ShardingType.GRID_SHARD],
         lambda sig, req: len(req.geometries) in wanted[sig])

    result = {}
    for table in problem.tables:
        sig = sigs[table.name]
        options = [o for o in costed[sig] if fits_one_rank(o, cluster)
                   and (o.sharding_type is not ShardingType.GRID_SHARD or len(o.shards) in grids[table.name])]
        if not options:
            _raise_too_large(table, costed[sig], cluster)
        if problem.constraints is not None:
            options = problem.constraints.allowed(table.name, options)
        result[table.name] = [o if o.table == table.name else replace(o, table=table.name) for o in options]
    return result


def _raise_too_large(table: TableSpec, options: list[ShardingOption], cluster: ClusterSpec) -> None:
    caps = [cluster.capacity_bytes_per_rank(t) for t in TIERS]

    def overflow(option: ShardingOption) -> tuple[float, int]:
        """The option's worst tier, as need / capacity of its largest shard."""
        largest = option.shard_bytes.max(axis=0)
        ratios = [largest[i] / caps[i] if caps[i] else (float("inf") if largest[i] else 0.0) for i in range(len(TIERS))]
        worst = max(range(len(TIERS)), key=lambda i: ratios[i])
        return ratios[worst], worst

    smallest = min(options, key=lambda o: overflow(o)[0])
    tier_index = overflow(smallest)[1]
    need = int(smallest.shard_bytes.max(axis=0)[tier_index])
    tier = TIERS[tier_index]
    raise InfeasiblePlanError(
        f"table '{table.name}' does not fit: its smallest shard ({smallest.label}) needs {need:,} bytes of "
        f"{tier} but a rank has {caps[tier_index]:,}; add ranks (--world-size), give more memory per rank, "
        f"or reduce num_embeddings/embedding_dim"
    )

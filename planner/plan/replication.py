"""2D sparse parallelism: the tables sharded over groups of G ranks, every group a replica of
the others, the replicas' tables brought together every N steps (TorchRec's `DMPCollection`
layout; the sync is ours, dlrm_scale.training.replicas: weights and optimizer state all-reduced
over each replica group, and after each step the rows two replicas looked up).

The groups are those `DMPCollection` makes by default: a replica group is R = W/G consecutive
ranks (inside one node where R <= L, so its all-reduce uses the fast link) and a sharding group
takes one rank of each, ranks g, g+R, g+2R, ...: L/R ranks on each node, or one rank on each of
G nodes where R is a multiple of L.

What a group size changes, and how the planner prices it:
- the step: a group's all-to-alls span G ranks, not W, and its shards serve the group's G x b
  samples: the plan of a G-rank cluster with the same batch per rank (`group_cluster`);
- the sync (`replication_of`): each step, the rows each replica is about to look up gathered
  over the R ranks of a replica group, the rows one changed that another will read and, after
  the step, those two looked up all-reduced; every N steps the rows one changed all-reduced;
  only rows its replicas looked up, expected from each table's Zipf law; its share per step is
  added to the group's step;
- memory: a rank holds R times the share of the tables it would hold in 1D, and beside its
  shards the copy its replicas last agreed on: a group is planned into half of each rank's
  device memory (`group_cluster`), its tables uncached (a cached table's copy would be the whole
  table in device memory), and a plan's ranks count the copy;
- the model: each replica updates its tables with its own samples' gradients, its rows synced
  as the others read them: the 1D model whatever N (docs/planner.md).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from planner.cost.cost_model import (WEIGHT_BYTES, all_gather_ms, all_reduce_ms, collective_ms, distinct_rows_per_step,
                                     optimizer_state_bytes, rows_bytes)
from planner.plan.document import Plan, RankPlan, Replication
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.errors import ConfigError, InfeasiblePlanError, PlanFormatError
from planner.spec.problem import PlanningProblem
from planner.spec.specs import ClusterSpec, TableSpec
from planner.spec.types import Storage

AGREED_COPIES = 2  # a rank's sharded tables and the copy its replicas last agreed on (dlrm_scale.training.replicas)
CHANGED_BY_BYTES = 2  # a rank keeps, per row of its shards, which replica changed it since they agreed (int16)
ID_BYTES = 4  # a row a replica looked up, as the replicas exchange them after each step (int32)


def check_sync_every(sync_every_steps: Any) -> int:
    if isinstance(sync_every_steps, bool) or not isinstance(sync_every_steps, int) or sync_every_steps < 1:
        raise ConfigError(f"--sync-every must be a whole number of steps >= 1 (replicas are synced that often), got {sync_every_steps!r}")
    return sync_every_steps


def check_group_size(cluster: ClusterSpec, group_size: Any) -> int:
    """A group size DMPCollection can lay out on this cluster, or one line saying which would do."""
    world, local = cluster.world_size, cluster.ranks_per_node
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1 or world % group_size:
        raise ConfigError(f"--group-size {group_size!r} must divide the world size {world}; use one of "
                          f"{', '.join(map(str, group_sizes(cluster)))}")
    if group_size not in group_sizes(cluster):
        raise ConfigError(f"--group-size {group_size} makes replica groups of {world // group_size} ranks, which neither divide a node's "
                          f"{local} ranks nor span whole nodes; use one of {', '.join(map(str, group_sizes(cluster)))}")
    return group_size


def group_sizes(cluster: ClusterSpec) -> list[int]:
    """Every group size a W-rank cluster can be split into, W (1D) first, then smaller."""
    world, local = cluster.world_size, cluster.ranks_per_node
    return [world // r for r in range(1, world + 1) if world % r == 0 and (local % r == 0 or r % local == 0)]


def group_cluster(cluster: ClusterSpec, group_size: int) -> ClusterSpec:
    """What one sharding group of `group_size` ranks is: its ranks per node and their share of
    each node's host memory and SSD (the node's other ranks belong to other groups), and half of
    the memory a rank computes from (the other half holds the copy its replicas agreed on)."""
    replicas, local = cluster.world_size // group_size, cluster.ranks_per_node
    per_node = local // replicas if replicas <= local else 1
    group = replace(cluster, num_nodes=group_size // per_node, ranks_per_node=per_node,
                    ddr_bytes_per_node=cluster.ddr_bytes_per_node * per_node // local,
                    ssd_bytes_per_node=cluster.ssd_bytes_per_node * per_node // local)
    if group.device_tier == "hbm":
        return replace(group, hbm_bytes_per_rank=group.hbm_bytes_per_rank // AGREED_COPIES)
    return replace(group, ddr_bytes_per_node=group.ddr_bytes_per_node // AGREED_COPIES)


def group_problem(problem: PlanningProblem, group_size: int) -> PlanningProblem:
    """The problem a group's plan solves: on a group's cluster, no table cached."""
    return replace(problem, cluster=group_cluster(problem.cluster, group_size), tiering=replace(problem.tiering, enabled=False))


def planned_problem(problem: PlanningProblem, plan: Plan) -> PlanningProblem:
    """The problem `plan` was made for, in the job `problem` describes: a 2D plan's is one
    sharding group's. One line where the job cannot run the plan's groups."""
    rep = plan.replication
    if rep is None:
        return problem
    cluster = problem.cluster
    if rep.job_world_size != cluster.world_size:
        raise PlanFormatError(f"plan is 2D for {rep.replicas} replicas of {rep.group_size} ranks ({rep.job_world_size} in all) but the job "
                              f"has {cluster.world_size}; re-plan with --world-size {cluster.world_size}")
    if rep.group_size not in group_sizes(cluster):
        raise PlanFormatError(f"plan's replica groups of {rep.replicas} ranks neither divide a node's {cluster.ranks_per_node} ranks nor "
                              f"span whole nodes; re-plan with --ranks-per-node {cluster.ranks_per_node}")
    return group_problem(problem, rep.group_size)


def sharding_groups(replication: Replication) -> list[list[int]]:
    """The job's ranks of each sharding group, in group-rank order (the layout above)."""
    g, r = replication.group_size, replication.replicas
    return [[first + r * k for k in range(g)] for first in range(r)]


def group_ranks(replication: Replication) -> list[int]:
    """Each job rank's rank in its sharding group (index = job rank)."""
    out = [0] * replication.job_world_size
    for members in sharding_groups(replication):
        for k, rank in enumerate(members):
            out[rank] = k
    return out


def _sharded_bytes_per_rank(plan: Plan, bytes_of: Callable[[int, int], int]) -> list[int]:
    """`bytes_of(rows, cols)` summed over each rank's shards of sharded tables (data-parallel
    tables are all-reduced every step, never synced)."""
    held = [0] * plan.world_size
    for table in plan.tables.values():
        if table.sharding_type != "data_parallel":
            for s in table.shards:
                held[s.rank] += bytes_of(s.rows, s.cols)
    return held


def held_bytes_per_rank(plan: Plan, optimizer: str) -> list[int]:
    """Each rank's sharded tables' weights and optimizer state (its copy the same again)."""
    return _sharded_bytes_per_rank(plan, lambda rows, cols: rows_bytes(rows, cols, optimizer))


def with_agreed_copies(plan: Plan, optimizer: str, device_tier: str) -> tuple[RankPlan, ...]:
    """A group plan's ranks, each holding beside its shards the copy its replicas agreed on, and
    which replica changed each row since."""
    changed_by = _sharded_bytes_per_rank(plan, lambda rows, _: rows * CHANGED_BY_BYTES)
    return tuple(replace(r, memory=r.memory + Storage(**{f"{device_tier}_bytes": copy + record}))
                 for r, copy, record in zip(plan.ranks, held_bytes_per_rank(plan, optimizer), changed_by))


@dataclass(frozen=True)
class SyncBytes:
    """What a rank of a group exchanges with its replicas (dlrm_scale.training.replicas), expected:
    each step, every replica's distinct rows about to be looked up in its shards, gathered; the
    rows one replica changed that another is about to read (its change and its state's), and
    after the step those two looked up in it (their summed gradient), all-reduced (`shared`);
    every N steps the rows one replica changed, all-reduced (`synced`: change and state's)."""

    gathered: float
    shared: float
    synced: float

    def per_step(self, sync_every_steps: int) -> float:
        return self.gathered + self.shared + self.synced / sync_every_steps


def sync_bytes_per_rank(plan: Plan, tables: Sequence[TableSpec], batch_size_per_rank: int, optimizer: str, replicas: int,
                        sync_every_steps: int) -> list[SyncBytes]:
    """Each group rank's SyncBytes. Rows two replicas look up in a step: those two of the R
    replicas' draws hit in it; rows read after another's change: once each of those two hit within
    N steps, beyond a step's; rows one replica changed: those the draws of N steps hit, less those
    two hit. Synced every step, every row looked up in the step. Assumes each table's Zipf law and independent draws (as the cost model's distinct
    rows), a replica's batch of G x b samples, a table's rows spread evenly over its row blocks."""
    out = [[0.0, 0.0, 0.0] for _ in range(plan.world_size)]
    n, specs = sync_every_steps, {t.name: t for t in tables}
    for name, table in plan.tables.items():
        if table.sharding_type == "data_parallel":
            continue
        spec = specs[name]
        ids = batch_size_per_rank * plan.world_size * spec.pooling_factor  # a replica's in a step

        def distinct(draws: float) -> float:
            return distinct_rows_per_step(spec, draws)

        def by_two_or_more(draws: float) -> float:  # of R replicas' `draws` each
            return replicas * distinct((replicas - 1) * draws) - (replicas - 1) * distinct(replicas * draws)

        fresh = by_two_or_more(ids)
        shared = fresh + (by_two_or_more(n * ids) - fresh) / n
        by_one = distinct(replicas * n * ids) - by_two_or_more(n * ids)
        looked_up = distinct(ids)
        for shard in table.shards:
            part = shard.rows / spec.num_embeddings
            update, state = shard.cols * WEIGHT_BYTES, optimizer_state_bytes(1, shard.cols, optimizer)
            for i, value in enumerate((replicas * looked_up * ID_BYTES, fresh * update + (shared - fresh) * (update + state),
                                       by_one * (update + state))):
                out[shard.rank][i] += part * value
    return [SyncBytes(*values) for values in out]


def replication_of(plan: Plan, problem: PlanningProblem, replicas: int, sync_every_steps: int) -> Replication:
    """`plan` (a group's) run as `replicas` synced every N steps, priced on the rank exchanging the
    most (every replica waits for it): each step, the counts and the rows looked up gathered, the
    rows read after another's change all-reduced, and after the step those two looked up; every
    N steps, the rest."""
    cluster, training = problem.cluster, problem.training
    exchanged = sync_bytes_per_rank(plan, problem.tables, training.batch_size_per_rank,
                                    training.embedding_optimizer, replicas, sync_every_steps)
    latency_ms = collective_ms(replicas - 1, cluster)
    sync = max(all_reduce_ms(b.synced, replicas, cluster) for b in exchanged) + latency_ms
    shared = max(all_gather_ms(b.gathered, replicas, cluster) + all_reduce_ms(b.shared, replicas, cluster) for b in exchanged)
    return Replication(plan.world_size, replicas, sync_every_steps, sync, shared + 4 * latency_ms)


def predicted_step_ms(plan: Plan) -> float:
    """The search's step, plus the replicas' sync per step for a 2D plan."""
    return plan.step[0] + (plan.replication.sync_ms_per_step if plan.replication is not None else 0.0)


def plan_replicated(problem: PlanningProblem, sync_every_steps: int, sizes: Sequence[int] | None = None,
                    config: SolverConfig | None = None) -> Plan:
    """The plan with the shortest predicted step (the sync included) over the group sizes the
    cluster allows, 1D among them, or over `sizes`, each searched with an equal share of the
    time limit. A 2D plan is its group's plan, with its `replication`."""
    config = config or SolverConfig()
    cluster, world = problem.cluster, problem.cluster.world_size
    sizes = [check_group_size(cluster, g) for g in sizes] if sizes is not None else group_sizes(cluster)
    share = replace(config, time_limit_s=config.time_limit_s / len(sizes))
    best, infeasible = None, None
    for size in sizes:
        try:
            candidate = make_plan(problem if size == world else group_problem(problem, size), config=share)
        except InfeasiblePlanError as e:  # the tables do not fit so few ranks
            infeasible = infeasible or e
            continue
        if size < world:
            replicas, optimizer = world // size, problem.training.embedding_optimizer
            candidate = replace(candidate, ranks=with_agreed_copies(candidate, optimizer, cluster.device_tier),
                                replication=replication_of(candidate, problem, replicas, sync_every_steps))
        if best is None or predicted_step_ms(candidate) < predicted_step_ms(best):
            best = candidate
    if best is None:
        raise infeasible
    return best

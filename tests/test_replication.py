"""2D sparse parallelism in the planner: which group sizes a cluster allows, what a group is,
what a sync costs, and that the planner takes a group size only where its step, the sync
included, beats 1D."""

from __future__ import annotations

from dataclasses import replace

import pytest

from benchmarks.workloads import synthetic_tables
from dlrm_scale.run_config import load_problem
from planner.cost.cost_model import collective_ms, rows_bytes, sharding_types_ms
from planner.plan.document import Plan, PlanFormatError, table_layout
from planner.plan.planning import make_plan
from planner.plan import replication
from planner.plan.replication import (group_cluster, group_sizes, held_bytes_per_rank, plan_replicated, predicted_step_ms,
                                      replication_of, sync_bytes_per_rank)
from planner.search.solver import SolverConfig
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec, TrainingSpec
from planner.spec.types import ShardingType

SYNC_EVERY = 10


def problem(world: int, peer_us: float) -> PlanningProblem:
    base = load_problem("configs/tiny.yaml", hardware="a100_zionex", cluster_overrides={"world_size": world})
    return PlanningProblem(tuple(synthetic_tables(24, 3)), base.cluster.with_costs(collective_peer_us=peer_us), TrainingSpec(512))


def test_group_sizes_are_those_dmpcollection_can_lay_out():
    cluster = problem(64, 0.0).cluster  # 8 nodes of 8
    assert group_sizes(cluster) == [64, 32, 16, 8, 4, 2, 1]
    two = group_cluster(cluster, 32)  # replicas in pairs inside a node: each group has 4 ranks on each of 8 nodes
    assert (two.num_nodes, two.ranks_per_node) == (8, 4)
    assert two.ddr_bytes_per_node == cluster.ddr_bytes_per_node // 2
    assert two.hbm_bytes_per_rank == cluster.hbm_bytes_per_rank // 2  # the other half: the copy its replicas agreed on
    spread = group_cluster(cluster, 4)  # 16 replicas span 2 nodes: a group has one rank on each of 4 nodes
    assert (spread.num_nodes, spread.ranks_per_node) == (4, 1)
    assert group_sizes(replace(cluster, num_nodes=3)) == [24, 12, 6, 3, 1]  # 3 or 6 replicas would split a node's ranks


def test_an_all_to_alls_latency_grows_with_the_ranks_it_spans():
    cluster = problem(64, 2.0).cluster
    assert collective_ms(63, cluster) == pytest.approx(cluster.costs.collective_latency_ms + 0.126)
    # table-row-wise exchanges with its node's 7 other ranks and one rank on each of the 7 other nodes
    assert sharding_types_ms(["table_row_wise"], cluster) == pytest.approx(collective_ms(63, cluster) + 2 * collective_ms(14, cluster))
    assert sharding_types_ms(["table_wise"], cluster) == pytest.approx(3 * collective_ms(63, cluster))


def test_a_sync_exchanges_the_rows_its_replicas_look_up_and_no_other():
    """A small table every step looks up whole, and a large one (20M rows) a step touches little
    of, each on a rank of a 2-rank group: synced every step, a rank all-reduces every row its
    replicas looked up (all of the small table) and gathers their ids; every 10 steps, each step
    the rows two replicas looked up and every 10th the rest."""
    p = problem(16, 1.0)
    small = TableSpec("small", 100, 64, 10.0)
    large = TableSpec("large", 20_000_000, 128, 1.0, zipf_exponent=1.05)
    p = replace(p, tables=(small, large))
    plan = Plan(2, 2, {t.name: table_layout(t, ShardingType.TABLE_WISE, [k], "hbm") for k, t in enumerate(p.tables)}, (), 0.0, 0.0)
    every_step = sync_bytes_per_rank(plan, p.tables, 512, "rowwise_adagrad", 8, 1)
    # synced every step: the small table's every row, looked up by every replica: its summed gradient (the
    # state follows from it), and 8 replicas' ids of it
    assert every_step[0].shared + every_step[0].synced == pytest.approx(100 * 64 * 4, rel=1e-3)
    assert every_step[0].gathered == pytest.approx(8 * 100 * 4, rel=1e-3)
    # the large table: 8 replicas' 1,024 ids a step hit fewer rows than that, a sliver of the table's 10 GB
    row = rows_bytes(1, 128, "rowwise_adagrad")
    assert 1_000 * row < every_step[1].per_step(1) < 8 * 1_024 * (row + 4) < rows_bytes(20_000_000, 128, "rowwise_adagrad") / 1_000
    every_10 = sync_bytes_per_rank(plan, p.tables, 512, "rowwise_adagrad", 8, SYNC_EVERY)
    assert every_10[0].shared == pytest.approx(100 * 64 * 4, rel=1e-3)  # hot: every row, every step
    assert every_10[1].per_step(SYNC_EVERY) < every_step[1].per_step(1)  # a row looked up twice in 10 steps, synced once
    within = replication_of(plan, p, 8, SYNC_EVERY)  # 8 replicas: one node, its fast link
    assert replication_of(plan, p, 16, SYNC_EVERY).sync_ms_per_step > within.sync_ms_per_step  # 16 span two nodes


@pytest.mark.parametrize("peer_us", [0.0, 20.0])
def test_the_planner_takes_the_group_size_whose_step_with_its_sync_is_shortest(peer_us, monkeypatch):
    """Without a per-peer latency a group only adds its sync (its ranks send as many bytes as in
    1D): 1D. With 20 us a peer, 64-rank all-to-alls cost more than a sync every 10 steps saves
    (32-rank groups' step with their sync 17% shorter; at 5 us a few percent, which searches the
    wall clock cut short on a busy machine could reverse). The group sizes' plans are those this
    search made (recorded as it made them): a search the wall clock stops is not repeatable, so
    plans made apart are not its candidates."""
    p = problem(64, peer_us)
    searched = {}

    def recorded(group_problem, **kwargs):
        plan = make_plan(group_problem, **kwargs)
        searched[group_problem.cluster.world_size] = plan
        return plan

    monkeypatch.setattr(replication, "make_plan", recorded)
    chosen = plan_replicated(p, SYNC_EVERY, config=SolverConfig(time_limit_s=1.2 * len(group_sizes(p.cluster))))
    assert sorted(searched, reverse=True) == group_sizes(p.cluster)
    one_d = searched[64].step[0]
    steps = {g: plan.step[0] + (replication_of(plan, p, 64 // g, SYNC_EVERY).sync_ms_per_step if g < 64 else 0.0)
             for g, plan in searched.items()}
    best = min(steps, key=steps.get)
    assert predicted_step_ms(chosen) == pytest.approx(steps[best])
    if peer_us == 0.0:
        assert chosen.replication is None and best == 64
    else:
        rep = chosen.replication
        assert rep is not None and rep.group_size == best < 64 and rep.replicas * rep.group_size == 64
        assert chosen.world_size == best  # the plan is one group's, as DMPCollection takes it
        assert one_d - chosen.step[0] > rep.sync_ms_per_step  # it beat 1D by more than its sync


def test_a_2d_plan_round_trips_and_a_damaged_replication_is_one_line():
    p = problem(16, 5.0)
    plan = plan_replicated(p, SYNC_EVERY, [4], SolverConfig(time_limit_s=1.0))
    doc = plan.to_dict()
    assert doc["replication"] == {"group_size": 4, "replicas": 4, "sync_every_steps": SYNC_EVERY,
                                  "sync_ms": plan.replication.sync_ms, "shared_ms": plan.replication.shared_ms, "strategy": "shared_rows"}
    # each rank holds its shards and, beside them, the copy its replicas agreed on; no table cached
    assert all(r.memory.hbm_bytes >= 2 * held for r, held in zip(plan.ranks, held_bytes_per_rank(plan, "rowwise_adagrad")))
    assert max(held_bytes_per_rank(plan, "rowwise_adagrad")) > 0 and not any(t.cached for t in plan.tables.values())
    assert Plan.from_dict(doc).replication == plan.replication
    doc["replication"]["group_size"] = 8
    with pytest.raises(PlanFormatError, match="plan.replication must name the plan's world size 4 as group_size"):
        Plan.from_dict(doc)

"""`explain` and `diff`: forcing an alternative prices the plan that would result, and a diff
counts exactly the bytes that would have to arrive at each rank."""

from __future__ import annotations

import pytest

from planner.cost.cost_model import AnalyticCostModel, rows_bytes
from planner.views.diff import diff_plans
from planner.views.explain import explain
from planner.plan.document import Plan, table_layout
from planner.plan.planning import make_plan
from planner.views.scoring import rank_times_ms
from planner.spec.specs import ClusterSpec, CostConstants, TableSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingType

TW, RW, CW, DP = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.COLUMN_WISE, ShardingType.DATA_PARALLEL
TABLES = (TableSpec("a", 40_000, 64, 8.0), TableSpec("b", 20_000, 64, 4.0), TableSpec("c", 1_000, 64, 2.0),
          TableSpec("d", 30_000, 64, 6.0))


def problem(world: int = 4, local: int = 2, hbm: int = 8 * 2**30) -> PlanningProblem:
    cluster = ClusterSpec(world // local, local, "cuda", hbm, 64 * 2**30, 0, CostConstants(100.0, 600.0, 25.0, 2000.0, 1000.0))
    return PlanningProblem(TABLES, cluster, TrainingSpec(512, "rowwise_adagrad"))


def hand_plan(layouts: dict[str, tuple[ShardingType, list[int]]], world: int = 4, local: int = 2) -> Plan:
    tables = {t.name: table_layout(t, *layouts[t.name], "hbm") for t in TABLES}
    return Plan(world, local, tables, (), 0.0, 0.0)


def test_an_optimal_plan_has_no_alternative_that_lowers_its_busiest_rank():
    p = problem()
    plan = make_plan(p)
    model = AnalyticCostModel(p.cluster, p.training)
    result = explain(plan, p, model)
    assert result.max_rank_ms == pytest.approx(float(rank_times_ms(plan, p, model).max()))
    for t in result.tables:
        assert t.alternatives, t.name
        for forced in t.alternatives:
            if forced.max_rank_ms is not None:
                assert forced.max_rank_ms >= result.max_rank_ms * (1 - plan.gap) - 1e-9, (t.name, forced.option.label)


def test_forcing_a_table_elsewhere_prices_the_plan_that_results():
    """Everything on rank 0: moving table 'a' to the least-loaded rank leaves rank 0 busiest
    with exactly its load less a's shard."""
    p = problem()
    model = AnalyticCostModel(p.cluster, p.training)
    plan = hand_plan({t.name: (TW, [0]) for t in TABLES})
    loads = rank_times_ms(plan, p, model)
    result = explain(plan, p, model, "a")
    assert result.critical_rank == 0 and result.max_rank_ms == pytest.approx(loads[0])
    table_wise = next(f for f in result.tables[0].alternatives if f.option.sharding_type is TW and f.option.tier == "hbm"
                      and f.option.compute_kernel == "fused" and f.option.cache_fraction == 1.0)
    a_ms = float(table_wise.option.shard_ms[0])
    assert table_wise.max_rank_ms == pytest.approx(max(loads[0] - a_ms, a_ms))
    assert result.tables[0].alternatives[0].max_rank_ms < result.max_rank_ms  # a better layout exists, and comes first


def test_an_alternative_without_room_says_which_tier_binds():
    """HBM for 1.2 of table 'a' per rank, half of it taken by the replicas of 'b': 'a' whole
    on one rank no longer fits anywhere, its row-wise quarters do."""
    p = problem(hbm=int(1.2 * rows_bytes(40_000, 64, "rowwise_adagrad")))
    model = AnalyticCostModel(p.cluster, p.training)
    plan = hand_plan({"a": (RW, [0, 1, 2, 3]), "b": (DP, [0, 1, 2, 3]), "c": (TW, [2]), "d": (RW, [0, 1, 2, 3])})
    result = explain(plan, p, model, "a")
    whole = [f for f in result.tables[0].alternatives if f.option.sharding_type is TW and f.option.tier == "hbm"
             and f.option.cache_fraction == 1.0]
    assert whole and all(f.max_rank_ms is None and f.binds == "hbm has no room for its shards" for f in whole)
    text = result.format()
    assert text.startswith("busiest rank") and "a: row_wisex4" in text and "does not fit" in text


def test_diff_counts_the_bytes_that_arrive_within_and_across_nodes():
    """4 ranks, 2 per node."""
    before = hand_plan({"a": (TW, [0]), "b": (RW, [0, 1, 2, 3]), "c": (DP, [0, 1, 2, 3]), "d": (CW, [0, 2])})
    after = hand_plan({"a": (TW, [1]), "b": (TW, [0]), "c": (TW, [3]), "d": (CW, [0, 2])})
    d = {c.name: c for c in diff_plans(before, after, "rowwise_adagrad").changes}
    assert set(d) == {"a", "b", "c"}  # d keeps its layout
    full = rows_bytes(40_000, 64, "rowwise_adagrad")
    assert (d["a"].intra_node_bytes, d["a"].inter_node_bytes) == (full, 0)  # rank 0 -> 1, same node
    block = rows_bytes(5_000, 64, "rowwise_adagrad")  # b's row blocks: rank 0 keeps its own
    assert (d["b"].intra_node_bytes, d["b"].inter_node_bytes) == (block, 2 * block)
    assert (d["c"].intra_node_bytes, d["c"].inter_node_bytes) == (0, 0)  # every rank held a replica
    result = diff_plans(before, after, "rowwise_adagrad")
    assert result.unchanged == 1 and result.inter_node_bytes == 2 * block

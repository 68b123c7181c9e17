import pytest

from dlrm_scale.run_config import ModelConfig
from dlrm_scale.tools.simulate import dense_cost
from dlrm_scale.tools.simulate import simulate
from dlrm_scale.tools.simulate import PHASE_GROUPS
from planner.cost_model import AnalyticCostModel, all_reduce_ms, dense_update_ms, host_overhead_ms
from planner.plan import Plan, table_layout
from planner.types import ShardingType
from planner.planning import make_plan
from planner.scoring import rank_times_ms
from tests.conftest import make_cluster, make_problem, table


def test_dense_cost_counts_mlp_and_interaction():
    tables = [table("a", 10, 8), table("b", 10, 8)]
    flops, params = dense_cost(tables, ModelConfig(num_dense_features=4, dense_arch=(8,), over_arch=(2, 1)))
    # bottom 4->8, interaction of 3 vectors of dim 8 (3 pairs), top (8+3)->2->1
    mlp = 4 * 8 + 11 * 2 + 2 * 1
    assert flops == 3.0 * (2 * mlp + 2 * 8 * 3)
    assert params == mlp + 8 + 2 + 1


def test_simulation_adds_dense_and_overhead_to_the_planned_embedding_time():
    cluster = make_cluster(ranks_per_node=2, dense_gflops=100.0, step_overhead_ms=1.5, collective_latency_ms=0.1,
                           dense_overhead_ms=0.7, dense_update_ns=2.0)
    problem = make_problem([table("a", 10_000, 16, 3.0), table("b", 5_000, 16)], cluster, batch=256)
    plan = make_plan(problem)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    sim = simulate(plan, problem, model)
    flops, params = dense_cost(problem.tables, model)
    dense = (flops * 256 / (100.0 * 1e6) + 0.7
             + dense_update_ms(params, 1, "adagrad", cluster.tier_gb_per_s(cluster.device_tier), 2.0))
    extra = dense + all_reduce_ms(4.0 * params, 2, cluster) + host_overhead_ms(2, cluster) + 4 * 0.1  # 4 collectives' latency
    embedding = rank_times_ms(plan, problem, AnalyticCostModel(cluster, problem.training))
    assert [r.step_ms for r in sim.ranks] == pytest.approx(list(embedding + extra))
    assert [r.phases_ms["dense"] for r in sim.ranks] == pytest.approx([dense, dense])
    # collectives are barriers: each phase group waits for its slowest rank
    assert sim.step_ms == pytest.approx(sum(max(r.phases_ms[g] for r in sim.ranks) for g in PHASE_GROUPS))
    assert sim.step_ms >= max(r.step_ms for r in sim.ranks)
    assert sim.samples_per_s == pytest.approx(512 / sim.step_ms * 1e3)
    assert sim.ranks[0].memory.hbm_bytes == plan.ranks[0].memory.hbm_bytes


def test_a_data_parallel_table_trains_on_the_dense_side_and_pays_no_all_to_all():
    """A replica's update runs with the dense optimizer and its gradient joins DDP's all-reduce;
    with every table replicated, no embedding all-to-all runs, so none pays latency."""
    cluster = make_cluster(ranks_per_node=2, dense_update_ns=3.0, dense_grad_ns=1.0, collective_latency_ms=0.5)
    problem = make_problem([table("a", 10_000, 16)], cluster, batch=256)
    replicated = Plan(2, 2, {"a": table_layout(problem.tables[0], ShardingType.DATA_PARALLEL, [0, 1], "hbm")}, (), 0.0, 0.0)
    tw = Plan(2, 2, {"a": table_layout(problem.tables[0], ShardingType.TABLE_WISE, [0], "hbm")}, (), 0.0, 0.0)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    dp, sharded = simulate(replicated, problem, model), simulate(tw, problem, model)
    update = dense_update_ms(10_000, 16, "rowwise_adagrad", cluster.tier_gb_per_s("hbm"), 3.0)
    assert dp.ranks[0].phases_ms["dense"] - sharded.ranks[0].phases_ms["dense"] == pytest.approx(update)
    assert dp.ranks[0].phases_ms["a2a_fwd"] == 0.0 and sharded.ranks[0].phases_ms["a2a_fwd"] >= 0.5
    assert dp.ranks[0].phases_ms["all_reduce"] > sharded.ranks[0].phases_ms["all_reduce"]

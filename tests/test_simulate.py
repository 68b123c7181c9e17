import pytest

from dlrm_scale.run_config import ModelConfig
from dlrm_scale.tools.simulate import dense_cost
from dlrm_scale.tools.simulate import simulate
from planner.cost_model import AnalyticCostModel, all_reduce_ms, framework_overhead_ms
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
    cluster = make_cluster(ranks_per_node=2, dense_gflops=100.0, step_overhead_ms=1.5, collective_latency_ms=0.1)
    problem = make_problem([table("a", 10_000, 16, 3.0), table("b", 5_000, 16)], cluster, batch=256)
    plan = make_plan(problem)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    sim = simulate(plan, problem, model)
    flops, params = dense_cost(problem.tables, model)
    extra = flops * 256 / (100.0 * 1e6) + all_reduce_ms(4.0 * params, 2, cluster) + framework_overhead_ms(2, cluster)
    embedding = rank_times_ms(plan, problem, AnalyticCostModel(cluster, problem.training))
    assert [r.step_ms for r in sim.ranks] == pytest.approx(list(embedding + extra))
    assert sim.samples_per_s == pytest.approx(512 / sim.step_ms * 1e3)
    assert sim.ranks[0].memory.hbm_bytes == plan.ranks[0].memory.hbm_bytes

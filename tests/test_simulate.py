from dataclasses import replace

import pytest

from dlrm_scale.run_config import ModelConfig
from dlrm_scale.tools.simulate import dense_cost
from dlrm_scale.tools.simulate import simulate
from dlrm_scale.run_record import PHASE_GROUPS
from planner.cost.cost_model import AnalyticCostModel, all_reduce_ms, dense_update_ms, host_overhead_ms, row_comm_bytes
from planner.plan.document import Plan, table_layout
from planner.spec.types import ShardingType
from planner.plan.planning import make_plan
from planner.views.scoring import costed_options, rank_times_ms
from tests.conftest import make_cluster, make_problem, table


def test_dense_cost_counts_mlp_and_interaction():
    tables = [table("a", 10, 8), table("b", 10, 8)]
    flops, params, values = dense_cost(tables, ModelConfig(num_dense_features=4, dense_arch=(8,), over_arch=(2, 1)))
    # bottom 4->8, interaction of 3 vectors of dim 8 (3 pairs), top (8+3)->2->1
    mlp = 4 * 8 + 11 * 2 + 2 * 1
    assert flops == 3.0 * (2 * mlp + 2 * 8 * 3)
    assert params == mlp + 8 + 2 + 1
    assert values == 3 * 8


def test_simulation_adds_dense_and_overhead_to_the_planned_embedding_time():
    cluster = make_cluster(ranks_per_node=2, dense_gflops=100.0, step_overhead_ms=1.5, collective_latency_ms=0.1,
                           dense_overhead_ms=0.7, dense_update_ns=2.0, interaction_value_ns=3.0)
    problem = make_problem([table("a", 10_000, 16, 3.0), table("b", 5_000, 16)], cluster, batch=256)
    plan = make_plan(problem)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    sim = simulate(plan, problem, model)
    flops, params, values = dense_cost(problem.tables, model)
    dense = (flops * 256 / (100.0 * 1e6) + values * 256 * 3.0 * 1e-6 + 0.7
             + dense_update_ms(params, 1, "adagrad", cluster.costs.tier_gb_per_s(cluster.device_tier), 2.0))
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
    """A replica's update (per weight, and a fixed cost per table) runs with the dense optimizer
    and its gradient is all-reduced by a DDP of its own; with every table replicated, no
    embedding all-to-all runs, so none pays latency."""
    cluster = make_cluster(ranks_per_node=2, dense_update_ns=3.0, dense_grad_ns=1.0, collective_latency_ms=0.5, replica_table_ms=0.25)
    problem = make_problem([table("a", 10_000, 16)], cluster, batch=256)
    replicated = Plan(2, 2, {"a": table_layout(problem.tables[0], ShardingType.DATA_PARALLEL, [0, 1], "hbm")}, (), 0.0, 0.0)
    tw = Plan(2, 2, {"a": table_layout(problem.tables[0], ShardingType.TABLE_WISE, [0], "hbm")}, (), 0.0, 0.0)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    dp, sharded = simulate(replicated, problem, model), simulate(tw, problem, model)
    update = dense_update_ms(10_000, 16, "rowwise_adagrad", cluster.costs.tier_gb_per_s("hbm"), 3.0) + 0.25
    assert dp.ranks[0].phases_ms["dense"] - sharded.ranks[0].phases_ms["dense"] == pytest.approx(update)
    assert dp.ranks[0].phases_ms["a2a_fwd"] == 0.0 and sharded.ranks[0].phases_ms["a2a_fwd"] >= 0.5
    gradient = all_reduce_ms(row_comm_bytes(10_000, 16, "fp32"), 2, cluster)
    assert dp.ranks[0].phases_ms["all_reduce"] - sharded.ranks[0].phases_ms["all_reduce"] == pytest.approx(gradient + 0.5)


def test_each_sharding_type_runs_its_own_embedding_collectives():
    """TorchRec keeps one input and one output distribution per sharding type: each embedding
    collective's latency is paid once per type the plan uses; the replicated tables' DDP runs an
    all-reduce of its own beside the dense layers' one."""
    problem = make_problem([table("a", 10_000, 16), table("b", 10_000, 16), table("c", 100, 16)], make_cluster(ranks_per_node=2), batch=256)
    a, b, c = problem.tables
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))

    def latency_paid(a_scheme: ShardingType, b_scheme: ShardingType) -> dict:
        plan = Plan(2, 2, {"a": table_layout(a, a_scheme, [0, 1] if a_scheme is ShardingType.ROW_WISE else [0], "hbm"),
                           "b": table_layout(b, b_scheme, [1], "hbm"),
                           "c": table_layout(c, ShardingType.DATA_PARALLEL, [0, 1], "hbm")}, (), 0.0, 0.0)
        with_latency, without = (simulate(plan, replace(problem, cluster=problem.cluster.with_costs(collective_latency_ms=ms)), model)
                                 for ms in (0.5, 0.0))
        return {g: with_latency.ranks[1].phases_ms[g] - without.ranks[1].phases_ms[g] for g in PHASE_GROUPS}

    tw, cw, rw = ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE
    for (a_scheme, b_scheme), types in {(tw, tw): 1, (rw, tw): 2, (tw, cw): 2}.items():
        paid = latency_paid(a_scheme, b_scheme)
        assert [paid[g] for g in ("input_dist", "a2a_fwd", "a2a_bwd")] == pytest.approx([0.5 * types] * 3)
        assert paid["all_reduce"] == pytest.approx(2 * 0.5) and paid["embedding"] == paid["dense"] == 0.0


def test_every_plan_pays_the_regrouping_of_its_pooled_embeddings_where_the_timers_put_it():
    """Each rank regroups every table's pooled embeddings for its samples into the dense part's
    input (and their gradient back), whatever the plan: a replicated table sends nothing over
    the all-to-all but is regrouped all the same. The trainer's timers charge it to the
    all-to-all phases it ends."""
    problem = make_problem([table("a", 10_000, 16), table("b", 10_000, 32)], make_cluster(ranks_per_node=2), batch=256)
    a, b = problem.tables
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    plans = {"table_wise": Plan(2, 2, {"a": table_layout(a, ShardingType.TABLE_WISE, [0], "hbm"),
                                       "b": table_layout(b, ShardingType.TABLE_WISE, [1], "hbm")}, (), 0.0, 0.0),
             "replicated": Plan(2, 2, {t.name: table_layout(t, ShardingType.DATA_PARALLEL, [0, 1], "hbm") for t in (a, b)}, (), 0.0, 0.0)}
    regroup = 256 * (16 + 32) * 2.0 / 1e6
    for plan in plans.values():
        with_regroup, without = (simulate(plan, replace(problem, cluster=problem.cluster.with_costs(pooled_value_ns=ns)), model)
                                 for ns in (2.0, 0.0))
        for r in range(2):
            paid = {g: with_regroup.ranks[r].phases_ms[g] - without.ranks[r].phases_ms[g] for g in PHASE_GROUPS}
            assert paid == pytest.approx({g: regroup if g in ("a2a_fwd", "a2a_bwd") else 0.0 for g in PHASE_GROUPS})


def test_the_replicas_all_reduce_hides_behind_the_busiest_ranks_sharded_backward():
    """The replicas' DDP all-reduces their gradients while each rank computes its sharded
    lookups' backward, and ends on every rank at once: every rank's all-reduce phase is shorter
    by min(the replicas' all-reduce, the busiest rank's sharded backward), and so is the step."""
    cluster = make_cluster(ranks_per_node=2, collective_latency_ms=0.0, lookup_bwd_ns=50.0)
    model = ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))
    for replica_rows, bound_by in ((2_000, "all-reduce"), (2_000_000, "backward")):
        problem = make_problem([table("heavy", 50_000, 16, 20.0), table("light", 50_000, 16), table("r", replica_rows, 16)],
                               cluster, batch=256)
        heavy, light, r = problem.tables
        layouts = {"heavy": table_layout(heavy, ShardingType.TABLE_WISE, [0], "hbm"),
                   "light": table_layout(light, ShardingType.TABLE_WISE, [1], "hbm")}
        alone = Plan(2, 2, layouts, (), 0.0, 0.0)
        beside = Plan(2, 2, {**layouts, "r": table_layout(r, ShardingType.DATA_PARALLEL, [0, 1], "hbm")}, (), 0.0, 0.0)
        options = dict(costed_options(alone, replace(problem, tables=(heavy, light)), AnalyticCostModel(cluster, problem.training)))
        backward = options["heavy"].shards[0].perf.bwd_compute_ms
        assert backward > options["light"].shards[0].perf.bwd_compute_ms
        reduce = all_reduce_ms(row_comm_bytes(replica_rows, 16, "fp32"), 2, cluster)
        assert (reduce < backward) == (bound_by == "all-reduce")
        without, with_replica = (simulate(p, problem, model) for p in (alone, beside))
        for rank in range(2):
            added = with_replica.ranks[rank].phases_ms["all_reduce"] - without.ranks[rank].phases_ms["all_reduce"]
            assert added == pytest.approx(reduce - min(reduce, backward)), bound_by
        assert with_replica.overlap.hidden_ms == pytest.approx(min(reduce, backward))

"""Constraints in the config: each kind honoured by the plan and by the proven bound, and an
infeasible set named by its smallest conflicting subset."""

from dataclasses import replace

import pytest

from planner.spec.config import constrain
from planner.spec.errors import ConfigError, InfeasiblePlanError
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.specs import GIB
from tests.conftest import make_cluster, make_problem, table
from tests.test_solver import brute_force_peak

TABLES = [table("cat_0", 400_000, 64, 20.0), table("cat_1", 200_000, 64, 5.0), table("dense_a", 1000, 64), table("dense_b", 500, 64)]
FAST = SolverConfig(time_limit_s=5)


def constrained(rules=(), reserve=None, tables=TABLES, cluster=None):
    problem = make_problem(tables, cluster or make_cluster(ranks_per_node=2))
    section = {"tables": list(rules), **({"reserve_gib_per_rank": reserve} if reserve else {})}
    return constrain(problem, section)


def test_allowed_schemes_by_pattern_are_honoured_and_the_bound_holds():
    free = make_plan(constrained(), config=FAST)
    assert {free.tables[n].sharding_type for n in ("dense_a", "dense_b")} != {"row_wise"}
    problem = constrained([{"match": "dense_*", "schemes": ["row_wise"]}, {"match": "cat_0", "schemes": ["column_wise"]}])
    plan = make_plan(problem, config=FAST)
    assert plan.tables["dense_a"].sharding_type == plan.tables["dense_b"].sharding_type == "row_wise"
    assert plan.tables["cat_0"].sharding_type == "column_wise"
    # the bound is proven for the constrained problem: never above the true constrained optimum
    from planner.search.candidates import enumerate_options
    from planner.cost.cost_model import AnalyticCostModel

    options = enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))
    optimum = brute_force_peak(options, problem.cluster)
    assert plan.lower_bound_ms <= optimum + 1e-9 <= plan.max_rank_ms + 1e-9
    assert free.max_rank_ms <= plan.max_rank_ms + 1e-9  # constraints never make a plan faster


def test_max_shards_kernels_and_tiers_are_honoured():
    problem = constrained([{"match": "cat_*", "max_shards": 1}, {"match": "dense_a", "kernels": ["fused"]}])
    plan = make_plan(problem, config=FAST)
    assert all(len(plan.tables[n].shards) == 1 for n in ("cat_0", "cat_1"))
    assert plan.tables["dense_a"].compute_kernel == "fused"  # so not a data-parallel replica
    # rows on SSD behind a cache, though they would fit in HBM
    cluster = make_cluster(ranks_per_node=2, ssd_bytes_per_node=100 * GIB)
    plan = make_plan(constrained([{"match": "cat_0", "tiers": ["ssd"]}], cluster=cluster), config=FAST)
    assert plan.tables["cat_0"].compute_kernel == "key_value" and {s.tier for s in plan.tables["cat_0"].shards} == {"ssd"}


def test_a_memory_reserve_keeps_room_on_every_rank():
    big = [table(f"t{i}", 2_000_000, 64) for i in range(4)]  # 520 MB each with row-wise Adagrad state
    cluster = make_cluster(ranks_per_node=2, hbm_gib=2.0)

    def plan_with(reserve):
        problem = constrained(tables=big, cluster=cluster, reserve=reserve)
        return problem, make_plan(replace(problem, tiering=replace(problem.tiering, enabled=False)), config=FAST)

    _, free = plan_with(None)
    assert max(r.memory.hbm_bytes for r in free.ranks) > 0.95 * GIB  # half the tables on each rank
    problem, plan = plan_with({"hbm": 0.75})
    assert problem.cluster.hbm_bytes_per_rank == cluster.hbm_bytes_per_rank - int(0.75 * GIB)
    assert max(r.memory.hbm_bytes for r in plan.ranks) <= 1.25 * GIB
    with pytest.raises(InfeasiblePlanError):  # 2 GB of tables cannot fit in 2 x 0.8 GiB
        plan_with({"hbm": 1.2})


def test_an_infeasible_set_names_its_smallest_conflicting_subset():
    rules = [{"match": "cat_*", "max_shards": 4},  # harmless alone
             {"match": "cat_0", "schemes": ["row_wise", "table_wise"]},
             {"match": "cat_0", "kernels": ["dense"]},  # dense is data-parallel only
             {"match": "dense_*", "tiers": ["hbm"]}]
    with pytest.raises(InfeasiblePlanError) as e:
        make_plan(constrained(rules), config=FAST)
    message = str(e.value)
    assert message.startswith("table 'cat_0' has no option left under constraints.tables[1] ('cat_0': schemes row_wise/table_wise) "
                               "and constraints.tables[2] ('cat_0': kernels dense); loosen one of them")
    assert "tables[0]" not in message and "tables[3]" not in message and "\n" not in message


@pytest.mark.parametrize("section, line", [
    ({"tables": [{"match": "cat_9", "max_shards": 2}]}, "constraints: tables[0]: 'cat_9' matches no table; check the name or pattern"),
    ({"tables": [{"match": "cat_0", "schemes": ["diagonal"]}]},
     "constraints: tables[0]: schemes must be a list of data_parallel, table_wise, column_wise, row_wise, table_row_wise, "
     "table_column_wise, grid_shard; got ['diagonal']"),
    ({"tables": [{"match": "cat_0"}]},
     "constraints: tables[0]: constrains nothing; give schemes, kernels, tiers, max_shards, min_shard_cols, cache_load_factors, ranks or nodes"),
    ({"tables": [{"match": "cat_0", "min_shard_cols": 0}]}, "constraints: tables[0]: min_shard_cols must be a positive integer, got 0"),
    ({"tables": [{"match": "cat_0", "cache_load_factors": [1.5]}]},
     "constraints: tables[0]: cache_load_factors must be a list of fractions in (0, 1), got [1.5]"),
    ({"tables": [{"match": "cat_0", "max_shard": 2}]}, "constraints: tables[0]: unknown key 'max_shard'; did you mean 'max_shards'?"),
    ({"reserve_gib_per_rank": {"gpu": 2}}, "constraints: reserve_gib_per_rank must map tiers (hbm, ddr, ssd) to GiB, got {'gpu': 2}"),
    ({"reserve_gib_per_rank": {"hbm": 100}}, "constraints: reserve_gib_per_rank: hbm 100 GiB is more than a rank has (40.0 GiB)"),
])
def test_bad_constraints_are_one_line(section, line):
    with pytest.raises(ConfigError) as e:
        constrain(make_problem(TABLES), section)
    assert str(e.value) == line


def test_explain_prices_what_a_constraint_forbids():
    from planner.cost.cost_model import AnalyticCostModel
    from planner.views.explain import explain

    problem = constrained([{"match": "cat_0", "schemes": ["table_wise"]}])
    plan = make_plan(problem, config=FAST)
    explanation = explain(plan, problem, AnalyticCostModel(problem.cluster, problem.training), "cat_0")
    forbidden = [f for f in explanation.tables[0].alternatives if f.binds.startswith("forbidden by")]
    assert forbidden and all(f.option.sharding_type.value != "table_wise" for f in forbidden)
    assert forbidden[0].binds == "forbidden by constraints.tables[0] ('cat_0': schemes table_wise)"
    assert forbidden[0].max_rank_ms is not None  # the predicted effect of forcing it anyway


def test_constraints_from_a_config_file_reach_the_plan(tmp_path):
    from dlrm_scale.run_config import load_problem

    config = tmp_path / "c.yaml"
    config.write_text(open("configs/tiny.yaml").read() + "constraints:\n  reserve_gib_per_rank: {ddr: 1}\n"
                      "  tables:\n    - {match: 't_*', schemes: [row_wise], max_shards: 2}\n")
    problem = load_problem(config)
    assert problem.cluster.ddr_bytes_per_node == load_problem("configs/tiny.yaml").cluster.ddr_bytes_per_node - 2 * GIB
    plan = make_plan(problem, config=FAST)
    assert {t.sharding_type for t in plan.tables.values()} == {"row_wise"}

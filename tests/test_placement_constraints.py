"""Pins, co-located and kept-apart tables: honoured by every solver path (greedy, class
model, joint model, repair), the proven bound still a bound under them, an infeasible set one
line naming its rules."""

import itertools

import numpy as np
import pytest

from planner.search.candidates import enumerate_options
from planner.search.colocation import colocate
from planner.spec.config import constrain
from planner.cost.cost_model import AnalyticCostModel
from planner.spec.errors import ConfigError, InfeasiblePlanError
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from tests.conftest import make_cluster, make_problem, table
from tests.test_solver import brute_force_peak

TABLES = [table("hot_0", 400_000, 64, 20.0), table("hot_1", 300_000, 64, 12.0), table("hot_2", 200_000, 64, 8.0),
          table("side_a", 100_000, 32, 2.0), table("side_b", 50_000, 32, 1.0)]
# Each path on its own: the class model first (default), the joint model, greedy with repair.
PATHS = {
    "class": SolverConfig(time_limit_s=4),
    "joint": SolverConfig(time_limit_s=4, class_model_max_variables=0),
    "repair": SolverConfig(time_limit_s=4, class_model_max_variables=0, joint_model_max_booleans=0),
}


def constrained(section, tables=TABLES, **cluster):
    return constrain(make_problem(tables, make_cluster(**({"num_nodes": 2, "ranks_per_node": 2} | cluster))), section)


def ranks_of(plan, name):
    return set(plan.tables[name].ranks)


def check_apart(plan, names):
    for a, b in itertools.combinations(names, 2):
        assert not ranks_of(plan, a) & ranks_of(plan, b), (a, b, ranks_of(plan, a), ranks_of(plan, b))


@pytest.mark.parametrize("path", PATHS)
def test_every_solver_path_keeps_pins_groups_and_apart(path):
    section = {"tables": [{"match": "hot_0", "ranks": [2, 3]}, {"match": "side_*", "nodes": [0]}],
               "colocate": [["side_a", "side_b"]], "apart": [["hot_*"]]}
    plan = make_plan(constrained(section), config=PATHS[path])
    assert ranks_of(plan, "hot_0") <= {2, 3}
    assert ranks_of(plan, "side_a") == ranks_of(plan, "side_b") and len(ranks_of(plan, "side_a")) == 1
    assert ranks_of(plan, "side_a") <= {0, 1}
    assert {plan.tables[n].sharding_type for n in ("side_a", "side_b")} == {"table_wise"}
    check_apart(plan, ["hot_0", "hot_1", "hot_2"])
    assert not {plan.tables[n].sharding_type for n in ("hot_0", "hot_1", "hot_2")} & {"row_wise", "data_parallel"}
    free = make_plan(constrained({}), config=PATHS[path])
    assert free.max_rank_ms <= plan.max_rank_ms + 1e-9
    assert ranks_of(free, "hot_0") - {2, 3} or ranks_of(free, "side_a") != ranks_of(free, "side_b")  # the rules bind


@pytest.mark.parametrize("path", PATHS)
def test_the_bound_stays_below_the_constrained_optimum(path):
    tables = TABLES[:3]
    section = {"tables": [{"match": "*", "max_shards": 2, "schemes": ["table_wise", "column_wise", "row_wise"]},
                          {"match": "hot_0", "ranks": [0, 1]}],
               "apart": [["hot_0", "hot_1"]]}
    problem = constrained(section, tables, num_nodes=1, ranks_per_node=3)
    plan = make_plan(problem, config=PATHS[path])
    options = enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))
    optimum = brute_force_peak(options, problem.cluster, {"hot_0": {0, 1}}, ["hot_0", "hot_1"])
    assert plan.lower_bound_ms <= optimum + 1e-9 <= plan.max_rank_ms + 1e-9
    assert ranks_of(plan, "hot_0") <= {0, 1}
    check_apart(plan, ["hot_0", "hot_1"])


def test_a_colocated_group_is_searched_as_one_table_on_its_pareto_front():
    problem = constrained({"colocate": [["hot_1", "side_*"]]})
    options = enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))
    rules = problem.constraints.rank_rules([t.name for t in problem.tables])
    search = colocate(options, problem.constraints.colocate, rules)
    assert set(search.options_by_table) == {"hot_0", "hot_2", "constraints.colocate[0]"}
    group = search.options_by_table["constraints.colocate[0]"]
    best = min(group, key=lambda o: o.total_ms)
    fastest = sum(min(o.total_ms for o in options[n]) for n in ("hot_1", "side_a", "side_b"))
    assert best.total_ms == pytest.approx(fastest)  # the members' fastest options combined
    for a, b in itertools.combinations(group, 2):  # none dominated by another
        assert not (a.total_ms <= b.total_ms and np.all(a.shard_bytes <= b.shard_bytes) and a is not b
                    and (a.total_ms < b.total_ms or np.any(a.shard_bytes < b.shard_bytes)))


@pytest.mark.parametrize("section, line", [
    ({"apart": [["hot_*"]], "tables": [{"match": "hot_*", "ranks": [0, 1]}]},
     "3 tables kept apart have 2 ranks between them under constraints.apart[0] (hot_*: no rank holding two of them) "
     "and constraints.tables[0] ('hot_*': ranks 0/1); loosen one of them or add ranks"),
    ({"tables": [{"match": "hot_0", "ranks": [0]}, {"match": "hot_*", "nodes": [1]}]},
     "table 'hot_0' has no rank left under constraints.tables[0] ('hot_0': ranks 0) and constraints.tables[1] "
     "('hot_*': nodes 1); loosen one of them"),
    ({"colocate": [["hot_0", "side_a"]], "tables": [{"match": "hot_0", "schemes": ["row_wise", "column_wise"]}]},
     "table 'hot_0' has no option left under constraints.tables[0] ('hot_0': schemes row_wise/column_wise) and "
     "constraints.colocate[0] (hot_0, side_a: placed whole on one rank together); loosen one of them"),
    ({"colocate": [["hot_0", "side_a"]], "tables": [{"match": "hot_0", "ranks": [0]}, {"match": "side_a", "ranks": [1]}]},
     "the tables of constraints.colocate[0] share no rank under constraints.colocate[0] (hot_0, side_a: placed whole on one "
     "rank together) and constraints.tables[0] ('hot_0': ranks 0) and constraints.tables[1] ('side_a': ranks 1); loosen one of them"),
    ({"tables": [{"match": "hot_0", "ranks": [0, 1], "schemes": ["row_wise"]}]},
     "table 'hot_0' has no option left under constraints.tables[0] ('hot_0': schemes row_wise, ranks 0/1); loosen it"),
])
def test_an_infeasible_placement_names_its_rules(section, line):
    with pytest.raises(InfeasiblePlanError) as e:
        make_plan(constrained(section), config=PATHS["class"])
    assert str(e.value).split(" (its options that fit")[0] == line


@pytest.mark.parametrize("section, line", [
    ({"tables": [{"match": "hot_0", "ranks": [4]}]}, "constraints: tables[0]: ranks must be a list of rank numbers 0..3; got [4]"),
    ({"tables": [{"match": "hot_0", "nodes": [0], "ranks": [1]}]}, "constraints: tables[0]: give ranks or nodes, not both"),
    ({"colocate": [["hot_0"]]}, "constraints: colocate[0] names one table ('hot_0'); a group needs at least two"),
    ({"apart": [["hot_0", "cold"]]}, "constraints: apart[0]: 'cold' matches no table; check the name or pattern"),
    ({"colocate": [["hot_0", "hot_1"], ["hot_1", "hot_2"]]},
     "constraints: colocate[1]: 'hot_1' is in colocate[0] too; merge the two groups into one"),
    ({"colocate": [["hot_0", "hot_1"]], "apart": [["hot_*"]]},
     "constraints: apart[0] keeps 'hot_0' and 'hot_1' apart but colocate[0] puts them together; drop one of the two"),
    ({"apart": "hot_0"}, "constraints: apart must be a list of groups"),
])
def test_bad_placement_constraints_are_one_line(section, line):
    with pytest.raises(ConfigError) as e:
        constrained(section)
    assert str(e.value) == line


def test_explain_keeps_a_pinned_table_to_its_ranks():
    from planner.views.explain import explain

    problem = constrained({"tables": [{"match": "hot_0", "ranks": [3]}]})
    plan = make_plan(problem, config=PATHS["class"])
    assert ranks_of(plan, "hot_0") == {3}
    explanation = explain(plan, problem, AnalyticCostModel(problem.cluster, problem.training), "hot_0")
    for alternative in explanation.tables[0].alternatives:
        if alternative.binds.startswith("forbidden by"):
            assert "ranks 3" in alternative.binds  # row-wise and data-parallel need every rank
        elif alternative.ranks is not None:
            assert set(alternative.ranks) == {3}


def test_repair_moves_shards_only_where_their_rules_admit():
    from planner.search.assignment import Assignment, RankLoads
    from planner.search.repair import repair_placement

    tables = [table(f"p_{i}", 20_000 + 7_919 * i, 32, 1.0 + i % 5) for i in range(8)] + \
             [table(f"hot_{i}", 300_000, 64, 10.0 + i) for i in range(3)] + [table(f"q_{i}", 30_000, 64, 2.0) for i in range(8)]
    problem = constrained({"tables": [{"match": "p_*", "ranks": [0, 1]}, {"match": "*", "schemes": ["table_wise"]}],
                           "apart": [["hot_*"]]}, tables, num_nodes=1, ranks_per_node=6)
    options = enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))
    rules = problem.constraints.rank_rules([t.name for t in tables])
    occupancy = rules.occupancy({})
    start = Assignment()
    for name, opts in options.items():  # a legal but lopsided start: each table on the first rank it may use
        rank = next(r for r in range(6) if occupancy.admits(name, r))
        start.choice[name], start.shard_ranks[name] = opts[0], [rank]
        occupancy.add(name, rank)
    before = RankLoads.of(start, 6).ms.max()
    repaired = repair_placement(start.copy(), problem.cluster, before / 20_000, 0.0, 5.0, float("inf"), 0, 4, rules)
    assert RankLoads.of(repaired, 6).ms.max() < 0.8 * before
    for name, ranks in repaired.shard_ranks.items():
        assert all(rules.may_use(name, r) for r in ranks)
    hot = [set(repaired.shard_ranks[f"hot_{i}"]) for i in range(3)]
    assert not (hot[0] & hot[1] or hot[0] & hot[2] or hot[1] & hot[2])

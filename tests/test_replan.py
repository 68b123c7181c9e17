"""Replanning from an old plan (`plan --from`): what stays stays, the bytes counted are the
bytes `diff` counts, every point within its budget, the front ends at the unconstrained plan."""

import json
import subprocess
import sys
from dataclasses import replace

import pytest

from planner.spec.config import constrain
from planner.views.diff import diff_plans
from planner.spec.errors import InfeasiblePlanError
from planner.plan.planning import make_plan
from planner.replan.replan import replan
from planner.search.solver import SolverConfig
from tests.conftest import make_cluster, make_problem, table

FAST = SolverConfig(time_limit_s=2)
TABLES = [table(f"t{i}", 200_000 * (i + 1), 64, 1.0 + i) for i in range(6)]


def problem_on(ranks, tables=TABLES):
    return make_problem(tables, make_cluster(ranks_per_node=ranks))


def moved(old, new):
    d = diff_plans(old, new, "rowwise_adagrad")
    return d.intra_node_bytes + d.inter_node_bytes


def test_new_tables_are_placed_around_the_old_ones_moving_nothing():
    old = make_plan(problem_on(4), config=FAST)
    grown = problem_on(4, TABLES + [table("new_a", 300_000, 64, 3.0), table("new_b", 50_000, 32, 1.0)])
    front = replan(grown, old, config=FAST, max_move_bytes=0)
    point = front.points[0]
    assert point.moved_bytes == 0 == moved(old, point.plan)
    assert all(point.plan.tables[n] == old.tables[n] for n in old.tables)
    assert {"new_a", "new_b"} <= set(point.plan.tables)


def test_the_front_on_more_ranks_is_faster_per_byte_and_ends_at_the_unconstrained_plan():
    old = make_plan(problem_on(2), config=FAST)
    front = replan(problem_on(4), old, config=FAST)
    assert len(front.points) >= 2
    for a, b in zip(front.points, front.points[1:]):
        assert a.moved_bytes <= b.moved_bytes and b.plan.max_rank_ms < a.plan.max_rank_ms
    for p in front.points:
        assert p.moved_bytes == moved(old, p.plan)  # the bytes diff would report
        assert p.budget_bytes is None or p.moved_bytes <= p.budget_bytes
    assert front.points[-1].plan.max_rank_ms == pytest.approx(front.free.plan.max_rank_ms)
    assert front.points[0].plan.max_rank_ms > front.free.plan.max_rank_ms  # staying costs time here


def test_the_unconstrained_plan_is_relabelled_to_move_fewer_bytes():
    old = make_plan(problem_on(4), config=FAST)
    new_problem = replace(problem_on(4), training=replace(problem_on(4).training, batch_size_per_rank=2048))
    from_scratch = make_plan(new_problem, config=FAST)
    front = replan(new_problem, old, config=FAST)
    assert front.free.plan.max_rank_ms == pytest.approx(from_scratch.max_rank_ms)
    assert front.free.moved_bytes <= moved(old, from_scratch)
    assert front.free.moved_bytes == moved(old, front.free.plan)


def test_a_budget_below_what_must_move_is_one_line():
    old = make_plan(problem_on(2, [table("a", 100_000, 64, 1.0), table("r", 4_000_000, 64, 50.0)]), config=FAST)
    forced = constrain(problem_on(4, [table("a", 100_000, 64, 1.0), table("r", 4_000_000, 64, 50.0)]), {"tables": [{"match": "r", "schemes": ["row_wise"]}]})  # a new world size re-cuts its rows
    with pytest.raises(InfeasiblePlanError) as e:
        replan(forced, old, config=FAST, max_move_bytes=0)
    assert str(e.value).startswith("the new plan moves at least ") and str(e.value).endswith(" or more")
    assert "\n" not in str(e.value)


def test_plan_from_writes_the_front_and_refuses_bad_flags(tmp_path):
    old = tmp_path / "old.json"
    run = [sys.executable, "-m", "dlrm_scale.cli", "plan", "configs/tiny.yaml", "--time-limit", "2"]
    subprocess.run(run + ["--out", str(old)], check=True, capture_output=True)
    out = tmp_path / "new.json"
    done = subprocess.run(run + ["--world-size", "4", "--from", str(old), "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    fronts = sorted(tmp_path.glob("new.front-*.json"))
    assert fronts and out.exists() and "vs unconstrained" in done.stdout
    assert json.loads(out.read_text())["world_size"] == 4
    budget = subprocess.run(run + ["--world-size", "4", "--from", str(old), "--max-move-gb", "0.5", "--out", str(out)],
                            capture_output=True, text=True)
    assert budget.returncode == 0, budget.stderr
    for flags, line in [(["--max-move-gb", "1"], "error: --max-move-gb takes a non-negative number of GiB, with --from OLD.json"),
                        (["--from", str(old), "--max-move-gb", "nan"], "error: --max-move-gb takes a non-negative number of GiB, with --from OLD.json"),
                        (["--from", str(tmp_path / "none.json")], None)]:
        bad = subprocess.run(run + flags + ["--out", str(out)], capture_output=True, text=True)
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
        if line:
            assert bad.stderr.strip() == line


def together(plan, names):
    return len({tuple(plan.tables[n].ranks) for n in names}) == 1 and len(plan.tables[names[0]].ranks) == 1 \
        and {plan.tables[n].sharding_type for n in names} == {"table_wise"}


def test_colocated_groups_stay_move_and_are_counted_together():
    group = {"colocate": [["t1", "t4"]]}
    old = make_plan(constrain(problem_on(2), group), config=FAST)
    assert together(old, ["t1", "t4"])
    front = replan(constrain(problem_on(4), group), old, config=FAST)
    assert front.points[0].moved_bytes == 0 and front.points[0].plan.tables == old.tables  # the group stayed whole
    for p in front.points:
        assert together(p.plan, ["t1", "t4"])
        assert p.moved_bytes == moved(old, p.plan)
        assert p.budget_bytes is None or p.moved_bytes <= p.budget_bytes
    assert front.points[-1].plan.max_rank_ms < front.points[0].plan.max_rank_ms
    # a group the old plan had apart must come together: it cannot move nothing, and moves once
    apart = make_plan(constrain(problem_on(4), {"apart": [["t1", "t4"]]}), config=FAST)
    grouped = constrain(problem_on(4), group)
    with pytest.raises(InfeasiblePlanError, match="the new plan moves at least"):
        replan(grouped, apart, config=FAST, max_move_bytes=0)
    joined = replan(grouped, apart, config=FAST)
    assert all(together(p.plan, ["t1", "t4"]) for p in joined.points)
    assert all(p.moved_bytes == moved(apart, p.plan) > 0 for p in joined.points)


def plans_with_moves(problem, old):
    """Every plan of `problem` (each option, each placement of its shards, memory ignored, which
    only adds plans): its busiest rank and the bytes it moves from `old`, as `diff` counts them."""
    import itertools

    import numpy as np

    from planner.search.candidates import enumerate_options
    from planner.cost.cost_model import AnalyticCostModel
    from planner.views.diff import moved_bytes
    from planner.plan.planning import option_layout
    from planner.spec.types import Placement

    world, specs = problem.cluster.world_size, {t.name: t for t in problem.tables}
    options = enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))
    per_table = []
    for name, opts in options.items():
        laid = []
        for o in opts:
            fixed = o.placement in (Placement.EVERY_RANK, Placement.NODE_RANKS)
            for ranks in ([list(range(len(o.shards)))] if fixed else itertools.product(range(world), repeat=len(o.shards))):
                moves = sum(moved_bytes(old.tables[name], option_layout(o, list(ranks), specs[name]), old.ranks_per_node,
                                        problem.cluster.ranks_per_node, problem.training.embedding_optimizer))
                laid.append((o, list(ranks), moves))
        per_table.append(laid)
    for combo in itertools.product(*per_table):
        ms = np.zeros(world)
        for o, ranks, _ in combo:
            np.add.at(ms, ranks, o.shard_ms)
        yield float(ms.max()), sum(m for *_, m in combo)


def floors_under_every_plan(new, old, plans):
    """Each point's floor at or under the fastest of `plans` within its budget, for budgets
    from nothing to the sixth smallest any plan moves."""
    for budget in sorted({0, *(m for _, m in plans)})[:6]:
        for point in replan(new, old, config=FAST, max_move_bytes=budget).points:
            best_within = min(ms for ms, m in plans if m <= (budget if point.budget_bytes is None else point.budget_bytes))
            assert point.floor_ms <= best_within * (1 + 1e-9) <= point.plan.max_rank_ms * (1 + 1e-9)


def test_the_proven_floor_is_under_every_plan_within_its_budget_and_binds_where_a_table_must_split():
    # 'a' is heavy: on 3 ranks the fastest plans split it, which moves part of it off its old rank
    tables = [table("a", 400_000, 16, 30.0), table("b", 20_000, 16, 2.0)]
    old = make_plan(constrain(problem_on(2, tables), {"tables": [{"match": "a", "schemes": ["table_wise"]}]}), config=FAST)
    new = problem_on(3, tables)
    plans = list(plans_with_moves(new, old))
    fastest = min(ms for ms, _ in plans)
    floors_under_every_plan(new, old, plans)
    nothing = replan(new, old, config=FAST, max_move_bytes=0).points[0]
    assert nothing.floor_ms > fastest * 1.05  # moving nothing keeps 'a' whole, and the floor knows it
    assert nothing.floor_ms > nothing.plan.lower_bound_ms * 1.05


def test_the_floor_knows_a_busy_old_rank_keeps_only_what_fits_under_it():
    # 'a' and 'b' stay together on rank 0 unless one of them moves: moving nothing keeps rank 0
    # at both, though the three ranks' work together would allow far less
    tables = [table("a", 300_000, 8, 6.0), table("b", 300_000, 8, 6.0), table("c", 1_000, 8, 1.0)]
    old = make_plan(constrain(problem_on(2, tables), {"tables": [{"match": "[ab]", "schemes": ["table_wise"], "ranks": [0]},
                                                                 {"match": "c", "ranks": [1]}]}), config=FAST)
    assert old.tables["a"].ranks == old.tables["b"].ranks == [0]
    new = problem_on(3, tables)
    plans = list(plans_with_moves(new, old))
    floors_under_every_plan(new, old, plans)
    nothing = replan(new, old, config=FAST, max_move_bytes=0).points[0]
    best_within = min(ms for ms, m in plans if m == 0)
    assert nothing.floor_ms <= best_within * (1 + 1e-9)
    assert nothing.floor_ms >= best_within * (1 - 1e-3)  # the floor is the best plan that moves nothing
    assert best_within > min(ms for ms, _ in plans) * 1.3


def test_the_search_keeps_each_shard_of_a_held_table_on_its_own_rank():
    # stacking 'a''s two halves on one rank would free the other for 'n' (which must stay whole),
    # but it moves half of 'a': a held table's shards stay each on its rank
    from planner.search.candidates import enumerate_options
    from planner.search.colocation import colocate
    from planner.cost.cost_model import AnalyticCostModel
    from planner.replan.replan import _Moves, keeping, stay

    old = make_plan(constrain(problem_on(2, [table("a", 200_000, 64, 4.0)]),
                              {"tables": [{"match": "a", "schemes": ["column_wise"], "max_shards": 2}]}), config=FAST)
    assert old.tables["a"].ranks == [0, 1]
    new = constrain(problem_on(2, [table("a", 200_000, 64, 4.0), table("n", 50_000, 64, 12.0)]),
                    {"tables": [{"match": "n", "schemes": ["table_wise"]}]})
    options = enumerate_options(new, AnalyticCostModel(new.cluster, new.training))
    base = _Moves(new, old, options, colocate(options, (), new.constraints.rank_rules(["a", "n"])))
    stay(base)
    found = keeping(base, {"n"}, FAST, 2.0)
    assert found.shard_ranks["a"] == [0, 1] and found.choice["a"] is base.assignment.choice["a"]

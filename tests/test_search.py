"""The search's bounds and its improvers: the shard-limited bound, the class model under a cap
(the probes' question) and the hill climbing over options."""

import math
import time

import numpy as np
import pytest
from ortools.sat.python import cp_model

from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.search.bounds import lower_bound_ms, shard_limited_bound_ms
from planner.search.cpsat import ClassModel, packing_cut_value, solver_parameters
from planner.search.greedy import choose_options, local_search, pack, rechoose_options
from planner.spec.placement_rules import RankRules
from planner.search.solver import SolverConfig, _probe_caps, probe_target, solve
from planner.spec.types import Placement
from tests.conftest import make_cluster, make_problem, table
from tests.test_solver import brute_force_peak, options_for

# Problems small enough for the brute force, on which the shard-limited bound is above the
# work-or-granularity one (a heavy table whose cheapest option is too large for the target).
NEEDS_SPLIT = [
    ([table("a", 100_000, 64, 10.0), table("b", 1000, 8, 1.0)], 2),
    ([table("a", 200_000, 64, 20.0), table("b", 50_000, 32, 5.0), table("c", 1000, 8, 1.0)], 2),
    ([table("a", 100_000, 8, 10.0), table("b", 30, 4, 1.0)], 3),
]


def peak(assignment, world):
    return float(RankLoads.of(assignment, world).ms.max())


@pytest.mark.parametrize("tables, ranks", NEEDS_SPLIT)
def test_shard_limited_bound_is_tighter_and_still_a_bound(tables, ranks):
    problem = make_problem(tables, make_cluster(ranks_per_node=ranks), batch=4096)
    options = options_for(problem)
    optimum = brute_force_peak(options, problem.cluster)
    simple = lower_bound_ms(options, ranks)
    tighter = shard_limited_bound_ms(options, ranks)
    assert simple * (1 + 1e-6) < tighter <= optimum * (1 + 1e-9)
    assert solve(options, problem.cluster, SolverConfig(time_limit_s=5)).lower_bound_ms <= optimum * (1 + 1e-9)


@pytest.mark.parametrize("cuts", [False, True], ids=["default", "cuts"])
@pytest.mark.parametrize("tables, ranks", NEEDS_SPLIT)
def test_class_model_under_a_cap_refutes_below_the_optimum_and_plans_at_it(tables, ranks, cuts):
    problem = make_problem(tables, make_cluster(ranks_per_node=ranks), batch=4096)
    options = options_for(problem)
    optimum = brute_force_peak(options, problem.cluster)
    start = local_search(pack(choose_options(options, math.inf), problem.cluster), problem.cluster)
    model = ClassModel(options, problem.cluster, start, unit_ms=optimum / 20_000)

    below = model.solve(5.0, 10.0, seed=0, peak_at_most_ms=optimum * 0.98, cuts=cuts)
    assert below.optimal and below.assignment is None
    assert optimum * 0.98 < below.bound_ms <= optimum * (1 + 1e-9)  # a refutation, and a valid bound

    at = model.solve(5.0, 10.0, seed=0, peak_at_most_ms=optimum * 1.001, cuts=cuts)  # the same model, asked again
    assert at.assignment is not None
    assert peak(at.assignment, ranks) <= optimum * 1.001


@pytest.mark.parametrize("tables, ranks", NEEDS_SPLIT)
def test_the_class_model_stops_at_its_first_plan_better_than_the_hint_under_the_stop(tables, ranks):
    """`stop_at_ms`: the search ends at the first plan better than its hint at or under it,
    before any proof; a stop no plan reaches leaves the search to its optimum."""
    problem = make_problem(tables, make_cluster(ranks_per_node=ranks), batch=4096)
    options = options_for(problem)
    optimum = brute_force_peak(options, problem.cluster)
    start = pack(choose_options(options, math.inf), problem.cluster)  # a poor start
    model = ClassModel(options, problem.cluster, start, unit_ms=optimum / 20_000)
    full = model.solve(5.0, 10.0, seed=0)
    assert full.optimal and peak(full.assignment, ranks) == pytest.approx(optimum, rel=1e-3)
    stopped = model.solve(5.0, 10.0, seed=0, stop_at_ms=peak(start, ranks))
    assert not stopped.optimal and peak(stopped.assignment, ranks) < peak(start, ranks)
    unreached = model.solve(5.0, 10.0, seed=0, stop_at_ms=optimum * 0.9)
    assert unreached.optimal and peak(unreached.assignment, ranks) == pytest.approx(optimum, rel=1e-3)


def test_local_search_ends_where_no_move_or_swap_lowers_the_busiest_rank():
    """Random tables on 16 ranks, placed at random: local search stops only where no move of a
    shard off the busiest rank, and no swap of one with a shard of another rank, puts both ranks
    below it (brute force), whichever ranks its array pricing passed over."""
    from tests.test_phase_balance import placed, table_wise

    rng = np.random.default_rng(7)
    options = {f"t{i}": table_wise(f"t{i}", compute_ms=float(rng.uniform(0, 10))) for i in range(60)}
    start = placed({t: int(rng.integers(16)) for t in options}, options)
    out = local_search(start.copy(), make_cluster(ranks_per_node=16))
    loads = RankLoads.of(out, 16).ms
    assert loads.max() < 0.8 * RankLoads.of(start, 16).ms.max()
    top = int(np.argmax(loads))
    ms = {t: float(options[t].shard_ms[0]) for t in options}
    on_top = [t for t in options if out.shard_ranks[t] == [top]]
    for t in on_top:
        for d in range(16):
            assert d == top or max(loads[top] - ms[t], loads[d] + ms[t]) >= loads[top] - 1e-12, (t, d)
        for u in options:
            d = out.shard_ranks[u][0]
            if d != top:
                delta = ms[t] - ms[u]
                assert max(loads[top] - delta, loads[d] + delta) >= loads[top] - 1e-12, (t, u)


@pytest.mark.parametrize("tables, ranks", NEEDS_SPLIT)
def test_probes_climb_from_the_bound_to_the_optimum(tables, ranks):
    """Small steps up from the shard-limited bound close the gap on small problems, and no
    step proves a bound above the optimum."""
    problem = make_problem(tables, make_cluster(ranks_per_node=ranks), batch=4096)
    options = options_for(problem)
    optimum = brute_force_peak(options, problem.cluster)
    start = pack(choose_options(options, math.inf), problem.cluster)  # a poor start: the probes must find better
    bound = shard_limited_bound_ms(options, ranks)
    model = ClassModel(options, problem.cluster, start, unit_ms=optimum / 20_000)
    config = SolverConfig(probe_step=0.01)
    best, best_peak, proven = _probe_caps(model, start, bound, 20.0, time.monotonic() + 60, config)
    assert bound <= proven <= optimum * (1 + 1e-9)
    assert best_peak == pytest.approx(peak(best, ranks)) and best_peak <= proven * (1 + config.target_gap) + 1e-9


def test_probes_land_on_the_proof_of_the_promised_gap_instead_of_stepping_past_it():
    """Within two steps of the cap that proves the plan within `proof_gap`, the next probe is
    that cap (a step would end just under or past it); further below, or once it is refuted or
    undecided, the probes step as before."""
    config = SolverConfig(probe_step=0.005, proof_gap=0.02)
    best = 6.5693
    proof = best / 1.02
    assert probe_target(6.0, best, best, config) == pytest.approx(6.03)  # far below: one step
    assert probe_target(6.40, best, best, config) == pytest.approx(proof)  # a step would stop at 6.432
    assert probe_target(6.43, best, best, config) == pytest.approx(proof)  # a step would pass it
    assert probe_target(proof * 1.0001, best, best, config) == pytest.approx(proof * 1.0001 * 1.005)  # refuted: climb on
    undecided = probe_target(6.43, proof, best, config)  # undecided: the probes stay below it
    assert 6.43 < undecided < proof
    no_promise = SolverConfig(probe_step=0.005, proof_gap=0.0)
    assert probe_target(6.40, best, best, no_promise) == pytest.approx(6.432)


def seven_tables_on_four_ranks():
    problem = make_problem([table(f"t{i}", 200_000, 64, 8.0) for i in range(7)], make_cluster(ranks_per_node=4), batch=4096)
    return problem, options_for(problem)


def test_rechoosing_options_mixes_schemes_a_uniform_cap_cannot():
    problem, options = seven_tables_on_four_ranks()
    cluster = problem.cluster
    uniform = [local_search(pack(choose_options(options, cap), cluster), cluster)
               for cap in {o.max_shard_ms + 1e-12 for opts in options.values() for o in opts}]
    best_uniform = min(peak(a, 4) for a in uniform)
    start = min(uniform, key=lambda a: peak(a, 4))
    better = rechoose_options(options, start.copy(), cluster, time.monotonic() + 10)
    assert peak(better, 4) < best_uniform * (1 - 0.02)
    assert len({o.sharding_type for o in better.choice.values()}) > 1
    assert peak(better, 4) >= shard_limited_bound_ms(options, 4) * (1 - 1e-9)
    assert np.all(RankLoads.of(better, 4).bytes <= rank_capacities(cluster))


def test_rechoosing_options_keeps_pins():
    problem, options = seven_tables_on_four_ranks()
    cluster = problem.cluster
    rules = RankRules(allowed={"t0": frozenset({3}), "t1": frozenset({2})})
    pinned = {t: [o for o in opts if t not in rules.allowed or len(o.shards) == 1] for t, opts in options.items()}
    start = local_search(pack(choose_options(pinned, math.inf), cluster, rules), cluster, rules)
    better = rechoose_options(pinned, start.copy(), cluster, time.monotonic() + 10, rules)
    assert peak(better, 4) < peak(start, 4)
    assert better.shard_ranks["t0"] == [3] and better.shard_ranks["t1"] == [2]


def test_packing_cut_values_fit_one_rank_and_count_the_large_shards():
    """Shards that fit a rank together have f_k summing to at most k (what makes each cut valid),
    and three shards over half a cap count three ranks where their area needs two."""
    rng = np.random.default_rng(0)
    cap = 20_000
    for _ in range(2_000):
        loads = []
        while True:  # shards drawn until the next would overfill the rank
            t = int(rng.integers(1, cap + 1) ** rng.uniform(0.5, 1.0))
            if sum(loads) + t > cap:
                break
            loads.append(t)
        for k in range(1, 9):
            assert sum(packing_cut_value(t, cap, k) for t in loads) <= k
    assert sum(packing_cut_value(int(0.6 * cap), cap, 1) for _ in range(3)) == 3  # > 2 ranks' worth of k=1
    assert packing_cut_value(cap // 3, cap, 2) == 0 and packing_cut_value(cap // 3 + 1, cap, 2) == 1


def test_class_model_hint_keeps_a_plan_with_node_bound_options():
    """A plan that took a node-bound option (table-column-wise, which the class model leaves
    out) is hinted through its free twin: the hint is complete and feasible, so the model can
    start from it (otherwise CP-SAT starts from the horizon and returns far worse plans)."""
    problem = make_problem([table(f"t{i}", 400_000, 128, 20.0) for i in range(5)], make_cluster(num_nodes=2, ranks_per_node=2), batch=4096)
    options = options_for(problem)
    plan = Assignment()
    for i, (name, opts) in enumerate(options.items()):
        node_bound = next(o for o in opts if o.placement is Placement.ONE_NODE)
        plan.choice[name] = node_bound
        plan.shard_ranks[name] = [(i % 2) * 2 + s for s in range(len(node_bound.shards))]
    model = ClassModel(options, problem.cluster, plan, unit_ms=peak(plan, 4) / 20_000)
    proto = model.model.Proto()
    assert len(proto.solution_hint.vars) == len(proto.variables)  # complete, the busiest rank included
    solver = solver_parameters(5.0, 10.0, 0)
    solver.parameters.fix_variables_to_their_hinted_value = True
    assert solver.Solve(model.model) in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    result = model.solve(0.5, 10.0, seed=0)
    assert peak(result.assignment, 4) <= peak(plan, 4) * (1 + 1e-9)

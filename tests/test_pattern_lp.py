"""The configuration LP (planner.search.pattern_lp): never refutes a cap a plan meets, refutes every cap
under the shard-limited bound, and more where whole shards cannot share ranks evenly; its
fractional plans seed the search (planner.search.solver._pattern_stage)."""

import itertools
import math
import time

import numpy as np

import pytest

from planner.search.bounds import shard_limited_bound_ms
from planner.search.cpsat import to_ticks
from planner.spec.errors import ConfigError
from planner.search.greedy import choose_options, pack
from planner.search.pattern_lp import PatternLP, _best_pattern, _splits, _worth_pricing
from planner.search import work
from planner.search.solver import SolverConfig, _LPBounds, _pattern_stage
from planner.spec.placement_rules import RankRules
from planner.spec.types import Perf, ShardCost, ShardGeometry, ShardingOption, ShardingType, Storage
from tests.conftest import make_cluster, make_problem, table
from tests.test_search import NEEDS_SPLIT, peak
from tests.test_solver import brute_force_peak, options_for

FAR = 1e18  # no wall-clock deadline: the checks stop on their rounds
# Small enough for the brute force: shards that must split, replicas and (on a host) every-rank costs
PROBLEMS = NEEDS_SPLIT + [
    ([table("a", 10_000, 8, 4.0), table("b", 5_000, 8, 1.0), table("c", 2_000_000, 8, 2.0)], 2, "cuda"),
    ([table("a", 100_000, 8, 10.0), table("b", 30, 4, 1.0), table("c", 5_000, 16, 3.0)], 3, "cpu"),
]


def cap_ticks(ms: float, unit_ms: float) -> int:
    return to_ticks(ms * (1 + 1e-12), unit_ms)


def whole_table(name: str, ms: float) -> ShardingOption:
    """A table with one option: one shard of `ms`."""
    return ShardingOption(name, ShardingType.TABLE_WISE, "fused", "hbm", (ShardGeometry(0, 0, 100, 8),),
                          (ShardCost(Perf(fwd_compute_ms=ms), Storage(hbm_bytes=1)),))


@pytest.mark.parametrize("problem", PROBLEMS, ids=lambda p: f"{len(p[0])}x{p[1]}")
def test_the_lp_never_refutes_the_optimum_and_refutes_below_the_shard_limited_bound(problem):
    tables, ranks, *device = (*problem, "cuda") if len(problem) == 2 else problem
    cluster = make_cluster(ranks_per_node=ranks, device=device[0])
    options = options_for(make_problem(tables, cluster, batch=4096))
    optimum = brute_force_peak(options, cluster)
    unit_ms = optimum / 20_000
    lp = PatternLP(options, ranks, unit_ms)
    below = lp.check(cap_ticks(shard_limited_bound_ms(options, ranks) * 0.999, unit_ms), 400, FAR)
    assert below.refuted and below.weights is None
    at = lp.check(cap_ticks(optimum, unit_ms), 400, FAR)  # the same LP, its patterns kept, asked again
    assert not at.refuted
    assert set(at.weights) == set(options)
    assert all(sum(w.values()) == pytest.approx(1.0) for w in at.weights.values())


def test_whole_shards_that_cannot_share_ranks_evenly_are_refuted_where_their_area_fits():
    """Five tables of 0.6 ms on three ranks: 1.0 ms a rank by area, but a rank holds one or two
    of them, so some rank carries 1.2. The LP proves it; the shard-limited bound says 1.0."""
    options = {f"t{i}": [whole_table(f"t{i}", 0.6)] for i in range(5)}
    unit_ms = 1.2 / 20_000
    assert shard_limited_bound_ms(options, 3) == pytest.approx(1.0)
    lp = PatternLP(options, 3, unit_ms)
    assert lp.check(cap_ticks(1.19, unit_ms), 400, FAR).refuted
    at = lp.check(cap_ticks(1.2, unit_ms), 400, FAR)
    assert not at.refuted and at.weights == {t: {0: pytest.approx(1.0)} for t in options}


@pytest.mark.parametrize("tables, ranks", NEEDS_SPLIT)
def test_the_pattern_stage_raises_the_bound_validly_and_never_worsens_the_plan(tables, ranks):
    problem = make_problem(tables, make_cluster(ranks_per_node=ranks), batch=4096)
    options = options_for(problem)
    optimum = brute_force_peak(options, problem.cluster)
    start = pack(choose_options(options, math.inf), problem.cluster)  # a poor start
    bound = shard_limited_bound_ms(options, ranks)
    unit_ms = bound / 20_000
    lp = _LPBounds(PatternLP(options, ranks, unit_ms), unit_ms, bound)
    best, best_peak = _pattern_stage(lp, options, problem.cluster, start, SolverConfig(), time.monotonic() + 60, RankRules(),
                                     work.now() + work.budget(60))
    assert bound <= lp.bound_ms <= optimum * (1 + 1e-9)
    assert best_peak == pytest.approx(peak(best, ranks)) and best_peak <= peak(start, ranks)
    # a plan found later (the optimum) asks the LP for its own proof: the bound never passes it
    assert lp.bound_ms <= lp.prove(optimum, bound, SolverConfig(), time.monotonic() + 60) <= optimum * (1 + 1e-9)


def test_a_plan_found_after_the_lp_stage_is_proven_by_the_lp_where_it_can():
    """Five tables of 0.6 ms on three ranks, the LP's optimum 1.2 ms (one rank holds two): a
    1.2 ms plan is proven within the target gap by one check; for a 1.25 ms plan the check finds
    a fractional plan, the bound stays and later caps above that one are not asked."""
    options = {f"t{i}": [whole_table(f"t{i}", 0.6)] for i in range(5)}
    unit_ms = 1.2 / 20_000
    config = SolverConfig(target_gap=0.01)
    lp = _LPBounds(PatternLP(options, 3, unit_ms), unit_ms, 1.0)
    assert lp.prove(1.25, 1.0, config, FAR) == 1.0
    assert lp.high_ms == pytest.approx(1.25 / 1.01)
    proven = lp.prove(1.2, 1.0, config, FAR)
    assert 1.2 / 1.01 <= proven <= 1.2 and lp.bound_ms == proven
    fresh = _LPBounds(PatternLP(options, 3, unit_ms), unit_ms, 1.0)
    fresh.high_ms = 1.15  # as if it had found a fractional plan under 1.15: a cap above that is not asked
    assert fresh.prove(1.2, 1.0, config, FAR) == 1.0


@pytest.mark.parametrize("seed", range(20))
def test_the_pricing_knapsack_finds_the_best_pattern_and_its_value(seed):
    """Against every count of every class (brute force): the pattern fits the cap and the
    limits and is worth the best, and the value returned is the best's to float rounding, which
    REFUTE_MARGIN covers (a smaller one would let Farley's bound refute a cap a plan meets)."""
    rng = np.random.default_rng(seed)
    classes = 5
    ticks = rng.integers(0, 40, classes)
    values = np.where(rng.random(classes) < 0.8, rng.random(classes) * rng.choice([1e-6, 1.0, 1e3]), 0.0)
    limit = rng.integers(0, 4, classes)
    cap = int(rng.integers(1, 120))
    best = max(float(np.dot(counts, values)) for counts in itertools.product(*(range(n + 1) for n in limit))
               if np.dot(counts, ticks) <= cap)
    value, pattern = _best_pattern(values, ticks, limit, cap)
    assert sum(ticks[c] * n for c, n in pattern.items()) <= cap and all(n <= limit[c] for c, n in pattern.items())
    assert sum(values[c] * n for c, n in pattern.items()) == pytest.approx(best, rel=1e-12, abs=1e-300)
    assert value == pytest.approx(best, rel=1e-12, abs=1e-300)


def test_the_splits_left_out_of_pricing_are_in_no_best_pattern():
    """Over every subset of the splits (brute force), on instances where the reduction leaves some
    out: each one left out is in no subset within the cap worth the best."""
    left_out = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        ticks = rng.integers(1, 40, 7)
        values = rng.random(7) * ticks * rng.uniform(0.5, 1.5, 7)  # densities near each other, as duals make them
        splits = _splits(values, ticks, rng.integers(1, 4, 7))
        cap = int(rng.integers(20, 100))
        kept = set(_worth_pricing(splits, cap))
        subsets = [(sum(s[3] for s in chosen), chosen) for k in range(len(splits) + 1)
                   for chosen in itertools.combinations(splits, k) if sum(s[2] for s in chosen) <= cap]
        best = max(v for v, _ in subsets)
        for split in set(splits) - kept:
            left_out += 1
            assert max((v for v, chosen in subsets if split in chosen), default=-1.0) < best
    assert left_out > 0


@pytest.mark.parametrize("setting", [{"pattern_checks": -1}, {"pattern_rounds": -1}])
def test_negative_pattern_settings_are_refused_with_their_names(setting):
    with pytest.raises(ConfigError, match="pattern_checks and pattern_rounds must be >= 0"):
        SolverConfig(**setting)

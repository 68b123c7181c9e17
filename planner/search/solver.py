"""The optimizer: warm start from greedy, then CP-SAT, with a proven lower bound and gap.

Small instances go to the configuration LP (a bound that sees whole shards, and seeds) and the
class or joint CP-SAT model (option and placement chosen together); large ones keep the best
greedy options, placed again by best fit under a bisected cap, and repair placement with
CP-SAT over a few ranks at a time. Identical tables
are costed once (candidates), identical ranks make every rank an equal target, and the bound
is valid whichever path ran.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Mapping, Sequence

from planner.search import progress, wall_clock, work
from planner.search.assignment import Assignment, RankLoads
from planner.search.bounds import shard_limited_bound_ms
from planner.search.cpsat import ClassModel, class_model_size, joint_model_size, solve_joint, to_ticks
from planner.spec.errors import ConfigError, InfeasiblePlanError
from planner.search.greedy import choose_options, fit_memory, local_search, pack, rechoose_options, refine_by_splitting, split_stuck_table
from planner.search.pattern_lp import PatternCheck, PatternLP
from planner.search.phase_balance import tightest_by_phases
from planner.spec.placement_rules import RankRules
from planner.search.repair import repair_placement
from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS, ShardingOption


# The greedy stages' work (planner.search.work), as shares of the time limit: the warm start's
# caps, hill climbing over options after it, and the seeds the configuration LP rounds. The
# CP-SAT stages count deterministic seconds (below, in solve); the wall clock only caps them all.
# All of them together spend WORK_SHARE of the time limit's seconds: a deterministic second of
# CP-SAT took up to 2 s of wall clock on a 2-core machine, and the limit stays a ceiling that a
# busy machine (both cores taken by a training run) should not reach; at half, the planner
# benchmark's Criteo workloads planned the same plans and bounds as with all of it.
WORK_SHARE = 0.5
WARM_START_SHARE = 0.4
RECHOOSE_SHARE = 0.15
PATTERN_SHARE = 0.2


@dataclass(frozen=True)
class SolverConfig:
    """Solver settings. `time_limit_s` bounds the whole search; `seed` fixes its choices."""

    time_limit_s: float = 10.0
    seed: int = 0
    class_model_max_variables: int = 50_000  # above this, try the joint model, then repair
    joint_model_max_booleans: int = 20_000  # above this, keep greedy options and repair placement
    repair_neighbourhood_ranks: int = 8
    # stop once the plan's busiest rank is proven this close to its bound: a tenth of the cost
    # model's own error. On the planner benchmark's Criteo and synthetic workloads (8-128 ranks)
    # 1% gave steps within 0.04% of 0.1%'s or shorter (Criteo Kaggle on 8: 10% shorter, its solve
    # closing in time for the fewer-types re-solves), in 0.3-8.2 s against 2.0-8.6 s
    target_gap: float = 0.01
    # the probes under caps climb from the bound in steps of at most this fraction of it
    probe_step: float = 0.005
    # ... and land on the target that proves the plan within this of optimal instead of stepping
    # past it: the proof a plan's gap promises (2%), where a step beyond it ends undecided
    proof_gap: float = 0.02
    # caps put to the configuration LP (planner.search.pattern_lp), and its pricing rounds for each
    pattern_checks: int = 10
    pattern_rounds: int = 400
    # shard-size caps tried by the greedy warm start, as fractions of the lower bound
    greedy_shard_caps: tuple[float, ...] = (math.inf, 1.0, 0.8, 0.65, 0.5, 0.35, 0.25, 0.1)

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ConfigError(f"solver: time_limit_s must be > 0, got {self.time_limit_s}; try --time-limit 10")
        if self.repair_neighbourhood_ranks < 2:
            raise ConfigError("solver: repair_neighbourhood_ranks must be at least 2")
        if not self.probe_step > 0:
            raise ConfigError(f"solver: probe_step must be > 0, got {self.probe_step}")
        if not 0 <= self.target_gap < 1:
            raise ConfigError(f"solver: target_gap must be in [0, 1), got {self.target_gap}; try --gap 0.01")
        if not self.proof_gap >= 0:
            raise ConfigError(f"solver: proof_gap must be >= 0, got {self.proof_gap}")
        if self.pattern_checks < 0 or self.pattern_rounds < 0:
            raise ConfigError(f"solver: pattern_checks and pattern_rounds must be >= 0, got {self.pattern_checks} and {self.pattern_rounds}")
        if not self.greedy_shard_caps:
            raise ConfigError("solver: greedy_shard_caps needs at least one cap")


@dataclass(frozen=True)
class Solution:
    assignment: Assignment
    max_rank_ms: float
    lower_bound_ms: float
    method: str  # the path that produced it: greedy, class[-optimal], joint[-optimal], each maybe +repair
    seconds: float

    @property
    def gap(self) -> float:
        """How far above the proven lower bound the plan is, as a fraction of the bound."""
        return self.max_rank_ms / self.lower_bound_ms - 1 if self.lower_bound_ms > 0 else 0.0


def _tick_ms(bound_ms: float) -> float:
    """The CP-SAT models' and the configuration LP's integer tick: 0.005% of the bound."""
    return max(bound_ms, 1e-9) / 20_000


def _peak(assignment: Assignment, world: int) -> float:
    return float(RankLoads.of(assignment, world).ms.max())


def _check_total_memory(options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec) -> None:
    """One line when even each table's smallest option overfills a tier of the whole cluster."""
    cached = any(o.cache_fraction < 1 for opts in options_by_table.values() for o in opts)
    for index, tier in enumerate(TIERS):
        need = sum(min(int(o.shard_bytes[:, index].sum()) for o in opts) for opts in options_by_table.values())
        have = cluster.capacity_bytes_per_rank(tier) * cluster.world_size
        if need > have:
            smallest = "each in its smallest option, caches at the smallest load factor" if cached else "each in its smallest option"
            fix = "add ranks or memory, or allow smaller caches (tiering.load_factors)" if cached else "add ranks or memory per rank"
            raise InfeasiblePlanError(f"the tables need at least {need:,} bytes of {tier} ({smallest}) but the cluster has {have:,}; {fix}")


def _fitted(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    chosen: dict[str, ShardingOption],
    cluster: ClusterSpec,
    deadline_s: float,
    rules: RankRules,
    work_until: int,
) -> tuple[Assignment | InfeasiblePlanError, bool]:
    """`chosen` made to fit memory, then placed and refined. Swaps options until each tier's
    total fits (filling less of it on each retry), and splits the tables that still find no
    rank with room; the error of the last try if nothing fits. Also says whether memory was
    tight (`chosen` did not fit as it was)."""
    try:  # the fastest choice, when it fits as it is
        return refine_by_splitting(options_by_table, chosen, cluster, deadline_s, rules, work_until), False
    except InfeasiblePlanError as e:
        error = e
    for fill in (0.95, 0.85, 0.7):
        fitted = fit_memory(chosen, options_by_table, cluster, fill)
        for _ in range(len(fitted)):
            try:
                return refine_by_splitting(options_by_table, fitted, cluster, deadline_s, rules, work_until), True
            except InfeasiblePlanError as e:
                error = e
                if e.table is None or not split_stuck_table(fitted, options_by_table, e.table, cluster):
                    break
    return error, True


def warm_start(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    cluster: ClusterSpec,
    bound_ms: float,
    caps: Sequence[float],
    deadline_s: float,
    rules: RankRules,
    work_until: int,
) -> Assignment:
    """Best over several shard-size caps of: greedy option choice (made to fit memory), LPT,
    local search and splitting of the tables on the busiest rank, and of the smallest shards
    everywhere. Each cap gets an equal share of the work left before `work_until`
    (planner.search.work); `deadline_s` is the wall-clock ceiling."""
    _check_total_memory(options_by_table, cluster)
    best, best_peak, first_error, tight = None, math.inf, None, False
    for i, frac in enumerate(caps):
        share = work.now() + max(0, work_until - work.now()) // (len(caps) - i)
        candidate, squeezed = _fitted(options_by_table, choose_options(options_by_table, frac * bound_ms), cluster, deadline_s, rules,
                                      share)
        tight = tight or squeezed
        if isinstance(candidate, InfeasiblePlanError):
            first_error = first_error or candidate
            continue
        peak = _peak(candidate, cluster.world_size)
        if peak < best_peak - 1e-12:
            best, best_peak = candidate, peak
    if not tight:
        return best
    # The greedy choices favour speed; the smallest shards everywhere (tables split rather
    # than cached) sometimes fit better when memory is tight, and are the last resort.
    smallest = {t: min(opts, key=lambda o: (o.shard_bytes.max(), o.total_ms)) for t, opts in options_by_table.items()}
    try:
        candidate = local_search(pack(smallest, cluster, rules), cluster, rules)
    except InfeasiblePlanError:
        if best is None:
            raise first_error from None
    else:
        if _peak(candidate, cluster.world_size) < best_peak - 1e-12:
            best = candidate
    return best


def probe_target(bound_ms: float, high_ms: float, best_peak_ms: float, config: SolverConfig) -> float:
    """The next probe's cap: a step of `config.probe_step` up from the bound, or the midpoint of
    the bound and `high_ms` (the best plan, or an undecided cap) when that is lower. It lands on
    the target that proves the best plan within `config.proof_gap` rather than step past it, and
    goes straight to it from within two steps: near the optimum each step costs about four times
    the last (26 MLPerf tables on 16 ranks: 6.400 ms refuted in 0.3 deterministic s, 6.432 in
    1.25, 6.4405 cold in 1.4), so the step below it would spend what the proof needs."""
    proof_ms = proof_cap_ms(best_peak_ms, config)
    if bound_ms < proof_ms < high_ms and proof_ms <= bound_ms * (1 + 2 * config.probe_step):
        return proof_ms
    return min((bound_ms + high_ms) / 2, bound_ms * (1 + config.probe_step))


def proof_cap_ms(best_peak_ms: float, config: SolverConfig) -> float:
    """The cap whose refutation proves a plan of `best_peak_ms` within `config.proof_gap`."""
    return best_peak_ms / (1 + config.proof_gap)


class _LPBounds:
    """The configuration LP (planner.search.pattern_lp) and what its checks settled: a refuted
    cap raises `bound_ms`; `high_ms` is the least cap it did not refute (a fractional plan under
    it, or undecided), above which no check is worth asking."""

    def __init__(self, lp: PatternLP, unit_ms: float, bound_ms: float) -> None:
        self.lp, self.unit_ms, self.bound_ms, self.high_ms = lp, unit_ms, bound_ms, math.inf

    def check(self, cap_ms: float, config: SolverConfig, deadline_s: float) -> PatternCheck:
        cap_ticks = to_ticks(cap_ms * (1 + 1e-12), self.unit_ms)
        check = self.lp.check(cap_ticks, config.pattern_rounds, deadline_s)
        if check.refuted:
            self.bound_ms = max(self.bound_ms, (cap_ticks + 1) * self.unit_ms)
        else:
            self.high_ms = min(self.high_ms, cap_ms)
        return check

    def prove(self, best_peak_ms: float, bound_ms: float, config: SolverConfig, deadline_s: float) -> float:
        """`bound_ms`, raised where the LP refutes the cap that proves a plan of `best_peak_ms`
        within `config.target_gap`: for a plan found after the LP's stage, whose proof may be
        within the LP's reach (Criteo-1TB on 8 ranks: the class model's plan, 1.7% above the
        bound the LP's stage left and 0.9% above the LP's optimum)."""
        self.bound_ms = max(self.bound_ms, bound_ms)
        cap_ms = best_peak_ms / (1 + config.target_gap)
        if self.bound_ms < cap_ms < self.high_ms and not wall_clock.passed(deadline_s, "configuration LP"):
            self.check(cap_ms, config, deadline_s)
        return self.bound_ms


def bound_of(options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec, bound_ms: float,
             best_peak_ms: float, config: SolverConfig, deadline_s: float) -> float:
    """A bound on the busiest rank of every plan over these options, for a plan of `best_peak_ms`
    found over part of them: `bound_ms` (their analytic one), raised by the configuration LP (where
    the class model would run: small instances): the cap that proves that plan within
    `config.target_gap` first, then midpoints, up to `config.pattern_checks` caps."""
    unit_ms = _tick_ms(bound_ms)
    if class_model_size(options_by_table, cluster, unit_ms) > config.class_model_max_variables:
        return bound_ms
    lp = _LPBounds(PatternLP(options_by_table, cluster.world_size, unit_ms), unit_ms, bound_ms)
    lp.prove(best_peak_ms, bound_ms, config, deadline_s)
    for _ in range(config.pattern_checks - 1):
        high_ms = min(best_peak_ms, lp.high_ms)
        if high_ms <= lp.bound_ms * (1 + config.target_gap) or wall_clock.passed(deadline_s, "configuration LP"):
            break
        lp.check((lp.bound_ms + high_ms) / 2, config, deadline_s)
    return lp.bound_ms


def _pattern_stage(lp: _LPBounds, options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec,
                   best: Assignment, config: SolverConfig, deadline_s: float, rules: RankRules,
                   work_until: int) -> tuple[Assignment, float]:
    """Caps between the bound and the best plan put to the configuration LP: the proof of
    `config.proof_gap` for the best plan while that is undecided, else the midpoint. A refuted
    cap raises the bound; a fractional plan under one, rounded (each table's option of most
    weight) and re-chosen by hill climbing, may lower the best (26 MLPerf tables on 32 ranks:
    3.79 ms -> 3.72, where the class model's search had stopped at 3.79). Returns (best, its
    peak); the bound is `lp.bound_ms`."""
    world = cluster.world_size
    best_peak = _peak(best, world)
    seeded: set[tuple[int, ...]] = set()
    for _ in range(config.pattern_checks):
        high_ms = min(best_peak, lp.high_ms)
        if high_ms <= lp.bound_ms * (1 + config.target_gap):
            break  # the plan proven, or the LP's own optimum known to within what would not matter
        if wall_clock.passed(deadline_s, "configuration LP"):
            break
        cap_ms = proof_cap_ms(best_peak, config)
        if not lp.bound_ms < cap_ms < high_ms:
            cap_ms = (lp.bound_ms + high_ms) / 2
        check = lp.check(cap_ms, config, deadline_s)
        choice = {t: options_by_table[t][max(w, key=w.get)] for t, w in (check.weights or {}).items()}
        if choice and tuple(map(id, choice.values())) not in seeded:  # a rounding already climbed from climbs the same way
            seeded.add(tuple(map(id, choice.values())))
            seed, _ = _fitted(options_by_table, choice, cluster, deadline_s, rules, work.now() + max(0, work_until - work.now()) // 2)
            if not isinstance(seed, InfeasiblePlanError):
                seed = rechoose_options(options_by_table, seed, cluster, deadline_s, rules, lp.bound_ms * (1 + config.target_gap),
                                        work.now() + max(0, work_until - work.now()) // 2)
                peak = _peak(seed, world)
                if peak < best_peak:
                    best, best_peak = seed, peak
    return best, best_peak


def _probe_caps(model: ClassModel, best: Assignment, bound_ms: float, budget_s: float, deadline_s: float,
            config: SolverConfig) -> tuple[Assignment, float, float]:
    """Probes on the busiest rank, asking the class model (with its cuts) whether a plan exists
    under a target: a proof that none does raises the bound (CP-SAT refutes a fixed target far
    faster than its optimisation moves its bound), a plan under it lowers the best. Targets
    climb from the bound (`probe_target`): the closer a target is to the optimum the longer its refutation
    takes (26 MLPerf tables on 16 ranks: 6.36 ms in 0.06 s, 6.42 in 0.7 s, 6.45 in 4.7
    deterministic s), so small steps bank cheap proofs, where the midpoint spent the budget on
    one that ended undecided. An undecided probe caps the next ones below it, as its budget
    would only be spent again there. Each stops on the deterministic budget left, the wall
    clock only a ceiling. Returns (best, its peak, bound)."""
    world = model.cluster.world_size
    best_peak, spent, undecided_ms = _peak(best, world), 0.0, math.inf
    while spent < budget_s - 1e-3:
        if wall_clock.passed(deadline_s, "class model probes"):
            break
        high = min(best_peak, undecided_ms)
        if high <= bound_ms * (1 + config.target_gap):
            break
        target = probe_target(bound_ms, high, best_peak, config)
        result = model.solve(budget_s - spent, deadline_s - time.monotonic(), config.seed, config.target_gap, target, cuts=True)
        spent += result.deterministic_s
        if result.bound_ms is not None:
            bound_ms = max(bound_ms, result.bound_ms)
        peak = _peak(result.assignment, world) if result.assignment is not None else math.inf
        if peak < best_peak:
            best, best_peak = result.assignment, peak
        elif bound_ms < target:  # neither a plan under the target nor a proof that none exists
            undecided_ms = target
        progress.report("class model probes", best_peak, bound_ms)
    return best, best_peak, bound_ms


def solve(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    cluster: ClusterSpec,
    config: SolverConfig,
    deadline_s: float | None = None,
    rules: RankRules = RankRules(),
) -> Solution:
    """Plan over costed options, each table's shards where `rules` admit them. CP-SAT's
    budgets are deterministic time and the greedy stages' counted work (planner.search.work),
    both fixed by `config.time_limit_s`, so the answer depends on the input only, unless the
    wall-clock `deadline_s` (default: now + time_limit_s), a ceiling for a slow or busy
    machine, stops a stage first (planner.search.wall_clock records which)."""
    start = time.monotonic()
    deadline = deadline_s if deadline_s is not None else start + config.time_limit_s
    budget = config.time_limit_s * WORK_SHARE  # deterministic seconds (and the greedy stages' work), split between the stages below
    world = cluster.world_size
    bound = shard_limited_bound_ms(options_by_table, world)
    unit_ms = _tick_ms(bound)
    best = warm_start(options_by_table, cluster, bound, config.greedy_shard_caps, deadline, rules,
                      work.now() + work.budget(WARM_START_SHARE * budget))
    target = bound * (1 + config.target_gap)
    small = class_model_size(options_by_table, cluster, unit_ms) <= config.class_model_max_variables
    if not small:  # no class model will place the shards: best fit under a cap, where LPT strands big shards
        best = tightest_by_phases(best, cluster, rules, bound, target, deadline)
    progress.report("warm start", _peak(best, world), bound)
    if _peak(best, world) > target:
        best = rechoose_options(options_by_table, best, cluster, deadline, rules, target, work.now() + work.budget(RECHOOSE_SHARE * budget))
    best_peak, method = _peak(best, world), "greedy"
    progress.report("greedy", best_peak, bound)
    class_placed = False  # the class model leaves memory out; when it could not place its counts, try the joint model
    lp = None
    if best_peak > target and small and not wall_clock.passed(deadline, "configuration LP"):
        # The LP's checks (pattern_checks of pattern_rounds) and the seeds it rounds (PATTERN_SHARE
        # of the work): on 26 MLPerf tables on 32 ranks the LP's seeds and checks found the best
        # plan, proved it within 2% and settled the LP's optimum to 0.07% in 3 s of a 2-core machine
        lp = _LPBounds(PatternLP(options_by_table, world, unit_ms), unit_ms, bound)
        best, best_peak = _pattern_stage(lp, options_by_table, cluster, best, config, deadline, rules,
                                         work.now() + work.budget(PATTERN_SHARE * budget))
        bound = lp.bound_ms
        target = max(target, bound * (1 + config.target_gap))
        progress.report("configuration LP", best_peak, bound)
    if best_peak > target and small and not wall_clock.passed(deadline, "class model"):
        # 0.3 of the deterministic budget: where the optimisation stalls, probes under caps do
        # better (the rest of half the budget), and near the optimum one probe needs seconds (26
        # MLPerf tables on 16 ranks: the proof of 2% took 1.9-2.4 s of a 2-core machine).
        class_model = ClassModel(options_by_table, cluster, best, unit_ms, bound, rules)
        if bound < proof_cap_ms(best_peak, config) <= bound * (1 + 2 * config.probe_step):
            # The proof the plan's gap promises is the next probe, and the optimisation would
            # spend what it needs (26 MLPerf tables on 16 ranks: 1.5 deterministic s without a
            # better plan or bound, then 1.0 left where the proof needs 2.3): probes first.
            class_placed, method = True, "class"
            best, best_peak, bound = _probe_caps(class_model, best, bound, budget * 0.5, deadline, config)
        else:
            # where the LP ran, the first better plan the LP could prove (at or under the least cap
            # it found a fractional plan under, plus the gap) ends the search and is put to the LP
            # (Criteo-1TB on 8 ranks: its plan found 0.47 of 1.5 deterministic s in, the rest found
            # nothing better); unproven, the probes go on with the budget left
            stop_at = lp.high_ms * (1 + config.target_gap) if lp is not None else None
            result = class_model.solve(budget * 0.3, deadline - time.monotonic(), config.seed, config.target_gap, stop_at_ms=stop_at)
            if result.bound_ms is not None:
                bound = max(bound, result.bound_ms)
            if result.assignment is not None:
                class_placed = True
                peak = _peak(result.assignment, world)
                if peak < best_peak:
                    best, best_peak = result.assignment, peak
                method = "class-optimal" if result.optimal and result.bound_ms is not None else "class"
                if lp is not None:
                    bound = lp.prove(best_peak, bound, config, deadline)
                progress.report("class model", best_peak, bound)
                if method == "class":  # the probes return at once where the gap is closed
                    best, best_peak, bound = _probe_caps(class_model, best, bound, budget * 0.5 - result.deterministic_s, deadline, config)
    if (not class_placed and best_peak > target and joint_model_size(options_by_table, cluster) <= config.joint_model_max_booleans
            and not wall_clock.passed(deadline, "joint model")):  # building its model alone takes seconds on large problems
        result = solve_joint(
            options_by_table, cluster, best, unit_ms, budget * 0.5, deadline - time.monotonic(), config.seed, bound, config.target_gap, rules
        )
        if result is not None:
            bound = max(bound, result.bound_ms)
            if _peak(result.assignment, world) < best_peak:
                best, best_peak = result.assignment, _peak(result.assignment, world)
            method = ("joint-optimal" if result.optimal else "joint") if method == "greedy" else method + "+joint"
            progress.report("joint model", best_peak, bound)
    if best_peak > max(target, bound * (1 + config.target_gap)):  # past the ceiling, repair notes itself and returns at once
        repaired = repair_placement(
            best.copy(), cluster, unit_ms, bound * (1 + config.target_gap),
            budget * 0.3, deadline, config.seed, config.repair_neighbourhood_ranks, rules,
        )
        peak = _peak(repaired, world)
        if peak < best_peak:
            best, best_peak = repaired, peak
            method += "+repair"
            progress.report("repair", best_peak, bound)
    return Solution(best, best_peak, bound, method, time.monotonic() - start)

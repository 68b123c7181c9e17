"""The planner's one entry point: specs in, plan out."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping, Sequence

from planner.search import progress, wall_clock, work
from planner.search.collector import collector_paused
from planner.search.assignment import Assignment, RankLoads
from planner.cost.step import rank_perf_storage
from planner.search.candidates import enumerate_options
from planner.cost.capacity import check_capacity
from planner.search.bounds import shard_limited_bound_ms, step_lower_bound_ms
from planner.search.colocation import Colocated, colocate
from planner.cost.cost_model import AnalyticCostModel, CostModel, sharding_types_ms
from planner.spec.errors import InfeasiblePlanError
from planner.search.phase_balance import balance_phases, barrier_step_ms
from planner.plan.document import Plan, PlannedShard, RankPlan, TablePlan
from planner.spec.placement_rules import RankRules
from planner.plan.inputs import PlanInputs
from planner.spec.schemes import cache_rows
from planner.search.solver import Solution, SolverConfig, bound_of, solve, warm_start
from planner.spec.specs import ClusterSpec, TableSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingOption

# The solver always gets at least this share of the time limit, however long costing took.
MIN_SOLVER_SHARE = 0.2
# Re-solves with one sharding type fewer (fewer_sharding_types): at most this many, each with
# this share of the time limit; only plans that closed their gap get them. Five: three types
# (each left out once), then the two left.
MAX_TYPE_RESOLVES = 5
TYPE_RESOLVE_SHARE = 0.2
# A type is left out where that saves at least this share of the busiest rank in fixed cost, and
# a re-solve kept where it shortens the step by as much. Not the user's --gap: a re-solve also
# moves the step's barrier part, by more than the fixed cost it saves (synthetic 100x8: 0.4% of
# fixed cost, 7.5% of step), and a 1% gap would skip it.
TYPE_MIN_GAIN = 0.001
# Balancing the phases may raise the busiest rank up to this far above the proven bound where
# that shortens the step: a plan that close is as good as proven (the cost model's own error is
# ~10%). On 2 ranks, 1% let it shorten the embeddings' step by 5-8% where no slack left 0-1%.
PHASE_SLACK = 0.01
# The solver's wall clock ends this share of its time early, for balancing (where it stops on its
# deterministic budget or a closed gap, it leaves that much anyway). Without the reserve, a solve that ran to the wall clock
# left its plan unbalanced (MLPerf's 26 multi-hot tables on 8 ranks, 2-core machine: embeddings'
# step +15.4% over the bound; with it +12.8%, the busiest rank +0.80% -> +0.90%).
PHASE_BALANCE_SHARE = 0.2
# Balancing's own budget, in CP-SAT's deterministic seconds per second of the time limit: it
# stops on it (the same plan on any machine), the wall clock the solver left only a safety net.
# Half the wall reserve: a deterministic second took up to 2 s of wall clock on a 2-core machine,
# and 0.2 let 1,000 tables on 128 ranks run 3 s of stale rounds past 10 s.
PHASE_BALANCE_DETERMINISTIC_SHARE = 0.1
# Sharding types are chosen before the search (types_first) where the set chosen saves at least
# this share of the greedy plan's step in fixed cost against every type on offer: of the order of
# the cost model's own error. Criteo-1TB and the synthetic 100 tables on 8 ranks, where the
# search's own fewer-types re-solves find shorter steps, stay under it.
TYPES_FIRST_MIN_SAVING = 0.1
# Each greedy plan `types_first` weighs a type set by: this share of the time limit, in counted work.
TYPES_FIRST_SHARE = 0.01


@collector_paused()
def make_plan(problem: PlanningProblem, cost_model: CostModel | None = None, config: SolverConfig | None = None) -> Plan:
    """Cost every candidate, then solve; `config.time_limit_s` bounds the two together.

    Cached options are offered to the solver only when the tables do not fit with every row
    in device memory: a cached shard is never faster than the same shard uncached, so they
    matter only for memory, and without them the search space stays as small as it can be.
    """
    start = time.monotonic()
    config = config or SolverConfig()
    cost_model = cost_model or AnalyticCostModel(problem.cluster, problem.training)
    attempts = [problem]
    if problem.tiering.enabled:  # costing cached options takes time too: only when needed
        attempts.insert(0, replace(problem, tiering=replace(problem.tiering, enabled=False)))
    constraints = problem.constraints
    rules = constraints.rank_rules([t.name for t in problem.tables]) if constraints is not None else RankRules()
    with wall_clock.recorded() as stops:
        for i, attempt in enumerate(attempts):
            stops.clear()  # of the attempt that plans
            try:
                search = colocate(enumerate_options(attempt, cost_model), constraints.colocate if constraints else (), rules)
                options, shortest = types_first(search, problem.cluster, config, start + config.time_limit_s)
                proven: dict[frozenset, float] = {}  # rank bounds that searches over some types' options proved
                solution, closed, first = _search(search, options, shortest, problem.cluster, config, start, proven)
                solution = fewer_sharding_types(search, problem.cluster, config, solution, closed, start + config.time_limit_s, proven)
                solution = _no_longer_than(solution, shortest, first, search, problem.cluster)
                break
            except InfeasiblePlanError:
                if i == len(attempts) - 1:
                    raise
        solution = replace(solution, method=wall_clock.described(solution.method, stops))
    step_bound_ms = _step_bound_ms(search.options_by_table, problem.cluster, solution.lower_bound_ms, proven)
    plan = plan_from_solution(solution, problem, cost_model.name, (_step_ms(solution.assignment, problem.cluster), step_bound_ms))
    check_capacity([r.memory for r in plan.ranks], problem.cluster)
    return plan


def _search(search: Colocated, options: Mapping[str, Sequence[ShardingOption]], shortest: TypeTrial | None, cluster: ClusterSpec,
            config: SolverConfig, start: float, proven: dict[frozenset, float]) -> tuple[Solution, bool, Solution | None]:
    """The search over `options` (types_first's: every option, or those of the types it chose),
    its plan's bound every option's; whether it closed its gap; and the fewer-types-first search's
    plan where that was made and not proven (the plan returned is no longer a step than it).
    Where types_first tried fewer types without choosing them, those first (`_fewer_types_first`).
    Each search over some types' options alone records the bound it proved in `proven`."""
    every_ms = shard_limited_bound_ms(search.options_by_table, cluster.world_size)

    def left() -> float:
        return max(config.time_limit_s - (time.monotonic() - start), MIN_SOLVER_SHARE * config.time_limit_s)

    if options is search.options_by_table:
        first = _fewer_types_first(search, shortest, cluster, config, left(), every_ms, proven) if shortest is not None else None
        if first is not None and first[1]:
            return first[0], True, None
        return *_solve(search, options, cluster, config, left()), first[0] if first is not None else None
    with progress.bound_at_most(every_ms):  # the restricted solve's bound is its own problem's: the plan's is every option's
        solution, _ = _solve(search, options, cluster, config, left())
    proven[frozenset(shortest.used)] = solution.lower_bound_ms
    bound_ms = bound_of(search.options_by_table, cluster, every_ms, solution.max_rank_ms, config, start + config.time_limit_s)
    solution = replace(solution, lower_bound_ms=bound_ms, method=solution.method + "+types-first")
    return solution, solution.gap <= config.target_gap, None


def _solve(search: Colocated, options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec,
           config: SolverConfig, seconds: float, rounds: bool = True) -> tuple[Solution, bool]:
    """Solve, then balance the plan's phases (PHASE_BALANCE_DETERMINISTIC_SHARE of the time
    limit, within the time the solver left; `rounds`: CP-SAT's rounds after the exchanges); and
    whether the solve closed its gap (before balancing, which may use PHASE_SLACK). A solver
    that runs to the wall clock stops that share early, so that its plan is balanced too."""
    deadline_s = time.monotonic() + seconds
    world = cluster.world_size
    reserve_s = PHASE_BALANCE_SHARE * seconds if world > 1 else 0.0
    solution = solve(options_by_table, cluster, config, deadline_s - reserve_s, search.rules)
    before_ms = barrier_step_ms(solution.assignment, world)
    balanced = balance_phases(solution.assignment.copy(), cluster, solution.lower_bound_ms * (1 + PHASE_SLACK),
                              PHASE_BALANCE_DETERMINISTIC_SHARE * config.time_limit_s, deadline_s, config.seed, search.rules, rounds)
    changed = barrier_step_ms(balanced, world) < before_ms
    return replace(solution, assignment=search.expand(balanced), max_rank_ms=float(RankLoads.of(balanced, world).ms.max()),
                   method=solution.method + ("+phases" if changed else "")), solution.gap <= config.target_gap


def _no_longer_than(solution: Solution, trial: TypeTrial | None, first: Solution | None, search: Colocated,
                    cluster: ClusterSpec) -> Solution:
    """`solution`, or a plan the planner made before it where that has the shorter step by
    TYPE_MIN_GAIN: the greedy plan of `types_first`'s trial, or the fewer-types-first search's plan
    that was not proven (`first`). The search minimises the busiest rank and weighs the types' fixed
    cost and the phases only after a solve that closed its gap, so one that did not close could return a
    longer step than a plan made before it, and a longer time limit a longer step (24 tables on 64
    ranks: 1.044 ms at 1-4 s, where the greedy over two sharding types gave 0.956; bench_embedding_bound
    on 8 ranks of one node: the search over every option stopped by the wall clock, 47.73 ms, where the
    fewer-types-first search's plan gave 47.28)."""
    made = []
    if trial is not None:
        placed = search.expand(trial.made)
        made.append((trial.step_ms, placed, "greedy+types-first"))
    if first is not None:
        made.append((_step_ms(first.assignment, cluster), first.assignment, first.method))
    if not made:
        return solution
    step_ms, placed, method = min(made, key=lambda m: m[0])
    if step_ms >= _step_ms(solution.assignment, cluster) * (1 - TYPE_MIN_GAIN):
        return solution
    return replace(solution, assignment=placed, max_rank_ms=float(RankLoads.of(placed, cluster.world_size).ms.max()), method=method)


def _step_ms(assignment: Assignment, cluster: ClusterSpec) -> float:
    """The step a plan's embeddings take (each phase waits for its busiest rank) plus the fixed
    cost of the sharding types it uses."""
    return (barrier_step_ms(assignment, cluster.world_size)
            + sharding_types_ms((o.sharding_type for o in assignment.choice.values()), cluster))


def _step_bound_ms(options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec, rank_bound_ms: float,
                   proven: Mapping[frozenset, float]) -> float:
    """A bound on the step of every plan over these options (bounds.step_lower_bound_ms), given a
    bound on their busiest rank and those searches over some types' options proved."""
    return step_lower_bound_ms(options_by_table, cluster.world_size, rank_bound_ms, lambda types: sharding_types_ms(types, cluster),
                               proven)


def _fewer_types_first(search: Colocated, shortest: TypeTrial, cluster: ClusterSpec, config: SolverConfig, seconds: float,
                       every_ms: float, proven: dict[frozenset, float]) -> tuple[Solution, bool] | None:
    """The search over the types `types_first`'s descent ended at, where they are fewer than those
    on offer, kept as the whole search where its plan's step is proven within the gap: against
    the plans over those types by its own bound, against every plan using another type by that
    plan's step bound (those types' fixed cost on their options' bound). Each type a plan uses
    adds its collectives' fixed cost, so fewer types' plan can be shorter than any plan using
    more could be, and searching every option proves a plan the fewer-types re-solves then
    replace (Criteo-1TB on 8 ranks: 2.3 s on a plan 11% longer than the data-parallel and
    table-wise one). Not tried where even those types' own step bound is above that of the plans
    using another (by the gap). Returns its plan (its bound every option's) and whether that is
    proven (else the search over every option follows), or None where not tried or nothing fitted.
    What it proved stays in `proven`."""
    allowed = frozenset(shortest.used)
    offered = {o.sharding_type for opts in search.options_by_table.values() for o in opts}
    options = _of_types(search.options_by_table, allowed)
    other_types_ms = _step_bound_ms(search.options_by_table, cluster, every_ms, {**proven, allowed: math.inf})
    if allowed >= offered or _step_bound_ms(options, cluster, every_ms, proven) > other_types_ms * (1 + config.target_gap):
        return None
    try:
        with progress.bound_at_most(every_ms):
            solution, closed = _solve(search, options, cluster, config, seconds)
    except InfeasiblePlanError:  # their greedy plan fitted; should the search's not, every option's may
        return None
    proven[allowed] = solution.lower_bound_ms
    proof = closed and _step_ms(solution.assignment, cluster) <= _step_bound_ms(search.options_by_table, cluster, every_ms, proven) * (1 + config.target_gap)
    return replace(solution, lower_bound_ms=every_ms, method=solution.method + "+types-first"), proof


@dataclass(frozen=True)
class TypeTrial:
    """A plan made with some sharding types left out: its step (barrier step plus the fixed cost
    of the types it used), how many tables use each type, and what made it."""

    step_ms: float
    used: Counter
    made: Any


STOP = object()  # a trial's answer: no more trials this round (the time or the count of them is spent)


def leave_types_out(used: Counter, step_ms: float, trial: Callable[[set], TypeTrial | None | object],
                    go_on: Callable[[TypeTrial], bool] = lambda _: True) -> TypeTrial | None:
    """The descent over sharding types both `types_first` and `fewer_sharding_types` take: each
    round, `trial` with each type `used` left out in turn (the type the fewest tables use first),
    and the trial of shortest step kept while it shortens the step by TYPE_MIN_GAIN and `go_on`
    says so. `trial` answers a TypeTrial, None (nothing to try there) or STOP. A trial whose plan
    uses a type the plan it descends from does not (a table with no option of the types left keeps
    all of its own) is no descent: kept, it would bring back the types left out before it, and the
    descent would go round in circles, ending at every type (24 tables on 64 ranks: the types left
    out in one round came back in the next, and the search then ran over every type, its step 9%
    longer than over the two the first round kept). Returns the last trial kept, or None."""
    kept = None
    while len(used) > 1:
        tried = []
        for drop in sorted(used, key=lambda t: (used[t], t.value)):
            answer = trial(set(used) - {drop})
            if answer is STOP:
                break
            if answer is not None and set(answer.used) <= set(used):
                tried.append(answer)
        if not tried:
            break
        best = min(tried, key=lambda t: t.step_ms)
        if best.step_ms >= step_ms * (1 - TYPE_MIN_GAIN):
            break
        kept, step_ms, used = best, best.step_ms, best.used
        if not go_on(best):
            break
    return kept


def fewer_sharding_types(search: Colocated, cluster: ClusterSpec, config: SolverConfig, solution: Solution, closed: bool,
                         deadline_s: float, proven: dict[frozenset, float]) -> Solution:
    """Each sharding type a plan uses runs collectives of its own (three embedding collectives
    per sharded type, an all-reduce for the replicated tables), a fixed cost on every rank that
    no shard carries (cost_model.sharding_types_ms), so the solver does not weigh it.
    Where a plan whose solve closed its gap (`closed`) mixes types, re-solve once with each type
    left out in turn (tables with no other option keep theirs, no new type comes in) and keep the
    re-solve with the shortest step, its barrier step plus that fixed cost, while that improves
    (and the re-solve kept closed its own gap), within MAX_TYPE_RESOLVES and the time limit left
    (`deadline_s`: a re-solve starts only where its whole share is left, and where that stops one
    the plan records it; 1,000 tables on 128 ranks ran 0.7 s past the limit with the last re-solve
    squeezed into 0.05 s). Each type is tried, not only the one the fewest tables use: one hot
    table row-wise beside five table-wise ones is better all row-wise than all table-wise where
    the hot table alone outweighs the rest (mix1 of benchmarks/costmodel_bench.py, by 4% in the
    model; tiny.yaml all data-parallel, 9% measured). A re-solve no plan of which could be kept
    (its options' step bound no shorter than the best step) is skipped: Criteo-1TB on 64 ranks
    skipped two of 1.7 s each. The bound stays the first solve's: a valid bound on every plan's
    busiest rank. A re-solve's phases are balanced by exchanges alone: CP-SAT's rounds took
    0.3 s a re-solve of 100 tables on 8 ranks and shortened no step of the planner benchmark's.
    Each re-solve's bound goes into `proven` (its types' plans), which also skips re-solves."""
    if not closed:
        return solution
    began = time.monotonic()
    resolve = replace(config, time_limit_s=config.time_limit_s * TYPE_RESOLVE_SHARE)
    resolves = 0
    now = TypeTrial(_step_ms(solution.assignment, cluster), _types_used(solution.assignment.choice.values()), (solution, closed))  # the plan a round's trials would replace

    def trial(allowed: set) -> TypeTrial | None | object:
        nonlocal resolves
        if sharding_types_ms(now.used, cluster) - sharding_types_ms(allowed, cluster) <= TYPE_MIN_GAIN * now.made[0].max_rank_ms:
            return None  # the type's collectives cost too little to be worth a re-solve
        options = _of_types(search.options_by_table, allowed)
        # the first solve's bound holds for these options too; their own shard-limited one may be higher
        rank_bound_ms = max(solution.lower_bound_ms, shard_limited_bound_ms(options, cluster.world_size))
        if _step_bound_ms(options, cluster, rank_bound_ms, proven) >= now.step_ms * (1 - TYPE_MIN_GAIN):
            return None  # no plan over these options could be kept
        if resolves == MAX_TYPE_RESOLVES:
            return STOP
        if deadline_s - time.monotonic() < resolve.time_limit_s:
            wall_clock.note("fewer sharding types")
            return STOP  # a re-solve starts only with its whole share left: one squeezed in ran past the limit
        resolves += 1
        try:
            with progress.watched(None):  # a re-solve's bound is of its own, restricted, problem: not shown
                made = _solve(search, options, cluster, resolve, deadline_s - time.monotonic(), rounds=False)  # its budget; the limit's ceiling
        except InfeasiblePlanError:
            return None
        proven[frozenset(allowed)] = max(proven.get(frozenset(allowed), 0.0), made[0].lower_bound_ms)
        return TypeTrial(_step_ms(made[0].assignment, cluster), _types_used(made[0].assignment.choice.values()), made)

    def kept(t: TypeTrial) -> bool:
        nonlocal now
        now = t
        progress.report(f"fewer sharding types: step {t.step_ms:.4f} ms", t.made[0].max_rank_ms, solution.lower_bound_ms)
        return t.made[1]  # it closed its gap, against its own, restricted, problem: it may go on

    last = leave_types_out(now.used, now.step_ms, trial, kept)
    if last is None:
        return solution
    candidate, _ = last.made
    return replace(candidate, lower_bound_ms=solution.lower_bound_ms, method=candidate.method + "+fewer-types",
                   seconds=solution.seconds + time.monotonic() - began)


def _types_used(options) -> Counter:
    """How many tables use each sharding type."""
    return Counter(o.sharding_type for o in options)


def _of_types(options_by_table: Mapping[str, Sequence[ShardingOption]], allowed: set) -> dict[str, list[ShardingOption]]:
    """Each table's options of the `allowed` sharding types; a table with none keeps all of its own."""
    return {t: [o for o in opts if o.sharding_type in allowed] or list(opts) for t, opts in options_by_table.items()}


def types_first(search: Colocated, cluster: ClusterSpec, config: SolverConfig,
                deadline_s: float) -> tuple[Mapping[str, Sequence[ShardingOption]], TypeTrial | None]:
    """The options the search should choose among: all of them, or those of fewer sharding types
    where their collectives' fixed cost matters more than the busiest rank the search minimises;
    and the greedy plan of shortest step its trials made (None where it tried none), which the
    plan returned is never longer than (`make_plan`).

    Each type a plan uses adds a fixed cost to every rank's step (cost_model.sharding_types_ms),
    which `fewer_sharding_types` weighs only after a solve that closed its gap. With per-peer
    latency on many ranks that cost can be several times the busiest rank, those solves do not
    close, and the search takes whatever types lower the busiest rank (24 tables on 64 ranks at
    5 us a peer: step 3.39 ms, where table-row-wise alone gives 1.40). So first the greedy warm
    start (TYPES_FIRST_SHARE of the work each) over every option, then over the types its plan
    used with one left out at a time while that shortens its step (`leave_types_out`). Where the
    set it ends at saves, against every type on offer, more fixed cost than the greedy plan stands
    above the bound (what the search could take off the busiest rank) and than
    TYPES_FIRST_MIN_SAVING of its step, the search is over that set's options; the plan's bound is
    then every option's (`bound_of`), as the restricted search proves a bound on its own problem
    only. Nothing is tried where no set of types could save that much."""
    options = search.options_by_table
    world = cluster.world_size
    bound_ms = shard_limited_bound_ms(options, world)
    present = {o.sharding_type for opts in options.values() for o in opts}
    if sharding_types_ms(present, cluster) - min(sharding_types_ms([t], cluster) for t in present) <= TYPES_FIRST_MIN_SAVING * bound_ms:
        return options, None  # no type set saves enough (a plan's step is at least the bound)

    def greedy(allowed: set | None) -> TypeTrial | None:
        try:
            plan = warm_start(options if allowed is None else _of_types(options, allowed), cluster, bound_ms, config.greedy_shard_caps,
                              deadline_s, search.rules, work.now() + work.budget(TYPES_FIRST_SHARE * config.time_limit_s))
        except InfeasiblePlanError:
            return None
        return TypeTrial(_step_ms(plan, cluster), _types_used(plan.choice.values()), plan)

    first = greedy(None)
    if first is None:
        return options, None
    last = leave_types_out(first.used, first.step_ms, greedy) or first
    saved_ms = sharding_types_ms(present, cluster) - sharding_types_ms(last.used, cluster)
    above_ms = float(RankLoads.of(first.made, world).ms.max()) - bound_ms  # what the search could take off the busiest rank
    return (_of_types(options, set(last.used)) if saved_ms > max(above_ms, TYPES_FIRST_MIN_SAVING * first.step_ms) else options), last


def option_layout(option: ShardingOption, ranks: Sequence[int], table: TableSpec) -> TablePlan:
    """How a plan writes `option` with its shards on `ranks`."""
    cached = option.cache_fraction < 1.0
    shards = tuple(PlannedShard(rank, g.row_offset, g.col_offset, g.rows, g.cols, option.tier,
                                cache_rows(g.rows, option.cache_fraction) if cached else 0)
                   for g, rank in zip(option.geometries, ranks))
    return TablePlan(option.sharding_type.value, option.compute_kernel, table.num_embeddings, table.embedding_dim,
                     shards, option.cache_fraction if cached else None)


def plan_from_solution(solution: Solution, problem: PlanningProblem, cost_model: str,
                       step: tuple[float, float] | None = None) -> Plan:
    """The plan of a solution: each table's shards on their ranks, each rank's predicted time
    and bytes (the sums of its shards'), the inputs it was made for, and `step`: the step the
    search minimised and its proven bound, where the search gave them."""
    world = problem.cluster.world_size
    choice, shard_ranks = solution.assignment.choice, solution.assignment.shard_ranks
    tables = {t.name: option_layout(choice[t.name], shard_ranks[t.name], t) for t in problem.tables}
    perf, memory = rank_perf_storage(((choice[t.name], shard_ranks[t.name]) for t in problem.tables), world)
    rank_plans = tuple(RankPlan(r, perf[r], memory[r]) for r in range(world))
    return Plan(world_size=world, ranks_per_node=problem.cluster.ranks_per_node, tables=tables, ranks=rank_plans,
                max_rank_ms=max(r.predicted_ms for r in rank_plans), lower_bound_ms=solution.lower_bound_ms,
                cost_model=cost_model, solver=solution.method, solve_seconds=solution.seconds,
                inputs=PlanInputs.of(problem), step=step)

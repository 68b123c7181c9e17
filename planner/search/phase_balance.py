"""The step as the machine runs it: each collective is a barrier, so every phase of a step
waits for its slowest rank, and a step takes the sum over phases of each phase's busiest rank
(dlrm_scale.tools.simulate prices a run the same way).

The solver minimises the busiest rank's summed time, a lower bound of that step and what its
proofs are about. Among placements with nearly the same busiest rank, though, one that puts the
compute-heavy tables on one rank and the comms-heavy ones on another waits at every barrier:
12 tables on 2 ranks (costmodel_bench's mix 5) had placements within 0.02% of the same busiest
rank whose embedding steps were 25.5 and 20.8 ms. `balance_phases` re-places the free shards
to shorten the step, every rank's total kept under a cap the planner sets (planning.PHASE_SLACK):
exchanges of shards between ranks first, then CP-SAT over a few ranks at a time.
"""

from __future__ import annotations

import math
import time

import numpy as np
from ortools.sat.python import cp_model

from planner.search import wall_clock, work
from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.search.cpsat import solver_parameters
from planner.spec.placement_rules import RankRules
from planner.search.repair import free_shards, hint_placement, limit_memory, placement_vars
from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS
from planner.cost.step import PHASES, perf_phase_ms, shard_phase_ms, step_ms

# Ranks re-placed together in one CP-SAT model: all of them up to this many; on larger
# clusters, each phase's busiest rank and the ranks least loaded in it, round after round.
NEIGHBOURHOOD_RANKS = 8
STALE_ROUNDS = 8  # rounds in a row that found nothing shorter, then stop
MIN_GAIN = 1e-3  # a round counts when it shortens the step by this fraction: finer gains are far inside the model's error
# The moves and swaps that precede the CP-SAT rounds (shorten_by_exchanges): their counted work
# (planner.search.work) per deterministic second of the balancing's budget.
EXCHANGE_WORK_SHARE = 0.5
ROUND_DETERMINISTIC_S = 0.2
TICKS_PER_PEAK = 1_000_000  # time resolution of the model: a millionth of the busiest rank


def phase_loads(assignment: Assignment, world_size: int) -> np.ndarray:
    """Each rank's time in each phase (rows: ranks, columns: PHASES)."""
    loads = np.zeros((world_size, len(PHASES)))
    for table, option in assignment.choice.items():
        np.add.at(loads, assignment.shard_ranks[table], shard_phase_ms(option))
        loads += perf_phase_ms(option.every_rank)
    return loads


def barrier_step_ms(assignment: Assignment, world_size: int) -> float:
    """step_ms of a placement."""
    return step_ms(phase_loads(assignment, world_size))


def balance_phases(assignment: Assignment, cluster: ClusterSpec, cap_ms: float, budget_s: float, deadline_s: float,
                   seed: int = 0, rules: RankRules = RankRules(), rounds: bool = True) -> Assignment:
    """`assignment` with its free (any-rank) shards re-placed to shorten the barrier step:
    exchanges (shorten_by_exchanges, EXCHANGE_WORK_SHARE of the budget in counted work), then
    CP-SAT a few ranks at a time, each rank's total at most `cap_ms` (or the busiest rank's as
    it was, if more); memory and the placement rules kept. Options, spread and node-bound
    shards stay. `rounds`: whether the CP-SAT rounds follow. A round is kept only when the
    step, recomputed exactly, got MIN_GAIN shorter; after a round that was not, the next
    searches the other way (`_replace`'s `repair`). Changes `assignment`. The rounds stop on
    `budget_s` of CP-SAT's deterministic time, so the plan depends on the input only; the
    wall-clock `deadline_s` is a safety net for a slow machine (a wall-clock limit of its own
    made two plans of one problem differ, round counts apart)."""
    world = cluster.world_size
    if world < 2:
        return assignment
    rng = np.random.default_rng(seed)
    peak_ms = max(cap_ms, float(RankLoads.of(assignment, world).ms.max()))
    unit_ms = peak_ms / TICKS_PER_PEAK
    shorten_by_exchanges(assignment, cluster, peak_ms, deadline_s, rules, work.now() + work.budget(EXCHANGE_WORK_SHARE * budget_s))
    stale, spent_s = 0, 0.0
    while rounds and stale < STALE_ROUNDS and spent_s < budget_s:
        if wall_clock.passed(deadline_s, "phase balance"):
            break
        loads = phase_loads(assignment, world)
        if step_ms(loads) <= loads.sum(axis=1).max() * (1 + MIN_GAIN):
            break  # the step is the busiest rank's: no phase waits for another rank
        ranks = _neighbourhood(loads, rng)
        placed, round_s = _replace(assignment, ranks, loads, cluster, peak_ms, unit_ms,
                                   min(ROUND_DETERMINISTIC_S, budget_s - spent_s), deadline_s, seed, rules, stale % 2 == 0)
        spent_s += round_s
        if placed is not None:
            trial = assignment.copy()
            for table, i, rank in placed:
                trial.shard_ranks[table][i] = rank
            trial_loads = phase_loads(trial, world)
            if (step_ms(trial_loads) < step_ms(loads) * (1 - MIN_GAIN)
                    and trial_loads.sum(axis=1).max() <= peak_ms * (1 + 1e-6)):
                assignment.shard_ranks.update(trial.shard_ranks)
                stale = 0
                continue
        if len(ranks) == world and stale % 2 == 1:
            break  # every rank was in the model, searched both ways: another round would solve the same one
        stale += 1
    return assignment


def best_fit_by_phases(assignment: Assignment, cluster: ClusterSpec, cap_ms: float, rules: RankRules) -> Assignment | None:
    """The free shards placed again from scratch, largest first (those with pins or keep-apart
    groups before the rest), each onto the rank where it lengthens the step least (how far it
    takes the rank past each phase's busiest rank so far, summed), the fullest of those: each
    rank's total at most `cap_ms`, memory and the placement rules kept. None where a shard finds
    no rank. LPT's placement is made for the busiest rank alone, this one for the step too."""
    world = cluster.world_size
    shards = _FreeShards(assignment.copy(), cluster, rules)
    if not shards.items:
        return None
    loads, used = shards.loads, shards.used
    np.add.at(loads, shards.rank, -shards.ms)
    np.add.at(used, shards.rank, -shards.bytes)
    occupancy = shards.occupancy
    for (table, _), rank in zip(shards.items, shards.rank.tolist()):
        occupancy.add(table, rank, -1)
    totals, tops, caps = loads.sum(axis=1), loads.max(axis=0), shards.caps
    restricted = np.array([rules.restricts(t) for t, _ in shards.items])
    for s in np.lexsort((-shards.ms.sum(axis=1), ~restricted)):
        work.tick(world)
        table, index = shards.items[s]
        fits = (totals + shards.ms[s].sum() <= cap_ms * (1 + 1e-9)) & np.all(used + shards.bytes[s] <= caps, axis=1)
        if restricted[s]:
            fits &= np.fromiter((occupancy.admits(table, r) for r in range(world)), bool, world)
        if not fits.any():
            return None
        longer = np.where(fits, np.maximum(loads + shards.ms[s] - tops, 0.0).sum(axis=1), np.inf)
        ties = np.flatnonzero(longer <= longer.min() + 1e-12)
        rank = int(ties[np.argmax(totals[ties])])
        loads[rank] += shards.ms[s]
        used[rank] += shards.bytes[s]
        totals[rank] += shards.ms[s].sum()
        tops = np.maximum(tops, loads[rank])
        occupancy.add(table, rank)
        shards.assignment.shard_ranks[table][index] = rank
    return shards.assignment


def tightest_by_phases(assignment: Assignment, cluster: ClusterSpec, rules: RankRules, floor_ms: float, target_ms: float,
                       deadline_s: float, tolerance: float = 1e-3) -> Assignment:
    """`assignment`, or its free shards placed again by `best_fit_by_phases` under the least cap
    found: first `target_ms` (the plan the search would stop at), then caps bisected between
    the highest without room and the busiest rank, until it is at the target or within
    `tolerance` of the highest cap without room (`floor_ms` to begin with: a bound on the busiest
    rank). The same options, a lower busiest rank and a placement made for the step. With two or
    three shards a rank, as on many ranks, LPT and moves off the busiest rank strand big shards
    on ranks already half full (2,000 tables on 1,024 ranks: 3.7% above the bound, placed again
    under 1% at the first try, the embeddings' step 11.0 -> 9.7 ms). A cap whose placement is no
    lower counts as one without room: the busiest rank's shards may not be free to move (a
    row-wise table's block on every rank), and bisecting under a busiest rank that cannot fall
    would ask the same cap again until the wall clock stopped it (MLPerf's DCNv2 tables on 4,096
    ranks: 8 s of tries, then no time for the rest of the search). The wall-clock `deadline_s`
    stops the tries after the first."""
    best = assignment
    peak_ms = float(RankLoads.of(assignment, cluster.world_size).ms.max())
    cap_ms = target_ms
    while peak_ms > target_ms and peak_ms - floor_ms > tolerance * peak_ms:
        if cap_ms != target_ms and wall_clock.passed(deadline_s, "tight placement"):
            break
        placed = best_fit_by_phases(assignment, cluster, cap_ms, rules)
        placed_ms = float(RankLoads.of(placed, cluster.world_size).ms.max()) if placed is not None else math.inf
        if placed_ms < peak_ms:
            best, peak_ms = placed, placed_ms
        else:
            floor_ms = max(floor_ms, cap_ms)
        cap_ms = (floor_ms + peak_ms) / 2
    return best


def shorten_by_exchanges(assignment: Assignment, cluster: ClusterSpec, cap_ms: float, deadline_s: float,
                         rules: RankRules, work_until: int) -> Assignment:
    """`assignment` with free shards moved off, or swapped with shards of other ranks from, each
    phase's busiest rank while that shortens the step (priced exactly: every phase's new busiest
    rank), or leaves it as it is and evens the phases' loads (their sum of squares, which moves
    the busiest of tied ranks on); the best exchange first, each rank's total at most `cap_ms`,
    memory and the placement rules kept. Every rank is a partner, where CP-SAT's rounds take a
    few at a time on large clusters (synthetic 1,000 x 128: the solver's step 35.0 ms, 30.8 after
    0.4 s of exchanges, where the rounds alone reached 32.9). Stops on its counted work
    (`work_until`), the wall clock a ceiling. Changes `assignment`."""
    shards = _FreeShards(assignment, cluster, rules)
    while shards.items and not work.stop(work_until, deadline_s, "phase balance"):
        best = shards.best_exchange(cap_ms * (1 + 1e-9))
        if best is None:
            break
        shards.exchange(*best)
    return assignment


class _FreeShards:
    """The free shards of an assignment as arrays (each one's phase times, bytes and rank), each
    rank's phase loads and bytes, and exchanges of them that keep all of it up to date."""

    def __init__(self, assignment: Assignment, cluster: ClusterSpec, rules: RankRules) -> None:
        world = cluster.world_size
        self.assignment, self.world = assignment, world
        self.items = free_shards(assignment, list(range(world)))
        phases = {t: shard_phase_ms(assignment.choice[t]) for t in {t for t, _ in self.items}}
        self.ms = np.array([phases[t][i] for t, i in self.items]).reshape(-1, len(PHASES))
        self.bytes = np.array([assignment.choice[t].shard_bytes[i] for t, i in self.items], dtype=np.int64).reshape(-1, len(TIERS))
        self.rank = np.array([assignment.shard_ranks[t][i] for t, i in self.items], dtype=np.int64)
        self.loads, self.used = phase_loads(assignment, world), RankLoads.of(assignment, world).bytes
        self.caps, self.occupancy = rank_capacities(cluster), rules.occupancy(assignment.shard_ranks)
        # The exchanges of one shard: a move to each rank (nothing comes back), then a swap with
        # each free shard (it comes back from its rank); what comes back, per exchange:
        self.back_ms = np.vstack([np.zeros((world, len(PHASES))), self.ms])
        self.back_bytes = np.vstack([np.zeros((world, len(TIERS)), dtype=np.int64), self.bytes])

    def best_exchange(self, limit_ms: float) -> tuple[int, int | None, int] | None:
        """(shard, shard swapped back or None, partner rank) of the exchange, from a phase's
        busiest rank, that shortens the step most (then evens the loads most), or None."""
        loads, world = self.loads, self.world
        step = loads.max(axis=0).sum()
        order = np.argsort(-loads, axis=0, kind="stable")[:3]  # each phase's three busiest ranks, and their loads
        top = np.take_along_axis(loads, order, axis=0)
        if world < 3:
            order = np.vstack([order, np.full((3 - world, len(PHASES)), -1)])
            top = np.vstack([top, np.zeros((3 - world, len(PHASES)))])
        to = np.concatenate([np.arange(world), self.rank])  # the partner rank of each exchange
        loads_to, used_to = loads[to], self.used[to]
        best, best_key = None, None
        for a in sorted(set(order[0].tolist())):
            # each phase's busiest rank other than a and the partner: the first of its three busiest that is neither
            rest = np.where((order[0] != a) & (order[0] != to[:, None]), top[0],
                            np.where((order[1] != a) & (order[1] != to[:, None]), top[1], top[2]))
            for s in np.flatnonzero(self.rank == a):
                work.tick(len(self.back_ms))
                new_a, new_b = loads[a] - self.ms[s] + self.back_ms, loads_to + self.ms[s] - self.back_ms
                keep = ((to != a) & (new_a.sum(axis=1) <= limit_ms) & (new_b.sum(axis=1) <= limit_ms)
                        & np.all(self.used[a] - self.bytes[s] + self.back_bytes <= self.caps, axis=1)
                        & np.all(used_to + self.bytes[s] - self.back_bytes <= self.caps, axis=1))
                if not keep.any():
                    continue
                new_step = np.maximum(rest, np.maximum(new_a, new_b)).sum(axis=1)
                evened = (new_a ** 2 + new_b ** 2 - loads[a] ** 2 - loads_to ** 2).sum(axis=1)
                better = keep & ((new_step < step * (1 - 1e-9)) | ((new_step <= step) & (evened < -1e-9 * step * step)))
                for k in np.flatnonzero(better)[np.lexsort((evened[better], new_step[better]))]:
                    if best_key is not None and (new_step[k], evened[k]) >= best_key:
                        break
                    t = k - world if k >= world else None
                    if (self.occupancy.admits_move(self.items[s][0], a, int(to[k])) if t is None
                            else self.occupancy.admits_swap(self.items[s][0], a, self.items[t][0], int(to[k]))):
                        best, best_key = (int(s), t, int(to[k])), (new_step[k], evened[k])
                        break
        return best

    def exchange(self, s: int, t: int | None, partner: int) -> None:
        """Shard s to `partner`, and shard t (if any) from there to s's rank."""
        home = int(self.rank[s])
        for item, src, dst in [(s, home, partner)] + ([(t, partner, home)] if t is not None else []):
            table, index = self.items[item]
            self.loads[src] -= self.ms[item]
            self.loads[dst] += self.ms[item]
            self.used[src] -= self.bytes[item]
            self.used[dst] += self.bytes[item]
            self.occupancy.add(table, src, -1)
            self.occupancy.add(table, dst)
            self.rank[item] = dst
            self.assignment.shard_ranks[table][index] = dst


def _neighbourhood(loads: np.ndarray, rng: np.random.Generator) -> list[int]:
    """Each phase's busiest rank, then the ranks least loaded in those phases, then random ones."""
    world = loads.shape[0]
    if world <= NEIGHBOURHOOD_RANKS:
        return list(range(world))
    ranks = list(dict.fromkeys(int(r) for r in np.argmax(loads, axis=0)))
    for r in np.argsort(loads.sum(axis=1), kind="stable"):
        if len(ranks) >= NEIGHBOURHOOD_RANKS - 2:
            break
        if int(r) not in ranks:
            ranks.append(int(r))
    rest = [r for r in range(world) if r not in ranks]
    ranks += [int(r) for r in rng.choice(rest, size=NEIGHBOURHOOD_RANKS - len(ranks), replace=False)]
    return sorted(ranks)


def _replace(assignment: Assignment, ranks: list[int], loads: np.ndarray, cluster: ClusterSpec, cap_ms: float, unit_ms: float,
             budget_s: float, deadline_s: float, seed: int, rules: RankRules, repair: bool) -> tuple[list[tuple[str, int, int]] | None, float]:
    """The free shards on `ranks` placed among them to minimise the sum over phases of each
    phase's busiest rank (the ranks left out counting as they are), None if CP-SAT found none;
    and the deterministic seconds it spent. `repair`: CP-SAT starts from the placement as it is."""
    items = free_shards(assignment, ranks)
    if not items:
        return None, 0.0
    vectors = [shard_phase_ms(assignment.choice[t])[i] for t, i in items]
    base = {r: loads[r].copy() for r in ranks}
    used = RankLoads.of(assignment, cluster.world_size).bytes
    base_bytes = {r: used[r].copy() for r in ranks}
    for (t, i), v in zip(items, vectors):
        r = assignment.shard_ranks[t][i]
        base[r] -= v
        base_bytes[r] -= assignment.choice[t].shard_bytes[i]
    ticks = lambda ms: int(round(ms / unit_ms))  # noqa: E731
    model = cp_model.CpModel()
    x = placement_vars(model, items, ranks, assignment, rules)
    phase = [[ticks(v[g]) for v in vectors] for g in range(len(PHASES))]
    total = [sum(p[j] for p in phase) for j in range(len(items))]
    # in the model's own rounding the placement as it is stays feasible
    rank_total = {r: sum(ticks(base[r][g]) for g in range(len(PHASES))) + sum(total[j] for j, (t, i) in enumerate(items)
                                                                         if assignment.shard_ranks[t][i] == r) for r in ranks}
    cap = max(max(rank_total.values()), ticks(cap_ms))
    outside = np.delete(loads, ranks, axis=0).max(axis=0, initial=0.0)
    top = [model.NewIntVar(ticks(outside[g]), cap, f"top{g}") for g in range(len(PHASES))]
    caps = rank_capacities(cluster)
    for r in ranks:
        model.Add(sum(ticks(base[r][g]) for g in range(len(PHASES))) + sum(total[j] * x[j, r] for j in range(len(items))) <= cap)
        for g in range(len(PHASES)):
            model.Add(ticks(base[r][g]) + sum(phase[g][j] * x[j, r] for j in range(len(items)) if phase[g][j]) <= top[g])
        limit_memory(model, x, items, r, assignment, caps, base_bytes[r])
    hint_placement(model, x, items, ranks, assignment)
    model.Minimize(sum(top))
    solver = solver_parameters(budget_s, deadline_s - time.monotonic(), seed)
    # `repair`: search from the hint (the placement as it is) repaired; otherwise the hint only
    # guides a search that leaves it. The first alone found nothing on some problems the second
    # shortened, and the second ended on longer steps than the hint, or none, on others (100
    # tables on 8 ranks: every round), so balance_phases alternates them.
    solver.parameters.repair_hint = repair
    placed = None
    status = solver.Solve(model)
    wall_clock.note_cpsat(solver, "phase balance")
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        placed = [(t, i, next(r for r in ranks if solver.BooleanValue(x[j, r]))) for j, (t, i) in enumerate(items)]
    return placed, solver.deterministic_time

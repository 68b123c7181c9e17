"""Re-placing the free (any-rank) shards of a few ranks with CP-SAT, options kept: the
solver's repair of its busiest rank (large-neighbourhood search), and the model it builds, which
the phase balancing (planner.search.phase_balance) builds on too."""

from __future__ import annotations

import time

import numpy as np
from ortools.sat.python import cp_model

from planner.search import wall_clock
from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.search.cpsat import KIB, keep_apart, kib_up, solver_parameters, to_ticks
from planner.spec.placement_rules import RankRules
from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS, Placement


def repair_placement(
    assignment: Assignment,
    cluster: ClusterSpec,
    unit_ms: float,
    target_ms: float,
    max_deterministic_s: float,
    wall_deadline_s: float,
    seed: int,
    neighbourhood: int = 8,
    rules: RankRules = RankRules(),
) -> Assignment:
    """Large-neighbourhood search: repeatedly free the any-rank shards on the busiest rank and
    a few others (the least loaded, or random ones), and re-place them optimally with CP-SAT.

    Options stay as chosen; spread and node-bound shards stay put. Stops at `target_ms`, when
    the deterministic budget is spent, or after a run of rounds that found nothing better.
    """
    world = cluster.world_size
    if world < 2:
        return assignment
    rng = np.random.default_rng(seed)
    caps = rank_capacities(cluster)
    loads = RankLoads.of(assignment, world)
    spent, stale = 0.0, 0
    k = min(neighbourhood, world)
    while spent < max_deterministic_s and stale < 12:
        if wall_clock.passed(wall_deadline_s, "repair"):
            break
        top = int(np.argmax(loads.ms))
        if loads.ms[top] <= target_ms:
            break
        if stale % 2 == 0:
            others = [int(r) for r in np.argsort(loads.ms, kind="stable") if r != top][: k - 1]
        else:
            others = [int(r) for r in rng.choice([r for r in range(world) if r != top], size=k - 1, replace=False)]
        ranks = [top] + others
        items = free_shards(assignment, ranks)
        if not items:
            break
        base_ms = {r: loads.ms[r] for r in ranks}
        base_bytes = {r: loads.bytes[r].copy() for r in ranks}
        for table, i in items:
            option = assignment.choice[table]
            r = assignment.shard_ranks[table][i]
            base_ms[r] -= option.shard_ms[i]
            base_bytes[r] -= option.shard_bytes[i]
        model = cp_model.CpModel()
        x = placement_vars(model, items, ranks, assignment, rules)
        cost = [to_ticks(assignment.choice[t].shard_ms[i], unit_ms) for t, i in items]
        peak = model.NewIntVar(0, sum(cost) + to_ticks(max(base_ms.values()), unit_ms), "peak")
        for r in ranks:
            model.Add(to_ticks(base_ms[r], unit_ms) + sum(cost[j] * x[j, r] for j in range(len(items))) <= peak)
            limit_memory(model, x, items, r, assignment, caps, base_bytes[r])
        hint_placement(model, x, items, ranks, assignment)
        model.Minimize(peak)
        solver = solver_parameters(min(0.5, max_deterministic_s - spent), wall_deadline_s - time.monotonic(), seed)
        status = solver.Solve(model)
        wall_clock.note_cpsat(solver, "repair")
        spent += solver.deterministic_time
        if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            new_ms, new_bytes = dict(base_ms), {r: b.copy() for r, b in base_bytes.items()}
            moves = []
            for j, (t, i) in enumerate(items):
                r = next(r for r in ranks if solver.BooleanValue(x[j, r]))
                new_ms[r] += assignment.choice[t].shard_ms[i]
                new_bytes[r] += assignment.choice[t].shard_bytes[i]
                moves.append((t, i, r))
            before = max(loads.ms[r] for r in ranks)
            if max(new_ms.values()) < before - 1e-9 and all(np.all(new_bytes[r] <= caps) for r in ranks):
                for t, i, r in moves:
                    assignment.shard_ranks[t][i] = r
                for r in ranks:
                    loads.ms[r], loads.bytes[r] = new_ms[r], new_bytes[r]
                stale = 0
                continue
        stale += 1
    return assignment


def free_shards(assignment: Assignment, ranks: list[int]) -> list[tuple[str, int]]:
    """The shards on `ranks` that may go to any rank, as (table, shard index)."""
    return [(t, i) for t, o in assignment.choice.items() if o.placement is Placement.ANY_RANK
            for i, r in enumerate(assignment.shard_ranks[t]) if r in ranks]


def placement_vars(model: cp_model.CpModel, items: list[tuple[str, int]], ranks: list[int], assignment: Assignment,
                   rules: RankRules) -> dict:
    """x[j, r]: freed shard j on rank r, each on exactly one of `ranks`, the placement rules kept."""
    x = {(j, r): model.NewBoolVar(f"x{j}_{r}") for j in range(len(items)) for r in ranks}
    for j in range(len(items)):
        model.AddExactlyOne(x[j, r] for r in ranks)
    if rules:
        _repair_rules(model, x, items, ranks, assignment, rules)
    return x


def limit_memory(model: cp_model.CpModel, x: dict, items: list[tuple[str, int]], rank: int, assignment: Assignment,
               caps: np.ndarray, base_bytes: np.ndarray) -> None:
    """The freed shards placed on `rank` fit each tier beside `base_bytes` (what stays there), in
    KiB: each shard rounded up, the room down, so what the model accepts fits."""
    for ti in range(len(TIERS)):
        demand = [(kib_up(assignment.choice[t].shard_bytes[i][ti]), j) for j, (t, i) in enumerate(items)]
        if any(d for d, _ in demand):
            model.Add(sum(d * x[j, rank] for d, j in demand if d) <= (int(caps[ti]) - int(base_bytes[ti])) // KIB)


def hint_placement(model: cp_model.CpModel, x: dict, items: list[tuple[str, int]], ranks: list[int], assignment: Assignment) -> None:
    """Start CP-SAT from where the freed shards are."""
    for j, (t, i) in enumerate(items):
        for r in ranks:
            model.AddHint(x[j, r], assignment.shard_ranks[t][i] == r)


def _repair_rules(model: cp_model.CpModel, x: dict, items: list[tuple[str, int]], ranks: list[int],
                  assignment: Assignment, rules: RankRules) -> None:
    """The freed shards kept to their pins, and off ranks where another table of one of their
    keep-apart groups stays; among themselves, at most one table of a group per rank."""
    freed, members = set(items), rules.members()
    staying = {(t, r) for t, rs in assignment.shard_ranks.items() for i, r in enumerate(rs) if r in ranks and (t, i) not in freed}
    present: dict[tuple[str, int], list] = {}
    for j, (t, _) in enumerate(items):
        for r in ranks:
            blocked = not rules.may_use(t, r) or any(
                (other, r) in staying for g in rules.apart.get(t, ()) for other in members[g] if other != t)
            if blocked:
                model.Add(x[j, r] == 0)
            elif t in rules.apart and (t, r) not in staying:
                present.setdefault((t, r), []).append(x[j, r])
    keep_apart(model, present, rules, ranks)

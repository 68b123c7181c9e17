"""OR-Tools CP-SAT models: the joint option-and-placement model for small instances, and the
class model (options by class, placement after) for large ones; the repair of a few ranks at a
time is planner.search.repair.

Times are scaled to integers in units of `unit_ms`, rounded down, and bytes to KiB (demands
rounded up, capacities down, so an integer-feasible answer is feasible in bytes too). Pinned
shards get a variable only for the ranks they may use; a keep-apart group is, per rank, at
most one of its tables present.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from ortools.sat.python import cp_model

from planner.search import wall_clock
from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.spec.placement_rules import RankRules
from planner.spec.specs import ClusterSpec
from planner.spec.types import TIERS, Placement, ShardingOption

KIB = 1024
PACKING_CUT_LEVELS = 8  # f_1..f_8 in ClassModel._add_packing_cuts: one linear constraint each, per probe


def packing_cut_value(ticks: int, cap_ticks: int, k: int) -> int:
    """k * f_k(ticks / cap) for ClassModel's packing cuts: (k+1) x rounded up, less one; whole."""
    return max(0, -(-(k + 1) * ticks // cap_ticks) - 1)


def to_ticks(ms: float, unit_ms: float) -> int:
    """Rounded down: the model never overstates a cost, so its proven bound stays a bound."""
    return int(ms // unit_ms)


def kib_up(num_bytes: int) -> int:
    return -(-int(num_bytes) // KIB)


def solver_parameters(max_deterministic_s: float, max_wall_s: float, seed: int, relative_gap: float = 0.0) -> cp_model.CpSolver:
    """One worker and a deterministic-time limit make the answer a function of the input;
    the wall-clock limit is only a safety net on a slow or busy machine."""
    solver = cp_model.CpSolver()
    solver.parameters.relative_gap_limit = relative_gap
    solver.parameters.num_workers = 1
    solver.parameters.random_seed = seed
    solver.parameters.max_deterministic_time = max(0.01, max_deterministic_s)
    solver.parameters.max_time_in_seconds = max(0.05, max_wall_s)
    return solver


def joint_model_size(options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec) -> int:
    """Booleans the joint model would need; decides between it and the repair search."""
    w, n = cluster.world_size, cluster.num_nodes
    size = 0
    for options in options_by_table.values():
        for o in options:
            if o.placement in (Placement.ANY_RANK, Placement.ONE_NODE):
                size += len(o.shards) * w + (n if o.placement is Placement.ONE_NODE else 0)
            elif o.placement is Placement.NODE_RANKS:
                size += n
            size += 1
    return size


@dataclass(frozen=True)
class JointResult:
    assignment: Assignment
    bound_ms: float
    optimal: bool


def solve_joint(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    cluster: ClusterSpec,
    hint: Assignment,
    unit_ms: float,
    max_deterministic_s: float,
    max_wall_s: float,
    seed: int,
    known_bound_ms: float = 0.0,
    relative_gap: float = 0.0,
    rules: RankRules = RankRules(),
) -> JointResult | None:
    """Choose one option per table and a rank for every shard, minimising the busiest rank
    under every rank's capacity in every tier and `rules`. Returns None if no solution was found."""
    world, local, nodes = cluster.world_size, cluster.ranks_per_node, cluster.num_nodes
    tiers = [t for t in TIERS if any(s.storage.of_tier(t) for opts in options_by_table.values() for o in opts for s in o.shards)]
    caps = {t: cluster.capacity_bytes_per_rank(t) // KIB for t in tiers}
    model = cp_model.CpModel()
    load = [[] for _ in range(world)]  # (coefficient, literal) per rank
    shared = []  # (coefficient, literal) on every rank
    mem = {t: [[] for _ in range(world)] for t in tiers}
    decode = []  # (table, option, choose, per-shard {rank: literal} or node literals)
    present: dict[tuple[str, int], list] = {}  # (kept-apart table, rank) -> literals putting a shard there

    def charge(rank: int, shard, lit, table: str) -> None:
        if table in rules.apart:
            present.setdefault((table, rank), []).append(lit)
        load[rank].append((to_ticks(shard.perf.total_ms, unit_ms), lit))
        for t in tiers:
            b = shard.storage.of_tier(t)
            if b:
                mem[t][rank].append((kib_up(b), lit))

    for table, options in options_by_table.items():
        chooses = []
        for k, o in enumerate(options):
            choose = model.NewBoolVar(f"c[{table},{k}]")
            chooses.append(choose)
            every_rank_term(shared, o, choose, unit_ms, hint.choice.get(table) is o)
            if o.placement is Placement.EVERY_RANK:
                for r, shard in enumerate(o.shards):
                    charge(r, shard, choose, table)
                decode.append((table, o, choose, None))
            elif o.placement is Placement.NODE_RANKS:
                at = _node_literals(model, table, k, o, rules, local, nodes)
                model.Add(sum(at) == o.nodes_taken * choose)
                for n in range(nodes):  # every column block's row blocks are alike
                    for i, r in enumerate(o.ranks_on_nodes([n], local)):
                        charge(r, o.shards[i], at[n], table)
                decode.append((table, o, choose, ("node", at)))
            else:
                on_node = None
                if o.placement is Placement.ONE_NODE:
                    on_node = [model.NewBoolVar(f"n[{table},{k},{n}]") for n in range(nodes)]
                    model.Add(sum(on_node) == choose)
                per_shard = []
                for i, shard in enumerate(o.shards):
                    x = _rank_literals(model, table, k, i, choose, rules, world)
                    for r, lit in x.items():
                        charge(r, shard, lit, table)
                        if on_node is not None:
                            model.AddImplication(lit, on_node[r // local])
                    per_shard.append(x)
                decode.append((table, o, choose, ("shards", per_shard)))
        model.AddExactlyOne(chooses)
    keep_apart(model, present, rules, range(world))
    charge_every_rank(model, load, shared)

    horizon = sum(max(to_ticks(o.max_shard_ms, unit_ms) * len(o.shards) for o in opts) for opts in options_by_table.values())
    # A bound proven elsewhere lets the search stop once it is within `relative_gap` of it.
    peak = model.NewIntVar(min(to_ticks(known_bound_ms, unit_ms), horizon), max(1, horizon), "peak")
    for r in range(world):
        model.Add(sum(c * v for c, v in load[r]) <= peak)
        for t in tiers:
            if mem[t][r]:
                model.Add(sum(c * v for c, v in mem[t][r]) <= caps[t])
    model.Minimize(peak)

    for table, o, choose, extra in decode:
        chosen = hint.choice.get(table) is o
        model.AddHint(choose, chosen)
        if extra is None:
            continue
        kind, lits = extra
        ranks = hint.shard_ranks.get(table, []) if chosen else []
        if kind == "node":
            for n, lit in enumerate(lits):
                model.AddHint(lit, any(r // local == n for r in ranks))
        else:
            for i, x in enumerate(lits):
                for r, lit in x.items():
                    model.AddHint(lit, bool(ranks) and ranks[i] == r)

    solver = solver_parameters(max_deterministic_s, max_wall_s, seed, relative_gap)
    status = solver.Solve(model)
    wall_clock.note_cpsat(solver, "joint model")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    out = Assignment()
    for table, o, choose, extra in decode:
        if not solver.BooleanValue(choose):
            continue
        out.choice[table] = o
        if extra is None:
            out.shard_ranks[table] = list(range(world))
        elif extra[0] == "node":
            out.shard_ranks[table] = o.ranks_on_nodes(_chosen_nodes(solver, extra[1]), local)
        else:
            out.shard_ranks[table] = [next(r for r, lit in x.items() if solver.BooleanValue(lit)) for x in extra[1]]
    return JointResult(out, solver.BestObjectiveBound() * unit_ms, status == cp_model.OPTIMAL)


def every_rank_term(shared: list, option: ShardingOption, choose, unit_ms: float, hinted: bool) -> None:
    """What `option` costs every rank when chosen (ShardingOption.every_rank), as a term of
    `shared`; `hinted`: the hint chooses it."""
    ticks = to_ticks(option.every_rank_ms, unit_ms)
    if ticks:
        shared.append((ticks, choose, hinted))


def charge_every_rank(model: cp_model.CpModel, load: list[list], shared: list) -> None:
    """The sum of the chosen options' every-rank costs, as one variable on every rank's load
    (one term a rank, not one an option and rank), hinted as the hint's."""
    if shared:
        total = model.NewIntVar(0, sum(c for c, _, _ in shared), "every_rank")
        model.Add(total == sum(c * v for c, v, _ in shared))
        model.AddHint(total, sum(c for c, _, hinted in shared if hinted))
        for terms in load:
            terms.append((1, total))


def _rank_literals(model: cp_model.CpModel, table: str, k: int, i: int, choose, rules: RankRules, world: int) -> dict:
    """A literal per rank the table may use for shard `i` of its option `k`, one of them true when the option is chosen."""
    x = {r: model.NewBoolVar(f"x[{table},{k},{i},{r}]") for r in range(world) if rules.may_use(table, r)}
    model.Add(sum(x.values()) == choose)
    return x


def _node_literals(model: cp_model.CpModel, table: str, k: int, option: ShardingOption, rules: RankRules, local: int, nodes: int) -> list:
    """A literal per node for a node-ranks option (true on the nodes it takes), fixed false on
    nodes whose ranks the table may not use."""
    at = [model.NewBoolVar(f"n[{table},{k},{n}]") for n in range(nodes)]
    for n, lit in enumerate(at):
        if not all(rules.may_use(table, r) for r in option.ranks_on_nodes([n], local)):
            model.Add(lit == 0)
    return at


def _chosen_nodes(solver: cp_model.CpSolver, at: list) -> list[int]:
    return [n for n, lit in enumerate(at) if solver.BooleanValue(lit)]


def keep_apart(model: cp_model.CpModel, present: dict[tuple[str, int], list], rules: RankRules, ranks) -> None:
    """Per keep-apart group and rank, at most one of its tables has shards there."""
    there = {}
    for (table, rank), lits in present.items():
        y = model.NewBoolVar(f"y[{table},{rank}]")
        for lit in lits:
            model.AddImplication(lit, y)
        there[table, rank] = y
    for tables in rules.members().values():
        for rank in ranks:
            ys = [there[t, rank] for t in tables if (t, rank) in there]
            if len(ys) > 1:
                model.AddAtMostOne(ys)


@dataclass(frozen=True)
class ClassModelResult:
    assignment: Assignment | None  # None when none was found, or its counts could not be matched to memory
    bound_ms: float | None  # None when the model left options out, so it bounds nothing
    optimal: bool  # the search finished: the bound is the optimum, or (under a cap) the cap is refuted
    deterministic_s: float  # CP-SAT's deterministic time spent


def class_model_size(options_by_table: Mapping[str, Sequence[ShardingOption]], cluster: ClusterSpec, unit_ms: float) -> int:
    """Integer variables of the class model: one count per (shard-cost class, rank)."""
    classes = {
        to_ticks(ms, unit_ms)
        for opts in options_by_table.values()
        for o in opts
        if o.placement is Placement.ANY_RANK
        for ms in o.shard_ms.tolist()
    }
    return len(classes) * cluster.world_size + sum(len(opts) for opts in options_by_table.values())


class ClassModel:
    """Choose options and how many shards of each cost class every rank takes.

    Ranks are identical and many shards cost the same (TorchRec's estimate does not depend on
    a table's rows, say), so counting shards per class removes the symmetry that stalls the
    joint model. Memory is constrained exactly for shards whose rank the option fixes
    (row-wise, data-parallel, table-row-wise) and, for the free ones, only in total over the
    cluster: the placement of the counts (largest shards first, onto the rank with most room
    among those with quota) then checks every rank, and fails rather than overfill one.
    Node-bound column shards (table_column_wise) are left out of the choice; the proven bound
    is reported only when each of them has a column_wise twin of equal shards. Shards of
    tables with pins or keep-apart groups are placed by a variable per rank, as in the joint
    model, not counted.

    Built once and solved as often as asked: optimising, or under a cap on the busiest rank
    (the bisection's question), which only narrows the peak's domain.
    """

    def __init__(
        self,
        options_by_table: Mapping[str, Sequence[ShardingOption]],
        cluster: ClusterSpec,
        hint: Assignment,
        unit_ms: float,
        known_bound_ms: float = 0.0,
        rules: RankRules = RankRules(),
    ) -> None:
        world, local, nodes = cluster.world_size, cluster.ranks_per_node, cluster.num_nodes
        hint = _hint_free_twins(hint, options_by_table)
        model = cp_model.CpModel()
        load = [[] for _ in range(world)]
        shared = []  # on every rank
        caps_kib = rank_capacities(cluster) // KIB
        fixed_kib = [[[] for _ in TIERS] for _ in range(world)]  # per rank and tier: (KiB, literal)
        total_kib = [[] for _ in TIERS]  # the whole cluster's demand per tier

        def hold(rank: int | None, shard_bytes: np.ndarray, lit) -> None:
            for ti, b in enumerate(shard_bytes.tolist()):
                if b:
                    total_kib[ti].append((kib_up(b), lit))
                    if rank is not None:
                        fixed_kib[rank][ti].append((kib_up(b), lit))

        class_members: dict[int, list] = {}  # class -> [(choose literal, table, option, shard index)]
        present: dict[tuple[str, int], list] = {}
        decode = []
        left_out = False
        for table, options in options_by_table.items():
            chooses = []
            for k, o in enumerate(options):
                if o.placement is Placement.ONE_NODE:
                    # Leaving out an option that a free-placement twin with the same shard costs and
                    # sizes dominates (table_column_wise beside column_wise, usually) keeps the bound.
                    left_out = left_out or _free_twin(o, options) is None
                    continue
                choose = model.NewBoolVar(f"c[{table},{k}]")
                chooses.append(choose)
                model.AddHint(choose, hint.choice.get(table) is o)
                every_rank_term(shared, o, choose, unit_ms, hint.choice.get(table) is o)
                def place(rank: int, i: int, lit) -> None:
                    load[rank].append((to_ticks(float(o.shard_ms[i]), unit_ms), lit))
                    hold(rank, o.shard_bytes[i], lit)
                    if table in rules.apart:
                        present.setdefault((table, rank), []).append(lit)

                if o.placement is Placement.EVERY_RANK:
                    for r in range(world):
                        place(r, r, choose)
                    decode.append((table, o, choose, None))
                elif o.placement is Placement.NODE_RANKS:
                    at = _node_literals(model, table, k, o, rules, local, nodes)
                    model.Add(sum(at) == o.nodes_taken * choose)
                    for n, lit in enumerate(at):
                        model.AddHint(lit, hint.choice.get(table) is o and any(r // local == n for r in hint.shard_ranks[table]))
                    for n in range(nodes):  # every column block's row blocks are alike
                        for i, r in enumerate(o.ranks_on_nodes([n], local)):
                            place(r, i, at[n])
                    decode.append((table, o, choose, at))
                elif rules.restricts(table):
                    per_shard = []
                    for i in range(len(o.shards)):
                        x = _rank_literals(model, table, k, i, choose, rules, world)
                        for r, lit in x.items():
                            place(r, i, lit)
                            model.AddHint(lit, hint.choice.get(table) is o and hint.shard_ranks[table][i] == r)
                        per_shard.append(x)
                    decode.append((table, o, choose, per_shard))
                else:
                    for i, ms in enumerate(o.shard_ms.tolist()):
                        class_members.setdefault(to_ticks(ms, unit_ms), []).append((choose, table, o, i))
                        hold(None, o.shard_bytes[i], choose)
                    decode.append((table, o, choose, None))
            model.AddExactlyOne(chooses)
        keep_apart(model, present, rules, range(world))
        charge_every_rank(model, load, shared)

        hinted_counts = {c: [0] * world for c in class_members}
        for c, members in class_members.items():
            for _, table, o, i in members:
                if hint.choice.get(table) is o:
                    hinted_counts[c][hint.shard_ranks[table][i]] += 1
        counts = {}
        for c, members in class_members.items():
            n = [model.NewIntVar(0, len(members), f"n[{c},{r}]") for r in range(world)]
            model.Add(sum(n) == sum(lit for lit, *_ in members))
            for r in range(world):
                load[r].append((c, n[r]))
                model.AddHint(n[r], hinted_counts[c][r])
            counts[c] = n
        horizon = sum(max(to_ticks(o.total_ms, unit_ms) for o in opts) for opts in options_by_table.values()) + 1
        floor = min(to_ticks(known_bound_ms, unit_ms), horizon)
        peak = model.NewIntVar(floor, horizon, "peak")
        hint_ticks = _hinted_peak_ticks(hint, world, unit_ms) if hint.choice else horizon + 1  # no hint: every plan is better
        if hint.choice:  # without the peak the hint is incomplete, and CP-SAT completes it at the horizon
            model.AddHint(peak, max(floor, hint_ticks))
        for r in range(world):
            model.Add(sum(c * v for c, v in load[r]) <= peak)
        for ti in range(len(TIERS)):
            for r in range(world):
                if fixed_kib[r][ti]:
                    model.Add(sum(c * v for c, v in fixed_kib[r][ti]) <= int(caps_kib[ti]))
            if total_kib[ti]:
                model.Add(sum(c * v for c, v in total_kib[ti]) <= int(caps_kib[ti]) * world)
        model.Minimize(peak)
        self.model, self.peak, self.cluster, self.unit_ms = model, peak, cluster, unit_ms
        self.decode, self.class_members, self.counts, self.left_out = decode, class_members, counts, left_out
        self.floor_ticks, self.horizon, self.hint_ticks = floor, horizon, hint_ticks

    def _add_packing_cuts(self, model: cp_model.CpModel, cap_ticks: int) -> None:
        """Cuts from dual-feasible functions, valid while every rank carries at most `cap_ticks`.

        f_k(x) = (ceil((k+1) x) - 1) / k maps the loads on a rank, as fractions of the cap, to
        values that still sum to at most 1 (Fekete and Schepers' u^(k), rounded down where
        (k+1) x is whole), so over all shards of the chosen options the f_k sum to at most one
        per rank. Where the area bound lets small gaps add up, this counts the shards too large
        to share a rank (k = 1: more than half the cap each, at most one a rank). On 26 MLPerf
        tables on 16 ranks CP-SAT refuted 6.44 and 6.45 ms in 1.1 and 2.2 deterministic s with
        them, 1.7 and 4.7 without.
        """
        world, unit_ms = self.cluster.world_size, self.unit_ms
        shard_ticks = [(model.get_bool_var_from_proto_index(choose.Index()), [to_ticks(ms, unit_ms) for ms in o.shard_ms.tolist()])
                       for _, o, choose, _ in self.decode]
        for k in range(1, PACKING_CUT_LEVELS + 1):
            terms = [(sum(packing_cut_value(t, cap_ticks, k) for t in ticks), choose) for choose, ticks in shard_ticks]
            model.Add(sum(v * choose for v, choose in terms if v) <= k * world)

    def solve(self, max_deterministic_s: float, max_wall_s: float, seed: int, relative_gap: float = 0.0,
              peak_at_most_ms: float | None = None, cuts: bool = False, stop_at_ms: float | None = None) -> ClassModelResult:
        """The best plan found, or (with `peak_at_most_ms`) any plan with every rank at or under
        it; a proof that none exists is a bound (`optimal` with no assignment). `cuts`: CP-SAT's
        full linear relaxation with its cuts (linearization level 2), which refutes caps the
        default cannot (26 MLPerf tables on 16 ranks: 6.44 ms in 1.7 deterministic s, where the
        default had not in 60 s) but slows the search for plans. `stop_at_ms`: the search ends
        at its first plan better than the hint with its busiest rank at or under it."""
        world, local, unit_ms = self.cluster.world_size, self.cluster.ranks_per_node, self.unit_ms
        # a cap on a tick must not lose that tick to the float division's rounding
        cap = self.horizon if peak_at_most_ms is None else min(self.horizon, to_ticks(peak_at_most_ms * (1 + 1e-12), unit_ms))
        domain = self.model.Proto().variables[self.peak.Index()].domain
        domain[0], domain[1] = min(self.floor_ticks, cap), cap
        solver = solver_parameters(max_deterministic_s, max_wall_s, seed, relative_gap)
        model = self.model
        if cuts:
            solver.parameters.linearization_level = 2
            if peak_at_most_ms is not None:  # a copy: the packing cuts hold for this cap only
                model = self.model.clone()
                self._add_packing_cuts(model, cap)
        status = solver.Solve(model, None if stop_at_ms is None else _StopAt(min(to_ticks(stop_at_ms, unit_ms), self.hint_ticks - 1)))
        wall_clock.note_cpsat(solver, "class model probes" if peak_at_most_ms is not None else "class model")
        spent = solver.deterministic_time
        if status == cp_model.INFEASIBLE and peak_at_most_ms is not None:
            # Loads are rounded down to ticks, so no plan's busiest rank is under the next tick.
            return ClassModelResult(None, None if self.left_out else (cap + 1) * unit_ms, True, spent)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return ClassModelResult(None, None, False, spent)
        bound = None if self.left_out else solver.BestObjectiveBound() * unit_ms
        out = Assignment()
        for table, o, choose, at in self.decode:
            if not solver.BooleanValue(choose):
                continue
            out.choice[table] = o
            if o.placement is Placement.EVERY_RANK:
                out.shard_ranks[table] = list(range(world))
            elif o.placement is Placement.NODE_RANKS:
                out.shard_ranks[table] = o.ranks_on_nodes(_chosen_nodes(solver, at), local)
            elif at is not None:  # placed by its own variables
                out.shard_ranks[table] = [next(r for r, lit in x.items() if solver.BooleanValue(lit)) for x in at]
            else:
                out.shard_ranks[table] = [-1] * len(o.shards)
        quota = {c: [solver.Value(v) for v in n] for c, n in self.counts.items()}
        placed = _place_by_counts(out, self.class_members, quota, self.cluster)
        return ClassModelResult(out if placed else None, bound, status == cp_model.OPTIMAL, spent)


class _StopAt(cp_model.CpSolverSolutionCallback):
    """Ends a search at its first plan whose busiest rank is at or under `ticks`."""

    def __init__(self, ticks: int) -> None:
        super().__init__()
        self.ticks = ticks

    def on_solution_callback(self) -> None:
        if self.ObjectiveValue() <= self.ticks:
            self.StopSearch()


def _hint_free_twins(hint: Assignment, options_by_table: Mapping[str, Sequence[ShardingOption]]) -> Assignment:
    """The hint with each node-bound choice the class model leaves out replaced by its
    free-placement twin (equal shards, each on the rank its equal had): a hint naming an
    option the model lacks is infeasible, and CP-SAT then starts from its own, far worse, plan."""
    out = hint.copy()
    for table, o in hint.choice.items():
        if o.placement is not Placement.ONE_NODE:
            continue
        twin = _free_twin(o, options_by_table[table])
        if twin is not None:
            ranks = [0] * len(twin.shards)
            for mine, theirs in zip(np.argsort(twin.shard_ms, kind="stable"), np.argsort(o.shard_ms, kind="stable")):
                ranks[int(mine)] = hint.shard_ranks[table][int(theirs)]
            out.choice[table], out.shard_ranks[table] = twin, ranks
    return out


def _hinted_peak_ticks(hint: Assignment, world: int, unit_ms: float) -> int:
    """The busiest rank of the hint as the model counts it (each shard's and each option's
    every-rank cost in ticks)."""
    ticks = [0] * world
    for table, o in hint.choice.items():
        for i, r in enumerate(hint.shard_ranks[table]):
            ticks[r] += to_ticks(float(o.shard_ms[i]), unit_ms)
    return max(ticks) + sum(to_ticks(o.every_rank_ms, unit_ms) for o in hint.choice.values())


def _free_twin(option: ShardingOption, options: Sequence[ShardingOption]) -> ShardingOption | None:
    """A free-placement option with the same shard costs and sizes as `option`, if any."""
    return next((t for t in options if t.placement is Placement.ANY_RANK and _same_shards(option, t)), None)


def _same_shards(a: ShardingOption, b: ShardingOption) -> bool:
    return (
        len(a.shards) == len(b.shards)
        and np.array_equal(np.sort(a.shard_ms), np.sort(b.shard_ms))
        and np.array_equal(np.sort(a.shard_bytes, axis=0), np.sort(b.shard_bytes, axis=0))
    )


def _place_by_counts(out: Assignment, class_members, quota: dict[int, list[int]], cluster: ClusterSpec) -> bool:
    """Give each chosen shard a rank with quota left for its class and room for its bytes."""
    caps = rank_capacities(cluster)
    loads = RankLoads.empty(cluster.world_size)
    for table, o in out.choice.items():
        if -1 not in out.shard_ranks[table]:  # placed by the model itself
            loads.add(o, out.shard_ranks[table])
    if np.any(loads.bytes > caps):
        return False
    shards = [
        (c, table, o, i)
        for c, members in class_members.items()
        for _, table, o, i in members
        if out.choice.get(table) is o
    ]
    shards.sort(key=lambda s: (-int(s[2].shard_bytes[s[3]].sum()), s[1], s[3]))
    for c, table, o, i in shards:
        need = o.shard_bytes[i]
        room = [(int((caps - loads.bytes[r] - need).min()), -r) for r in range(cluster.world_size) if quota[c][r] > 0]
        fits = [x for x in room if x[0] >= 0]
        if not fits:
            return False
        r = -max(fits)[1]
        quota[c][r] -= 1
        loads.bytes[r] += need
        out.shard_ranks[table][i] = r
    return True

"""Replanning with least movement (`dlrm-scale plan --from OLD.json [--max-move-gb X]`).

The tables, their statistics, the world size or the hardware changed; the model is trained
under OLD. Moving weights and optimizer state costs time (a checkpoint reshards on load, but
bytes still cross the network), so the new plan starts from OLD's layout, kept wherever it
still exists among the new options and fits, and buys step time with bytes:

1. stay: each table keeps its old layout if it can; one that cannot (a row-wise table on a
   new world size, a table whose shape or hardware changed) takes the layout that moves
   fewest bytes, a new table the one that keeps the busiest rank lowest (nothing moves: it
   starts from its initial weights);
2. search: the tables that move fewest bytes (new ones, then old ones smallest first, as far
   as their bytes fit the budget) are planned by the planner's own search around the others,
   held where they stay (one option each, its shards pinned to their ranks), and the result relabelled;
3. improve: repeatedly re-lay one table of the busiest rank (any of its options, placed as the
   planner places them or with each shard kept on the old rank that holds most of its rows,
   or its layout in the unconstrained plan), taking the change that lowers the busiest rank
   most per byte moved, while the bytes moved stay within the budget.

Ranks are interchangeable, so the unconstrained plan is first relabelled to move the fewest
bytes: its free-placed shards go, a rank's worth at a time, to the rank that holds most of
them already (a linear assignment, OR-Tools), never raising its busiest rank or overfilling one.

Each point carries a proven floor (`planner.replan.move_floor`): no plan within its budget is faster.

Bytes moved are `planner.views.diff.moved_bytes` (what arrives at each rank, weights plus optimizer
state), summed within and across nodes. Without a budget, the result is the front of (bytes
moved, busiest rank) over a ladder of budgets, with the unconstrained plan at its end.
Co-located groups are replanned as the search sees them, each group one table
(`planner.search.colocation`): its members stay, move and are counted together, on one rank.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from ortools.graph.python import linear_sum_assignment

from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.search.candidates import enumerate_options
from planner.search.collector import collector_paused
from planner.search.colocation import Colocated, colocate
from planner.cost.cost_model import AnalyticCostModel, CostModel, rows_bytes
from planner.views.diff import arrivals, moved_bytes, shared_block
from planner.spec.errors import InfeasiblePlanError
from planner.search.greedy import place_one
from planner.replan.move_floor import MoveFloor, option_keeping
from planner.spec.placement_rules import Occupancy, RankRules
from planner.plan.document import Plan, TablePlan
from planner.plan.planning import make_plan, option_layout, plan_from_solution
from planner.search.solver import Solution, SolverConfig, solve
from planner.spec.specs import GIB
from planner.spec.problem import PlanningProblem
from planner.spec.types import Placement, ShardingOption, ShardingType

BUDGET_LADDER = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5)  # fractions of the model's bytes, for the front
MIN_BYTES = 2**20  # a change that moves (almost) nothing is priced as moving 1 MiB
PRICED_RANKS = 32  # the proven floor prices each of the old plan's busiest ranks alone, at most these


@dataclass(frozen=True)
class Replanned:
    plan: Plan
    moved_bytes: int
    budget_bytes: int | None  # None: the unconstrained plan
    floor_ms: float  # proven: no plan within the budget (or any plan, unconstrained) has a faster busiest rank


@dataclass(frozen=True)
class Front:
    points: list[Replanned]  # by bytes moved, each faster than the one before
    model_bytes: int  # weights and optimizer state of the old plan's tables, once each
    free: Replanned  # the unconstrained plan

    def format(self) -> str:
        lines = [f"{'budget':>16} {'moved GiB':>10} {'% of model':>10} {'busiest ms':>11} {'vs unconstrained':>17} "
                 f"{'proven floor':>20}"]

        def vs_free(ms: float) -> float:
            return ms / self.free.plan.max_rank_ms - 1
        for p in self.points:
            budget = "unconstrained" if p.budget_bytes is None else f"{p.budget_bytes / GIB:.3f} GiB"
            lines.append(f"{budget:>16} {p.moved_bytes / GIB:>10.3f} {p.moved_bytes / self.model_bytes:>10.1%} "
                         f"{p.plan.max_rank_ms:>11.4f} {vs_free(p.plan.max_rank_ms):>+17.2%} "
                         f"{p.floor_ms:>10.4f} ({vs_free(p.floor_ms):+.1%})")
        return "\n".join(lines)


def model_bytes(plan: Plan, optimizer: str) -> int:
    return sum(rows_bytes(t.num_embeddings, t.embedding_dim, optimizer) for t in plan.tables.values())


class _Moves:
    """The replan in progress, over the search's tables (each co-located group one): each
    one's option and ranks, the bytes each one's change moves, the ranks' loads."""

    def __init__(self, problem: PlanningProblem, old: Plan, table_options: dict[str, list[ShardingOption]], search: Colocated) -> None:
        self.problem, self.old, self.search = problem, old, search
        self.table_options = table_options  # of the real tables
        self.options, self.rules = search.options_by_table, search.rules
        self.specs = {t.name: t for t in problem.tables}
        self.cluster = problem.cluster
        self.caps = rank_capacities(problem.cluster)
        self.assignment = Assignment()
        self.moved: dict[str, int] = {}
        self.loads = RankLoads.empty(problem.cluster.world_size)

    def layouts(self, table: str, option: ShardingOption, ranks: list[int]) -> list[tuple[str, TablePlan]]:
        """How the plan would write each real table behind `table`."""
        return [(name, option_layout(member, ranks, self.specs[name])) for name, member in self.search.members_of(table, option)]

    def bytes_for(self, table: str, option: ShardingOption, ranks: list[int]) -> int:
        return sum(sum(moved_bytes(self.old.tables[name], layout, self.old.ranks_per_node, self.cluster.ranks_per_node,
                                   self.problem.training.embedding_optimizer))
                   for name, layout in self.layouts(table, option, ranks) if name in self.old.tables)

    def set(self, table: str, option: ShardingOption, ranks: list[int]) -> None:
        if table in self.assignment.choice:
            self.loads.add(self.assignment.choice[table], self.assignment.shard_ranks[table], sign=-1)
        self.assignment.choice[table], self.assignment.shard_ranks[table] = option, list(ranks)
        self.loads.add(option, ranks)
        self.moved[table] = self.bytes_for(table, option, ranks)

    def admits(self, table: str) -> Callable[[int], bool]:
        occupancy: Occupancy = self.rules.occupancy({t: r for t, r in self.assignment.shard_ranks.items() if t != table})
        return occupancy.admitting(table)

    def fits(self, option: ShardingOption, ranks: list[int], others: RankLoads) -> bool:
        used = others.bytes.copy()
        np.add.at(used, ranks, option.shard_bytes)
        return bool(np.all(used <= self.caps))

    def without(self, table: str) -> RankLoads:
        others = RankLoads(self.loads.ms.copy(), self.loads.bytes.copy())
        if table in self.assignment.choice:
            others.add(self.assignment.choice[table], self.assignment.shard_ranks[table], sign=-1)
        return others

    def total_moved(self) -> int:
        return sum(self.moved.values())


def move_floor(moves: _Moves, bound_ms: float) -> MoveFloor:
    """The proven floor under any plan within a budget, never below `bound_ms` (the new
    problem's proven bound), pricing each of the old plan's busiest ranks alone."""
    optimizer, world = moves.problem.training.embedding_optimizer, moves.cluster.world_size

    def layouts(table: str, option: ShardingOption) -> list[tuple[TablePlan | None, TablePlan]]:
        return [(moves.old.tables.get(name), layout) for name, layout in moves.layouts(table, option, [0] * len(option.shards))]

    keeps = {t: [option_keeping(o, layouts(t, o), world, optimizer) for o in opts] for t, opts in moves.options.items()}
    old_ranks = min(world, moves.old.world_size)
    old_ms = {r.rank: r.predicted_ms for r in moves.old.ranks}
    busiest = sorted(range(old_ranks), key=lambda r: -old_ms.get(r, 0.0))[:PRICED_RANKS]
    return MoveFloor(moves.options, keeps, world, old_ranks, busiest, bound_ms)


def _free_blocks(assignment: Assignment, world: int) -> tuple[list[list[tuple[str, int]]], RankLoads]:
    """Each rank's free-placed (any-rank) shards, and the loads of everything else."""
    blocks: list[list[tuple[str, int]]] = [[] for _ in range(world)]
    fixed = RankLoads.empty(world)
    for table, option in assignment.choice.items():
        ranks = assignment.shard_ranks[table]
        if option.placement is Placement.ANY_RANK:
            for i, r in enumerate(ranks):
                blocks[r].append((table, i))
            fixed.ms += option.every_rank_ms  # every rank's, whichever rank its shards go to
        else:
            fixed.add(option, ranks)
    return blocks, fixed


def align(free: Assignment, moves: _Moves) -> Assignment:
    """`free` with its ranks' free-placed shards relabelled to move the fewest bytes from the
    old plan, keeping every rank's time under `free`'s busiest and its bytes within capacity."""
    world = moves.cluster.world_size
    blocks, fixed = _free_blocks(free, world)
    peak = float(RankLoads.of(free, world).ms.max())
    optimizer, old_local, local = moves.problem.training.embedding_optimizer, moves.old.ranks_per_node, moves.cluster.ranks_per_node
    solver = linear_sum_assignment.SimpleLinearSumAssignment()
    for a, block in enumerate(blocks):
        ms = sum(free.choice[t].shard_ms[i] for t, i in block)
        need = sum((free.choice[t].shard_bytes[i] for t, i in block), np.zeros(len(moves.caps), dtype=np.int64))
        for b in range(world):
            if fixed.ms[b] + ms > peak * (1 + 1e-9) or np.any(fixed.bytes[b] + need > moves.caps) \
                    or not all(moves.rules.may_use(t, b) for t, _ in block):
                continue
            cost = 0
            for t, i in block:
                for name, layout in moves.layouts(t, free.choice[t], [b] * len(free.choice[t].shards)):
                    if name in moves.old.tables:
                        arriving = sum(arrivals(layout.shards[i], moves.old.tables[name], old_local, local, optimizer))
                        cost += -(-arriving // 1024)  # KiB, rounded up: any move costs
            solver.add_arc_with_cost(a, b, cost)
    if solver.solve() != solver.OPTIMAL:
        return free
    aligned = free.copy()
    for a, block in enumerate(blocks):
        for t, i in block:
            aligned.shard_ranks[t][i] = solver.right_mate(a)
    occupancy = moves.rules.occupancy({})
    for t, ranks in aligned.shard_ranks.items():
        for r in ranks:
            if not occupancy.admits(t, r):
                return free  # a keep-apart group met a node-bound table: keep the labels as they were
            occupancy.add(t, r)
    return aligned


def in_place(option: ShardingOption, table: str, moves: _Moves, others: RankLoads, admits) -> list[int] | None:
    """Ranks for a free-placed `option` with each shard on the old rank holding most of its
    elements (one shard per old rank) where it fits, the rest onto the least-loaded ranks with room."""
    layouts = [(moves.old.tables[name], layout) for name, layout in moves.layouts(table, option, [0] * len(option.shards))
               if name in moves.old.tables]
    if not layouts or option.placement is not Placement.ANY_RANK:
        return None
    used, ms = others.bytes.copy(), others.ms.copy()
    ranks = []
    for i in range(len(option.shards)):
        overlap = {}
        for before, layout in layouts:
            for source in before.shards:
                rows, cols = shared_block(layout.shards[i], source)
                overlap[source.rank] = overlap.get(source.rank, 0) + rows * cols
        claimed = [r for r in sorted(overlap, key=lambda r: -overlap[r]) if r not in ranks]  # one shard stays per old rank
        order = claimed[:1] + sorted(range(len(ms)), key=lambda r: (ms[r], r))
        rank = next((r for r in order if r < len(ms) and admits(r) and np.all(used[r] + option.shard_bytes[i] <= moves.caps)), None)
        if rank is None:
            return None
        used[rank] += option.shard_bytes[i]
        ms[rank] += option.shard_ms[i]
        ranks.append(rank)
    return ranks


def _kept(moves: _Moves, table: str) -> tuple[ShardingOption, list[int]] | None:
    """The option that lays `table` out exactly as the old plan did, if any; for a group,
    its members' such options, if the old plan had them all whole on one rank."""
    kept = []
    for name in moves.search.tables_of(table):
        before: TablePlan | None = moves.old.tables.get(name)
        if before is None or any(r >= moves.cluster.world_size or not moves.rules.may_use(table, r) for r in before.ranks):
            return None
        option = next((o for o in moves.table_options[name]
                       if len(o.shards) == len(before.shards) and option_layout(o, before.ranks, moves.specs[name]) == before), None)
        if option is None:
            return None
        kept.append((name, option, before.ranks))
    if len(kept) == 1:
        return kept[0][1], kept[0][2]
    if len({tuple(ranks) for _, _, ranks in kept}) != 1 or len(kept[0][2]) != 1:
        return None
    return moves.search.combine(table, tuple((name, option) for name, option, _ in kept)), kept[0][2]


def stay(moves: _Moves) -> None:
    """Each table where the old plan had it, if it can be; the others laid out to move the
    fewest bytes (then to keep the busiest rank lowest)."""
    placed_later = []
    for table in moves.options:
        kept = _kept(moves, table)
        if kept is not None:
            moves.set(table, *kept)
        else:
            placed_later.append(table)
    if np.any(moves.loads.bytes > moves.caps):
        raise InfeasiblePlanError("the old plan's layout does not fit the new cluster's memory; plan without --from")
    order = sorted(placed_later, key=lambda t: -max(o.max_shard_ms for o in moves.options[t]))
    for table in order:
        others, admits = moves.without(table), moves.admits(table)
        best = None
        for option in moves.options[table]:
            ranks = place_one(option, others, moves.caps, moves.cluster, admits)
            if ranks is None:
                continue
            ms = others.ms + option.every_rank_ms
            np.add.at(ms, ranks, option.shard_ms)
            key = (moves.bytes_for(table, option, ranks), float(ms.max()), option.total_ms)
            if best is None or key < best[0]:
                best = (key, option, ranks)
        if best is None:
            raise InfeasiblePlanError(f"table '{table}' finds no rank with room beside the old plan's layout; plan without --from")
        moves.set(table, best[1], best[2])


def _score(ms: np.ndarray) -> tuple[float, int]:
    peak = float(ms.max())
    return peak, int(np.sum(ms >= peak * (1 - 1e-9)))


def improve(moves: _Moves, budget_bytes: float, free: Assignment, max_steps: int) -> None:
    """Re-lay tables of the busiest rank, best gain per byte first, within `budget_bytes`."""
    for _ in range(max_steps):
        peak, count = _score(moves.loads.ms)
        top = int(np.argmax(moves.loads.ms))
        spent = moves.total_moved()
        best = None
        for table in sorted(t for t, r in moves.assignment.shard_ranks.items() if top in r):
            others, admits = moves.without(table), moves.admits(table)
            candidates = [(o, place_one(o, others, moves.caps, moves.cluster, admits)) for o in moves.options[table]]
            candidates += [(o, in_place(o, table, moves, others, admits)) for o in moves.options[table]]
            target = free.choice[table], free.shard_ranks[table]
            if all(map(admits, target[1])) and moves.fits(*target, others):
                candidates.append(target)
            for option, ranks in candidates:
                if ranks is None:
                    continue
                ms = others.ms + option.every_rank_ms
                np.add.at(ms, ranks, option.shard_ms)
                new_peak, new_count = _score(ms)
                if (new_peak, new_count) >= (peak, count):
                    continue
                cost = moves.bytes_for(table, option, ranks)
                if spent - moves.moved[table] + cost > budget_bytes:
                    continue
                gain = peak - new_peak if new_peak < peak * (1 - 1e-9) else 1e-6 * peak * (count - new_count)
                ratio = gain / max(cost - moves.moved[table], MIN_BYTES)
                if best is None or (ratio, gain) > best[0]:
                    best = ((ratio, gain), table, option, ranks)
        if best is None:
            return
        moves.set(best[1], best[2], best[3])


def movable(base: _Moves, budget_bytes: float) -> set[str]:
    """The tables free to move under `budget_bytes`: new ones (nothing of theirs moves), then
    old ones smallest first while their bytes (a copy per rank a data-parallel table gains)
    add up within the budget; the rest keep their stay layout."""
    optimizer, world = base.problem.training.embedding_optimizer, base.cluster.world_size
    free, sizes, worst = set(), {}, {}
    for table in base.options:
        old = [n for n in base.search.tables_of(table) if n in base.old.tables]
        if not old:
            free.add(table)
            continue
        size = {n: rows_bytes(base.specs[n].num_embeddings, base.specs[n].embedding_dim, optimizer) for n in old}
        sizes[table] = sum(size.values())
        worst[table] = sum(b * (world if base.old.tables[n].sharding_type == "data_parallel" else 1) for n, b in size.items())
    spent = 0.0
    for table in sorted(sizes, key=lambda t: (sizes[t], t)):
        if spent + worst[table] > budget_bytes:
            break
        free.add(table)
        spent += worst[table]
    return free


def keeping(base: _Moves, free_tables: set[str], config: SolverConfig, seconds: float) -> Assignment:
    """The planner's search with every table outside `free_tables` held to its stay layout,
    then relabelled to move the fewest bytes. A held table of freely placed shards enters the
    search as one table per rank it uses, its shards there pinned to that rank (pinning the whole
    table to its ranks let the search stack its shards on one of them, which moved their bytes
    and threw the search's plan away); one of shards on fixed ranks, pinned to its ranks."""
    options, allowed, apart, held_parts = {}, dict(base.rules.allowed), dict(base.rules.apart), {}
    for t in base.options:
        if t in free_tables:
            options[t] = base.options[t]
            continue
        option, ranks = base.assignment.choice[t], base.assignment.shard_ranks[t]
        if option.placement in (Placement.EVERY_RANK, Placement.NODE_RANKS):  # shard i on (local) rank i
            options[t] = [option]
            allowed[t] = frozenset(ranks) & allowed.get(t, frozenset(range(base.cluster.world_size)))
            continue
        for rank in sorted(set(ranks)):
            part = f"{t}\0{rank}"  # no table's name holds a NUL
            mine = [i for i, r in enumerate(ranks) if r == rank]
            options[part] = [replace(option, table=part, sharding_type=ShardingType.COLUMN_WISE,  # placed freely, pinned
                                     geometries=tuple(option.geometries[i] for i in mine), shards=tuple(option.shards[i] for i in mine))]
            allowed[part] = frozenset([rank])
            if t in apart:
                apart[part] = apart[t]
            held_parts[part] = t
    for t in held_parts.values():
        allowed.pop(t, None)
        apart.pop(t, None)
    rules = RankRules(allowed, apart)
    found = solve(options, base.cluster, replace(config, time_limit_s=seconds), rules=rules).assignment
    for part, t in held_parts.items():
        del found.choice[part], found.shard_ranks[part]
        found.choice[t], found.shard_ranks[t] = base.assignment.choice[t], list(base.assignment.shard_ranks[t])
    return align(found, base)


@collector_paused()
def replan(problem: PlanningProblem, old: Plan, cost_model: CostModel | None = None, config: SolverConfig | None = None,
           max_move_bytes: int | None = None) -> Front:
    """The front of (bytes moved, busiest rank) from `old` to a plan for `problem`; with
    `max_move_bytes`, its one point for that budget (and the unconstrained plan, when that
    moves no more)."""
    start = time.monotonic()
    config = config or SolverConfig()
    constraints = problem.constraints
    cost_model = cost_model or AnalyticCostModel(problem.cluster, problem.training)
    free_plan = make_plan(problem, cost_model, config)
    options = enumerate_options(problem, cost_model)
    rules = constraints.rank_rules([t.name for t in problem.tables]) if constraints is not None else RankRules()
    search = colocate(options, constraints.colocate if constraints is not None else (), rules)
    base = _Moves(problem, old, options, search)
    free = Assignment()
    for name, t in free_plan.tables.items():
        option = next(o for o in options[name] if option_layout(o, t.ranks, base.specs[name]) == t)
        free.choice[name], free.shard_ranks[name] = option, t.ranks
    free = align(search.grouped(free), base)
    free_plan = plan_from_solution(Solution(search.expand(free), free_plan.max_rank_ms, free_plan.lower_bound_ms, free_plan.solver,
                                            free_plan.solve_seconds), problem, cost_model.name)
    stay(base)
    optimizer = problem.training.embedding_optimizer
    total = model_bytes(old, optimizer)
    free_moved = sum(sum(moved_bytes(old.tables[n], t, old.ranks_per_node, problem.cluster.ranks_per_node, optimizer))
                     for n, t in free_plan.tables.items() if n in old.tables)
    least = base.total_moved()
    if max_move_bytes is not None and max_move_bytes < least:
        raise InfeasiblePlanError(f"the new plan moves at least {least / GIB:.3f} GiB (tables whose old layout cannot stay); "
                                  f"give --max-move-gb {least / GIB:.3f} or more")
    floor = move_floor(base, free_plan.lower_bound_ms)  # after the budget's check: a refused budget costs nothing more
    # a budget's search may end worse than a smaller budget's (it frees more tables in the same
    # time): with one budget, the least one is tried too, and the faster kept
    budgets = sorted({least, max_move_bytes} if max_move_bytes is not None else {max(least, f * total) for f in BUDGET_LADDER})
    points = []
    seconds = max(0.5, config.time_limit_s / len(budgets))
    for budget in budgets:
        moves = _Moves(problem, old, options, search)
        free_tables = movable(base, budget)
        searched = keeping(base, free_tables, config, seconds) if free_tables else base.assignment
        for table, option in searched.choice.items():
            moves.set(table, option, searched.shard_ranks[table])
        # the search moved more than the sizes promised, or did worse than staying: stay instead
        if moves.total_moved() > budget or moves.loads.ms.max() > base.loads.ms.max():
            for table, option in base.assignment.choice.items():
                moves.set(table, option, base.assignment.shard_ranks[table])
        improve(moves, budget, free, max_steps=20 * len(problem.tables))
        solution = Solution(search.expand(moves.assignment), float(moves.loads.ms.max()), free_plan.lower_bound_ms, "replan", time.monotonic() - start)
        points.append(Replanned(plan_from_solution(solution, problem, cost_model.name), moves.total_moved(), int(budget),
                                floor.ms(budget, high_ms=float(moves.loads.ms.max()))))
    free_point = Replanned(free_plan, free_moved, None, free_plan.lower_bound_ms)
    if max_move_bytes is None or free_moved <= max_move_bytes:
        points.append(free_point)
    front = []
    for p in sorted(points, key=lambda p: (p.moved_bytes, p.plan.max_rank_ms)):
        if not front or p.plan.max_rank_ms < front[-1].plan.max_rank_ms * (1 - 1e-9):
            front.append(p)
    return Front(front, total, free_point)

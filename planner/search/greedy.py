"""Fast heuristics: pick options against a shard-size cap, pack by LPT, then local search.

They give the solver a good warm start in milliseconds, and on large instances (thousands of
shards) most of the final quality: with many small items LPT is within a few percent.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Callable, Mapping, Sequence

import numpy as np

from planner.search import work
from planner.search.assignment import Assignment, RankLoads, rank_capacities
from planner.spec.errors import InfeasiblePlanError
from planner.spec.placement_rules import Occupancy, RankRules
from planner.spec.specs import ClusterSpec
from planner.spec.types import Placement, ShardingOption


def choose_options(options_by_table: Mapping[str, Sequence[ShardingOption]], cap_ms: float) -> dict[str, ShardingOption]:
    """Per table, the cheapest option (least summed time) whose largest shard is under `cap_ms`;
    when none is, the option with the smallest largest shard. Ties go to fewer shards."""
    chosen = {}
    for table, options in options_by_table.items():
        small = [o for o in options if o.max_shard_ms <= cap_ms]
        if small:
            chosen[table] = min(small, key=lambda o: (o.total_ms, len(o.shards)))
        else:
            chosen[table] = min(options, key=lambda o: (o.max_shard_ms, o.total_ms))
    return chosen


def fit_memory(
    chosen: Mapping[str, ShardingOption],
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    cluster: ClusterSpec,
    fill: float = 0.95,
) -> dict[str, ShardingOption]:
    """Swap options until each tier's summed demand is within `fill` of the cluster's capacity.

    Each swap frees bytes in the most over-full tier (relative to its size) at the least extra
    time per byte, without pushing another tier over: this is how tables move to a slower tier
    behind a cache, or to finer shards, only as far as memory forces. Packing may still fail
    on fragmentation; callers retry with a smaller `fill`. Vectorised over every option of
    every table, since a model may have thousands of each.
    """
    caps = rank_capacities(cluster).astype(np.float64) * cluster.world_size * fill
    tables = list(options_by_table)
    options = [o for t in tables for o in options_by_table[t]]
    owner = np.repeat(np.arange(len(tables)), [len(options_by_table[t]) for t in tables])
    sizes = np.array([o.shard_bytes.sum(axis=0) for o in options], dtype=np.float64)
    times = np.array([o.total_ms for o in options])
    position = {id(o): i for i, o in enumerate(options)}
    current = np.array([position[id(chosen[t])] for t in tables])
    demand = sizes[current].sum(axis=0)
    while True:
        over = (demand - caps) / np.maximum(caps, 1.0)
        tier = int(np.argmax(over))
        if over[tier] <= 0:
            break
        have = sizes[current[owner]]
        saved = have[:, tier] - sizes[:, tier]
        after = demand - have + sizes
        usable = (saved > 0) & ~np.any((after > caps) & (after > demand), axis=1)
        if not usable.any():
            break  # nothing frees memory here; packing reports the tier that is short
        cost = np.where(usable, (times - times[current[owner]]) / np.where(usable, saved, 1.0), np.inf)
        best = int(np.lexsort((times, cost))[0])
        table = owner[best]
        demand = demand - sizes[current[table]] + sizes[best]
        current[table] = best
    return {t: options[current[i]] for i, t in enumerate(tables)}


def relative_shard_size(option: ShardingOption, caps: np.ndarray) -> float:
    """The option's largest shard as a fraction of a rank's room, in its fullest tier."""
    return float(np.max(option.shard_bytes.max(axis=0) / np.maximum(caps, 1)))


def split_stuck_table(chosen: dict[str, ShardingOption], options_by_table: Mapping[str, Sequence[ShardingOption]],
                      table: str, cluster: ClusterSpec) -> bool:
    """After `table` found no rank with room: switch it to the fastest option with smaller
    shards and at most a quarter more bytes in any tier (row-wise instead of table-wise, say,
    whose shards each add output buffers). False if none."""
    caps = rank_capacities(cluster)
    current = chosen[table]
    size, total = relative_shard_size(current, caps), current.shard_bytes.sum(axis=0)
    finer = [o for o in options_by_table[table]
             if relative_shard_size(o, caps) < size and np.all(o.shard_bytes.sum(axis=0) <= 1.25 * total)]
    if not finer:
        return False
    chosen[table] = min(finer, key=lambda o: (o.total_ms, relative_shard_size(o, caps)))
    return True


def _fits(loads: RankLoads, caps: np.ndarray, rank: int, shard_bytes: np.ndarray) -> bool:
    return bool((loads.bytes[rank] + shard_bytes <= caps).all())


def _shard_bytes(option: ShardingOption, index: int) -> np.ndarray:
    return option.shard_bytes[index]


def _no_room(option: ShardingOption, cluster: ClusterSpec, rules: RankRules) -> InfeasiblePlanError:
    tier = cluster.device_tier
    need = sum(s.storage.of_tier(tier) for s in option.shards)
    have = cluster.capacity_bytes_per_rank(tier) * cluster.world_size
    where = "among the ranks its constraints allow " if rules.restricts(option.table) else ""
    return InfeasiblePlanError(
        f"table '{option.table}' ({option.label}, {need:,} bytes of {tier}) found no rank with room left {where}"
        f"after the other tables ({have:,} bytes of {tier} in the cluster); add ranks or memory per rank"
        + (", or loosen its pins and keep-apart groups" if where else ""),
        table=option.table,
    )


def pack(chosen: Mapping[str, ShardingOption], cluster: ClusterSpec, rules: RankRules = RankRules()) -> Assignment:
    """Place the chosen options: spread ones first, then node-bound ones, then LPT for the rest.

    LPT: free shards in decreasing time (those with pins or keep-apart groups first), each onto
    the least-loaded rank with memory for it that its rules admit.
    """
    world, local = cluster.world_size, cluster.ranks_per_node
    work.tick(world + sum(len(o.shards) for o in chosen.values()))
    caps = rank_capacities(cluster)
    loads = RankLoads.empty(world)
    occupancy = Occupancy(rules)
    out = Assignment(choice=dict(chosen))
    by_kind: dict[Placement, list[ShardingOption]] = {p: [] for p in Placement}
    for option in chosen.values():
        by_kind[option.placement].append(option)

    def place(option: ShardingOption, ranks: list[int]) -> None:
        out.shard_ranks[option.table] = ranks
        loads.add(option, ranks)
        occupancy.add_shards(option.table, ranks)

    for option in by_kind[Placement.EVERY_RANK]:  # the constraints leave none that a rule would refuse
        place(option, list(range(world)))
    if np.any(loads.bytes > caps):
        worst = max(by_kind[Placement.EVERY_RANK], key=lambda o: o.shards[0].storage.of_tier(cluster.device_tier))
        raise _no_room(worst, cluster, rules)

    def node_order(option: ShardingOption) -> list[int]:
        totals = loads.ms.reshape(cluster.num_nodes, local).sum(axis=1)
        return sorted(range(cluster.num_nodes), key=lambda n: (totals[n], n))

    for option in sorted(by_kind[Placement.NODE_RANKS], key=lambda o: (-o.total_ms, o.table)):
        def fits(node: int) -> bool:
            return all(_fits(loads, caps, r, _shard_bytes(option, i)) and occupancy.admits(option.table, r)
                       for i, r in enumerate(option.ranks_on_nodes([node], local)))

        ranks = on_nodes(option, node_order(option), fits, local)
        if ranks is None:
            raise _no_room(option, cluster, rules)
        place(option, ranks)

    for option in sorted(by_kind[Placement.ONE_NODE], key=lambda o: (-o.total_ms, o.table)):
        for node in node_order(option):
            node_ranks = [r for r in range(node * local, (node + 1) * local) if occupancy.admits(option.table, r)]
            ranks = lpt_into(option, node_ranks, loads, caps) if node_ranks else None
            if ranks is not None:
                place(option, ranks)
                break
        else:
            raise _no_room(option, cluster, rules)

    free = [(option, i) for option in by_kind[Placement.ANY_RANK] for i in range(len(option.shards))]
    by_time = sorted(free, key=lambda item: (not rules.restricts(item[0].table), -item[0].shard_ms_list[item[1]], item[0].table, item[1]))
    placed, stuck = _least_loaded_with_room(by_time, loads, caps, occupancy)
    if placed is None:  # time order strands big shards when memory is tight: largest (relative to room) first
        by_size = sorted(free, key=lambda item: (not rules.restricts(item[0].table),
                                                 -float(np.max(_shard_bytes(*item) / np.maximum(caps, 1))), item[0].table, item[1]))
        placed, _ = _least_loaded_with_room(by_size, loads, caps, occupancy)
    if placed is None:
        raise _no_room(stuck, cluster, rules)
    for option in by_kind[Placement.ANY_RANK]:
        out.shard_ranks[option.table] = [-1] * len(option.shards)
    for (option, i), rank in placed:
        out.shard_ranks[option.table][i] = rank
    return out


def _least_loaded_with_room(
    order: list[tuple[ShardingOption, int]], loads: RankLoads, caps: np.ndarray, occupancy: Occupancy
) -> tuple[list[tuple[tuple[ShardingOption, int], int]] | None, ShardingOption | None]:
    """Each shard in `order` onto the least-loaded rank with memory for it that `occupancy`
    admits (its pins, its keep-apart groups as placed so far), updating `loads`. Returns the
    placements, or (None, the option that found no room) leaving `loads` as it was."""
    # Python numbers, not arrays: a shard's check is three comparisons, which numpy makes slower
    ms, used, room = loads.ms.tolist(), loads.bytes.tolist(), caps.tolist()
    scratch = occupancy.copy()
    ruled = bool(occupancy.rules)  # without pins or keep-apart groups every rank admits every shard
    heap = [(ms[r], r) for r in range(len(ms))]
    heapq.heapify(heap)
    placed = []
    for option, i in order:
        need = option.shard_bytes_list[i]
        skipped = []
        while heap:
            _, rank = heapq.heappop(heap)
            if all(u + n <= c for u, n, c in zip(used[rank], need, room)) and (not ruled or scratch.admits(option.table, rank)):
                break
            skipped.append((ms[rank], rank))
        else:
            return None, option
        placed.append(((option, i), rank))
        if ruled:
            scratch.add(option.table, rank)
        ms[rank] += option.shard_ms_list[i]
        used[rank] = [u + n for u, n in zip(used[rank], need)]
        heapq.heappush(heap, (ms[rank], rank))
        for entry in skipped:
            heapq.heappush(heap, entry)
    loads.ms[:], loads.bytes[:] = ms, used
    return placed, None


def lpt_into(option: ShardingOption, ranks: list[int], loads: RankLoads, caps: np.ndarray) -> list[int] | None:
    """LPT of one option's shards over `ranks` (on a scratch copy); None if they do not fit."""
    ms = {r: loads.ms[r] for r in ranks}
    used = {r: loads.bytes[r].copy() for r in ranks}
    placed = [-1] * len(option.shards)
    order = sorted(range(len(option.shards)), key=lambda i: -option.shards[i].perf.total_ms)
    for i in order:
        need = _shard_bytes(option, i)
        for r in sorted(ranks, key=lambda r: (ms[r], r)):
            if (used[r] + need <= caps).all():
                placed[i] = r
                ms[r] += option.shards[i].perf.total_ms
                used[r] += need
                break
        else:
            return None
    return placed


def on_nodes(option: ShardingOption, nodes: Sequence[int], fits: Callable[[int], bool], local: int) -> list[int] | None:
    """A node-ranks option's ranks on the first of `nodes` where its row blocks `fits` (one node
    per column block, the blocks alike, in node order), or None if too few do."""
    taken = list(itertools.islice((n for n in nodes if fits(n)), option.nodes_taken))
    return option.ranks_on_nodes(sorted(taken), local) if len(taken) == option.nodes_taken else None


def place_one(option: ShardingOption, loads: RankLoads, caps: np.ndarray, cluster: ClusterSpec,
              admits: Callable[[int], bool] = lambda rank: True) -> list[int] | None:
    """Ranks for one table's `option` given the other tables' `loads`, as `pack` places them (every
    rank, one node's ranks, or LPT onto the least-loaded rank with room), on ranks `admits`
    allows; None if it does not fit."""
    world, local = cluster.world_size, cluster.ranks_per_node
    if option.placement is Placement.EVERY_RANK:
        ranks = list(range(world))
        return ranks if np.all(loads.bytes[ranks] + option.shard_bytes <= caps) and all(map(admits, ranks)) else None
    nodes = sorted(range(cluster.num_nodes), key=lambda n: (loads.ms[n * local:(n + 1) * local].sum(), n))
    if option.placement is Placement.NODE_RANKS:
        def fits(node: int) -> bool:
            ranks = option.ranks_on_nodes([node], local)
            return bool(np.all(loads.bytes[ranks] + option.shard_bytes[:len(ranks)] <= caps)) and all(map(admits, ranks))

        return on_nodes(option, nodes, fits, local)
    if option.placement is Placement.ONE_NODE:
        for node in nodes:
            node_ranks = [r for r in range(node * local, (node + 1) * local) if admits(r)]
            ranks = lpt_into(option, node_ranks, loads, caps) if node_ranks else None
            if ranks is not None:
                return ranks
        return None
    ranks = [r for r in range(world) if admits(r)]
    return lpt_into(option, ranks, loads, caps) if ranks else None


def local_search(assignment: Assignment, cluster: ClusterSpec, rules: RankRules = RankRules(), max_rounds: int = 2000) -> Assignment:
    """Move or swap free (any-rank) shards off the busiest rank while that lowers it."""
    moves = _FreeShardMoves(assignment, cluster, rules)
    loads, world = moves.loads, cluster.world_size
    for _ in range(max_rounds):
        work.tick(world)  # the ranks sorted by load
        top = int(np.argmax(loads.ms))
        dsts = [int(d) for d in np.argsort(loads.ms, kind="stable")[: min(world, 16)] if d != top]
        hopeful = None  # once the least loaded rank took nothing: the ranks where best() may find something
        for dst in dsts:
            if hopeful is not None and dst not in hopeful:  # best() would weigh its candidates and find none
                work.tick(moves.candidates(top, dst))
                continue
            best = moves.best(top, dst)
            if best is not None:
                a, b = best
                moves.relocate(a, top, dst)
                if b is not None:
                    moves.relocate(b, dst, top)
                break
            if hopeful is None:
                hopeful = moves.hopeful(top, dsts[1:])
        else:
            break
    return assignment


class _FreeShardMoves:
    """The free shards on each rank, and the moves and swaps of them between two ranks."""

    def __init__(self, assignment: Assignment, cluster: ClusterSpec, rules: RankRules) -> None:
        self.assignment = assignment
        self.caps = rank_capacities(cluster)
        self.loads = RankLoads.of(assignment, cluster.world_size)
        self.occupancy = rules.occupancy(assignment.shard_ranks)
        self.free_on: dict[int, list[tuple[str, int]]] = {r: [] for r in range(cluster.world_size)}
        self.ms: dict[tuple[str, int], float] = {}  # each free shard's time, looked up on every search step
        for table, option in assignment.choice.items():
            if option.placement is Placement.ANY_RANK:
                for i, (r, ms) in enumerate(zip(assignment.shard_ranks[table], option.shard_ms.tolist())):
                    self.free_on[r].append((table, i))
                    self.ms[table, i] = ms

    def need(self, item: tuple[str, int]) -> np.ndarray:
        return _shard_bytes(self.assignment.choice[item[0]], item[1])

    def relocate(self, item: tuple[str, int], src: int, dst: int) -> None:
        c, need = self.ms[item], self.need(item)
        self.loads.ms[src] -= c
        self.loads.ms[dst] += c
        self.loads.bytes[src] -= need
        self.loads.bytes[dst] += need
        self.free_on[src].remove(item)
        self.free_on[dst].append(item)
        self.occupancy.add(item[0], src, -1)
        self.occupancy.add(item[0], dst)
        self.assignment.shard_ranks[item[0]][item[1]] = dst

    def candidates(self, top: int, dst: int) -> int:
        """The moves and swaps between `top` and `dst` that best() weighs (its counted work)."""
        return 1 + len(self.free_on[top]) * (1 + len(self.free_on[dst]))

    def hopeful(self, top: int, dsts: list[int]) -> set[int]:
        """The ranks among `dsts` with a move or swap that would lower `top`, priced as best()
        prices them before room and rules, all at once: best() finds nothing on the others (at a
        local optimum, a round called it for each of up to 15 ranks, a few array operations each)."""
        loads = self.loads.ms
        peak = loads[top]
        top_ms = np.fromiter(map(self.ms.__getitem__, self.free_on[top]), float, len(self.free_on[top]))[:, None]
        low = loads[dsts][None, :]
        moving = (_move_gain(peak, low, top_ms) > 1e-12).any(axis=0)
        found = {d for d, yes in zip(dsts, moving.tolist()) if yes}
        rest = [(d, item) for d in dsts if d not in found for item in self.free_on[d]]
        if rest and len(top_ms):
            low = loads[[d for d, _ in rest]][None, :]
            delta = top_ms - np.fromiter((self.ms[item] for _, item in rest), float, len(rest))[None, :]
            found.update(d for (d, _), yes in zip(rest, (_swap_gain(peak, low, delta) > 1e-12).any(axis=0).tolist()) if yes)
        return found

    def best(self, top: int, dst: int) -> tuple | None:
        """The move (shard, None) or swap (shard, shard) between the busiest rank `top` and
        `dst` that lowers `top` most, or None: the first in order (moves, then swaps row by row)
        to beat the best before it by more than 1e-12 and fit. Gains are priced as arrays, and
        only the candidates that would beat the best so far are checked for room and rules."""
        loads, caps = self.loads, self.caps
        peak, low = loads.ms[top], loads.ms[dst]
        on_top, on_dst = self.free_on[top], self.free_on[dst]
        work.tick(self.candidates(top, dst))
        top_ms = np.fromiter(map(self.ms.__getitem__, on_top), float, len(on_top))
        best, best_gain = None, 0.0
        move_gain = _move_gain(peak, low, top_ms)
        for k in _improving(move_gain, best_gain):
            if move_gain[k] > best_gain + 1e-12:
                item = on_top[k]
                if _fits(loads, caps, dst, self.need(item)) and self.occupancy.admits_move(item[0], top, dst):
                    best, best_gain = (item, None), float(move_gain[k])
        if not on_dst:
            return best
        dst_ms = np.fromiter(map(self.ms.__getitem__, on_dst), float, len(on_dst))
        delta = top_ms[:, None] - dst_ms[None, :]
        swap_gain = _swap_gain(peak, low, delta).ravel()
        for k in _improving(swap_gain, best_gain):
            if swap_gain[k] > best_gain + 1e-12:
                a, b = on_top[k // len(on_dst)], on_dst[k % len(on_dst)]
                need_a, need_b = self.need(a), self.need(b)
                if (np.all(loads.bytes[dst] - need_b + need_a <= caps) and np.all(loads.bytes[top] - need_a + need_b <= caps)
                        and self.occupancy.admits_swap(a[0], top, b[0], dst)):
                    best, best_gain = (a, b), float(swap_gain[k])
        return best


def _move_gain(peak: float, low, shard_ms: np.ndarray) -> np.ndarray:
    """How far the busiest rank (`peak`) falls when a shard moves to a rank at `low`: a move
    helps when the shard is smaller than the gap; best is half the gap."""
    return peak - np.maximum(peak - shard_ms, low + shard_ms)


def _swap_gain(peak: float, low, delta: np.ndarray) -> np.ndarray:
    """The same for swaps that move `delta` ms net off the busiest rank (-inf where none helps)."""
    return np.where((delta > 0) & (delta < peak - low), peak - np.maximum(peak - delta, low + delta), -np.inf)


def _improving(gains: np.ndarray, floor: float) -> np.ndarray:
    """Indices, in order, of the gains above `floor` by more than 1e-12: the only candidates a
    scan that keeps the first strict improvement can take (its best only rises)."""
    return np.flatnonzero(gains > floor + 1e-12)


def refine_by_splitting(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    chosen: dict[str, ShardingOption],
    cluster: ClusterSpec,
    deadline_s: float,
    rules: RankRules = RankRules(),
    work_until: int | None = None,
) -> Assignment:
    """Split only where it pays: while a table on the busiest rank can move to an option with
    smaller shards (the cheapest such) and the re-packed plan gets better, do so.

    A uniform shard-size cap splits every table alike; this mixes whole tables and split ones,
    which is what balances a few heavy tables on many ranks at little extra work. Fewer ranks
    at the peak counts as progress: one split rarely lowers the peak alone. Stops at `work_until`
    (planner.search.work), or at the wall-clock ceiling `deadline_s`.
    """
    best = local_search(pack(chosen, cluster, rules), cluster, rules)
    loads = RankLoads.of(best, cluster.world_size)
    best_score = _balance(loads.ms)[:2]
    while not work.stop(work_until, deadline_s, "splitting"):
        top = int(np.argmax(loads.ms))
        on_top = sorted(
            {t for t, ranks in best.shard_ranks.items() if top in ranks},
            key=lambda t: (-best.choice[t].max_shard_ms, t),
        )
        improved = False
        for table in on_top:
            current = best.choice[table]
            finer = [o for o in options_by_table[table] if o.max_shard_ms < current.max_shard_ms - 1e-12]
            if not finer:
                continue
            trial = _repacked(best.choice, table, min(finer, key=lambda o: (o.total_ms, len(o.shards))), cluster, rules)
            if trial is None:
                continue
            trial_loads = RankLoads.of(trial, cluster.world_size)
            trial_score = _balance(trial_loads.ms)[:2]
            if trial_score[0] < best_score[0] * (1 - 1e-9) or (
                trial_score[0] <= best_score[0] and trial_score[1] < best_score[1]
            ):
                best, loads, best_score, improved = trial, trial_loads, trial_score, True
                break
            if work.stop(work_until, deadline_s, "splitting"):
                break
        if not improved:
            break
    return best


def _repacked(choice: Mapping[str, ShardingOption], table: str, option: ShardingOption, cluster: ClusterSpec,
              rules: RankRules) -> Assignment | None:
    """The plan with `table` switched to `option`, every table packed again and locally
    searched; None when it does not fit."""
    trial_choice = dict(choice)
    trial_choice[table] = option
    work.tick(cluster.world_size)  # the trial's loads, summed again by its caller
    try:
        return local_search(pack(trial_choice, cluster, rules), cluster, rules)
    except InfeasiblePlanError:
        return None


def _balance(ms: np.ndarray) -> tuple[float, int, float]:
    """What option changes are judged by: the busiest rank, then how many ranks are at it, then
    the sum of squared loads, so that a change which evens out lighter ranks counts as progress
    (a lone change rarely lowers the peak; it makes room for the next one)."""
    peak = float(ms.max())
    return peak, int(np.sum(ms >= peak * (1 - 1e-9))), float(np.square(ms).sum())


def rechoose_options(
    options_by_table: Mapping[str, Sequence[ShardingOption]],
    assignment: Assignment,
    cluster: ClusterSpec,
    deadline_s: float,
    rules: RankRules = RankRules(),
    target_ms: float = 0.0,
    work_until: int | None = None,
) -> Assignment:
    """Hill climbing over options: one table at a time, each of its other options tried in a
    re-packed plan (pack, then local search), kept when the plan gets better by `_balance`;
    passes over the tables until one changes nothing or the busiest rank is at `target_ms`.

    The greedy choice takes one shard-size cap for all tables; the plans it cannot reach mix
    whole, split and replicated tables unevenly, which is what balances heavy tables on few
    ranks (26 MLPerf multi-hot tables on 16 ranks: 6.9% above the bound -> 4.4%). Re-packing
    every table, not only the changed one, is what finds them: placing the changed table alone
    on the others' loads stopped at 5.0%. Stops at `work_until` (planner.search.work), or at the
    wall-clock ceiling `deadline_s`.
    """
    world = cluster.world_size
    best = assignment
    best_score = _balance(RankLoads.of(best, world).ms)
    changed = True
    while changed:
        changed = False
        for table in sorted(best.choice):
            for option in options_by_table[table]:
                if best_score[0] <= target_ms or work.stop(work_until, deadline_s, "option hill climbing"):
                    return best
                if option is best.choice[table] or option.max_shard_ms >= best_score[0]:
                    continue
                trial = _repacked(best.choice, table, option, cluster, rules)
                if trial is None:
                    continue
                score = _balance(RankLoads.of(trial, world).ms)
                if score < best_score:
                    best, best_score, changed = trial, score, True
    return best

"""Co-located tables searched as one: a group's tables, each placed whole (table-wise), go to
one rank together, so the search sees one table whose options are the group's combinations.

A combination's time and bytes are its members' sums. Only combinations on the Pareto front
(no other as fast with as few bytes in every tier) are kept: a dominated one is never needed,
so the proven bound stays a bound. The front is capped at MAX_COMBINATIONS, evenly spread
in time, the fastest and the smallest always kept (with a handful of options per member it
stays far below the cap).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Sequence

import numpy as np

from planner.search.assignment import Assignment
from planner.spec.constraints import GroupRule
from planner.spec.placement_rules import RankRules
from planner.spec.types import Perf, ShardCost, ShardGeometry, ShardingOption, ShardingType, Storage

MAX_COMBINATIONS = 512


@dataclass(frozen=True)
class Colocated:
    """The search's view of the tables: each co-located group one table, and the way back."""

    options_by_table: dict[str, list[ShardingOption]]
    rules: RankRules
    groups: dict[str, tuple[str, ...]]  # group name -> its tables
    # id(group option) -> (the option, each member's option); the option is held so its id stays its own
    members: dict[int, tuple[ShardingOption, tuple[tuple[str, ShardingOption], ...]]]

    def tables_of(self, name: str) -> tuple[str, ...]:
        """The real tables behind a name of the search: a group's members, or the table itself."""
        return self.groups.get(name, (name,))

    def members_of(self, name: str, option: ShardingOption) -> tuple[tuple[str, ShardingOption], ...]:
        entry = self.members.get(id(option))
        return entry[1] if entry is not None else ((name, option),)

    def combine(self, name: str, combo: tuple[tuple[str, ShardingOption], ...]) -> ShardingOption:
        """Group `name`'s option of these member options (each whole, on one rank), on the front or not."""
        option = _combined(name, combo)
        self.members[id(option)] = (option, combo)
        return option

    def expand(self, assignment: Assignment) -> Assignment:
        """The assignment of the real tables: each member on its group's rank."""
        out = Assignment()
        for table, option in assignment.choice.items():
            for name, member in self.members_of(table, option):
                out.choice[name], out.shard_ranks[name] = member, list(assignment.shard_ranks[table])
        return out

    def grouped(self, assignment: Assignment) -> Assignment:
        """The search's view of an assignment of the real tables whose groups' members each
        sit whole on one rank: each group one table."""
        out = Assignment()
        in_group = {t for tables in self.groups.values() for t in tables}
        for table, option in assignment.choice.items():
            if table not in in_group:
                out.choice[table], out.shard_ranks[table] = option, list(assignment.shard_ranks[table])
        for name, tables in self.groups.items():
            out.choice[name] = self.combine(name, tuple((t, assignment.choice[t]) for t in tables))
            out.shard_ranks[name] = list(assignment.shard_ranks[tables[0]])
        return out


def group_name(group: GroupRule) -> str:
    return f"constraints.colocate[{group.index}]"


def colocate(options_by_table: Mapping[str, Sequence[ShardingOption]], groups: Sequence[GroupRule], rules: RankRules) -> Colocated:
    """Each group's tables replaced by one table of their combined options; the group may use
    the ranks all its members may, and is kept apart from what any member is kept apart from."""
    grouped = {t for g in groups for t in g.tables}
    out = {t: list(o) for t, o in options_by_table.items() if t not in grouped}
    allowed = {t: r for t, r in rules.allowed.items() if t not in grouped}
    apart = {t: g for t, g in rules.apart.items() if t not in grouped}
    members = {}
    for group in groups:
        name = group_name(group)
        combos = _front([[(t, o) for o in options_by_table[t]] for t in group.tables])
        out[name] = [_combined(name, combo) for combo in combos]
        members.update({id(option): (option, combo) for option, combo in zip(out[name], combos)})
        pins = [rules.allowed[t] for t in group.tables if t in rules.allowed]
        if pins:
            allowed[name] = frozenset.intersection(*pins)
        ids = sorted({g for t in group.tables for g in rules.apart.get(t, ())})
        if ids:
            apart[name] = tuple(ids)
    return Colocated(out, RankRules(allowed, apart), {group_name(g): tuple(g.tables) for g in groups}, members)


def _cost(combo) -> tuple[float, np.ndarray]:
    return sum(o.total_ms for _, o in combo), sum(o.shard_bytes[0] for _, o in combo)


def _front(per_member: list[list[tuple[str, ShardingOption]]]) -> list[tuple]:
    front: list[tuple] = [()]
    for choices in per_member:
        grown = [combo + (c,) for combo in front for c in choices]
        costs = [_cost(c) for c in grown]
        order = sorted(range(len(grown)), key=lambda i: (costs[i][0], tuple(costs[i][1])))
        kept: list[int] = []
        for i in order:  # by time: dominated if an earlier (faster) one needs no more of any tier
            if not any(np.all(costs[j][1] <= costs[i][1]) for j in kept):
                kept.append(i)
        if len(kept) > MAX_COMBINATIONS:
            smallest = min(kept, key=lambda i: (int(costs[i][1].sum()), costs[i][0]))
            picks = np.linspace(0, len(kept) - 1, MAX_COMBINATIONS - 1).round().astype(int)
            kept = sorted({kept[p] for p in picks} | {smallest}, key=order.index)
        front = [grown[i] for i in kept]
    return front


def _combined(name: str, combo) -> ShardingOption:
    perf, storage, shared = Perf(), Storage(), Perf()
    for _, option in combo:
        perf, storage = perf + option.shards[0].perf, storage + option.shards[0].storage
        shared = shared + option.every_rank
    first = combo[0][1]
    rows = sum(o.geometries[0].rows for _, o in combo)
    return replace(first, table=name, sharding_type=ShardingType.TABLE_WISE, geometries=(ShardGeometry(0, 0, rows, first.geometries[0].cols),),
                   shards=(ShardCost(perf, storage),), cache_fraction=min(o.cache_fraction for _, o in combo), every_rank=shared,
                   ranks_sharing=max(o.ranks_sharing for _, o in combo))

"""Where shards may go: the ranks each table may use, and the keep-apart groups it is in.

Every placing step of the search (greedy packing, local search, the CP-SAT models, repair)
asks these rules before it puts a shard on a rank, so a plan from any path honours pins and
keep-apart groups. A keep-apart group means no rank holds shards of two of its tables; a
table's own shards may share a rank.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping


@dataclass(frozen=True)
class RankRules:
    allowed: Mapping[str, frozenset[int]] = field(default_factory=dict)  # table -> its ranks; absent: any
    apart: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # table -> its keep-apart groups

    def __bool__(self) -> bool:
        return bool(self.allowed or self.apart)

    def restricts(self, table: str) -> bool:
        return table in self.allowed or table in self.apart

    def may_use(self, table: str, rank: int) -> bool:
        ranks = self.allowed.get(table)
        return ranks is None or rank in ranks

    def members(self) -> dict[int, list[str]]:
        """Each keep-apart group's tables."""
        groups: dict[int, list[str]] = {}
        for table, ids in self.apart.items():
            for g in ids:
                groups.setdefault(g, []).append(table)
        return groups

    def occupancy(self, shard_ranks: Mapping[str, Iterable[int]]) -> Occupancy:
        occupancy = Occupancy(self)
        for table, ranks in shard_ranks.items():
            occupancy.add_shards(table, ranks)
        return occupancy


class Occupancy:
    """Which keep-apart tables hold shards on each rank, as shards are placed and moved."""

    def __init__(self, rules: RankRules) -> None:
        self.rules = rules
        self.count: Counter[tuple[int, int, str]] = Counter()  # (group, rank, table) -> shards
        self.holder: dict[tuple[int, int], set[str]] = {}

    def add_shards(self, table: str, ranks: Iterable[int]) -> None:
        if table in self.rules.apart:  # a table in no keep-apart group changes nothing here
            for rank in ranks:
                self.add(table, rank)

    def add(self, table: str, rank: int, sign: int = 1) -> None:
        for g in self.rules.apart.get(table, ()):
            key = (g, rank, table)
            self.count[key] += sign
            holders = self.holder.setdefault((g, rank), set())
            if self.count[key] > 0:
                holders.add(table)
            else:
                holders.discard(table)
                del self.count[key]

    def copy(self) -> Occupancy:
        other = Occupancy(self.rules)
        other.count, other.holder = self.count.copy(), {k: set(v) for k, v in self.holder.items()}
        return other

    def admits(self, table: str, rank: int) -> bool:
        """Whether `table` may put a shard on `rank`: a rank it may use, and no other table of
        one of its keep-apart groups there."""
        if not self.rules.may_use(table, rank):
            return False
        return all(self.holder.get((g, rank), set()) <= {table} for g in self.rules.apart.get(table, ()))

    def admits_move(self, table: str, src: int, dst: int) -> bool:
        """Whether a shard of `table` may go from `src` to `dst`."""
        self.add(table, src, -1)
        ok = self.admits(table, dst)
        self.add(table, src)
        return ok

    def admits_swap(self, a: str, src: int, b: str, dst: int) -> bool:
        """Whether `a` may go from `src` to `dst` while `b` goes from `dst` to `src`."""
        self.add(a, src, -1)
        self.add(b, dst, -1)
        ok = self.admits(a, dst) and self.admits(b, src)
        self.add(a, src)
        self.add(b, dst)
        return ok

    def admitting(self, table: str) -> Callable[[int], bool]:
        return lambda rank: self.admits(table, rank)

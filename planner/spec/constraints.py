"""Constraints a user puts on the plan (the config's `constraints:` section).

Per table, by name or glob pattern: the schemes, kernels and tiers it may use, its most
shards, and the ranks or nodes it is pinned to; groups of tables co-located (placed whole on
one rank together) or kept apart (no rank holds shards of two of them); per rank, memory
reserved for what the planner does not place (dense parameters, activations, as TorchRec's
storage reservation does).

What a rule says of an option alone (scheme, kernel, tier, shard count, and whether its
placement can keep to a pin or a group) removes options before the search, so every solver
path and every bound (computed from the options left) honour it. Where shards may go is
`RankRules`, asked by every placing step; a co-located group is searched as one table
(`planner.search.colocation`); a reserve lowers each rank's capacity once.

An infeasible set is named by its smallest conflicting subset: the fewest rules that together
leave some table (or a keep-apart group) no option.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field
from typing import Any, Sequence

from planner.spec.errors import ConfigError, InfeasiblePlanError
from planner.spec.schemes import COLUMN_SCHEMES, KERNELS
from planner.spec.specs import GIB, MAX_COUNT, check_keys, short_repr
from planner.spec.placement_rules import RankRules
from planner.spec.types import TIERS, Placement, ShardingOption, ShardingType

RULE_KEYS = ("match", "schemes", "kernels", "tiers", "max_shards", "min_shard_cols", "cache_load_factors", "ranks", "nodes")
SECTION_KEYS = ("tables", "colocate", "apart", "reserve_gib_per_rank")
RESERVE_KEY = "reserve_gib_per_rank"


def _names(value: Any, allowed: Sequence[str], where: str, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or any(v not in allowed for v in value):
        raise ConfigError(f"{where}: {key} must be a list of {', '.join(allowed)}; got {short_repr(value)}")
    return tuple(value)


def _indices(value: Any, limit: int, where: str, key: str, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        value = [value]
    if (not isinstance(value, list) or not value
            or any(not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < limit for v in value)):
        raise ConfigError(f"{where}: {key} must be a list of {what} numbers 0..{limit - 1}; got {short_repr(value)}")
    return tuple(sorted(set(value)))


@dataclass(frozen=True)
class Shape:
    """The cluster's shape, which pins are read against."""

    world_size: int
    ranks_per_node: int


@dataclass(frozen=True)
class TableRule:
    """What the tables whose names match `match` (a name or glob) may use; None: anything.
    `ranks` is the pin (given as ranks or as nodes, whose ranks it then holds)."""

    match: str
    schemes: tuple[str, ...] | None = None
    kernels: tuple[str, ...] | None = None
    tiers: tuple[str, ...] | None = None
    max_shards: int | None = None
    min_shard_cols: int | None = None  # a column-split shard's least width (TorchRec's min_partition)
    cache_load_factors: tuple[float, ...] | None = None  # a cached option's cache share (TorchRec's cache_params.load_factor)
    ranks: frozenset[int] | None = None
    pinned_as: str = ""  # how the config gave the pin, to name it: "ranks 0/1" or "nodes 1"
    shape: Shape | None = None
    index: int = 0  # its place in the config, to name it

    @classmethod
    def parse(cls, entry: Any, index: int, shape: Shape) -> TableRule:
        where = f"constraints: tables[{index}]"
        if not isinstance(entry, dict):
            raise ConfigError(f"{where} must be a mapping with 'match' and what the tables may use")
        check_keys(entry, RULE_KEYS, where)
        match = entry.get("match")
        if not isinstance(match, str) or not match:
            raise ConfigError(f"{where}: match must be a table name or a glob pattern such as 'cat_*'")
        max_shards = entry.get("max_shards")
        if max_shards is not None and (not isinstance(max_shards, int) or isinstance(max_shards, bool) or not 1 <= max_shards <= MAX_COUNT):
            raise ConfigError(f"{where}: max_shards must be a positive integer, got {short_repr(max_shards)}")
        min_cols = entry.get("min_shard_cols")
        if min_cols is not None and (not isinstance(min_cols, int) or isinstance(min_cols, bool) or not 1 <= min_cols <= MAX_COUNT):
            raise ConfigError(f"{where}: min_shard_cols must be a positive integer, got {short_repr(min_cols)}")
        factors = entry.get("cache_load_factors")
        if factors is not None:
            factors = [factors] if isinstance(factors, (int, float)) and not isinstance(factors, bool) else factors
            if (not isinstance(factors, list) or not factors
                    or any(not isinstance(f, (int, float)) or isinstance(f, bool) or not 0 < f < 1 for f in factors)):
                raise ConfigError(f"{where}: cache_load_factors must be a list of fractions in (0, 1), got {short_repr(entry['cache_load_factors'])}")
            factors = tuple(float(f) for f in factors)
        if entry.get("ranks") is not None and entry.get("nodes") is not None:
            raise ConfigError(f"{where}: give ranks or nodes, not both")
        ranks = _indices(entry.get("ranks"), shape.world_size, where, "ranks", "rank")
        nodes = _indices(entry.get("nodes"), shape.world_size // shape.ranks_per_node, where, "nodes", "node")
        pinned_as = f"ranks {'/'.join(map(str, ranks))}" if ranks else ""
        if nodes is not None:
            ranks = tuple(n * shape.ranks_per_node + i for n in nodes for i in range(shape.ranks_per_node))
            pinned_as = f"nodes {'/'.join(map(str, nodes))}"
        rule = cls(match, _names(entry.get("schemes"), [s.value for s in ShardingType], where, "schemes"),
                   _names(entry.get("kernels"), KERNELS, where, "kernels"), _names(entry.get("tiers"), TIERS, where, "tiers"),
                   max_shards, min_cols, factors, frozenset(ranks) if ranks is not None else None, pinned_as, shape, index)
        if all(v is None for v in (rule.schemes, rule.kernels, rule.tiers, max_shards, min_cols, factors, ranks)):
            raise ConfigError(f"{where}: constrains nothing; give schemes, kernels, tiers, max_shards, min_shard_cols, "
                              f"cache_load_factors, ranks or nodes")
        return rule

    def applies_to(self, table: str) -> bool:
        return fnmatch.fnmatchcase(table, self.match)

    def allows(self, option: ShardingOption) -> bool:
        return ((self.schemes is None or option.sharding_type.value in self.schemes)
                and (self.kernels is None or option.compute_kernel in self.kernels)
                and (self.tiers is None or option.tier in self.tiers)
                and (self.max_shards is None or len(option.shards) <= self.max_shards)
                and (self.min_shard_cols is None or option.sharding_type not in COLUMN_SCHEMES
                     or all(g.cols >= self.min_shard_cols for g in option.geometries))
                and (self.cache_load_factors is None or option.cache_fraction >= 1.0
                     or any(abs(option.cache_fraction - f) < 1e-9 for f in self.cache_load_factors))
                and self._pin_allows(option))

    def _pin_allows(self, option: ShardingOption) -> bool:
        """Whether the option's placement can keep to the pinned ranks: a row-wise or
        data-parallel table is on every rank, a table-row-wise one on a node's first ranks, a
        grid on as many nodes' as it has column blocks."""
        if self.ranks is None or option.placement in (Placement.ANY_RANK, Placement.ONE_NODE):
            return True
        if option.placement is Placement.EVERY_RANK:
            return len(self.ranks) == self.shape.world_size
        local = self.shape.ranks_per_node
        usable = [n for n in range(self.shape.world_size // local) if set(option.ranks_on_nodes([n], local)) <= self.ranks]
        return len(usable) >= option.nodes_taken

    def describe(self) -> str:
        parts = [f"{k} {'/'.join(map(str, v)) if isinstance(v, tuple) else v}"
                 for k in ("schemes", "kernels", "tiers", "max_shards", "min_shard_cols", "cache_load_factors")
                 if (v := getattr(self, k)) is not None]
        return f"constraints.tables[{self.index}] ({self.match!r}: {', '.join(parts + ([self.pinned_as] if self.pinned_as else []))})"


@dataclass(frozen=True)
class GroupRule:
    """Tables co-located (each placed whole, table-wise, all on one rank) or kept apart (no
    rank holds shards of two of them, so none is row-wise or data-parallel)."""

    kind: str  # "colocate" or "apart"
    patterns: tuple[str, ...]
    tables: tuple[str, ...]  # the names the patterns match, in the config's table order
    index: int

    @classmethod
    def parse(cls, kind: str, entry: Any, index: int, table_names: Sequence[str]) -> GroupRule:
        where = f"constraints: {kind}[{index}]"
        if isinstance(entry, str):
            entry = [entry]
        if not isinstance(entry, list) or not entry or any(not isinstance(p, str) or not p for p in entry):
            raise ConfigError(f"{where} must be a list of table names or glob patterns, such as [cat_0, cat_1]; got {short_repr(entry)}")
        for pattern in entry:
            if not any(fnmatch.fnmatchcase(name, pattern) for name in table_names):
                raise ConfigError(f"{where}: {pattern!r} matches no table; check the name or pattern")
        tables = tuple(n for n in table_names if any(fnmatch.fnmatchcase(n, p) for p in entry))
        if len(tables) < 2:
            raise ConfigError(f"{where} names one table ({tables[0]!r}); a group needs at least two")
        return cls(kind, tuple(entry), tables, index)

    def applies_to(self, table: str) -> bool:
        return table in self.tables

    def allows(self, option: ShardingOption) -> bool:
        if self.kind == "colocate":
            return option.placement is Placement.ANY_RANK and len(option.shards) == 1
        return option.placement is not Placement.EVERY_RANK

    def describe(self) -> str:
        how = "placed whole on one rank together" if self.kind == "colocate" else "no rank holding two of them"
        return f"constraints.{self.kind}[{self.index}] ({', '.join(self.patterns)}: {how})"


Rule = TableRule | GroupRule


@dataclass(frozen=True)
class Constraints:
    rules: tuple[TableRule, ...] = ()
    reserve_bytes_per_rank: dict[str, int] = field(default_factory=dict)  # tier -> bytes kept free on each rank
    colocate: tuple[GroupRule, ...] = ()
    apart: tuple[GroupRule, ...] = ()
    shape: Shape = Shape(1, 1)

    @classmethod
    def parse(cls, section: Any, table_names: Sequence[str], shape: Shape) -> Constraints:
        if section is None:
            return cls(shape=shape)
        if not isinstance(section, dict):
            raise ConfigError(f"constraints must be a mapping with any of {', '.join(SECTION_KEYS)}")
        check_keys(section, SECTION_KEYS, "constraints")
        rules = tuple(TableRule.parse(entry, i, shape) for i, entry in enumerate(_entries(section, "tables", "rules")))
        for rule in rules:
            if not any(rule.applies_to(name) for name in table_names):
                raise ConfigError(f"constraints: tables[{rule.index}]: {rule.match!r} matches no table; check the name or pattern")
        groups = {kind: tuple(GroupRule.parse(kind, entry, i, table_names) for i, entry in enumerate(_entries(section, kind, "groups")))
                  for kind in ("colocate", "apart")}
        _check_groups(groups["colocate"], groups["apart"])
        return cls(rules, _reserve(section.get(RESERVE_KEY)), groups["colocate"], groups["apart"], shape)

    def rules_for(self, table: str) -> list[Rule]:
        return [r for r in (*self.rules, *self.colocate, *self.apart) if r.applies_to(table)]

    def forbidding(self, table: str, option: ShardingOption) -> Rule | None:
        """The first rule on `table` that forbids `option`, or None."""
        return next((r for r in self.rules_for(table) if not r.allows(option)), None)

    def names_scheme(self, table: str, scheme: str) -> bool:
        """Whether a rule on `table` lists `scheme` among the schemes it allows: asked for by name."""
        return any(r.schemes is not None and scheme in r.schemes for r in self.rules if r.applies_to(table))

    def excludes_tier(self, table: str, tier: str) -> bool:
        return any(r.tiers is not None and tier not in r.tiers for r in self.rules if r.applies_to(table))

    def allowed(self, table: str, options: list[ShardingOption]) -> list[ShardingOption]:
        """The options of `table` that every rule on it allows; when none is left, one line
        naming the smallest set of rules that removes them all."""
        rules = self.rules_for(table)
        allowed = [o for o in options if all(r.allows(o) for r in rules)]
        if options and not allowed:
            conflict = smallest_conflict(rules, options)
            raise InfeasiblePlanError(
                f"table '{table}' has no option left under {' and '.join(r.describe() for r in conflict)}; "
                f"loosen {'it' if len(conflict) == 1 else 'one of them'} (its options that fit: "
                f"{', '.join(sorted({o.label for o in options})[:6])})"
            )
        return allowed

    def pinned_ranks(self, table: str) -> tuple[frozenset[int] | None, list[TableRule]]:
        """The ranks `table` may use (None: any), and the rules that pin it."""
        pins = [r for r in self.rules if r.ranks is not None and r.applies_to(table)]
        return (frozenset.intersection(*(r.ranks for r in pins)) if pins else None), pins

    def rank_rules(self, table_names: Sequence[str]) -> RankRules:
        """Where each table's shards may go; one line when a table's pins share no rank, nor
        the pins of a co-located group's tables, or a keep-apart group has more tables than
        its ranks."""
        allowed = {}
        for table in table_names:
            ranks, pins = self.pinned_ranks(table)
            if ranks is not None and not ranks:
                raise InfeasiblePlanError(f"table '{table}' has no rank left under {' and '.join(r.describe() for r in pins)}; "
                                          "loosen one of them")
            if ranks is not None:
                allowed[table] = ranks
        for group in self.colocate:
            pins = [r for t in group.tables for r in self.pinned_ranks(t)[1]]
            if pins and not frozenset.intersection(*(allowed[t] for t in group.tables if t in allowed)):
                named = " and ".join(dict.fromkeys(r.describe() for r in [group, *pins]))
                raise InfeasiblePlanError(f"the tables of constraints.colocate[{group.index}] share no rank under {named}; "
                                          "loosen one of them")
        apart: dict[str, tuple[int, ...]] = {}
        for group in self.apart:
            for table in group.tables:
                apart[table] = apart.get(table, ()) + (group.index,)
            _check_room_apart(group, allowed, self)
        return RankRules(allowed, apart)


def _entries(section: dict, key: str, what: str) -> list:
    entries = section.get(key) or []
    if not isinstance(entries, list):
        raise ConfigError(f"constraints: {key} must be a list of {what}")
    return entries


def _check_groups(colocate: tuple[GroupRule, ...], apart: tuple[GroupRule, ...]) -> None:
    """A table in two co-located groups (which would join them: the user merges them, so the
    config says what it means), or two tables both co-located and kept apart: one line."""
    owner: dict[str, GroupRule] = {}
    for group in colocate:
        for table in group.tables:
            if table in owner:
                raise ConfigError(f"constraints: colocate[{group.index}]: '{table}' is in colocate[{owner[table].index}] "
                                  "too; merge the two groups into one")
            owner[table] = group
    for group in apart:
        for i, a in enumerate(group.tables):
            for b in group.tables[i + 1:]:
                if a in owner and owner[a] is owner.get(b):
                    raise ConfigError(f"constraints: apart[{group.index}] keeps '{a}' and '{b}' apart but "
                                      f"colocate[{owner[a].index}] puts them together; drop one of the two")


def _check_room_apart(group: GroupRule, allowed: dict[str, frozenset[int]], constraints: Constraints) -> None:
    """A keep-apart group needs a rank of its own for each table, within their pins."""
    ranks = set().union(*(allowed.get(t, range(constraints.shape.world_size)) for t in group.tables))
    if len(ranks) < len(group.tables):
        pins = [r for t in group.tables for r in constraints.pinned_ranks(t)[1]]
        named = " and ".join(dict.fromkeys(r.describe() for r in [group, *pins]))
        raise InfeasiblePlanError(f"{len(group.tables)} tables kept apart have {len(ranks)} ranks between them under {named}; "
                                  "loosen one of them or add ranks")


def smallest_conflict(rules: list[Rule], options: list[ShardingOption]) -> tuple[Rule, ...]:
    """The fewest of `rules` that together allow none of `options` (rules on one table are few)."""
    for size in range(1, len(rules) + 1):
        for subset in itertools.combinations(rules, size):
            if not any(all(r.allows(o) for r in subset) for o in options):
                return subset
    return tuple(rules)


def _reserve(value: Any) -> dict[str, int]:
    if value is None:
        return {}
    where = f"constraints: {RESERVE_KEY}"
    if not isinstance(value, dict) or any(k not in TIERS for k in value):
        raise ConfigError(f"{where} must map tiers ({', '.join(TIERS)}) to GiB, got {short_repr(value)}")
    out = {}
    for tier, gib in value.items():
        if not isinstance(gib, (int, float)) or isinstance(gib, bool) or not 0 <= gib <= MAX_COUNT:
            raise ConfigError(f"{where}: {tier} must be a non-negative number of GiB, got {short_repr(gib)}")
        out[tier] = int(gib * GIB)
    return out

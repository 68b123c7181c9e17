"""Constraints a user puts on the plan (the config's `constraints:` section).

Per table, by name or glob pattern: the schemes, kernels and tiers it may use and its most
shards; per rank, memory reserved for what the planner does not place (dense parameters,
activations, as TorchRec's storage reservation does). Table rules remove options before the
search, so every solver path and every bound (which are computed from the options left) honour
them; a reserve lowers each rank's capacity, which every path and the final capacity check use.

An infeasible set is named by its smallest conflicting subset: the fewest rules that together
leave some table no option.
"""

from __future__ import annotations

import fnmatch
import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from planner.errors import ConfigError, InfeasiblePlanError
from planner.schemes import KERNELS
from planner.specs import GIB, MAX_COUNT, PlanningProblem, check_keys, short_repr
from planner.types import TIERS, ShardingOption, ShardingType

RULE_KEYS = ("match", "schemes", "kernels", "tiers", "max_shards")
RESERVE_KEY = "reserve_gib_per_rank"


def _names(value: Any, allowed: Sequence[str], where: str, key: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or any(v not in allowed for v in value):
        raise ConfigError(f"{where}: {key} must be a list of {', '.join(allowed)}; got {short_repr(value)}")
    return tuple(value)


@dataclass(frozen=True)
class TableRule:
    """What the tables whose names match `match` (a name or glob) may use; None: anything."""

    match: str
    schemes: tuple[str, ...] | None = None
    kernels: tuple[str, ...] | None = None
    tiers: tuple[str, ...] | None = None
    max_shards: int | None = None
    index: int = 0  # its place in the config, to name it

    @classmethod
    def parse(cls, entry: Any, index: int) -> TableRule:
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
        rule = cls(match, _names(entry.get("schemes"), [s.value for s in ShardingType], where, "schemes"),
                   _names(entry.get("kernels"), KERNELS, where, "kernels"), _names(entry.get("tiers"), TIERS, where, "tiers"),
                   max_shards, index)
        if rule.schemes is None and rule.kernels is None and rule.tiers is None and max_shards is None:
            raise ConfigError(f"{where}: constrains nothing; give schemes, kernels, tiers or max_shards")
        return rule

    def applies_to(self, table: str) -> bool:
        return fnmatch.fnmatchcase(table, self.match)

    def allows(self, option: ShardingOption) -> bool:
        return ((self.schemes is None or option.sharding_type.value in self.schemes)
                and (self.kernels is None or option.compute_kernel in self.kernels)
                and (self.tiers is None or option.tier in self.tiers)
                and (self.max_shards is None or len(option.shards) <= self.max_shards))

    def describe(self) -> str:
        parts = [f"{k} {'/'.join(v) if isinstance(v, tuple) else v}" for k in ("schemes", "kernels", "tiers", "max_shards")
                 if (v := getattr(self, k)) is not None]
        return f"constraints.tables[{self.index}] ({self.match!r}: {', '.join(parts)})"


@dataclass(frozen=True)
class Constraints:
    rules: tuple[TableRule, ...] = ()
    reserve_bytes_per_rank: dict[str, int] = field(default_factory=dict)  # tier -> bytes kept free on each rank

    @classmethod
    def parse(cls, section: Any, table_names: Sequence[str]) -> Constraints:
        if section is None:
            return cls()
        if not isinstance(section, dict):
            raise ConfigError("constraints must be a mapping with 'tables' and/or 'reserve_gib_per_rank'")
        check_keys(section, ("tables", RESERVE_KEY), "constraints")
        entries = section.get("tables") or []
        if not isinstance(entries, list):
            raise ConfigError("constraints: tables must be a list of rules")
        rules = tuple(TableRule.parse(entry, i) for i, entry in enumerate(entries))
        for rule in rules:
            if not any(rule.applies_to(name) for name in table_names):
                raise ConfigError(f"constraints: tables[{rule.index}]: {rule.match!r} matches no table; check the name or pattern")
        return cls(rules, _reserve(section.get(RESERVE_KEY)))

    def rules_for(self, table: str) -> list[TableRule]:
        return [r for r in self.rules if r.applies_to(table)]

    def forbidding(self, table: str, option: ShardingOption) -> TableRule | None:
        """The first rule on `table` that forbids `option`, or None."""
        return next((r for r in self.rules_for(table) if not r.allows(option)), None)

    def excludes_tier(self, table: str, tier: str) -> bool:
        return any(r.tiers is not None and tier not in r.tiers for r in self.rules_for(table))

    def allowed(self, table: str, options: list[ShardingOption]) -> list[ShardingOption]:
        """The options of `table` that every rule on it allows; when none is left, one line
        naming the smallest set of rules that removes them all."""
        rules = self.rules_for(table)
        kept = [o for o in options if all(r.allows(o) for r in rules)]
        if options and not kept:
            conflict = smallest_conflict(rules, options)
            raise InfeasiblePlanError(
                f"table '{table}' has no option left under {' and '.join(r.describe() for r in conflict)}; "
                f"loosen {'it' if len(conflict) == 1 else 'one of them'} (its options that fit: "
                f"{', '.join(sorted({o.label for o in options})[:6])})"
            )
        return kept


def smallest_conflict(rules: list[TableRule], options: list[ShardingOption]) -> tuple[TableRule, ...]:
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


def constrain(problem: PlanningProblem, section: Any) -> PlanningProblem:
    """`problem` under a config's `constraints:` section: its rules kept for the candidates,
    its reserve taken off each rank's capacity (once: this is the one place that does)."""
    constraints = Constraints.parse(section, [t.name for t in problem.tables])
    cluster = problem.cluster
    for tier, reserve in constraints.reserve_bytes_per_rank.items():
        have = cluster.capacity_bytes_per_rank(tier)
        if reserve > have:
            raise ConfigError(f"constraints: {RESERVE_KEY}: {tier} {reserve / GIB:g} GiB is more than a rank has ({have / GIB:.1f} GiB)")
        if tier == "hbm":
            cluster = replace(cluster, hbm_bytes_per_rank=cluster.hbm_bytes_per_rank - reserve)
        else:  # host tiers are a node's, shared evenly by its ranks
            key = f"{tier}_bytes_per_node"
            cluster = replace(cluster, **{key: getattr(cluster, key) - reserve * cluster.ranks_per_node})
    return replace(problem, cluster=cluster, constraints=constraints)

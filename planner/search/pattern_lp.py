"""The configuration LP (Gilmore and Gomory's) over what one rank can hold: a lower bound on the
busiest rank that sees how whole shards pack, and fractional option choices that seed the search.

A pattern is a multiset of shards whose summed time fits under a cap. The LP asks whether some
fractional choice of options has its shards covered by at most W patterns (one a rank); where
none does, no plan has every rank under the cap. Column generation writes only the patterns that
matter: each round prices the shard classes by the LP's duals and adds the most valuable pattern,
a bounded knapsack over ticks.

What keeps it a bound: memory, pins, keep-apart groups and which node a node-bound option uses
are left out, and shards of equal ticks are interchangeable. What it keeps that the class model's
linear relaxation loses: a rank holds whole shards (26 MLPerf tables on 32 ranks: this LP refutes
3.650 ms, the class model's relaxation with its cuts not 3.61). Times are ticks (`to_ticks`), as in
the class model, so a cap of C ticks refuted bounds every plan at C + 1 ticks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
from ortools.linear_solver import pywraplp

from planner.search import wall_clock
from planner.search.cpsat import to_ticks
from planner.spec.types import Placement, ShardingOption

# A refutation needs the Farley bound this far above W: the LP's duals are floating point.
REFUTE_MARGIN = 1e-6
# Wentges' smoothing: price at this mix of the best prices so far (by Farley's bound) and the
# master's, which the LP's duals jump between; 26 MLPerf tables on 8/16/32 ranks: a fifth fewer
# rounds over their checks (3.81 s -> 3.04 at 0.7; 0.3-0.8 all within 0.3 s of each other).
SMOOTHING = 0.7


@dataclass(frozen=True)
class PatternCheck:
    refuted: bool  # no fractional plan has every rank at or under the cap
    weights: dict[str, dict[int, float]] | None  # a fractional plan under it: per table, option index -> weight
    rounds: int  # pricing rounds spent (the work, a function of the input)


@dataclass(frozen=True)
class _Option:
    table: str
    index: int
    demand: dict[int, int]  # class -> shards of it
    largest_ticks: int  # the option's largest shard (with its every-rank cost)


class PatternLP:
    """Built once over the costed options; `check` answers one cap at a time and keeps the
    patterns it wrote for the next (a pattern under a cap is under every higher one).

    Shard classes: the free shards of all tables by ticks (any rank may take any of them), and per
    option that puts one shard on each of several ranks (data-parallel and row-wise on every rank,
    table-row-wise on a node's) a class of its own, at most one a pattern, of its smallest shard
    plus its every-rank cost. An option's every-rank cost without such shards is a class of its own
    too, demanded W times.
    """

    def __init__(self, options_by_table: Mapping[str, Sequence[ShardingOption]], world_size: int, unit_ms: float) -> None:
        self.world, self.unit_ms = world_size, unit_ms
        self.tables = list(options_by_table)
        self.ticks: list[int] = []
        self.once: list[bool] = []  # at most one a pattern
        shared: dict[int, int] = {}  # ticks -> class of free shards
        self.options: list[_Option] = []

        def own(ticks: int) -> int:
            self.ticks.append(ticks)
            self.once.append(True)
            return len(self.ticks) - 1

        for table, opts in options_by_table.items():
            for k, o in enumerate(opts):
                every = to_ticks(o.every_rank_ms, unit_ms)
                shard_ticks = [to_ticks(ms, unit_ms) for ms in o.shard_ms.tolist()]
                demand: dict[int, int] = {}
                if o.placement in (Placement.EVERY_RANK, Placement.NODE_RANKS):
                    demand[own(min(shard_ticks) + (every if o.placement is Placement.EVERY_RANK else 0))] = len(shard_ticks)
                else:
                    for t in shard_ticks:
                        if t not in shared:
                            self.ticks.append(t)
                            self.once.append(False)
                            shared[t] = len(self.ticks) - 1
                        demand[shared[t]] = demand.get(shared[t], 0) + 1
                if every and o.placement is not Placement.EVERY_RANK:
                    demand[own(every)] = world_size
                self.options.append(_Option(table, k, demand, max(shard_ticks) + every))
        self.patterns: list[tuple[int, dict[int, int]]] = []  # (load in ticks, class -> count)

    @property
    def classes(self) -> int:
        return len(self.ticks)

    def check(self, cap_ticks: int, max_rounds: int, deadline_s: float) -> PatternCheck:
        """Whether any fractional plan has every rank at or under `cap_ticks`: refuted (a bound),
        a plan found (its option weights), or neither within `max_rounds` of pricing."""
        admissible = [j for j, o in enumerate(self.options) if o.largest_ticks <= cap_ticks]
        if {self.options[j].table for j in admissible} != set(self.tables):
            return PatternCheck(True, None, 0)
        per_table: dict[str, dict[int, int]] = {}  # the most shards of each class any admissible option of a table has
        for j in admissible:
            table_most = per_table.setdefault(self.options[j].table, {})
            for c, n in self.options[j].demand.items():
                table_most[c] = max(table_most.get(c, 0), n)
        limit = np.zeros(self.classes, dtype=np.int64)  # the most of each class a rank can hold: what all tables may bring
        for table_most in per_table.values():
            for c, n in table_most.items():
                limit[c] += n
        used = np.flatnonzero(limit).tolist()
        for c in used:
            limit[c] = 1 if self.once[c] else min(limit[c], cap_ticks // self.ticks[c]) if self.ticks[c] else limit[c]
        master = _Master(self, admissible, used)
        usable = set(used)
        for load, pattern in self.patterns:  # less what this cap rules out: what is left still fits
            kept = {c: n for c, n in pattern.items() if c in usable}
            if load <= cap_ticks and kept:
                master.add(kept)
        for c in used:  # every class coverable, so the master is feasible from the start
            master.add({c: int(limit[c])})
        ticks = np.asarray(self.ticks, dtype=np.int64)
        center, center_bins = None, -1.0
        for rounds in range(max_rounds + 1):
            bins = master.solve()
            if bins is None:
                return PatternCheck(False, None, rounds)
            if bins <= self.world + 1e-9:  # a fractional plan in W patterns: not refuted
                return PatternCheck(False, master.weights(), rounds)
            prices = master.prices()
            # the smoothed prices first; where their pattern is worth nothing at the master's, those
            for sep in [prices] if center is None else [SMOOTHING * center + (1 - SMOOTHING) * prices, prices]:
                value, pattern = _best_pattern(sep, ticks, limit, cap_ticks)
                least_bins = self._least_bins(sep, value, master)
                if least_bins > center_bins:
                    center, center_bins = sep, least_bins
                if least_bins > self.world * (1 + REFUTE_MARGIN):
                    return PatternCheck(True, None, rounds)
                if sum(prices[c] * n for c, n in pattern.items()) > 1 + 1e-9:
                    break
            else:
                return PatternCheck(False, None, rounds)  # converged just above W
            if rounds == max_rounds:
                return PatternCheck(False, None, rounds)
            if wall_clock.passed(deadline_s, "configuration LP"):
                return PatternCheck(False, None, rounds)
            load = sum(self.ticks[c] * n for c, n in pattern.items())
            self.patterns.append((load, pattern))
            master.add(pattern)
        raise AssertionError("unreachable")

    def _least_bins(self, prices: np.ndarray, value: float, master: _Master) -> float:
        """Farley's bound on the patterns any fractional plan needs: any prices of the classes,
        scaled down by the most valuable pattern's value, are feasible for the full LP's dual."""
        return sum(min(sum(n * prices[c] for c, n in self.options[j].demand.items()) for j in master.by_table[t])
                   for t in self.tables) / max(value, 1.0)


class _Master:
    """The restricted master LP: patterns (cost 1 each) covering the chosen options' shards."""

    def __init__(self, lp: PatternLP, admissible: list[int], used: list[int]) -> None:
        self.lp, self.admissible, self.used = lp, admissible, used
        self.columns: list[dict[int, int]] = []
        self._build()

    def _build(self) -> None:
        self.solver = pywraplp.Solver.CreateSolver("GLOP")
        inf = self.solver.infinity()
        self.cover = {c: self.solver.Constraint(0, inf) for c in self.used}
        self.by_table: dict[str, list[int]] = {t: [] for t in self.lp.tables}
        self.choose: dict[int, pywraplp.Variable] = {}
        for t in self.lp.tables:
            one = self.solver.Constraint(1, 1)
            for j in self.admissible:
                if self.lp.options[j].table == t:
                    lam = self.solver.NumVar(0, inf, "")
                    one.SetCoefficient(lam, 1)
                    for c, n in self.lp.options[j].demand.items():
                        self.cover[c].SetCoefficient(lam, -n)
                    self.by_table[t].append(j)
                    self.choose[j] = lam
        self.objective = self.solver.Objective()
        self.objective.SetMinimization()
        for pattern in self.columns:
            self._column(pattern)

    def _column(self, pattern: dict[int, int]) -> None:
        x = self.solver.NumVar(0, self.solver.infinity(), "")
        self.objective.SetCoefficient(x, 1)
        for c, n in pattern.items():
            self.cover[c].SetCoefficient(x, n)

    def add(self, pattern: dict[int, int]) -> None:
        self.columns.append(pattern)
        self._column(pattern)

    def solve(self) -> float | None:
        """The fewest patterns that cover a fractional choice; None if GLOP fails twice (its
        warm-started re-solve now and then ends ABNORMAL where a fresh one solves)."""
        if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
            self._build()
            if self.solver.Solve() != pywraplp.Solver.OPTIMAL:
                return None
        return self.objective.Value()

    def prices(self) -> np.ndarray:
        out = np.zeros(self.lp.classes)
        for c, row in self.cover.items():
            out[c] = max(0.0, row.dual_value())
        return out

    def weights(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for j, lam in self.choose.items():
            if lam.solution_value() > 1e-9:
                o = self.lp.options[j]
                out.setdefault(o.table, {})[o.index] = lam.solution_value()
        return out


def _best_pattern(values: np.ndarray, ticks: np.ndarray, limit: np.ndarray, cap_ticks: int) -> tuple[float, dict[int, int]]:
    """The most valuable multiset of classes (at most `limit` of each) within `cap_ticks`: a
    bounded knapsack, each class split into counts 1, 2, 4, ... so that 0/1 choices reach every
    count, over the splits that can be in a best pattern (`_worth_pricing`). A dynamic program
    over every tick up to the cap: numpy at memory speed, so fewer splits is what makes it faster."""
    best = np.zeros(cap_ticks + 1)  # best value within each capacity
    takes = []
    for c, q, w, v in _worth_pricing(_splits(values, ticks, limit), cap_ticks):
        if w == 0:
            best += v
            takes.append((c, q, 0, None))
            continue
        with_it = best[:-w] + v  # a new array: best[:-w] is read before best[w:] is written
        take = with_it > best[w:]
        np.maximum(best[w:], with_it, out=best[w:])
        takes.append((c, q, w, take))
    pattern: dict[int, int] = {}
    room = cap_ticks
    for c, q, w, take in reversed(takes):
        if take is None or (room >= w and take[room - w]):
            pattern[c] = pattern.get(c, 0) + q
            room -= w
    return float(best[cap_ticks]), pattern


def _splits(values: np.ndarray, ticks: np.ndarray, limit: np.ndarray) -> list[tuple[int, int, int, float]]:
    """(class, count, ticks, value) of each class of positive value split into counts 1, 2, 4, ..."""
    splits = []
    for c in np.flatnonzero((values > 0) & (limit > 0)).tolist():
        left, chunk = int(limit[c]), 1
        while left:
            q = min(chunk, left)
            left, chunk = left - q, chunk * 2
            splits.append((c, q, q * int(ticks[c]), q * float(values[c])))
    return splits


def _worth_pricing(splits: list[tuple[int, int, int, float]], cap_ticks: int) -> list[tuple[int, int, int, float]]:
    """`splits` less those no best pattern holds (Dembo and Hammer's reduction): at the value
    density r of the first split a greedy fill by density leaves out, any pattern is worth at most
    r x cap plus each split's value above r x its ticks, so one holding a split worth less than
    r x its ticks is worth at most that bound less the shortfall; where that is under the greedy
    fill's value, no best pattern holds it. So the best value is the same, and the pattern the DP
    finds too unless best patterns tie (the 803 pricings of 26 Criteo-1TB and 26 MLPerf tables:
    all identical), over a third to a half fewer splits."""
    weighted = sorted((s for s in splits if s[2] > 0), key=lambda s: -s[3] / s[2])
    free_value = sum(s[3] for s in splits if s[2] == 0)  # splits of no ticks: in every pattern
    room, greedy_value, ratio = cap_ticks, free_value, None
    for s in weighted:
        if s[2] <= room:
            room -= s[2]
            greedy_value += s[3]
        elif ratio is None:
            ratio = s[3] / s[2]
    if ratio is None:  # everything fits
        return splits
    upper = free_value + ratio * cap_ticks + sum(max(0.0, s[3] - ratio * s[2]) for s in weighted)
    floor = greedy_value * (1 - 1e-9) - 1e-12  # below the greedy fill by more than rounding
    return [s for s in splits if s[2] == 0 or upper + min(0.0, s[3] - ratio * s[2]) >= floor]

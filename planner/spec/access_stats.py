"""How a table is read: pooling, distinct ids, and the hit rate a row cache of a given size gets.

The unit of access is a row requested by one batch (duplicates within a batch count once),
because that is what a cache serves: the rows of a batch are made resident before its lookup.
A hit rate is the fraction of those requests found in the cache.

Curves come from a trace (`trace_access`, what `dlrm-scale profile` writes to stats.json) or,
when there is none, from a Zipf exponent (`zipf_access`). Both describe steady state: a
trace's first half warms the cache and only its second half is scored, since training runs
far longer than any profiled sample.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from planner.spec import json_file
from planner.spec.errors import ConfigError
from planner.spec.specs import CACHE_POLICIES, TableSpec
from planner.spec.problem import PlanningProblem

# Cache sizes at which curves are tabulated, as fractions of the table's rows.
CACHE_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0)
STATS_SCHEMA = "dlrm-scale/stats/v1"


@dataclass(frozen=True)
class HitRateCurve:
    """Hit rate at cache sizes given as fractions of the table's rows (increasing)."""

    cache_fractions: tuple[float, ...]
    hit_rates: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.cache_fractions) != len(self.hit_rates) or not self.cache_fractions:
            raise ConfigError("hit-rate curve: cache_fractions and hit_rates must be non-empty and of equal length")
        if any(b <= a for a, b in zip(self.cache_fractions, self.cache_fractions[1:])):
            raise ConfigError("hit-rate curve: cache_fractions must increase")
        if any(not 0.0 <= h <= 1.0 for h in self.hit_rates) or any(not 0.0 < f <= 1.0 for f in self.cache_fractions):
            raise ConfigError("hit-rate curve: fractions must lie in (0, 1] and hit rates in [0, 1]")
        if any(b < a for a, b in zip(self.hit_rates, self.hit_rates[1:])):
            raise ConfigError("hit-rate curve: hit rates must not fall as the cache grows")

    def at(self, cache_fraction: float) -> float:
        """Linear between tabulated sizes, through (0, 0); flat past the largest."""
        return float(np.interp(cache_fraction, (0.0, *self.cache_fractions), (0.0, *self.hit_rates)))


@dataclass(frozen=True)
class TableAccess:
    """Access statistics of one table, as measured by a profile or derived from a Zipf law."""

    name: str
    batch_size: int  # samples per batch the statistics were taken at
    pooling_factor: float  # ids per sample
    distinct_ids: int  # distinct ids in the whole sample
    unique_ids_per_batch: float  # distinct ids in one batch, on average
    lru: HitRateCurve
    lfu: HitRateCurve

    def curve(self, policy: str) -> HitRateCurve:
        if policy not in CACHE_POLICIES:
            raise ConfigError(f"unknown cache policy {policy!r}; use one of {', '.join(CACHE_POLICIES)}")
        return self.lru if policy == "lru" else self.lfu

    @property
    def unique_ratio(self) -> float:
        """Distinct rows per id looked up in a batch: how much deduplication saves."""
        ids = self.batch_size * self.pooling_factor
        return min(1.0, self.unique_ids_per_batch / ids) if ids > 0 else 1.0


# ---- from a trace ----------------------------------------------------------------------------
def distinct_rows(batches: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each batch's distinct ids, renumbered 0..R-1 over the whole trace (R distinct ids):
    the form the replays below index their per-row state with."""
    uniques = [np.unique(b) for b in batches]
    _, inverse = np.unique(np.concatenate(uniques), return_inverse=True)
    return np.split(inverse, np.cumsum([len(u) for u in uniques])[:-1])


def lru_positions(batches: Sequence[np.ndarray]) -> tuple[np.ndarray, int]:
    """LRU stack position of every row request of the scored (second) half of the trace.

    A request at batch t for a row last requested at batch t' < t has, above it, the D rows
    last requested in batches t'+1..t-1; rows last requested in batch t' itself tie with it,
    so it is put in the middle of them. A cache of C rows serves it iff position <= C. First
    requests get +inf. Batch-granular stack distances in O(T^2 + N), with T batches.
    `batches` holds each batch's distinct rows (`distinct_rows`). Returns the positions and
    the number of scored requests.
    """
    last = np.full(max((int(b.max()) + 1 for b in batches if len(b)), default=0), -1, dtype=np.int64)
    alive = np.zeros(len(batches), dtype=np.int64)  # rows whose latest request is in batch t
    scored_from = len(batches) // 2
    positions, scored = [], 0
    for t, rows in enumerate(batches):
        prev = last[rows]
        seen = prev >= 0
        if t >= scored_from:
            cum = np.cumsum(alive[:t])
            p = prev[seen]
            above = cum[t - 1] - cum[p]
            pos = np.full(len(rows), np.inf)
            pos[seen] = above + (alive[p] + 1) / 2.0
            positions.append(pos)
            scored += len(rows)
        np.subtract.at(alive, prev[seen], 1)
        alive[t] = len(rows)
        last[rows] = t
    return (np.concatenate(positions) if positions else np.zeros(0)), scored


def lfu_ranks(batches: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per batch from the one before the scored (second) half: its distinct rows (as indices)
    and each one's LFU rank by the batches before it.

    The rank orders rows by how often they were requested so far, ties (many, among rarely
    requested rows) broken by recency, the most recent first: rows with a higher count, plus
    the row's place among rows of equal count by the batch they were last requested in. Rows
    never requested get +inf. Counts are small integers, so a histogram over (count, last
    batch) gives ranks in O(T^2 + N) for T batches. `batches` holds each batch's distinct
    rows (`distinct_rows`).
    """
    n_rows = max((int(b.max()) + 1 for b in batches if len(b)), default=0)
    count = np.zeros(n_rows, dtype=np.int64)
    last = np.full(n_rows, -1, dtype=np.int64)
    T = len(batches)
    hist = np.zeros((T + 1, T), dtype=np.int64)  # rows with count c last requested in batch t
    out = []
    for t, rows in enumerate(batches):
        c, l = count[rows], last[rows]
        seen = c > 0
        if t >= T // 2 - 1:
            per_count = hist[:t + 1, :t].sum(axis=1)
            higher = np.concatenate([np.cumsum(per_count[::-1])[::-1][1:], [0]])  # rows with count > c
            newer = np.cumsum(hist[:t + 1, :t][:, ::-1], axis=1)[:, ::-1]  # same count, last >= l
            rank = np.full(len(rows), np.inf)
            cs, ls = c[seen], l[seen]
            rank[seen] = higher[cs] + newer[cs, ls]
            out.append((rows, rank))
        np.subtract.at(hist, (c[seen], l[seen]), 1)
        count[rows] += 1
        last[rows] = t
        np.add.at(hist, (count[rows], np.full(len(rows), t)), 1)
    return out


def lfu_hit_rate(ranked: list[tuple[np.ndarray, np.ndarray]], cache_rows: int) -> float:
    """Hit rate of an LFU cache of `cache_rows` that, like the trainer's (and FBGEMM's), admits
    every missed row: the rows the previous batch missed are cached, the rest of the cache holds
    the most requested rows. Scored over all batches but the first of `ranked`."""
    hits = total = 0
    admitted = np.zeros(0, dtype=np.int64)
    for k, (rows, rank) in enumerate(ranked):
        hit = (rank <= cache_rows - len(admitted)) | np.isin(rows, admitted)
        if k:
            hits += int(hit.sum())
            total += len(rows)
        admitted = rows[~hit]
    return hits / total if total else 0.0


def trace_access(name: str, batches: Sequence[np.ndarray], num_rows: int, batch_size: int,
                 fractions: Sequence[float] = CACHE_FRACTIONS) -> TableAccess:
    """Statistics of a table from the ids its batches requested (one array per batch)."""
    if len(batches) < 2:
        raise ConfigError(f"table '{name}': a profile needs at least 2 batches, got {len(batches)}")
    sizes = [max(1, math.ceil(f * num_rows)) for f in fractions]
    rows = distinct_rows(batches)
    positions, scored = lru_positions(rows)
    lru = [float(np.sum(positions <= c)) / scored if scored else 0.0 for c in sizes]
    ranked = lfu_ranks(rows)
    # admitting every miss can cost a tiny cache a hair of hit rate as it grows; keep the
    # curve monotone, as the planner reads it
    lfu = np.maximum.accumulate([lfu_hit_rate(ranked, c) for c in sizes]).tolist()
    return TableAccess(
        name=name,
        batch_size=batch_size,
        pooling_factor=sum(len(b) for b in batches) / (batch_size * len(batches)),
        distinct_ids=max((int(r.max()) + 1 for r in rows if len(r)), default=0),
        unique_ids_per_batch=float(np.mean([len(r) for r in rows])),
        lru=HitRateCurve(tuple(fractions), tuple(lru)),
        lfu=HitRateCurve(tuple(fractions), tuple(lfu)),
    )


# ---- from a Zipf law -------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def zipf_row_probabilities(num_rows: int, exponent: float, exact_head: int = 2_000, tail_bins: int = 1_000):
    """P(id = i) proportional to (i+1)^-s, as (probability, multiplicity) pairs: exact for the
    first `exact_head` rows, log-spaced bins of near-equal probability for the rest, so tables
    of a billion rows cost as much as small ones. Cached (costing asks for a table's law once
    per sharding type), so read-only."""
    head = min(num_rows, exact_head)
    ranks = [np.arange(1, head + 1, dtype=np.float64)]
    mult = [np.ones(head)]
    if num_rows > head:
        edges = np.unique(np.geomspace(head + 1, num_rows + 1, tail_bins + 1).astype(np.int64))
        lo, hi = edges[:-1], edges[1:]
        ranks.append(np.sqrt(lo * (hi - 1.0).clip(min=lo)))
        mult.append((hi - lo).astype(np.float64))
    r, m = np.concatenate(ranks), np.concatenate(mult)
    w = r ** -exponent
    p = w / np.sum(w * m)
    p.flags.writeable = m.flags.writeable = False
    return p, m


def batch_request_probability(p: np.ndarray, num_ids: float) -> np.ndarray:
    """Chance that a batch of `num_ids` independent draws requests a row of probability p."""
    return -np.expm1(num_ids * np.log1p(-np.minimum(p, 1 - 1e-15)))


@lru_cache(maxsize=65536)
def zipf_unique_ids(num_rows: int, exponent: float, num_ids: float) -> float:
    """Expected distinct rows among `num_ids` independent draws from a table's Zipf law
    (exponent 0: uniform): what a kernel that merges duplicate ids touches."""
    if num_ids <= 0:
        return 0.0
    p, m = zipf_row_probabilities(num_rows, exponent)
    return float(np.sum(batch_request_probability(p, num_ids) * m))


def zipf_access(name: str, num_rows: int, exponent: float, batch_size: int, pooling_factor: float,
                fractions: Sequence[float] = CACHE_FRACTIONS) -> TableAccess:
    """Steady-state statistics under independent Zipf draws of `batch_size * pooling_factor`
    ids per batch. A row of probability p is requested by a batch with q = 1 - (1-p)^n.
    LFU keeps the rows of highest q. LRU follows Che's approximation: a row stays cached for
    a characteristic T batches, with sum(1 - (1-q)^T) = C, and hits with 1 - (1-q)^T."""
    p, m = zipf_row_probabilities(num_rows, exponent)
    q = batch_request_probability(p, batch_size * pooling_factor)
    unique = float(np.sum(q * m))
    order = np.argsort(-q, kind="stable")
    q_sorted, m_sorted = q[order], m[order]
    cum_rows, cum_q = np.cumsum(m_sorted), np.cumsum(q_sorted * m_sorted)
    caches = np.minimum(num_rows, np.asarray(fractions, dtype=np.float64) * num_rows)

    k = np.searchsorted(cum_rows, caches)  # LFU: whole bins above the boundary, part of the one on it
    full = np.where(k > 0, cum_q[np.maximum(k - 1, 0)], 0.0)
    inside = caches - np.where(k > 0, cum_rows[np.maximum(k - 1, 0)], 0.0)
    lfu = np.minimum(1.0, (full + inside * q_sorted[np.minimum(k, len(q_sorted) - 1)] * (k < len(q_sorted))) / unique)

    log_miss = np.log1p(-np.minimum(q, 1 - 1e-15))

    def occupancy(t: np.ndarray) -> np.ndarray:  # expected cached rows after T batches, per cache
        return -np.expm1(np.outer(t, log_miss)) @ m

    lo, hi = np.zeros(len(caches)), np.ones(len(caches))
    while np.any(grow := (occupancy(hi) < caches) & (caches < num_rows)):
        hi[grow] *= 2.0
    for _ in range(50):  # bisection on T for all cache sizes at once
        mid = (lo + hi) / 2
        below = occupancy(mid) < caches
        lo, hi = np.where(below, mid, lo), np.where(below, hi, mid)
    lru = (-np.expm1(np.outer(hi, log_miss)) @ (q * m)) / unique
    lru = np.where(caches >= num_rows, 1.0, lru)
    return TableAccess(
        name=name,
        batch_size=batch_size,
        pooling_factor=pooling_factor,
        distinct_ids=int(round(unique)),
        unique_ids_per_batch=unique,
        lru=HitRateCurve(tuple(fractions), tuple(float(x) for x in lru)),
        lfu=HitRateCurve(tuple(fractions), tuple(float(x) for x in lfu)),
    )


# ---- stats.json ------------------------------------------------------------------------------
def save_stats(stats: dict[str, TableAccess], path: str | Path, source: str) -> None:
    doc = {
        "schema": STATS_SCHEMA,
        "source": source,
        "tables": {
            name: {
                "batch_size": a.batch_size,
                "pooling_factor": a.pooling_factor,
                "distinct_ids": a.distinct_ids,
                "unique_ids_per_batch": a.unique_ids_per_batch,
                "cache_fractions": list(a.lru.cache_fractions),
                "lru_hit_rate": list(a.lru.hit_rates),
                "lfu_hit_rate": list(a.lfu.hit_rates),
            }
            for name, a in stats.items()
        },
    }
    json_file.write_atomic(path, doc)


def load_stats(path: str | Path) -> dict[str, TableAccess]:
    """Read stats.json; every problem is one line naming the file and the field."""
    doc = json_file.read(path, "stats file", f"write one with 'dlrm-scale profile CONFIG --out {path}'", "dlrm-scale profile", ConfigError)
    if not isinstance(doc, dict) or doc.get("schema") != STATS_SCHEMA or not isinstance(doc.get("tables"), dict):
        raise ConfigError(f"stats file {path}: not a {STATS_SCHEMA} document; re-run 'dlrm-scale profile'")
    out = {}
    for name, t in doc["tables"].items():
        try:
            fractions = tuple(float(x) for x in t["cache_fractions"])
            access = TableAccess(
                name=name,
                batch_size=int(t["batch_size"]),
                pooling_factor=float(t["pooling_factor"]),
                distinct_ids=int(t["distinct_ids"]),
                unique_ids_per_batch=float(t["unique_ids_per_batch"]),
                lru=HitRateCurve(fractions, tuple(float(x) for x in t["lru_hit_rate"])),
                lfu=HitRateCurve(fractions, tuple(float(x) for x in t["lfu_hit_rate"])),
            )
            out[name] = _consistent(access)
        except (KeyError, TypeError, ValueError, OverflowError) as e:  # OverflowError: an integer past float range
            raise ConfigError(f"stats file {path}: table {name!r} has a missing or malformed field ({str(e)[:80]}); "
                              f"re-run 'dlrm-scale profile'") from None
        except ConfigError as e:
            raise ConfigError(f"stats file {path}: table {name!r}: {e}") from None
    return out


def _consistent(access: TableAccess) -> TableAccess:
    """Statistics that can describe a trace: counts not negative, no more distinct ids in a batch
    than ids in it (its samples times the pooling factor)."""
    if access.batch_size <= 0 or access.pooling_factor < 0 or access.distinct_ids < 0 or access.unique_ids_per_batch < 0:
        raise ConfigError("batch_size must be positive and pooling_factor, distinct_ids and unique_ids_per_batch "
                          "non-negative; re-run 'dlrm-scale profile'")
    ids = access.batch_size * access.pooling_factor
    if access.unique_ids_per_batch > ids * (1 + 1e-9):
        raise ConfigError(f"unique_ids_per_batch {access.unique_ids_per_batch:,.0f} exceeds the ids of a batch "
                          f"({access.batch_size:,} samples x pooling {access.pooling_factor:g} = {ids:,.0f}); "
                          f"re-run 'dlrm-scale profile'")
    return access


@lru_cache(maxsize=4096)
def _zipf_access(name: str, rows: int, exponent: float, batch: int, pooling: float) -> TableAccess:
    return zipf_access(name, rows, exponent, batch, pooling)


def table_access(table: TableSpec, problem: PlanningProblem) -> TableAccess:
    """Measured statistics when stats.json has the table; else its Zipf law (uniform if none
    is given) at the step's global batch."""
    measured = problem.access.get(table.name)
    if measured is not None:
        return measured
    batch = problem.training.batch_size_per_rank * problem.cluster.world_size
    return _zipf_access("zipf", table.num_embeddings, float(table.zipf_exponent or 0.0), batch, table.pooling_factor)

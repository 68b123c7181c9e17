"""Hit-rate curves from traces and from Zipf laws, and the stats.json format."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from planner.spec.access_stats import HitRateCurve, distinct_rows, lfu_hit_rate, lfu_ranks, load_stats, lru_positions, save_stats, trace_access, zipf_access
from planner.spec.errors import ConfigError


def zipf_batches(rows, exponent, ids, batches, seed=0):
    p = np.arange(1, rows + 1, dtype=float) ** -exponent
    cdf = np.cumsum(p / p.sum())
    rng = np.random.default_rng(seed)
    return [np.minimum(np.searchsorted(cdf, rng.random(ids)), rows - 1) for _ in range(batches)]


def brute_lru_hits(batches, cache_rows):
    """Textbook LRU over one-id batches, scored on the second half."""
    cache, hits, scored = OrderedDict(), 0, 0
    for t, b in enumerate(batches):
        x = int(b[0])
        if t >= len(batches) // 2:
            scored += 1
            hits += x in cache
        cache[x] = True
        cache.move_to_end(x)
        if len(cache) > cache_rows:
            cache.popitem(last=False)
    return hits / scored


def brute_lfu_hits(batches, cache_rows):
    """LFU as the profile defines it, one row per batch: the cache holds the row the previous
    batch missed (always admitted) and, beside it, the rows requested most often so far (ties
    to the most recent). Scored from the second half of the trace on."""
    count, last, hits, scored, admitted = {}, {}, 0, 0, []
    start = len(batches) // 2 - 1
    for t, b in enumerate(batches):
        x = int(b[0])
        top = sorted(count, key=lambda r: (-count[r], -last[r]))[: cache_rows - len(admitted)]
        hit = x in top or x in admitted
        if t > start:
            scored += 1
            hits += hit
        if t >= start:
            admitted = [] if hit else [x]
        count[x] = count.get(x, 0) + 1
        last[x] = t
    return hits / scored


@pytest.mark.parametrize("cache_rows", [1, 3, 10, 40])
def test_lru_stack_distances_equal_a_replayed_lru_when_batches_hold_one_id(cache_rows):
    batches = [b[:1] for b in zipf_batches(60, 0.9, 1, 400, seed=cache_rows)]
    positions, scored = lru_positions(distinct_rows(batches))
    assert np.sum(positions <= cache_rows) / scored == pytest.approx(brute_lru_hits(batches, cache_rows))


@pytest.mark.parametrize("cache_rows", [1, 3, 10, 40])
def test_lfu_ranks_equal_a_replayed_lfu_when_batches_hold_one_id(cache_rows):
    batches = [b[:1] for b in zipf_batches(60, 0.9, 1, 300, seed=cache_rows)]
    assert lfu_hit_rate(lfu_ranks(distinct_rows(batches)), cache_rows) == pytest.approx(brute_lfu_hits(batches, cache_rows))


def test_curves_rise_with_cache_size_and_skew():
    flat = trace_access("t", zipf_batches(5000, 0.5, 256, 100), 5000, 256)
    skewed = trace_access("t", zipf_batches(5000, 1.2, 256, 100), 5000, 256)
    for curve in (flat.lru, flat.lfu, skewed.lru):
        assert list(curve.hit_rates) == sorted(curve.hit_rates)
    assert skewed.lru.at(0.05) > flat.lru.at(0.05) + 0.2
    assert flat.lfu.at(0.05) >= flat.lru.at(0.05)  # a skewed, stationary trace favours LFU


def test_zipf_formulas_agree_with_a_long_trace():
    rows, ids = 20_000, 1024
    batches = zipf_batches(rows, 1.05, ids, 600)
    measured = trace_access("t", batches, rows, ids)
    model = zipf_access("t", rows, 1.05, ids, 1.0)
    assert model.unique_ids_per_batch == pytest.approx(measured.unique_ids_per_batch, rel=0.02)
    for f in (0.05, 0.1, 0.2):  # caches of at least two batches' rows, as the planner allows
        assert model.lru.at(f) == pytest.approx(measured.lru.at(f), abs=0.03)


def test_zipf_formulas_handle_a_billion_rows_quickly():
    a = zipf_access("big", 1_000_000_000, 1.05, 65536, 20.0)
    assert 0 < a.lru.at(0.01) < a.lru.at(0.1) < 1 and a.unique_ids_per_batch < 65536 * 20


def test_uniform_access_hits_in_proportion_to_the_cache():
    a = zipf_access("u", 100_000, 0.0, 100, 1.0)
    assert a.lru.at(0.2) == pytest.approx(0.2, abs=0.01) and a.lfu.at(0.2) == pytest.approx(0.2, abs=0.01)


def test_stats_round_trip_and_errors(tmp_path):
    stats = {"t": trace_access("t", zipf_batches(1000, 1.0, 64, 20), 1000, 64)}
    save_stats(stats, tmp_path / "s.json", "test")
    assert load_stats(tmp_path / "s.json") == stats
    with pytest.raises(ConfigError, match="does not exist"):
        load_stats(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text('{"schema": "dlrm-scale/stats/v1", "tables": {"t": {"batch_size": 4}}}')
    with pytest.raises(ConfigError, match="table 't' has a missing or malformed field"):
        load_stats(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="must increase"):
        HitRateCurve((0.2, 0.1), (0.5, 0.6))


def test_stats_that_contradict_their_table_are_one_line_exit_2(tmp_path):
    """Statistics a trace of this table could not give: more distinct ids than rows, more distinct
    ids in a batch than ids in it, a hit rate that falls as the cache grows."""
    import json
    import subprocess
    import sys

    config = tmp_path / "c.yaml"
    config.write_text("hardware: cpu_gloo\ncluster: {world_size: 2}\ntraining: {batch_size_per_rank: 32}\n"
                      "tables:\n  - {name: t, num_embeddings: 1000, embedding_dim: 16, pooling_factor: 2.0}\n")
    save_stats({"t": trace_access("t", zipf_batches(1000, 1.0, 64, 20), 1000, 64)}, tmp_path / "good.json", "test")
    good = json.loads((tmp_path / "good.json").read_text())
    cases = {
        "distinct_ids": (10**9, "table 't' has 1,000,000,000 distinct ids but 1,000 rows; profile this config's data"),
        "unique_ids_per_batch": (10**7, "unique_ids_per_batch 10,000,000 exceeds the ids of a batch (64 samples x pooling"),
        "lru_hit_rate": ([0.9] + [0.1] * (len(good["tables"]["t"]["lru_hit_rate"]) - 1), "hit rates must not fall as the cache grows"),
    }
    for field, (value, message) in cases.items():
        doc = json.loads(json.dumps(good))
        doc["tables"]["t"][field] = value
        (tmp_path / f"{field}.json").write_text(json.dumps(doc))
        r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", str(config), "--stats", str(tmp_path / f"{field}.json"),
                            "--out", str(tmp_path / "p.json")], capture_output=True, text=True)
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, (field, r.stderr)
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", str(config), "--stats", str(tmp_path / "good.json"),
                        "--out", str(tmp_path / "p.json")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr

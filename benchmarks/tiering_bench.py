"""Tiering benchmark: hit-rate curves, training with rows 4x the fast memory, exactness.

1. curves: for Zipf exponents 0.8, 1.05 and 1.2, the hit-rate curves `dlrm-scale profile`
   computes (planner.access_stats: batch-granular LRU stack distances, LFU by request counts)
   against a replay of the same trace through the cache the trainer uses
   (dlrm_scale.tiering.cache, 32-way set-associative), at several cache sizes; also the Zipf
   formulas the planner falls back on without a profile, against a steady-state replay.
2. speed: configs/bench_tiered.yaml (4.2 GB of rows and optimizer state, fast memory a
   quarter of it) planned by our planner, which puts the rows on SSD behind 25% caches;
   trained on 2 gloo ranks, alternating with the same plan all in memory. Samples/s are
   medians over the runs of each run's steady windows; resident memory is the largest rank's.
3. exactness: 2 ranks, a cached SSD table and a cached DDR table, rows and optimizer state
   after N steps against the same tables trained in memory (dlrm_scale.training.state).

    python benchmarks/tiering_bench.py [--repeats 3] [--steps 200] [--parts curves,speed,exact]

Writes benchmarks/results/tiering.json and prints Markdown tables for the README.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_scale.tiering.cache import SetAssociativeCache  # noqa: E402
from planner.access_stats import trace_access, zipf_access  # noqa: E402
from planner.plan import Plan  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "tiering.json"
CONFIG = "configs/bench_tiered.yaml"
FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.4)


# ---- 1. curves -------------------------------------------------------------------------------
def zipf_trace(rows: int, exponent: float, ids_per_batch: int, batches: int, seed: int) -> list[np.ndarray]:
    p = np.arange(1, rows + 1, dtype=np.float64) ** -exponent
    cdf = np.cumsum(p / p.sum())
    rng = np.random.default_rng(seed)
    perm = rng.permutation(rows)  # hot ids spread over the id space, as hashed ids are
    return [perm[np.minimum(np.searchsorted(cdf, rng.random(ids_per_batch)), rows - 1)] for _ in range(batches)]


def replay(batches: list[np.ndarray], rows: int, cache_rows: int, policy: str, scored_from: int) -> float:
    cache = SetAssociativeCache(cache_rows, rows, 32, policy)
    for i, b in enumerate(batches):
        if i == scored_from:
            cache.counters.hits = cache.counters.misses = 0
        cache.take_overflow()
        cache.assign(torch.unique(torch.from_numpy(b)))
    return cache.counters.hits / (cache.counters.hits + cache.counters.misses)


def curves(rows: int = 1_000_000, ids_per_batch: int = 4096, batches: int = 400) -> dict:
    out = {}
    for exponent in (0.8, 1.05, 1.2):
        trace = zipf_trace(rows, exponent, ids_per_batch, batches, seed=1)
        stats = trace_access("t", trace, rows, ids_per_batch, FRACTIONS)
        # the formulas describe steady state: replay a long trace, score its last quarter
        long_trace = trace + zipf_trace(rows, exponent, ids_per_batch, 3 * batches, seed=2)
        model = zipf_access("t", rows, exponent, ids_per_batch, 1.0, FRACTIONS)
        points = []
        for f in FRACTIONS:
            c = int(f * rows)
            point = {"cache_fraction": f}
            for policy in ("lru", "lfu"):
                replayed = replay(trace, rows, c, policy, batches // 2)
                point[policy] = {"profile": stats.curve(policy).at(f), "replay": replayed,
                                 "zipf_model": model.curve(policy).at(f),
                                 "replay_steady": replay(long_trace, rows, c, policy, 3 * len(long_trace) // 4)}
            points.append(point)
            print(exponent, json.dumps(point), flush=True)
        worst = max(abs(p[k]["profile"] - p[k]["replay"]) for p in points for k in ("lru", "lfu"))
        worst_model = max(abs(p[k]["zipf_model"] - p[k]["replay_steady"]) for p in points for k in ("lru", "lfu"))
        out[str(exponent)] = {"points": points, "max_profile_error_points": 100 * worst, "max_zipf_model_error_points": 100 * worst_model}
    return {"rows": rows, "ids_per_batch": ids_per_batch, "batches": batches, "by_exponent": out}


# ---- 2. speed --------------------------------------------------------------------------------
def train(plan: str, steps: int, store_dir: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "dlrm_scale.train",
               "--config", CONFIG, "--plan", plan, "--steps", str(steps), "--out-dir", out, "--store-dir", store_dir]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"training failed: {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "samples_per_s" in r]
    cache = [r for r in records if "cache_hits" in r]
    steady = windows[len(windows) // 2:]  # caches fill during the first half
    result = {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        "rss_bytes": max(r["rss_bytes"] for r in windows),
        "rss_anon_bytes": max(r["rss_anon_bytes"] for r in windows),
        "auc": [r for r in records if "auc" in r][-1]["auc"],
    }
    if cache:
        last = cache[len(cache) // 2:]
        result["cache_hit_rate"] = sum(r["cache_hits"] for r in last) / sum(r["cache_hits"] + r["cache_misses"] for r in last)
        result["cache_ms_per_step"] = statistics.median(r["cache_install_us"] for r in last) / 1e3 / 2 / 10  # per rank, log_every 10
    return result


def in_memory(plan: Plan) -> Plan:
    """The same layout with every table's rows in the device tier."""
    tables = {n: replace(t, compute_kernel="fused", cache_load_factor=None,
                         shards=tuple(replace(s, tier="ddr", cache_rows=0) for s in t.shards)) for n, t in plan.tables.items()}
    return replace(plan, tables=tables)


def speed(steps: int, repeats: int) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tiering_bench_"))
    tiered_path, memory_path = work / "tiered.json", work / "memory.json"
    subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", CONFIG, "--out", str(tiered_path)], cwd=ROOT, check=True,
                   capture_output=True)
    plan = Plan.load(tiered_path)
    in_memory(plan).save(memory_path)
    rows_bytes = sum(s.rows * s.cols * 4 + s.rows * 4 for t in plan.tables.values() for s in t.shards)
    cache_bytes = sum(s.cache_rows * s.cols * 4 + s.cache_rows * 4 for t in plan.tables.values() for s in t.shards)
    runs = {"tiered": [], "in_memory": []}
    for _ in range(repeats):
        for kind, path in (("tiered", tiered_path), ("in_memory", memory_path)):
            store = work / f"store_{kind}"
            store.mkdir(exist_ok=True)
            r = train(str(path), steps, str(store))
            runs[kind].append(r)
            print(kind, json.dumps(r), flush=True)
            for f in store.iterdir():
                f.unlink()
    tiered = statistics.median(r["samples_per_s"] for r in runs["tiered"])
    memory = statistics.median(r["samples_per_s"] for r in runs["in_memory"])
    rss_tiered = max(r["rss_bytes"] for r in runs["tiered"])
    rss_memory = max(r["rss_bytes"] for r in runs["in_memory"])
    per_rank_rows, per_rank_cache = rows_bytes / plan.world_size, cache_bytes / plan.world_size
    return {
        "plan": {n: {"kernel": t.compute_kernel, "tier": t.shards[0].tier, "cache_load_factor": t.cache_load_factor}
                 for n, t in plan.tables.items()},
        "rows_bytes": rows_bytes, "cache_bytes": cache_bytes, "rows_over_cache": rows_bytes / cache_bytes,
        "tiered_samples_per_s": tiered, "in_memory_samples_per_s": memory, "ratio": tiered / memory,
        # overhead: resident memory beyond the embedding bytes each run keeps in memory
        "rss_tiered_bytes": rss_tiered, "rss_in_memory_bytes": rss_memory,
        "overhead_tiered_bytes": rss_tiered - per_rank_cache, "overhead_in_memory_bytes": rss_memory - per_rank_rows,
        "runs": runs,
    }


# ---- 3. exactness ----------------------------------------------------------------------------
def exactness(steps: int) -> dict:
    from tests.test_tiering_distributed import gather, run

    with tempfile.TemporaryDirectory() as d:
        memory = gather(run(Path(d), "memory", False, steps=steps))
        tiered = gather(run(Path(d), "tiered", True, steps=steps))
    diffs = {f"{name}/{col}": {"weights": float((memory[k][0] - tiered[k][0]).abs().max()),
                               "optimizer_state": float((memory[k][1] - tiered[k][1]).abs().max())}
             for k in memory for name, col in [k]}
    return {"steps": steps, "max_abs_difference": diffs, "exact": all(v["weights"] == 0 and v["optimizer_state"] == 0 for v in diffs.values())}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--parts", default="curves,speed,exact")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if "curves" in parts:
        results["curves"] = curves()
    if "speed" in parts:
        results["speed"] = speed(args.steps, args.repeats)
    if "exact" in parts:
        results["exactness"] = exactness(40)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n")
    if "curves" in results:
        print("| Zipf | max error, profile vs replay (points) | max error, Zipf formulas vs steady replay (points) |\n|---|---|---|")
        for e, c in results["curves"]["by_exponent"].items():
            print(f"| {e} | {c['max_profile_error_points']:.2f} | {c['max_zipf_model_error_points']:.2f} |")
    if "speed" in results:
        s = results["speed"]
        print(f"rows {s['rows_bytes'] / 1e9:.2f} GB on SSD, caches {s['cache_bytes'] / 1e9:.2f} GB ({s['rows_over_cache']:.1f}x): "
              f"{s['tiered_samples_per_s']:,.0f} vs {s['in_memory_samples_per_s']:,.0f} samples/s in memory = {s['ratio']:.2f}x; "
              f"RSS {s['rss_tiered_bytes'] / 2**30:.2f} GiB vs {s['rss_in_memory_bytes'] / 2**30:.2f} GiB")
    if "exactness" in results:
        print(f"exact after {results['exactness']['steps']} steps: {results['exactness']['exact']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

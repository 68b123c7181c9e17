"""Tiering benchmark: hit-rate curves, training with rows 4x and 10x the fast memory, exactness.

1. curves: for Zipf exponents 0.8, 1.05 and 1.2, the hit-rate curves `dlrm-scale profile`
   computes (planner.spec.access_stats: batch-granular LRU stack distances, LFU by request counts)
   against a replay of the same trace through the cache the trainer uses
   (dlrm_scale.tiering.cache, 32-way set-associative), at several cache sizes; also the Zipf
   formulas the planner falls back on without a profile, against a steady-state replay.
2. speed: configs/bench_tiered.yaml (4.2 GB of rows and optimizer state) with fast memory
   1/4 and 1/10 of it, Zipf 1.05 and 0.8, LRU and LFU, each profiled (`dlrm-scale profile`,
   as many steps as the runs train) and planned by our planner from those statistics (rows on
   SSD behind 25% or 10% caches), and priced by `simulate` with them; trained on 2 gloo ranks, every variant and the same plans
   all in memory run once per round, rounds repeated; the SSD store read as the hardware
   profile's `cpu_kernels.store_io` says (calibrate's choice; `--store-io` for the other).
   Samples/s: medians over the runs of each run's steady windows (and each half's samples over
   its whole time, which counts the windows a log compaction falls in); ratios per round. Then one
   short run reading with O_DIRECT (disk speed), and the disk's own O_DIRECT read speed beside it.
3. exactness: 2 ranks, a cached SSD table and a cached DDR table, rows and optimizer state
   after N steps against the same tables trained in memory (dlrm_scale.training.state).

    python -m benchmarks.tiering_bench [--repeats 3] [--steps 200] [--parts curves,speed,direct,exact] [--variants 4x,10x_lfu]
                                       [--store-io pread|mapped]

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
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


from dlrm_scale.tiering.cache import SetAssociativeCache
from planner.spec.access_stats import trace_access, zipf_access
from planner.cost.cost_model import cache_index_bytes, rows_bytes
from planner.plan.document import Plan
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "tiering.json"
CONFIG = "configs/bench_tiered.yaml"
OPTIMIZER = "rowwise_adagrad"  # bench_tiered.yaml's
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
# (name, Zipf exponent, cache policy, cache load factor); fast memory = the caches plus the dense side
VARIANTS = (
    ("4x", 1.05, "lru", 0.25), ("10x", 1.05, "lru", 0.1),
    ("4x_lfu", 1.05, "lfu", 0.25), ("10x_lfu", 1.05, "lfu", 0.1),
    ("4x_zipf0.8", 0.8, "lru", 0.25), ("10x_zipf0.8", 0.8, "lru", 0.1),
)
DIRECT = ("10x_direct", 1.05, "lru", 0.1)  # O_DIRECT: disk speed, a short run
# bench_tiered.yaml: 1.2 GiB of fast memory, 1.05 for caches of 25% and their buffers, 0.15 for the
# caches' index (planner.cost.cost_model.cache_index_bytes: 0.09-0.13 GiB in these variants)
INDEX_GIB = 0.15
DDR_GIB_PER_LOAD_FACTOR = 1.05 / 0.25


def variant_config(work: Path, name: str, zipf: float, policy: str, load_factor: float) -> Path:
    text = Path(ROOT, CONFIG).read_text()
    ddr_gib = load_factor * DDR_GIB_PER_LOAD_FACTOR + INDEX_GIB
    text = (text.replace("zipf_exponent: 1.05", f"zipf_exponent: {zipf}").replace("policy: lru", f"policy: {policy}")
            .replace("load_factors: [0.25]", f"load_factors: [{load_factor}]").replace("ddr_gib_per_node: 1.2", f"ddr_gib_per_node: {ddr_gib:.3f}"))
    path = work / f"{name}.yaml"
    path.write_text(text)
    return path


def train(config: Path, plan: Path, steps: int, store_dir: Path, store_io: str | None = None) -> dict:
    """One 2-rank run; the store read as `store_io` says (None: as the hardware profile's
    cpu_kernels says, the trainer's default)."""
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "dlrm_scale.train",
               "--config", str(config), "--plan", str(plan), "--steps", str(steps), "--out-dir", out, "--store-dir", str(store_dir),
               *(["--store-io", store_io] if store_io else [])]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        job_s = time.perf_counter() - started
        if proc.returncode != 0:
            raise RuntimeError(f"training failed: {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "samples_per_s" in r]
    cache = [r for r in records if "cache_hits" in r]
    steady = windows[len(windows) // 2:]  # caches fill during the first half
    result = {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in steady),
        # the whole half's samples over its time (windows are equal in steps): counts the windows
        # a log compaction falls in, which the median leaves out
        "samples_per_s_overall": statistics.harmonic_mean([r["samples_per_s"] for r in steady]),
        "step_ms": statistics.median(r["step_ms"] for r in steady),
        "rss_bytes": max(r["rss_bytes"] for r in windows),
        "rss_anon_bytes": max(r["rss_anon_bytes"] for r in windows),
        "auc": [r for r in records if "auc" in r][-1]["auc"],
        # per rank: the slower rank's median over the steady windows
        "phase_ms": {k: statistics.median(max(r["phase_ms"][k]) for r in steady) for k in ("emb_fwd", "tiering")},
        "job_s": job_s,  # the whole job, start-up included (the stores' files created and warmed)
    }
    if cache:
        last = cache[len(cache) // 2:]
        log_every = records[1]["step"] if len(records) > 1 else 10
        result["cache_hit_rate"] = sum(r["cache_hits"] for r in last) / sum(r["cache_hits"] + r["cache_misses"] for r in last)
        # counters are summed over the 2 ranks, per logging window
        result["cache_install_ms_per_step"] = statistics.median(r["cache_install_us"] for r in last) / 1e3 / 2 / log_every
        for part in ("index", "move", "append"):  # the compiled pass's parts of the install
            result[f"cache_{part}_ms_per_step"] = statistics.median(r[f"cache_{part}_us"] for r in last) / 1e3 / 2 / log_every
        result["misses_per_step_per_rank"] = statistics.median(r["cache_misses"] for r in last) / 2 / log_every
    return result


def in_memory(plan: Plan) -> Plan:
    """The same layout with every table's rows in the device tier."""
    tables = {n: replace(t, compute_kernel="fused", cache_load_factor=None,
                         shards=tuple(replace(s, tier="ddr", cache_rows=0) for s in t.shards)) for n, t in plan.tables.items()}
    return replace(plan, tables=tables)


def disk_read_bandwidth(directory: Path, size_bytes: int = 1 << 30, seconds: float = 3.0) -> dict:
    """The store's device as O_DIRECT sees it: random 4 KiB reads one at a time (its latency;
    the store keeps 16 in flight per rank) and sequential 1 MiB reads, on a file of its own in
    the store directory."""
    import mmap

    path = directory / "disk_probe.bin"
    with open(path, "wb") as f:
        for _ in range(size_bytes >> 24):
            f.write(os.urandom(1 << 24))
        os.fsync(f.fileno())
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    out = {}
    try:
        for label, block in (("random_4k", 4096), ("sequential_1m", 1 << 20)):
            buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT needs
            rng = np.random.default_rng(0)
            reads, start, at = 0, time.perf_counter(), 0
            while time.perf_counter() - start < seconds:
                at = int(rng.integers(0, size_bytes // block)) * block if block == 4096 else (at + block) % size_bytes
                os.preadv(fd, [buf], at)
                reads += 1
            elapsed = time.perf_counter() - start
            out[label] = {"mb_per_s": reads * block / elapsed / 1e6, "reads_per_s": reads / elapsed}
    finally:
        os.close(fd)
        path.unlink()
    return out


def predicted_cache_ms(config: Path, tiered: Path, memory: Path, stats: Path) -> float:
    """What the cost model says the caches add to a step, on the rank where they add the most:
    the embedding phase group of the tiered plan less the in-memory plan's (cache_miss_ms and
    cache_lookup_ms of each cached shard), from `dlrm-scale simulate --stats`."""
    from dlrm_scale.run_config import Overrides, load_run_config
    from dlrm_scale.tools.simulate import simulate

    run = load_run_config(config, Overrides(stats=str(stats)))
    tiered_sim, memory_sim = (simulate(Plan.load(p), run.problem, run.model, run.train.dense_optimizer) for p in (tiered, memory))
    return max(t.phases_ms["embedding"] - m.phases_ms["embedding"] for t, m in zip(tiered_sim.ranks, memory_sim.ranks))


def measured_cache_ms(tiered: dict, memory: dict) -> float:
    """What the caches added, as the trainer timed it: the tiered run's lookup forward (which
    installs each batch's rows) and its read-ahead phase, less the in-memory run's forward."""
    return tiered["phase_ms"]["emb_fwd"] + tiered["phase_ms"]["tiering"] - memory["phase_ms"]["emb_fwd"]


def resident_overhead(plan: Plan, policy: str, rounds: list[tuple[int, int]]) -> dict:
    """Resident memory tiering adds beyond its caches' rows, per rank and per row the rank's
    stores hold: the tiered run's anonymous RSS less its cache rows, against the in-memory
    run's of the same round less its rows (both keep the same model, TorchRec and buffers);
    the median over the rounds, and their range. Anonymous: a mapped store's file pages are
    the page cache's, which the pread store uses as much without mapping it. Beside it, what
    the planner counts for the caches' index (planner.cost.cost_model.cache_index_bytes)."""
    shards = [s for t in plan.tables.values() for s in t.shards]
    rows = sum(s.rows for s in shards) / plan.world_size
    row_bytes = sum(rows_bytes(s.rows, s.cols, OPTIMIZER) for s in shards) / plan.world_size
    cache_bytes = sum(rows_bytes(s.cache_rows, s.cols, OPTIMIZER) for s in shards) / plan.world_size
    index_bytes = sum(cache_index_bytes(s.rows, s.cache_rows, policy, s.tier, "cpu") for s in shards) / plan.world_size
    per_round = [((tiered - cache_bytes) - (in_memory - row_bytes)) / rows for tiered, in_memory in rounds]
    per_row = statistics.median(per_round)
    return {"rows_per_rank": rows, "cache_bytes_per_rank": cache_bytes, "overhead_bytes_per_rank": per_row * rows,
            "overhead_bytes_per_row": per_row, "overhead_bytes_per_row_range": [min(per_round), max(per_round)],
            "planned_index_bytes_per_row": index_bytes / rows}


def speed(steps: int, repeats: int, variants: tuple = VARIANTS, store_io: str | None = None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="tiering_bench_"))
    kinds: dict[str, tuple[Path, Path]] = {}  # kind -> (config, plan)
    stats_of: dict[str, Path] = {}  # variant -> its profile's stats.json
    for name, zipf, policy, factor in variants:
        config = variant_config(work, name, zipf, policy, factor)
        plan_path, stats = work / f"{name}.json", work / f"{name}.stats.json"
        for command in (["profile", str(config), "--batches", str(steps), "--out", str(stats)],
                        ["plan", str(config), "--stats", str(stats), "--out", str(plan_path)]):
            subprocess.run([sys.executable, "-m", "dlrm_scale.cli", *command], cwd=ROOT, check=True, capture_output=True)
        stats_of[name] = stats
        kinds[name] = (config, plan_path)
        memory = f"memory_zipf{zipf}"
        if memory not in kinds:
            in_memory(Plan.load(plan_path)).save(work / f"{memory}.json")
            kinds[memory] = (config, work / f"{memory}.json")
    store = work / "store"
    store.mkdir()
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for kind in runs:  # alternated: each round runs every kind once
            r = train(*kinds[kind], steps, store, store_io)
            runs[kind].append(r)
            print(kind, json.dumps(r), flush=True)
            for f in store.iterdir():
                f.unlink()
    def median(kind: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[kind])

    measured = {}
    for name, zipf, policy, factor in variants:
        plan, stats = Plan.load(kinds[name][1]), stats_of[name]
        memory = f"memory_zipf{zipf}"
        ratios = [t["samples_per_s"] / m["samples_per_s"] for t, m in zip(runs[name], runs[memory])]  # same round
        measured[name] = {
            "zipf": zipf, "policy": policy, "cache_load_factor": factor,
            "plan": sorted({f"{t.compute_kernel}/{t.shards[0].tier}/{t.cache_load_factor}" for t in plan.tables.values()}),
            "tiered_samples_per_s": median(name, "samples_per_s"), "in_memory_samples_per_s": median(memory, "samples_per_s"),
            "ratio": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
            "ratio_overall": statistics.median(t["samples_per_s_overall"] / m["samples_per_s_overall"]
                                               for t, m in zip(runs[name], runs[memory])),
            "cache_hit_rate": median(name, "cache_hit_rate"), "profiled_hit_rate": profiled_hit_rate(stats, policy, factor), "misses_per_step_per_rank": median(name, "misses_per_step_per_rank"),
            "cache_install_ms_per_step": median(name, "cache_install_ms_per_step"),
            **{f"cache_{part}_ms_per_step": median(name, f"cache_{part}_ms_per_step") for part in ("index", "move", "append")},
            "tiering_phase_ms": statistics.median(r["phase_ms"]["tiering"] for r in runs[name]),
            "rss_tiered_bytes": max(r["rss_bytes"] for r in runs[name]), "rss_in_memory_bytes": max(r["rss_bytes"] for r in runs[memory]),
            "rss_anon_tiered_bytes": max(r["rss_anon_bytes"] for r in runs[name]),
            "rss_anon_in_memory_bytes": max(r["rss_anon_bytes"] for r in runs[memory]),
            "cache_ms_measured": statistics.median(measured_cache_ms(t, m) for t, m in zip(runs[name], runs[memory])),
            "cache_ms_predicted": predicted_cache_ms(kinds[name][0], kinds[name][1], kinds[memory][1], stats),
        }
        measured[name]["cache_ms_error"] = measured[name]["cache_ms_predicted"] / measured[name]["cache_ms_measured"] - 1
        measured[name]["runs"] = {"tiered": runs[name], "in_memory": runs[memory]}  # round by round
        rounds = [(t["rss_anon_bytes"], m["rss_anon_bytes"]) for t, m in zip(runs[name], runs[memory])]
        measured[name].update(resident_overhead(plan, policy, rounds))
    return {"steps": steps, "repeats": repeats, "store_io": store_io or profile_store_io(), "variants": measured}


def profiled_hit_rate(stats: Path, policy: str, load_factor: float) -> float:
    """The hit rate the plan was priced with: `dlrm-scale profile`'s curve at the cache's size,
    weighted by each table's distinct ids a step."""
    from planner.spec.access_stats import load_stats

    tables = load_stats(stats).values()
    return sum(a.curve(policy).at(load_factor) * a.unique_ids_per_batch for a in tables) / sum(a.unique_ids_per_batch for a in tables)


def profile_store_io() -> str:
    """How the trainer reads the SSD store by default here: the hardware profile's choice."""
    from dlrm_scale.run_config import measured_cpu_kernels
    from planner.spec.config import profile_file, read_yaml

    return measured_cpu_kernels(profile_file(read_yaml(Path(ROOT, CONFIG), "config"), f"config {CONFIG}"))["store_io"]


def direct_io(steps: int) -> dict:
    """The 10x variant reading with O_DIRECT (the device, not the page cache), and the device's
    own O_DIRECT read speed beside it."""
    work = Path(tempfile.mkdtemp(prefix="tiering_bench_"))
    name, zipf, policy, factor = DIRECT
    config, plan = variant_config(work, name, zipf, policy, factor), work / f"{name}.json"
    subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", str(config), "--out", str(plan)], cwd=ROOT, check=True,
                   capture_output=True)
    store = work / "store"
    store.mkdir()
    run = train(config, plan, steps, store, store_io="direct")
    print(name, json.dumps(run), flush=True)
    for f in store.iterdir():
        f.unlink()
    return {"steps": steps, "run": run, "disk": disk_read_bandwidth(store)}


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
    ap.add_argument("--variants", help="comma-separated speed variants to re-measure (default: all)")
    ap.add_argument("--parts", default="curves,speed,direct,exact")
    ap.add_argument("--store-io", choices=("pread", "mapped"), help="how the speed runs read the store (default: the profile's choice)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() else {}
    if "curves" in parts:
        results["curves"] = curves()
    if "speed" in parts:
        chosen = tuple(v for v in VARIANTS if args.variants is None or v[0] in args.variants.split(","))
        if not chosen:
            ap.error(f"--variants names none of {', '.join(v[0] for v in VARIANTS)}")
        fresh = speed(args.steps, args.repeats, chosen, args.store_io)
        if args.variants is None or "speed" not in results or results["speed"].get("store_io") != fresh["store_io"]:
            results["speed"] = fresh
        else:  # re-measured variants replace theirs, each with the in-memory runs it was measured against
            results["speed"]["variants"].update(fresh["variants"])
    if "direct" in parts:
        results["direct"] = direct_io(max(20, args.steps // 2))
    if "exact" in parts:
        results["exactness"] = exactness(40)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out), results)
    if "curves" in results:
        print("| Zipf | max error, profile vs replay (points) | max error, Zipf formulas vs steady replay (points) |\n|---|---|---|")
        for e, c in results["curves"]["by_exponent"].items():
            print(f"| {e} | {c['max_profile_error_points']:.2f} | {c['max_zipf_model_error_points']:.2f} |")
    if "speed" in results:
        s = results["speed"]
        print("| rows / fast memory | Zipf | policy | hit rate: measured, profiled | samples/s tiered | in memory | ratio (range) | "
              "ratio, whole half | cache ms/step: install, read-ahead | cache ms/step: measured, simulate | resident overhead, bytes/row |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for name, v in s["variants"].items():
            print(f"| {name.split('_')[0]} | {v['zipf']} | {v['policy']} | {v['cache_hit_rate']:.3f}, {v['profiled_hit_rate']:.3f} | "
                  f"{v['tiered_samples_per_s']:,.0f} | "
                  f"{v['in_memory_samples_per_s']:,.0f} | **{v['ratio']:.2f}x** ({v['ratio_range'][0]:.2f}-{v['ratio_range'][1]:.2f}) | "
                  f"{v['ratio_overall']:.2f}x | "
                  f"{v['cache_install_ms_per_step']:.1f}, {v['tiering_phase_ms']:.1f} | "
                  f"{v['cache_ms_measured']:.1f}, {v['cache_ms_predicted']:.1f} ({100 * v['cache_ms_error']:+.0f}%) | "
                  f"{v['overhead_bytes_per_row']:.1f} ({v['overhead_bytes_per_row_range'][0]:.1f}-{v['overhead_bytes_per_row_range'][1]:.1f}) |")
    if "direct" in results:
        d, memory = results["direct"], results.get("speed", {}).get("variants", {}).get("10x", {}).get("in_memory_samples_per_s")
        ratio = f" ({d['run']['samples_per_s'] / memory:.3f}x in memory)" if memory else ""
        print(f"O_DIRECT, 10x: {d['run']['samples_per_s']:,.0f} samples/s{ratio}, read-ahead {d['run']['phase_ms']['tiering']:.0f} ms "
              f"a step; the disk alone: {d['disk']['random_4k']['reads_per_s']:,.0f} random 4 KiB reads/s one at a time, "
              f"{d['disk']['sequential_1m']['mb_per_s']:,.0f} MB/s sequential")
    if "exactness" in results:
        print(f"exact after {results['exactness']['steps']} steps: {results['exactness']['exact']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

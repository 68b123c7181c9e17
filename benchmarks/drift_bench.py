"""Drift benchmark: a tiered job whose hot ids move mid-run, left alone or retuning itself.

The tiering benchmark's config (`configs/bench_tiered.yaml`: 8 tables of 2M rows, a quarter of
their rows cached, the rest on SSD behind the row cache) trained as a 2-rank gloo job
(`dlrm-scale train`, as a user runs it) for --steps steps with `--drift-at`: at that step every
table's hot set moves (a new permutation of its Zipf ranks), so the caches, warmed on the old hot
set, miss. The store is read with O_DIRECT (`--store-io direct`) so that a miss costs the disk's
read, not the page cache's copy. Arms, alternated within a round, --repeats rounds:
- static: the plan made at start, kept;
- retune: the same with `--retune` (its measurements, decisions and any move in the run).
Per run, samples/s (the mean of the logged windows' samples/s) over: the --span steps before the drift
(`before`), the first 50 after it (`drop`), and --span steps ending --recover steps after it
(`after`); `restored` = (after - drop) / (before - drop), the share of the lost throughput won
back by then.

    python -m benchmarks.drift_bench [--drift-at 250] [--recover 300] [--repeats 3]

Writes benchmarks/results/drift.json and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, train_job, write_result

RESULTS = ROOT / "benchmarks" / "results" / "drift.json"
CONFIG = ROOT / "configs" / "bench_tiered.yaml"
DROP_STEPS = 50
ARMS = {"static": [], "retune": ["--retune"]}


def run_job(steps: int, drift_at: int, folder: Path, name: str, extra: list[str]) -> dict:
    """One job: its wall time, each logged window's (step, samples/s, cache hit rate), and its
    retune records."""
    out, store = folder / name, folder / f"{name}_store"
    store.mkdir(parents=True)
    wall, records = train_job(["--config", str(CONFIG), "--steps", str(steps), "--drift-at", str(drift_at), "--store-io", "direct",
                               "--store-dir", str(store), *extra], out)
    hit_rates = {r["step"]: r["cache_hit_rate"] for r in records if "cache_hit_rate" in r}
    windows = [(r["step"], r["samples_per_s"], hit_rates.get(r["step"])) for r in records if "samples_per_s" in r]
    shutil.rmtree(store, ignore_errors=True)  # 4 GiB a run
    return {"wall_s": wall, "windows": windows, "retune": [r["retune"] for r in records if "retune" in r],
            "reshard": [r["reshard"] for r in records if "reshard" in r]}


def rate(windows: list, first: int, last: int) -> float:
    """Mean samples/s of the windows ending in (first, last]."""
    inside = [s for step, s, _ in windows if first < step <= last]
    if not inside:
        raise ValueError(f"no logged window ends in steps ({first}, {last}]")
    return statistics.fmean(inside)


def score(run: dict, drift_at: int, recover: int, span: int) -> dict:
    before = rate(run["windows"], drift_at - span, drift_at)
    drop = rate(run["windows"], drift_at, drift_at + DROP_STEPS)
    after = rate(run["windows"], drift_at + recover - span, drift_at + recover)
    return {"before": before, "drop": drop, "after": after, "restored": (after - drop) / (before - drop) if before > drop else None,
            "moves": sum(1 for d in run["retune"] if d.get("move"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drift-at", type=int, default=250, help="the step the hot ids move (the caches warm up before it)")
    ap.add_argument("--recover", type=int, default=300, help="steps after the drift the throughput is judged at")
    ap.add_argument("--span", type=int, default=50, help="steps each rate is a mean over")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.repeats < 1 or args.span < 10 or args.drift_at <= args.span or args.recover < max(args.span, DROP_STEPS):
        ap.error("--repeats takes >= 1, --span >= 10, --drift-at more than --span and --recover at least --span and 50")
    steps = args.drift_at + args.recover
    runs: dict[str, list[dict]] = {name: [] for name in ARMS}
    scores: dict[str, list[dict]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            for name, extra in ARMS.items():
                runs[name].append(run_job(steps, args.drift_at, Path(d), f"{name}_{r}", extra))
                scores[name].append(score(runs[name][-1], args.drift_at, args.recover, args.span))
                print(f"{name} round {r}: {runs[name][-1]['wall_s']:.1f} s, {scores[name][-1]}", flush=True)
    arms = {}
    for name, arm_runs in runs.items():
        arms[name] = {"runs": arm_runs, "scores": scores[name],
                      **{f"{k}_median": statistics.median(s[k] for s in scores[name] if s[k] is not None) for k in ("before", "drop", "after", "restored")},
                      "wall_median_s": statistics.median(run["wall_s"] for run in arm_runs)}
    write_result(args.out, {"config": str(CONFIG.relative_to(ROOT)), "steps": steps, "drift_at": args.drift_at, "recover": args.recover,
                            "span": args.span, "repeats": args.repeats, "arms": arms})
    print("| arm | before the drift | first 50 steps after | steps "
          f"{args.recover - args.span}-{args.recover} after | lost throughput won back | wall s | moves |")
    print("|---|---|---|---|---|---|---|")
    for name, arm in arms.items():
        def cell(key: str, fmt: str) -> str:
            values = [s[key] for s in arm["scores"] if s[key] is not None]
            return f"{format(arm[key + '_median'], fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"
        walls = [run["wall_s"] for run in arm["runs"]]
        print(f"| {name} | {cell('before', ',.0f')} | {cell('drop', ',.0f')} | {cell('after', ',.0f')} | {cell('restored', '.0%')} "
              f"| {arm['wall_median_s']:.0f} ({min(walls):.0f}-{max(walls):.0f}) | {', '.join(str(s['moves']) for s in arm['scores'])} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

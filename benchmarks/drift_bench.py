"""Drift benchmark: a job whose data changes mid-run, left alone or retuning itself.

Each case is a 2-rank gloo job (`dlrm-scale train`, as a user runs it) whose synthetic data
drifts at --drift-at:
- hot_set: the tiering benchmark's config (`configs/bench_tiered.yaml`: 8 tables of 2M rows, a
  quarter of their rows cached, the rest on SSD behind the row cache); every table's hot set moves
  (a new permutation of its Zipf ranks), so the caches, warmed on the old hot set, miss. The store
  is read with O_DIRECT (`--store-io direct`) so that a miss costs the disk's read, not the page
  cache's copy. --drift-at + --recover steps.
- grows_hot: `configs/bench_grows_hot.yaml` (8 equal tables of 250k rows, 8 ids a sample, in
  memory); table t0's bags grow GROWTH times longer (`--drift-grows`), so the rank that holds it
  does most of the work. 1,000 steps: a move is worth its seconds only with steps left to gain them.
Arms, alternated within a round, --repeats rounds:
- static: the plan made at start, kept;
- retune: the same with `--retune` (its measurements, decisions and any move in the run);
- planned (grows_hot): the config with t0 as it grows, planned for it from the start, no drift
  (from the drift step on its batches are the drifting jobs'): what a plan made for the grown
  table runs at, the reference the others are held to after the drift.
Per run, samples/s (the mean of the logged windows' samples/s) over: the --span steps before the drift
(`before`), the first 50 after it (`drop`), --span steps ending --recover steps after it
(`after`) and the rest of the job (`rest`, grows_hot); hot_set: `restored` = (after - drop) /
(before - drop), the share of the lost throughput won back by then. grows_hot, whose work after
the drift is more than before: `won back`, the share of the gap between the static plan and the
planned reference that retuning closed, over the rest of the job.

    python -m benchmarks.drift_bench [--case hot_set|grows_hot] [--drift-at 250] [--recover 300] [--repeats 3]

Writes the case's entry of benchmarks/results/drift.json (the other case's is kept) and prints a
Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from benchmarks.common import ROOT, provenance, train_job, write_result

RESULTS = ROOT / "benchmarks" / "results" / "drift.json"
DROP_STEPS = 50
GROWS, GROWTH = "t0", 12  # grows_hot: the table that grows hot, and how many times longer its bags grow


@dataclass(frozen=True)
class Case:
    config: Path
    flags: tuple[str, ...]  # besides --drift-at: how the data drifts, and how the store reads
    steps: int | None  # None: --drift-at + --recover
    store: bool  # its tables have rows on SSD (each run's store folder made and removed)
    arms: tuple[str, ...]


CASES = {
    "hot_set": Case(ROOT / "configs" / "bench_tiered.yaml", ("--store-io", "direct"), None, True, ("static", "retune")),
    "grows_hot": Case(ROOT / "configs" / "bench_grows_hot.yaml", ("--drift-grows", f"{GROWS}={GROWTH}"), 1000, False,
                      ("static", "retune", "planned")),
}


def grown_config(case: Case, folder: Path) -> Path:
    """The case's config with the table grown as the drift grows it (the planned arm's)."""
    doc = yaml.safe_load(case.config.read_text())
    for table in doc["tables"]:
        if table["name"] == GROWS:
            table["pooling_factor"] *= GROWTH
    path = folder / f"{case.config.stem}_grown.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_job(case: Case, arm: str, steps: int, drift_at: int, folder: Path, name: str) -> dict:
    """One job: its wall time, each logged window's (step, samples/s, cache hit rate), and its
    retune records."""
    out, store = folder / name, folder / f"{name}_store"
    if arm == "planned":
        args = ["--config", str(grown_config(case, folder)), "--steps", str(steps)]
    else:
        args = ["--config", str(case.config), "--steps", str(steps), "--drift-at", str(drift_at), *case.flags,
                *(["--retune"] if arm == "retune" else [])]
    if case.store:
        store.mkdir(parents=True)
        args += ["--store-dir", str(store)]
    wall, records = train_job(args, out)
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


def score(run: dict, drift_at: int, recover: int, span: int, steps: int, drifts: bool) -> dict:
    """The run's rates; for a run whose data does not drift (the planned reference), only those after the drift step."""
    after = rate(run["windows"], drift_at + recover - span, drift_at + recover)
    rest = rate(run["windows"], drift_at + recover, steps) if steps > drift_at + recover else None
    out = {"before": None, "drop": None, "after": after, "rest": rest, "restored": None,
           "moves": sum(1 for d in run["retune"] if d.get("move"))}
    if drifts:
        before = rate(run["windows"], drift_at - span, drift_at)
        drop = rate(run["windows"], drift_at, drift_at + DROP_STEPS)
        out.update(before=before, drop=drop, restored=(after - drop) / (before - drop) if before > drop else None)
    return out


def won_back(arms: dict) -> float | None:
    """The share of the gap between the static plan and the planned reference that retuning
    closed over the rest of the job, by the arms' medians."""
    static, planned = arms["static"]["rest_median"], arms["planned"]["rest_median"]
    return (arms["retune"]["rest_median"] - static) / (planned - static) if planned > static else None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", choices=sorted(CASES), default="hot_set")
    ap.add_argument("--drift-at", type=int, default=250, help="the step the data drifts (the caches warm up before it)")
    ap.add_argument("--recover", type=int, default=300, help="steps after the drift the throughput is judged at")
    ap.add_argument("--span", type=int, default=50, help="steps each rate is a mean over")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    case = CASES[args.case]
    steps = case.steps or args.drift_at + args.recover
    if (args.repeats < 1 or args.span < 10 or args.drift_at <= args.span or args.recover < max(args.span, DROP_STEPS)
            or args.drift_at + args.recover > steps):
        ap.error(f"--repeats takes >= 1, --span >= 10, --drift-at more than --span, --recover at least --span and 50, "
                 f"and --drift-at + --recover at most the case's {steps} steps")
    runs: dict[str, list[dict]] = {name: [] for name in case.arms}
    scores: dict[str, list[dict]] = {name: [] for name in case.arms}
    with tempfile.TemporaryDirectory() as d:
        for r in range(args.repeats):
            for arm in case.arms:
                runs[arm].append(run_job(case, arm, steps, args.drift_at, Path(d), f"{arm}_{r}"))
                scores[arm].append(score(runs[arm][-1], args.drift_at, args.recover, args.span, steps, arm != "planned"))
                print(f"{arm} round {r}: {runs[arm][-1]['wall_s']:.1f} s, {scores[arm][-1]}", flush=True)
    arms = {}
    for arm, arm_runs in runs.items():
        medians = {f"{k}_median": statistics.median(values) for k in ("before", "drop", "after", "rest", "restored")
                   if (values := [s[k] for s in scores[arm] if s[k] is not None])}
        arms[arm] = {"runs": arm_runs, "scores": scores[arm], **medians, "wall_median_s": statistics.median(run["wall_s"] for run in arm_runs)}
    entry = {"provenance": provenance(), "config": str(case.config.relative_to(ROOT)), "flags": list(case.flags), "steps": steps,
             "drift_at": args.drift_at, "recover": args.recover, "span": args.span, "repeats": args.repeats, "arms": arms}
    if "planned" in arms:
        entry["won_back"] = won_back(arms)
    out = Path(args.out)
    cases = json.loads(out.read_text()).get("cases", {}) if out.exists() else {}
    write_result(out, {"cases": {**cases, args.case: entry}})
    last = "rest" if "planned" in arms else "restored"
    heads = {"rest": f"steps {args.drift_at + args.recover}-{steps}", "restored": "lost throughput won back"}
    print(f"| arm | before the drift | first 50 steps after | steps {args.recover - args.span}-{args.recover} after | {heads[last]} "
          "| wall s | moves |")
    print("|---|---|---|---|---|---|---|")
    for arm, summary in arms.items():
        def cell(key: str, fmt: str) -> str:
            values = [s[key] for s in summary["scores"] if s[key] is not None]
            return f"{format(summary[key + '_median'], fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})" if values else "-"
        walls = [run["wall_s"] for run in summary["runs"]]
        print(f"| {arm} | {cell('before', ',.0f')} | {cell('drop', ',.0f')} | {cell('after', ',.0f')} "
              f"| {cell(last, ',.0f' if last == 'rest' else '.0%')} | {summary['wall_median_s']:.0f} ({min(walls):.0f}-{max(walls):.0f}) "
              f"| {', '.join(str(s['moves']) for s in summary['scores'])} |")
    if "won_back" in entry:
        won = entry["won_back"]
        print(f"of the gap between static and planned over the rest of the job, retuning won back {won:.0%}" if won is not None
              else "the planned reference was no faster than static over the rest of the job")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

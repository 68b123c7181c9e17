"""Planner regret as users meet it: each plan trained as its own job, many alternated rounds.

regret_paired.py measures plans side by side in one job, where every plan's model lives in the
same two processes; there a plan's ratio also moves 3-5% from job to job with where its
memory lands, and a process holds several models at once, which no user runs. costmodel_bench.py
trains each plan as its own job, but only 3 times, and a job's step varies by ~11% from one run
to the next. Here one mix's plans are trained as separate `torchrun -m dlrm_scale.train` jobs
(as costmodel_bench.py trains them), round after round, the plans' order rotating each round,
so a slow spell of the machine falls on neighbouring jobs of every plan:
- a job's step: the median over its logging windows after the first (as every benchmark here);
- per round, each plan's step over ours in that round; the regret: ours' median step over the
  fastest plan's, with a 90% bootstrap interval resampling whole rounds;
- each plan's phases per rank (median over its jobs), to trace a regret to a phase and a rank.

    python -m benchmarks.regret_jobs [--mix 7] [--plans ours,torchrec,table_wise] [--rounds 20] [--steps 120]
    python -m benchmarks.regret_jobs --pool A.json B.json --out POOLED.json   # trains nothing

Needs the held-out profile costmodel_bench.py fitted (--hardware, default
the cpu_xeon_m167 profile: ours is planned with it, as in that
benchmark). Writes --out (default benchmarks/results/regret_jobs_mixN.json) after every round.
--pool puts the rounds of earlier runs of one mix together (the labels they all ran, each
label's plan the same in every run) and scores them as one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np


from benchmarks.costmodel_bench import (PLANS, RESULTS, TABLE_COUNTS, generate_mix, given_plan, layout_key,
                                        run_cli, train, write_config)
from benchmarks.regret_paired import rotated
from dlrm_scale.run_config import load_problem
from dlrm_scale.tools.runs import load_run
from planner.spec.errors import ConfigError
from benchmarks.common import write_result

RESAMPLES = 4000
SUMMARY = ("rounds", "fastest", "median_step_ms", "over_fastest", "over_fastest_interval_90", "over_ours_median_of_rounds")


def regret(steps: dict[str, list[float]], layouts: dict[str, str]) -> dict:
    """Ours (and each plan) over the fastest, from the plans' median steps; a 90% interval from
    whole rounds resampled (round k of every plan together). Labels that trained the same plan
    are pooled round by round."""
    pooled = {}
    for label, layout in layouts.items():
        pooled.setdefault(layout, []).append(np.array(steps[label]))
    by_layout = {k: np.mean(v, axis=0) for k, v in pooled.items()}  # a round's step, labels of one plan averaged
    medians = {label: float(np.median(by_layout[layouts[label]])) for label in steps}
    fastest = min(medians, key=medians.get)
    keys = sorted(by_layout)
    table = np.stack([by_layout[k] for k in keys], axis=1)  # [round, layout]
    rng = np.random.default_rng(0)
    draws = np.median(table[rng.integers(0, len(table), size=(RESAMPLES, len(table)))], axis=1)  # [resample, layout]
    over_fastest = draws / draws.min(axis=1, keepdims=True)
    interval = {label: [float(q) for q in np.percentile(over_fastest[:, keys.index(layouts[label])], [5, 95])] for label in steps}
    per_round = {label: [round(a / b, 4) for a, b in zip(steps[label], steps["ours"])] for label in steps}
    return {"fastest": fastest, "median_step_ms": medians, "over_fastest": {k: v / medians[fastest] for k, v in medians.items()},
            "over_fastest_interval_90": interval, "over_ours_per_round": per_round,
            "over_ours_median_of_rounds": {k: float(np.median(v)) for k, v in per_round.items()}}


def phase_medians(phases: list[tuple[dict[str, float], ...]]) -> list[dict[str, float]]:
    """Each rank's median over a plan's jobs of each phase group (ms a step): where a plan's
    step goes, so a regret can be traced to a phase and a rank."""
    return [{g: round(float(np.median([job[r][g] for job in phases])), 4) for g in phases[0][r]} for r in range(len(phases[0]))]


def write(out: Path, args: argparse.Namespace, layouts: dict[str, str], steps: dict[str, list[float]], rounds: int,
          phases: dict[str, list]) -> dict:
    doc = {"mix": args.mix, "rounds": rounds, "rounds_asked": args.rounds, "steps": args.steps, "hardware": args.hardware,
           "layouts": layouts, "steps_ms": steps, **regret(steps, layouts),
           "phase_ms_median_per_rank": {label: phase_medians(p) for label, p in phases.items()}}
    write_result(out, doc)
    return doc


def _run_document(path: Path) -> dict:
    """A regret_jobs output read back, its fields checked: a missing or damaged file is one line."""
    fix = "give regret_jobs outputs (their --out)"
    if not path.is_file():
        raise ConfigError(f"--pool: no such file {path}; {fix}")
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ConfigError(f"--pool: {path} is not JSON; {fix}") from None
    if (not isinstance(doc, dict) or not isinstance(doc.get("mix"), int) or not isinstance(doc.get("layouts"), dict)
            or not isinstance(doc.get("steps_ms"), dict) or set(doc["layouts"]) - set(doc["steps_ms"])
            or not all(isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in doc["steps_ms"].values())):
        raise ConfigError(f"--pool: {path} is not a regret_jobs output (mix, layouts, steps_ms); {fix}")
    return doc


def pooled(files: list[Path]) -> dict:
    """The rounds of `files` (regret_jobs outputs of one mix) as one run: the labels all of them
    trained, each with one plan throughout."""
    docs = [_run_document(f) for f in files]
    labels = [label for label in docs[0]["layouts"] if all(label in d["layouts"] for d in docs)]
    if "ours" not in labels or len({d["mix"] for d in docs}) > 1:
        raise ConfigError(f"--pool: {', '.join(map(str, files))} are not runs of one mix that all trained ours")
    for label in labels:
        if len({d["layouts"][label] for d in docs}) > 1:
            raise ConfigError(f"--pool: {label} trained another plan in one of {', '.join(map(str, files))}; pool runs of the same plans")
    layouts = {label: docs[0]["layouts"][label] for label in labels}
    steps = {label: [ms for d in docs for ms in d["steps_ms"][label]] for label in labels}
    return {"mix": docs[0]["mix"], "pooled_from": [f.name for f in files], "rounds": len(steps["ours"]), "layouts": layouts,
            "steps_ms": steps, **regret(steps, layouts)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the training options' defaults, applied after parsing: --pool trains nothing and refuses them
    training = {"mix": 7, "plans": "ours,torchrec,table_wise", "rounds": 20, "steps": 120,
                "hardware": "cpu_xeon_m167"}
    ap.add_argument("--mix", type=int, help=f"default {training['mix']}")
    ap.add_argument("--plans", help=f"labels among {', '.join(PLANS)}; ours is needed (default {training['plans']})")
    ap.add_argument("--rounds", type=int, help=f"default {training['rounds']}")
    ap.add_argument("--steps", type=int, help=f"default {training['steps']}")
    ap.add_argument("--hardware", help=f"default {training['hardware']}")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--pool", type=Path, nargs="+", metavar="JSON", help="train nothing: pool these runs' rounds into --out")
    args = ap.parse_args()
    if args.pool:
        given = [f"--{name}" for name in training if getattr(args, name) is not None]
        if given:
            ap.error(f"--pool trains nothing: leave out {', '.join(given)}")
        if args.out is None:
            ap.error("--pool needs --out")
        doc = pooled(args.pool)
        write_result(args.out, doc)
        print(json.dumps({k: doc[k] for k in SUMMARY}, indent=1))
        return 0
    for name, value in training.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    labels = [p for p in args.plans.split(",") if p]
    if not 0 <= args.mix < len(TABLE_COUNTS) or "ours" not in labels or set(labels) - set(PLANS) or args.rounds < 3 or args.steps < 30:
        ap.error(f"--mix in 0-{len(TABLE_COUNTS) - 1}, --plans among {', '.join(PLANS)} with ours, --rounds >= 3, --steps >= 30")
    out = args.out or RESULTS / f"regret_jobs_mix{args.mix}.json"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        config = folder / f"mix{args.mix}.yaml"
        write_config(config, generate_mix(args.mix), args.hardware)
        problem = load_problem(config)
        plans = {label: given_plan(problem, label) for label in labels}
        steps: dict[str, list[float]] = {label: [] for label in labels}
        phases: dict[str, list] = {label: [] for label in labels}
        layouts: dict[str, str] = {}
        for r in range(args.rounds):
            for label in rotated(labels, r):
                run_dir = folder / f"{label}_r{r}"
                train(config, args.steps, label, plans[label], run_dir, print)
                run = load_run(run_dir, args.hardware)
                layouts.setdefault(label, layout_key(run.plan))
                if layout_key(run.plan) != layouts[label]:
                    raise RuntimeError(f"{label} trained another plan in round {r}: the planner is not deterministic")
                steps[label].append(run.step_ms)
                phases[label].append(run.phases_ms)
                shutil.rmtree(run_dir)
                print(f"round {r} {label}: {run.step_ms:.2f} ms", flush=True)
            doc = write(out, args, layouts, steps, r + 1, phases)  # after every round: a stopped run keeps its rounds
    print(json.dumps({k: doc[k] for k in SUMMARY}, indent=1))
    return 0


if __name__ == "__main__":
    run_cli(main)

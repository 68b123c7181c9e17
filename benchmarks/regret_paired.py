"""Planner regret measured side by side: each held-out mix of the cost-model benchmark trained
under all its plans in the same two gloo processes, in blocks of steps alternated plan by plan.

costmodel_bench.py trains each plan as its own job, and on these machines a job's step varies
by ~11% from one run to the next (whole runs slowing, every phase alike): a regret of 1.02 is
then out of reach of any affordable number of repeats. Here every plan's model lives in the
same processes and the plans take turns, a block of steps each, so a slow spell of the machine
falls on all of them alike and their ratio is measured to a fraction of that spread.

- plans: as costmodel_bench.py (ours planned with the refitted profile, TorchRec's planner's,
  all table-wise, column-wise, row-wise, mostly data-parallel), in two groups that both hold
  ours (`GROUPS`: six models of a 2.6 GiB mix would not fit this 24 GB machine at once); labels
  that make the same plan train it once;
- each group run as `--jobs` separate jobs, job k building the models in an order rotated by
  k: the same plans' ratio moves by 3-5% from one job to the next (where each model's memory
  lands), more than within a job, so only several jobs measure it;
- each plan first runs `--warmup` steps untimed, then `--blocks` rounds, each round a block of
  `--block-steps` steps per plan (the plans' order rotating round by round); a block's first
  step is left out (it meets caches the other plans filled);
- a plan's step: the median of its timed steps (rank 0's wall clock between steps; the
  collectives keep the ranks in step); each plan over ours in each job, the geometric mean of
  those over a group's jobs, and from those the regret: ours (or TorchRec's) over the fastest,
  with a 90% bootstrap interval resampling a group's jobs and, within each, its whole rounds
  (the same rounds for every plan of a job);
- each plan's time per phase group on each rank (the trainer's phase timers over a block's
  timed steps, the median over rounds and jobs) beside `simulate`'s prediction: where, within
  one job, one plan's step is longer than another's.

    python -m benchmarks.regret_paired [--mixes 1,3,5,7,9,11] [--jobs 3] [--blocks 12] [--block-steps 8] [--hardware YAML] [--out JSON]
    python -m benchmarks.regret_paired --pool A.json B.json [...] --out JSON   # trains nothing

`--pool` scores the jobs of earlier runs together, mix by mix (the mixes every file holds), as
if one run had made them all: each file's plans must be the same (their layouts are compared).

Plans ours with --hardware (default the cpu_epyc_zen4 profile, costmodel_bench's refit there). Writes --out
(default benchmarks/results/regret_paired.json) and prints a Markdown table for the README.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


from benchmarks.costmodel_bench import RESULTS, WORLD, generate_mix, layout_key, plan_for, write_config
from benchmarks.common import ROOT, write_result
from planner.spec.config import hardware_path
from planner.spec.errors import ConfigError

FITTED = "cpu_epyc_zen4"
HELD_OUT = (1, 3, 5, 7, 9, 11)
GROUPS = (("ours", "torchrec", "table_wise"), ("ours", "column_wise", "row_wise", "mostly_data_parallel"))
RESAMPLES = 4000


def worker(config: Path, labels: list[str], rotate: int, blocks: int, block_steps: int, warmup: int, out: Path) -> None:
    """One rank: each distinct plan of `labels` built side by side (in their order rotated by
    `rotate`), then the rounds of blocks."""
    import torch
    import torch.distributed as dist

    from dlrm_scale.run_config import Overrides, load_run_config
    from dlrm_scale.tools.simulate import simulate
    from dlrm_scale.train import init_distributed
    from dlrm_scale.training.build import build_parts
    from dlrm_scale.training.phases import step_runner
    from dlrm_scale.training.prefetch import batch_source
    from dlrm_scale.training.rank_end import end_rank
    from planner.plan.document import Plan

    rank, world, device = init_distributed()
    run = load_run_config(config, Overrides(world_size=world, ranks_per_node=int(os.environ["LOCAL_WORLD_SIZE"]), device="cpu"))
    box = [None]
    if rank == 0:  # ours and TorchRec's planned once, as the trainer plans at start
        box = [{label: plan_for(run.problem, label).to_dict() for label in labels}]
    dist.broadcast_object_list(box, src=0)
    plans = {label: Plan.from_dict(doc) for label, doc in box[0].items()}
    layouts = {label: layout_key(plan) for label, plan in plans.items()}
    distinct = list(dict.fromkeys(layouts.values()))
    steps = warmup + blocks * block_steps
    build_order = rotated(distinct, rotate)
    with contextlib.ExitStack() as stack:
        runners, batches, timers = {}, {}, {}
        for key in build_order:
            plan = plans[next(label for label in labels if layouts[label] == key)]
            torch.manual_seed(run.train.seed)
            parts = build_parts(run, plan, device, rank, world, None, True)
            if parts.cpu_kernel is not None:
                stack.callback(parts.cpu_kernel.close)
            parts.model.train()
            runners[key] = step_runner(run.train.pipeline, parts.model, parts.optimizer, device, parts.timer)
            timers[key] = parts.timer
            batches[key] = stack.enter_context(batch_source(parts.data.batches(0, steps + 4), steps + 4, run.train.materialise_mib,
                                                            run.train.prefetch_batches, rank))
        for key in distinct:
            for _ in range(warmup):
                runners[key].progress(batches[key])
        timed = {key: [] for key in distinct}  # [round][step] ms
        phases = {key: [] for key in distinct}  # [round] phase -> ms a step, this rank's
        for r in range(blocks):
            for key in rotated(distinct, r):
                dist.barrier()
                timers[key].skip()
                ms, last = [], time.perf_counter()
                for i in range(block_steps):
                    runners[key].progress(batches[key])
                    now = time.perf_counter()
                    ms.append((now - last) * 1e3)
                    last = now
                    if i == 0:  # the block's first step is left out of its phases too
                        timers[key].take()
                timed[key].append(ms[1:])
                phases[key].append({p: s * 1e3 / (block_steps - 1) for p, s in timers[key].take().items()})
        ranks_phases = [None] * world
        dist.all_gather_object(ranks_phases, phases)
    if rank == 0:
        built_first = next(label for label in labels if layouts[label] == build_order[0])
        predicted = {label: [r.phases_ms for r in simulate(plan, run.problem, run.model, run.train.dense_optimizer).ranks]
                     for label, plan in plans.items()}
        out.write_text(json.dumps({"layouts": layouts, "built_first": built_first,
                                   "steps_ms": {label: timed[layouts[label]] for label in labels},
                                   "phases_ms": {label: [p[layouts[label]] for p in ranks_phases] for label in labels},
                                   "predicted_ms": predicted}))
    end_rank(0)


def rotated(items: list, k: int) -> list:
    return items[k % len(items):] + items[:k % len(items)]


def regret(groups: list[list[dict[str, list[list[float]]]]], rng: np.random.Generator) -> dict:
    """`groups[g][k]`: job k of group g, each plan's steps by round. Each plan's median step
    over ours' in each job, the geometric mean over its group's jobs; ours' and TorchRec's over
    the fastest plan's, with 90% bootstrap intervals (a group's jobs resampled, and each
    drawn job's rounds, the same rounds for every plan of a job)."""
    def over_ours(job, picks=None):
        med = {p: float(np.median(np.concatenate(v if picks is None else [v[i] for i in picks]))) for p, v in job.items()}
        return {p: m / med["ours"] for p, m in med.items()}

    def geometric_mean(ratios):  # [job] plan -> ratio  =>  plan -> ratio
        return {p: float(np.exp(np.mean([np.log(r[p]) for r in ratios]))) for p in ratios[0]}

    def drawn(jobs):
        jobs = [jobs[k] for k in rng.integers(0, len(jobs), size=len(jobs))]
        return geometric_mean([over_ours(j, rng.integers(0, len(j["ours"]), size=len(j["ours"]))) for j in jobs])

    def summary(relative):  # plan -> its step over ours
        fastest = min(relative.values())
        return relative["ours"] / fastest, relative["torchrec"] / fastest

    per_job = [[over_ours(j) for j in jobs] for jobs in groups]
    relative = {p: r for ratios in per_job for p, r in geometric_mean(ratios).items()}
    draws = np.array([summary({p: r for jobs in groups for p, r in drawn(jobs).items()}) for _ in range(RESAMPLES)])
    ours, torchrec = summary(relative)
    # ours comes first in `relative`, so a plan only as fast as ours leaves ours the fastest
    return {"fastest": min(relative, key=relative.get), "over_ours": relative,
            "over_ours_per_job": {p: [r[p] for r in ratios] for ratios in per_job for p in ratios[0] if p != "ours"},
            "median_step_ms_first_job": {p: float(np.median(np.concatenate(v))) for jobs in groups for p, v in jobs[0].items()},
            "ours": ours, "ours_interval_90": [float(q) for q in np.percentile(draws[:, 0], [5, 95])],
            "torchrec": torchrec, "torchrec_interval_90": [float(q) for q in np.percentile(draws[:, 1], [5, 95])]}


def phase_summary(groups: list[list[dict]]) -> dict:
    """Each plan's time per phase group (as `simulate` groups the timers), per rank: the median
    over its jobs' rounds, beside the prediction; jobs that predate the phase timers are left out."""
    from dlrm_scale.run_record import PHASE_GROUPS

    out = {}
    for jobs in groups:
        jobs = [j for j in jobs if "phases_ms" in j]
        for label in (jobs[0]["phases_ms"] if jobs else ()):
            if label in out:
                continue
            ranks = len(jobs[0]["phases_ms"][label])
            out[label] = {"measured_ms": [{g: float(np.median([sum(rnd[p] for p in phases) for j in jobs for rnd in j["phases_ms"][label][r]]))
                                           for g, phases in PHASE_GROUPS.items()} for r in range(ranks)],
                          "predicted_ms": jobs[0]["predicted_ms"][label], "jobs": len(jobs)}
    return out


def print_phases(results: dict) -> None:
    from dlrm_scale.run_record import PHASE_GROUPS

    print("| mix | plan | rank | " + " | ".join(PHASE_GROUPS) + " |\n|---|---|---|" + "---|" * len(PHASE_GROUPS))
    for m, r in results.items():
        for label, ph in r.get("phases", {}).items():
            for rank, (meas, pred) in enumerate(zip(ph["measured_ms"], ph["predicted_ms"])):
                print(f"| {m} | {label} | {rank} | " + " | ".join(f"{meas[g]:.1f} ({pred[g]:.1f})" for g in PHASE_GROUPS) + " |")


def run_job(config: Path, labels: tuple[str, ...], rotate: int, args, out: Path) -> dict:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "-m", "benchmarks.regret_paired",
           "--blocks", str(args.blocks), "--block-steps", str(args.block_steps), "--warmup", str(args.warmup),
           "--worker", str(config), ",".join(labels), str(rotate), str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"{config.stem} {labels} job {rotate}: {proc.stderr[-3000:]}")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixes", default=",".join(map(str, HELD_OUT)), help="held-out mixes of costmodel_bench.py, by index")
    ap.add_argument("--jobs", type=int, default=3, help="jobs per group of plans, each building its models in a rotated order")
    ap.add_argument("--blocks", type=int, default=12, help="rounds; each gives every plan one block")
    ap.add_argument("--block-steps", type=int, default=8, help="steps per block (its first left out)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed steps per plan before the rounds")
    ap.add_argument("--out", type=Path, default=RESULTS / "regret_paired.json")
    ap.add_argument("--hardware", default=FITTED,
                    help="the profile ours is planned with (default: the cost-model benchmark's refit; on another machine, "
                         "a refit made there: profiles are per machine)")
    ap.add_argument("--pool", nargs="+", type=Path, metavar="JSON", help="score earlier runs' jobs together; trains nothing")
    ap.add_argument("--worker", nargs=4, metavar=("CONFIG", "PLANS", "ROTATE", "OUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.worker[1].split(","), int(args.worker[2]), args.blocks, args.block_steps, args.warmup,
               Path(args.worker[3]))
        return 0
    if not args.out.parent.is_dir():
        print(f"error: --out {args.out}: its folder does not exist; create it or give another path", file=sys.stderr)
        return 2
    if args.pool:
        return pool(args.pool, args.out)
    try:
        mixes = [int(m) for m in args.mixes.split(",")]
    except ValueError:
        mixes = []
    if (not mixes or any(not 0 <= m < 12 for m in mixes) or args.jobs < 1 or args.blocks < 3 or args.block_steps < 2
            or args.warmup < 0):
        print("error: --mixes takes indices 0-11 (comma-separated), --jobs >= 1, --blocks >= 3, --block-steps >= 2, --warmup >= 0",
              file=sys.stderr)
        return 2
    try:
        hardware_path(args.hardware)
    except ConfigError as e:
        print(f"error: --hardware: {e}", file=sys.stderr)
        return 2
    rng = np.random.default_rng(0)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for index in mixes:
            config = Path(tmp) / f"mix{index}.yaml"
            write_config(config, generate_mix(index), str(args.hardware))
            start, jobs = time.monotonic(), [[] for _ in GROUPS]
            for k in range(args.jobs):  # a round of every group's job k, so a slow hour falls on every group
                for g, labels in enumerate(GROUPS):
                    jobs[g].append(run_job(config, labels, k, args, Path(tmp) / f"mix{index}_{g}_{k}.json"))
            r = results[f"mix{index}"] = {**regret([[j["steps_ms"] for j in group] for group in jobs], rng),
                                          "phases": phase_summary(jobs), "jobs": jobs, "seconds": time.monotonic() - start}
            print(f"mix{index}: fastest {r['fastest']}, ours {r['ours']:.3f} {r['ours_interval_90']}, "
                  f"torchrec {r['torchrec']:.3f} ({r['seconds']:.0f} s)", flush=True)
    doc = {"jobs": args.jobs, "blocks": args.blocks, "block_steps": args.block_steps,
           "warmup": args.warmup, "hardware": args.hardware, "mixes": results}
    write_result(args.out, doc)
    print_table(results)
    print_phases(results)
    return 0


def pool(paths: list[Path], out: Path) -> int:
    """The jobs of the runs in `paths` scored together, mix by mix (those every run holds)."""
    try:
        docs = {p: json.loads(p.read_text()) for p in paths}
        runs = [d["mixes"] for d in docs.values()]
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"error: --pool: {e}; give JSON files this benchmark wrote", file=sys.stderr)
        return 2
    older = [str(p) for p, d in docs.items() if not isinstance(d.get("jobs"), int)]
    if older:
        print(f"error: --pool: {older[0]} was written before runs had several jobs; pool runs of this version", file=sys.stderr)
        return 2
    mixes = [m for m in runs[0] if all(m in r for r in runs[1:])]
    if not mixes:
        print("error: --pool: no mix is in every file; pool runs that measured the same mixes", file=sys.stderr)
        return 2
    results, rng = {}, np.random.default_rng(0)  # one generator over the mixes, as a run's
    for m in mixes:
        groups = [[job for r in runs for job in r[m]["jobs"][g]] for g in range(len(GROUPS))]
        for g in groups:
            if len({json.dumps(job["layouts"], sort_keys=True) for job in g}) > 1:
                print(f"error: --pool: {m}'s runs trained different plans (their layouts differ); pool runs of the same planner",
                      file=sys.stderr)
                return 2
        results[m] = {**regret([[job["steps_ms"] for job in g] for g in groups], rng),
                      "phases": phase_summary(groups), "jobs_pooled": len(groups[0])}
    write_result(out, {"pooled": [str(p) for p in paths], "mixes": results})
    print_table(results)
    print_phases(results)
    return 0


def print_table(results: dict) -> None:
    print("| mix | fastest plan (its step / ours') | ours regret (90%) | TorchRec regret (90%) |\n|---|---|---|---|")
    for m, r in results.items():
        (a, b), (c, d) = r["ours_interval_90"], r["torchrec_interval_90"]
        print(f"| {m} | {r['fastest']} ({r['over_ours'][r['fastest']]:.3f}) | {r['ours']:.3f} ({a:.3f}-{b:.3f}) | "
              f"{r['torchrec']:.3f} ({c:.3f}-{d:.3f}) |")


if __name__ == "__main__":
    sys.exit(main())

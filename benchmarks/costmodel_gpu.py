"""The cost model on one GPU: the cost-model benchmark's 12 mixes trained on one GPU, the
datasheet profile refitted to the fit half and scored on the held-out half.

Made for a GPU machine held for minutes, so a first look, not costmodel_bench.py:
- one rank: no all-to-all, and the plan's only choices are each table's kernel and tier;
- two plans a mix: ours (`--planner ours`, priced by --hardware) and every table that holds
  CACHE_HEADROOM times the rows a batch looks up behind a UVM cache of CACHE_LOAD_FACTOR;
- one run a plan; runs stop being started when --budget-s is spent (ours over every mix first).

    # on the GPU machine, with the stack unpacked (scripts/offline_cuda/unpack.sh):
    python -m benchmarks.costmodel_gpu --train --runs /tmp/runs --archive $OUT/runs.tar.gz --budget-s 340
    # here, on what came back (a call returns at most 8 files: the runs come back as one archive):
    tar xzf runs.tar.gz -C DIR && python -m benchmarks.costmodel_gpu --runs DIR/runs [--name h200]

Scoring writes benchmarks/results/costmodel_gpu_NAME.json and the profile configs/hardware/gpu_NAME.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path


from benchmarks.costmodel_bench import (TABLE_COUNTS, accuracy, generate_mix, layout_key, phase_errors,
                                        run_cli, shown_path, write_config)
from dlrm_scale.run_config import load_problem
from dlrm_scale.tools.fit import compare, profile_values
from dlrm_scale.tools.runs import load_run
from planner.spec.config import HARDWARE_DIR, hardware_path
from planner.spec.errors import ConfigError
from planner.plan.document import Plan, table_layout
from planner.spec.types import ShardingType
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results"
PLANS = ("ours", "uvm_cached")
CACHE_LOAD_FACTOR = 0.2
CACHE_HEADROOM = 4  # a cache smaller than this many batches' lookups would miss on most of them
RUN_S_ESTIMATE = 30  # a run's start-up and steps on an H200; none is started with less left


def cached_plan(config: Path) -> Plan:
    problem = load_problem(config)
    batch = problem.training.batch_size_per_rank
    tables = {t.name: table_layout(t, ShardingType.TABLE_WISE, [0],
                                   "ddr" if t.num_embeddings >= CACHE_HEADROOM * t.pooling_factor * batch else "hbm",
                                   CACHE_LOAD_FACTOR)
              for t in problem.tables}
    return Plan(1, 1, tables, (), 0.0, 0.0)


def archive_runs(runs: Path, archive: Path) -> None:
    """The runs so far as one file, replaced whole (a cut-off call still returns the last)."""
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(runs, arcname=runs.name)
    partial.replace(archive)


def train_all(runs: Path, hardware: str, steps: int, budget_s: float, archive: Path | None) -> None:
    started = time.monotonic()
    runs.mkdir(parents=True, exist_ok=True)
    for label in PLANS:
        for index in range(len(TABLE_COUNTS)):
            left = budget_s - (time.monotonic() - started)
            if left < RUN_S_ESTIMATE:
                print(f"budget spent: mix{index} {label} and later not run", flush=True)
                return
            config = runs / f"mix{index}.yaml"
            if not config.is_file():
                write_config(config, generate_mix(index), hardware, world=1, log_every=steps // 6)
            out = runs / f"mix{index}_{label}"
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
                   "-m", "dlrm_scale.train", "--config", str(config), "--steps", str(steps), "--out-dir", str(out)]
            if label == "ours":
                cmd += ["--planner", "ours"]
            else:
                cached_plan(config).save(runs / f"mix{index}_{label}.plan.json")
                cmd += ["--plan", str(runs / f"mix{index}_{label}.plan.json")]
            t0 = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=max(left, 1))
            except subprocess.TimeoutExpired:
                print(f"mix{index} {label}: past the budget, stopped", flush=True)
                shutil.rmtree(out, ignore_errors=True)
                return
            if proc.returncode != 0:
                (runs / f"mix{index}_{label}.log").write_text(proc.stdout[-5000:] + proc.stderr[-20000:])
                shutil.rmtree(out, ignore_errors=True)
                print(f"mix{index} {label}: failed (exit {proc.returncode}), log kept", flush=True)
                continue
            shutil.rmtree(out / "tensorboard", ignore_errors=True)
            if archive is not None:
                archive_runs(runs, archive)
            run = load_run(out)
            print(f"mix{index} {label}: {run.step_ms:.2f} ms a step measured, {compare(run).predicted_step_ms:.3f} predicted "
                  f"by {hardware}; {time.monotonic() - t0:.0f} s", flush=True)


def describe(run, fitted_values: dict, datasheet_values: dict) -> dict:
    refit, datasheet = compare(run, fitted_values), compare(run, datasheet_values)
    mix, plan = run.directory.name.split("_", 1)
    return {"mix": mix, "plan": plan, "tables": len(run.run.problem.tables), "layout": layout_key(run.plan),
            "measured_step_ms": run.step_ms, "predicted_step_ms": refit.predicted_step_ms,
            "predicted_step_ms_datasheet": datasheet.predicted_step_ms,
            "phases_predicted_vs_measured": {g: [round(p, 4), round(m, 4)] for g, (p, m) in refit.fair_phases.items()}}


def score(runs: Path, hardware: str, name: str) -> dict:
    from dlrm_scale.tools.refit import refit_from_runs

    if not runs.is_dir():
        raise ConfigError(f"{runs}: no such folder; give --runs the folder `--train --runs` filled")
    def mix_index(run_dir: Path) -> int:  # mixK_label
        return int(run_dir.name.split("_")[0][3:])

    dirs = sorted((d for d in runs.iterdir() if d.is_dir() and (d / "metrics.jsonl").is_file()), key=lambda d: (mix_index(d), d.name))
    if not dirs:
        raise ConfigError(f"{runs}: no finished runs in it; give the folder `--train --runs` filled")
    fit_dirs = [d for d in dirs if mix_index(d) % 2 == 0]
    held_dirs = [d for d in dirs if d not in fit_dirs]
    fitted_profile = HARDWARE_DIR / f"gpu_{name}.yaml"
    _, fit = refit_from_runs(fit_dirs, hardware, fitted_profile)
    datasheet = profile_values(load_run(dirs[0], hardware).run.problem.cluster)
    held = [describe(load_run(d, hardware), fit.values, datasheet) for d in held_dirs]
    fitted_on = [describe(load_run(d, hardware), fit.values, datasheet) for d in fit_dirs]
    by_mix: dict[str, dict] = {}
    for r in held + fitted_on:
        by_mix.setdefault(r["mix"], {})[r["plan"]] = {"measured_step_ms": r["measured_step_ms"], "predicted_step_ms": r["predicted_step_ms"]}
    choices = {m: {"faster_measured": min(p, key=lambda k: p[k]["measured_step_ms"]),
                   "faster_predicted": min(p, key=lambda k: p[k]["predicted_step_ms"])} for m, p in by_mix.items() if len(p) == 2}
    summary = {
        "held_out": accuracy(held, "predicted_step_ms"),
        "held_out_datasheet_profile": accuracy(held, "predicted_step_ms_datasheet"),
        "fit_half": accuracy(fitted_on, "predicted_step_ms"),
        "held_out_phases": phase_errors(held),
        "fit_residuals": fit.residuals,
        "kernel_choice_agrees": sum(c["faster_measured"] == c["faster_predicted"] for c in choices.values()),
        "mixes_with_both_plans": len(choices),
        "median_step_ms_measured": statistics.median(r["measured_step_ms"] for r in held + fitted_on),
    }
    doc = {"summary": summary, "choices": choices, "held_out": held, "fit_half": fitted_on,
           "hardware": shown_path(hardware_path(hardware)), "fitted_profile": shown_path(fitted_profile)}
    write_result((RESULTS / f"costmodel_{name}.json"), doc)
    return summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True, help="the runs' folder: --train fills it, scoring reads it")
    ap.add_argument("--train", action="store_true", help="train the mixes here (on the GPU machine)")
    ap.add_argument("--hardware", default="h100_dgx", help="the profile ours is planned with and the refit starts from")
    ap.add_argument("--steps", type=int, default=120, help="steps a run (6 logging windows, the first not measured)")
    ap.add_argument("--archive", type=Path, help="with --train: keep the runs also as this .tar.gz, rewritten after each")
    ap.add_argument("--budget-s", type=float, default=380, help="with --train: start no run past this many seconds")
    ap.add_argument("--name", default="h200", help="results as costmodel_gpu_NAME.json and the profile gpu_NAME")
    args = ap.parse_args()
    if args.steps < 36 or not args.name.replace("_", "").isalnum():
        print("error: --steps must be >= 36 (6 windows of 6), --name letters, digits and underscores", file=sys.stderr)
        return 2
    if args.train:
        os.environ.setdefault("OMP_NUM_THREADS", "4")
        train_all(args.runs, args.hardware, args.steps, args.budget_s, args.archive)
        return 0
    print(json.dumps(score(args.runs, args.hardware, args.name), indent=1))
    return 0


if __name__ == "__main__":
    run_cli(main)

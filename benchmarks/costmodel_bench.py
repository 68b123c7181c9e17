"""Cost-model validation on mixes the fit never saw, and planner regret, trained for real.

12 generated table mixes (4-100 tables, dims 16-256, pooling 1-100, Zipf 0.8-1.2, 10^2-10^7
rows), split into a fit half and a held-out half. Every mix is trained as 2-rank gloo jobs
(`torchrun -m dlrm_scale.train`, as a user runs it) under 6 plans: ours, TorchRec's planner's
(`--planner torchrec`), all table-wise, all column-wise, all row-wise, and mostly data-parallel
(every table whose weights take at most 16 MiB replicated, the rest table-wise).

1. The fit half trains once per plan, priced by the calibrated profile (--hardware, default
   configs/hardware/cpu_gloo.yaml, from `dlrm-scale calibrate`).
2. `calibrate --from-runs` refits that profile to the fit half's runs
   (configs/hardware/cpu_NAME.yaml, a named profile).
3. The held-out half trains --repeats times per plan (each repeat round all its mixes, plans
   alternated within a mix), "ours" planned with the refitted profile; each run's measured step (median over logging windows after the first)
   and phases are compared with `simulate`'s prediction, under both profiles.
4. Planner regret per held-out mix: the median measured step of the planner's plan over the
   fastest plan's median, for ours and for TorchRec's.

    python -m benchmarks.costmodel_bench [--steps 60] [--repeats 3] [--runs DIR]
    python -m benchmarks.costmodel_bench --runs DIR --rescore   # the kept runs scored again, trains nothing

Writes benchmarks/results/costmodel_NAME.json, costmodel_NAME.png (scatter) and
costmodel_NAME_regret.png, and the refitted profile as configs/hardware/cpu_NAME.yaml (a profile
belongs to the machine it was measured on: NAME names the machine).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


from dlrm_scale.run_record import COLLECTIVE_GROUPS
from dlrm_scale.tools.fit import FLOOR_OF_STEP, compare, profile_values
from dlrm_scale.tools.refit import refit_from_runs
from dlrm_scale.tools.runs import load_run
from planner.spec.config import HARDWARE_DIR, hardware_path
from planner.spec.errors import ConfigError
from planner.plan.document import Plan, table_layout, uniform_plan
from planner.plan.planning import make_plan
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingType
from dlrm_scale.run_config import load_problem
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results"
MODEL = {"num_dense_features": 13, "dense_arch": [64, 32], "over_arch": [64, 1]}
BATCH_SIZE_PER_RANK = 512
WORLD = 2
TABLE_COUNTS = (4, 6, 100, 80, 8, 12, 64, 48, 16, 24, 32, 40)  # mix i: fit half when i is even
DIMS = (32, 64, 16, 16, 256, 128, 64, 32, 128, 256, 64, 32)
MAX_TABLE_BYTES = 640 << 20  # weights of one table, so 10^7 rows come with small dims
MAX_MIX_BYTES = 2 << 30
MAX_IDS_PER_SAMPLE = 400  # pooling summed over a mix's tables: keeps a step under a second
DP_MAX_BYTES = 16 << 20
REGRET_RESAMPLES = 4000  # bootstrap resamples behind each regret's interval
PLANS = ("ours", "torchrec", "table_wise", "column_wise", "row_wise", "mostly_data_parallel")


def generate_mix(index: int, seed: int = 0) -> list[dict]:
    """Mix `index`'s tables: rows log-uniform over 10^2-10^7 (capped by MAX_TABLE_BYTES),
    pooling log-uniform over 1-100 (scaled to MAX_IDS_PER_SAMPLE), Zipf uniform over 0.8-1.2;
    table 0 at pooling 100 or table 1 at 10^7 rows (as its dim allows)."""
    rng = np.random.default_rng([seed, index])
    n, dim = TABLE_COUNTS[index], DIMS[index]
    rows = np.exp(rng.uniform(np.log(1e2), np.log(1e7), n)).astype(np.int64)
    rows = np.minimum(rows, MAX_TABLE_BYTES // (4 * dim))
    if rows.sum() * dim * 4 > MAX_MIX_BYTES:
        rows = np.maximum(100, (rows * (MAX_MIX_BYTES / (rows.sum() * dim * 4))).astype(np.int64))
    pooling = np.exp(rng.uniform(0.0, np.log(100.0), n))
    if pooling.sum() > MAX_IDS_PER_SAMPLE:
        pooling = np.maximum(1.0, pooling * MAX_IDS_PER_SAMPLE / pooling.sum())
    if index % 4 < 2:  # each half holds a table at either end of the ranges
        pooling[0] = 100.0
    else:
        rows[1] = min(10**7, MAX_TABLE_BYTES // (4 * dim))
    zipf = rng.uniform(0.8, 1.2, n)
    return [{"name": f"t{i}", "num_embeddings": int(rows[i]), "embedding_dim": dim,
             "pooling_factor": round(float(pooling[i]), 2), "zipf_exponent": round(float(zipf[i]), 3)} for i in range(n)]


def write_config(path: Path, tables: list[dict], hardware: str, world: int = WORLD, log_every: int = 10) -> None:
    lines = [f"hardware: {hardware}", f"cluster: {{world_size: {world}}}", f"training: {{batch_size_per_rank: {BATCH_SIZE_PER_RANK}}}",
             f"model: {json.dumps(MODEL)}", f"train: {{log_every: {log_every}, eval_batches: 1}}", "tables:"]
    lines += [f"  - {json.dumps(t)}" for t in tables]
    path.write_text("\n".join(lines) + "\n")


def mostly_data_parallel(problem: PlanningProblem) -> Plan:
    plan = uniform_plan(problem, ShardingType.TABLE_WISE)
    tables = dict(plan.tables)
    for t in problem.tables:
        if t.num_embeddings * t.embedding_dim * 4 <= DP_MAX_BYTES:
            tables[t.name] = table_layout(t, ShardingType.DATA_PARALLEL, list(range(WORLD)), problem.cluster.device_tier)
    return Plan(WORLD, WORLD, tables, (), 0.0, 0.0)


def given_plan(problem: PlanningProblem, label: str) -> Plan | None:
    if label in ("ours", "torchrec"):
        return None  # planned by the job itself, at start
    if label == "mostly_data_parallel":
        return mostly_data_parallel(problem)
    return uniform_plan(problem, ShardingType(label))


def plan_for(problem: PlanningProblem, label: str) -> Plan:
    """The plan a label trains, made here as the trainer makes ours and TorchRec's at start
    (`--planner ours / torchrec`)."""
    if label == "ours":
        return make_plan(problem)
    if label == "torchrec":
        from dlrm_scale.bridge.torchrec_cost import torchrec_planner_plan

        return torchrec_planner_plan(problem)[0]
    return given_plan(problem, label)


def train(config: Path, steps: int, label: str, plan: Plan | None, out: Path, log) -> None:
    """One run into `out`, written under a temporary name until it finished (so a folder of
    runs can be resumed); a run that fails is tried once more, its error logged."""
    partial = out.with_name(out.name + ".partial")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "-m", "dlrm_scale.train",
           "--config", str(config), "--steps", str(steps), "--out-dir", str(partial)]
    if plan is not None:
        plan.save(out.with_suffix(".plan.json"))
        cmd += ["--plan", str(out.with_suffix(".plan.json"))]
    else:
        cmd += ["--planner", label]
    for attempt in (1, 2):
        shutil.rmtree(partial, ignore_errors=True)
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode == 0:
            partial.rename(out)
            return
        errors = [line for line in proc.stderr.splitlines() if "Error" in line or "terminate" in line or "error" in line]
        log(f"{out.name}: attempt {attempt} failed (exit {proc.returncode}): {' | '.join(errors[-3:])}")
    raise RuntimeError(f"{out.name}: {proc.stderr[-3000:]}")


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def run_mixes(indices: list[int], hardware: str, steps: int, repeats: int, runs: Path, log, train_runs: bool = True) -> list[Path]:
    """Each mix under every plan, `repeats` times. Repeats go round over all the mixes (a slow
    spell of the machine then touches one repeat of many plans, which their medians discard,
    not every repeat of one mix), plans alternated within a mix (each leads once). With
    `train_runs` False, the runs already in `runs` are read back instead (--rescore)."""
    plans = {}
    for index in indices:
        config = runs / f"mix{index}.yaml"
        if train_runs:
            write_config(config, generate_mix(index), hardware)
        problem = load_problem(config)
        plans[index] = {label: given_plan(problem, label) for label in PLANS}
    folders = []
    for rep in range(repeats):
        for index in indices:
            order = PLANS[rep % len(PLANS):] + PLANS[:rep % len(PLANS)]
            for label in order:
                out = runs / f"mix{index}_{label}_r{rep}"
                if train_runs and not out.is_dir():  # a finished run of an interrupted benchmark is kept
                    train(runs / f"mix{index}.yaml", steps, label, plans[index][label], out, log)
                    log(f"mix{index} {label} r{rep}: {load_run(out, hardware).step_ms:.2f} ms")
                folders.append(out)
    return folders


def describe(run, fitted_values: dict, calibrated_values: dict) -> dict:
    refit, calibrated = compare(run, fitted_values), compare(run, calibrated_values)
    label = run.directory.name
    mix, rest = label.split("_", 1)
    plan, rep = rest.rsplit("_r", 1)
    fair = refit.fair_phases
    a2a = [sum(fair[g][i] for g in COLLECTIVE_GROUPS if g != "all_reduce") for i in (0, 1)]
    return {"mix": mix, "plan": plan, "repeat": int(rep), "tables": len(run.run.problem.tables), "layout": layout_key(run.plan),
            "measured_step_ms": run.step_ms, "predicted_step_ms": refit.predicted_step_ms,
            "predicted_step_ms_calibrated": calibrated.predicted_step_ms,
            "phases_predicted_vs_measured": {g: [round(p, 4), round(m, 4)] for g, (p, m) in fair.items()},
            "all_to_all_predicted_vs_measured": [round(a2a[0], 4), round(a2a[1], 4)]}


def layout_key(plan: Plan) -> str:
    """What a plan runs (each table's scheme, kernel and shards), so two labels for the same plan
    (ours and table-wise, say) are known as one."""
    tables = {name: [t.sharding_type, t.compute_kernel, [[s.rank, s.row_offset, s.col_offset, s.rows, s.cols, s.tier] for s in t.shards]]
              for name, t in sorted(plan.tables.items())}
    return hashlib.sha1(json.dumps(tables).encode()).hexdigest()[:12]


def accuracy(rows: list[dict], key: str) -> dict:
    measured = np.array([r["measured_step_ms"] for r in rows])
    predicted = np.array([r[key] for r in rows])
    rel = np.abs(predicted / measured - 1)
    return {"runs": len(rows), "spearman": spearman(predicted, measured), "median_abs_rel_error": float(np.median(rel)),
            "max_abs_rel_error": float(rel.max())}


def accuracy_of_medians(rows: list[dict], key: str) -> dict:
    """As accuracy, over each plan's median measured step (the repeats' spread left out)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["mix"], r["plan"]), []).append(r)
    medians = [{"measured_step_ms": statistics.median(x["measured_step_ms"] for x in g),
                key: statistics.median(x[key] for x in g)} for g in groups.values()]
    return {**accuracy(medians, key), "runs": len(rows), "plans": len(medians)}


def phase_errors(rows: list[dict]) -> dict:
    errors: dict[str, list[float]] = {}
    for r in rows:
        pairs = dict(r["phases_predicted_vs_measured"])
        if "all_to_all_predicted_vs_measured" in r:  # none on one rank (costmodel_gpu.py)
            pairs["all_to_all"] = r["all_to_all_predicted_vs_measured"]
        for g, (p, m) in pairs.items():
            if m >= FLOOR_OF_STEP * r["measured_step_ms"]:  # a phase under 2% of its step: its timer's noise, not the model's
                errors.setdefault(g, []).append(abs(p / m - 1))
    return {g: {"median_abs_rel_error": float(np.median(v)), "runs": len(v)} for g, v in errors.items()}


def regret(rows: list[dict], resamples: int = REGRET_RESAMPLES) -> dict:
    """Per mix, the median measured step of each plan over the fastest plan's. Labels that ran the
    same plan (the planner's choice equal to all table-wise, say) are one plan: their runs are
    pooled, since what tells them apart is only the machine's noise. Beside each regret, its 90%
    bootstrap interval: every plan's runs resampled with replacement and the fastest chosen again
    each time, so a regret the runs' spread could have made (or hidden) shows as one."""
    rng = np.random.default_rng(0)
    out = {}
    for mix in sorted({r["mix"] for r in rows}, key=lambda m: int(m[3:])):
        runs = [r for r in rows if r["mix"] == mix]
        layout = {r["plan"]: r["layout"] for r in runs}
        pooled = {k: [r["measured_step_ms"] for r in runs if r["layout"] == k] for k in set(layout.values())}
        medians = {p: statistics.median(pooled[layout[p]]) for p in PLANS}
        best = min(medians, key=medians.get)
        steps = {p: [r["measured_step_ms"] for r in runs if r["plan"] == p] for p in PLANS}
        # resampled medians, [resample, layout]; each label reads its layout's column
        keys = sorted(pooled)
        draws = np.stack([np.median(rng.choice(pooled[k], size=(resamples, len(pooled[k]))), axis=1) for k in keys], axis=1)
        fastest = draws.min(axis=1)
        interval = {p: [float(q) for q in np.percentile(draws[:, keys.index(layout[p])] / fastest, [5, 95])] for p in ("ours", "torchrec")}
        out[mix] = {"tables": runs[0]["tables"], "fastest": best,
                    "same_plan": {p: sorted(q for q in PLANS if q != p and layout[q] == layout[p]) for p in PLANS if
                                  any(q != p and layout[q] == layout[p] for q in PLANS)},
                    "median_step_ms": medians, "spread_ms": {p: [min(v), max(v)] for p, v in steps.items()},
                    "ours": medians["ours"] / medians[best], "torchrec": medians["torchrec"] / medians[best],
                    "ours_interval_90": interval["ours"], "torchrec_interval_90": interval["torchrec"]}
    return out


def plots(held_out: list[dict], regrets: dict, summary: dict, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = np.array([r["measured_step_ms"] for r in held_out])
    predicted = np.array([r["predicted_step_ms"] for r in held_out])
    fig, ax = plt.subplots(figsize=(5, 5))
    for label in PLANS:
        sel = [i for i, r in enumerate(held_out) if r["plan"] == label]
        ax.scatter(measured[sel], predicted[sel], label=label, s=14)
    lim = [min(measured.min(), predicted.min()) * 0.8, max(measured.max(), predicted.max()) * 1.2]
    ax.plot(lim, lim, "k--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured step ms")
    ax.set_ylabel("predicted step ms (refitted profile)")
    s = summary["held_out"]
    ax.set_title(f"held-out: Spearman {s['spearman']:.3f}, median |err| {100 * s['median_abs_rel_error']:.1f}%", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=100)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    mixes = list(regrets)
    x = np.arange(len(mixes))
    ax.bar(x - 0.2, [regrets[m]["ours"] for m in mixes], 0.4, label="ours")
    ax.bar(x + 0.2, [regrets[m]["torchrec"] for m in mixes], 0.4, label="TorchRec's planner")
    ax.axhline(1.02, color="k", linestyle="--", linewidth=1, label="1.02")
    ax.set_xticks(x, [f"{m}\n{regrets[m]['tables']} tables" for m in mixes], fontsize=7)
    ax.set_ylabel("measured step / fastest plan's")
    ax.set_ylim(0.95, max(1.1, max(max(r["ours"], r["torchrec"]) for r in regrets.values()) * 1.05))
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}_regret.png", dpi=100)


def shown_path(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def log(message: str) -> None:
    print(message, flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3, help="held-out runs per plan (the fit half trains once)")
    ap.add_argument("--mixes", type=int, default=len(TABLE_COUNTS), help="the first N mixes (a quick look)")
    ap.add_argument("--hardware", default="cpu_gloo",
                    help="the profile the fit half is planned with and the refit starts from (e.g. a fresh `dlrm-scale calibrate`)")
    ap.add_argument("--runs", type=Path, help="keep the training runs in this folder (default: a temporary one); "
                    "the runs a folder already holds are kept, so an interrupted benchmark resumes")
    ap.add_argument("--rescore", action="store_true",
                    help="train nothing: refit and score the runs kept in --runs with the cost model as it is now "
                         "(the regrets stay those of the plans the runs trained)")
    ap.add_argument("--name", required=True, help="the machine: results as costmodel_NAME.json, the profile as cpu_NAME")
    args = ap.parse_args()
    if not args.name.replace("_", "").isalnum():
        print(f"error: --name must be letters, digits and underscores, got {args.name!r}", file=sys.stderr)
        return 2
    stem = f"costmodel_{args.name}"
    if args.steps < 30 or args.repeats < 1 or not 2 <= args.mixes <= len(TABLE_COUNTS):
        print(f"error: --steps must be >= 30 (3 windows), --repeats >= 1, --mixes in 2..{len(TABLE_COUNTS)}", file=sys.stderr)
        return 2
    if args.rescore and (args.runs is None or not (args.runs / "mix0.yaml").is_file()):
        print("error: --rescore needs --runs DIR holding a finished run of this benchmark (its mix0.yaml, runs and plans)", file=sys.stderr)
        return 2
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        runs = args.runs or Path(tmp)
        runs.mkdir(parents=True, exist_ok=True)
        fitted_profile = HARDWARE_DIR / f"cpu_{args.name}.yaml"
        fit_dirs = run_mixes(list(range(0, args.mixes, 2)), args.hardware, args.steps, 1, runs, log, not args.rescore)
        _, fit = refit_from_runs(fit_dirs, args.hardware, fitted_profile)
        print(f"refitted on {fit.runs} runs: {fit.residuals}", flush=True)
        held_dirs = run_mixes(list(range(1, args.mixes, 2)), str(fitted_profile), args.steps, args.repeats, runs, log, not args.rescore)
        calibrated = profile_values(load_run(fit_dirs[0], args.hardware).run.problem.cluster)
        held = [load_run(d, str(fitted_profile)) for d in held_dirs]
        fit_runs_ = [load_run(d, str(fitted_profile)) for d in fit_dirs]
        held_out = [describe(r, fit.values, calibrated) for r in held]
        fitted_on = [describe(r, fit.values, calibrated) for r in fit_runs_]
    regrets = regret(held_out)
    summary = {
        "held_out": accuracy(held_out, "predicted_step_ms"),
        "held_out_plan_medians": accuracy_of_medians(held_out, "predicted_step_ms"),
        "held_out_calibrated_profile": accuracy(held_out, "predicted_step_ms_calibrated"),
        "fit_half": accuracy(fitted_on, "predicted_step_ms"),
        "held_out_phases": phase_errors(held_out),
        "regret_ours_max": max(r["ours"] for r in regrets.values()),
        "regret_torchrec_max": max(r["torchrec"] for r in regrets.values()),
        "fit_residuals": fit.residuals,
        "fitted_values": fit.values,
    }
    mixes = {f"mix{i}": generate_mix(i) for i in range(args.mixes)}
    doc = {"summary": summary, "regret": regrets, "rescored": args.rescore, "steps": args.steps, "repeats": args.repeats, "held_out": held_out,
           "fit_half": fitted_on, "mixes": mixes, "hardware": shown_path(hardware_path(args.hardware))}
    write_result((RESULTS / f"{stem}.json"), doc)
    plots(held_out, regrets, summary, stem)
    if args.rescore:
        print("rescored: predictions and fit from the model as it is now; the regrets are of the plans these runs trained")
    print(json.dumps(summary, indent=1))
    print("| mix | tables | fastest plan | ours regret (90% interval) | TorchRec regret (90% interval) |\n|---|---|---|---|---|")
    for m, r in regrets.items():
        (a, b), (c, d) = r["ours_interval_90"], r["torchrec_interval_90"]
        print(f"| {m} | {r['tables']} | {r['fastest']} | {r['ours']:.3f} ({a:.3f}-{b:.3f}) | {r['torchrec']:.3f} ({c:.3f}-{d:.3f}) |")
    return 0


def run_cli(entry) -> None:
    """Exit with `entry()`'s status; a user's error (a bad --hardware, kept runs that do not read
    back) is one line and exit 2, before any training."""
    try:
        sys.exit(entry())
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    run_cli(main)

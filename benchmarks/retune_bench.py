"""Self-tuning benchmark: jobs planned with a wrong profile, left alone or retuning themselves,
beside the plans a right profile, TorchRec's planner and all-table-wise give, on this machine.

Each mix (the cost-model benchmark's generated mixes, `--mixes`) is trained as 2-rank gloo jobs
(`dlrm-scale train`, as a user runs it) for --steps steps under:
- wrong: planned at start with --wrong (default the datasheet h100_dgx profile, on CPU);
- retune: the same, with --retune (its warm-up, measurement, fit, decision and any move
  included in its wall time);
- right: planned with --right (a profile calibrated on this machine), when given;
- torchrec: TorchRec's planner (`--planner torchrec`);
- table_wise: every table whole on one rank.
With --kernels-from PROFILE, the wrong profile's arms run the CPU kernels PROFILE's calibration
chose (a wrong profile's plans on this machine's kernels); --arms runs a subset.
Runs alternate within a round, --repeats rounds. Per run: the wall time of the whole job (start
to exit) and the steady state (median samples/s over the last --steady windows).

    python -m benchmarks.retune_bench [--mixes 0 1 4] [--steps 2000] [--repeats 3] [--wrong PROFILE] [--right PROFILE]

Writes benchmarks/results/retune.json (a row per mix and wrong profile; rows another invocation
measured stay, each with its own provenance) and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
from pathlib import Path

from benchmarks.common import ROOT, provenance, train_job, write_result
from benchmarks.costmodel_bench import generate_mix, given_plan, write_config
from dlrm_scale.run_config import load_problem, measured_cpu_kernels
from planner.spec.config import hardware_path
from planner.spec.errors import PlannerError

RESULTS = ROOT / "benchmarks" / "results" / "retune.json"
LOG_EVERY = 25


def run_job(config: Path, steps: int, out: Path, extra: list[str], plan=None) -> dict:
    """One job; its wall time, the CPU kernels it trained with (a retuning job may measure its own),
    and its windows' samples/s and retune records."""
    shutil.rmtree(out, ignore_errors=True)
    args = ["--config", str(config), "--steps", str(steps), *extra]
    if plan is not None:
        out.mkdir(parents=True)
        plan.save(out / "given_plan.json")
        args += ["--plan", str(out / "given_plan.json")]
    wall, records = train_job(args, out)
    windows = [r["samples_per_s"] for r in records if "samples_per_s" in r]
    kernels = next(r["run"]["train"] for r in records if "run" in r)
    return {"wall_s": wall, "kernels": kernels, "windows_samples_per_s": windows, "retune": [r["retune"] for r in records if "retune" in r],
            "reshard": [r["reshard"] for r in records if "reshard" in r]}


ARMS = ("wrong", "retune", "torchrec", "table_wise", "right")


def kernel_flags(profile: str | None) -> list[str]:
    """The trainer flags that run the CPU kernels `profile`'s calibration chose (none: the
    config's profile's own)."""
    if profile is None:
        return []
    chosen = measured_cpu_kernels(profile)
    return ["--cpu-embeddings", chosen["embeddings"], "--interaction", chosen["interaction"], "--store-io", chosen["store_io"]]


def variants(config_for, problem_right, args, kernels: list[str]) -> dict:
    wrong = config_for(args.wrong)
    out = {"wrong": (wrong, kernels, None), "retune": (wrong, [*kernels, "--retune"], None),
           "torchrec": (wrong, [*kernels, "--planner", "torchrec"], None),
           "table_wise": (wrong, kernels, given_plan(problem_right, "table_wise"))}
    if args.right:
        out["right"] = (config_for(args.right), [], None)
    return {name: arm for name, arm in out.items() if name in args.arms}


def row_key(row: dict) -> tuple:
    """A result row's identity: its mix, the wrong profile and whose CPU kernels that ran."""
    return row["mix"], row.get("wrong_profile") or "", row.get("kernels_from") or ""


def summary(runs: list[dict], steady: int) -> dict:
    walls = [r["wall_s"] for r in runs]
    steadies = [statistics.median(r["windows_samples_per_s"][-steady:]) for r in runs]
    return {"wall_s": walls, "wall_median_s": statistics.median(walls), "steady_samples_per_s": steadies,
            "steady_median": statistics.median(steadies)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixes", type=int, nargs="+", default=[0, 1, 4])
    ap.add_argument("--steps", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steady", type=int, default=10, help="windows (of 25 steps) the steady state is the median of")
    ap.add_argument("--wrong", default="h100_dgx")
    ap.add_argument("--right", help="a profile calibrated on this machine")
    ap.add_argument("--kernels-from", help="the wrong profile's arms run the CPU kernels this profile's calibration chose")
    ap.add_argument("--arms", nargs="+", choices=ARMS, default=list(ARMS), help="the arms to run (right only with --right)")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.repeats < 1 or args.steps < 10 * LOG_EVERY:
        ap.error("--repeats takes a whole number >= 1 and --steps at least 250")
    reference_arms = {"torchrec", "table_wise"} | ({"right"} if args.right else set())
    if not {"wrong", "retune"} <= set(args.arms) or not reference_arms & set(args.arms):
        ap.error("--arms takes wrong, retune and at least one reference (right only with --right)")
    try:  # a profile that cannot be read: one line now, not a traceback minutes into the first mix
        for profile in (args.wrong, args.right):
            if profile is not None:
                hardware_path(profile)
        kernels = kernel_flags(args.kernels_from)
    except PlannerError as e:
        ap.error(str(e))
    out = Path(args.out)
    kept = json.loads(out.read_text())["mixes"] if out.exists() else []
    rows = []
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        for mix in args.mixes:
            tables = generate_mix(mix)

            def config_for(hardware: str, mix=mix, tables=tables) -> Path:
                path = folder / f"mix{mix}_{Path(hardware).stem}.yaml"
                write_config(path, tables, hardware, log_every=LOG_EVERY)
                return path

            problem = load_problem(config_for(args.wrong))
            runs: dict[str, list[dict]] = {}
            for r in range(args.repeats):  # alternated: every variant sees the same moments of the machine
                for name, (config, extra, plan) in variants(config_for, problem, args, kernels).items():
                    runs.setdefault(name, []).append(run_job(config, args.steps, folder / f"mix{mix}_{name}_{r}", extra, plan))
                    print(f"mix {mix} {name} round {r}: {runs[name][-1]['wall_s']:.1f} s", flush=True)
            row = {"provenance": provenance(), "mix": mix, "tables": len(tables), "wrong_profile": args.wrong, "right_profile": args.right,
                   "kernels_from": args.kernels_from,
                   **{name: summary(v, args.steady) for name, v in runs.items()},
                   "retune_decisions": [run["retune"] for run in runs["retune"]], "reshards": [run["reshard"] for run in runs["retune"]],
                   "retune_kernels": [run["kernels"] for run in runs["retune"]]}
            references = [row[n]["steady_median"] for n in ("right", "torchrec", "table_wise") if n in row]
            row["best_reference_steady"] = max(references)
            row["wrong_off"] = 1 - row["wrong"]["steady_median"] / row["best_reference_steady"]
            row["retune_vs_best"] = row["retune"]["steady_median"] / row["best_reference_steady"]
            row["retune_wall_vs_wrong"] = row["retune"]["wall_median_s"] / row["wrong"]["wall_median_s"]
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("retune_decisions", "reshards", "retune_kernels")}), flush=True)
            # after each mix: a mix can take 40 minutes, and a run stopped later keeps those done
            measured = {row_key(r) for r in rows}
            others = [r for r in kept if row_key(r) not in measured]
            write_result(out, {"steps": args.steps, "repeats": args.repeats, "mixes": sorted(others + rows, key=row_key)})
    print("| mix | tables | wrong profile | wrong plan's steady samples/s vs best reference | retuned vs best reference "
          "| retuned wall / wrong wall | moves |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        moves = sum(1 for run in r["retune_decisions"] for d in run if d.get("move"))
        wrong = r["wrong_profile"] + (f" ({r['kernels_from']}'s CPU kernels)" if r["kernels_from"] else "")
        print(f"| {r['mix']} | {r['tables']} | {wrong} | {1 - r['wrong_off']:.3f} | {r['retune_vs_best']:.3f} "
              f"| {r['retune_wall_vs_wrong']:.3f} | {moves} in {len(r['retune_decisions'])} runs |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

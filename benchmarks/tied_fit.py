"""The fit with the lookup kernel's constants held in a micro-benchmark's proportions (one fitted
factor), against the fit as it is, on a cost-model benchmark's runs: each refitted on the fit
half (even mixes) and scored on the held-out half (odd mixes), as costmodel_bench.py does.

    python benchmarks/tied_fit.py --runs DIR --kernel benchmarks/results/lookup_kernel_intel207.json --start benchmarks/results/intel207_calibrated.yaml
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.costmodel_bench import spearman  # noqa: E402
from dlrm_scale.tools.fit import KERNEL_CONSTANTS, compare, fit_runs, kernel_values, profile_values, with_values  # noqa: E402
from dlrm_scale.tools.runs import load_run  # noqa: E402


def scored(held, values: dict) -> dict:
    predicted, measured, embedding, difference = [], [], [], []
    for run in held:
        c = compare(run, values)
        predicted.append(c.predicted_step_ms)
        measured.append(run.step_ms)
        p, m = c.fair_phases["embedding"]
        embedding.append(p / m - 1)
        pe = [r["embedding"] for r in c.predicted]
        me = [r["embedding"] for r in run.phases_ms]
        difference.append(((pe[0] - pe[1]) - (me[0] - me[1])) / np.mean(me))
    e = np.array(predicted) / np.array(measured) - 1
    return {"spearman": spearman(predicted, measured), "median": float(np.median(abs(e))), "max": float(abs(e).max()),
            "embedding_median": float(np.median(np.abs(embedding))), "rank_difference_rms": float(np.sqrt(np.mean(np.square(difference))))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, required=True)
    ap.add_argument("--kernel", type=Path, required=True, help="lookup_kernel.py's JSON: its grid's constants")
    ap.add_argument("--start", required=True, help="the calibrated profile both fits start from")
    args = ap.parse_args()
    dirs = sorted(p for p in args.runs.glob("mix*_r*") if p.is_dir())
    half = {d: int(re.match(r"mix(\d+)_", d.name).group(1)) % 2 for d in dirs}
    fit_half = [load_run(d, args.start) for d in dirs if half[d] == 0]
    held = [load_run(d, args.start) for d in dirs if half[d] == 1]
    start = fit_half[0].run.problem.cluster
    kernel = {k: v for k, v in json.loads(args.kernel.read_text())["grid"]["constants"].items() if k in KERNEL_CONSTANTS}
    tied_start = with_values(start, kernel_values(kernel))  # the factor's prior: 1, the kernel alone
    out = {}
    for label, fit in (("free", fit_runs(fit_half, start)),
                       ("tied", fit_runs([replace(r, run=replace(r.run, problem=replace(r.run.problem, cluster=tied_start))) for r in fit_half],
                                         tied_start, kernel))):
        out[label] = {"held_out": scored(held, fit.values), "constants": {k: fit.values[k] for k in KERNEL_CONSTANTS}}
        if label == "tied":
            measured = kernel_values(kernel)
            out[label]["factor"] = fit.values["lookup_bwd_ns"] / measured["lookup_bwd_ns"]
        print(label, json.dumps(out[label]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How well the cost model tells a plan's two ranks apart, from regret_paired.py's runs.

A plan's step waits for its busiest rank, so what decides between two table-wise plans is the
difference between their ranks' embedding phases, not the phases' common level (a whole job
slows down as one). regret_paired.py measures each plan's phases on each rank within one job;
here, for every table-wise plan of those runs (each mix's distinct plans once):
- the model's predicted difference between rank 1 and rank 0 against the measured one (ms);
- for each quantity of the tables a rank holds (ids looked up, distinct rows, their bytes, the
  weights the ids add, tables), the correction to the difference proportional to it, fitted by
  least squares on the cost-model benchmark's fit half (even mixes) and scored on its held-out
  half (odd mixes): a quantity the model mis-prices corrects the held-out half too.

    python -m benchmarks.rank_differences RUN.json [RUN.json ...] [--out JSON]

The plans are made again (ours with the cpu_epyc_zen4 profile, as regret_paired
makes them) and must be those the runs trained (their layouts are compared).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np


from benchmarks.costmodel_bench import RESULTS, WORLD, generate_mix, layout_key, plan_for, write_config
from benchmarks.common import write_result

FITTED = "cpu_epyc_zen4"
QUANTITIES = ("ids", "distinct_rows", "distinct_bytes", "id_weights", "tables")
MIN_PHASE_MS = 2.0  # ranks under this are mostly launch costs and timer noise


class OtherPlans(Exception):
    """The runs trained plans other than those the planner makes now."""


def rank_quantities(plan, problem) -> list[dict[str, float]]:
    """Per rank, the quantities of the table-wise shards it holds, per step."""
    from planner.cost.cost_model import WEIGHT_BYTES, distinct_rows_per_step

    out = [dict.fromkeys(QUANTITIES, 0.0) for _ in range(plan.world_size)]
    batch = problem.training.batch_size_per_rank * plan.world_size
    for name, layout in plan.tables.items():
        table = problem.tables_by_name[name]
        ids = batch * table.pooling_factor
        distinct = distinct_rows_per_step(table, ids)
        q = out[layout.ranks[0]]
        q["ids"] += ids
        q["distinct_rows"] += distinct
        q["distinct_bytes"] += distinct * table.embedding_dim * WEIGHT_BYTES
        q["id_weights"] += ids * table.embedding_dim
        q["tables"] += 1
    return out


def table_wise_pairs(paths: list[Path]) -> list[dict]:
    from dlrm_scale.run_config import Overrides, load_run_config

    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            for mix, result in json.loads(path.read_text())["mixes"].items():
                index = int(mix.removeprefix("mix"))
                config = Path(tmp) / f"{mix}.yaml"
                write_config(config, generate_mix(index), str(FITTED))
                problem = load_run_config(config, Overrides(world_size=WORLD, ranks_per_node=WORLD, device="cpu")).problem
                layouts = {label: key for group in result["jobs"] for job in group for label, key in job["layouts"].items()}
                seen = set()
                for label, phases in result.get("phases", {}).items():
                    plan = plan_for(problem, label)
                    if layout_key(plan) != layouts[label]:
                        raise OtherPlans(f"{path}: {mix}'s {label} plan is not the one its run trained; "
                                         "give runs of this planner and profile")
                    measured = [r["embedding"] for r in phases["measured_ms"]]
                    if ({t.sharding_type for t in plan.tables.values()} != {"table_wise"} or layouts[label] in seen
                            or min(measured) < MIN_PHASE_MS):
                        continue
                    seen.add(layouts[label])
                    pairs.append({"mix": index, "plan": label, "measured_ms": measured,
                                  "predicted_ms": [r["embedding"] for r in phases["predicted_ms"]],
                                  "quantities": rank_quantities(plan, problem)})
    return pairs


def score(pairs: list[dict]) -> dict:
    def difference(p, key):
        return p[key][1] - p[key][0]

    halves = {"fit": [p for p in pairs if p["mix"] % 2 == 0], "held_out": [p for p in pairs if p["mix"] % 2 == 1]}
    error = {h: np.array([difference(p, "predicted_ms") - difference(p, "measured_ms") for p in ps]) for h, ps in halves.items()}
    out = {"pairs": {h: len(ps) for h, ps in halves.items()},
           "model": {h: {"rms_ms": float(np.sqrt(np.mean(e**2))), "median_abs_ms": float(np.median(np.abs(e)))} for h, e in error.items()},
           "corrections": {}}
    for q in QUANTITIES:
        x = {h: np.array([p["quantities"][1][q] - p["quantities"][0][q] for p in ps]) for h, ps in halves.items()}
        per_unit_ms = float(-(x["fit"] @ error["fit"]) / (x["fit"] @ x["fit"])) if np.any(x["fit"]) else 0.0
        corrected = {h: error[h] + per_unit_ms * x[h] for h in halves}
        out["corrections"][q] = {"per_unit_ns": per_unit_ms * 1e6,
                                 **{f"{h}_rms_ms": float(np.sqrt(np.mean(e**2))) for h, e in corrected.items()},
                                 "held_out_median_abs_ms": float(np.median(np.abs(corrected["held_out"])))}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="JSON files regret_paired.py wrote (with its phase timers)")
    ap.add_argument("--out", type=Path, default=RESULTS / "rank_differences.json")
    args = ap.parse_args()
    missing = [p for p in args.runs if not p.is_file()]
    if missing or not args.out.parent.is_dir():
        print(f"error: {missing[0] if missing else args.out.parent}: no such file or folder; give regret_paired.py's JSON "
              "and an existing --out folder", file=sys.stderr)
        return 2
    try:
        pairs = table_wise_pairs(args.runs)
    except OtherPlans as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (ValueError, KeyError, TypeError) as e:  # not JSON, or not regret_paired.py's
        print(f"error: {e!r} reading the runs; give JSON files regret_paired.py wrote", file=sys.stderr)
        return 2
    if not any(p["mix"] % 2 == 0 for p in pairs) or not any(p["mix"] % 2 == 1 for p in pairs):
        print("error: the runs need table-wise plans of both halves (even and odd mixes) with phase timers; "
              "run regret_paired.py on mixes of both", file=sys.stderr)
        return 2
    result = score(pairs)
    write_result(args.out, {"runs": [str(p) for p in args.runs], **result, "table_wise_pairs": pairs})
    m = result["model"]
    print(f"rank 1 - rank 0, predicted against measured: fit half rms {m['fit']['rms_ms']:.2f} ms ({result['pairs']['fit']} plans), "
          f"held-out rms {m['held_out']['rms_ms']:.2f} ms, median {m['held_out']['median_abs_ms']:.2f} ({result['pairs']['held_out']} plans)")
    print("| quantity | correction fitted on the fit half | fit half rms ms | held-out rms ms | held-out median ms |\n|---|---|---|---|---|")
    for q, c in result["corrections"].items():
        print(f"| {q} | {c['per_unit_ns']:+.3g} ns each | {c['fit_rms_ms']:.2f} | {c['held_out_rms_ms']:.2f} | {c['held_out_median_abs_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

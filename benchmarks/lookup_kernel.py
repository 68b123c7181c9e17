"""The lookup kernel alone, against what training measures of it (the cost-model issue).

1. grid: a rank's CPU lookups as the trainer runs them (FBGEMM's forward, our fused row-wise
   Adagrad backward, timed as `dlrm-scale calibrate` times them) over tables of 300 to 2M rows,
   dims 16-256, pooling 1-100, batch 1024 (the global batch a table-wise shard serves in the
   cost-model benchmark), the grid run --repeats times; planner/cost/cost_model.py's lookup formulas
   fitted to it (calibrate.fit_embedding). Small tables at high pooling repeat their rows many
   times, so a cost per id and a cost per distinct row come apart there; calibrate's own grid
   (100k and 2M rows, pooling up to 32) cannot tell them apart.
2. colocated: a table's forward and backward timed alone and as one of T alike tables in one
   table-batched module (TorchRec batches a rank's tables so), T = 1, 4, 12, the three
   alternated in each of --repeats rounds; per table, the median over rounds.
3. ranks (with --runs DIR, a `costmodel_bench.py --runs` folder): each rank's measured lookups
   (emb_fwd + emb_bwd_opt, median over windows) against --hardware's prediction and against the
   grid's constants with --hardware's launch cost (training launches one batched module per
   rank, not one a table as the grid does), for the plans without replicas, row blocks or
   caches (their lookup phases hold other work).

    python -m benchmarks.lookup_kernel --hardware cpu_xeon_m207 --runs DIR --out benchmarks/results/lookup_kernel_xeon_m207.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np


from benchmarks.costmodel_bench import run_cli
from dlrm_scale.tools.calibrate import EMBEDDING_CONSTANTS, CalibrationConfig, embedding_samples, fit_embedding
from dlrm_scale.tools.fit import compare
from dlrm_scale.tools.runs import load_run
from planner.cost.cost_model import lookup_bwd_ms, lookup_fwd_ms
from benchmarks.common import ROOT, write_result

BATCH = 1024
GRID = CalibrationConfig(batch_size=BATCH, dims=(16, 64, 128, 256), pooling_factors=(1, 8, 32, 100),
                         rows=(300, 2000, 8000, 50_000, 500_000, 2_000_000), repeats=7)
COLOCATED_COUNTS = (1, 4, 12)
COLOCATED_SHAPES = ((128, 200_000, 20), (128, 2000, 50), (256, 200_000, 20), (256, 2000, 50))  # dim, rows, pooling
COLOCATED_CALLS = 7
OPTIMIZER = "rowwise_adagrad"


def grid(repeats: int) -> dict:
    samples = []
    for rep in range(repeats):
        samples += [{**s, "repeat": rep} for s in embedding_samples(GRID, "dlrm_scale")]
    constants = fit_embedding(samples, OPTIMIZER)
    errors = {"fwd": [], "bwd": []}
    for s in samples:
        errors["fwd"].append(lookup_fwd_ms(s["lookups"], s["distinct"], s["dim"], constants["ddr_gb_per_s"], constants["kernel_launch_ms"],
                                           constants["lookup_fwd_ns"], constants["lookup_fwd_weight_ns"]) / s["fwd_ms"] - 1)
        errors["bwd"].append(lookup_bwd_ms(s["lookups"], s["distinct"], s["dim"], OPTIMIZER, constants["ddr_gb_per_s"],
                                           constants["kernel_launch_ms"], constants["lookup_bwd_ns"], constants["lookup_bwd_row_ns"],
                                           constants["lookup_bwd_weight_ns"]) / s["bwd_ms"] - 1)
    same = {}
    for s in samples:
        same.setdefault((s["rows"], s["dim"], s["pooling"]), []).append(s)
    repeat_spread = {k: float(np.median([(max(x[f"{k}_ms"] for x in v) / min(x[f"{k}_ms"] for x in v)) - 1 for v in same.values()]))
                     for k in ("fwd", "bwd")}
    return {"samples": samples, "constants": constants, "repeat_spread_median": repeat_spread,
            "fit_error_median": {k: float(np.median(np.abs(v))) for k, v in errors.items()},
            "fit_error_max": {k: float(np.max(np.abs(v))) for k, v in errors.items()}}


def colocated(repeats: int) -> list[dict]:
    import torch
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from dlrm_scale.kernels.cpu_adagrad import install
    from dlrm_scale.kernels.huge_pages import back_with_huge_pages
    from dlrm_scale.training.data import ZipfIds

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    kernel = install(OPTIMIZER)
    out = []
    try:
        for dim, rows, pooling in COLOCATED_SHAPES:
            zipf = ZipfIds(rows, 1.0, seed=rows)
            modules = {}
            for count in COLOCATED_COUNTS:
                modules[count] = SplitTableBatchedEmbeddingBagsCodegen(
                    [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)] * count,
                    optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01)
                back_with_huge_pages(modules[count])
            times = {count: {"fwd": [], "bwd": []} for count in COLOCATED_COUNTS}
            for rep in range(repeats):
                order = COLOCATED_COUNTS[rep % len(COLOCATED_COUNTS):] + COLOCATED_COUNTS[:rep % len(COLOCATED_COUNTS)]
                for count in order:
                    ids = BATCH * pooling * count
                    offsets = torch.arange(0, ids + 1, pooling)
                    fwd, bwd = [], []
                    for call in range(COLOCATED_CALLS + 1):  # the first call warms up
                        batch = torch.from_numpy(zipf.sample(ids, rng).astype(np.int64))
                        start = time.perf_counter()
                        pooled = modules[count](batch, offsets)
                        middle = time.perf_counter()
                        pooled.backward(torch.ones_like(pooled))
                        end = time.perf_counter()
                        if call:
                            fwd.append((middle - start) * 1e3 / count)
                            bwd.append((end - middle) * 1e3 / count)
                    times[count]["fwd"].append(statistics.median(fwd))
                    times[count]["bwd"].append(statistics.median(bwd))
            for count in COLOCATED_COUNTS:
                row = {"dim": dim, "rows": rows, "pooling": pooling, "tables": count}
                for k in ("fwd", "bwd"):
                    row[f"{k}_ms_per_table"] = statistics.median(times[count][k])
                    row[f"{k}_over_alone"] = row[f"{k}_ms_per_table"] / statistics.median(times[1][k])
                    row[f"{k}_spread"] = [min(times[count][k]), max(times[count][k])]
                out.append(row)
                print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
            del modules
    finally:
        if kernel is not None:
            kernel.close()
    return out


def lookup_runs(runs_dir: Path, hardware: str) -> list:
    """The runs of `runs_dir` whose ranks' embedding phase is their lookups alone (emb_fwd +
    emb_bwd_opt): no replicas (their dense update), no row blocks (their bucketing), no caches;
    read before any timing, so a bad folder or profile is one line, not a failure at the end."""
    runs = [load_run(d, hardware) for d in sorted(p for p in runs_dir.glob("mix*_r*") if p.is_dir())]
    return [run for run in runs if not any(t.sharding_type in ("data_parallel", "row_wise", "table_row_wise") or t.cached
                                           for t in run.plan.tables.values())]


def ranks(runs: list, constants: dict[str, float]) -> dict:
    """Each rank's lookups, measured and predicted both ways, and how well each prediction tells
    a run's two ranks apart (the difference's miss, as a share of their mean)."""
    kernel = {k: constants[k] for k in EMBEDDING_CONSTANTS if k != "kernel_launch_ms"}
    kernel["ddr_gb_per_s"] = 1.0 / constants["ddr_gb_per_s"]  # the fit's units: a bandwidth as its reciprocal
    rows = [{"run": run.directory.name, "measured": [r["embedding"] for r in run.phases_ms],
             "profile": [r["embedding"] for r in compare(run).predicted],
             "kernel": [r["embedding"] for r in compare(run, kernel).predicted]} for run in runs]
    out = {"runs": rows}
    for side in ("profile", "kernel"):
        errors = [p / m - 1 for r in rows for p, m in zip(r[side], r["measured"])]
        misses = [((r[side][0] - r[side][1]) - (r["measured"][0] - r["measured"][1])) / statistics.mean(r["measured"])
                  for r in rows if len(r["measured"]) == 2]
        out[side] = {"rank_error_median": float(np.median(np.abs(errors))), "rank_error_mean": float(np.mean(errors)),
                     "rank_difference_miss_rms": float(np.sqrt(np.mean(np.square(misses)))), "ranks": len(errors)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hardware", default="cpu_xeon_m207")
    ap.add_argument("--runs", type=Path, help="a costmodel_bench.py --runs folder: its runs' ranks compared")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/lookup_kernel.json")
    args = ap.parse_args()
    if args.repeats < 2:
        ap.error("--repeats must be >= 2 (the grid's spread needs two)")
    if args.runs is not None and not any(args.runs.glob("mix*_r*/metrics.jsonl")):
        ap.error(f"--runs {args.runs}: no costmodel_bench.py runs in it (mix*_r*/metrics.jsonl)")
    if not args.out.parent.is_dir():
        ap.error(f"--out {args.out}: folder {args.out.parent} does not exist")
    runs = lookup_runs(args.runs, args.hardware) if args.runs is not None else None
    result = {"grid": grid(args.repeats)}
    print(json.dumps({k: v for k, v in result["grid"].items() if k != "samples"}, indent=1), flush=True)
    result["colocated"] = colocated(args.repeats)
    if runs is not None:
        result["ranks"] = ranks(runs, result["grid"]["constants"])
        print(json.dumps({k: result["ranks"][k] for k in ("profile", "kernel")}, indent=1))
    write_result(args.out, result)
    return 0


if __name__ == "__main__":
    run_cli(main)

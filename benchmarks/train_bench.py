"""Training benchmark: 2 ranks on gloo, synthetic data, ours against TorchRec's own recipe.

The anchor is `benchmarks/torchrec_recipe.py`: a stand-alone script using only TorchRec's public
API (its planner and stock sharder, DMP, fused row-wise Adagrad, TrainPipelineSparseDist,
batches generated before the loop), nothing from dlrm_scale. Ours is `dlrm_scale.train` on its
defaults (our plan; the CPU kernels the hardware profile's calibration chose; batches made
ahead by a worker thread). Same model, batch, table sizes, id distribution and learning rate.
Runs are alternated (ours, anchor, ours, ...), each figure the median over the windows after
the first (start-up), and the ratio of medians over repeats is reported with the spread.
Then, on the embedding-bound model, our plan with fp16/bf16 and int8 comms: bytes each
rank sent per step in the embedding collectives (measured) against fp32's, and AUC after
the same number of steps.

    python -m benchmarks.train_bench [--repeats 3] [--steps 200] [--parts models,precision]
    python -m benchmarks.train_bench --hardware h100_dgx --nproc 1 --parts models --out OUT.json   # on GPUs

With --hardware and --nproc the configs are trained on that profile's device (CUDA: NCCL, FBGEMM's
GPU kernels; the anchor takes the GPUs wherever there are GPUs) with that many ranks.

Writes benchmarks/results/train.json and prints a Markdown table for the README.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "train.json"
MODELS = {"embedding_bound": "configs/bench_embedding_bound.yaml", "kaggle_shaped": "configs/bench_kaggle_shaped.yaml"}


def run(config: str, steps: int, planner: str, precision: str = "fp32", plan: str | None = None, seed: int = 0, tries: int = 2,
        nproc: int = 2) -> dict:
    """One training job's figures; a job that dies (this shared machine) is run once more."""
    for attempt in range(tries):
        try:
            return _run(config, steps, planner, precision, plan, seed, nproc)
        except RuntimeError as e:
            print(f"run failed (attempt {attempt + 1}): {str(e)[-300:]}", file=sys.stderr, flush=True)
    raise RuntimeError(f"training failed {tries} times: {config} {planner} {precision}")


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def _run(config: str, steps: int, planner: str, precision: str, plan: str | None, seed: int, nproc: int) -> dict:
    if planner == "anchor":
        return _run_anchor(config, steps, seed, nproc)
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "-m", "dlrm_scale.train",
            "--config", config, "--steps", str(steps), "--planner", planner,
            "--comm-precision", f"fwd={precision},bwd={precision}" if precision != "fp16/bf16" else "fwd=fp16,bwd=bf16",
            "--out-dir", out, "--seed", str(seed), *(["--plan", plan, "--ignore-plan-inputs"] if plan else []),  # one layout, every precision
        ]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            raise RuntimeError(f"training failed: {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
        plan = json.loads(Path(out, "plan.json").read_text())
    steps_logged = [r for r in records if "samples_per_s" in r]
    evals = [r for r in records if "auc" in r]
    schemes: dict[str, int] = {}
    for t in plan["tables"].values():
        schemes[t["sharding_type"]] = schemes.get(t["sharding_type"], 0) + 1
    windows = steps_logged[1:]  # the first window holds start-up (pipeline fill, first allocations)
    phases = {p: statistics.median(max(r["phase_ms"][p]) for r in windows) for p in windows[0]["phase_ms"]}
    return {
        "samples_per_s": statistics.median(r["samples_per_s"] for r in windows),
        "step_ms": statistics.median(r["step_ms"] for r in windows),
        # the slower rank's ms per step in each phase, median over windows
        "phase_ms": phases,
        "phases_sum_vs_step": statistics.median(sum(r["phase_ms"][p][0] for p in phases) / r["step_ms"] for r in windows),
        "comm_bytes": statistics.median(r["comm_bytes"] for r in windows),
        "auc": evals[-1]["auc"],
        "logloss": evals[-1]["logloss"],
        "schemes": schemes,
    }


def _run_anchor(config: str, steps: int, seed: int, nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        result = Path(out, "result.json")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "benchmarks/torchrec_recipe.py",
               "--config", config, "--steps", str(steps), "--seed", str(seed), "--out", str(result)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            raise RuntimeError(f"anchor failed: {proc.stderr[-2000:]}")
        doc = json.loads(result.read_text())
    return {"samples_per_s": statistics.median(doc["samples_per_s"][1:]), "schemes": doc["schemes"]}


def on_device(config: str, hardware: str, nproc: int, folder: Path) -> str:
    """`config` on the profile `hardware` with `nproc` ranks, written into `folder` (JSON is YAML)."""
    import yaml

    doc = yaml.safe_load((ROOT / config).read_text())
    doc["hardware"] = hardware
    doc.setdefault("cluster", {})["world_size"] = nproc
    path = folder / Path(config).name
    path.write_text(json.dumps(doc))
    return str(path)


def spread(values: list[float]) -> list[float]:
    return [round(min(values), 1), round(max(values), 1)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--parts", default="models,precision", help="models, precision, or both")
    ap.add_argument("--seeds", type=int, default=3, help="seeds per precision in the precision part")
    ap.add_argument("--hardware", help="train on this hardware profile's device (e.g. h100_dgx: the GPUs)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (on a GPU machine: at most one a GPU)")
    args = ap.parse_args()
    if args.nproc < 1 or (args.nproc < 2 and "precision" in args.parts):
        ap.error("--nproc must be >= 1, and >= 2 for the precision part (one rank sends nothing)")
    with tempfile.TemporaryDirectory() as scratch:  # the device configs and the plan, gone with the benchmark
        return bench(args, Path(scratch))


def bench(args: argparse.Namespace, scratch: Path) -> int:
    models = dict(MODELS)
    if args.hardware is not None or args.nproc != 2:
        models = {m: on_device(c, args.hardware or "cpu_gloo", args.nproc, scratch) for m, c in MODELS.items()}
    parts = set(args.parts.split(","))
    results = json.loads(Path(args.out).read_text()) if Path(args.out).exists() and parts != {"models", "precision"} else {}
    results.update(steps=args.steps, repeats=args.repeats, seeds=args.seeds, ranks=args.nproc,
                   hardware=args.hardware or "as the configs give")
    results.setdefault("models", {})
    results.setdefault("comm_precision", {})
    for model, config in models.items() if "models" in parts else []:
        runs = {"ours": [], "anchor": []}
        for _ in range(args.repeats):
            for side in ("ours", "anchor"):
                r = run(config, args.steps, side, nproc=args.nproc)
                runs[side].append(r)
                print(model, side, json.dumps(r), flush=True)
        ours = [r["samples_per_s"] for r in runs["ours"]]
        theirs = [r["samples_per_s"] for r in runs["anchor"]]
        results["models"][model] = {
            "ours_samples_per_s": statistics.median(ours), "anchor_samples_per_s": statistics.median(theirs),
            "speedup": statistics.median(ours) / statistics.median(theirs),
            "ours_spread": spread(ours), "anchor_spread": spread(theirs),
            "speedup_per_pair": [round(a / b, 3) for a, b in zip(ours, theirs)], "runs": runs,
        }
    config = models["embedding_bound"]
    base = None
    plan = str(scratch / "plan.json")  # one plan for all precisions
    if "precision" in parts:
        subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", config, "--out", plan], cwd=ROOT, check=True, capture_output=True)
    # AUC after 200 steps moves by ~0.002 with the seed; each precision is compared with fp32
    # on the same seeds (same initial model and data), and the differences averaged
    for precision in ("fp32", "fp16/bf16", "int8") if "precision" in parts else []:
        runs = [run(config, args.steps, "ours", precision, plan, seed, nproc=args.nproc) for seed in range(args.seeds)]
        base = base or runs
        diffs = [r["auc"] - b["auc"] for r, b in zip(runs, base)]
        results["comm_precision"][precision] = {
            "comm_bytes": runs[0]["comm_bytes"], "bytes_vs_fp32": runs[0]["comm_bytes"] / base[0]["comm_bytes"],
            "auc": statistics.mean(r["auc"] for r in runs), "auc_minus_fp32": statistics.mean(diffs),
            "auc_minus_fp32_per_seed": diffs, "runs": runs,
        }
        print(precision, json.dumps(results["comm_precision"][precision]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out), results)
    print("| model | ours samples/s (min-max) | TorchRec recipe samples/s (min-max) | ratio of medians | per pair |\n|---|---|---|---|---|")
    for model, m in results["models"].items():
        print(f"| {model} | {m['ours_samples_per_s']:,.0f} ({m['ours_spread'][0]:,.0f}-{m['ours_spread'][1]:,.0f}) | "
              f"{m['anchor_samples_per_s']:,.0f} ({m['anchor_spread'][0]:,.0f}-{m['anchor_spread'][1]:,.0f}) | "
              f"{m['speedup']:.2f}x | {' / '.join(f'{x:.2f}' for x in m['speedup_per_pair'])} |")
    print("| comms | bytes/step/rank | vs fp32 | AUC (mean) | AUC - fp32 (mean) | per seed |\n|---|---|---|---|---|---|")
    for p, r in results["comm_precision"].items():
        per_seed = " / ".join(f"{d:+.4f}" for d in r["auc_minus_fp32_per_seed"])
        print(f"| {p} | {r['comm_bytes']:,.0f} | {r['bytes_vs_fp32']:.3f} | {r['auc']:.4f} | {r['auc_minus_fp32']:+.4f} | {per_seed} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

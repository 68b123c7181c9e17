"""Cost-model validation: predicted against measured step time, for real, on this machine.

Runs table mixes under several plans each (ours, TorchRec's, uniform table-wise, column-wise,
row-wise, data-parallel) as 2-rank gloo training jobs, with the calibrated profile
(configs/hardware/cpu_gloo.yaml, from `dlrm-scale calibrate`), and compares the measured step
time (median over logging windows after the first) with `dlrm-scale simulate`'s prediction.

    python benchmarks/costmodel_bench.py [--steps 60]

Writes benchmarks/results/costmodel.json and costmodel.png, and prints the README table.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_scale.run_config import ModelConfig  # noqa: E402
from dlrm_scale.tools.simulate import simulate  # noqa: E402
from dlrm_scale.run_config import load_problem  # noqa: E402
from planner.plan import Plan, table_layout  # noqa: E402
from planner.types import ShardingType  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
MODEL = {"num_dense_features": 13, "dense_arch": [64, 32], "over_arch": [64, 1]}

# (name, tables, rows, dim, pooling factors cycled over the tables)
MIXES = [
    ("few_light", 4, 20_000, 16, [1, 2]),
    ("few_heavy", 4, 200_000, 64, [20, 5]),
    ("many_light", 16, 10_000, 32, [1, 1, 3]),
    ("mixed_pooling", 8, 100_000, 32, [1, 30, 5, 2]),
    ("skewed", 8, 200_000, 64, [60, 1, 1, 1]),
]
UNIFORM = {"table_wise": None, "column_wise": 2, "row_wise": 2, "data_parallel": 2}


def write_config(path: Path, num_tables, rows, dim, pooling) -> None:
    lines = [
        "hardware: cpu_gloo", "cluster: {world_size: 2}", "training: {batch_size_per_rank: 512}",
        f"model: {json.dumps(MODEL)}", "train: {log_every: 10, eval_batches: 1}", "tables:",
    ]
    for i in range(num_tables):
        lines.append(f"  - {{name: t{i}, num_embeddings: {rows}, embedding_dim: {dim}, pooling_factor: {float(pooling[i % len(pooling)])}}}")
    path.write_text("\n".join(lines) + "\n")


def uniform_plan(problem, scheme: str) -> Plan:
    st = ShardingType(scheme)
    tables = {t.name: table_layout(t, st, [i % 2] if scheme == "table_wise" else [0, 1], "ddr") for i, t in enumerate(problem.tables)}
    return Plan(2, 2, tables, (), 0.0, 0.0)


def train(config: Path, steps: int, plan: Path | None, planner: str, out: Path) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "dlrm_scale.train",
           "--config", str(config), "--steps", str(steps), "--planner", planner, "--out-dir", str(out)]
    if plan:
        cmd += ["--plan", str(plan)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    rates = [json.loads(l)["samples_per_s"] for l in (out / "metrics.jsonl").read_text().splitlines() if "samples_per_s" in l]
    return 1024 / statistics.median(rates[1:]) * 1e3


def spearman(a, b) -> float:
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    return float(np.corrcoef(ra, rb)[0, 1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for name, n, r, d, pool in MIXES:
            config = tmp / f"{name}.yaml"
            write_config(config, n, r, d, pool)
            problem = load_problem(config)
            for label in ["ours", "torchrec", *UNIFORM]:
                out = tmp / f"{name}_{label}"
                plan_path = None
                if label in UNIFORM:
                    plan_path = tmp / f"{name}_{label}.json"
                    uniform_plan(problem, label).save(plan_path)
                measured = train(config, args.steps, plan_path, "torchrec" if label == "torchrec" else "ours", out)
                plan = Plan.load(out / "plan.json")
                sim = simulate(plan, problem, ModelConfig(**MODEL))
                row = {"mix": name, "plan": label, "measured_step_ms": measured, "predicted_step_ms": sim.step_ms,
                       "predicted_embedding_ms": [r.embedding.total_ms for r in sim.ranks]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    measured = np.array([r["measured_step_ms"] for r in rows])
    predicted = np.array([r["predicted_step_ms"] for r in rows])
    rel = np.abs(predicted - measured) / measured
    summary = {"runs": len(rows), "spearman": spearman(predicted, measured), "median_abs_rel_error": float(np.median(rel)),
               "max_abs_rel_error": float(rel.max())}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "costmodel.json").write_text(json.dumps({"summary": summary, "steps": args.steps, "results": rows}, indent=1) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 5))
    for label in ["ours", "torchrec", *UNIFORM]:
        sel = [i for i, r in enumerate(rows) if r["plan"] == label]
        ax.scatter(measured[sel], predicted[sel], label=label, s=18)
    lim = [0, max(measured.max(), predicted.max()) * 1.05]
    ax.plot(lim, lim, "k--", linewidth=1)
    ax.set_xlabel("measured step ms")
    ax.set_ylabel("predicted step ms")
    ax.set_title(f"Spearman {summary['spearman']:.3f}, median |rel err| {100 * summary['median_abs_rel_error']:.1f}%")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "costmodel.png", dpi=100)
    print(json.dumps(summary))
    print("| runs | Spearman | median abs rel error | max abs rel error |\n|---|---|---|---|")
    print(f"| {summary['runs']} | {summary['spearman']:.3f} | {100 * summary['median_abs_rel_error']:.1f}% | {100 * summary['max_abs_rel_error']:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

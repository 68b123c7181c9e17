"""The plan never changes the model, measured: one config and seed trained under several plans
and world sizes (same global batch), every step's loss compared with all-table-wise on 2 ranks.

    python -m benchmarks.invariance_bench [--models tiny,embedding_bound] [--steps 300]

Plans, each a real `torchrun ... dlrm_scale.train --deterministic` job: all table-wise, all
column-wise, all row-wise, data-parallel (every table where it fits: tiny; tables up to 50k
rows, the rest table-wise: embedding-bound, whose 2M-row tables would each cost a dense
all-reduce of 0.5 GB per step), the planner's own, and the planner's own on 4 ranks at half
the batch per rank. Column-wise schemes keep row-wise Adagrad's state per column shard
(FBGEMM's layout), so they are reported as the documented deviation they are. A control run
(the anchor's plan, with the other of our two dot-interaction kernels: the same function up to
summation order) measures how far rounding alone moves this model's trajectory.
Writes benchmarks/results/invariance.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


from dlrm_scale.run_config import load_problem
from planner.plan.document import Plan, table_layout
from planner.spec.types import ShardingType
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "invariance.json"
MODELS = {"tiny": "configs/tiny.yaml", "embedding_bound": "configs/bench_embedding_bound.yaml"}
DP_MAX_ROWS = {"tiny": None, "embedding_bound": 50_000}  # None: every table data-parallel
SEED = 7
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
ANCHOR = "table_wise@2"
CONTROL = "table_wise@2, other interaction kernel"


def other_interaction(config: str) -> str:
    """The dot interaction the trainer does not pick by default on this machine."""
    from dlrm_scale.run_config import measured_cpu_kernels
    from planner.spec.config import profile_file, read_yaml

    profile = profile_file(read_yaml(Path(config), "config"), f"config {config}")
    return "torchrec" if measured_cpu_kernels(profile)["interaction"] == "dlrm_scale" else "dlrm_scale"


def hand_plan(config: str, scheme: str, world: int, dp_max_rows: int | None = None) -> Plan:
    problem = load_problem(config, cluster_overrides={"world_size": world, "ranks_per_node": world})
    tables = {}
    for i, t in enumerate(problem.tables):
        if scheme == "data_parallel" and (dp_max_rows is None or t.num_embeddings <= dp_max_rows):
            tables[t.name] = table_layout(t, ShardingType.DATA_PARALLEL, list(range(world)), "ddr")
        elif scheme == "column_wise":
            tables[t.name] = table_layout(t, ShardingType.COLUMN_WISE, [(i + k) % world for k in range(world)], "ddr")
        elif scheme == "row_wise":
            tables[t.name] = table_layout(t, ShardingType.ROW_WISE, list(range(world)), "ddr")
        else:
            tables[t.name] = table_layout(t, ShardingType.TABLE_WISE, [i % world], "ddr")
    return Plan(world, world, tables, (), 0.0, 0.0)


def train(config: str, steps: int, world: int, batch_per_rank: int, plan: Plan | None, *flags: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "-m", "dlrm_scale.train",
               "--config", config, "--steps", str(steps), "--batch-size", str(batch_per_rank), "--seed", str(SEED),
               "--deterministic", "--out-dir", out, *flags]
        if plan is not None:
            plan.save(Path(out) / "given_plan.json")
            cmd += ["--plan", str(Path(out) / "given_plan.json")]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            raise RuntimeError(f"training failed: {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
        used = json.loads(Path(out, "plan.json").read_text())
    schemes: dict[str, int] = {}
    for t in used["tables"].values():
        schemes[t["sharding_type"]] = schemes.get(t["sharding_type"], 0) + 1
    return {"losses": [r["loss"] for r in records if "loss" in r], "auc": [r["auc"] for r in records if "auc" in r][-1],
            "schemes": schemes, "wall_s": round(time.perf_counter() - started, 1)}


def compare(run: dict, anchor: dict) -> dict:
    rel = [abs(a - b) / abs(b) for a, b in zip(run["losses"], anchor["losses"])]
    return {
        "max_rel_loss_diff": max(rel),
        "first_loss_equal": run["losses"][0] == anchor["losses"][0],
        "bitwise_equal_losses": run["losses"] == anchor["losses"],
        "auc": round(run["auc"], 6),
        "auc_diff": round(run["auc"] - anchor["auc"], 6),
        "schemes": run["schemes"],
        "wall_s": run["wall_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    results = {"steps": args.steps, "seed": SEED, "anchor": ANCHOR, "models": {}}
    for model in args.models.split(","):
        config = MODELS[model]
        batch = load_problem(config).training.batch_size_per_rank
        jobs = {
            ANCHOR: (2, batch, hand_plan(config, "table_wise", 2)),
            "column_wise@2": (2, batch, hand_plan(config, "column_wise", 2)),
            "row_wise@2": (2, batch, hand_plan(config, "row_wise", 2)),
            "data_parallel@2": (2, batch, hand_plan(config, "data_parallel", 2, DP_MAX_ROWS[model])),
            "planner@2": (2, batch, None),
            "planner@4": (4, batch // 2, None),
            # the noise floor: the anchor's plan with the other (equal up to rounding) dot interaction
            CONTROL: (2, batch, hand_plan(config, "table_wise", 2), "--interaction", other_interaction(config)),
        }
        runs = {}
        for name, (world, per_rank, plan, *flags) in jobs.items():
            runs[name] = train(config, args.steps, world, per_rank, plan, *flags)
            print(f"{model} {name}: final loss {runs[name]['losses'][-1]:.6f} AUC {runs[name]['auc']:.4f} "
                  f"({runs[name]['wall_s']} s)", flush=True)
        results["models"][model] = {
            "global_batch": 2 * batch,
            "anchor_auc": round(runs[ANCHOR]["auc"], 6),
            "plans": {name: compare(run, runs[ANCHOR]) for name, run in runs.items() if name != ANCHOR},
        }
        print(json.dumps(results["models"][model], indent=1), flush=True)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    write_result(RESULTS, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())

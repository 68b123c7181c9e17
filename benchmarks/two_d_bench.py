"""2D sparse parallelism against 1D, trained: what syncing replicas every N steps does to the model.

    python -m benchmarks.two_d_bench [--models tiny,embedding_bound] [--steps 300] [--seeds 1,2,3]

On 2 cores the embedding-bound model's sync every step (1.6 GB a rank over gloo) takes seconds,
so its N = 1 run takes ~10 minutes: `--models embedding_bound --seeds 1` measures it alone,
beside the models already in the file.

Each model on 4 CPU ranks (one node), the same global batch of every step whatever the plan:
the 1D plan over all 4 ranks, and 2D plans of 2 replicas of a 2-rank sharding group synced
every N = 1 and N = 10 steps (dlrm_scale.training.replicas), each a real `torchrun ... dlrm_scale.train --deterministic` job
evaluated on the held-out batches at the last step. Runs alternate per seed (the order rotates),
so a slow moment of the machine falls on every plan alike.

Plans: embedding-bound, the planner's (`dlrm-scale plan` and `--sync-every N --group-size 2`),
which keep its small tables data-parallel; tiny, every table table-wise (the planner makes
every tiny table data-parallel, and data-parallel tables are all-reduced every step, never
replicated: 2D would be 1D exactly). Writes benchmarks/results/two_d.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from benchmarks.common import ROOT, provenance, write_result
from benchmarks.invariance_bench import hand_plan
from dlrm_scale.run_config import load_problem
from planner.plan.document import Plan, Replication

RESULTS = ROOT / "benchmarks" / "results" / "two_d.json"
MODELS = {"tiny": "configs/tiny.yaml", "embedding_bound": "configs/bench_embedding_bound.yaml"}
WORLD, GROUP = 4, 2
SYNC_EVERY = (1, 10)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def planned(model: str, config: str, batch: int, sync_every: int | None, directory: Path) -> Path:
    """The plan file of one variant: 1D (`sync_every` None) or 2D over groups of GROUP ranks."""
    path = directory / f"{model}_{sync_every or '1d'}.json"
    if model == "tiny":
        plan = hand_plan(config, "table_wise", WORLD if sync_every is None else GROUP)
        if sync_every is not None:
            plan = replace(plan, replication=Replication(GROUP, WORLD // GROUP, sync_every, 0.0))
        plan.save(path)
        return path
    flags = [] if sync_every is None else ["--sync-every", str(sync_every), "--group-size", str(GROUP)]
    proc = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", config, "--world-size", str(WORLD), "--ranks-per-node",
                           str(WORLD), "--batch-size", str(batch), "--out", str(path), *flags],
                          cwd=ROOT, capture_output=True, text=True, env=ENV)
    if proc.returncode != 0:
        raise RuntimeError(f"planning failed: {proc.stderr[-2000:]}")
    return path


def train(config: str, plan: Path, steps: int, batch: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(WORLD), "-m", "dlrm_scale.train",
               "--config", config, "--plan", str(plan), "--steps", str(steps), "--batch-size", str(batch), "--seed", str(seed),
               "--eval-every", "0", "--deterministic", "--out-dir", out]
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=ENV)
        if proc.returncode != 0:
            raise RuntimeError(f"training failed: {proc.stderr[-2000:]}")
        records = [json.loads(line) for line in Path(out, "metrics.jsonl").read_text().splitlines()]
    windows = [r for r in records if "loss" in r and "samples_per_s" in r]
    final = [r for r in records if "auc" in r][-1]
    synced = [sum(r.get("replica_sync_bytes", [0])) for r in windows]
    return {"auc": final["auc"], "logloss": final["logloss"],
            "losses_every_25": [round(r["loss"], 6) for r in windows][24::25],
            "samples_per_s": statistics.median(r["samples_per_s"] for r in windows[len(windows) // 5:]),
            "replica_sync_bytes_per_step": sum(synced) / len(windows),
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="1,2,3")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    # models measured by another invocation stay (each with its own provenance and seeds)
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if (doc.get("steps"), doc.get("ranks"), doc.get("group_size")) != (args.steps, WORLD, GROUP):
        doc = {"steps": args.steps, "ranks": WORLD, "group_size": GROUP, "models": {}}
    variants = ["1d", *(f"2d_sync_every_{n}" for n in SYNC_EVERY)]
    for model in args.models.split(","):
        config = MODELS[model]
        batch = load_problem(config).training.batch_size_per_rank // 2  # the global batch of 2 ranks at the config's batch
        with tempfile.TemporaryDirectory() as d:
            plans = dict(zip(variants, (planned(model, config, batch, n, Path(d)) for n in (None, *SYNC_EVERY))))
            runs: dict[str, list[dict]] = {v: [] for v in variants}
            result = doc["models"][model] = {"provenance": provenance(), "seeds": seeds, "global_batch": batch * WORLD,
                                             "schemes": {v: _schemes(Plan.load(p)) for v, p in plans.items()}, "runs": runs}
            for i, seed in enumerate(seeds):
                for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
                    run = train(config, plans[variant], args.steps, batch, seed)
                    runs[variant].append({"seed": seed, **run})
                    print(f"{model} seed {seed} {variant}: AUC {run['auc']:.4f} logloss {run['logloss']:.4f} "
                          f"{run['samples_per_s']:,.0f} samples/s ({run['wall_s']} s)", flush=True)
                    result["auc_diff_vs_1d"] = {v: [round(r["auc"] - a["auc"], 6) for r, a in zip(runs[v], runs["1d"])]
                                                for v in variants[1:]}
                    write_result(RESULTS, doc)  # after each run: a stopped run keeps what it measured
        print(json.dumps(result["auc_diff_vs_1d"]), flush=True)
    return 0


def _schemes(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in plan.tables.values():
        counts[t.sharding_type] = counts.get(t.sharding_type, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())

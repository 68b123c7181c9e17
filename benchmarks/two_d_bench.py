"""2D sparse parallelism against 1D, trained: the model a 2D plan trains, synced every N steps.

    python -m benchmarks.two_d_bench [--models tiny,embedding_bound] [--steps 300] [--seeds 1,2,3] [--sync-every 1,10]

A model's runs of other seeds or N stay in the file (e.g. `--models tiny --sync-every 10`), each
naming the invocation that made it. On 2 cores the whole benchmark takes about 30 minutes.

Each model on 4 CPU ranks (one node), the same global batch of every step whatever the plan:
the 1D plan over all 4 ranks, and 2D plans of 2 replicas of a 2-rank sharding group synced
every N = 1 and N = 10 steps (dlrm_scale.training.replicas), each a real
`torchrun ... dlrm_scale.train --deterministic` job
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
from planner.plan.document import Plan
from planner.plan.replication import replication_of

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
            problem = load_problem(config, training_overrides={"batch_size_per_rank": batch})
            plan = replace(plan, replication=replication_of(plan, problem, WORLD // GROUP, sync_every))
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
    def per_step(key: str) -> float:  # summed over ranks, mean over steps (a window is a step: --deterministic)
        return sum(sum(r.get(key, [0])) for r in windows) / len(windows)

    return {"auc": final["auc"], "logloss": final["logloss"],
            "losses_every_25": [round(r["loss"], 6) for r in windows][24::25],
            "samples_per_s": statistics.median(r["samples_per_s"] for r in windows[len(windows) // 5:]),
            "replica_sync_bytes_per_step": per_step("replica_sync_bytes"),
            "replica_sync_bytes_per_step_predicted": per_step("replica_sync_bytes_predicted"),
            "wall_s": round(time.perf_counter() - started, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--sync-every", default=",".join(map(str, SYNC_EVERY)),
                        help="the 2D variants' N, beside 1D (default 1,10); a model's runs of other seeds or N stay")
    args = parser.parse_args()
    seeds, sync_every = [int(s) for s in args.seeds.split(",")], [int(n) for n in args.sync_every.split(",")]
    # models measured by another invocation stay (each with its own provenance and seeds)
    doc = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if (doc.get("steps"), doc.get("ranks"), doc.get("group_size")) != (args.steps, WORLD, GROUP):
        doc = {"steps": args.steps, "ranks": WORLD, "group_size": GROUP, "models": {}}
    variants = ["1d", *(f"2d_sync_every_{n}" for n in sync_every)]
    for model in args.models.split(","):
        config = MODELS[model]
        batch = load_problem(config).training.batch_size_per_rank // 2  # the global batch of 2 ranks at the config's batch
        with tempfile.TemporaryDirectory() as d:
            plans = dict(zip(variants, (planned(model, config, batch, n, Path(d)) for n in (None, *sync_every))))
            result = _model_entry(doc, model, batch * WORLD)
            result["provenance"].append(provenance())
            result["schemes"].update({v: _schemes(Plan.load(p)) for v, p in plans.items()})
            runs = result["runs"]
            for i, seed in enumerate(seeds):
                for variant in variants[i % len(variants):] + variants[:i % len(variants)]:
                    run = train(config, plans[variant], args.steps, batch, seed)
                    kept = [r for r in runs.setdefault(variant, []) if r["seed"] != seed]
                    runs[variant] = sorted(kept + [{"seed": seed, "invocation": len(result["provenance"]) - 1, **run}],
                                           key=lambda r: r["seed"])
                    print(f"{model} seed {seed} {variant}: AUC {run['auc']:.4f} logloss {run['logloss']:.4f} "
                          f"{run['samples_per_s']:,.0f} samples/s ({run['wall_s']} s)", flush=True)
                    one_d = {r["seed"]: r["auc"] for r in runs.get("1d", [])}
                    result["auc_diff_vs_1d"] = {v: {str(r["seed"]): round(r["auc"] - one_d[r["seed"]], 6) for r in rs if r["seed"] in one_d}
                                                for v, rs in runs.items() if v != "1d"}
                    write_result(RESULTS, doc)  # after each run: a stopped run keeps what it measured
        print(json.dumps(result["auc_diff_vs_1d"]), flush=True)
    return 0


def _model_entry(doc: dict, model: str, global_batch: int) -> dict:
    """The model's runs so far (each names the invocation in `provenance` that made it), or none
    where they were of another global batch."""
    entry = doc["models"].get(model)
    if entry is None or entry.get("global_batch") != global_batch or not isinstance(entry.get("provenance"), list):
        entry = doc["models"][model] = {"provenance": [], "global_batch": global_batch, "schemes": {}, "runs": {}}
    return entry


def _schemes(plan: Plan) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in plan.tables.values():
        counts[t.sharding_type] = counts.get(t.sharding_type, 0) + 1
    return counts


if __name__ == "__main__":
    sys.exit(main())

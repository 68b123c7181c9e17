"""The trainer of two checkouts on this machine, alternated: did a change move its speed?

    git worktree add /tmp/before BASE_COMMIT
    python -m benchmarks.trees_ab /tmp/before . [--pairs 5] [--steps 200]

Runs `dlrm_scale.train` of each tree on its defaults (PYTHONPATH and working directory set to
the tree), before/after/before/..., on the training benchmark's two models, and reports each
tree's median samples/s (the median over the 25-step windows after the first), the ratio of
medians, each pair's ratio and, per run, the slower rank's ms in every phase: a change that
slows a code path shows in one phase; a machine that slows shows in all of them.

Each tree compiles its CPU extension on first use into the virtual environment's build folder;
two trees whose sources sit at different paths would rebuild it in turn, so give the other tree
a folder of its own first (its `cpu_extension.build_directory()`).
Writes benchmarks/results/trees_ab.json.
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

MODELS = {"embedding_bound": "configs/bench_embedding_bound.yaml", "kaggle_shaped": "configs/bench_kaggle_shaped.yaml"}


def run(tree: Path, config: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(tree)}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "dlrm_scale.train",
               "--config", config, "--steps", str(steps), "--out-dir", out]
        proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{tree}: training failed: {proc.stderr[-2000:]}")
        windows = [json.loads(l) for l in Path(out, "metrics.jsonl").read_text().splitlines() if "samples_per_s" in l][1:]
    return {"samples_per_s": statistics.median(r["samples_per_s"] for r in windows),
            "phase_ms": {p: statistics.median(max(r["phase_ms"][p]) for r in windows) for p in windows[0]["phase_ms"]}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "trees_ab.json"))
    args = ap.parse_args()
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    results = {}
    for model, config in MODELS.items():
        runs = {side: [] for side in trees}
        for _ in range(args.pairs):
            for side, tree in trees.items():
                runs[side].append(run(tree, config, args.steps))
                print(model, side, round(runs[side][-1]["samples_per_s"]), flush=True)
        rates = {side: [r["samples_per_s"] for r in rs] for side, rs in runs.items()}
        results[model] = {"after_over_before": statistics.median(rates["after"]) / statistics.median(rates["before"]),
                          "pairs": [round(a / b, 3) for a, b in zip(rates["after"], rates["before"])], "runs": runs}
        print(f"{model}: after/before {results[model]['after_over_before']:.3f}, pairs {results[model]['pairs']}", flush=True)
    doc = {"before": str(trees["before"]), "after": str(trees["after"]), "steps": args.steps, "results": results}
    write_result(Path(args.out), doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())

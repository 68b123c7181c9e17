"""Planning under constraints at scale: 1,000 synthetic tables on 128 ranks (the planner
benchmark's synthetic_1000x128) with 50 constraints of every kind — per-table rules on schemes,
shards and kernels, pins to nodes and ranks, co-located groups, keep-apart groups — and a
memory reserve, against the same problem unconstrained. Reports planning time (the issue asks
≤ 10 s), the busiest rank and its gap to the proven bound, and checks every constraint in the
plan (tests/capacity_problems.broken_rule).

    python -m benchmarks.constraints_bench [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


from benchmarks.workloads import workload
from planner.spec.config import constrain
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from tests.capacity_problems import broken_rule
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "constraints.json"


def section(num_tables: int, world: int, ranks_per_node: int) -> dict:
    """50 constraints: 30 table rules (10 scheme/shard rules, 10 kernel rules, 5 node pins,
    5 rank pins), 10 co-located pairs and 10 keep-apart groups of 3, and a 2 GiB HBM reserve."""
    nodes = world // ranks_per_node
    rules = [{"match": f"t{i}", "schemes": ["table_wise", "column_wise"], "max_shards": 4} for i in range(0, 100, 10)]
    rules += [{"match": f"t{i}", "kernels": ["fused"]} for i in range(5, 105, 10)]
    rules += [{"match": f"t{i}", "nodes": [i % nodes]} for i in range(200, 205)]
    rules += [{"match": f"t{i}", "ranks": [i % world, (i + 1) % world]} for i in range(300, 305)]
    colocate = [[f"t{i}", f"t{i + 1}"] for i in range(400, 420, 2)]
    apart = [[f"t{i}", f"t{i + 1}", f"t{i + 2}"] for i in range(500, 530, 3)]
    assert len(rules) + len(colocate) + len(apart) == 50 and num_tables > 530
    return {"tables": rules, "colocate": colocate, "apart": apart, "reserve_gib_per_rank": {"hbm": 2}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    free = workload("synthetic", 1000, 128)
    problems = {"unconstrained": free,
                "constrained": constrain(free, section(1000, 128, free.cluster.ranks_per_node))}
    runs = {name: [] for name in problems}
    for _ in range(args.repeats):  # alternated
        for name, problem in problems.items():
            start = time.monotonic()
            plan = make_plan(problem, config=SolverConfig(time_limit_s=args.time_limit))
            seconds = time.monotonic() - start
            broken = broken_rule(plan, problem)
            runs[name].append({"seconds": seconds, "max_rank_ms": plan.max_rank_ms, "lower_bound_ms": plan.lower_bound_ms,
                               "gap": plan.max_rank_ms / plan.lower_bound_ms - 1, "solver": plan.solver, "broken": broken})
            print(f"{name:14} {seconds:6.2f} s  busiest {plan.max_rank_ms:.4f} ms  gap {runs[name][-1]['gap']:+.3%}  "
                  f"{plan.solver}  {'OK' if broken is None else broken}", flush=True)
    summary = {name: {"median_seconds": statistics.median(r["seconds"] for r in rs),
                      "seconds": [round(r["seconds"], 2) for r in rs],
                      "max_rank_ms": rs[0]["max_rank_ms"], "gap": rs[0]["gap"],
                      "violations": sum(r["broken"] is not None for r in rs)} for name, rs in runs.items()}
    summary["constrained"]["vs_unconstrained"] = summary["constrained"]["max_rank_ms"] / summary["unconstrained"]["max_rank_ms"]
    out = {
           "workload": "synthetic_1000x128", "constraints": 50, "time_limit_s": args.time_limit,
           "summary": summary, "runs": runs}
    write_result(Path(args.out), out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

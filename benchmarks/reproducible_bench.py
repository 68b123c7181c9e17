"""Reproducible plans: every planner-benchmark workload planned with the machine otherwise idle
and again with every core busy (one spinning process per core beside the planner), alternated.

A plan is reproducible when both give the same plan/v1 document, byte for byte (solve_seconds
aside); where one does not, its solver names the stages the wall clock stopped
(planner/search/wall_clock.py), and this benchmark checks that it does.

    python -m benchmarks.reproducible_bench [--only NAME ...] [--repeats 2] [--time-limit 10]

Writes benchmarks/results/reproducible.json and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import time

from benchmarks.common import ROOT, write_result
from benchmarks.workloads import WORKLOADS, workload
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig

RESULTS = ROOT / "benchmarks" / "results" / "reproducible.json"


def _spin() -> None:
    while True:
        pass


@contextlib.contextmanager
def busy(cores: int):
    """`cores` processes spinning, as a training run beside the planner keeps the cores busy."""
    spinners = [mp.get_context("spawn").Process(target=_spin, daemon=True) for _ in range(cores)]
    for p in spinners:
        p.start()
    time.sleep(0.5)
    try:
        yield
    finally:
        for p in spinners:
            p.terminate()
            p.join()


def planned(problem, time_limit_s: float) -> dict:
    """The plan's document without its solve time, its solver, busiest rank, bound and step, and the seconds it took."""
    start = time.perf_counter()
    plan = make_plan(problem, config=SolverConfig(time_limit_s=time_limit_s))
    seconds = time.perf_counter() - start
    doc = plan.to_dict()
    doc["predicted"].pop("solve_seconds")
    return {"doc": json.dumps(doc, sort_keys=True), "solver": plan.solver, "seconds": seconds, "max_rank_ms": plan.max_rank_ms,
            "lower_bound_ms": plan.lower_bound_ms, "step_ms": plan.step[0] if plan.step else None}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="+", help="workload names")
    ap.add_argument("--repeats", type=int, default=1, help="idle/busy pairs per workload")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    rows = []
    for name, kind, tables, ranks, _ in WORKLOADS:
        if args.only and name not in args.only:
            continue
        problem = workload(kind, tables, ranks)
        runs = []
        for _ in range(args.repeats):
            for load in ("idle", "busy"):
                with busy(cores) if load == "busy" else contextlib.nullcontext():
                    runs.append({"load": load, **planned(problem, args.time_limit)})
        same = len({r["doc"] for r in runs}) == 1
        # plans that differ are explained where a run was cut by the ceiling, which its plan records
        named = any("[wall clock: " in r["solver"] for r in runs) if not same else None
        row = {"workload": name, "tables": tables, "ranks": ranks, "identical": same, "differing_plans_name_the_wall_clock": named,
               "runs": [{k: v for k, v in r.items() if k != "doc"} for r in runs]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_result(args.out, {"time_limit_s": args.time_limit, "cores_busy": cores, "repeats": args.repeats, "results": rows})
    print("| workload | identical idle and busy | solver (idle / busy) | seconds (idle / busy) |")
    print("|---|---|---|---|")
    for r in rows:
        idle = [x for x in r["runs"] if x["load"] == "idle"]
        busy_ = [x for x in r["runs"] if x["load"] == "busy"]
        print(f"| {r['workload']} | {'yes' if r['identical'] else 'no'} | {idle[0]['solver']} / {busy_[0]['solver']} "
              f"| {idle[0]['seconds']:.1f} / {busy_[0]['seconds']:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Planner benchmark: dlrm-scale's planner against TorchRec 1.8's EmbeddingShardingPlanner.

For every workload, in the same run:
- quality: both plans scored by TorchRec's own estimator; ours searched with that estimator
  too (--cost-model torchrec) so the comparison is of the search. The lower bound is the
  issue's: max(sum of cheapest options / ranks, max over tables of smallest largest shard),
  from the same estimates; the proven bound is the solver's (never below it).
- speed: our planner with its own cost model (the default), and TorchRec's planner, each
  in a child process with a time limit.
- memory: every rank's bytes per tier re-checked against the cluster's capacities.

    python -m benchmarks.planner_bench [--only NAME ...] [--torchrec-timeout S]

Writes benchmarks/results/planner.json and prints the Markdown table docs/benchmarks.md shows.
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing as mp
import platform
import sys
import time
from pathlib import Path


from benchmarks.workloads import WORKLOADS, workload

from planner.search.bounds import lower_bound_ms
from planner.search.candidates import enumerate_options
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.types import TIERS
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "planner.json"


def memory_ok(plan, cluster) -> bool:
    return all(r.memory.of_tier(t) <= cluster.capacity_bytes_per_rank(t) for r in plan.ranks for t in TIERS)


def _torchrec_child(make_problem, queue):
    from dlrm_scale.bridge.torchrec_cost import torchrec_planner_plan

    problem = make_problem()
    try:
        plan, seconds = torchrec_planner_plan(problem)
        queue.put(("ok", plan.to_dict(), seconds))
    except Exception as e:  # reported in the results, e.g. TorchRec finding no plan
        queue.put(("error", f"{type(e).__name__}: {str(e)[:200]}", 0.0))


def run_torchrec_planner(make_problem, timeout_s):
    """TorchRec's planner on make_problem() in a forked child process, with a time limit."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_torchrec_child, args=(make_problem, queue))
    start = time.perf_counter()
    proc.start()
    proc.join(timeout_s)
    if proc.is_alive():
        proc.kill()
        proc.join()
        return None, None, f"did not finish in {timeout_s:.0f} s"
    if queue.empty():
        return None, None, f"exited with code {proc.exitcode}"
    status, payload, seconds = queue.get()
    if status != "ok":
        return None, time.perf_counter() - start, payload
    return payload, seconds, None


def bench_one(name, kind, tables, ranks, with_torchrec, time_limit_s, torchrec_timeout_s):
    from planner.plan.document import Plan
    from planner.views.scoring import rank_times_ms

    problem = workload(kind, tables, ranks)
    row = {"workload": name, "tables": len(problem.tables), "ranks": ranks, "batch_per_rank": problem.training.batch_size_per_rank}

    start = time.perf_counter()
    ours_default = make_plan(problem, config=SolverConfig(time_limit_s=time_limit_s))
    row["ours_plan_s"] = time.perf_counter() - start
    row["ours_gap_own_model"] = ours_default.gap  # the busiest rank's
    row["ours_step_gap_own_model"] = ours_default.step_gap  # the step's, which the search minimises and `plan` reports
    row["ours_memory_ok"] = memory_ok(ours_default, problem.cluster)
    if not with_torchrec:
        return row

    from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel

    tr_model = TorchRecCostModel(problem)
    start = time.perf_counter()
    options = enumerate_options(problem, tr_model)
    row["torchrec_estimates_s"] = time.perf_counter() - start
    bound = lower_bound_ms(options, problem.cluster.world_size)
    start = time.perf_counter()
    ours = make_plan(problem, tr_model, SolverConfig(time_limit_s=time_limit_s))
    row["ours_tr_plan_s"] = time.perf_counter() - start + row["torchrec_estimates_s"]
    ours_scored = float(rank_times_ms(ours, problem, tr_model).max())
    row.update(
        lower_bound_ms=bound,
        proven_bound_ms=ours.lower_bound_ms,
        ours_ms=ours_scored,
        ours_vs_bound=ours_scored / bound - 1,
        ours_vs_proven=ours_scored / ours.lower_bound_ms - 1,
        ours_solver=ours.solver,
        ours_tr_memory_ok=memory_ok(ours, problem.cluster),
    )
    doc, seconds, error = run_torchrec_planner(functools.partial(workload, kind, tables, ranks), torchrec_timeout_s)
    row["torchrec_plan_s"] = seconds
    if error:
        row["torchrec_error"] = error
    else:
        theirs = Plan.from_dict(doc)
        theirs_scored = float(rank_times_ms(theirs, problem, tr_model).max())
        row.update(torchrec_ms=theirs_scored, torchrec_vs_bound=theirs_scored / bound - 1,
                   ours_over_torchrec=ours_scored / theirs_scored)
    return row


def markdown(rows) -> str:
    """The table docs/benchmarks.md shows."""
    head = ("| workload | tables x ranks | ours vs bound | TorchRec vs bound | ours / TorchRec | ours vs proven "
            "| ours' step vs its bound (own model) | ours plan s (own model) | TorchRec plan s | memory ok |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        def pct(key):
            return f"{100 * r[key]:+.2f}%" if r.get(key) is not None else "-"
        tr = pct("torchrec_vs_bound") if "torchrec_ms" in r else r.get("torchrec_error", "not run")
        ratio = f"{r['ours_over_torchrec']:.3f}" if "ours_over_torchrec" in r else "-"
        trs = f"{r['torchrec_plan_s']:.1f}" if r.get("torchrec_plan_s") else "-"
        lines.append(
            f"| {r['workload']} | {r['tables']} x {r['ranks']} | {pct('ours_vs_bound')} | {tr} | {ratio} | "
            f"{pct('ours_vs_proven')} | {pct('ours_step_gap_own_model')} | {r['ours_plan_s']:.2f} | {trs} | "
            f"{r['ours_memory_ok'] and r.get('ours_tr_memory_ok', True)} |"
        )
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="workload names to run")
    ap.add_argument("--time-limit", type=float, default=10.0, help="our solver's time limit, s")
    ap.add_argument("--torchrec-timeout", type=float, default=300.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    rows = []
    for name, kind, tables, ranks, with_tr in WORKLOADS:
        if args.only and name not in args.only:
            continue
        row = bench_one(name, kind, tables, ranks, with_tr, args.time_limit, args.torchrec_timeout)
        print(json.dumps(row), flush=True)
        rows.append(row)
    doc = {
        "machine": {"cpus": mp.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "solver_time_limit_s": args.time_limit,
        "torchrec_timeout_s": args.torchrec_timeout,
        "results": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_result(Path(args.out), doc)
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Search benchmark: how close our plans end to their own proven bound on held-out workloads,
and how long 100-table problems take against TorchRec's planner.

- gap: on workloads no part of the planner was tuned on (MLPerf DLRM-DCNv2's 26 multi-hot
  tables on 8/16/32 ranks, 107 seeded synthetic tables on 8/16 ranks), all on TorchRec's
  default topology, searched and scored with TorchRec's own estimator (--cost-model
  torchrec); TorchRec's planner's plan scored the same way beside ours where it is run. Both
  as the busiest rank (what the bound bounds) and as the embeddings' step, each phase waiting
  for its busiest rank (the bound bounds that too).
- time: synthetic_100x8 and criteo_tb_8 of the planner benchmark (the latter a small problem,
  which TorchRec's planner plans in about a second) and the held-out 107 tables on 16 ranks, our
  planner (its own cost model, the default, as `dlrm-scale plan` runs) and TorchRec's
  EmbeddingShardingPlanner (its own estimator), runs alternated, 3 repeats, medians.

    python -m benchmarks.search_bench [--repeats 3]

Writes benchmarks/results/search.json and prints Markdown tables for the README.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time


from benchmarks.planner_bench import run_torchrec_planner
from benchmarks.workloads import held_out, workload

from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "search.json"
HELD_OUT = [  # (name, kind, ranks, seed, run TorchRec's planner too)
    ("mlperf_multihot_8", "mlperf_multihot", 8, 0, True),
    ("mlperf_multihot_16", "mlperf_multihot", 16, 0, True),
    ("mlperf_multihot_32", "mlperf_multihot", 32, 0, True),
    ("synthetic107x8_s0", "synthetic107", 8, 0, False),
    ("synthetic107x16_s0", "synthetic107", 16, 0, True),
    ("synthetic107x8_s1", "synthetic107", 8, 1, False),
    ("synthetic107x16_s1", "synthetic107", 16, 1, False),
    ("synthetic107x16_s2", "synthetic107", 16, 2, False),
]


def gap_row(name, kind, ranks, seed, with_torchrec, time_limit_s):
    from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel
    from planner.plan.document import Plan
    from planner.cost.step import rank_step_ms
    from planner.views.scoring import rank_breakdown, rank_times_ms

    problem = held_out(kind, ranks, seed)
    model = TorchRecCostModel(problem)
    start = time.perf_counter()
    plan = make_plan(problem, model, SolverConfig(time_limit_s=time_limit_s))
    seconds = time.perf_counter() - start
    ours = float(rank_times_ms(plan, problem, model).max())
    row = {"workload": name, "tables": len(problem.tables), "ranks": ranks, "ours_ms": ours, "proven_bound_ms": plan.lower_bound_ms,
           "ours_vs_proven": ours / plan.lower_bound_ms - 1, "solver": plan.solver, "ours_plan_s": seconds,
           # the embeddings' step, each phase waiting for its busiest rank (planner.search.phase_balance)
           "ours_step_vs_proven": rank_step_ms(rank_breakdown(plan, problem, model)[0]) / plan.lower_bound_ms - 1}
    if with_torchrec:
        doc, tr_seconds, error = run_torchrec_planner(functools.partial(held_out, kind, ranks, seed), 600)
        row["torchrec_plan_s"] = tr_seconds
        if error:
            row["torchrec_error"] = error
        else:
            their_plan = Plan.from_dict(doc)
            theirs = float(rank_times_ms(their_plan, problem, model).max())
            row.update(torchrec_ms=theirs, torchrec_vs_proven=theirs / plan.lower_bound_ms - 1,
                       torchrec_step_vs_proven=rank_step_ms(rank_breakdown(their_plan, problem, model)[0]) / plan.lower_bound_ms - 1)
    return row


# Planning time alone, each planner as its users run it: (name, the problem)
TIMED = [("synthetic_100x8", lambda: workload("synthetic", 100, 8)), ("criteo_tb_8", lambda: workload("criteo_terabyte", 26, 8)),
         ("synthetic107x16_s0", lambda: held_out("synthetic107", 16, 0))]


def timing(name, make_problem, repeats, time_limit_s):
    ours, theirs = [], []
    problem = make_problem()
    for _ in range(repeats):  # alternated, so both see the same machine
        start = time.perf_counter()
        make_plan(problem, config=SolverConfig(time_limit_s=time_limit_s))
        ours.append(time.perf_counter() - start)
        _, seconds, error = run_torchrec_planner(make_problem, 600)
        if error:
            raise SystemExit(f"TorchRec's planner failed on {name}: {error}")
        theirs.append(seconds)
    return {"workload": name, "ours_s": ours, "torchrec_s": theirs, "ours_median_s": statistics.median(ours),
            "torchrec_median_s": statistics.median(theirs), "ratio": statistics.median(ours) / statistics.median(theirs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.repeats < 1 or not args.time_limit > 0:
        ap.error("--repeats takes a whole number >= 1 and --time-limit a positive number of seconds")
    rows = []
    for name, kind, ranks, seed, with_torchrec in HELD_OUT:
        rows.append(gap_row(name, kind, ranks, seed, with_torchrec, args.time_limit))
        print(json.dumps(rows[-1]), flush=True)
    times = [timing(name, make_problem, args.repeats, args.time_limit) for name, make_problem in TIMED]
    for t in times:
        print(json.dumps(t), flush=True)
    write_result(args.out, {"solver_time_limit_s": args.time_limit, "held_out": rows, "timing": times})
    print("| workload | tables x ranks | ours vs proven bound | TorchRec vs our proven bound | ours' step vs bound | TorchRec's step vs bound "
          "| ours plan s | TorchRec plan s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        ran = "torchrec_ms" in r
        tr = f"{100 * r['torchrec_vs_proven']:+.2f}%" if ran else r.get("torchrec_error", "not run")
        tr_step = f"{100 * r['torchrec_step_vs_proven']:+.2f}%" if ran else "-"
        trs = f"{r['torchrec_plan_s']:.1f}" if r.get("torchrec_plan_s") else "-"
        print(f"| {r['workload']} | {r['tables']} x {r['ranks']} | {100 * r['ours_vs_proven']:+.2f}% | {tr} | {100 * r['ours_step_vs_proven']:+.2f}% "
              f"| {tr_step} | {r['ours_plan_s']:.1f} | {trs} |")
    for t in times:
        print(f"\n{t['workload']}: ours {t['ours_median_s']:.2f} s (runs {', '.join(f'{s:.2f}' for s in t['ours_s'])}), "
              f"TorchRec {t['torchrec_median_s']:.1f} s ({', '.join(f'{s:.1f}' for s in t['torchrec_s'])}); ratio {t['ratio']:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Capacity benchmark: thousands of generated planning problems (CPU and CUDA, 1-8 ranks, one
to eight tables, memory from far too little to plenty, tiering on and off, every solver path,
a quarter under a user's constraints: a rule on some tables and a memory reserve), each planned
and its plan re-checked against every tier of every rank from the shards alone, and against
every rule.

    python -m benchmarks.capacity_bench [--problems 2000] [--seed 0]

A problem ends in a plan that fits, or a one-line refusal (InfeasiblePlanError); anything
else (a plan that overfills, the planner's own last check firing, a traceback) is counted
as a violation and printed. Writes benchmarks/results/capacity.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time


from hypothesis import HealthCheck, given, seed, settings

from tests.capacity_problems import broken_rule, cases, overfilled, plan_or_refusal
from benchmarks.common import ROOT, write_result

RESULTS = ROOT / "benchmarks" / "results" / "capacity.json"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--problems", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    counts: collections.Counter = collections.Counter()
    violations: list[str] = []

    @seed(args.seed)
    @settings(max_examples=args.problems, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases())
    def run(case) -> None:
        device = case.problem.cluster.device
        try:
            outcome = plan_or_refusal(case)
        except Exception as e:  # noqa: BLE001 - any escape is what this benchmark counts
            counts[f"{device} violations"] += 1
            violations.append(f"{device}: {type(e).__name__}: {e}")
            return
        if isinstance(outcome, Exception):
            counts[f"{device} refused"] += 1
            return
        problem = overfilled(outcome, case.problem) or broken_rule(outcome, case.problem)
        counts[f"{device} {'violations' if problem else 'planned'}"] += 1
        counts[f"{device} constrained plans"] += case.problem.constraints is not None
        counts[f"{device} cached plans"] += any(t.cached for t in outcome.tables.values())
        if problem:
            violations.append(f"{device}: {problem}")

    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    total = sum(v for k, v in counts.items() if k.endswith(("planned", "refused", "violations")))
    result = {
        "problems": total,
        "counts": dict(sorted(counts.items())),
        "violations": violations,
        "seconds": round(seconds, 1),
    }
    write_result(RESULTS, result)
    print(json.dumps({k: v for k, v in result.items() if k != "violations"}, indent=1))
    for line in violations[:20]:
        print("VIOLATION", line)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())

"""Replanning with least movement on the Criteo-1TB config (the issue's two cases): a plan for
16 ranks replanned for 24, and for the same 16 ranks with 20 tables added (1M-20M rows, dim
128). Reports the front of (bytes moved, busiest rank) from `planner.replan.replan`, and the
point a budget of 10% of the model's bytes reaches, against the unconstrained plan.

    python -m benchmarks.replan_bench
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from dlrm_scale.run_config import load_problem
from planner.plan.planning import make_plan
from planner.replan.replan import replan
from planner.spec.specs import GIB, TableSpec
from benchmarks.common import RESULTS, write_result

RESULT = RESULTS / "replan.json"
CONFIG = "configs/criteo_terabyte.yaml"


def case(name: str, problem, old) -> dict:
    start = time.monotonic()
    front = replan(problem, old)
    seconds = time.monotonic() - start
    tenth = replan(problem, old, max_move_bytes=int(0.1 * front.model_bytes))
    best = min(tenth.points, key=lambda p: p.plan.max_rank_ms)
    print(f"{name}: front in {seconds:.1f} s\n{front.format()}\n  at 10%: {best.moved_bytes / GIB:.3f} GiB moved, "
          f"busiest {best.plan.max_rank_ms:.4f} ms ({best.plan.max_rank_ms / front.free.plan.max_rank_ms - 1:+.2%}); "
          f"proven floor {best.floor_ms:.4f} ms ({best.floor_ms / front.free.plan.max_rank_ms - 1:+.2%})", flush=True)
    return {"seconds": round(seconds, 2), "model_gib": front.model_bytes / GIB,
            "unconstrained_ms": front.free.plan.max_rank_ms, "unconstrained_moved_gib": front.free.moved_bytes / GIB,
            "front": [{"budget_gib": None if p.budget_bytes is None else p.budget_bytes / GIB, "moved_gib": p.moved_bytes / GIB,
                       "max_rank_ms": p.plan.max_rank_ms, "floor_ms": p.floor_ms} for p in front.points],
            "at_10_percent": {"moved_gib": best.moved_bytes / GIB, "max_rank_ms": best.plan.max_rank_ms, "floor_ms": best.floor_ms,
                              "vs_unconstrained": best.plan.max_rank_ms / front.free.plan.max_rank_ms}}


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    p16 = load_problem(CONFIG, cluster_overrides={"world_size": 16})
    old = make_plan(p16)
    extra = tuple(TableSpec(f"new_{i}", 1_000_000 * (i + 1), 128, 1.0) for i in range(20))
    out = {"config": CONFIG, "old_plan": {"world_size": 16, "max_rank_ms": old.max_rank_ms},
           "16_to_24_ranks": case("16 -> 24 ranks", load_problem(CONFIG, cluster_overrides={"world_size": 24}), old),
           "plus_20_tables": case("+20 tables", replace(p16, tables=p16.tables + extra), old)}
    write_result(RESULT, out)
    print(f"wrote {RESULT}")


if __name__ == "__main__":
    main()

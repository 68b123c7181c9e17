"""Scale-out what-ifs on a ZionEX-like cluster (nodes of 8 A100, NVLink inside, 200 Gb/s RDMA
per GPU) for a trillion-parameter-class model: how the busiest rank's step time and memory
per rank move with the number of ranks (8 to 1,024) and the communication precision.

The model: 8 tables of 10^9 rows and 400 more with log-normal rows (median 2M, capped at
2*10^8), dims 64..256, pooling factors 1..50, Zipf-skewed ids (exponents 0.9..1.2) -- about
1.3 trillion parameters, too large for HBM below a few hundred ranks: there the planner keeps
the largest tables' rows in DDR or on SSD behind HBM caches, and says how many.

    python -m benchmarks.whatif_bench

Writes benchmarks/results/whatif.json and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np


from dlrm_scale.run_config import load_problem
from planner.spec.errors import InfeasiblePlanError
from planner.plan.planning import make_plan
from planner.search.solver import SolverConfig
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec, TrainingSpec
from benchmarks.common import ROOT, write_result

GLOBAL_BATCH = 65_536
WORLD_SIZES = (8, 64, 128, 256, 512, 1024)
PRECISIONS = (("fp32", "fp32"), ("fp16", "bf16"), ("int8", "int8"))


def trillion_tables(seed: int = 0) -> list[TableSpec]:
    rng = np.random.default_rng(seed)
    tables = [TableSpec(f"huge{i}", 1_000_000_000, 128, float(rng.integers(1, 20)), 1.05) for i in range(8)]
    rows = np.clip(rng.lognormal(np.log(2e6), 1.5, 400), 1000, 2e8).astype(int)
    dims = rng.choice([64, 128, 256], 400)
    pooling = rng.integers(1, 51, 400)
    skew = np.round(rng.uniform(0.9, 1.2, 400), 2)
    tables += [TableSpec(f"t{i}", int(r), int(d), float(p), float(z)) for i, (r, d, p, z) in enumerate(zip(rows, dims, pooling, skew))]
    return tables


def main() -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    tables = trillion_tables()
    params = sum(t.num_parameters for t in tables)
    rows = []
    for world in WORLD_SIZES:
        base = load_problem("configs/tiny.yaml", hardware="a100_zionex", cluster_overrides={"world_size": world},
                            training_overrides={"batch_size_per_rank": GLOBAL_BATCH // world})
        for fwd, bwd in PRECISIONS:
            problem = PlanningProblem(tuple(tables), base.cluster, TrainingSpec(GLOBAL_BATCH // world, "rowwise_adagrad", fwd, bwd))
            row = {"ranks": world, "precision": f"{fwd}/{bwd}"}
            start = time.perf_counter()
            try:
                plan = make_plan(problem, config=SolverConfig(time_limit_s=10))
            except InfeasiblePlanError as e:
                row["infeasible"] = str(e)
            else:
                perf = max(plan.ranks, key=lambda r: r.predicted_ms).perf
                row.update(
                    max_rank_ms=plan.max_rank_ms, gap=plan.gap, compute_ms=perf.compute_ms, comms_ms=perf.comms_ms,
                    max_hbm_gib=max(r.memory.hbm_bytes for r in plan.ranks) / 2**30,
                    cached_tables={k: sum(1 for t in plan.tables.values() if t.compute_kernel == k) for k in ("fused_uvm_caching", "key_value")},
                    samples_per_s=GLOBAL_BATCH / plan.max_rank_ms * 1e3,
                    schemes={s: sum(1 for t in plan.tables.values() if t.sharding_type == s) for s in {t.sharding_type for t in plan.tables.values()}},
                )
            row["plan_s"] = time.perf_counter() - start
            rows.append(row)
            print(json.dumps(row)[:400], flush=True)
    out = ROOT / "benchmarks" / "results" / "whatif.json"
    write_result(out, {"parameters": params, "global_batch": GLOBAL_BATCH, "results": rows})
    print(f"model: {len(tables)} tables, {params / 1e12:.2f} trillion parameters, global batch {GLOBAL_BATCH}")
    print("| ranks | comms | busiest rank ms | of which comms | max HBM GiB/rank | cached tables (DDR / SSD) | embedding-bound samples/s | plan s |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "infeasible" in r:
            print(f"| {r['ranks']} | {r['precision']} | infeasible: {r['infeasible'][:90]}... | | | | | {r['plan_s']:.1f} |")
        else:
            cached = r["cached_tables"]
            print(f"| {r['ranks']} | {r['precision']} | {r['max_rank_ms']:.2f} | {r['comms_ms']:.2f} | {r['max_hbm_gib']:.1f} | "
                  f"{cached['fused_uvm_caching']} / {cached['key_value']} | {r['samples_per_s']:,.0f} | {r['plan_s']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

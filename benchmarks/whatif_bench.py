"""Scale-out what-ifs on a ZionEX-like cluster (nodes of 8 A100, NVLink inside, 200 Gb/s RDMA
per GPU).

Part "1d": a trillion-parameter-class model: how the busiest rank's step time and memory
per rank move with the number of ranks (8 to 1,024) and the communication precision.

The model: 8 tables of 10^9 rows and 400 more with log-normal rows (median 2M, capped at
2*10^8), dims 64..256, pooling factors 1..50, Zipf-skewed ids (exponents 0.9..1.2) -- about
1.3 trillion parameters, too large for HBM below a few hundred ranks: there the planner keeps
the largest tables' rows in DDR or on SSD behind HBM caches, and says how many.

Part "2d": Criteo-1TB- and DCNv2-sized models (MLPerf DLRM's 26 tables; MLPerf DLRM-DCNv2's 26
multi-hot tables) at 512, 1,024 and 4,096 ranks, 512 samples a rank: the best 1D plan against
the best 2D plan (planner/plan/replication.py: tables sharded over groups of G ranks, replicas
averaged every 10 steps), for a per-peer collective latency of 0, 1 and 5 us (the profile's
collective_peer_us is not measured: the what-if says at which latency 2D pays).

    python -m benchmarks.whatif_bench [--part 1d|2d]

Writes benchmarks/results/whatif.json (1d) or whatif_2d.json (2d) and prints a Markdown table.
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
from planner.plan.replication import group_sizes, plan_replicated, predicted_step_ms, sync_bytes_per_rank
from planner.views.comm_volume import embedding_comm_bytes
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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("1d", "2d"), default="1d")
    return two_d() if ap.parse_args().part == "2d" else one_d()


def one_d() -> int:
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


TWO_D_WORLDS = (512, 1024, 4096)
TWO_D_BATCH_PER_RANK = 512
PEER_US = (0.0, 1.0, 5.0)
SYNC_EVERY = 10
PLAN_SECONDS = 10.0


def two_d_models() -> dict[str, tuple[TableSpec, ...]]:
    from benchmarks.workloads import MLPERF_MULTIHOT_ROWS, MLPERF_MULTIHOT_SIZES

    criteo = load_problem("configs/criteo_terabyte.yaml").tables
    dcnv2 = tuple(TableSpec(f"cat_{i}", rows, 128, float(hot)) for i, (rows, hot) in enumerate(zip(MLPERF_MULTIHOT_ROWS, MLPERF_MULTIHOT_SIZES)))
    return {"criteo_1tb": criteo, "dcnv2": dcnv2}


def plan_summary(plan, problem: PlanningProblem) -> dict:
    """What a plan costs a rank: its predicted step (the sync's share included), memory, and bytes
    sent a step (the embeddings' collectives, and the sync's share)."""
    t = problem.training
    sent = float(embedding_comm_bytes(plan, t.batch_size_per_rank, t.fwd_comm_precision, t.bwd_comm_precision).total.max())
    memory = max(r.memory.hbm_bytes + r.memory.ddr_bytes for r in plan.ranks)
    rep = plan.replication
    row = {"step_ms": predicted_step_ms(plan), "embedding_step_ms": plan.step[0], "memory_gib_per_rank": memory / 2**30,
           "a2a_mb_per_step": sent / 1e6, "group_size": plan.world_size}
    if rep is not None:
        share = (rep.replicas - 1) / rep.replicas  # of its buffer a rank sends in a ring all-gather (twice that in an all-reduce)
        exchanged = max(sync_bytes_per_rank(plan, problem.tables, t.batch_size_per_rank, t.embedding_optimizer,
                                            rep.replicas, rep.sync_every_steps), key=lambda b: b.per_step(rep.sync_every_steps))
        sent = share * exchanged.gathered + 2 * share * (exchanged.shared + exchanged.synced / rep.sync_every_steps)
        row.update(sync_ms=rep.sync_ms, shared_ms=rep.shared_ms, sync_ms_per_step=rep.sync_ms_per_step, sync_mb_per_step=sent / 1e6)
    return row


def two_d() -> int:
    rows = []
    for model, tables in two_d_models().items():
        for world in TWO_D_WORLDS:
            base = load_problem("configs/tiny.yaml", hardware="a100_zionex", cluster_overrides={"world_size": world})
            for peer in PEER_US:
                problem = PlanningProblem(tuple(tables), base.cluster.with_costs(collective_peer_us=peer),
                                          TrainingSpec(TWO_D_BATCH_PER_RANK, "rowwise_adagrad"))
                row = {"model": model, "ranks": world, "peer_us": peer}
                start = time.perf_counter()
                one = make_plan(problem, config=SolverConfig(time_limit_s=PLAN_SECONDS))
                smaller = [g for g in group_sizes(problem.cluster) if g < world]
                two = plan_replicated(problem, SYNC_EVERY, smaller, SolverConfig(time_limit_s=PLAN_SECONDS))
                row["plan_s"] = time.perf_counter() - start
                row["1d"], row["2d"] = plan_summary(one, problem), plan_summary(two, problem)
                row["picked"] = "2d" if row["2d"]["step_ms"] < row["1d"]["step_ms"] else "1d"
                rows.append(row)
                print(json.dumps(row)[:300], flush=True)
    out = ROOT / "benchmarks" / "results" / "whatif_2d.json"
    write_result(out, {"batch_per_rank": TWO_D_BATCH_PER_RANK, "sync_every_steps": SYNC_EVERY, "hardware": "a100_zionex",
                       "plan_seconds": PLAN_SECONDS, "results": rows})
    print("| model | ranks | peer us | 1D step ms | 2D: G | 2D step ms (sync/step) | memory GiB/rank 1D / 2D | a2a MB/step 1D / 2D (+sync) | picked |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["1d"], r["2d"]
        print(f"| {r['model']} | {r['ranks']} | {r['peer_us']:g} | {a['step_ms']:.3f} | {b['group_size']} | {b['step_ms']:.3f} "
              f"({b.get('sync_ms_per_step', 0):.3f}) | {a['memory_gib_per_rank']:.1f} / {b['memory_gib_per_rank']:.1f} | "
              f"{a['a2a_mb_per_step']:.2f} / {b['a2a_mb_per_step']:.2f} (+{b.get('sync_mb_per_step', 0):.1f}) | {r['picked']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

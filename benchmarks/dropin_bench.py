"""Drop-in benchmark: planning through TorchRec's interface (`dlrm_scale.EmbeddingShardingPlanner`
on a meta-device EmbeddingBagCollection, TorchRec's Topology and ParameterConstraints, its stock
sharder) against `dlrm-scale plan` on a config of the same tables and cluster, on the search
benchmark's held-out workloads (MLPerf DLRM-DCNv2's multi-hot tables, seeded synthetic tables;
TorchRec's default topology: 32 GiB of HBM a GPU, 8 a host), priced with the a100_zionex profile.

For each workload, runs alternated, --repeats each: the seconds each takes (the drop-in from the
module to TorchRec's ShardingPlan; the CLI's path from the config file to the plan), and whether
the two plans' busiest ranks agree.

    python -m benchmarks.dropin_bench [--repeats 3] [--only NAME ...]

Writes benchmarks/results/dropin.json and prints a Markdown table for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.common import ROOT, write_result
from benchmarks.search_bench import HELD_OUT
from benchmarks.workloads import held_out

RESULTS = ROOT / "benchmarks" / "results" / "dropin.json"
HARDWARE = "a100_zionex"
GIB = 1024**3


def cli_config(problem) -> dict:
    """The config a `dlrm-scale plan` user writes for the workload: its tables, TorchRec's default
    topology's shape and capacities, the profile."""
    cluster = problem.cluster
    return {
        "hardware": HARDWARE,
        "cluster": {"device": "cuda", "world_size": cluster.world_size, "ranks_per_node": cluster.ranks_per_node,
                    "hbm_gib_per_rank": cluster.hbm_bytes_per_rank / GIB, "ddr_gib_per_node": cluster.ddr_bytes_per_node / GIB,
                    "ssd_gib_per_node": cluster.ssd_bytes_per_node / GIB},
        "training": {"batch_size_per_rank": problem.training.batch_size_per_rank},
        "tables": [{"name": t.name, "num_embeddings": t.num_embeddings, "embedding_dim": t.embedding_dim,
                    "pooling_factor": t.pooling_factor} for t in problem.tables],
    }


def run_cli(config_path: Path, time_limit_s: float):
    from planner import SolverConfig, load_problem, make_plan

    start = time.perf_counter()
    plan = make_plan(load_problem(config_path), config=SolverConfig(time_limit_s=time_limit_s))
    return plan, time.perf_counter() - start


def run_dropin(problem, time_limit_s: float):
    """As a TorchRec user's script: its module, Topology, constraints and stock sharder."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology

    from dlrm_scale import EmbeddingShardingPlanner
    from dlrm_scale.bridge.torchrec_cost import meta_collection

    module = meta_collection(problem.tables)
    topology = Topology(world_size=problem.cluster.world_size, compute_device="cuda", local_world_size=problem.cluster.ranks_per_node)
    constraints = {t.name: ParameterConstraints(pooling_factors=[t.pooling_factor]) for t in problem.tables}
    start = time.perf_counter()
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=problem.training.batch_size_per_rank, constraints=constraints,
                                       hardware=HARDWARE, time_limit_s=time_limit_s)
    planner.plan(module, [EmbeddingBagCollectionSharder()])
    return planner.last_plan, time.perf_counter() - start


def busiest(plan) -> tuple[int, float]:
    rank = max(plan.ranks, key=lambda r: r.predicted_ms)
    return rank.rank, rank.predicted_ms


def row(name, kind, ranks, seed, repeats, time_limit_s, folder: Path) -> dict:
    problem = held_out(kind, ranks, seed)
    config = folder / f"{name}.yaml"
    config.write_text(yaml.safe_dump(cli_config(problem), sort_keys=False))
    cli_s, dropin_s, agree = [], [], []
    for _ in range(repeats):  # alternated, so both see the same machine
        cli_plan, seconds = run_cli(config, time_limit_s)
        cli_s.append(seconds)
        dropin_plan, seconds = run_dropin(problem, time_limit_s)
        dropin_s.append(seconds)
        agree.append(busiest(cli_plan) == busiest(dropin_plan))
    return {"workload": name, "tables": len(problem.tables), "ranks": ranks, "cli_s": cli_s, "dropin_s": dropin_s,
            "cli_median_s": statistics.median(cli_s), "dropin_median_s": statistics.median(dropin_s),
            "time_ratio": statistics.median(dropin_s) / statistics.median(cli_s),
            "busiest_rank_cli": list(busiest(cli_plan)), "busiest_rank_dropin": list(busiest(dropin_plan)),
            "same_busiest_rank_every_run": all(agree), "same_tables_last_run": cli_plan.tables == dropin_plan.tables}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--only", nargs="*", choices=[w[0] for w in HELD_OUT], help="these workloads only")
    ap.add_argument("--out", default=str(RESULTS))
    args = ap.parse_args()
    if args.repeats < 1 or not args.time_limit > 0:
        ap.error("--repeats takes a whole number >= 1 and --time-limit a positive number of seconds")
    rows = []
    with tempfile.TemporaryDirectory() as d:
        for name, kind, ranks, seed, _ in HELD_OUT:
            if args.only and name not in args.only:
                continue
            rows.append(row(name, kind, ranks, seed, args.repeats, args.time_limit, Path(d)))
            print(json.dumps(rows[-1]), flush=True)
    write_result(args.out, {"hardware": HARDWARE, "solver_time_limit_s": args.time_limit, "repeats": args.repeats, "workloads": rows})
    print("| workload | tables x ranks | `dlrm-scale plan` s | drop-in s | drop-in / CLI | busiest rank (CLI / drop-in) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        spread = lambda xs: f"{min(xs):.2f}-{max(xs):.2f}"  # noqa: E731
        cli_rank, dropin_rank = r["busiest_rank_cli"], r["busiest_rank_dropin"]
        print(f"| {r['workload']} | {r['tables']} x {r['ranks']} | {r['cli_median_s']:.2f} ({spread(r['cli_s'])}) "
              f"| {r['dropin_median_s']:.2f} ({spread(r['dropin_s'])}) | {r['time_ratio']:.3f} "
              f"| {cli_rank[0]}: {cli_rank[1]:.3f} ms / {dropin_rank[0]}: {dropin_rank[1]:.3f} ms"
              f"{'' if r['same_busiest_rank_every_run'] else ' (differ)'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

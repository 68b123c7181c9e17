"""A rank's embedding work timed in one process, as the trainer runs it, against the cost model.

The cost model prices a rank's embeddings as the sum of its tables' costs (a cost per table,
per id looked up and per byte of the distinct rows a step touches). Two all-table-wise plans
of a mix differ only in which rank holds which table, so what decides between them is how
well those sums follow a rank's measured time. Here, on this machine:
- groups: for each cost-model-benchmark mix, `--groups` random subsets of its tables (a
  quarter to three quarters of them, what a rank of two holds), each built as one FBGEMM
  table-batched module (TorchRec puts a rank's tables of one kernel in one), trained forward
  and backward with the fused row-wise Adagrad on the global batch's ids (the benchmark's
  batch on each of its 2 ranks), drawn by the training data itself; the median of its timed
  calls (`TIMED` after `WARMUP`, cycling `DATA_STEPS` steps drawn beforehand, once per mix);
- the model's form refitted to the groups (least squares on relative error, one constant per
  term), scored on each mix with the fit of all the others, beside the profile's own
  prediction (the cpu_epyc_zen4 profile, the planner's);
- plans: for each of `--plans`' mixes, the ranks of its all-table-wise plans (ours, TorchRec's
  planner's, all table-wise) timed the same way, rounds alternated, beside the prediction.

    python -m benchmarks.embedding_groups [--mixes 0,...,11] [--groups 12] [--plans 11] [--rounds 60] [--out JSON]

Writes --out (default benchmarks/results/embedding_groups.json) and prints Markdown tables.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np


from benchmarks.costmodel_bench import BATCH_SIZE_PER_RANK, RESULTS, TABLE_COUNTS, WORLD, generate_mix, plan_for, write_config
from benchmarks.regret_paired import rotated
from benchmarks.common import write_result

FITTED = "cpu_epyc_zen4"
WARMUP, TIMED, DATA_STEPS = 16, 24, 8
PLANS = ("ours", "torchrec", "table_wise")


def problem_of(index: int, folder: Path):
    from dlrm_scale.run_config import Overrides, load_run_config

    config = folder / f"mix{index}.yaml"
    write_config(config, generate_mix(index), str(FITTED))
    return load_run_config(config, Overrides(world_size=WORLD, ranks_per_node=WORLD, device="cpu")).problem


class Tables:
    """One mix's tables: DATA_STEPS steps of the global batch's ids, drawn once by the training
    data itself (dlrm_scale.training.data.SyntheticData), and per table the model's terms and
    the profile's forward-and-backward ms as a table-wise shard (the planner's own pricing)."""

    def __init__(self, problem, seed: int) -> None:
        from dlrm_scale.training.data import SyntheticData, feature_name
        from planner.cost.cost_model import WEIGHT_BYTES, AnalyticCostModel, distinct_rows_per_step
        from planner.plan.document import uniform_plan
        from planner.views.scoring import costed_options
        from planner.spec.types import ShardingType

        self.specs = {t.name: t for t in problem.tables}
        batch = problem.training.batch_size_per_rank * WORLD
        data = SyntheticData(problem.tables, 1, batch, seed)
        self.steps = []  # [step] table -> (bag lengths, ids)
        for step in range(DATA_STEPS):
            kjt = data.batch(step).sparse_features
            self.steps.append({n: (kjt[feature_name(n)].lengths().numpy().astype(np.int64), kjt[feature_name(n)].values().numpy())
                               for n in self.specs})
        self.terms = {}
        for t in problem.tables:
            ids = batch * t.pooling_factor
            self.terms[t.name] = (1.0, ids, distinct_rows_per_step(t, ids) * t.embedding_dim * WEIGHT_BYTES)
        model = AnalyticCostModel(problem.cluster, problem.training)
        self.predicted_ms = {name: option.shards[0].perf.compute_ms
                             for name, option in costed_options(uniform_plan(problem, ShardingType.TABLE_WISE), problem, model)}

    def module(self, names: list[str]):
        from fbgemm_gpu.split_embedding_configs import EmbOptimType
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
            ComputeDevice,
            EmbeddingLocation,
            SplitTableBatchedEmbeddingBagsCodegen,
        )

        return SplitTableBatchedEmbeddingBagsCodegen(
            [(self.specs[n].num_embeddings, self.specs[n].embedding_dim, EmbeddingLocation.HOST, ComputeDevice.CPU) for n in names],
            optimizer=EmbOptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.01)

    def batches(self, names: list[str]) -> list:
        """Each step's (ids, offsets) for a module of `names`: their bags one table after another."""
        import torch

        out = []
        for step in self.steps:
            offsets = np.concatenate([[0], np.cumsum(np.concatenate([step[n][0] for n in names]))])
            ids = np.concatenate([step[n][1] for n in names]).astype(np.int64)
            out.append((torch.from_numpy(ids), torch.from_numpy(offsets.astype(np.int64))))
        return out


def step_ms(module, batch) -> float:
    import torch

    start = time.perf_counter()
    pooled = module(*batch)
    pooled.backward(torch.ones_like(pooled))
    return (time.perf_counter() - start) * 1e3


def time_group(tables: Tables, names: list[str]) -> float:
    module, batches = tables.module(names), tables.batches(names)
    times = [step_ms(module, batches[i % DATA_STEPS]) for i in range(WARMUP + TIMED)]
    return float(np.median(times[WARMUP:]))


def groups(mixes: list[int], per_mix: int, folder: Path) -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for index in mixes:
        tables = Tables(problem_of(index, folder), seed=index)
        names = list(tables.specs)
        for _ in range(per_mix):
            k = int(rng.integers(max(1, len(names) // 4), max(2, 3 * len(names) // 4) + 1))
            chosen = sorted(rng.choice(names, size=k, replace=False).tolist(), key=names.index)
            out.append({"mix": index, "tables": chosen, "measured_ms": time_group(tables, chosen),
                        "predicted_ms": sum(tables.predicted_ms[n] for n in chosen),
                        "terms": np.sum([tables.terms[n] for n in chosen], axis=0).tolist()})
            print(f"mix{index} group of {k}: {out[-1]['measured_ms']:.2f} ms (profile {out[-1]['predicted_ms']:.2f})", flush=True)
    return out


def fit(rows: list[dict]) -> np.ndarray:
    a, y = np.array([r["terms"] for r in rows]), np.array([r["measured_ms"] for r in rows])
    return np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)[0]


def score(rows: list[dict]) -> dict:
    """The form refitted on all mixes but one, scored on that one; the profile as it is."""
    held_out = []
    for index in sorted({r["mix"] for r in rows}):
        x = fit([r for r in rows if r["mix"] != index])
        held_out += [abs(float(np.dot(r["terms"], x)) / r["measured_ms"] - 1) for r in rows if r["mix"] == index]
    profile = [abs(r["predicted_ms"] / r["measured_ms"] - 1) for r in rows]
    whole = fit(rows)
    return {"groups": len(rows), "refit_held_out_mix": {"median": float(np.median(held_out)), "p90": float(np.percentile(held_out, 90)),
                                                        "max": float(np.max(held_out))},
            "profile": {"median": float(np.median(profile)), "p90": float(np.percentile(profile, 90))},
            "refit_all": {"per_table_ms": float(whole[0]), "per_id_ns": float(whole[1] * 1e6), "per_distinct_byte_ns": float(whole[2] * 1e6)}}


def plan_ranks(index: int, rounds: int, folder: Path) -> list[dict]:
    problem = problem_of(index, folder)
    tables = Tables(problem, seed=100 + index)
    sets = {}
    for label in PLANS:
        plan = plan_for(problem, label)
        if {t.sharding_type for t in plan.tables.values()} != {"table_wise"}:
            continue
        for rank in range(WORLD):
            sets[(label, rank)] = [n for n in tables.specs if plan.tables[n].shards[0].rank == rank]
    built = {key: (tables.module(names), tables.batches(names)) for key, names in sets.items()}
    times = {key: [] for key in sets}
    keys = list(sets)
    for r in range(rounds):  # each round every rank set once, the order rotating
        for key in rotated(keys, r):
            module, batches = built[key]
            times[key].append(step_ms(module, batches[r % DATA_STEPS]))
    return [{"mix": index, "plan": label, "rank": rank, "tables": len(sets[(label, rank)]),
             "measured_ms": float(np.median(times[(label, rank)][WARMUP:])),
             "spread_ms": [float(np.percentile(times[(label, rank)][WARMUP:], q)) for q in (10, 90)],
             "predicted_ms": sum(tables.predicted_ms[n] for n in sets[(label, rank)])} for label, rank in keys]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mixes", default=",".join(str(i) for i in range(len(TABLE_COUNTS))))
    ap.add_argument("--groups", type=int, default=12, help="random groups of each mix's tables")
    ap.add_argument("--plans", default="11", help="mixes whose all-table-wise plans' ranks are timed ('' for none)")
    ap.add_argument("--rounds", type=int, default=60, help="rounds over the plans' rank sets (the first WARMUP left out)")
    ap.add_argument("--out", type=Path, default=RESULTS / "embedding_groups.json")
    args = ap.parse_args()
    try:
        mixes = [int(m) for m in args.mixes.split(",") if m]
        plan_mixes = [int(m) for m in args.plans.split(",") if m]
    except ValueError:
        ap.error("--mixes and --plans take comma-separated mix numbers, e.g. 1,3,11")
    if any(not 0 <= m < len(TABLE_COUNTS) for m in mixes + plan_mixes) or len(set(mixes)) < 2 or args.groups < 2 or args.rounds <= WARMUP:
        ap.error(f"mixes are 0-{len(TABLE_COUNTS) - 1} (at least two in --mixes), --groups at least 2, --rounds over {WARMUP}")
    if not args.out.parent.is_dir():
        ap.error(f"{args.out.parent}: no such folder for --out")
    import torch

    torch.set_num_threads(1)  # as each rank of the 2-rank jobs on this 2-core machine
    with tempfile.TemporaryDirectory() as tmp:
        rows = groups(mixes, args.groups, Path(tmp))
        ranks = [r for index in plan_mixes for r in plan_ranks(index, args.rounds, Path(tmp))]
    result = score(rows)
    write_result(args.out, {"batch": BATCH_SIZE_PER_RANK * WORLD, **result, "plan_ranks": ranks, "group_runs": rows})
    h, p = result["refit_held_out_mix"], result["profile"]
    print(f"\n{result['groups']} groups: the model's form refitted without each group's mix, |error| median {100 * h['median']:.1f}%, "
          f"p90 {100 * h['p90']:.1f}%, max {100 * h['max']:.1f}%; the profile as it is: median {100 * p['median']:.1f}%, p90 {100 * p['p90']:.1f}%")
    if ranks:
        print("\n| mix | plan | rank | tables | measured ms (p10-p90) | predicted ms |\n|---|---|---|---|---|---|")
        for r in ranks:
            print(f"| mix{r['mix']} | {r['plan']} | {r['rank']} | {r['tables']} | {r['measured_ms']:.2f} ({r['spread_ms'][0]:.2f}-{r['spread_ms'][1]:.2f}) "
                  f"| {r['predicted_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Planner benchmark workloads: Criteo configs and seeded synthetic table sets."""

from __future__ import annotations

import numpy as np

from dlrm_scale.run_config import load_problem
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec, TrainingSpec

GLOBAL_BATCH = 65_536


def synthetic_tables(num_tables: int, seed: int) -> list[TableSpec]:
    """Log-normal rows (median ~440k, capped at 20M), dims 16..256, pooling factors 1..100."""
    rng = np.random.default_rng(seed)
    rows = np.clip(rng.lognormal(13.0, 2.0, num_tables), 100, 20_000_000).astype(int)
    dims = rng.choice([16, 32, 64, 128, 256], num_tables)
    pooling = np.round(np.exp(rng.uniform(0, np.log(100), num_tables)), 1)
    return [TableSpec(f"t{i}", int(r), int(d), float(p)) for i, (r, d, p) in enumerate(zip(rows, dims, pooling))]


def workload(kind: str, num_tables: int, world_size: int, seed: int = 0) -> PlanningProblem:
    batch = max(64, GLOBAL_BATCH // world_size)
    cluster = {"world_size": world_size}
    training = {"batch_size_per_rank": batch}
    if kind in ("criteo_terabyte", "criteo_kaggle"):
        return load_problem(f"configs/{kind}.yaml", cluster_overrides=cluster, training_overrides=training)
    base = load_problem("configs/tiny.yaml", hardware="a100_zionex", cluster_overrides=cluster, training_overrides=training)
    return PlanningProblem(tuple(synthetic_tables(num_tables, seed)), base.cluster, TrainingSpec(batch))


WORKLOADS = [
    # (name, kind, tables, ranks, run TorchRec's planner and estimator on it)
    ("criteo_kaggle_8", "criteo_kaggle", 26, 8, True),
    ("criteo_tb_8", "criteo_terabyte", 26, 8, True),
    ("criteo_tb_16", "criteo_terabyte", 26, 16, True),
    ("criteo_tb_64", "criteo_terabyte", 26, 64, True),
    ("synthetic_100x8", "synthetic", 100, 8, True),
    ("synthetic_200x64", "synthetic", 200, 64, True),
    ("synthetic_500x128", "synthetic", 500, 128, True),
    ("synthetic_1000x128", "synthetic", 1000, 128, True),
    ("synthetic_2000x1024", "synthetic", 2000, 1024, False),
]


# MLPerf Training DLRM-DCNv2 (Criteo 1TB multi-hot): rows per table, capped at 40M, and the
# multi-hot sizes the reference's synthetic multi-hot data draws per sample; dim 128.
MLPERF_MULTIHOT_ROWS = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209,
                        11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]
MLPERF_MULTIHOT_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


def held_out(kind: str, world_size: int, seed: int = 0) -> PlanningProblem:
    """Workloads no part of the planner was tuned on, on TorchRec's default topology:
    "mlperf_multihot" (the 26 tables above) or "synthetic107" (107 seeded tables)."""
    from dlrm_scale.bridge.torchrec_cost import torchrec_default_cluster

    if kind == "mlperf_multihot":
        tables = tuple(TableSpec(f"cat_{i}", rows, 128, float(hot))
                       for i, (rows, hot) in enumerate(zip(MLPERF_MULTIHOT_ROWS, MLPERF_MULTIHOT_SIZES)))
    else:
        tables = tuple(synthetic_tables(107, seed))
    return PlanningProblem(tables, torchrec_default_cluster(world_size), TrainingSpec(GLOBAL_BATCH // world_size))

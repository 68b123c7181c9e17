"""The plan never changes the model: under every scheme, a cached tier and 2 or 4 ranks, the
same config and seed give the same initial tables, the same batches and the same losses as
all-table-wise on 2 ranks. Real gloo processes. (Schemes that split columns keep row-wise
Adagrad's state per column block, FBGEMM's layout, so the grid's losses are not compared: they
are checked against an unsharded model in test_training_distributed.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import run_on_ranks
from planner.plan.document import Plan, table_layout
from planner.spec.specs import ClusterSpec, CostConstants, TableSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingType

pytestmark = pytest.mark.distributed

TW, RW, TWRW, DP = ShardingType.TABLE_WISE, ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.DATA_PARALLEL
GRID = ShardingType.GRID_SHARD
TABLES = (TableSpec("a", 3000, 16, 4.0, zipf_exponent=1.05), TableSpec("b", 800, 16, 2.0, zipf_exponent=1.05),
          TableSpec("c", 300, 16, 1.0), TableSpec("d", 50, 16, 1.0))
GLOBAL_BATCH = 256
STEPS = 6
SEED = 7

# plan name -> (world size, ranks per node, per table: scheme, ranks, tier, cache load factor)
PLANS = {
    "table_wise@2": (2, 2, [(TW, [0], "ddr", None), (TW, [1], "ddr", None), (TW, [1], "ddr", None), (TW, [0], "ddr", None)]),
    "mixed@2": (2, 2, [(RW, [0, 1], "ddr", None), (TWRW, [0, 1], "ddr", None), (DP, [0, 1], "ddr", None), (TW, [1], "ddr", None)]),
    "cached@2": (2, 2, [(TW, [1], "ssd", 0.3), (TW, [0], "ddr", 0.5), (TW, [0], "ddr", None), (TW, [1], "ddr", None)]),
    "mixed@4": (4, 4, [(RW, [0, 1, 2, 3], "ddr", None), (TW, [2], "ddr", None), (DP, [0, 1, 2, 3], "ddr", None),
                       (TWRW, [0, 1, 2, 3], "ddr", None)]),
    "grid@2x2": (4, 2, [(GRID, [2, 3, 0, 1], "ddr", None), (TWRW, [2, 3], "ddr", None), (TW, [0], "ddr", None),
                        (DP, [0, 1, 2, 3], "ddr", None)]),
}
COLUMN_SPLIT = {"grid@2x2"}  # row-wise Adagrad's state per column block: other losses


def problem(world: int, local: int | None = None) -> PlanningProblem:
    local = local or world
    cluster = ClusterSpec(world // local, local, "cpu", 0, 8 * 1024**3, 8 * 1024**3, CostConstants(1.0, 4.0, 0.5, 1.0, 1.0))
    return PlanningProblem(TABLES, cluster, TrainingSpec(GLOBAL_BATCH // world, "rowwise_adagrad"))


def plan_of(name: str) -> Plan:
    world, local, layout = PLANS[name]
    tables = {t.name: table_layout(t, scheme, ranks, tier, lf, local) for t, (scheme, ranks, tier, lf) in zip(TABLES, layout)}
    return Plan(world, local, tables, (), 0.0, 0.0)


def _train(rank, world, out_dir, plan_name):
    from dlrm_scale.run_config import ModelConfig, TrainConfig
    from dlrm_scale.training.state import full_tables
    from dlrm_scale.training.trainer import Trainer
    from tests.conftest import run_config

    out = Path(out_dir)
    store = out / f"store{rank}"
    store.mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig(steps=STEPS, embedding_lr=0.05, dense_lr=0.05, log_every=1,
                      eval_batches=2, seed=SEED, deterministic=True, store_dir=str(store),
                      cpu_embeddings="dlrm_scale", interaction="dlrm_scale")
    model = ModelConfig(num_dense_features=13, dense_arch=(32, 16), over_arch=(32, 1))
    plan = plan_of(plan_name)
    trainer = Trainer(run_config(problem(world, plan.ranks_per_node), model, cfg, GLOBAL_BATCH // world), plan, torch.device("cpu"), rank,
                      world, out)
    initial = full_tables(trainer.model, tiered=trainer.tiered)
    trainer.run()
    return {"initial": initial}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = {}
    for name, (world, local, _) in PLANS.items():
        d = tmp_path_factory.mktemp(name.replace("@", "_"))
        result = run_on_ranks(_train, world, str(d), name, ranks_per_node=local)
        metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        result["losses"] = [m["loss"] for m in metrics if "loss" in m]
        result["auc"] = [m["auc"] for m in metrics if "auc" in m][-1]
        out[name] = result
    return out


def test_initial_tables_are_a_function_of_seed_table_and_row_only(runs):
    from dlrm_scale.training.initial_weights import initial_rows

    for name, result in runs.items():
        for t in TABLES:
            want = initial_rows(SEED, t.name, t.num_embeddings, t.embedding_dim, 0, t.num_embeddings)
            assert torch.equal(result["initial"][t.name], want), (name, t.name)


@pytest.mark.parametrize("name", [n for n in PLANS if n != "table_wise@2" and n not in COLUMN_SPLIT])
def test_losses_and_auc_match_all_table_wise_on_two_ranks(runs, name):
    anchor, other = runs["table_wise@2"], runs[name]
    assert len(other["losses"]) == len(anchor["losses"]) == STEPS
    assert other["losses"] == pytest.approx(anchor["losses"], rel=1e-5)
    assert other["auc"] == pytest.approx(anchor["auc"], abs=1e-4)


def test_a_cached_tier_trains_bitwise_like_memory(runs):
    """Same shards, same summation order: a cache in front of a table changes nothing."""
    assert runs["cached@2"]["losses"] == runs["table_wise@2"]["losses"]

"""Cached tables trained on 2 gloo ranks equal the same tables trained all in memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import run_on_ranks
from planner.plan.document import Plan, table_layout
from planner.spec.specs import ClusterSpec, CostConstants, TableSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingType

pytestmark = pytest.mark.distributed

ROWS = 3000
# (name, scheme, ranks, backing tier, cache load factor): small caches, so rows are evicted
# and written back many times within a few steps
TABLES = [
    ("kv_tw", ShardingType.TABLE_WISE, [0], "ssd", 0.35),
    ("uvm_cw", ShardingType.COLUMN_WISE, [1, 0], "ddr", 0.4),
    ("plain_tw", ShardingType.TABLE_WISE, [1], "ddr", None),
]
STEPS = 12


def problem(optimizer: str) -> PlanningProblem:
    tables = tuple(TableSpec(name, ROWS + 7 * i, 16, pooling_factor=6.0, zipf_exponent=1.05) for i, (name, *_r) in enumerate(TABLES))
    cluster = ClusterSpec(1, 2, "cpu", 0, 8 * 1024**3, 8 * 1024**3, CostConstants(1.0, 4.0, 0.5, 1.0, 1.0))
    return PlanningProblem(tables, cluster, TrainingSpec(128, optimizer))


def plan_for(p: PlanningProblem, tiered: bool) -> Plan:
    tables = {}
    for t, (_, st, ranks, tier, lf) in zip(p.tables, TABLES):
        tables[t.name] = table_layout(t, st, ranks, tier, lf) if tiered and lf else table_layout(t, st, ranks, "ddr")
    return Plan(2, 2, tables, (), 0.0, 0.0)


def initial_table(t: TableSpec) -> torch.Tensor:
    g = torch.Generator().manual_seed(len(t.name))
    return (torch.rand(t.num_embeddings, t.embedding_dim, generator=g) - 0.5) * 0.2


def _train(rank, world, out_dir, tiered, optimizer, pipeline, steps, checkpoint_every, resume, store_io):
    from dlrm_scale.run_config import CheckpointConfig, TrainConfig
    from dlrm_scale.training.state import local_shard_state
    from dlrm_scale.training.trainer import Trainer
    from tests.conftest import run_config

    p = problem(optimizer)
    out = Path(out_dir)
    cfg = TrainConfig(steps=steps, embedding_lr=0.1, dense_lr=0.1, dense_optimizer="sgd", log_every=4,
                      eval_batches=1, pipeline=pipeline, store_dir=str(out / f"store{rank}") if tiered else None, store_io=store_io)
    if tiered:
        (out / f"store{rank}").mkdir(exist_ok=True)
    checkpoint = CheckpointConfig(out / "ckpt", checkpoint_every, 3) if checkpoint_every or resume else None
    torch.manual_seed(0)
    trainer = Trainer(run_config(p, _model_config(), cfg, 128, checkpoint), plan_for(p, tiered), torch.device("cpu"), rank, world, out,
                      resume=resume)
    local_shard_state(trainer.model, trainer.tiered, lambda name: initial_table(p.tables_by_name[name]))
    trainer.run()
    result = {"tables": local_shard_state(trainer.model, trainer.tiered)}
    if trainer.tiered is not None:
        result["counters"] = trainer.tiered.counters()
        # the stores read with pread (the default without a profile): those the pipeline reads ahead
        result["read_ahead"] = [(t.counters.prefetched_rows, t.counters.loaded_rows) for t in trainer.tiered.shards.values()
                                if not t.store.addressable]
        trainer.tiered.close()
    every = [None] * world
    torch.distributed.all_gather_object(every, result)
    return every


def _model_config():
    from dlrm_scale.run_config import ModelConfig

    return ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))


def run(tmp_path, name, tiered, optimizer="rowwise_adagrad", pipeline=True, steps=STEPS, checkpoint_every=0, resume=False,
        store_io=None):
    out = tmp_path / name
    out.mkdir(exist_ok=True)
    return run_on_ranks(_train, 2, str(out), tiered, optimizer, pipeline, steps, checkpoint_every, resume, store_io)


def gather(results) -> dict:
    return {key: value for r in results for key, value in r["tables"].items()}


@pytest.mark.parametrize("optimizer,pipeline,store_io", [("rowwise_adagrad", True, None), ("adagrad", False, None),
                                                         ("rowwise_adagrad", True, "mapped")])
def test_cached_tables_train_exactly_like_tables_in_memory(tmp_path, optimizer, pipeline, store_io):
    plain = gather(run(tmp_path, "plain", False, optimizer, pipeline))
    tiered_results = run(tmp_path, "tiered", True, optimizer, pipeline, store_io=store_io)
    tiered = gather(tiered_results)
    assert plain.keys() == tiered.keys()
    for key in plain:
        w0, s0 = plain[key]
        w1, s1 = tiered[key]
        assert torch.equal(w0, w1), key
        assert torch.equal(s0, s1), key
        assert not torch.equal(w0, initial_table(problem(optimizer).tables_by_name[key[0]])[:, key[1]:key[1] + w0.shape[1]])
    counters = [r["counters"] for r in tiered_results]
    assert sum(c["cache_evictions"] for c in counters) > 0 and sum(c["rows_written_back"] for c in counters) > 0
    read_ahead = [pair for r in tiered_results for pair in r["read_ahead"]]
    if store_io == "mapped":  # every store copied from directly: nothing read ahead, the plain pipeline
        assert not read_ahead and sum(c["rows_prefetched"] for c in counters) == 0
    elif pipeline:  # the next batch's misses were read ahead, where the store is read with pread
        assert read_ahead and sum(p for p, _ in read_ahead) > 0.9 * sum(n for _, n in read_ahead)


def test_resuming_a_cached_table_from_a_checkpoint_continues_bit_identically(tmp_path):
    import shutil

    full = gather(run(tmp_path, "full", True))
    run(tmp_path, "split", True, steps=8, checkpoint_every=6)
    # as after a crash at step 8: the stores moved on past the newest checkpoint (step 6), so
    # resuming must restore them from it, not reuse them
    shutil.rmtree(tmp_path / "split" / "ckpt" / "step_000000008")
    resumed = gather(run(tmp_path, "split", True, steps=STEPS, resume=True))
    for key in full:
        assert torch.equal(full[key][0], resumed[key][0]), key
        assert torch.equal(full[key][1], resumed[key][1]), key

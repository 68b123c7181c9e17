"""Real training on gloo, 2 ranks on one node and 4 as two nodes of two, against an unsharded
single-process reference."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from planner.plan.document import Plan, table_layout
from planner.spec.specs import ClusterSpec, CostConstants, TableSpec, TrainingSpec
from planner.spec.problem import PlanningProblem
from planner.spec.types import ShardingType
from dlrm_scale.tools.launch import run_on_ranks

pytestmark = pytest.mark.distributed

# One table per scheme, all in one model: every scheme is exercised in the same run.
SCHEMES = [
    ("dp", ShardingType.DATA_PARALLEL, 2, "dense", [0, 1]),
    ("tw", ShardingType.TABLE_WISE, 1, "fused", [1]),
    ("cw", ShardingType.COLUMN_WISE, 2, "fused", [1, 0]),
    ("twcw", ShardingType.TABLE_COLUMN_WISE, 2, "fused", [0, 1]),
    ("rw", ShardingType.ROW_WISE, 2, "fused", [0, 1]),
    ("twrw", ShardingType.TABLE_ROW_WISE, 2, "fused", [0, 1]),
]
# Two nodes of two ranks: the node schemes on a node, a grid's two column blocks a node each.
TWO_NODE_SCHEMES = [
    ("dp", ShardingType.DATA_PARALLEL, 4, "dense", [0, 1, 2, 3]),
    ("tw", ShardingType.TABLE_WISE, 1, "fused", [3]),
    ("cw", ShardingType.COLUMN_WISE, 2, "fused", [1, 2]),
    ("twcw", ShardingType.TABLE_COLUMN_WISE, 2, "fused", [2, 3]),
    ("rw", ShardingType.ROW_WISE, 4, "fused", [0, 1, 2, 3]),
    ("twrw", ShardingType.TABLE_ROW_WISE, 2, "fused", [2, 3]),
    ("grid", ShardingType.GRID_SHARD, 4, "fused", [2, 3, 0, 1]),
]
LAYOUTS = {"one_node": (1, SCHEMES), "two_nodes": (2, TWO_NODE_SCHEMES)}  # nodes of two ranks, tables
STEPS = 3
LR = 0.1


def problem(optimizer: str = "sgd", fwd: str = "fp32", bwd: str = "fp32", layout: str = "one_node") -> PlanningProblem:
    nodes, schemes = LAYOUTS[layout]
    tables = tuple(TableSpec(name, 101 + 10 * i, 16, pooling_factor=3.0) for i, (name, *_rest) in enumerate(schemes))
    cluster = ClusterSpec(nodes, 2, "cpu", 0, 8 * 1024**3, 0, CostConstants(1.0, 4.0, 0.5, 1.0, 1.0))
    return PlanningProblem(tables, cluster, TrainingSpec(64, optimizer, fwd, bwd))


def every_scheme_plan(p: PlanningProblem, layout: str = "one_node") -> Plan:
    schemes = LAYOUTS[layout][1]
    tables = {t.name: table_layout(t, st, ranks, "ddr", ranks_per_node=2) for t, (_, st, _n, _kernel, ranks) in zip(p.tables, schemes)}
    return Plan(p.cluster.world_size, 2, tables, (), 0.0, 0.0)


def model_config():
    from dlrm_scale.run_config import ModelConfig

    return ModelConfig(num_dense_features=4, dense_arch=(16,), over_arch=(8, 1))


def _train_sharded(rank, world, out_dir, fwd, bwd, pipeline, steps, optimizer="sgd", layout="one_node"):
    from dlrm_scale.run_config import TrainConfig
    from dlrm_scale.training.state import full_tables, local_shard_blocks
    from dlrm_scale.training.trainer import Trainer
    from tests.conftest import run_config

    p = problem(optimizer, fwd, bwd, layout)
    plan = every_scheme_plan(p, layout)
    cfg = TrainConfig(steps=steps, embedding_lr=LR, dense_lr=LR, dense_optimizer="sgd",
                      log_every=1, eval_batches=1, pipeline=pipeline, cpu_embeddings="dlrm_scale", interaction="dlrm_scale",
                      materialise_mib=1024 if pipeline else 0)  # without the pipeline, batches come from the worker thread
    trainer = Trainer(run_config(p, model_config(), cfg, 64), plan, torch.device("cpu"), rank, world, Path(out_dir))
    initial = {k: v.detach().clone() for k, v in trainer.model.state_dict().items() if "embedding_bags" not in k}
    initial_tables = full_tables(trainer.model)
    blocks = local_shard_blocks(trainer.model)
    all_blocks = [None] * world
    torch.distributed.all_gather_object(all_blocks, blocks)
    trainer.run()
    final_tables = full_tables(trainer.model)
    return {"initial": initial, "initial_tables": initial_tables, "final_tables": final_tables, "blocks": all_blocks}


def rowwise_adagrad_step(weight, state, blocks, eps=1e-8):
    """Row-wise Adagrad as the sharded tables run it: a column-wise shard is its own table, so
    each block of columns keeps its own per-row sum (FBGEMM's default eps)."""
    with torch.no_grad():
        for c0, cols in blocks:
            g = weight.grad[:, c0 : c0 + cols]
            h = state.setdefault(c0, torch.zeros(weight.shape[0]))
            h += g.pow(2).mean(dim=1)
            weight[:, c0 : c0 + cols] -= LR * g / (h.sqrt() + eps)[:, None]


def reference_run(initial, initial_tables, steps, optimizer="sgd", layout="one_node"):
    """The same model unsharded in one process, trained on both ranks' batches, with the
    optimizers written out in PyTorch (no FBGEMM kernel, ours or theirs, involved)."""
    from dlrm_scale.training.data import SyntheticData
    from dlrm_scale.training.model import build_model

    p = problem(layout=layout)
    world = p.cluster.world_size
    model = build_model(p.tables, model_config(), torch.device("cpu"), embedding_device="cpu")
    state = dict(initial)
    for name, w in initial_tables.items():
        state[f"model.sparse_arch.embedding_bag_collection.embedding_bags.{name}.weight"] = w
    model.load_state_dict(state)
    bags = model.model.sparse_arch.embedding_bag_collection.embedding_bags
    plan = every_scheme_plan(p, layout)
    blocks = {name: sorted({(s.col_offset, s.cols) for s in t.shards}) for name, t in plan.tables.items()}
    adagrad_state = {name: {} for name in blocks}
    opt = torch.optim.SGD(model.parameters() if optimizer == "sgd" else
                          [q for n, q in model.named_parameters() if "embedding_bags" not in n], lr=LR)
    data = [SyntheticData(p.tables, 4, 64 * world, seed=0, rank=r, world=world) for r in range(world)]
    losses = []
    for step in range(steps):
        loss = sum(model(d.batch(step))[0] for d in data) / world  # the mean over the global batch
        model.zero_grad()
        loss.backward()
        opt.step()
        if optimizer == "rowwise_adagrad":
            for name, bag in bags.items():
                rowwise_adagrad_step(bag.weight, adagrad_state[name], blocks[name])
        losses.append(float(loss))
    tables = {t.name: bags[t.name].weight.detach() for t in p.tables}
    return losses, tables


def logged_losses(out_dir: Path) -> list[float]:
    return [json.loads(l)["loss"] for l in (out_dir / "metrics.jsonl").read_text().splitlines() if "loss" in json.loads(l)]


@pytest.mark.parametrize("pipeline", [False, True])
def test_every_scheme_matches_unsharded_training(tmp_path, pipeline):
    """The sharded run uses dlrm_scale's dot interaction, the reference TorchRec's InteractionArch."""
    result = run_on_ranks(_train_sharded, 2, str(tmp_path), "fp32", "fp32", pipeline, STEPS)
    ref_losses, ref_tables = reference_run(result["initial"], result["initial_tables"], STEPS)
    assert logged_losses(tmp_path) == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
    for record in (m for m in metrics(tmp_path) if "phase_ms" in m):  # every rank's phases add up to its step
        for rank in range(2):
            phases = {p: ms[rank] for p, ms in record["phase_ms"].items()}
            assert all(ms >= 0 for ms in phases.values())
            assert phases["emb_fwd"] > 0 and phases["emb_bwd_opt"] > 0 and phases["dense_fwd"] > 0 and phases["data"] > 0
            # every forward waits for its batch's ids (with the pipeline, also the next batch's launch)
            assert phases["input_dist"] > 0
            if pipeline and record["step"] < STEPS:  # the last step has no next batch to distribute
                assert phases["a2a_bwd"] > 0
        sums = [sum(ms[rank] for ms in record["phase_ms"].values()) for rank in range(2)]
        assert max(sums) == pytest.approx(record["step_ms"], abs=1e-3)  # its steps (phases rounded to 1e-4 ms)
        # (a faster rank's window ends before its last step's tail wait, so its sum can be a few ms
        # less on these 1-step windows: only the slowest rank's sum is the window's time)
    for name, ref in ref_tables.items():
        got = result["final_tables"][name]
        assert not torch.equal(got, result["initial_tables"][name]), f"{name} did not train"
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=f"table {name} differs from the reference")


@pytest.fixture(scope="module")
def rowwise_adagrad_runs(tmp_path_factory):
    """Row-wise Adagrad on every scheme, the data-parallel table included: the fused ones run
    dlrm_scale's CPU kernel (the trainer's default), the replicated one
    dlrm_scale.training.table_optimizer, against the update written out in PyTorch. Two steps, so the
    second starts from state the first wrote; the kernel's state over many steps is checked
    against FBGEMM's in tests/test_cpu_adagrad.py."""
    out = tmp_path_factory.mktemp("rowwise_adagrad")
    result = run_on_ranks(_train_sharded, 2, str(out), "fp32", "fp32", True, 2, "rowwise_adagrad")
    _, ref_tables = reference_run(result["initial"], result["initial_tables"], 2, "rowwise_adagrad")
    return result, ref_tables


@pytest.mark.parametrize("name", [name for name, *_ in SCHEMES])
def test_row_wise_adagrad_on_every_scheme_matches_unsharded(rowwise_adagrad_runs, name):
    result, ref_tables = rowwise_adagrad_runs
    got = result["final_tables"][name]
    assert not torch.equal(got, result["initial_tables"][name]), f"{name} did not train"
    torch.testing.assert_close(got, ref_tables[name], rtol=1e-5, atol=1e-6, msg=f"table {name} differs from the reference")


def test_two_nodes_train_every_scheme_and_a_grid_as_unsharded(tmp_path):
    """Four ranks as two nodes of two (TorchRec's node groups from LOCAL_WORLD_SIZE): the node
    schemes and a grid, whose column blocks keep row-wise Adagrad's state apart as column-wise
    shards do, train as the unsharded model; every rank sends what the plan counts."""
    result = run_on_ranks(_train_sharded, 4, str(tmp_path), "fp32", "fp32", True, 2, "rowwise_adagrad", "two_nodes",
                          ranks_per_node=2)
    _, ref_tables = reference_run(result["initial"], result["initial_tables"], 2, "rowwise_adagrad", "two_nodes")
    for name, ref in ref_tables.items():
        got = result["final_tables"][name]
        assert not torch.equal(got, result["initial_tables"][name]), f"{name} did not train"
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6, msg=f"table {name} differs from the reference")
    plan = every_scheme_plan(problem(layout="two_nodes"), "two_nodes")
    for rank, blocks in enumerate(result["blocks"]):
        want = sorted((s.row_offset, s.col_offset, s.rows, s.cols) for s in plan.tables["grid"].shards if s.rank == rank)
        assert blocks["grid"] == want, rank
    windows = [m for m in metrics(tmp_path) if "comm_bytes" in m]
    assert windows and all(w["comm_bytes"] == w["comm_bytes_predicted"] for w in windows)
    assert all(0 < a < t for w in windows for a, t in zip(w["comm_bytes_across_nodes"], w["comm_bytes"]))


def test_shards_land_where_the_plan_says(tmp_path):
    result = run_on_ranks(_train_sharded, 2, str(tmp_path), "fp32", "fp32", False, 1)
    plan = every_scheme_plan(problem())
    for rank, blocks in enumerate(result["blocks"]):
        for name, t in plan.tables.items():
            want = sorted((s.row_offset, s.col_offset, s.rows, s.cols) for s in t.shards if s.rank == rank and s.rows)
            got = [b for b in blocks.get(name, []) if b[2]]
            assert got == want, (rank, name)


def metrics(out_dir: Path) -> list[dict]:
    return [json.loads(l) for l in (out_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("fwd, bwd, max_ratio", [("fp16", "bf16", 0.52), ("bf16", "fp16", 0.52)])
def test_quantized_comms_cut_measured_bytes_and_keep_the_loss(tmp_path, fwd, bwd, max_ratio):
    base, quant = tmp_path / "fp32", tmp_path / "q"
    base.mkdir()
    quant.mkdir()
    run_on_ranks(_train_sharded, 2, str(base), "fp32", "fp32", False, 4)
    run_on_ranks(_train_sharded, 2, str(quant), fwd, bwd, False, 4)
    b = [m for m in metrics(base) if "comm_bytes" in m]
    q = [m for m in metrics(quant) if "comm_bytes" in m]
    assert all(min(m["comm_bytes"]) > 0 for m in b)
    assert all(cq <= max_ratio * cb for mb, mq in zip(b, q) for cb, cq in zip(mb["comm_bytes"], mq["comm_bytes"]))
    assert [m["loss"] for m in q] == pytest.approx([m["loss"] for m in b], abs=2e-3)

"""Two torchrun agents on one host as two nodes of two ranks, started as a user starts a
multi-node job (`dlrm-scale train --nnodes 2 --rdzv-endpoint ...`, once per node): node-local
schemes train, every rank sends within and across nodes what the plan counts, and the job's
checkpoint resumes on one node of four ranks with the tables as they were saved."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import free_port, run_on_ranks
from planner.plan.document import Plan

pytestmark = pytest.mark.distributed

MODEL = """
hardware: cpu_gloo
training: {batch_size_per_rank: 64, embedding_optimizer: rowwise_adagrad}
tables:
  - {name: t_large, num_embeddings: 20000, embedding_dim: 32, pooling_factor: 4.0, zipf_exponent: 1.05}
  - {name: t_medium, num_embeddings: 5000, embedding_dim: 32, pooling_factor: 2.0, zipf_exponent: 1.05}
  - {name: t_small, num_embeddings: 1000, embedding_dim: 32, pooling_factor: 1.0}
  - {name: t_tiny, num_embeddings: 100, embedding_dim: 32, pooling_factor: 1.0}
  - {name: t_grid, num_embeddings: 8000, embedding_dim: 32, pooling_factor: 3.0, zipf_exponent: 1.05}
model: {arch: dlrm, num_dense_features: 13, dense_arch: [32, 16], over_arch: [32, 1]}
train: {eval_every: 0, embedding_lr: 0.05, dense_lr: 0.05}
"""
TWO_NODES = MODEL + """cluster: {world_size: 4, ranks_per_node: 2}
constraints:  # the node-local schemes
  tables:
    - {match: t_large, schemes: [table_row_wise]}
    - {match: t_medium, schemes: [table_column_wise], max_shards: 2}
    - {match: t_grid, schemes: [grid_shard]}
    - {match: "t_[st]*", schemes: [table_wise]}
"""
ONE_NODE = MODEL + """cluster: {world_size: 4, ranks_per_node: 4}
constraints:  # the same column split: row-wise Adagrad's state is per column shard, so it is part of the model
  tables:
    - {match: t_large, schemes: [row_wise]}
    - {match: "t_[mg]*", schemes: [column_wise], max_shards: 2}
    - {match: "t_[st]*", schemes: [table_wise]}
"""
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "dlrm_scale.cli", *args]


def plan(config: Path, out: Path, *args: str) -> Plan:
    r = subprocess.run(cli("plan", str(config), "--out", str(out), *args), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    return Plan.load(out)


def windows(out_dir: Path) -> list[dict]:
    return [r for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines()) if "comm_bytes" in r]


def _restored_tables(rank, world, config, plan_path, checkpoint, out_dir):
    """The tables as a job on one node of `world` ranks resumes them from `checkpoint`."""
    from dlrm_scale.training.flags import check_job, parse_args
    from dlrm_scale.training.state import full_tables
    from dlrm_scale.training.trainer import Trainer

    job = check_job(parse_args(["--config", config, "--resume-from", checkpoint, "--checkpoint-dir", str(Path(checkpoint).parent),
                                "--out-dir", out_dir]), "cpu")
    run = job.on_cluster(world, world, "cpu")
    trainer = Trainer(run, Plan.load(plan_path), torch.device("cpu"), rank, world, Path(out_dir), resume=True)
    assert trainer.checkpoints.restore(run.train.steps) == 20
    return full_tables(trainer.model)


def test_two_nodes_train_node_local_schemes_and_resume_on_one(tmp_path):
    config, one_node = tmp_path / "two_nodes.yaml", tmp_path / "one_node.yaml"
    config.write_text(TWO_NODES)
    one_node.write_text(ONE_NODE)
    two_by_two = plan(config, tmp_path / "plan_2x2.json")
    assert [two_by_two.tables[t].sharding_type for t in ("t_large", "t_medium", "t_grid")] == [
        "table_row_wise", "table_column_wise", "grid_shard"]
    checkpoints = tmp_path / "checkpoints"  # one directory both nodes write to, as on a shared file system
    port = free_port()
    agents = [subprocess.Popen(cli("train", "--nnodes", "2", "--nproc-per-node", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
                                   "--rdzv-id", "two-nodes", "--config", str(config), "--plan", str(tmp_path / "plan_2x2.json"),
                                   "--steps", "30", "--checkpoint-dir", str(checkpoints), "--checkpoint-every", "10",
                                   "--deterministic", "--out-dir", str(tmp_path / f"node{n}")),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV) for n in (0, 1)]
    for agent in agents:
        out, err = agent.communicate(timeout=300)
        assert agent.returncode == 0, err[-3000:] + out[-2000:]

    # every rank measured what the plan counts, within its node and across
    # rank 0 writes the job's metrics, on whichever node the rendezvous made the first
    trained = windows(next(d for d in (tmp_path / "node0", tmp_path / "node1") if (d / "metrics.jsonl").exists()))
    assert [w["step"] for w in trained] == list(range(1, 31))  # --deterministic logs every step's loss
    for w in trained:
        assert w["comm_bytes"] == w["comm_bytes_predicted"], w["step"]
        assert w["comm_bytes_across_nodes"] == w["comm_bytes_across_nodes_predicted"], w["step"]
        assert all(0 < across < total for across, total in zip(w["comm_bytes_across_nodes"], w["comm_bytes"]))

    # the same checkpoint on one node of four ranks, under a plan for it
    plan(one_node, tmp_path / "plan_1x4.json")
    saved = checkpoints / "step_000000020"
    r = subprocess.run(cli("export", str(saved), "--config", str(config), "--out", str(tmp_path / "model.pt")),
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    exported = torch.load(tmp_path / "model.pt", weights_only=True)["state_dict"]
    restored = run_on_ranks(_restored_tables, 4, str(one_node), str(tmp_path / "plan_1x4.json"), str(saved), str(tmp_path / "restore"))
    assert set(restored) == {"t_large", "t_medium", "t_small", "t_tiny", "t_grid"}
    for name, table in restored.items():
        assert torch.equal(table, next(v for k, v in exported.items() if k.endswith(f".{name}.weight"))), name

    # and trained on from it, as the user resumes: the losses go on as the two nodes' did
    r = subprocess.run(cli("train", "--nproc-per-node", "4", "--config", str(one_node), "--plan", str(tmp_path / "plan_1x4.json"),
                           "--steps", "30", "--resume-from", "20", "--checkpoint-dir", str(checkpoints),
                           "--deterministic", "--out-dir", str(tmp_path / "one_node")),
                       capture_output=True, text=True, env=ENV, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    resumed = windows(tmp_path / "one_node")
    assert [w["step"] for w in resumed] == list(range(21, 31))
    assert [w["loss"] for w in resumed] == pytest.approx([w["loss"] for w in trained[20:]], rel=1e-5)
    assert all(w["comm_bytes_across_nodes"] == [0, 0, 0, 0] for w in resumed)

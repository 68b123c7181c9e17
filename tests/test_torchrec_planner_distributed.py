"""dlrm_scale.EmbeddingShardingPlanner in a TorchRec user's own loop: 2 gloo ranks plan a model
this project does not ship through collective_plan, train it 20 steps with DMP and TorchRec's
optimizers, and get, on both ranks, the plan `dlrm-scale plan` makes for the same tables."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import run_on_ranks

pytestmark = pytest.mark.distributed

BATCH, STEPS = 64, 20
# name, rows, dim, features (EBC) / name, rows, dim, feature (EC)
BAGS = [("clicks", 30_000, 128, ["clicked_ads"]), ("geo", 2_000, 16, ["country", "region"]), ("device", 50, 16, ["device"])]
SEQUENCES = [("watched", 20_000, 32, ["watched_videos"])]
POOLING = {"clicks": [60.0], "watched": [8.0]}  # a hot wide table: the plan splits tables by columns

CLI_CONFIG = """
hardware: cpu_gloo
cluster: {device: cpu, world_size: 2, ranks_per_node: 2, ddr_gib_per_node: 256, ssd_gib_per_node: 4096}
training: {batch_size_per_rank: 64}
tables:
  - {name: clicks, num_embeddings: 30000, embedding_dim: 128, pooling_factor: 60}
  - {name: geo, num_embeddings: 2000, embedding_dim: 16, pooling_factor: 2, outputs_per_sample: 2}
  - {name: device, num_embeddings: 50, embedding_dim: 16}
  - {name: watched, num_embeddings: 20000, embedding_dim: 32, pooling_factor: 8, pooled: false}
constraints:
  tables:   # what TorchRec's stock CPU sharders run
    - {match: "*", kernels: [dense, fused]}
    - {match: "[cgd]*", schemes: [data_parallel, table_wise, column_wise, table_column_wise]}
"""


def _ranker():
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig

    class Ranker(nn.Module):
        """Pooled features and a watch history (sequence), summed per sample, into a small MLP."""

        def __init__(self) -> None:
            super().__init__()
            self.features = nn.ModuleDict({"bags": EmbeddingBagCollection(
                tables=[EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f) for n, r, d, f in BAGS])})
            self.history = EmbeddingCollection(
                tables=[EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f) for n, r, d, f in SEQUENCES])
            self.head = nn.Sequential(nn.Linear(128 + 2 * 16 + 16 + 32, 16), nn.ReLU(), nn.Linear(16, 1))

        def forward(self, bags, sequence, labels):
            watched = self.history(sequence)["watched_videos"]
            rows = torch.repeat_interleave(torch.arange(watched.lengths().numel()), watched.lengths())
            summed = torch.zeros(watched.lengths().numel(), 32).index_add_(0, rows, watched.values())
            logits = self.head(torch.cat([self.features["bags"](bags).values(), summed], dim=1)).squeeze(1)
            return nn.functional.binary_cross_entropy_with_logits(logits, labels)

    return Ranker()


def _batch(generator):
    from torchrec import KeyedJaggedTensor

    keys = ["clicked_ads", "country", "region", "device"]
    lengths = [torch.randint(1, 6, (BATCH,), generator=generator), torch.ones(BATCH, dtype=torch.int64),
               torch.ones(BATCH, dtype=torch.int64), torch.ones(BATCH, dtype=torch.int64)]
    rows = [30_000, 2_000, 2_000, 50]
    values = [torch.randint(r, (int(n.sum()),), generator=generator) for r, n in zip(rows, lengths)]
    history = torch.randint(1, 16, (BATCH,), generator=generator)
    return (KeyedJaggedTensor.from_lengths_sync(keys, torch.cat(values), torch.cat(lengths)),
            KeyedJaggedTensor.from_lengths_sync(["watched_videos"], torch.randint(20_000, (int(history.sum()),), generator=generator), history),
            (torch.rand(BATCH, generator=generator) < 0.3).float())


def _plan_and_train(rank, world, out_dir):
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    from dlrm_scale import EmbeddingShardingPlanner
    from planner.spec.errors import ConfigError

    out = Path(out_dir)
    torch.manual_seed(0)
    model = _ranker()
    apply_optimizer_in_backward(RowWiseAdagrad, [*model.features.parameters(), *model.history.parameters()], {"lr": 0.05})
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=world)
    constraints = {name: ParameterConstraints(pooling_factors=p) for name, p in POOLING.items()}

    try:  # a user's error on rank 0 reaches every rank as its one line
        EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints={"watch": ParameterConstraints()}).collective_plan(
            model, sharders, dist.GroupMember.WORLD)
    except ConfigError as e:
        (out / f"error{rank}.txt").write_text(str(e))

    planner = EmbeddingShardingPlanner(topology=topology, batch_size=BATCH, constraints=constraints)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    planner.save(out / f"plan{rank}.json")
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())), lambda p: torch.optim.SGD(p, lr=0.05))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])
    generator = torch.Generator().manual_seed(rank)
    losses = []
    for _ in range(STEPS):
        loss = dmp(*_batch(generator))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    sharded = {name: ps.sharding_type for module_plan in dmp.plan.plan.values() for name, ps in module_plan.items()}
    return losses, sharded


def test_a_users_model_planned_by_collective_plan_trains_with_dmp_and_matches_the_cli(tmp_path):
    losses, sharded = run_on_ranks(_plan_and_train, 2, str(tmp_path))
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)

    errors = [(tmp_path / f"error{r}.txt").read_text() for r in range(2)]
    assert errors[0] == errors[1] and errors[0].startswith("constraints['watch']: the module has no table of that name")

    plans = [json.loads((tmp_path / f"plan{r}.json").read_text()) for r in range(2)]
    assert plans[0]["tables"] == plans[1]["tables"]  # both ranks got one plan
    assert sharded == {name: t["sharding_type"] for name, t in plans[0]["tables"].items()}  # and DMP sharded by it
    assert "column_wise" in sharded.values()

    (tmp_path / "config.yaml").write_text(CLI_CONFIG)
    cli = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", str(tmp_path / "config.yaml"), "--out", str(tmp_path / "cli.json")],
                         capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    expected = json.loads((tmp_path / "cli.json").read_text())
    assert plans[0]["tables"] == expected["tables"]  # to the shard
    assert plans[0]["predicted"]["max_rank_ms"] == pytest.approx(expected["predicted"]["max_rank_ms"])

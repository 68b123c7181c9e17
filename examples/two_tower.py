"""A two-tower retrieval model in plain TorchRec, sharded by dlrm-scale's planner: the only
line that names dlrm-scale is the planner's import. `--planner torchrec` plans it with
TorchRec's own planner instead, for comparison.

    torchrun --nproc_per_node 2 examples/two_tower.py                     # ~1 minute on 2 CPU cores
    torchrun --nproc_per_node 2 examples/two_tower.py --planner torchrec

The user tower reads a user id, two geography features from one shared table
(EmbeddingBagCollection) and the user's recent items as a sequence (EmbeddingCollection,
mean-pooled here); the item tower an item id and its category. Clicks follow a hidden
affinity between user and item groups, so the loss falls as the towers learn it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import Topology
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

USERS, ITEMS, CITIES, CATEGORIES, GROUPS = 200_000, 100_000, 5_000, 500, 16
DIM, HISTORY = 64, 20  # embedding width; items in a user's history, on average


def mlp(width_in: int) -> nn.Module:
    return nn.Sequential(nn.Linear(width_in, 128), nn.ReLU(), nn.Linear(128, DIM))


class TwoTower(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.user_bags = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="user_id", num_embeddings=USERS, embedding_dim=DIM, feature_names=["user"]),
            EmbeddingBagConfig(name="geo", num_embeddings=CITIES, embedding_dim=DIM, feature_names=["country", "city"]),
        ])
        self.history = EmbeddingCollection(tables=[
            EmbeddingConfig(name="history_items", num_embeddings=ITEMS, embedding_dim=DIM, feature_names=["history"]),
        ])
        self.item_bags = EmbeddingBagCollection(tables=[
            EmbeddingBagConfig(name="item_id", num_embeddings=ITEMS, embedding_dim=DIM, feature_names=["item"]),
            EmbeddingBagConfig(name="category", num_embeddings=CATEGORIES, embedding_dim=DIM, feature_names=["category"]),
        ])
        self.user_tower, self.item_tower = mlp(4 * DIM), mlp(2 * DIM)

    def forward(self, user: KeyedJaggedTensor, history: KeyedJaggedTensor, item: KeyedJaggedTensor,
                clicked: torch.Tensor) -> torch.Tensor:
        seq = self.history(history)["history"]
        lengths = seq.lengths()
        rows = torch.repeat_interleave(torch.arange(lengths.numel()), lengths)
        mean = torch.zeros(lengths.numel(), DIM).index_add_(0, rows, seq.values()) / lengths.clamp(min=1).unsqueeze(1)
        u = self.user_tower(torch.cat([self.user_bags(user).values(), mean], dim=1))
        i = self.item_tower(self.item_bags(item).values())
        return nn.functional.binary_cross_entropy_with_logits((u * i).sum(dim=1), clicked)


def batch(size: int, generator: torch.Generator):
    """Users and items drawn at random; a user clicks an item of its own group (id mod GROUPS)."""
    users = torch.randint(USERS, (size,), generator=generator)
    items = torch.randint(ITEMS, (size,), generator=generator)
    same = torch.rand(size, generator=generator) < 0.5
    items = torch.where(same, items - items % GROUPS + users % GROUPS, items) % ITEMS
    clicked = (items % GROUPS == users % GROUPS).float()
    lengths = torch.randint(1, 2 * HISTORY, (size,), generator=generator)
    history = torch.randint(ITEMS, (int(lengths.sum()),), generator=generator)
    history = history - history % GROUPS + torch.repeat_interleave(users % GROUPS, lengths)  # users view their group's items
    ones = torch.ones(size, dtype=torch.int64)

    def kjt(keys, values, lengths):
        return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))

    geo = users % CITIES
    return (kjt(["user", "country", "city"], [users, geo // 100, geo], [ones, ones, ones]),
            kjt(["history"], [history % ITEMS], [lengths]),
            kjt(["item", "category"], [items, items % CATEGORIES], [ones, ones]),
            clicked)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--planner", choices=["dlrm-scale", "torchrec"], default="dlrm-scale")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=512, help="samples per rank and step")
    parser.add_argument("--plan-out", help="write dlrm-scale's plan JSON here (and its config beside it)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)  # the same initial weights on every rank and under either planner
    model = TwoTower()
    sparse = [p for m in (model.user_bags, model.history, model.item_bags) for p in m.parameters()]
    apply_optimizer_in_backward(RowWiseAdagrad, sparse, {"lr": 0.05})

    if args.planner == "torchrec":
        from torchrec.distributed.planner import EmbeddingShardingPlanner
    else:
        from dlrm_scale import EmbeddingShardingPlanner
    topology = Topology(world_size=world, compute_device="cpu", local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=args.batch_size,
                                       constraints={"history_items": ParameterConstraints(pooling_factors=[float(HISTORY)])})
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    start = time.perf_counter()
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    plan_s = time.perf_counter() - start
    if rank == 0:
        print(plan)
        if args.plan_out and args.planner == "dlrm-scale":
            planner.save(args.plan_out)
            planner.save_config(os.path.splitext(args.plan_out)[0] + ".yaml")

    model = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adam(params, lr=1e-3))
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])
    generator = torch.Generator().manual_seed(1 + rank)
    losses, times = [], []
    for step in range(args.steps):
        inputs = batch(args.batch_size, generator)
        tick = time.perf_counter()
        loss = model(*inputs)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - tick)
        losses.append(loss.item())
    if rank == 0:
        print(f"planner {args.planner}: planned in {plan_s:.2f} s; loss {statistics.mean(losses[:20]):.3f} -> "
              f"{statistics.mean(losses[-20:]):.3f}; {1000 * statistics.median(times[min(10, len(times) - 1):]):.1f} ms a step (median)")
    dist.barrier()
    dist.destroy_process_group()
    # On gloo, a worker thread may still free a finished collective's tensors while the interpreter
    # shuts down, which aborts a complete run (std::terminate; DDP keeps the default group alive
    # past destroy_process_group): leave without the interpreter's teardown, output flushed.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

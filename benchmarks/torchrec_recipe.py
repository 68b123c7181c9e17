"""The anchor of the training benchmark: TorchRec's own recipe, as its users write it.

A stand-alone script that uses only TorchRec's (and PyTorch's) public API, the way TorchRec's
DLRM example and docs do it, and nothing from dlrm_scale: its EmbeddingShardingPlanner with its
stock sharder, DistributedModelParallel (on NCCL and the GPUs where there are GPUs, else on gloo
and the CPU), row-wise Adagrad fused into the backward
(apply_optimizer_in_backward), Adagrad for the dense part, TrainPipelineSparseDist, fp32 comms.
Batches are generated before the timed loop (a fresh one every step), with each table's ids
Zipf-distributed over a random permutation of its rows, at the exponent and mean pooling factor
the config gives, so the embedding work matches the one dlrm_scale trains on.

    torchrun --nproc_per_node 2 benchmarks/torchrec_recipe.py --config configs/bench_embedding_bound.yaml \
        --steps 200 --out result.json

Rank 0 writes {"samples_per_s": [...per window of --log-every steps...], ...} to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torchrec.datasets.utils import Batch
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.models.dlrm import DLRM, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


def zipf_sampler(rows: int, exponent: float, rng: np.random.Generator):
    """Ids by inverting the tabulated Zipf CDF over a random permutation of the rows."""
    cdf = np.cumsum(np.arange(1, rows + 1, dtype=np.float64) ** -exponent)
    cdf /= cdf[-1]
    perm = rng.permutation(rows)
    return lambda n: perm[np.minimum(np.searchsorted(cdf, rng.random(n)), rows - 1)]


def make_batches(tables: list[dict], num_dense: int, batch_size: int, steps: int, seed: int) -> list[Batch]:
    rng = np.random.default_rng(seed)
    samplers = [zipf_sampler(t["num_embeddings"], t.get("zipf_exponent", 1.05), rng) for t in tables]
    keys = [f"f_{t['name']}" for t in tables]
    batches = []
    for _ in range(steps):
        lengths, values = [], []
        for t, sample in zip(tables, samplers):
            n = 1 + rng.poisson(max(t.get("pooling_factor", 1.0) - 1.0, 0.0), size=batch_size)
            lengths.append(n)
            values.append(sample(int(n.sum())))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.from_numpy(np.concatenate(values).astype(np.int64)),
            lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)),
        )
        dense = torch.from_numpy(rng.standard_normal((batch_size, num_dense)).astype(np.float32))
        labels = torch.from_numpy((rng.random(batch_size) < 0.5).astype(np.float32))
        batches.append(Batch(dense_features=dense, sparse_features=kjt, labels=labels))
    return batches


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--log-every", type=int, default=25)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    config = yaml.safe_load(open(args.config))
    tables, model_cfg = config["tables"], config["model"]
    batch_size = config["training"]["batch_size_per_rank"]

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(args.seed)

    dim = tables[0]["embedding_dim"]
    ebc = EmbeddingBagCollection(
        tables=[EmbeddingBagConfig(name=t["name"], embedding_dim=dim, num_embeddings=t["num_embeddings"],
                                   feature_names=[f"f_{t['name']}"]) for t in tables],
        device=torch.device("meta"),
    )
    dense_arch = list(model_cfg["dense_arch"]) + ([] if model_cfg["dense_arch"][-1] == dim else [dim])
    model = DLRMTrain(DLRM(ebc, model_cfg["num_dense_features"], dense_arch, list(model_cfg["over_arch"]), dense_device=device))
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": args.lr})

    topology = Topology(world_size=world, compute_device=device.type, local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size)
    sharders = [EmbeddingBagCollectionSharder()]
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    model = DistributedModelParallel(model, device=device, plan=plan, sharders=sharders)
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=args.lr))
    optimizer = CombinedOptimizer([model.fused_optimizer, dense])

    batches = make_batches(tables, model_cfg["num_dense_features"], batch_size, args.steps, args.seed * 1000 + rank)
    pipeline = TrainPipelineSparseDist(model, optimizer, device)
    it = iter(batches)
    dist.barrier()
    rates, start = [], time.perf_counter()
    for step in range(args.steps):
        pipeline.progress(it)
        if (step + 1) % args.log_every == 0:
            if cuda:  # the window's kernels finished, not only launched
                torch.cuda.synchronize()
            now = time.perf_counter()
            rates.append(args.log_every * batch_size * world / (now - start))
            start = now
    if rank == 0:
        schemes = {}
        for module_plan in plan.plan.values():
            for p in module_plan.values():
                schemes[p.sharding_type] = schemes.get(p.sharding_type, 0) + 1
        with open(args.out, "w") as f:
            json.dump({"samples_per_s": rates, "schemes": schemes, "threads": os.environ.get("OMP_NUM_THREADS"), "device": device.type}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

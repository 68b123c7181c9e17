"""What a training run is built from, for a plan: the sharded model (DMP over the plan through
the bridge, embedding optimizers fused into the backward), the optimizers, and the data."""

from __future__ import annotations

import torch
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm_scale.bridge.resident import resident_tables
from dlrm_scale.bridge.sharders import sharder_for
from dlrm_scale.bridge.sharding import to_sharding_plan
from dlrm_scale.run_config import ModelConfig, RunConfig
from dlrm_scale.training.criteo import criteo_data
from dlrm_scale.training.data import SyntheticData
from dlrm_scale.training.model import EMBEDDING_MODULE_PATH, build_model, table_of_key
from dlrm_scale.training.table_optimizer import ReplicatedTables, fused_optimizer
from planner.plan import Plan
from planner.specs import PlanningProblem

EVAL_SEED_OFFSET = 1_000_003  # held-out synthetic batches: another seed


def build_sharded_model(problem: PlanningProblem, plan: Plan, model_config: ModelConfig, lr: float, device: torch.device,
                        store_dir: str | None = None, interaction: str = "torchrec") -> DistributedModelParallel:
    """DMP over `plan`. On CPU, cached tables are sharded as their resident caches (see
    dlrm_scale.bridge.resident); on CUDA they keep FBGEMM's caching kernels."""
    tables = resident_tables(problem.tables, plan) if device.type == "cpu" else problem.tables
    model = build_model(tables, model_config, device, interaction=interaction)
    optimizer_cls, kwargs = fused_optimizer(problem.training.embedding_optimizer, lr)
    apply_optimizer_in_backward(optimizer_cls, model.model.sparse_arch.parameters(), kwargs)
    tr = problem.training
    return DistributedModelParallel(
        model,
        device=device,
        plan=to_sharding_plan(plan, device.type, EMBEDDING_MODULE_PATH),
        sharders=[sharder_for(tr.fwd_comm_precision, tr.bwd_comm_precision, store_dir if device.type == "cuda" else None,
                              tuple(s.cols for t in plan.tables.values() for s in t.shards))],
    )


def build_optimizer(model: DistributedModelParallel, run: RunConfig) -> CombinedOptimizer:
    """The fused embedding optimizers, the dense optimizer, and the embedding optimizer's
    update for data-parallel tables (after their all-reduce), as one keyed optimizer."""
    train = run.train
    dense_cls = torch.optim.Adagrad if train.dense_optimizer == "adagrad" else torch.optim.SGD
    unfused = dict(in_backward_optimizer_filter(model.named_parameters()))
    replicated = {k: (table_of_key(k), p) for k, p in unfused.items() if table_of_key(k) is not None}
    dense = KeyedOptimizerWrapper({k: p for k, p in unfused.items() if k not in replicated},
                                  lambda params: dense_cls(params, lr=train.dense_lr))
    optimizers = [model.fused_optimizer, dense]
    if replicated:
        optimizers.append(ReplicatedTables(replicated, run.problem.training.embedding_optimizer, train.embedding_lr))
    return CombinedOptimizer(optimizers)


def build_data(run: RunConfig, data_path: str | None, rank: int, world: int) -> tuple:
    """(training, held-out) batches of this rank: synthetic, or Criteo from `data_path`."""
    tables, nd, seed = run.problem.tables, run.model.num_dense_features, run.train.seed
    batch = run.batch_size_per_rank
    if data_path is None:
        return (SyntheticData(tables, nd, batch * world, seed, rank, world),
                SyntheticData(tables, nd, batch * world, seed + EVAL_SEED_OFFSET, rank, world))
    return (criteo_data(data_path, tables, nd, batch, rank, world, "train"),
            criteo_data(data_path, tables, nd, batch, rank, world, "eval"))

"""What a training run is built from, for a plan: the CPU kernels, the sharded model (DMP over
the plan through the bridge, embedding optimizers fused into the backward), its memory tiers
and initial weights, the optimizers, and the data."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torchrec.distributed.model_parallel import DefaultDataParallelWrapper, DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from dlrm_scale.bridge.resident import resident_tables
from dlrm_scale.kernels.cpu_adagrad import install as install_cpu_adagrad
from dlrm_scale.kernels.huge_pages import back_with_huge_pages
from dlrm_scale.bridge.sharders import sharder_for
from dlrm_scale.bridge.sharding_plan import to_sharding_plan
from dlrm_scale.run_config import UNMEASURED_CPU_KERNELS, ModelConfig, RunConfig
from dlrm_scale.tiering.runtime import TieredEmbeddings, TieringRuntime
from dlrm_scale.training.criteo import criteo_data
from dlrm_scale.training.data import SyntheticData, feature_name
from dlrm_scale.training.initial_weights import initialise_embeddings
from dlrm_scale.training.model import EMBEDDING_MODULE_PATH, build_model, table_of_key
from dlrm_scale.training.phases import PhaseTimer, instrument
from dlrm_scale.training.replicas import ReplicaGroups
from dlrm_scale.training.table_optimizer import ReplicatedTables, fused_optimizer
from planner.plan.document import Plan
from planner.spec.problem import PlanningProblem

EVAL_SEED_OFFSET = 1_000_003  # held-out synthetic batches: another seed


@dataclass
class Parts:
    model: DistributedModelParallel
    timer: PhaseTimer  # laps of every phase, hooked into the model
    tiered: TieredEmbeddings | None  # CPU memory tiers of cached tables
    optimizer: CombinedOptimizer
    data: object
    eval_data: object
    cpu_kernel: object | None  # our row-wise Adagrad kernel, installed while the run lasts
    replicas: ReplicaGroups | None  # a 2D plan's groups (None: the tables are sharded over every rank)
    initialise_s: float  # of the build, setting the tables' initial weights (which a resume loads instead)


def build_parts(run: RunConfig, plan: Plan, device: torch.device, rank: int, world: int, data_path: str | None,
                initialise: bool) -> Parts:
    """Everything a run trains with, on this rank; tables at their initial weights when
    `initialise` (a resume loads them instead)."""
    train = run.train
    ours_on_cpu = device.type == "cpu" and train.cpu_embeddings == "dlrm_scale"
    cpu_kernel = install_cpu_adagrad(run.problem.training.embedding_optimizer) if ours_on_cpu else None
    replicas = ReplicaGroups(plan, device.type, run.problem.training.embedding_optimizer) if plan.replication is not None else None
    model = build_sharded_model(run.problem, plan, run.model, train.embedding_lr, device, train.store_dir, train.interaction,
                                replicas, run.problem.cluster.ranks_per_node if replicas is not None else None, train.deterministic)
    if replicas is not None:
        replicas.share_gradients(model, {feature_name(t.name): t.name for t in run.problem.tables})
        replicas.watch_lookups(model)
    timer = PhaseTimer()
    instrument(model, timer)
    tiered = None
    if device.type == "cpu" and any(t.cached for t in plan.tables.values()):
        runtime = TieringRuntime(Path(train.store_dir) if train.store_dir else None, run.tiering.policy,
                                 prefetch_thread=train.prefetch_thread,
                                 store_io=train.store_io or UNMEASURED_CPU_KERNELS["store_io"])
        tiered = TieredEmbeddings(model, plan, rank, runtime)
    began = time.monotonic()
    if initialise:
        initialise_embeddings(model, {t.name: (t.num_embeddings, t.embedding_dim) for t in run.problem.tables}, train.seed, tiered)
    initialise_s = time.monotonic() - began
    if ours_on_cpu:
        on_huge, large = back_with_huge_pages(model)
        if rank == 0 and large:
            print(f"rank 0: {on_huge / 2**30:.2f} of {large / 2**30:.2f} GiB of tables and optimizer state on huge pages", flush=True)
    return Parts(model, timer, tiered, build_optimizer(model, run), *build_data(run, data_path, rank, world), cpu_kernel, replicas,
                 initialise_s)


def build_sharded_model(problem: PlanningProblem, plan: Plan, model_config: ModelConfig, lr: float, device: torch.device,
                        store_dir: str | None = None, interaction: str = "torchrec", replicas: ReplicaGroups | None = None,
                        ranks_per_node: int | None = None, deterministic: bool = False) -> DistributedModelParallel:
    """DMP over `plan`; a 2D plan over its sharding group (`replicas`, on nodes of `ranks_per_node`).
    On CPU, cached tables are sharded as their resident caches (see dlrm_scale.bridge.resident);
    on CUDA they keep FBGEMM's caching kernels. `deterministic`: DDP keeps its first gradient
    buckets (see below)."""
    tables = resident_tables(problem.tables, plan) if device.type == "cpu" else problem.tables
    model = build_model(tables, model_config, device, interaction=interaction)
    optimizer_cls, kwargs = fused_optimizer(problem.training.embedding_optimizer, lr)
    apply_optimizer_in_backward(optimizer_cls, model.model.sparse_arch.parameters(), kwargs)
    tr = problem.training
    job_ranks = replicas.job_ranks if replicas is not None else None
    # DDP regroups the dense gradients into new buckets after a process's first step, and on 3 or
    # more ranks a bucket's layout decides each sum's order: a job resumed at step k summed step
    # k+1 otherwise than the job that never stopped, one rounding apart. Without regrouping (DDP
    # does not regroup when it looks for unused parameters) every step sums alike in every process.
    wrapper = DefaultDataParallelWrapper(static_graph=False, find_unused_parameters=True) if deterministic else None
    return DistributedModelParallel(
        model,
        env=replicas.env() if replicas is not None else None,
        data_parallel_wrapper=wrapper,
        device=device,
        plan=to_sharding_plan(plan, device.type, EMBEDDING_MODULE_PATH, store_dir, job_ranks, ranks_per_node),
        sharders=[sharder_for(tr.fwd_comm_precision, tr.bwd_comm_precision, tuple(s.cols for t in plan.tables.values() for s in t.shards))],
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
        return (SyntheticData(tables, nd, batch * world, seed, rank, world, run.train.drift_at_step, run.train.drift_grows),
                SyntheticData(tables, nd, batch * world, seed + EVAL_SEED_OFFSET, rank, world))
    return (criteo_data(data_path, tables, nd, batch, rank, world, "train"),
            criteo_data(data_path, tables, nd, batch, rank, world, "eval"))

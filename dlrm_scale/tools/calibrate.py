"""`dlrm-scale calibrate`: measure this machine and fit the cost model's constants.

Micro-benchmarks, each rank-sized (one thread per rank, as a torchrun rank gets one core):
- FBGEMM's table-batched embedding forward, and forward+backward with the fused optimizer,
  over rows, dims and pooling factors, with rows in host memory (the CPU tier), run as the
  trainer runs them by default (our row-wise Adagrad kernel, tables on huge pages);
- all-to-all and all-reduce over the process group backend (gloo on CPU) for N ranks;
- dense MLP forward+backward throughput;
- framework overhead per step, per table and per id routed, from tiny models trained for real.
Fits are least squares on relative error of the cost model's own formulas
(planner/cost_model.py), so the profile's constants mean exactly what the planner uses.
"""

from __future__ import annotations

import datetime
import os
import platform
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from dlrm_scale.training.data import DEFAULT_ZIPF, ZipfIds
from dlrm_scale.tools.kernel_choice import choose_cpu_kernels, time_ms
from planner.specs import GIB
from planner.cost_model import WEIGHT_BYTES, optimizer_state_bytes
from planner.errors import ConfigError


@dataclass(frozen=True)
class CalibrationConfig:
    nproc: int = 2
    batch_size: int = 2048
    dims: tuple[int, ...] = (16, 64, 128)
    pooling_factors: tuple[int, ...] = (1, 8, 32)
    rows: tuple[int, ...] = (100_000, 2_000_000)
    comm_sizes_bytes: tuple[int, ...] = (1 << 14, 1 << 18, 1 << 21, 1 << 23, 1 << 25)
    replica_shapes: tuple[tuple[int, int], ...] = ((10_000, 32), (100_000, 32), (200_000, 64))
    repeats: int = 5
    optimizer: str = "rowwise_adagrad"
    zipf_exponent: float = DEFAULT_ZIPF

    def __post_init__(self) -> None:
        if self.nproc < 2:
            raise ConfigError("calibrate: --nproc must be at least 2 to measure collectives")
        if self.repeats < 1:
            raise ConfigError("calibrate: repeats must be >= 1")


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: drop the most negative unknown and refit until none is."""
    active = list(range(a.shape[1]))
    while True:
        x_active, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if np.all(x_active >= 0) or not active:
            x = np.zeros(a.shape[1])
            x[active] = x_active
            return x
        active.pop(int(np.argmin(x_active)))


def embedding_samples(cfg: CalibrationConfig, progress: tqdm | None = None) -> list[dict]:
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from dlrm_scale.kernels.cpu_adagrad import install as install_cpu_adagrad
    from dlrm_scale.kernels.huge_pages import back_with_huge_pages

    optimizer = {"rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "sgd": EmbOptimType.EXACT_SGD}[cfg.optimizer]
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    samples = []
    kernel = install_cpu_adagrad(cfg.optimizer)
    try:
        for rows in cfg.rows:
            # ids as the training data draws them: the backward's cost depends on how many repeat
            zipf = ZipfIds(rows, cfg.zipf_exponent, seed=rows)
            for dim in cfg.dims:
                tbe = SplitTableBatchedEmbeddingBagsCodegen(
                    [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=optimizer, learning_rate=0.01
                )
                back_with_huge_pages(tbe)
                for pooling in cfg.pooling_factors:
                    lookups = cfg.batch_size * pooling
                    ids = torch.from_numpy(zipf.sample(lookups, rng).astype(np.int64))
                    offsets = torch.arange(0, lookups + 1, pooling)
                    fwd = time_ms(lambda: tbe(ids, offsets), cfg.repeats)

                    def step():
                        out = tbe(ids, offsets)
                        out.backward(torch.ones_like(out))

                    both = time_ms(step, cfg.repeats)
                    samples.append({"rows": rows, "dim": dim, "pooling": pooling, "lookups": lookups,
                                    "fwd_ms": fwd, "bwd_ms": max(both - fwd, 1e-6)})
                    if progress:
                        progress.update(1)
    finally:
        if kernel is not None:
            kernel.close()
    return samples


def fit_embedding(samples: list[dict], optimizer: str) -> dict[str, float]:
    """launch, per-id forward and backward costs and bandwidth of cost_model.lookup_*_ms."""
    rows, targets = [], []
    for s in samples:
        fwd_bytes = s["lookups"] * s["dim"] * WEIGHT_BYTES
        bwd_bytes = s["lookups"] * 2 * (s["dim"] * WEIGHT_BYTES + optimizer_state_bytes(1, s["dim"], optimizer))
        # unknowns: launch ms, fwd ns/id, bwd ns/id, ms per byte
        rows.append([1.0, s["lookups"] * 1e-6, 0.0, fwd_bytes])
        targets.append(s["fwd_ms"])
        rows.append([1.0, 0.0, s["lookups"] * 1e-6, bwd_bytes])
        targets.append(s["bwd_ms"])
    a, b = np.array(rows), np.array(targets)
    x = nonnegative_lstsq(a / b[:, None], np.ones_like(b))  # relative error
    ms_per_byte = max(x[3], 1e-12)
    return {
        "kernel_launch_ms": float(x[0]),
        "lookup_fwd_ns": float(x[1]),
        "lookup_bwd_ns": float(x[2]),
        "ddr_gb_per_s": float(1.0 / (ms_per_byte * 1e6)),
    }


def _comm_worker(rank: int, world: int, port: int, sizes: tuple[int, ...], repeats: int, queue) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = []
    for size in sizes:
        n = max(world, size // 4 // world * world)
        src, out = torch.ones(n), torch.empty(n)
        dist.barrier()
        a2a = time_ms(lambda: dist.all_to_all_single(out, src), repeats)
        dist.barrier()
        ar = time_ms(lambda: dist.all_reduce(src), repeats)
        results.append({"bytes": n * 4, "all_to_all_ms": a2a, "all_reduce_ms": ar})
    if rank == 0:
        queue.put(results)
    dist.barrier()
    dist.destroy_process_group()


def comm_samples(cfg: CalibrationConfig) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_comm_worker, args=(r, cfg.nproc, port, cfg.comm_sizes_bytes, cfg.repeats, queue)) for r in range(cfg.nproc)]
    for p in procs:
        p.start()
    results = queue.get(timeout=600)
    for p in procs:
        p.join()
    return results


def fit_comms(samples: list[dict], world: int) -> dict[str, float]:
    """Latency and per-rank link bandwidth of cost_model.all_to_all_ms / all_reduce_ms on one node."""
    rows, targets = [], []
    for s in samples:
        rows.append([1.0, s["bytes"] * (world - 1) / world])
        targets.append(s["all_to_all_ms"])
        rows.append([1.0, 2 * s["bytes"] * (world - 1) / world])
        targets.append(s["all_reduce_ms"])
    a, b = np.array(rows), np.array(targets)
    x = nonnegative_lstsq(a / b[:, None], np.ones_like(b))
    gb_per_s = 1.0 / (max(x[1], 1e-12) * 1e6)
    return {"collective_latency_ms": float(x[0]), "intra_node_gb_per_s": gb_per_s, "inter_node_gb_per_s": gb_per_s}


def replica_update_ns(cfg: CalibrationConfig) -> float:
    """Cost per weight of a data-parallel table's step beyond its lookups: the dense gradient
    and the optimizer over every row (TorchRec's dense kernel with its unfused optimizer)."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    torch.set_num_threads(1)
    weights, times = [], []
    for rows, dim in cfg.replica_shapes:
        emb = torch.nn.EmbeddingBag(rows, dim, mode="sum")
        opt = RowWiseAdagrad(emb.parameters(), lr=0.01) if cfg.optimizer == "rowwise_adagrad" else torch.optim.SGD(emb.parameters(), lr=0.01)
        ids, offsets = torch.randint(0, rows, (cfg.batch_size,)), torch.arange(cfg.batch_size)

        def step():
            opt.zero_grad()
            emb(ids, offsets).sum().backward()
            opt.step()

        weights.append(rows * dim)
        times.append(time_ms(step, cfg.repeats))
    slope = nonnegative_lstsq(np.array(weights, dtype=float)[:, None] / np.array(times)[:, None], np.ones(len(times)))[0]
    return float(slope * 1e6)


def dense_gflops(batch: int = 2048, widths: tuple[int, ...] = (512, 256, 64), repeats: int = 5) -> float:
    torch.set_num_threads(1)
    layers, d = [], 13
    for w in widths:
        layers += [torch.nn.Linear(d, w), torch.nn.ReLU()]
        d = w
    mlp = torch.nn.Sequential(*layers)
    x = torch.randn(batch, 13)
    flops = 3 * 2 * batch * sum(a * b for a, b in zip((13, *widths[:-1]), widths))  # fwd + 2x bwd

    def step():
        mlp(x).sum().backward()

    return flops / (time_ms(step, repeats) * 1e-3) / 1e9


# (tables, rows, dim, pooling factor) of the small models whose real step time fits the
# framework terms: few and many tables, few and many ids
OVERHEAD_MODELS = ((2, 1000, 16, 1.0), (16, 1000, 16, 1.0), (4, 200_000, 64, 20.0))
OVERHEAD_STEPS = 60
OVERHEAD_BATCH_SIZE_PER_RANK = 256  # a measurement setting: the batch these small models are timed at


def _overhead_model():
    from dlrm_scale.run_config import ModelConfig

    return ModelConfig(num_dense_features=13, dense_arch=(16,), over_arch=(16, 1))


def _overhead_problem(model: tuple, cluster_fields: dict, world: int):
    from planner.specs import ClusterSpec, PlanningProblem, TableSpec, TrainingSpec

    num_tables, rows, dim, pooling = model
    tables = tuple(TableSpec(f"t{i}", rows, dim, pooling) for i in range(num_tables))
    cluster = ClusterSpec(num_nodes=1, ranks_per_node=world, device="cpu", hbm_bytes_per_rank=0, **cluster_fields)
    return PlanningProblem(tables, cluster, TrainingSpec(OVERHEAD_BATCH_SIZE_PER_RANK))


def _overhead_worker(rank: int, world: int, out_dir: str, model: tuple, cluster_fields: dict) -> float:
    import json

    from dlrm_scale.run_config import RunConfig, TrainConfig
    from dlrm_scale.training.trainer import Trainer
    from planner.planning import make_plan

    problem = _overhead_problem(model, cluster_fields, world)
    plan = make_plan(problem)
    run = RunConfig(problem, _overhead_model(), TrainConfig(steps=OVERHEAD_STEPS, log_every=10, eval_batches=1))
    Trainer(run, plan, torch.device("cpu"), rank, world, Path(out_dir)).run()
    if rank != 0:
        return 0.0
    rates = [json.loads(l)["samples_per_s"] for l in Path(out_dir, "metrics.jsonl").read_text().splitlines() if "samples_per_s" in l]
    return float(OVERHEAD_BATCH_SIZE_PER_RANK * world / np.median(rates[1:]) * 1e3)


def fit_overhead(cfg: CalibrationConfig, cluster_fields: dict) -> dict[str, float]:
    """Framework time per step, per table and per id routed: tiny models trained for real on
    `nproc` ranks, minus what the fitted kernels and collectives predict for them."""
    import tempfile

    from dlrm_scale.tools.launch import run_on_ranks
    from dlrm_scale.tools.simulate import simulate
    from planner.planning import make_plan

    rows, residuals = [], []
    for model in OVERHEAD_MODELS:
        with tempfile.TemporaryDirectory() as out:
            measured = run_on_ranks(_overhead_worker, cfg.nproc, out, model, cluster_fields)
        problem = _overhead_problem(model, cluster_fields, cfg.nproc)
        plan = make_plan(problem)
        sim = simulate(plan, problem, _overhead_model())
        busiest = max(sim.ranks, key=lambda r: r.step_ms).rank
        ids = sum(
            OVERHEAD_BATCH_SIZE_PER_RANK * cfg.nproc * problem.tables_by_name[name].pooling_factor * sum(s.rows for s in t.shards if s.rank == busiest) / t.num_embeddings
            for name, t in plan.tables.items() if t.sharding_type != "data_parallel"
        )
        rows.append([1.0, model[0], ids * 1e-6])
        residuals.append(measured - sim.step_ms)
    x = nonnegative_lstsq(np.array(rows), np.array(residuals))
    return {"step_overhead_ms": float(x[0]), "table_overhead_ms": float(x[1]), "input_id_ns": float(x[2])}


def store_miss_samples(directory: Path, dims: tuple[int, ...] = (16, 128), rows: int = 1_000_000, batches: int = 20) -> list[dict]:
    """Times of a table kept on SSD (dlrm_scale.tiering.runtime: row cache in front of the
    log-structured file store in `directory`), one sample per embedding dim: batches of
    uniform ids, nearly all missing once the cache is full, and the last batch again, all hits
    (the cost every id pays)."""
    import tempfile

    from dlrm_scale.training.initial_weights import initial_rows
    from dlrm_scale.tiering.cache import SetAssociativeCache
    from dlrm_scale.tiering.store import FileRowStore
    from dlrm_scale.tiering.runtime import TieredShard

    samples = []
    for dim in dims:
        with tempfile.TemporaryDirectory(dir=directory) as d:
            store = FileRowStore(rows, dim, 1, Path(d) / "rows.f32")
            store.initialise(lambda start, stop: initial_rows(0, "calibration", rows, dim, start, stop))
            cache_rows, batch = rows // 10, rows // 40
            shard = TieredShard("calibration", torch.zeros(cache_rows, dim), [torch.zeros(cache_rows)], store,
                                SetAssociativeCache(cache_rows, rows), None)
            g = torch.Generator().manual_seed(1)
            for _ in range(5):  # fill the cache first: then every miss also evicts and writes back
                shard.install(torch.randint(0, rows, (batch,), generator=g), training=True)
            misses, start = shard.cache.counters.misses, time.perf_counter()
            for _ in range(batches):
                ids = torch.randint(0, rows, (batch,), generator=g)
                shard.install(ids, training=True)
            seconds = time.perf_counter() - start
            start = time.perf_counter()
            for _ in range(batches):
                shard.install(ids, training=True)
            samples.append({"dim": dim, "ids": batches * batch, "misses": shard.cache.counters.misses - misses, "seconds": seconds,
                            "hit_seconds": time.perf_counter() - start})
            store.close()
    return samples


def fit_store(samples: list[dict], optimizer: str) -> dict[str, float]:
    """cache_id_ns from the all-hit batches, then ssd_gb_per_s and ssd_latency_us of
    planner.cost_model.cache_miss_ms from what misses add, at two row widths (the
    width-dependent part is bandwidth, the rest latency)."""
    from planner.cost_model import WEIGHT_BYTES, optimizer_state_bytes

    per_id_s = float(np.mean([s["hit_seconds"] / s["ids"] for s in samples]))
    a = np.array([[2 * (s["dim"] * WEIGHT_BYTES + optimizer_state_bytes(1, s["dim"], optimizer)), 2.0] for s in samples])
    b = np.array([(s["seconds"] - s["ids"] * per_id_s) / s["misses"] * 1e6 for s in samples])  # us per miss
    per_byte_us, latency_us = nonnegative_lstsq(a, b)
    return {"ssd_gb_per_s": float(1e-3 / per_byte_us) if per_byte_us > 0 else 100.0, "ssd_latency_us": float(latency_us),
            "cache_id_ns": per_id_s * 1e9}


def _yaml_value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(round(value, 6) if isinstance(value, float) else value)


def calibrate_kernels(profile: Path) -> tuple[dict[str, str], dict]:
    """Only the CPU kernel choice, written into an existing profile (its `cpu_kernels` line),
    leaving the fitted constants as they are."""
    if not profile.is_file():
        raise ConfigError(f"calibrate --kernels-only: {profile} is not a hardware profile; give an existing .yaml")
    kernels, times = choose_cpu_kernels()
    lines = [line for line in profile.read_text().splitlines() if not line.startswith("cpu_kernels:")]
    lines.append(f"cpu_kernels: {_yaml_value(kernels)}")
    tmp = profile.with_name(profile.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(profile)
    return kernels, times


def calibrate(out: Path, cfg: CalibrationConfig, name: str | None = None) -> dict:
    if not out.parent.exists():
        raise ConfigError(f"calibrate: folder {out.parent} does not exist; create it or choose another --out")
    total = len(cfg.rows) * len(cfg.dims) * len(cfg.pooling_factors) + 5
    with tqdm(total=total, desc="calibrating", unit="bench") as progress:
        emb = embedding_samples(cfg, progress)
        comms = comm_samples(cfg)
        progress.update(1)
        gflops = dense_gflops()
        progress.update(1)
        update_ns = replica_update_ns(cfg)
        progress.update(1)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        fitted = {
            "ddr_bytes_per_node": int(memory * 0.8), "ssd_bytes_per_node": 0, "hbm_gb_per_s": 1.0, "ssd_gb_per_s": 0.5,
            **fit_embedding(emb, cfg.optimizer), **fit_comms(comms, cfg.nproc), "dense_gflops": gflops, "dense_update_ns": update_ns,
        }
        overhead = fit_overhead(cfg, fitted)
        progress.update(1)
        store = store_miss_samples(out.parent)
        progress.update(1)
    kernels, kernel_times = choose_cpu_kernels()
    disk = shutil.disk_usage(out.parent).free
    profile = {
        "name": name or out.stem,
        "device": "cpu",
        "ranks_per_node": cfg.nproc,
        "ddr_gib_per_node": round(memory / GIB * 0.8, 1),  # leave a fifth to the OS and the dense model
        "ssd_gib_per_node": round(disk / GIB * 0.8, 1),
        "hbm_gb_per_s": 1.0,
        **fit_store(store, cfg.optimizer),
        **{k: v for k, v in fitted.items() if k not in ("ddr_bytes_per_node", "ssd_bytes_per_node", "hbm_gb_per_s", "ssd_gb_per_s")},
        **overhead,
        "cpu_kernels": kernels,
    }
    header = (
        f"# Calibrated by `dlrm-scale calibrate` on {platform.node()} ({os.cpu_count()} cores), "
        f"{datetime.date.today().isoformat()}, {cfg.nproc} ranks over gloo.\n"
        "# Fitted to planner/cost_model.py's formulas; the raw samples are in the .samples.json beside it.\n"
    )
    lines = [f"{k}: {_yaml_value(v)}" for k, v in profile.items()]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(header + "\n".join(lines) + "\n")
    tmp.replace(out)
    import json

    out.with_suffix(".samples.json").write_text(
        json.dumps({"embedding": emb, "comms": comms, "dense_gflops": gflops, "dense_update_ns": update_ns, "overhead": overhead,
                    "store_misses": store, "cpu_kernel_ms": kernel_times}, indent=1)
    )
    return profile

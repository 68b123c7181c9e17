"""`dlrm-scale calibrate`: measure this machine and fit the cost model's constants.

Micro-benchmarks, each rank-sized (one thread per rank, as a torchrun rank gets one core):
- FBGEMM's table-batched embedding forward, and forward+backward with the fused optimizer,
  over rows, dims and pooling factors, with rows in host memory (the CPU tier), run as the
  trainer runs them by default (our row-wise Adagrad kernel, tables on huge pages);
- all-to-all and all-reduce over the process group backend (gloo on CPU) for N ranks;
- dense MLP forward+backward throughput;
then small generated table mixes trained for real under several plans, whose per-phase times
refit every constant together (dlrm_scale.tools.fit, what `calibrate --from-runs` does with a
user's own runs), the micro-benchmarks' values as priors. Fits are least squares on relative
error of the cost model's own formulas (planner/cost/cost_model.py), so the profile's constants mean
exactly what the planner uses.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import shutil
import socket
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from tqdm import tqdm

from dlrm_scale.training.data import DEFAULT_ZIPF, ZipfIds
from dlrm_scale.training.rank_end import end_rank
from dlrm_scale.tools.kernel_choice import choose_cpu_kernels, time_ms
from dlrm_scale.tools.store_timing import store_samples_on_ranks
from planner.spec.specs import GIB
from dlrm_scale.tools.fit import gb_per_s, nonnegative_lstsq
from dlrm_scale.tools.refit import refit_from_runs, write_profile, yaml_value
from dlrm_scale.run_config import this_cpu
from planner.cost.cost_model import cache_miss_ms, lookup_bwd_ms, lookup_fwd_ms
from planner.spec.errors import ConfigError


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


def embedding_samples(cfg: CalibrationConfig, embeddings: str, progress: tqdm | None = None) -> list[dict]:
    """FBGEMM's table-batched forward and backward (fused optimizer) timed as the trainer will
    run them: with `embeddings` (run_config.CPU_EMBEDDINGS) our row-wise Adagrad kernel and
    huge-page tables, or FBGEMM's kernel on the allocator's pages; and a fresh batch of ids
    every call, as training draws them (one batch repeated would find its rows in the caches)."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
        ComputeDevice,
        EmbeddingLocation,
        SplitTableBatchedEmbeddingBagsCodegen,
    )

    from dlrm_scale.kernels.cpu_adagrad import install as install_cpu_adagrad
    from dlrm_scale.kernels.huge_pages import back_with_huge_pages

    optimizer = {"rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "sgd": EmbOptimType.EXACT_SGD}[cfg.optimizer]
    ours = embeddings == "dlrm_scale"
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    samples = []
    kernel = install_cpu_adagrad(cfg.optimizer) if ours else None
    try:
        for rows in cfg.rows:
            # ids as the training data draws them: the backward's cost depends on how many repeat
            zipf = ZipfIds(rows, cfg.zipf_exponent, seed=rows)
            for dim in cfg.dims:
                tbe = SplitTableBatchedEmbeddingBagsCodegen(
                    [(rows, dim, EmbeddingLocation.HOST, ComputeDevice.CPU)], optimizer=optimizer, learning_rate=0.01
                )
                if ours:
                    back_with_huge_pages(tbe)
                for pooling in cfg.pooling_factors:
                    lookups = cfg.batch_size * pooling
                    batches = [torch.from_numpy(zipf.sample(lookups, rng).astype(np.int64)) for _ in range(2 * (cfg.repeats + 1))]
                    offsets = torch.arange(0, lookups + 1, pooling)
                    fresh = iter(batches)  # time_ms makes a warm-up call, then cfg.repeats: each takes the next batch
                    fwd = time_ms(lambda: tbe(next(fresh), offsets), cfg.repeats)

                    def step():
                        out = tbe(next(fresh), offsets)
                        out.backward(torch.ones_like(out))

                    both = time_ms(step, cfg.repeats)
                    distinct = statistics.mean(len(torch.unique(ids)) for ids in batches[1:])
                    samples.append({"rows": rows, "dim": dim, "pooling": pooling, "lookups": lookups,
                                    "distinct": int(distinct), "fwd_ms": fwd, "bwd_ms": max(both - fwd, 1e-6)})
                    if progress:
                        progress.update(1)
    finally:
        if kernel is not None:
            kernel.close()
    return samples


EMBEDDING_CONSTANTS = ("kernel_launch_ms", "lookup_fwd_ns", "lookup_bwd_ns", "lookup_bwd_row_ns", "lookup_fwd_weight_ns",
                       "lookup_bwd_weight_ns", "ddr_gb_per_s")


def fit_embedding(samples: list[dict], optimizer: str) -> dict[str, float]:
    """The constants of cost_model.lookup_fwd_ms / lookup_bwd_ms, from the formulas themselves:
    each is linear in a launch cost, costs per id, per weight looked up and per distinct row,
    and 1 / bandwidth."""

    def fwd(s, launch, fwd_ns, bwd_ns, row_ns, fwd_weight_ns, bwd_weight_ns, ms_per_byte):
        return lookup_fwd_ms(s["lookups"], s["distinct"], s["dim"], gb_per_s(ms_per_byte), launch, fwd_ns, fwd_weight_ns)

    def bwd(s, launch, fwd_ns, bwd_ns, row_ns, fwd_weight_ns, bwd_weight_ns, ms_per_byte):
        return lookup_bwd_ms(s["lookups"], s["distinct"], s["dim"], optimizer, gb_per_s(ms_per_byte), launch, bwd_ns, row_ns,
                             bwd_weight_ns)

    rows, targets = [], []
    basis = np.eye(len(EMBEDDING_CONSTANTS))
    for s in samples:
        for formula, measured in ((fwd, s["fwd_ms"]), (bwd, s["bwd_ms"])):
            zero = formula(s, *np.zeros(len(basis)))
            rows.append([formula(s, *unit) - zero for unit in basis])
            targets.append(measured)
    a, b = np.array(rows), np.array(targets)
    x = nonnegative_lstsq(a / b[:, None], np.ones_like(b))  # relative error
    fitted = dict(zip(EMBEDDING_CONSTANTS, (float(v) for v in x)))
    fitted["ddr_gb_per_s"] = gb_per_s(fitted["ddr_gb_per_s"])
    return fitted


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
        queue.close()
        queue.join_thread()  # the results are in the pipe before the process ends
    end_rank(0)


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
    """Latency, per-rank link bandwidth and the host's summing per byte of cost_model.all_to_all_ms
    / all_reduce_ms on one node: the all-reduce moves twice the all-to-all's share and sums one."""
    rows, targets = [], []
    for s in samples:
        share = s["bytes"] * (world - 1) / world
        rows.append([1.0, share, 0.0])
        targets.append(s["all_to_all_ms"])
        rows.append([1.0, 2 * share, share * 1e-6])
        targets.append(s["all_reduce_ms"])
    a, b = np.array(rows), np.array(targets)
    x = nonnegative_lstsq(a / b[:, None], np.ones_like(b))
    link = 1.0 / (max(x[1], 1e-12) * 1e6)
    return {"collective_latency_ms": float(x[0]), "intra_node_gb_per_s": link, "inter_node_gb_per_s": link,
            "reduce_byte_ns": float(x[2])}


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


# Small generated mixes trained for real, each under the plans named: (tables, rows, dim,
# pooling factor, Zipf exponent), plans ("ours" = our planner's). Few and many tables, few and
# many ids, every scheme, so each constant of the cost model shows in some phase.
CALIBRATION_MIXES = (
    ((2, 1000, 16, 1.0, 1.05), ("ours",)),
    ((16, 1000, 16, 1.0, 1.05), ("ours",)),
    ((4, 200_000, 64, 20.0, 1.05), ("ours", "row_wise", "column_wise")),
    ((4, 20_000, 32, 2.0, 1.05), ("data_parallel", "table_wise")),
)
CALIBRATION_STEPS = 60
CALIBRATION_BATCH_SIZE_PER_RANK = 512  # a measurement setting: the batch these mixes are timed at
CALIBRATION_MODEL = {"num_dense_features": 13, "dense_arch": [64, 32], "over_arch": [64, 1]}


def mix_document(mix: tuple, world: int, hardware: str) -> dict:
    """A run document (dlrm_scale.run_config) of a generated mix of identical tables."""
    from dlrm_scale.run_record import RUN_RECORD_SCHEMA

    num_tables, rows, dim, pooling, zipf = mix
    return {
        "schema": RUN_RECORD_SCHEMA, "hardware": hardware, "cluster": {"world_size": world, "ranks_per_node": world},
        "training": {"batch_size_per_rank": CALIBRATION_BATCH_SIZE_PER_RANK}, "model": CALIBRATION_MODEL,
        "train": {"steps": CALIBRATION_STEPS, "log_every": 10, "eval_batches": 1},
        "tables": [{"name": f"t{i}", "num_embeddings": rows, "embedding_dim": dim, "pooling_factor": pooling, "zipf_exponent": zipf}
                   for i in range(num_tables)],
    }


def _train_mix(rank: int, world: int, out_dir: str, doc: dict, plan_name: str, hardware: str) -> None:
    from dlrm_scale.run_record import run_from_document
    from dlrm_scale.training.trainer import Trainer
    from planner.plan.document import Plan, uniform_plan
    from planner.plan.planning import make_plan
    from planner.spec.types import ShardingType

    run = run_from_document(doc, "calibration mix", hardware)
    box = [None]
    if rank == 0:  # planned once: under its wall-clock limit a busy rank could plan otherwise
        plan = make_plan(run.problem) if plan_name == "ours" else uniform_plan(run.problem, ShardingType(plan_name))
        plan.save(Path(out_dir) / "plan.json")
        box[0] = plan.to_dict()
    dist.broadcast_object_list(box, src=0)
    plan = Plan.from_dict(box[0], source="calibration plan")
    Trainer(run, plan, torch.device("cpu"), rank, world, Path(out_dir)).run()


def calibration_runs(cfg: CalibrationConfig, profile: Path, directory: Path) -> list[Path]:
    """Train CALIBRATION_MIXES for real on `nproc` ranks, priced with `profile`; their folders."""
    from dlrm_scale.tools.launch import run_on_ranks

    folders = []
    for k, (mix, plans) in enumerate(CALIBRATION_MIXES):
        doc = mix_document(mix, cfg.nproc, str(profile))
        for plan_name in plans:
            folder = directory / f"mix{k}_{plan_name}"
            folder.mkdir()
            run_on_ranks(_train_mix, cfg.nproc, str(folder), doc, plan_name, str(profile))
            folders.append(folder)
    return folders


def fit_store(samples: list[dict], optimizer: str) -> dict[str, float]:
    """cache_id_ns from the all-hit batches, then ssd_gb_per_s and ssd_latency_us of
    planner.cost.cost_model.cache_miss_ms from what misses add, at two row widths (the
    width-dependent part is bandwidth, the rest latency), from the formula itself."""
    per_id_s = float(np.mean([s["hit_seconds"] / s["ids"] for s in samples]))

    def per_miss_ms(dim, ms_per_byte, latency_us):
        return cache_miss_ms(1.0, dim, optimizer, gb_per_s(ms_per_byte), latency_us)

    a = np.array([[per_miss_ms(s["dim"], *unit) - per_miss_ms(s["dim"], 0.0, 0.0) for unit in np.eye(2)] for s in samples])
    b = np.array([(s["seconds"] - s["ids"] * per_id_s) / s["misses"] * 1e3 for s in samples])  # ms per miss
    ms_per_byte, latency_us = nonnegative_lstsq(a, b)
    return {"ssd_gb_per_s": gb_per_s(ms_per_byte), "ssd_latency_us": float(latency_us), "cache_id_ns": per_id_s * 1e9}


def calibrate_kernels(profile: Path) -> tuple[dict[str, str], dict]:
    """Only the CPU kernel choice, written into an existing profile (its `cpu_kernels` line),
    leaving the fitted constants as they are; so a `store_io` the profile has stays (its store
    constants were fitted reading that way), and is chosen only where it has none."""
    from planner.spec.config import read_yaml

    if not profile.is_file():
        raise ConfigError(f"calibrate --kernels-only: {profile} is not a hardware profile; give an existing .yaml")
    existing = read_yaml(profile, "hardware profile").get("cpu_kernels") or {}
    kept = {"store_io": existing["store_io"]} if isinstance(existing, dict) and "store_io" in existing else {}
    kernels, times = choose_cpu_kernels(store_directory=None if kept else profile.parent)
    kernels.update(kept)
    lines = [line for line in profile.read_text().splitlines() if not line.startswith(("cpu_kernels:", "measured_on:"))]
    lines += [f"cpu_kernels: {yaml_value(kernels)}", f"measured_on: {yaml_value(this_cpu())}"]
    tmp = profile.with_name(profile.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(profile)
    return kernels, times


def calibrate(out: Path, cfg: CalibrationConfig, name: str | None = None) -> dict:
    if not out.parent.exists():
        raise ConfigError(f"calibrate: folder {out.parent} does not exist; create it or choose another --out")
    total = len(cfg.rows) * len(cfg.dims) * len(cfg.pooling_factors) + 5
    with tqdm(total=total, desc="calibrating", unit="bench") as progress:
        # the kernels first: the lookups' constants are those of the kernel the trainer will run
        kernels, kernel_times = choose_cpu_kernels(store_directory=out.parent)
        emb = embedding_samples(cfg, kernels["embeddings"], progress)
        comms = comm_samples(cfg)
        progress.update(1)
        gflops = dense_gflops()
        progress.update(1)
        update_ns = replica_update_ns(cfg)
        progress.update(1)
        store = store_samples_on_ranks(out.parent, cfg.nproc, io=kernels["store_io"])  # the store as it will read
        progress.update(1)
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        disk = shutil.disk_usage(out.parent).free
        profile = {
            "name": name or out.stem,
            "device": "cpu",
            "ranks_per_node": cfg.nproc,
            "ddr_gib_per_node": round(memory / GIB * 0.8, 1),  # leave a fifth to the OS and the dense model
            "ssd_gib_per_node": round(disk / GIB * 0.8, 1),
            "hbm_gb_per_s": 1.0,
            **fit_store(store, cfg.optimizer),
            **fit_embedding(emb, cfg.optimizer), **fit_comms(comms, cfg.nproc), "dense_gflops": gflops, "dense_update_ns": update_ns,
            "cpu_kernels": kernels,
            "measured_on": this_cpu(),
        }
        write_profile(out, profile, "# Micro-benchmarks only: `dlrm-scale calibrate` was interrupted before its training runs.\n")
        header = (
            f"# Calibrated by `dlrm-scale calibrate` on {platform.node()} ({os.cpu_count()} cores), "
            f"{datetime.date.today().isoformat()}, {cfg.nproc} ranks over gloo: micro-benchmarks, then every constant\n"
            "# refitted to the phases of small mixes trained for real (planner/cost/cost_model.py's formulas); samples in the .samples.json.\n"
        )
        with tempfile.TemporaryDirectory(dir=out.parent) as runs_dir:
            folders = calibration_runs(cfg, out, Path(runs_dir))
            progress.update(1)
            profile, fit = refit_from_runs(folders, str(out), out, header)
    out.with_suffix(".samples.json").write_text(
        json.dumps({"embedding": emb, "comms": comms, "dense_gflops": gflops, "dense_update_ns": update_ns,
                    "store_misses": store, "cpu_kernel_ms": kernel_times, "runs_fit": fit.values}, indent=1)
    )
    return profile

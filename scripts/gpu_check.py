"""The CUDA path, checked in one short run on a GPU machine (`make gpu-check`, about 8 minutes).

    python scripts/gpu_check.py --out out/gpu_check            # on a CUDA machine
    python scripts/gpu_check.py --out out/gpu_check --dry-run  # the same plumbing on CPU/gloo

Each step is a real command (`dlrm-scale plan`, `torchrun ... dlrm_scale.train`, `calibrate`,
`simulate`), run with a time limit; its log goes to OUT/<step>.log and its outcome, time and
figures to OUT/gpu_check.json, step by step, so a run cut short still leaves what it measured.
Steps: FBGEMM's lookup kernels alone (HBM, UVM cache); plan the tiny and a mid-size config for
the device; train tiny on NCCL (one rank per GPU, two where there are) with fused,
fused_uvm_caching and key_value tables, and compare their losses (the plan never changes the
model); every comm precision; more ranks than GPUs (refused in one line); checkpoint + resume
bitwise with --deterministic; the mid-size config cached and not; calibrate writing a profile
(it measures collectives: two GPUs or more); simulate against the measured run. key_value needs
an FBGEMM built with its SSD store (RocksDB): where the installed one lacks it, the step says
so.
The dry run swaps CUDA for CPU: two gloo ranks, our CPU tiers for the cached kernels, and no fp8
(FBGEMM's CPU codec fails), to check the script itself where no GPU is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dlrm_scale.run_config import load_problem  # noqa: E402
from planner.spec.config import read_yaml
from planner.plan.document import Plan, table_layout
from planner.spec.types import ShardingType

TINY, MID = "configs/tiny.yaml", "configs/bench_kaggle_shaped.yaml"
CACHED = {"fused_uvm_caching": ("ddr", 0.5), "key_value": ("ssd", 0.5)}
CACHE_HEADROOM = 8
# FBGEMM's table-batched lookup alone, forward + backward with its fused SGD, in HBM and in UVM
# behind a 20% cache: the kernels every training step runs, timed before anything is built on them
LOOKUP = """
import json, time, torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen
rows, dim, tables, batch, ids = 100_000, 64, 2, 4096, 8
figures = {}
for where in (EmbeddingLocation.DEVICE, EmbeddingLocation.MANAGED_CACHING):
    tbe = SplitTableBatchedEmbeddingBagsCodegen([(rows, dim, where, ComputeDevice.CUDA)] * tables, cache_load_factor=0.2)
    indices = torch.randint(0, rows, (tables * batch * ids,), device="cuda")
    offsets = torch.arange(0, indices.numel() + 1, ids, device="cuda")
    times = []
    for step in range(23):
        torch.cuda.synchronize()
        started = time.perf_counter()
        tbe(indices, offsets).sum().backward()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e3)
    figures[where.name.lower() + "_fwd_bwd_ms"] = sorted(times[3:])[10]  # median after 3 warm-ups
print(json.dumps(figures))
"""


class Check:
    """Runs the steps, each a command with a time limit, and records them as it goes."""

    def __init__(self, out: Path, dry_run: bool, steps: int | None) -> None:
        import torch

        self.out, self.dry_run = out, dry_run
        self.device = "cpu" if dry_run else "cuda"
        self.hardware = "cpu_gloo" if dry_run else "h100_dgx"
        self.gpus = 0 if dry_run else torch.cuda.device_count()
        self.nproc = 2 if dry_run else min(2, self.gpus)
        self.steps = steps or (40 if dry_run else 300)
        self.record: dict = {"dry_run": dry_run, "steps": {}, "environment": environment()}
        self.store = Path(tempfile.mkdtemp(prefix="gpu_check_store_"))

    def save(self) -> None:
        (self.out / "gpu_check.json").write_text(json.dumps(self.record, indent=1) + "\n")

    def run(self, name: str, cmd: list[str], timeout_s: int = 240, expect_exit: int = 0) -> bool:
        started = time.perf_counter()
        with open(self.out / f"{name}.log", "w") as log:
            try:
                code = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s,
                                      env={**os.environ, "OMP_NUM_THREADS": "1"}).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        ok = code == expect_exit
        self.record["steps"][name] = {"ok": ok, "exit": code, "seconds": round(time.perf_counter() - started, 1),
                                      "command": " ".join(cmd)}
        self.save()
        print(f"{'ok  ' if ok else 'FAIL'} {name} ({self.record['steps'][name]['seconds']} s)", flush=True)
        return ok

    def note(self, name: str, **figures) -> None:
        self.record["steps"].setdefault(name, {}).update(figures)
        self.save()

    # ---- the pieces ---------------------------------------------------------------------
    def config(self, base: str) -> str:
        """`base` on this device's hardware profile (the trainer reads the profile's kernels)."""
        doc = read_yaml(ROOT / base, "config")
        doc["hardware"] = self.hardware
        doc.setdefault("cluster", {})["world_size"] = self.nproc
        path = self.out / f"{Path(base).stem}_{self.device}.yaml"
        path.write_text(json.dumps(doc))  # JSON is YAML
        return str(path)

    def cached_plan(self, config: str, kernel: str) -> str:
        """Every table table-wise; those with CACHE_HEADROOM times more rows than a batch looks up
        in `kernel`'s tier behind a cache (a smaller one needs most of its rows every batch)."""
        problem = load_problem(config, cluster_overrides={"world_size": self.nproc, "ranks_per_node": self.nproc,
                                                          "device": self.device})
        tier, load_factor = CACHED[kernel]
        tables = {t.name: table_layout(t, ShardingType.TABLE_WISE, [i % self.nproc], tier, load_factor)
                  if t.num_embeddings >= CACHE_HEADROOM * t.pooling_factor * problem.training.batch_size_per_rank * self.nproc else
                  table_layout(t, ShardingType.TABLE_WISE, [i % self.nproc], "hbm" if self.device == "cuda" else "ddr")
                  for i, t in enumerate(problem.tables)}
        path = self.out / f"plan_{Path(config).stem}_{kernel}.json"
        Plan(self.nproc, self.nproc, tables, (), 0.0, 0.0).save(path)
        return str(path)

    def skip(self, name: str, why: str) -> None:
        self.note(name, ok=None, skipped=why)
        print(f"skip {name}: {why}", flush=True)

    def train(self, name: str, config: str, plan: str, *flags: str, nproc: int | None = None, steps: int | None = None,
              expect_exit: int = 0) -> dict | None:
        out = self.out / name
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc or self.nproc),
               "-m", "dlrm_scale.train", "--config", config, "--plan", plan, "--steps", str(steps or self.steps),
               "--out-dir", str(out), "--store-dir", str(self.store), *flags]
        if not self.run(name, cmd, expect_exit=expect_exit) or expect_exit:
            return None
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        windows = [r for r in records if "samples_per_s" in r][1:] or [r for r in records if "samples_per_s" in r]
        figures = {"samples_per_s": sorted(r["samples_per_s"] for r in windows)[len(windows) // 2],
                   "step_ms": sorted(r["step_ms"] for r in windows)[len(windows) // 2],
                   "losses": [r["loss"] for r in records if "loss" in r],
                   "auc": ([r["auc"] for r in records if "auc" in r] or [None])[-1]}
        self.note(name, **{k: v for k, v in figures.items() if k != "losses"})
        return figures


def environment() -> dict:
    import torch

    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.cuda.is_available()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["gpus"] = torch.cuda.device_count()
    for package in ("fbgemm_gpu", "torchrec"):
        try:
            env[package] = __import__(package).__version__
        except Exception as e:  # noqa: BLE001 (recorded, not raised: the record says what is missing)
            env[package] = f"missing ({type(e).__name__})"
    return env


def fbgemm_ssd_store() -> bool:
    """Whether the installed FBGEMM has its SSD store (PyPI's CUDA wheels are built without RocksDB)."""
    import torch
    import fbgemm_gpu  # noqa: F401 (registers FBGEMM's classes)

    try:
        torch.classes.fbgemm.EmbeddingRocksDBWrapper
        return True
    except (RuntimeError, AttributeError):
        return False


def max_rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b)) if a and len(a) == len(b) else float("nan")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="out/gpu_check")
    parser.add_argument("--dry-run", action="store_true", help="CPU/gloo: check the script where no GPU is")
    parser.add_argument("--steps", type=int, help="steps of each full training run (default 300; dry run 40)")
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    c = Check(out, args.dry_run, args.steps)
    if not args.dry_run and not c.record["environment"]["cuda"]:
        print("no CUDA device: run on a GPU machine, or pass --dry-run", file=sys.stderr)
        return 2
    if not args.dry_run and c.run("fbgemm_lookup", [sys.executable, "-c", LOOKUP]):
        c.note("fbgemm_lookup", **json.loads([line for line in (out / "fbgemm_lookup.log").read_text().splitlines()
                                               if line.startswith("{")][-1]))
    tiny, mid = c.config(TINY), c.config(MID)
    cli = [sys.executable, "-m", "dlrm_scale.cli"]
    plans = {}
    for name, config in (("tiny", tiny), ("mid", mid)):
        plans[name] = str(out / f"plan_{name}.json")
        c.run(f"plan_{name}", [*cli, "plan", config, "--device", c.device, "--world-size", str(c.nproc),
                               "--time-limit", "5", "--out", plans[name]])
    # tiny: the planner's plan, then every table cached in DDR and on SSD; same seed, same model
    det = ["--deterministic", "--seed", "3"]
    fused = c.train("train_tiny_fused", tiny, plans["tiny"], *det)
    for kernel in CACHED:
        if kernel == "key_value" and not args.dry_run and not fbgemm_ssd_store():
            c.skip(f"train_tiny_{kernel}", "this FBGEMM has no SSD store (EmbeddingRocksDBWrapper): built without RocksDB")
            continue
        run = c.train(f"train_tiny_{kernel}", tiny, c.cached_plan(tiny, kernel), *det)
        if fused and run:
            c.note(f"train_tiny_{kernel}", max_rel_loss_diff_vs_fused=max_rel_diff(run["losses"], fused["losses"]))
    for precision in ("fp16", "bf16", "int8", "fp8"):
        if args.dry_run and precision == "fp8":
            c.skip("comms_fp8", "FBGEMM's fp8 codec runs on CUDA only")
            continue
        # one layout for every precision (the plan was priced for fp32)
        c.train(f"comms_{precision}", tiny, plans["tiny"], "--comm-precision", precision, "--ignore-plan-inputs", steps=60)
    if not args.dry_run:  # a rank per GPU (NCCL refuses two on one): more ranks are refused in one line
        c.train("more_ranks_than_gpus", tiny, plans["tiny"], nproc=c.gpus + 1, steps=20, expect_exit=1)  # torchrun's exit
        refused = "has no GPU of its own" in (out / "more_ranks_than_gpus.log").read_text()
        c.note("more_ranks_than_gpus", ok=c.record["steps"]["more_ranks_than_gpus"]["ok"] and refused, refused_in_one_line=refused)
    # checkpoint + resume, bitwise
    ck = out / "ckpt"
    ck.mkdir(exist_ok=True)
    whole = c.train("resume_whole", tiny, plans["tiny"], *det, "--checkpoint-dir", str(out / "ckpt_whole"), steps=60)
    c.train("resume_first_half", tiny, plans["tiny"], *det, "--checkpoint-dir", str(ck), steps=30)
    second = c.train("resume_second_half", tiny, plans["tiny"], *det, "--checkpoint-dir", str(ck), "--resume", steps=60)
    if whole and second:
        c.note("resume_second_half", bitwise=second["losses"] == whole["losses"][30:])
    # mid-size: fused and cached, samples/s; then the cost model against the measured run
    c.train("train_mid_fused", mid, plans["mid"], steps=c.steps // 2)
    c.train("train_mid_fused_uvm_caching", mid, c.cached_plan(mid, "fused_uvm_caching"), steps=c.steps // 2)
    if c.nproc < 2:
        c.skip("calibrate", "calibrate measures collectives between two ranks: one GPU here")
    else:
        c.run("calibrate", [*cli, "calibrate", "--out", str(out / f"{c.device}_profile.yaml"), "--quick", "--nproc", str(c.nproc)],
              timeout_s=300)
    if c.run("simulate_tiny", [*cli, "simulate", plans["tiny"], "--config", tiny, "--json", str(out / "simulate_tiny.json")]) and fused:
        predicted = json.loads((out / "simulate_tiny.json").read_text())["step_ms"]
        c.note("simulate_tiny", predicted_step_ms=predicted, measured_step_ms=fused["step_ms"],
               predicted_over_measured=predicted / fused["step_ms"])
    failed = [n for n, s in c.record["steps"].items() if s.get("ok") is False]
    c.record["passed"] = not failed
    c.save()
    skipped = sum(s.get("ok") is None for s in c.record["steps"].values())
    print(f"{len(c.record['steps']) - len(failed) - skipped} of {len(c.record['steps'])} steps passed, {skipped} skipped; "
          f"{out / 'gpu_check.json'}")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

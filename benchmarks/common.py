"""What every benchmark shares: where results go and what each result file says of itself."""

from __future__ import annotations

import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from dlrm_scale.kernels.cpu_extension import built as cpu_kernels_built
from dlrm_scale.run_config import this_cpu

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"


def machine() -> str:
    """CPU (as a calibrated profile records it: name, family and model; the name alone, "AMD EPYC",
    does not tell one generation from the next on these VMs), kernel and THP mode: the speed
    figures are facts of this machine."""
    cpu = this_cpu()
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    gpus = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True).stdout.split("\n") \
        if shutil.which("nvidia-smi") else []
    gpus = [g for g in gpus if g.strip()]
    return (f"{cpu}, {os.cpu_count()} cores, Linux {os.uname().release}, THP {thp.read_text().strip() if thp.exists() else 'n/a'}"
            + (f", {len(gpus)}x {gpus[0]}" if gpus else ""))


def commit() -> str:
    """The checkout's commit, marked when its tracked code differs from it (results and docs aside)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!benchmarks/results", ":!docs", ":!*.md")
    return head + ("+changes" if changed else "")


def provenance() -> dict[str, str]:
    """The command that reproduces a result, the machine, the date and the commit."""
    module = Path(sys.argv[0]).with_suffix("").name
    return {"command": " ".join(["python -m benchmarks." + module, *sys.argv[1:]]), "machine": machine(),
            "date": datetime.date.today().isoformat(), "commit": commit()}


def write_result(path: str | Path, doc: dict[str, Any]) -> None:
    """A benchmark's result file, its provenance (this run's) first; a provenance in `doc`, read
    back from the file a benchmark adds to, is the run before's and is replaced."""
    rest = {k: v for k, v in doc.items() if k != "provenance"}
    Path(path).write_text(json.dumps({"provenance": provenance(), **rest}, indent=1) + "\n")


def train_job(args: list[str], out: Path) -> tuple[float, list[dict]]:
    """`dlrm-scale train` on 2 ranks as a user runs it, with `args` and its --out-dir `out`: its
    wall time, start to exit, and the records of its metrics.jsonl; one line if it fails."""
    # dlrm_scale's CPU extension built (or found built; the module keeps it) before the clock starts:
    # the first job to load it from a checkout at another path than the last build's compiles every
    # source, 60 s of a 2-core machine. Its include paths are the interpreter's, so this finds the
    # jobs' build only when run by the virtual environment's python by the path the jobs' torchrun
    # takes (a symlinked copy of it builds again).
    cpu_kernels_built()
    cmd = [sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", *args, "--out-dir", str(out)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{out.name}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]

"""torchrun --max-restarts: a rank killed with SIGKILL costs only the steps since the last
checkpoint, and the job ends with the same model as one never killed (deterministic mode)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

pytestmark = pytest.mark.distributed
STEPS, EVERY, KILL_AFTER = 120, 20, 50


def command(tmp: Path, name: str, restarts: int) -> list[str]:
    (tmp / f"{name}_ck").mkdir(exist_ok=True)  # --resume needs the directory to exist
    # --standalone: c10d rendezvous; the static one hands restarted workers stale gloo addresses
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", f"--max-restarts={restarts}",
            "-m", "dlrm_scale.train", "--config", "configs/tiny.yaml", "--steps", str(STEPS), "--deterministic",
            "--checkpoint-dir", str(tmp / f"{name}_ck"), "--checkpoint-every", str(EVERY), "--resume",
            "--out-dir", str(tmp / name)]


def logged_steps(metrics: Path) -> list[int]:
    if not metrics.exists():
        return []
    return [json.loads(l)["step"] for l in metrics.read_text().splitlines() if '"loss"' in l]


def rank_pid(agent: int, rank: int) -> int | None:
    children = subprocess.run(["pgrep", "-P", str(agent)], capture_output=True, text=True).stdout.split()
    for pid in children:
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"RANK={rank}".encode() in env:
            return int(pid)
    return None


def final_model(ck: Path, tmp: Path) -> dict:
    out = tmp / f"{ck.name}.pt"
    dcp_to_torch_save(str(ck / f"step_{STEPS:09d}"), str(out))
    return torch.load(out, weights_only=False)["model"]


ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    """The final model of a run never killed."""
    tmp = tmp_path_factory.mktemp("reference")
    ref = subprocess.run(command(tmp, "ref", 0), capture_output=True, text=True, env=ENV, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    return final_model(tmp / "ref_ck", tmp)


def assert_same_model(reference: dict, model: dict) -> None:
    assert reference.keys() == model.keys()
    for key, value in reference.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, model[key]), key


def test_killed_rank_restarts_from_newest_checkpoint(tmp_path, reference):
    env = ENV

    log = open(tmp_path / "job.log", "w")  # a file, not a pipe: nobody reads a pipe while we poll, and a full one blocks the job
    job = subprocess.Popen(command(tmp_path, "job", 1), stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    deadline = time.time() + 300
    while max(logged_steps(tmp_path / "job" / "metrics.jsonl"), default=0) < KILL_AFTER:
        assert time.time() < deadline and job.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    victim = rank_pid(job.pid, 1)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    job.wait(timeout=600)
    log.close()
    out = (tmp_path / "job.log").read_text()
    assert job.returncode == 0, out[-3000:]

    resumed = re.findall(r"resumed from \S+ \(step (\d+)\)", out)
    assert resumed, out[-2000:]
    steps = logged_steps(tmp_path / "job" / "metrics.jsonl")
    killed_at = max(s for s in steps[: steps.index(int(resumed[0]) + 1, 1)])  # last step logged before the restart
    assert int(resumed[0]) % EVERY == 0 and killed_at - int(resumed[0]) <= EVERY  # lost at most the steps since it
    assert steps[-1] == STEPS

    assert_same_model(reference, final_model(tmp_path / "job_ck", tmp_path))


def launcher_command(tmp: Path) -> list[str]:
    """The same job through `dlrm-scale train`, our launcher."""
    return [sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", *command(tmp, "job", 0)[9:]]


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_killing_the_launcher_leaves_no_worker_behind_and_resume_is_exact(tmp_path, reference):
    """Workers run in process groups of their own: killing the launcher's group must still end
    them (they die with torchrun's agent), so nothing writes to the checkpoint directory after,
    and the next --resume ends with the model of a run never killed."""
    log = open(tmp_path / "job.log", "w")
    job = subprocess.Popen(launcher_command(tmp_path), stdout=log, stderr=subprocess.STDOUT, env=ENV, start_new_session=True)
    deadline = time.time() + 300
    while max(logged_steps(tmp_path / "job" / "metrics.jsonl"), default=0) < KILL_AFTER:
        assert time.time() < deadline and job.poll() is None, "the job ended before it could be killed"
        time.sleep(0.05)
    agents = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
    workers = [int(w) for a in agents for w in subprocess.run(["pgrep", "-P", a], capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2
    os.killpg(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.time() + 20
    while any(alive(w) for w in workers):
        assert time.time() < deadline, "a worker outlived its launcher"
        time.sleep(0.1)
    log.close()
    checkpoints = sorted(p.name for p in (tmp_path / "job_ck").iterdir())
    time.sleep(1)
    assert sorted(p.name for p in (tmp_path / "job_ck").iterdir()) == checkpoints  # nobody writes there any more

    resumed = subprocess.run(launcher_command(tmp_path), capture_output=True, text=True, env=ENV, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert re.search(r"resumed from \S+ \(step (\d+)\)", resumed.stdout + resumed.stderr)
    assert_same_model(reference, final_model(tmp_path / "job_ck", tmp_path))

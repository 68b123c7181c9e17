"""Preemption as a cluster delivers it, on real processes: SIGTERM to `dlrm-scale train` or to
torchrun stops the job at an agreed step with a checkpoint of it, leaves no process behind, and a
resume goes on bitwise as if never stopped."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlrm_scale.training.checkpoint import verify
from dlrm_scale.training.preemption import EXIT_CODE

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parent.parent


def train(tmp_path: Path, out: str, steps: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", "--config", "configs/tiny.yaml",
            "--steps", str(steps), "--deterministic", "--checkpoint-dir", str(tmp_path / "ck"), "--out-dir", str(tmp_path / out), *extra]


def losses(out_dir: Path) -> dict[int, float]:
    """The losses logged so far; a line still being written (no newline yet) is not read."""
    lines = (out_dir / "metrics.jsonl").read_text().split("\n")[:-1]
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if "loss" in r}


def wait_for_step(out_dir: Path, step: int, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if (out_dir / "metrics.jsonl").exists() and max(losses(out_dir), default=0) >= step:
            return
        time.sleep(0.2)
    raise AssertionError(f"the job did not reach step {step}")


def workers(out_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in (out_dir / ".workers").glob("*.pid")]


def children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


@pytest.mark.parametrize("target", ["launcher", "torchrun"])
def test_a_sigterm_stops_at_a_checkpoint_and_the_resume_is_bitwise(tmp_path, target):
    proc = subprocess.Popen(train(tmp_path, "stopped", 100_000), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "stopped", 40, proc)
    pids = workers(tmp_path / "stopped")
    assert len(pids) == 2
    os.kill(proc.pid if target == "launcher" else children(proc.pid)[0], signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_CODE, err[-3000:]
    line = err.strip().splitlines()[-1]
    step = int(line.split("after step ")[1].split(":")[0])
    assert line == (f"stopped by SIGTERM after step {step}: checkpoint {tmp_path / 'ck' / f'step_{step:09d}'}; "
                    f"resume with the same command and --resume")
    assert verify(tmp_path / "ck" / f"step_{step:09d}") is None
    assert max(losses(tmp_path / "stopped")) == step  # every step trained is in the checkpoint: none lost
    time.sleep(1)
    assert not [p for p in pids if Path(f"/proc/{p}").exists()]  # no worker outlives the launcher
    resumed = subprocess.run(train(tmp_path, "resumed", step + 20, "--resume"), cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole = subprocess.run(train(tmp_path / "whole", "whole", step + 20), cwd=ROOT, capture_output=True, text=True)
    assert whole.returncode == 0, whole.stderr[-3000:]
    expected = losses(tmp_path / "whole" / "whole")
    assert {s: expected[s] for s in losses(tmp_path / "stopped")} == losses(tmp_path / "stopped")
    assert losses(tmp_path / "resumed") == {s: v for s, v in expected.items() if s > step}  # bitwise


def test_a_stopped_rank_ends_the_job_within_the_timeout_naming_it(tmp_path):
    """SIGSTOP one rank: its peer stops waiting after --collective-timeout, names it and the step,
    and no process is left."""
    proc = subprocess.Popen(train(tmp_path, "hung", 100_000, "--collective-timeout", "5"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "hung", 40, proc)
    pids = {int(p.stem.rsplit("rank", 1)[1]): int(p.read_text()) for p in (tmp_path / "hung" / ".workers").glob("*.pid")}
    os.kill(pids[1], signal.SIGSTOP)
    start = time.monotonic()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    line = next(l for l in err.splitlines() if l.startswith("error: rank 0 waited 5 s at step"))
    assert "for rank 1, which stopped answering; the job stops (resume with --resume" in line, line
    # the timeout, the peers' answer, and torchrun's own grace before it kills the stopped rank (30 s)
    assert time.monotonic() - start < 5 + 3 + 30 + 30
    time.sleep(1)
    assert not [p for p in pids.values() if Path(f"/proc/{p}").exists()]


def test_a_workers_error_is_the_launchers_one_line_and_torchruns_report_goes_to_the_log(tmp_path):
    """Every checkpoint damaged: the ranks find it only once they run. The terminal gets one line
    and exit 2; torchrun's banner and traceback are in the run's launcher.log."""
    made = subprocess.run(train(tmp_path, "first", 20, "--checkpoint-every", "10"), cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    for f in (tmp_path / "ck").glob("step_*/*.distcp"):
        f.write_bytes(f.read_bytes()[:100])
    r = subprocess.run(train(tmp_path, "again", 40, "--resume"), cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: no checkpoint in"), r.stderr[-2000:]
    assert "ChildFailedError" in (tmp_path / "again" / "launcher.log").read_text()


def test_a_checkpoint_of_other_tables_is_refused_before_launch(tmp_path):
    made = subprocess.run(train(tmp_path, "first", 10), cwd=ROOT, capture_output=True, text=True)
    assert made.returncode == 0, made.stderr[-2000:]
    config = tmp_path / "wider.yaml"
    config.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace("embedding_dim: 16", "embedding_dim: 32", 1))
    cmd = train(tmp_path, "again", 20, "--resume")
    cmd[cmd.index("configs/tiny.yaml")] = str(config)
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert "cannot be resumed under this config: table" in r.stderr and "x 16 there" in r.stderr and "x 32 here" in r.stderr
    assert not (tmp_path / "again" / "launcher.log").exists()  # refused before torchrun started


def test_without_checkpoint_on_signal_a_stop_saves_nothing(tmp_path):
    proc = subprocess.Popen(train(tmp_path, "o", 100_000, "--no-checkpoint-on-signal"), cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for_step(tmp_path / "o", 20, proc)
    os.kill(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == EXIT_CODE, err[-2000:]
    assert err.strip().endswith("nothing was saved (no --checkpoint-dir, or --no-checkpoint-on-signal)")
    assert not list((tmp_path / "ck").glob("step_*"))


def test_gloos_words_for_a_peer_gone_are_recognised():
    from dlrm_scale.training.watchdog import peer_failure

    for message in ("[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 5000ms for recv operation to complete",
                    "Application timeout caused pair closure", "[gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:1"):
        assert peer_failure(RuntimeError(message)), message
    assert not peer_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied")) and not peer_failure(ValueError("timeout"))

"""The trainer's user errors: one line, exit code 2, before any training starts."""

import json
import re
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dlrm_scale.run_config import TrainConfig, parse_comm_precision
from dlrm_scale.training.lr_schedule import lr_factor
from planner.spec.errors import ConfigError
from planner.plan.document import Plan


def torchrun(*args, timeout=180):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "-m", "dlrm_scale.train", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_comm_precision_parsing():
    assert parse_comm_precision("fwd=fp16,bwd=bf16") == ("fp16", "bf16")
    assert parse_comm_precision("int8") == ("int8", "int8")
    assert parse_comm_precision("fwd=fp8") == ("fp8", "fp32")  # NCCL's codec; refused on CPU (tests/test_bad_input.py)
    with pytest.raises(ConfigError, match="fp4"):
        parse_comm_precision("fwd=fp4")


def test_cpu_kernel_choices_are_validated():
    assert TrainConfig().cpu_embeddings is None and TrainConfig().interaction is None  # the profile's measured choice
    assert TrainConfig().store_io is None
    with pytest.raises(ConfigError, match="store_io 'page_cache' is not one of pread, mapped, direct"):
        TrainConfig(store_io="page_cache")
    with pytest.raises(ConfigError, match="cpu_embeddings 'mkl' is not one of dlrm_scale, fbgemm"):
        TrainConfig(cpu_embeddings="mkl")
    with pytest.raises(ConfigError, match="interaction 'fast' is not one of dlrm_scale, torchrec"):
        TrainConfig(interaction="fast")
    with pytest.raises(ConfigError, match="prefetch_batches must be an integer >= 0"):
        TrainConfig(prefetch_batches=-1)


def test_learning_rate_schedule_follows_mlperf():
    cfg = TrainConfig(warmup_steps=4, decay_start_step=10, decay_steps=10)
    assert [lr_factor(cfg, s) for s in range(4)] == [0.25, 0.5, 0.75, 1.0]
    assert lr_factor(cfg, 9) == 1.0
    assert lr_factor(cfg, 15) == pytest.approx(0.25)
    assert lr_factor(cfg, 25) == 0.0


def test_plan_for_another_world_size_is_refused(tmp_path: Path):
    plan = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", "configs/tiny.yaml", "--world-size", "4",
                        "--ranks-per-node", "4", "--out", str(plan)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = torchrun("--config", "configs/tiny.yaml", "--plan", str(plan), "--steps", "2", "--out-dir", str(tmp_path / "o"))
    assert r.returncode != 0
    assert "error: plan is for 4 ranks but the job has 2; re-plan with --world-size 2" in r.stderr
    assert "dlrm_scale/" not in r.stderr  # torchrun reports the failed child; our code raised nothing
    # dlrm-scale train checks the same before starting torchrun: one line, exit 2
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", "--config", "configs/tiny.yaml",
                        "--plan", str(plan)], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == ["error: plan is for 4 ranks but the job has 2; re-plan with --world-size 2"]


def test_training_writes_metrics_with_auc(tmp_path: Path):
    out = tmp_path / "o"
    r = torchrun("--config", "configs/tiny.yaml", "--steps", "200", "--out-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in records if "samples_per_s" in x]
    assert steps and all({"step", "loss", "samples_per_s", "comm_bytes"} <= set(x) for x in steps)
    # every rank's measured embedding bytes equal the plan's count at fp32
    assert all(x["comm_bytes"] == x["comm_bytes_predicted"] and len(x["comm_bytes"]) == 2 for x in steps)
    assert all(x["comm_bytes_across_nodes"] == [0, 0] for x in steps)
    final = [x for x in records if "auc" in x][-1]
    assert final["step"] == 200 and final["auc"] > 0.7
    assert (out / "plan.json").exists()
    assert list((out / "tensorboard").glob("events.out.tfevents.*"))


def test_training_on_criteo_tsv_with_bad_lines(tmp_path: Path):
    from tests.criteo_fixture import BAD_LINES, write_criteo_tsv

    data = write_criteo_tsv(tmp_path / "day_0.tsv", 3000, {10: BAD_LINES[1], 2000: BAD_LINES[4]})
    config = tmp_path / "criteo_small.yaml"
    config.write_text(
        "hardware: cpu_gloo\ntraining: {batch_size_per_rank: 64}\n"
        "model: {num_dense_features: 13, dense_arch: [16], over_arch: [16, 1]}\n"
        "train: {log_every: 5, eval_batches: 2}\ntables:\n"
        + "".join(f"  - {{name: c{i}, num_embeddings: {500 + i}, embedding_dim: 8}}\n" for i in range(26))
    )
    out = tmp_path / "o"
    r = torchrun("--config", str(config), "--data", "criteo", "--data-path", str(data), "--steps", "20", "--out-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"{data}:10" in r.stderr and f"{data}:2000" in r.stderr
    records = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records if "loss" in x] == [5, 10, 15, 20]
    assert 0.0 <= [x for x in records if "auc" in x][-1]["auc"] <= 1.0


def test_int8_comms_on_a_table_wise_plan(tmp_path: Path):
    from dlrm_scale.run_config import load_problem
    from planner.plan.document import Plan, table_layout
    from planner.spec.types import ShardingType

    problem = load_problem("configs/tiny.yaml")  # the planner makes it data-parallel at int8: no all-to-all to measure
    tables = {t.name: table_layout(t, ShardingType.TABLE_WISE, [k % 2], "ddr") for k, t in enumerate(problem.tables)}
    plan = tmp_path / "tw.json"
    Plan(2, 2, tables, (), 0.0, 0.0).save(plan)
    out = tmp_path / "o"
    r = torchrun("--config", "configs/tiny.yaml", "--plan", str(plan), "--steps", "20", "--comm-precision", "int8", "--out-dir", str(out))
    assert r.returncode == 0, r.stderr[-3000:]
    steps = [json.loads(l) for l in (out / "metrics.jsonl").read_text().splitlines() if "comm_bytes" in l]
    # dim 16: 16 payload bytes per row plus the codec's per-row scale and bias, against 64 in fp32
    assert all(0 < c < 0.5 * f for x in steps for c, f in zip(x["comm_bytes"], x["comm_bytes_fp32_predicted"]))


def test_training_on_a_profile_measured_on_another_cpu_says_so_once(tmp_path: Path):
    """Its kernels and constants are another machine's: one warning line (rank 0's) naming both
    CPUs and the fix, and the run goes on."""
    profile = tmp_path / "elsewhere.yaml"
    profile.write_text(Path("configs/hardware/cpu_gloo.yaml").read_text() + 'measured_on: "Some Other CPU (family 25, model 17)"\n')
    config = tmp_path / "c.yaml"
    config.write_text(Path("configs/tiny.yaml").read_text().replace("hardware: cpu_gloo", f"hardware: {profile}"))
    r = torchrun("--config", str(config), "--steps", "2", "--out-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-3000:]
    # on stdout: under dlrm-scale train the workers' stderr goes to the run's log
    assert r.stdout.count("warning: hardware profile") == 1 and "Some Other CPU (family 25, model 17)" in r.stdout
    assert "calibrate --kernels-only" in r.stdout


def test_int8_with_row_wise_tables_is_refused(tmp_path: Path):
    from dlrm_scale.run_config import load_problem
    from planner.plan.document import Plan, table_layout
    from planner.spec.types import ShardingType

    problem = load_problem("configs/tiny.yaml")
    tables = {t.name: table_layout(t, ShardingType.ROW_WISE, [0, 1], "ddr") for t in problem.tables}
    plan = tmp_path / "rw.json"
    Plan(2, 2, tables, (), 0.0, 0.0).save(plan)
    r = torchrun("--config", "configs/tiny.yaml", "--plan", str(plan), "--comm-precision", "int8", "--steps", "2", "--out-dir", str(tmp_path / "o"))
    assert r.returncode != 0
    assert "error: int8 comms cannot run with row-wise table 't_large'" in r.stderr


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path):
    config = tmp_path / "explode.yaml"
    config.write_text(Path("configs/tiny.yaml").read_text().replace("embedding_lr: 0.05", "embedding_lr: 1.0e+30")
                      .replace("dense_lr: 0.05", "dense_lr: 1.0e+30"))
    ck = tmp_path / "ck"
    r = torchrun("--config", str(config), "--steps", "50", "--checkpoint-dir", str(ck), "--checkpoint-every", "1", "--out-dir", str(tmp_path / "o"))
    assert r.returncode != 0
    m = re.search(r"error: loss is not finite at step (\d+); training stopped and the newest good checkpoint is (\S+) \(step (\d+)\); lower the learning rates", r.stderr)
    assert m, r.stderr[-2000:]
    bad, kept = int(m.group(1)), int(m.group(3))
    assert kept == bad - 1
    from dlrm_scale.training.checkpoint import complete_checkpoints

    assert complete_checkpoints(ck)[-1][0] == kept


def test_plan_made_for_another_batch_is_refused_before_torchrun(tmp_path: Path):
    plan = tmp_path / "p.json"
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", "configs/tiny.yaml", "--out", str(plan)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", "--config", "configs/tiny.yaml",
                        "--plan", str(plan), "--batch-size", "128", "--out-dir", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"error: plan {plan} does not fit this run: it was made for batch_size_per_rank 256, "
                                             f"this run has 128; re-plan for it with 'dlrm-scale plan', or pass --ignore-plan-inputs "
                                             f"to train it anyway"]
    assert not (tmp_path / "o" / "metrics.jsonl").exists()
    # on purpose (one layout at another batch): it trains, saying what differs
    r = torchrun("--config", "configs/tiny.yaml", "--plan", str(plan), "--batch-size", "128", "--ignore-plan-inputs",
                 "--steps", "4", "--out-dir", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"warning: training plan {plan} though it was made for batch_size_per_rank 256, this run has 128" in r.stdout
    # and a plan can be made for the run in the first place
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "plan", "configs/tiny.yaml", "--batch-size", "128",
                        "--comm-precision", "fwd=fp16,bwd=bf16", "--out", str(plan)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert Plan.load(plan).inputs.fwd_comm_precision == "fp16" and Plan.load(plan).inputs.batch_size_per_rank == 128

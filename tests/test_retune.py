"""A job that tunes itself (--retune): the decision rule, a decision from a recorded run, the
move through a checkpoint on real gloo ranks (the model goes on as if it never moved), and the
synthetic data whose hot set moves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import weakref
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dlrm_scale.run_config import this_cpu
from dlrm_scale.tuning.decide import FITTED_PROFILE, MIN_GAIN, Candidate, MoveCost, choose, decide
from planner.plan.document import Plan
from planner.replan.replan import Replanned
from tests.test_plan_invariance import GLOBAL_BATCH, SEED, TABLES, plan_of, problem

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "recorded_runs" / "run0_table_wise"


# ---- the rule ------------------------------------------------------------------------------------
def point(name: str, moved: int, ms: float, measured: bool = False, guess: bool = False) -> Candidate:
    return Candidate(Replanned(plan_of(name), moved, None, 0.0), ms, measured, guess)


def test_a_move_is_taken_only_when_it_saves_more_than_the_measurement_can_tell_and_pays_for_itself():
    running = plan_of("table_wise@2")
    other = [point("mixed@2", 10**9, 8.0)]
    move, why, chosen, gain_s, measure_on = choose(running, 10.0, 10.0, other, steps_left=10_000, move_s=5.0, spread=0.01)
    assert move and chosen.point.plan.tables == plan_of("mixed@2").tables and gain_s == pytest.approx(20.0) and "20.0% of the step" in why
    # 20% saved, but the windows differ by 25%: the gain may be noise, which more windows can tell
    noisy = choose(running, 10.0, 10.0, other, 10_000, 5.0, spread=0.25)
    assert not noisy.move and noisy.measure_on and noisy.why.endswith("under the 25.0% a measurement can tell; measuring on")
    # ... but not a gain that would not pay for its move even if it were real
    assert not choose(running, 10.0, 10.0, other, 100, 5.0, spread=0.25).measure_on
    # below MIN_GAIN, however steady the windows (and more windows do not change what the model can tell)
    small = choose(running, 10.0, 10.0, [point("mixed@2", 1, 10.0 * (1 - MIN_GAIN / 2))], 10**6, 0.0, 0.0)
    assert not small.move and not small.measure_on
    # 2 ms x 100 steps = 0.2 s does not pay for a 5 s move (x 10,000 steps, 20 s, does)
    move, why, *_ = choose(running, 10.0, 10.0, other, 100, 5.0, 0.01)
    assert not move and "under the 5.0 s a move costs" in why
    # every other layout slower: said as such, and nothing to measure on
    slower = choose(running, 10.0, 10.0, [point("mixed@2", 1, 12.0, measured=True)], 10_000, 0.0, 0.5)
    assert not slower.move and not slower.measure_on and slower.why == "no other layout is faster (the best, 20.0% slower as measured)"
    # the replan keeps the layout: nothing to move to
    assert choose(running, 10.0, 10.0, [point("table_wise@2", 0, 10.0)], 1000, 0.0, 0.0)[1] == "the refitted profile plans the same layout"


def test_a_guess_must_pay_for_the_move_back_too():
    """A point whose prediction rests on work no measured layout did: 20 s saved pays for one
    12 s move, not for two."""
    running = plan_of("table_wise@2")
    assert choose(running, 10.0, 10.0, [point("mixed@2", 1, 8.0)], 10_000, 12.0, 0.0)[0]
    move, why, *_ = choose(running, 10.0, 10.0, [point("mixed@2", 1, 8.0, guess=True)], 10_000, 12.0, 0.0)
    assert not move and "24.0 s of a move and the move back" in why
    # beside a guess that predicts more, a sure point that nets more is taken
    both = [point("cached@2", 1, 7.0, guess=True), point("mixed@2", 2, 8.0)]
    assert choose(running, 10.0, 10.0, both, 10_000, 12.0, 0.0)[2].point.moved_bytes == 2


def test_a_layout_measured_before_is_priced_by_its_measurement_against_the_measured_step():
    """After a move the fit predicted 10 ms for but that measures 12 ms: the layout measured
    before at 9 ms is 25% faster as measured (the refit's 10 ms of the running plan is no measure of it)."""
    running = plan_of("mixed@2")
    back = [point("table_wise@2", 10**8, 9.0, measured=True)]
    move, why, chosen, gain_s, _ = choose(running, 10.0, 12.0, back, 10_000, 5.0, 0.0)
    assert move and chosen.measured and gain_s == pytest.approx(30.0) and why.startswith("going back to a layout measured saves 25.0%")
    assert not choose(running, 10.0, 9.2, back, 10_000, 5.0, 0.0)[0]  # 2% as measured: within what a measurement tells


def test_of_points_as_fast_the_one_moving_fewest_bytes_is_taken():
    running = plan_of("table_wise@2")
    front = [point("cached@2", 10, 8.05), point("mixed@2", 10**9, 8.0)]  # by bytes moved, as the front is
    assert choose(running, 10.0, 10.0, front, 1000, 1.0, 0.0)[2].point.moved_bytes == 10
    front = [point("cached@2", 10, 9.0), point("mixed@2", 10**9, 8.0)]
    assert choose(running, 10.0, 10.0, front, 1000, 1.0, 0.0)[2].point.moved_bytes == 10**9


def test_work_a_layout_does_is_known_to_the_fit_only_when_a_measured_layout_did_it():
    """Column-wise tables permute their pooled columns, table-wise ones do not: a fit to
    table-wise runs has no measure of that constant, so a column-wise plan it prices is a guess."""
    from dlrm_scale.run_config import ModelConfig
    from dlrm_scale.tools.fit import exercised
    from planner.plan.document import table_layout
    from planner.spec.types import ShardingType
    from tests.test_plan_invariance import TABLES

    tw = plan_of("table_wise@2")
    cw = Plan(2, 2, {t.name: table_layout(t, ShardingType.COLUMN_WISE, [0, 1], "ddr", None) for t in TABLES}, (), 0.0, 0.0)
    model = ModelConfig(num_dense_features=13, dense_arch=(32, 16), over_arch=(32, 1))
    known = exercised(tw, problem(2), model, "sgd")
    assert "column_permute_value_ns" in exercised(cw, problem(2), model, "sgd") - known
    assert {"lookup_fwd_ns", "comm_byte_ns", "dense_gflops"} <= known


def test_a_decision_from_a_recorded_run_refits_the_wrong_profile_it_started_from(tmp_path):
    """A 2-rank run on cpu_gloo, decided on from the datasheet h100_dgx profile: the fitted
    profile is written beside the metrics and predicts the run far better than the one it started from."""
    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED, run_dir)
    decision, measured = decide(run_dir, "h100_dgx", step=40, steps_left=1000, cost=MoveCost(5.0, 4.0), time_limit_s=2.0)
    assert measured.step_ms == decision.measured_step_ms
    assert (run_dir / FITTED_PROFILE).is_file() and decision.profile == str(run_dir / FITTED_PROFILE)
    error = lambda ms: abs(ms / decision.measured_step_ms - 1)  # noqa: E731
    assert error(decision.predicted_before_ms) > 0.9 and error(decision.predicted_ms) < 0.25
    assert set(decision.phases_ms) == {"input_dist", "embedding", "a2a_fwd", "a2a_bwd", "dense", "all_reduce", "other"}
    json.dumps(decision.record())
    assert not decision.move and decision.plan is None and decision.why  # this run's layout is already the refit's best


def test_a_gpu_job_tunes_its_own_gpu_profile_and_replans_to_plans_the_cuda_path_maps(tmp_path):
    """--retune on CUDA, asserted without a GPU (the decision is torch-free; scripts/gpu_check.py
    runs the loop on one): a run priced with a CUDA profile is refitted into a CUDA profile (its
    device and capacities kept), and the plans it replans to under it are CUDA plans that map
    onto TorchRec's CUDA kernels and pass the checks a move makes on every rank."""
    from dlrm_scale.bridge.sharding_plan import to_sharding_plan
    from planner.plan.planning import make_plan
    from planner.search.solver import SolverConfig
    from dlrm_scale.tools.runs import load_run
    from dlrm_scale.train import check_plan_runs
    from planner.spec.config import read_yaml

    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED, run_dir)
    decision, _ = decide(run_dir, "a100_zionex", step=40, steps_left=10**9, cost=MoveCost(0.0, 0.0), time_limit_s=2.0)
    fitted = read_yaml(Path(decision.profile), "profile")
    assert fitted["device"] == "cuda" and fitted["hbm_gib_per_rank"] == read_yaml(ROOT / "configs" / "hardware" / "a100_zionex.yaml", "p")["hbm_gib_per_rank"]
    run = load_run(run_dir, decision.profile).run
    plan = make_plan(run.problem, config=SolverConfig(time_limit_s=2.0))  # decide's first candidate, under the fitted profile
    check_plan_runs(plan, run, "cuda", [0])
    assert {t.compute_kernel for t in plan.tables.values()} <= {"fused", "dense", "fused_uvm_caching", "key_value"}
    sharding = to_sharding_plan(plan, "cuda").plan[""]
    assert set(sharding) == set(plan.tables) and all(ps.compute_kernel == plan.tables[n].compute_kernel
                                                     for n, ps in sharding.items() if ps.sharding_type != "data_parallel")


def _with_pooling(run_dir: Path, factors) -> None:
    """The recorded run's windows, each recording `factors` as the tables' measured pooling."""
    metrics = run_dir / "metrics.jsonl"
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    metrics.write_text("".join(json.dumps({**r, "pooling_factors": factors} if "phase_ms" in r else r) + "\n" for r in records))


def test_a_table_measured_hotter_than_configured_is_priced_as_it_ran_and_named_in_the_decision(tmp_path):
    """The recorded run's four tables are configured at 4 ids a sample; its windows say t0 ran at 40:
    the run is priced (fitted, replanned) with 40 for t0, and the decision says so."""
    from dlrm_scale.tools.runs import load_run

    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED, run_dir)
    configured = load_run(run_dir).run.problem
    _with_pooling(run_dir, {"t0": 40.0, "t1": 4.1, "t2": 3.9, "t3": 4.0})
    measured = load_run(run_dir)
    assert measured.pooling["t0"] == (4.0, 40.0) and measured.run.problem.tables_by_name["t0"].pooling_factor == 40.0
    assert measured.run.problem.tables_by_name["t1"].pooling_factor == 4.1
    assert [replace(t, pooling_factor=1.0) for t in measured.run.problem.tables] == [replace(t, pooling_factor=1.0) for t in configured.tables]
    decision, _ = decide(run_dir, "cpu_gloo", step=40, steps_left=1000, cost=MoveCost(5.0, 4.0), time_limit_s=2.0)
    assert decision.pooling_changed == {"t0": [4.0, 40.0]}  # t1-t3 are within POOLING_NAMED of their config
    assert "t0's pooling factor 40 (configured 4)" in decision.line()


@pytest.mark.parametrize("factors", [{"t0": 4.0}, {"t0": -1.0, "t1": 4.0, "t2": 4.0, "t3": 4.0}, [4.0, 4.0, 4.0, 4.0]])
def test_damaged_pooling_factors_in_a_run_are_one_line(factors, tmp_path):
    from dlrm_scale.tools.runs import load_run
    from planner.spec.errors import ConfigError

    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED, run_dir)
    _with_pooling(run_dir, factors)
    with pytest.raises(ConfigError, match=r"metrics.jsonl:3: pooling_factors must give every table of the run a number >= 0"):
        load_run(run_dir)


# ---- the data whose hot set moves ----------------------------------------------------------------
def test_the_hot_ids_move_at_the_drift_step_and_only_then():
    from dlrm_scale.training.data import SyntheticData

    steady = SyntheticData(TABLES, 13, 256, SEED)
    drifting = SyntheticData(TABLES, 13, 256, SEED, drift_at_step=5)
    before, after = steady.batch(4), drifting.batch(4)
    assert torch.equal(before.sparse_features.values(), after.sparse_features.values())
    moved, kept = drifting.batch(5).sparse_features, steady.batch(5).sparse_features
    assert torch.equal(moved.lengths(), kept.lengths()) and not torch.equal(moved.values(), kept.values())
    hottest = lambda kjt: np.bincount(kjt["f_a"].values().numpy()).argmax()  # noqa: E731
    assert hottest(moved) != hottest(kept)
    halves = [SyntheticData(TABLES, 13, 256, SEED, r, 2, drift_at_step=5).batch(7).sparse_features for r in range(2)]
    assert torch.equal(torch.cat([h["f_a"].values() for h in halves]), drifting.batch(7).sparse_features["f_a"].values())


def test_a_table_grows_hot_at_the_drift_step_and_the_windows_measure_it():
    """--drift-grows a=5: from the drift step on, table a's bags are 5 times as long, the other
    tables' as they were, and no hot set moves; PoolingMeter measures both sides of it."""
    from dlrm_scale.training.data import SyntheticData, feature_name
    from dlrm_scale.training.metrics import PoolingMeter

    steady = SyntheticData(TABLES, 13, 256, SEED)
    growing = SyntheticData(TABLES, 13, 256, SEED, drift_at_step=5, drift_grows=("a", 5.0))
    assert torch.equal(steady.batch(4).sparse_features.values(), growing.batch(4).sparse_features.values())
    grown, kept = growing.batch(5).sparse_features, steady.batch(5).sparse_features
    hottest = lambda kjt, f: np.bincount(kjt[f].values().numpy()).argmax()  # noqa: E731
    assert hottest(grown, "f_a") == hottest(kept, "f_a") and hottest(grown, "f_b") == hottest(kept, "f_b")
    meter = PoolingMeter([feature_name(t.name) for t in TABLES])
    batches = meter.counting(growing.batches(0, 10))
    for _ in range(5):
        next(batches)
    before = meter.take()
    for _ in range(5):
        next(batches)
    after = meter.take()
    configured = torch.tensor([t.pooling_factor for t in TABLES], dtype=torch.float64)
    assert torch.allclose(before, configured, rtol=0.1)
    assert after[0] == pytest.approx(5 * TABLES[0].pooling_factor, rel=0.1) and torch.allclose(after[1:], configured[1:], rtol=0.1)


# ---- flags ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("flags, line", [
    (["--retune-window", "50"], "--retune-window applies with --retune; add --retune or drop it"),
    (["--retune", "--retune-window", "200"], "--retune-window 200 covers fewer than 3 logging windows of 100 steps"),
    (["--retune", "--retune-times", "0"], "--retune-times: must be a whole number >= 1, got 0"),
    (["--data", "criteo", "--data-path", "tests", "--drift-at", "5"], "--drift-at moves the hot ids of synthetic data"),
    (["--drift-grows", "t_large=4"], "--drift-grows t_large=4 applies at --drift-at STEP; add --drift-at"),
    (["--drift-at", "5", "--drift-grows", "t_large"], "--drift-grows takes TABLE=FACTOR with a factor > 0, such as t0=8; got 't_large'"),
    (["--drift-at", "5", "--drift-grows", "t_large=0"], "--drift-grows takes TABLE=FACTOR with a factor > 0"),
    (["--drift-at", "5", "--drift-grows", "t_large=inf"], "--drift-grows takes TABLE=FACTOR with a factor > 0"),
    (["--drift-at", "5", "--drift-grows", "t_huge=4"], "--drift-grows names table 't_huge', which the config does not have; name one of t_large"),
])
def test_bad_retune_flags_are_one_line(flags, line, tmp_path):
    from dlrm_scale.training.flags import check_job, parse_args
    from planner.spec.errors import ConfigError

    with pytest.raises(ConfigError) as e:
        check_job(parse_args(["--config", str(ROOT / "configs" / "tiny.yaml"), "--out-dir", str(tmp_path), *flags]), device="cpu")
    assert str(e.value).startswith(line)


# ---- the schedule ---------------------------------------------------------------------------------
def test_a_gain_under_the_spread_is_measured_on_and_decided_on_every_window_of_the_measurement(tmp_path):
    """The real schedule (warm-up 10, windows of 10 steps, a decision after 30 measured), the
    decisions given: the first stays with measure_on, so no new measurement record is logged (the
    next decision reads the same measurement's windows, and the ones after) and the next decision
    comes 30 steps later; that one stays for good, and the job watches."""
    from dlrm_scale.run_config import RetuneConfig
    from dlrm_scale.tuning.decide import Decision
    from dlrm_scale.tuning.tuner import Tuner

    def decision(step: int, measure_on: bool) -> dict:
        return Decision(step, False, "under the spread", "cpu_gloo", 10.0, 0.3, 3, 10.0, 10.0, 10.0, 0, 0.1, 1.0, 1.0,
                        False, False, measure_on, {}, {}).record()

    class Given(Tuner):
        def _decision(self, done, steps_left):
            self.asked.append(done)
            return decision(done, measure_on=len(self.asked) == 1)

    tuner = Given(RetuneConfig(True, warmup_steps=10, window_steps=30, times=3), tmp_path, "cpu_gloo", 0, tmp_path)
    tuner.asked = []
    logged = []
    tuner.started(0, build_s=1.0)
    for done in range(10, 200, 10):
        assert tuner.after_window(done, 10.0, 200, logged.append, {"run": "record"}) is None
    assert tuner.asked == [40, 70]  # measuring from step 10: decided at 40, measured on, decided at 70
    assert [r["step"] for r in logged if "run" in r] == [10]  # one measurement for both decisions
    assert [r["retune"]["measure_on"] for r in logged if "retune" in r] == [True, False]
    assert tuner.decisions == 2 and tuner._decide_at is None  # watching now: steady windows start nothing


# ---- the move, on real ranks ---------------------------------------------------------------------
STEPS, MOVE_AT = 12, 6


def _train(rank, world, out_dir, move_to, start="table_wise@2", die_mid_move=False, resume=False, checkpoints=None):
    import os
    import time

    from dlrm_scale.run_config import CheckpointConfig, ModelConfig, RetuneConfig, TrainConfig
    from dlrm_scale.train import train_under_plans
    from dlrm_scale.training import trainer as trainer_module
    from dlrm_scale.training.data import SyntheticData
    from dlrm_scale.tuning.tuner import Tuner
    from tests.conftest import run_config

    class MoveOnce(Tuner):
        """The real schedule, warm-up and windows, with the decision given: move to `move_to`."""

        def _decide(self, done, steps_left, log):
            self.decisions += 1
            self._moving = {"began": time.monotonic(), "moved_bytes": 1, "model_gib": 0.001}
            self._decide_at, self._watching, self.predicted_ms = None, True, 1.0
            return plan_of(move_to)

    if die_mid_move:  # killed with the move's checkpoint written, while the trainer is rebuilt under the new plan
        build = trainer_module.Trainer.__init__

        def dying(self, *args, resume=False, **kwargs):
            if resume:
                os._exit(9)
            build(self, *args, resume=resume, **kwargs)

        trainer_module.Trainer.__init__ = dying
    out = Path(out_dir)
    cfg = TrainConfig(steps=STEPS, embedding_lr=0.05, dense_lr=0.05, log_every=1, eval_batches=2, seed=SEED, deterministic=True,
                      cpu_embeddings="dlrm_scale", interaction="dlrm_scale")
    model = ModelConfig(num_dense_features=13, dense_arch=(32, 16), over_arch=(32, 1))
    run = run_config(problem(world), model, cfg, GLOBAL_BATCH // world, CheckpointConfig(Path(checkpoints or out / "ckpt"), 0, 2))
    tuner = MoveOnce(RetuneConfig(True, warmup_steps=2, window_steps=MOVE_AT - 2, times=1), out, "cpu_gloo", rank, out / "ckpt") if move_to else None
    before = []
    build_after_move = trainer_module.Trainer.__init__

    def built_alone(self, *args, **kwargs):  # the real one; a trainer that stopped for a move is gone first
        assert all(earlier() is None for earlier in before), "the next trainer is built beside the one before the move"
        build_after_move(self, *args, **kwargs)
        before.append(weakref.ref(self))

    trainer_module.Trainer.__init__ = built_alone
    made, make = [], SyntheticData.batch

    def counted(self, step):  # the training batches (the held-out data has another seed)
        if self.seed == SEED:
            made.append(step)
        return make(self, step)

    SyntheticData.batch = counted
    plans = []
    for trainer in train_under_plans(run, plan_of(start), torch.device("cpu"), rank, world, out, None, resume, tuner):
        plans.append(trainer.plan.tables)
        del trainer  # as the CLI keeps none
    (out / f"batches_made_rank{rank}.json").write_text(json.dumps(made))
    return plans


def _losses(directory: Path) -> list[float]:
    return [m["loss"] for m in map(json.loads, (directory / "metrics.jsonl").read_text().splitlines()) if "loss" in m]


@pytest.mark.distributed
def test_a_move_reshards_through_a_checkpoint_and_the_model_goes_on_as_if_it_never_moved(tmp_path):
    from dlrm_scale.tools.launch import run_on_ranks

    losses = {}
    # to mixed@2; and to cached@2, whose SSD table cannot run here (no --store-dir): on under table_wise@2
    for move_to, kept in ((None, None), ("mixed@2", "mixed@2"), ("cached@2", "table_wise@2")):
        d = tmp_path / f"to_{move_to}"
        d.mkdir()
        plans = run_on_ranks(_train, 2, str(d), move_to)
        metrics = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        losses[move_to] = _losses(d)
        for rank in (0, 1):  # each step's batch made once: the trainer after a move goes on from the batches made before it
            assert sorted(json.loads((d / f"batches_made_rank{rank}.json").read_text())) == list(range(STEPS))
        if move_to:
            assert [p == plan_of(n).tables for p, n in zip(plans, ("table_wise@2", kept))] == [True, True]
            reshards = [m for m in metrics if "reshard" in m]
            if kept == move_to:
                assert [m["step"] for m in reshards] == [MOVE_AT] and reshards[0]["reshard"]["seconds"] > 0
            else:  # refused: nothing moved, nothing to report as a reshard
                assert reshards == []
            assert Plan.load(d / "plan.json").tables == plan_of(kept).tables
    again = tmp_path / "again"
    again.mkdir()
    run_on_ranks(_train, 2, str(again), "mixed@2")
    assert _losses(again) == losses["mixed@2"]  # --deterministic: a job that moves is reproducible bitwise
    for move_to in ("mixed@2", "cached@2"):
        assert len(losses[move_to]) == len(losses[None]) == STEPS
        assert losses[move_to] == pytest.approx(losses[None], rel=1e-5)  # the invariance tests' bound


@pytest.mark.distributed
def test_a_job_killed_mid_move_resumes_from_the_moves_checkpoint_under_either_plan_with_nothing_lost(tmp_path):
    """Every rank killed once the move's checkpoint is written, while the trainer is rebuilt
    under the new plan: resumed under the old plan or the new one, the job goes on from the
    step it moved at, as a job that never moved does."""
    from dlrm_scale.tools.launch import run_on_ranks

    (tmp_path / "still").mkdir()
    run_on_ranks(_train, 2, str(tmp_path / "still"), None)
    still = _losses(tmp_path / "still")
    killed = tmp_path / "killed"
    killed.mkdir()
    with pytest.raises(Exception, match="exit code 9|exitcode 9|signal|9"):
        run_on_ranks(_train, 2, str(killed), "mixed@2", "table_wise@2", True)
    assert _losses(killed) == pytest.approx(still[:MOVE_AT], rel=1e-5)
    for plan in ("table_wise@2", "mixed@2"):
        d = tmp_path / f"resumed_{plan.replace('@', '_')}"
        shutil.copytree(killed / "ckpt", d / "ckpt")  # each resume from the checkpoints the kill left (a resume saves its own last step)
        plans = run_on_ranks(_train, 2, str(d), None, plan, False, True)
        assert plans == [plan_of(plan).tables]
        assert _losses(d) == pytest.approx(still[MOVE_AT:], rel=1e-5)  # nothing lost, nothing trained twice


def test_a_retuning_job_measures_the_kernels_its_profile_chose_elsewhere_and_no_flag_named(tmp_path):
    from dlrm_scale.run_config import Overrides, RetuneConfig, load_run_config
    from dlrm_scale.tuning.kernels import kinds_to_measure

    def kinds(device="cpu", retune=True, **flags):
        run = load_run_config(ROOT / "configs" / "tiny.yaml", Overrides(**flags))
        return kinds_to_measure(replace(run, retune=RetuneConfig(enabled=retune)), device)

    assert kinds(hardware="h100_dgx") == ("embeddings", "interaction")  # a datasheet: measured on no CPU
    assert kinds(hardware="h100_dgx", interaction="torchrec") == ("embeddings",)  # a flag's kernel is the user's
    assert kinds(hardware="h100_dgx", retune=False) == () and kinds("cuda", hardware="h100_dgx") == ()
    here = tmp_path / "here.yaml"  # the same profile, measured on this CPU
    here.write_text((ROOT / "configs" / "hardware" / "h100_dgx.yaml").read_text() + f"measured_on: {json.dumps(this_cpu())}\n")
    assert kinds(hardware=str(here)) == ()


TEXTS = ["{\"embeddings\": \"fbgemm\"}", "", "rang \u00e9 2, longer than the others"]


def _gathered(rank, world):
    from dlrm_scale.bridge.broadcast import gather_text

    got = gather_text(None, TEXTS[rank])
    assert got == TEXTS, (rank, got)  # on every rank, in rank order
    return got


@pytest.mark.distributed
def test_every_rank_gets_every_ranks_text_in_rank_order():
    """What the ranks measure of the kernels is shared as text of any length (none, too)."""
    from dlrm_scale.tools.launch import run_on_ranks

    assert run_on_ranks(_gathered, 3) == TEXTS


@pytest.mark.distributed
def test_a_retuning_job_decides_writes_its_profile_and_finishes(tmp_path):
    """The whole loop from the launcher: a tiny job priced with the datasheet h100_dgx profile
    on CPU, its hot set moving mid-run; it measures, refits, decides (and logs why), and ends."""
    config = tmp_path / "tiny_h100.yaml"
    config.write_text((ROOT / "configs" / "tiny.yaml").read_text().replace("hardware: cpu_gloo", "hardware: h100_dgx"))
    run = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "train", "--nproc-per-node", "2", "--config", str(config), "--steps", "60",
                          "--deterministic", "--retune", "--retune-warmup", "5", "--retune-window", "15", "--drift-at", "30",
                          "--out-dir", str(tmp_path / "out")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "retune at step 20: measured" in run.stdout
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    decisions = [r["retune"] for r in records if "retune" in r]
    assert decisions and all(d["why"] and d["decide_s"] > 0 for d in decisions)
    fitted = (tmp_path / "out" / FITTED_PROFILE).read_text()
    assert fitted.startswith("# Fitted by `dlrm-scale train --retune`")
    # the datasheet measured no CPU kernels: the job measured them, trained with them, and its profile keeps them
    announced = re.search(r"CPU kernels measured here: embeddings (\w+) \(.*\); interaction (\w+) \(", run.stdout)
    assert announced, run.stdout[-2000:]
    ran = {(r["run"]["train"]["cpu_embeddings"], r["run"]["train"]["interaction"]) for r in records if "run" in r}
    assert ran == {announced.groups()}
    profile = yaml.safe_load(fitted)
    assert profile["measured_on"] == this_cpu()
    assert (profile["cpu_kernels"]["embeddings"], profile["cpu_kernels"]["interaction"]) == announced.groups()
    # each window records the tables' pooling factors as the data had them, over both ranks' batches
    windows = [r["pooling_factors"] for r in records if "pooling_factors" in r]
    assert windows and all(w["t_large"] == pytest.approx(4.0, rel=0.1) and w["t_small"] == 1.0 for w in windows)


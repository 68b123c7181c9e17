"""When a self-tuning job measures and decides, across the trainers of one job (a move rebuilds
the trainer under the new plan, through a checkpoint of the step it stopped at).

Every rank keeps the same schedule: the window records it reads are gathered from every rank
(training.metrics.WindowReport), so each rank sees the same step times. Rank 0 decides
(dlrm_scale.tuning.decide, torch-free) and sends the decision as JSON; a rank never waits for a
decision another does not ask for.

    start --warm-up--> measure --window--> decide: stay --> watch
                                                   stay, the gain under the spread --> measure on
                                                        --window--> decide on every window measured
                                                   move --warm-up--> measure (the new layout on
                                                        probation: the next decision may move back)
    watch: DRIFT_WINDOWS windows in a row off the refitted prediction by more than --retune-drift
           --> measure (the data moved: what other layouts measured before is dropped) --window--> decide ...
    (at most --retune-times decisions)
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

from dlrm_scale.bridge.broadcast import broadcast_text
from dlrm_scale.run_config import RetuneConfig
from dlrm_scale.training.host_group import host_group
from dlrm_scale.tools.runs import MeasuredRun
from dlrm_scale.training.checkpoint import round_trip_s_per_gib
from dlrm_scale.tuning.decide import Decision, MoveCost, decide
from planner.plan.document import Plan
from planner.spec.errors import PlannerError
from planner.spec.specs import GIB

DRIFT_WINDOWS = 2  # one slow window is noise (a checkpoint, a neighbour); two in a row are the job
REPLAN_TIME_LIMIT_S = 5.0  # every rank waits while rank 0 replans


class Tuner:
    def __init__(self, config: RetuneConfig, out_dir: Path, profile: str, rank: int, checkpoint_dir: Path) -> None:
        self.config, self.out_dir, self.profile, self.rank = config, out_dir, profile, rank
        self.checkpoint_dir = checkpoint_dir
        self.decisions = 0
        self.cost: MoveCost | None = None
        self.predicted_ms: float | None = None  # the refitted prediction of the running plan's step
        self._staying_ms: float | None = None  # the same, for the plan in use while a move is under way
        self._warm_until = 0  # windows before this step are neither measured nor watched
        self._decide_at: int | None = None  # while measuring, the step of the next decision (None: not measuring)
        self._watching = False  # after a decision: comparing each window with predicted_ms
        self._off = 0
        self._moving: dict | None = None  # the move under way: when it began, what it moved
        self._measured: list[MeasuredRun] = []  # rank 0: the last measurement of each layout, on the data as it is now

    def started(self, step: int, build_s: float, restore_s: float = 0.0) -> dict | None:
        """A trainer starts at `step`: the job's start, or a move's end (the move's cost is measured
        and returned as a record); either way its plan is measured after the warm-up. (After a
        refused move, see move_refused, the plan in use is watched as before.)"""
        self._warm_until, self._decide_at, self._off = step + self.config.warmup_steps, None, 0
        if self._moving is None:
            if self.cost is None and self.rank == 0:  # only rank 0 decides, so only it measures a checkpoint's round trip
                self.cost = MoveCost(build_s, round_trip_s_per_gib(self.checkpoint_dir))
            return None
        moved, model_gib = self._moving["moved_bytes"], self._moving["model_gib"]
        total = time.monotonic() - self._moving["began"]
        self.cost = MoveCost(rebuild_s=build_s, s_per_gib=(total - build_s) / model_gib if model_gib > 0 else 0.0)
        self._moving, self._watching = None, False  # the new layout on probation: measured after its warm-up
        return {"step": step, "reshard": {"seconds": total, "rebuild_s": build_s, "restore_s": restore_s, "moved_gib": moved / GIB,
                                          "s_per_gib_moved": total / (moved / GIB) if moved else None}}

    def move_refused(self) -> None:
        """The plan decided on cannot run on every rank: the job goes on under the plan in use,
        watched against its own prediction (measuring it again would decide the same move)."""
        self._moving, self.predicted_ms = None, self._staying_ms

    def after_window(self, done: int, window_step_ms: float, steps: int, log, run_record: dict) -> Plan | None:
        """After each logging window, on every rank: the plan to move to (the trainer then saves
        a checkpoint of step `done` and stops), or None to go on."""
        if self.decisions >= self.config.times or done >= steps or done < self._warm_until:
            return None
        if self._decide_at is None:
            if self._watching:  # has the job drifted from the refitted prediction?
                off = abs(window_step_ms / self.predicted_ms - 1) > self.config.drift
                self._off = self._off + 1 if off else 0
                if self._off < DRIFT_WINDOWS:
                    return None
                self._measured = []  # the job drifted: other layouts' measurements were of other data
            self._decide_at, self._off = done + self.config.window_steps, 0
            log({"step": done, "run": run_record})  # the measurement: the windows after this record
            return None
        if done < self._decide_at:
            return None
        return self._decide(done, steps - done, log)

    def _decision(self, done: int, steps_left: int) -> dict:
        """Rank 0's decision (a Decision's fields, or {"error": why}), as every rank receives it."""
        text = None
        if self.rank == 0:
            try:
                decision, measured = decide(self.out_dir, self.profile, done, steps_left, self.cost, self._measured,
                                            REPLAN_TIME_LIMIT_S)
                self._measured = [r for r in self._measured if r.plan.tables != measured.plan.tables] + [measured]
                text = json.dumps(asdict(decision))
            except PlannerError as e:  # a measurement it cannot fit: go on under the plan in use, and measure again
                text = json.dumps({"error": str(e)})
        return json.loads(broadcast_text(host_group(), text))

    def _decide(self, done: int, steps_left: int, log) -> Plan | None:
        began = time.monotonic()
        message = self._decision(done, steps_left)
        self.decisions += 1
        self._decide_at = None
        if "error" in message:
            log({"step": done, "retune": {"move": False, "why": f"no decision: {message['error']}"}})
            self._say(f"retune at step {done}: no decision ({message['error']}); going on under the plan in use")
            return None
        decision = Decision(**message)
        # every rank waited this long for the decision: part of what retuning costs
        log({"step": done, "retune": {**decision.record(), "decide_s": time.monotonic() - began}})
        self._say(decision.line())
        self.predicted_ms, self._staying_ms, self._watching = decision.new_predicted_ms, decision.predicted_ms, True
        if decision.measure_on:  # the same measurement goes on: the next decision reads its windows and the next ones
            self._decide_at = done + self.config.window_steps
            return None
        self.profile = decision.profile  # the next fit starts from this one
        if not decision.move:
            return None
        self._moving = {"began": time.monotonic(), "moved_bytes": decision.moved_bytes, "model_gib": decision.model_gib}
        return Plan.from_dict(decision.plan, "the retuned plan")

    def _say(self, line: str) -> None:
        if self.rank == 0:
            print(line, flush=True)

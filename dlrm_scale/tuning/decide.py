"""One decision of a self-tuning job, torch-free: the job's own measurement refits its profile,
the running plan is replanned from with least movement, and a move is taken only when its
predicted gain over the steps left outweighs what moving costs.

- measure: the windows logged since the measurement began (dlrm_scale.tools.runs: the last run
  record in metrics.jsonl starts them), under the plan in plan.json;
- fit: `calibrate --from-runs`'s fit (dlrm_scale.tools.refit) started from, and regularised
  toward, the profile the job is priced with; written to OUT_DIR/fitted_profile.yaml, so the
  next job can start from it;
- replan: the unconstrained plan under the fitted profile first, each plan's whole step priced
  by it (dlrm_scale.tools.simulate); only when that is worth a move, planner.replan's front of
  (bytes moved, busiest rank) from the running plan;
- decide: the fastest point (or one within NEAR of it that moves fewer bytes), taken when its
  gain, (step saved) x (steps left), outweighs the cost of moving and the step it saves is more
  than the measured window-to-window spread and MIN_GAIN (below either, the gain is within what
  the measurement can tell).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dlrm_scale.run_record import PHASE_GROUPS
from dlrm_scale.tools.fit import compare
from dlrm_scale.tools.refit import refit
from dlrm_scale.tools.runs import load_run
from dlrm_scale.tools.simulate import simulate
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.replan.replan import Replanned, model_bytes, replan
from planner.search.solver import SolverConfig
from planner.spec.specs import GIB

FITTED_PROFILE = "fitted_profile.yaml"
# The least step a move must save, as a share of the step: the fitted model's error on a plan it
# was not fitted to is of this order (the cost-model benchmark's held-out median is ~6%).
MIN_GAIN = 0.05
NEAR = 0.01  # points of the front this close to the fastest count as fast


@dataclass
class MoveCost:
    """What a move costs, in seconds: the job rebuilt under the new plan (`rebuild_s`, first its
    own start-up) and its state saved and loaded through a checkpoint (`s_per_gib` of the model:
    first the checkpoint folder's disk measured, `disk_s_per_gib`, then what the last move took)."""

    rebuild_s: float
    s_per_gib: float

    def seconds(self, model_gib: float) -> float:
        return self.rebuild_s + self.s_per_gib * model_gib


PROBE_BYTES = 64 << 20


def disk_s_per_gib(directory: Path) -> float:
    """Seconds to write a GiB to `directory` (to the disk: fsync) and read it back, from a
    PROBE_BYTES file; what a checkpoint's save and load take per GiB, at least."""
    directory.mkdir(parents=True, exist_ok=True)
    probe = directory / ".disk_probe"
    block = os.urandom(1 << 20)
    start = time.perf_counter()
    with open(probe, "wb") as f:
        for _ in range(PROBE_BYTES >> 20):
            f.write(block)
        f.flush()
        os.fsync(f.fileno())
    with open(probe, "rb") as f:
        while f.read(1 << 24):
            pass
    seconds = time.perf_counter() - start
    probe.unlink()
    return seconds * ((1 << 30) / PROBE_BYTES)


@dataclass(frozen=True)
class Decision:
    step: int
    move: bool
    why: str
    profile: str  # the fitted profile
    measured_step_ms: float
    spread: float  # window-to-window, relative to the median step
    predicted_before_ms: float  # the running plan, by the profile it was priced with
    predicted_ms: float  # the running plan, by the fitted profile
    new_predicted_ms: float  # the plan chosen, by the fitted profile (the running one's when staying)
    moved_bytes: int
    model_gib: float  # weights and optimizer state, all of which a move saves and loads
    gain_s: float  # predicted over the steps left
    cost_s: float
    phases_ms: dict[str, list[float]]  # per phase group: [predicted before the fit, after it, measured]
    plan: dict | None = None  # the plan moved to (plan/v1), when moving

    def record(self) -> dict:
        """What metrics.jsonl keeps of it (the plan itself goes to plan.json)."""
        return {k: v for k, v in asdict(self).items() if k != "plan"}

    def line(self) -> str:
        verb = "moving" if self.move else "staying"
        return (f"retune at step {self.step}: measured {self.measured_step_ms:.2f} ms a step (spread {100 * self.spread:.1f}%), "
                f"predicted {self.predicted_before_ms:.2f} ms by the profile, {self.predicted_ms:.2f} ms refitted; {verb}: {self.why}")


def decide(out_dir: Path, profile: str, step: int, steps_left: int, cost: MoveCost, time_limit_s: float = 10.0) -> Decision:
    measured = load_run(out_dir, profile)
    before = compare(measured)
    fitted_path = out_dir / FITTED_PROFILE
    refit([measured], profile, fitted_path, header=f"# Fitted by `dlrm-scale train --retune` to its own steps, from {profile}.\n")
    refitted = load_run(out_dir, str(fitted_path))
    after = compare(refitted)
    run = refitted.run
    current_ms = after.predicted_step_ms
    model_gib = model_bytes(measured.plan, run.problem.training.embedding_optimizer) / GIB
    move_s = cost.seconds(model_gib)
    solver = SolverConfig(time_limit_s=time_limit_s)

    def step_ms(plan: Plan) -> float:
        return simulate(plan, run.problem, run.model, run.train.dense_optimizer).step_ms

    # the unconstrained plan first: when even it is not worth a move, no front of moves is (the
    # front's budgets each search again: seconds every rank waits)
    free = make_plan(run.problem, config=solver)
    move, why, point, new_ms, gain_s = choose(measured.plan, current_ms, [(Replanned(free, 0, None, free.lower_bound_ms), step_ms(free))],
                                              steps_left, move_s, measured.spread)
    if move:
        front = replan(run.problem, measured.plan, config=solver)
        move, why, point, new_ms, gain_s = choose(measured.plan, current_ms, [(p, step_ms(p.plan)) for p in front.points], steps_left,
                                                  move_s, measured.spread)
    phases = {g: [before.fair_phases[g][0], after.fair_phases[g][0], after.fair_phases[g][1]] for g in PHASE_GROUPS}
    return Decision(step, move, why, str(fitted_path), measured.step_ms, measured.spread, before.predicted_step_ms, current_ms,
                    new_ms if move else current_ms, point.moved_bytes if move else 0, model_gib, gain_s, move_s, phases,
                    point.plan.to_dict() if move else None)


def choose(running: Plan, current_ms: float, priced: list[tuple[Replanned, float]], steps_left: int, move_s: float,
           spread: float) -> tuple[bool, str, Replanned, float, float]:
    """(move?, why, the point, its predicted step, its gain in s over the steps left) among the
    front's points, each given with its predicted step. A move costs the same whatever moves (the whole state goes through a
    checkpoint), so the fastest point is taken, or one within NEAR of it that moves fewer bytes
    (the front is ordered by bytes)."""
    fastest = min(ms for _, ms in priced)
    point, new_ms = next((p, ms) for p, ms in priced if ms <= fastest * (1 + NEAR))
    gain_s = (current_ms - new_ms) * steps_left / 1e3
    saved = 1 - new_ms / current_ms
    needed = max(MIN_GAIN, spread)
    if point.plan.tables == running.tables:
        return False, "the refitted profile plans the same layout", point, new_ms, gain_s
    if saved < needed:
        return (False, f"the best replan saves {100 * saved:.1f}% of the step, under the {100 * needed:.1f}% a measurement can tell",
                point, new_ms, gain_s)
    if gain_s <= move_s:
        return (False, f"it would save {gain_s:.1f} s over the {steps_left} steps left, under the {move_s:.1f} s a move costs",
                point, new_ms, gain_s)
    return True, (f"a replan saves {100 * saved:.1f}% of the step ({current_ms:.2f} -> {new_ms:.2f} ms predicted), "
                  f"{gain_s:.1f} s over the {steps_left} steps left against {move_s:.1f} s to move "
                  f"{point.moved_bytes / GIB:.3f} GiB"), point, new_ms, gain_s

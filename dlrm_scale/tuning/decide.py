"""One decision of a self-tuning job, torch-free: the job's own measurements refit its profile,
the running plan is replanned from with least movement, and a move is taken only when its
predicted gain over the steps left outweighs what moving costs.

- measure: the windows logged since the measurement began (dlrm_scale.tools.runs: the last run
  record in metrics.jsonl starts them), under the plan in plan.json, each table priced with the
  pooling factor the windows measured (a table that grew hot is fitted and replanned as it now
  is); beside it, the last measurement of each other layout this job trained under (`earlier`);
- fit: `calibrate --from-runs`'s fit (dlrm_scale.tools.refit) to all of them, started from, and
  regularised toward, the profile the job is priced with; written to OUT_DIR/fitted_profile.yaml,
  so the next job can start from it;
- replan: the unconstrained plan under the fitted profile first, each plan's whole step priced
  by it (dlrm_scale.tools.simulate); only when that is worth a move, planner.replan's front of
  (bytes moved, busiest rank) from the running plan; and each layout measured before, priced by
  its measurement (a move back is no guess);
- decide: the point whose gain, (step saved) x (steps left), most exceeds what moving there may
  cost, taken when that is positive and the step it saves is more than the measured
  window-to-window spread and MIN_GAIN (below either, the gain is within what the measurement
  can tell; where only the spread stands in the way of a move that would pay, the job measures
  on, and the next decision reads every window of the measurement). A point whose prediction
  rests on work no measured layout did (a constant of the fit that none of them exercises, say
  the column permute of column-wise tables when the job only ran row-wise) is a guess: its move
  must pay for the move back as well.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple, Sequence

from dlrm_scale.run_config import this_cpu
from dlrm_scale.run_record import PHASE_GROUPS
from dlrm_scale.tools.fit import compare, exercised
from dlrm_scale.tools.refit import refit
from dlrm_scale.tools.runs import MeasuredRun, load_run
from dlrm_scale.tools.simulate import simulate
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.replan.replan import Replanned, model_bytes, replan
from planner.search.solver import SolverConfig
from planner.spec.specs import GIB
from planner.views.diff import diff_plans

FITTED_PROFILE = "fitted_profile.yaml"
# The least step a move must save, as a share of the step: the fitted model's error on a plan it
# was not fitted to is of this order (the cost-model benchmark's held-out median is ~6%).
MIN_GAIN = 0.05
NEAR = 0.01  # points of the front this close to the fastest count as fast
POOLING_NAMED = 0.25  # a table whose measured pooling factor is this far from its config's is named in the decision


@dataclass
class MoveCost:
    """What a move costs, in seconds: the job rebuilt under the new plan (`rebuild_s`, first its
    own build, less setting initial weights, which a move loads) and its state saved and loaded
    through a checkpoint (`s_per_gib` of the model: first a probe of that round trip in the
    checkpoint directory, dlrm_scale.training.checkpoint.round_trip_s_per_gib, then what the
    last move took)."""

    rebuild_s: float
    s_per_gib: float

    def seconds(self, model_gib: float) -> float:
        return self.rebuild_s + self.s_per_gib * model_gib


@dataclass(frozen=True)
class Decision:
    step: int
    move: bool
    why: str
    profile: str  # the fitted profile
    measured_step_ms: float
    spread: float  # window-to-window, relative to the median step
    windows: int  # measured
    predicted_before_ms: float  # the running plan, by the profile it was priced with
    predicted_ms: float  # the running plan, by the fitted profile
    new_predicted_ms: float  # the plan chosen, by the fitted profile (the running one's when staying)
    moved_bytes: int
    model_gib: float  # weights and optimizer state, all of which a move saves and loads
    gain_s: float  # predicted over the steps left
    cost_s: float  # of one move
    guess: bool  # the point's prediction rests on work no measured layout did
    measured_before: bool  # the point is a layout this job measured (priced by that measurement)
    measure_on: bool  # staying only because the gain is under the spread: the measurement goes on (Choice)
    phases_ms: dict[str, list[float]]  # per phase group: [predicted before the fit, after it, measured]
    pooling_changed: dict[str, list[float]]  # per table off its config by POOLING_NAMED: [configured, measured]
    plan: dict | None = None  # the plan moved to (plan/v1), when moving

    def record(self) -> dict:
        """What metrics.jsonl keeps of it (the plan itself goes to plan.json)."""
        return {k: v for k, v in asdict(self).items() if k != "plan"}

    def line(self) -> str:
        verb = "moving" if self.move else "staying"
        pooling = "".join(f", {t}'s pooling factor {m:g} (configured {c:g})" for t, (c, m) in self.pooling_changed.items())
        return (f"retune at step {self.step}: measured {self.measured_step_ms:.2f} ms a step ({self.windows} windows, spread "
                f"{100 * self.spread:.1f}%){pooling}, "
                f"predicted {self.predicted_before_ms:.2f} ms by the profile, {self.predicted_ms:.2f} ms refitted; {verb}: {self.why}")


@dataclass(frozen=True)
class Candidate:
    point: Replanned
    step_ms: float  # predicted by the fitted profile, or measured
    measured: bool = False  # a layout the job trained under: step_ms is its measurement
    guess: bool = False  # its prediction rests on constants no measured layout exercises


def decide(out_dir: Path, profile: str, step: int, steps_left: int, cost: MoveCost, earlier: Sequence[MeasuredRun] = (),
           time_limit_s: float = 10.0) -> tuple[Decision, MeasuredRun]:
    """The decision, and the measurement it was made on (a later decision's `earlier`). `earlier`:
    the last measurement of each other layout the job trained under, on the same data."""
    measured = load_run(out_dir, profile)
    earlier = [r for r in earlier if r.plan.tables != measured.plan.tables]
    before = compare(measured)
    fitted_path = out_dir / FITTED_PROFILE
    _, fit = refit([measured, *earlier], profile, fitted_path,
                   header=f"# Fitted by `dlrm-scale train --retune` to its own steps under {1 + len(earlier)} layouts, from {profile}.\n",
                   measured_on=this_cpu())
    refitted = load_run(out_dir, str(fitted_path))
    after = compare(refitted)
    run = refitted.run
    current_ms = after.predicted_step_ms
    optimizer = run.problem.training.embedding_optimizer
    model_gib = model_bytes(measured.plan, optimizer) / GIB
    move_s = cost.seconds(model_gib)
    solver = SolverConfig(time_limit_s=time_limit_s)

    def predicted(point: Replanned) -> Candidate:
        plan = point.plan
        guess = not exercised(plan, run.problem, run.model, run.train.dense_optimizer) <= fit.exercised
        return Candidate(point, simulate(plan, run.problem, run.model, run.train.dense_optimizer).step_ms, guess=guess)

    def remeasured(r: MeasuredRun) -> Candidate:
        change = diff_plans(measured.plan, r.plan, optimizer)
        moved = change.intra_node_bytes + change.inter_node_bytes
        return Candidate(Replanned(r.plan, moved, None, r.plan.lower_bound_ms), r.step_ms, measured=True)

    # the unconstrained plan first: when even it is not worth a move, no front of moves is (the
    # front's budgets each search again: seconds every rank waits)
    free = make_plan(run.problem, config=solver)
    back = [remeasured(r) for r in earlier]
    candidates = [predicted(Replanned(free, 0, None, free.lower_bound_ms)), *back]
    choice = choose(measured.plan, current_ms, measured.step_ms, candidates, steps_left, move_s, measured.spread)
    if choice.move and not choice.candidate.measured:
        front = replan(run.problem, measured.plan, config=solver)
        choice = choose(measured.plan, current_ms, measured.step_ms, [*map(predicted, front.points), *back], steps_left, move_s,
                        measured.spread)
    move, chosen = choice.move, choice.candidate
    phases = {g: [before.fair_phases[g][0], after.fair_phases[g][0], after.fair_phases[g][1]] for g in PHASE_GROUPS}
    pooling = {t: [c, round(m, 2)] for t, (c, m) in measured.pooling.items() if abs(m / c - 1) > POOLING_NAMED}
    decision = Decision(step, move, choice.why, str(fitted_path), measured.step_ms, measured.spread, measured.windows,
                        before.predicted_step_ms, current_ms, chosen.step_ms if move else current_ms,
                        chosen.point.moved_bytes if move else 0, model_gib, choice.gain_s, move_s, move and chosen.guess,
                        move and chosen.measured, choice.measure_on, phases, pooling, chosen.point.plan.to_dict() if move else None)
    return decision, measured


class Choice(NamedTuple):
    move: bool
    why: str
    candidate: Candidate
    gain_s: float  # predicted over the steps left
    # no move, only because the step it saves is under the windows' spread (not MIN_GAIN, and it
    # would pay for itself): more windows of the same layout tell more, so the job measures on
    measure_on: bool = False


def choose(running: Plan, current_ms: float, measured_ms: float, candidates: Sequence[Candidate], steps_left: int, move_s: float,
           spread: float) -> Choice:
    """Whether to move, and to which candidate. The running plan's step is `current_ms` as the
    fitted profile predicts it, beside a predicted candidate, and `measured_ms` beside a measured
    one (like with like). A move costs the same whatever moves (the whole state goes through a
    checkpoint); a guess is charged the move back too. The candidate whose gain most exceeds its
    charge is taken, or one within NEAR of the step of it that moves fewer bytes (the front is
    ordered by bytes)."""
    def gain_s(c: Candidate) -> float:
        return ((measured_ms if c.measured else current_ms) - c.step_ms) * steps_left / 1e3

    def charge_s(c: Candidate) -> float:
        return move_s * (2 if c.guess else 1)

    moving = [c for c in candidates if c.point.plan.tables != running.tables]
    if not moving:
        return Choice(False, "the refitted profile plans the same layout", candidates[0], 0.0)
    best = max(gain_s(c) - charge_s(c) for c in moving)
    slack = NEAR * current_ms * steps_left / 1e3
    chosen = next(c for c in moving if gain_s(c) - charge_s(c) >= best - slack)
    gain = gain_s(chosen)
    before_ms = measured_ms if chosen.measured else current_ms
    saved = 1 - chosen.step_ms / before_ms
    pays = gain > charge_s(chosen)
    if saved <= 0:
        whence = "as measured" if chosen.measured else "predicted"
        return Choice(False, f"no other layout is faster (the best, {100 * -saved:.1f}% slower {whence})", chosen, gain)
    if saved < MIN_GAIN or saved < spread:
        needed = max(MIN_GAIN, spread)
        measure_on = saved >= MIN_GAIN and pays
        return Choice(False, f"the best replan saves {100 * saved:.1f}% of the step, under the {100 * needed:.1f}% a measurement can tell"
                      + ("; measuring on" if measure_on else ""), chosen, gain, measure_on)
    if not pays:
        what = (f"the {charge_s(chosen):.1f} s of a move and the move back (its gain rests on work no layout of this job measured)"
                if chosen.guess else f"the {move_s:.1f} s a move costs")
        return Choice(False, f"it would save {gain:.1f} s over the {steps_left} steps left, under {what}", chosen, gain)
    whence = "measured" if chosen.measured else "predicted"
    return Choice(True, (f"{'going back to a layout measured' if chosen.measured else 'a replan'} saves {100 * saved:.1f}% of the step "
                         f"({before_ms:.2f} -> {chosen.step_ms:.2f} ms {whence}), {gain:.1f} s over the {steps_left} steps left against "
                         f"{charge_s(chosen):.1f} s to move {chosen.point.moved_bytes / GIB:.3f} GiB"
                         f"{' (and back, were it wrong: its gain rests on work no layout of this job measured)' if chosen.guess else ''}"),
                  chosen, gain)

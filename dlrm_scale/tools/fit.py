"""Fitting a hardware profile's cost constants to what training runs measured, phase by phase.

Every formula of planner/cost/cost_model.py is linear in each constant it uses (a fixed cost, a
cost per id, row or weight, or bytes over a bandwidth, linear in 1 / bandwidth). So a run's
predicted time of each phase on each rank is `offset + sum_k theta_k * coefficient_k`, where
the coefficients come from simulating the run with one constant set to 1 and the others to 0
(bandwidths to the largest a profile takes): the fit uses the cost model's own formulas, never a copy of them.
One term is not linear: the all-reduce the sharded backward hides, a min() of two linear parts
(simulate's overlap). Both parts are designed apart, and each fitting round takes the side that
bounds the min() at that round's constants.

The constants are then fitted by non-negative least squares, first on error relative to the
measured time, then on log(predicted / measured) by Gauss-Newton rounds, over:
- per rank, the phases that are the rank's own work (embedding, dense, other);
- per run, each collective phase on the rank that waited least for it: a collective's time on
  a rank also holds its wait for the slowest rank, and the last to arrive waits for nobody;
- per run, the step time (each phase group on its slowest rank, as simulate's step);
- weak prior rows pulling each constant towards the starting profile's (its micro-benchmarks),
  so a constant the runs barely exercise keeps its measured value; each relative to the start's
  value or, where larger, to the value that makes PRIOR_FLOOR of the rows' time (a start too
  small to matter, such as a bandwidth a calibration left near infinite, must not pin its
  constant there when the runs say otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import numpy as np

from dlrm_scale.tools.runs import MeasuredRun
from dlrm_scale.run_record import COLLECTIVE_GROUPS, PHASE_GROUPS
from dlrm_scale.tools.simulate import simulate
from planner.plan.document import Plan
from planner.spec.problem import PlanningProblem
from planner.spec.specs import ClusterSpec

# The constants fitted, by profile key. A bandwidth is fitted as its reciprocal; "link_gb_per_s"
# stands for the intra- and inter-node links at once (one node measures only one of them).
FITTED = ("kernel_launch_ms", "lookup_fwd_ns", "lookup_bwd_ns", "lookup_bwd_row_ns", "lookup_fwd_weight_ns", "lookup_bwd_weight_ns",
          "ddr_gb_per_s", "collective_latency_ms",
          "comm_shard_ms", "comm_byte_ns", "link_gb_per_s", "input_id_ns", "bucketize_id_ns", "reduce_byte_ns",
          "dense_grad_ns", "dense_update_ns", "replica_table_ms", "dense_gflops", "interaction_value_ns", "pooled_value_ns", "column_permute_value_ns",
          "dense_overhead_ms", "step_overhead_ms", "table_overhead_ms")
RECIPROCAL = {"ddr_gb_per_s", "link_gb_per_s", "dense_gflops"}
LINKS = ("intra_node_gb_per_s", "inter_node_gb_per_s")
OWN_WORK = tuple(g for g in PHASE_GROUPS if g not in COLLECTIVE_GROUPS)
PHASE_GROUPS_INDEX = {g: i for i, g in enumerate(PHASE_GROUPS)}
ALL_REDUCE = PHASE_GROUPS_INDEX["all_reduce"]  # the phase the overlap hides part of
NO_TIME_GB_PER_S = float(2**40)  # the largest bandwidth a profile takes: its bytes then cost nothing
PRIOR_WEIGHT = 0.05  # a prior row weighs as much as a 5%-error on one phase of one run
PRIOR_FLOOR = 0.1  # a constant's prior is relative to at least the value that makes 10% of the rows' time
FLOOR_OF_STEP = 0.02  # a phase under 2% of its step is weighed as if it were 2%: its timer's noise is larger
# Error relative to the measurement alone favours predicting low (a prediction 30% under a slow
# run costs less than one 30% over a fast run): fitted that way, the cost-model benchmark's
# held-out steps came out 7.5% short on median. Log error is symmetric; its Gauss-Newton rounds
# from the linear fit settle by the third on that benchmark's runs.
LOG_ROUNDS = 4


def gb_per_s(per_gb_per_s: float) -> float:
    """A bandwidth from its reciprocal (1 / (GB/s)), as fits solve for it; none measured: the
    largest a profile takes."""
    return min(1.0 / per_gb_per_s, NO_TIME_GB_PER_S) if per_gb_per_s > 0 else NO_TIME_GB_PER_S


def profile_values(cluster: ClusterSpec) -> dict[str, float]:
    """The fitted constants of `cluster` as the fit sees them (bandwidths as reciprocals)."""
    values = {}
    for name in FITTED:
        value = getattr(cluster.costs, LINKS[0] if name == "link_gb_per_s" else name)
        # a throughput of 0 prices nothing (planner.cost.cost_model.dense_compute_ms), as the largest does
        values[name] = (1.0 / value if 0 < value < NO_TIME_GB_PER_S else 0.0) if name in RECIPROCAL else float(value)
    return values


def with_values(cluster: ClusterSpec, values: dict[str, float]) -> ClusterSpec:
    """`cluster` with its fitted constants replaced (reciprocals turned back into bandwidths)."""
    fields = {}
    for name, value in values.items():
        if name in RECIPROCAL:
            value = gb_per_s(value)
        for field in (LINKS if name == "link_gb_per_s" else (name,)):
            fields[field] = value
    return cluster.with_costs(**fields)


def fitted_fields(cluster: ClusterSpec, values: dict[str, float]) -> dict[str, float]:
    """The profile keys `values` set, as a profile writes them (bandwidths in GB/s)."""
    fitted = with_values(cluster, values)
    names = [f for name in FITTED for f in (LINKS if name == "link_gb_per_s" else (name,))]
    return {name: float(getattr(fitted.costs, name)) for name in names}


@dataclass(frozen=True)
class RunDesign:
    """One run's predicted phases as `offset + coefficients @ theta`, per rank and group, before
    the all-reduce the sharded backward hides (simulate's overlap, a min() of two linear parts:
    `overlap_*` row 0 is the replicas' all-reduce, row 1 + r rank r's sharded backward)."""

    run: MeasuredRun
    offset: np.ndarray  # (ranks, groups)
    coefficients: np.ndarray  # (ranks, groups, constants)
    overlap_offset: np.ndarray  # (1 + ranks,)
    overlap_coefficients: np.ndarray  # (1 + ranks, constants)

    def linear_at(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(offset, coefficients) of the phases, the hidden all-reduce taken on the side of the
        min() that bounds it at `theta` (each fitting round re-linearises there)."""
        sides = self.overlap_offset + self.overlap_coefficients @ theta
        side = 0 if sides[0] <= sides[1:].max(initial=0.0) else 1 + int(sides[1:].argmax())
        offset, coefficients = self.offset.copy(), self.coefficients.copy()
        offset[:, ALL_REDUCE] -= self.overlap_offset[side]
        coefficients[:, ALL_REDUCE] -= self.overlap_coefficients[side]
        return offset, coefficients


def _linear_parts(plan: Plan, problem: PlanningProblem, model, dense_optimizer: str) -> tuple[np.ndarray, ...]:
    """(offset, coefficients, overlap offset, overlap coefficients) of `plan`'s phases, as
    RunDesign keeps them."""
    zero = dict.fromkeys(FITTED, 0.0)

    def parts(values: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
        p = replace(problem, cluster=with_values(problem.cluster, values))
        sim = simulate(plan, p, model, dense_optimizer)
        phases = np.array([[r.phases_ms[g] for g in PHASE_GROUPS] for r in sim.ranks])
        phases[:, ALL_REDUCE] += sim.overlap.hidden_ms
        return phases, np.array([sim.overlap.replica_all_reduce_ms, *sim.overlap.sharded_backward_ms])

    offset, overlap_offset = parts(zero)
    columns = [parts({**zero, name: 1.0}) for name in FITTED]
    return (offset, np.stack([c[0] - offset for c in columns], axis=-1),
            overlap_offset, np.stack([c[1] - overlap_offset for c in columns], axis=-1))


def design(run: MeasuredRun) -> RunDesign:
    return RunDesign(run, *_linear_parts(run.plan, run.run.problem, run.run.model, run.run.train.dense_optimizer))


def _used(coefficients: np.ndarray, overlap_coefficients: np.ndarray) -> frozenset[str]:
    """The constants with a coefficient anywhere in a design."""
    used = (np.abs(coefficients).sum(axis=(0, 1)) + np.abs(overlap_coefficients).sum(axis=0)) > 0
    return frozenset(name for name, u in zip(FITTED, used) if u)


def exercised(plan: Plan, problem: PlanningProblem, model, dense_optimizer: str) -> frozenset[str]:
    """The fitted constants `plan`'s predicted step depends on: a run of it measures them, and a
    fit to runs that exercise none of them has nothing to set them by (they keep the starting
    profile's values, which a datasheet profile leaves at 0 for work its device does not do)."""
    _, coefficients, _, overlap_coefficients = _linear_parts(plan, problem, model, dense_optimizer)
    return _used(coefficients, overlap_coefficients)


def nonnegative_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with x >= 0: drop the most negative unknown and refit until none is."""
    active = list(range(a.shape[1]))
    while True:
        x_active, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        if np.all(x_active >= 0) or not active:
            x = np.zeros(a.shape[1])
            x[active] = x_active
            return x
        active.pop(int(np.argmin(x_active)))


def least_waiting_rank(phases_ms: Sequence[dict[str, float]], group: str) -> int:
    """The rank whose measured time of a collective phase group compares with a prediction: the
    one that waited least for it (a collective's time on a rank also holds its wait for the
    slowest rank, and the last to arrive waits for nobody)."""
    return min(range(len(phases_ms)), key=lambda r: phases_ms[r][group])


def _rows(d: RunDesign, theta: np.ndarray) -> list[tuple[np.ndarray, float, float, float]]:
    """(coefficients, offset, measured target, floor) of each fitted row of one run, linear at
    `theta`: predicted = offset + coefficients @ theta."""
    measured = np.array([[r[g] for g in PHASE_GROUPS] for r in d.run.phases_ms])
    offset, coefficients = d.linear_at(theta)
    index = PHASE_GROUPS_INDEX
    rows = []
    for r in range(measured.shape[0]):
        for g in OWN_WORK:
            rows.append((coefficients[r, index[g]], offset[r, index[g]], measured[r, index[g]]))
    waited_least = {g: least_waiting_rank(d.run.phases_ms, g) for g in COLLECTIVE_GROUPS}
    for g, r in waited_least.items():
        rows.append((coefficients[r, index[g]], offset[r, index[g]], measured[r, index[g]]))
    # the step: each group on its slowest rank (simulate's step), linearised where the run had it
    slowest = [waited_least[g] if g in COLLECTIVE_GROUPS else int(measured[:, i].argmax()) for i, g in enumerate(PHASE_GROUPS)]
    step = d.run.step_ms
    rows.append((sum(coefficients[r, i] for i, r in enumerate(slowest)), sum(offset[r, i] for i, r in enumerate(slowest)), step))
    return [(*row, FLOOR_OF_STEP * step) for row in rows]


@dataclass(frozen=True)
class Fit:
    values: dict[str, float]  # by FITTED name (bandwidths as reciprocals)
    runs: int
    residuals: dict[str, float]  # median |relative error| over the fitted runs: step, and each phase group
    exercised: frozenset[str]  # the constants the runs measured (`exercised` by one of their plans); the rest kept their start


def _solve(rows: Sequence[tuple[np.ndarray, float]], start: ClusterSpec) -> np.ndarray:
    """Non-negative least squares over (coefficients, target) rows (both relative to the
    measurement), plus the weak prior rows of the module's docstring."""
    a, b = [c for c, _ in rows], [t for _, t in rows]
    rms_effect = np.sqrt(np.mean(np.square(np.array(a)), axis=0))  # relative time per unit of each constant
    prior = profile_values(start)
    for k, name in enumerate(FITTED):
        if prior[name] > 0:
            scale = max(prior[name], PRIOR_FLOOR / rms_effect[k]) if rms_effect[k] > 0 else prior[name]
            row = np.zeros(len(FITTED))
            row[k] = PRIOR_WEIGHT / scale
            a.append(row)
            b.append(PRIOR_WEIGHT * prior[name] / scale)
    return nonnegative_lstsq(np.array(a), np.array(b))


def _relative(c: np.ndarray, offset: float, target: float, floor: float) -> tuple[np.ndarray, float]:
    """A row as error relative to its measured target (a target under the floor weighed as the floor)."""
    scale = max(target, floor)
    return c / scale, (target - offset) / scale


def fit_runs(runs: Sequence[MeasuredRun], start: ClusterSpec) -> Fit:
    """The constants that best predict `runs`' phases, from `start`'s (its values are the priors)."""
    designs = [design(run) for run in runs]
    theta = np.array([profile_values(start)[name] for name in FITTED])
    theta = _solve([_relative(*row) for d in designs for row in _rows(d, theta)], start)
    for _ in range(LOG_ROUNDS):
        linearised = []
        for c, offset, target, floor in (row for d in designs for row in _rows(d, theta)):
            if target < floor:  # kept relative, as in the first fit
                linearised.append(_relative(c, offset, target, floor))
                continue
            # log(offset + c.x) ~ log(predicted) + c.(x - theta) / predicted, set equal to log(target)
            fitted = c @ theta
            predicted = max(offset + fitted, floor)
            linearised.append((c / predicted, np.log(target / predicted) + fitted / predicted))
        theta = _solve(linearised, start)
    values = dict(zip(FITTED, (float(x) for x in theta)))
    measured = frozenset().union(*(_used(d.coefficients, d.overlap_coefficients) for d in designs))
    return Fit(values, len(runs), residuals(runs, values), measured)


def residuals(runs: Sequence[MeasuredRun], values: dict[str, float]) -> dict[str, float]:
    """Median |relative error| of predicted against measured: the step, and each phase group
    where the runs spend at least 2% of their step on it (own work per rank, collectives on
    the rank that waited least)."""
    errors: dict[str, list[float]] = {"step": [], **{g: [] for g in PHASE_GROUPS}}
    for run in runs:
        compared = compare(run, values)
        errors["step"].append(abs(compared.predicted_step_ms / run.step_ms - 1))
        for g, (predicted, measured) in compared.fair_phases.items():
            if measured >= FLOOR_OF_STEP * run.step_ms:
                errors[g].append(abs(predicted / measured - 1))
    return {k: float(np.median(v)) for k, v in errors.items() if v}


@dataclass(frozen=True)
class Comparison:
    predicted: tuple[dict[str, float], ...]  # per rank, by group
    predicted_step_ms: float
    # per group, (predicted, measured) where the two compare: own work on the busiest rank,
    # a collective on the rank that waited least for it
    fair_phases: dict[str, tuple[float, float]]


    def format(self, run: MeasuredRun, misses: int = 3) -> str:
        """Predicted beside measured per rank and phase group, and the largest misses named."""
        ranks = range(len(self.predicted))
        lines = [f"{'phase ms':<11}" + "".join(f"{f'rank {r} pred':>13}{'measured':>10}" for r in ranks)]
        for g in PHASE_GROUPS:
            lines.append(f"{g:<11}" + "".join(f"{self.predicted[r][g]:>13.3f}{run.phases_ms[r][g]:>10.3f}" for r in ranks))
        lines.append(f"{'sum':<11}" + "".join(f"{sum(self.predicted[r].values()):>13.3f}{sum(run.phases_ms[r].values()):>10.3f}"
                                              for r in ranks))
        error = self.predicted_step_ms / run.step_ms - 1
        lines.append(f"step: predicted {self.predicted_step_ms:.3f} ms, measured {run.step_ms:.3f} ms "
                     f"(median of {run.windows} windows), {100 * error:+.1f}%")
        worst = sorted(self.fair_phases.items(), key=lambda kv: -abs(kv[1][0] - kv[1][1]))[:misses]
        lines.append("largest misses (collectives on the rank that waited least, as the others' include waiting): "
                     + "; ".join(f"{g} {p:.3f} predicted vs {m:.3f} measured ({p - m:+.3f} ms)" for g, (p, m) in worst))
        return "\n".join(lines)


def compare(run: MeasuredRun, values: dict[str, float] | None = None) -> Comparison:
    """The run against its prediction, under its own profile or with `values` fitted into it."""
    problem = run.run.problem
    if values is not None:
        problem = replace(problem, cluster=with_values(problem.cluster, values))
    sim = simulate(run.plan, problem, run.run.model, run.run.train.dense_optimizer)
    predicted = tuple(r.phases_ms for r in sim.ranks)
    measured = run.phases_ms
    busiest = max(range(len(measured)), key=lambda r: sum(measured[r][g] for g in OWN_WORK))
    fair = {}
    for g in PHASE_GROUPS:
        r = least_waiting_rank(measured, g) if g in COLLECTIVE_GROUPS else busiest
        fair[g] = (predicted[r][g], measured[r][g])
    return Comparison(predicted, sim.step_ms, fair)

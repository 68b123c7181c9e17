"""A profile refitted to finished runs (`dlrm-scale calibrate --from-runs`), torch-free: it reads
the runs' records and fits, and measures nothing."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from dlrm_scale.tools.fit import Fit, fit_runs, fitted_fields
from dlrm_scale.tools.runs import MeasuredRun, load_run
from planner.spec.config import hardware_path, read_yaml
from planner.spec.errors import ConfigError


def yaml_value(value) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    if isinstance(value, str) and any(c in value for c in ":#{}[],&*!|>'\"%@`"):
        return json.dumps(value)  # a CPU's name, say: quoted, so YAML reads it back as written
    return str(round(value, 6) if isinstance(value, float) else value)


def write_profile(out: Path, profile: dict, header: str) -> None:
    lines = [f"{k}: {yaml_value(v)}" for k, v in profile.items()]
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(header + "\n".join(lines) + "\n")
    tmp.replace(out)


def refit_from_runs(run_dirs: list[Path], start: str, out: Path, header: str | None = None) -> tuple[dict, Fit]:
    """`start`'s profile (a name or .yaml path) with every constant refitted to the runs in
    `run_dirs`, written to `out`; the profile records what it was fitted on and its residuals."""
    return refit([load_run(d, start) for d in run_dirs], start, out, header)


def refit(runs: list[MeasuredRun], start: str, out: Path, header: str | None = None,
          measured_on: str | None = None) -> tuple[dict, Fit]:
    """The same for runs already read back, priced with `start`; `measured_on`: the CPU the runs
    ran on where it is known (a job refitting itself), so that a job started from the profile on
    that CPU takes its kernels as measured there."""
    kernels = {(r.run.train.cpu_embeddings, r.run.train.interaction) for r in runs}
    if len(kernels) > 1:
        raise ConfigError(f"calibrate --from-runs: the runs trained with different CPU kernels ({', '.join(sorted(map(str, kernels)))}); "
                          "fit each kernel's runs into a profile of its own")
    fit = fit_runs(runs, runs[0].run.problem.cluster)
    profile = {**read_yaml(hardware_path(start), "hardware profile"), "name": out.stem}
    for name, value in fitted_fields(runs[0].run.problem.cluster, fit.values).items():
        profile[name] = value
    (embeddings, interaction), = kernels
    # the kernels the constants describe (the store's, not refitted here, keep the profile's store_io)
    profile["cpu_kernels"] = {**(profile.get("cpu_kernels") or {}), "embeddings": embeddings, "interaction": interaction}
    if measured_on is not None:
        profile["measured_on"] = measured_on
    profile["fitted_on"] = {"runs": len(runs), "tables": f"{min(len(r.run.problem.tables) for r in runs)}-"
                            f"{max(len(r.run.problem.tables) for r in runs)}", "ranks": ",".join(sorted({str(r.plan.world_size) for r in runs}))}
    profile["fit_residuals"] = {k: round(v, 4) for k, v in fit.residuals.items()}
    header = header or (f"# Refitted by `dlrm-scale calibrate --from-runs` from {start} on {len(runs)} runs, "
                        f"{datetime.date.today().isoformat()}.\n")
    write_profile(out, profile, header)
    return profile, fit

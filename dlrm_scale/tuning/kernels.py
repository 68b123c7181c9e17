"""A self-tuning job's CPU kernels: where its profile was not measured on this CPU (a datasheet
profile, another machine's), the kernels no flag or config named are measured here before the
first step, as `dlrm-scale calibrate --kernels-only` measures them. Retuning refits constants
and replans, never kernels, so a job priced with another machine's kernels would otherwise run
them throughout: the datasheet h100_dgx profile measured none, so its CPU jobs ran TorchRec's dot
interaction, about twice ours here, for 9 of the 23 points its plan of the retune benchmark's
mix 4 was below the calibrated run's.

The ranks share the kinds out and measure at once, then exchange the winners; every rank runs
the same kernels. The job's refitted profile records them (dlrm_scale.tools.refit), so the next
job starts from them. The SSD store's read path is not measured here (it needs the store's
disk): it stays the profile's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import replace

import torch.distributed as dist

from dlrm_scale.bridge.broadcast import gather_text
from dlrm_scale.run_config import KERNEL_FIELDS, RunConfig, measured_here
from dlrm_scale.tools.kernel_choice import TIMERS, choose_cpu_kernels
from dlrm_scale.training.host_group import host_group


def kinds_to_measure(run: RunConfig, device_type: str) -> tuple[str, ...]:
    """The kernel kinds a job measures before its first step: on CPU, with --retune, those it took
    from a profile not measured on this CPU."""
    if device_type != "cpu" or not run.retune.enabled or run.profile is None or measured_here(run.profile):
        return ()
    return tuple(kind for kind in TIMERS if kind in run.kernels_from_profile)


def with_kernels_measured_here(run: RunConfig, kinds: tuple[str, ...], rank: int) -> RunConfig:
    """`run` with each of `kinds` the faster kernel as measured here (the same on every rank).
    The kinds are shared out over the ranks, which measure at once, as they train: on one CPU
    the measurements contend as the steps will."""
    group = host_group()
    world = dist.get_world_size(group)
    chosen, times = choose_cpu_kernels(kinds=kinds[rank::world])  # none: nothing measured
    for share in map(json.loads, gather_text(group, json.dumps([chosen, times]))):
        chosen, times = {**chosen, **share[0]}, {**times, **share[1]}
    if rank == 0:
        shown = "; ".join(f"{kind} {chosen[kind]} (" + ", ".join(f"{name} {statistics.median(ms):.2f} ms" for name, ms in times[kind].items()) + ")"
                          for kind in kinds)
        print(f"retune: profile {run.profile} was not measured on this CPU; CPU kernels measured here: {shown}", flush=True)
    return replace(run, train=replace(run.train, **{KERNEL_FIELDS[kind]: chosen[kind] for kind in kinds}))

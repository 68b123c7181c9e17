"""The torchrun entry point (its flags and checks: dlrm_scale.training.flags):

    torchrun --nproc_per_node 2 -m dlrm_scale.train --config configs/tiny.yaml --steps 100
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import sys
import weakref
from dataclasses import replace
from pathlib import Path

import torch
import torch.distributed as dist

from dlrm_scale import quiet
from dlrm_scale.bridge.resident import resident_plan
from dlrm_scale.run_config import RunConfig, measured_elsewhere
from dlrm_scale.tiering.runtime import check_row_cache_rows, check_store_directory
from dlrm_scale.training.flags import TrainJob, check_given_plan, check_job, parse_args
from dlrm_scale.training.host_group import host_group, init_host_group
from dlrm_scale.training import outcome, preemption, watchdog
from dlrm_scale.training import checkpoint_layout as ckpt_layout
from dlrm_scale.training.rank_end import end_rank
from dlrm_scale.tuning.kernels import kinds_to_measure, with_kernels_measured_here
from dlrm_scale.tuning.tuner import Tuner
from planner.spec.errors import ConfigError, PlannerError
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.spec.schemes import check_precisions_trainable

def die_with_launcher() -> None:
    """torchrun starts each worker in a process group of its own, so killing the launcher's
    group would leave the workers training, and writing checkpoints, on their own: the kernel
    kills this worker when its parent (torchrun's agent) dies."""
    preemption.die_with_parent(signal.SIGKILL)


def local_gpu(local_rank: int, gpus: int) -> torch.device:
    """The GPU of this rank: one per rank (NCCL refuses two ranks on one GPU)."""
    if local_rank >= gpus:
        raise ConfigError(f"local rank {local_rank} has no GPU of its own: this machine has {gpus}; "
                          f"start at most {gpus} ranks per node (--nproc_per_node {gpus})")
    return torch.device(f"cuda:{local_rank}")


def init_distributed(timeout_s: float) -> tuple[int, int, torch.device]:
    if "RANK" not in os.environ:
        raise ConfigError("not started by torchrun: use 'torchrun --nproc_per_node N -m dlrm_scale.train ...' or 'dlrm-scale train'")
    die_with_launcher()
    cuda = torch.cuda.is_available()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's agent hosts the store; otherwise rank 0 does. Keys live under the restart
    # round, so workers restarted by --max-restarts never read the dead round's addresses.
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_store and rank == 0, timeout=datetime.timedelta(minutes=10))
    round_prefix = f"dlrm_scale/round{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    device = local_gpu(int(os.environ.get("LOCAL_RANK", 0)), torch.cuda.device_count()) if cuda else torch.device("cpu")
    job_store = dist.PrefixStore(round_prefix, store)
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend="nccl" if cuda else "gloo", store=job_store, rank=rank, world_size=world, timeout=timeout)
    init_host_group(cuda, timeout)
    watchdog.init(job_store, rank, world, timeout_s)
    if cuda:
        torch.cuda.set_device(device)
    return rank, dist.get_world_size(), device


def obtain_plan(job: TrainJob, run: RunConfig, rank: int) -> Plan:
    """The given plan, checked against the run (its tables and the inputs it was made for); or
    one made on rank 0 and broadcast."""
    if job.plan_path:
        plan = Plan.load(job.plan_path)
        why = check_given_plan(plan, job, run)
        if why and rank == 0:
            print(f"warning: training plan {job.plan_path} though {why} (--ignore-plan-inputs)", flush=True)
        return plan
    box = [None]
    if rank == 0:
        if job.planner == "torchrec":
            from dlrm_scale.bridge.torchrec_cost import torchrec_planner_plan

            box[0] = torchrec_planner_plan(run.problem)[0].to_dict()
        else:
            box[0] = make_plan(run.problem).to_dict()
    dist.broadcast_object_list(box, src=0)
    return Plan.from_dict(box[0], source="broadcast plan")


def check_plan_runs(plan: Plan, run: RunConfig, device: str, ranks: list[int]) -> None:
    """What a plan needs of this machine: comm precisions its schemes can use here, and (CPU)
    cached tables that can be cached on CPU (their rows within the row cache's index), with room for their SSD rows."""
    training = run.problem.training
    check_precisions_trainable({n: t.sharding_type for n, t in plan.tables.items()}, training.fwd_comm_precision,
                               training.bwd_comm_precision, device)
    cached = [n for n, t in plan.tables.items() if t.cached]
    if plan.replication is not None and cached:  # a sync's copy of a cached table would be the whole table in device memory
        raise ConfigError(f"plan is 2D and caches table '{cached[0]}'; 2D keeps every sharded table and its replicas' copy in "
                          f"device memory: re-plan with dlrm-scale plan --sync-every N, or 1D")
    if device == "cpu":
        resident_plan(plan)  # a cached table that cannot be cached on CPU is one line, here
        check_row_cache_rows(plan)
        store = run.train.store_dir
        check_store_directory(plan, ranks, Path(store) if store else None, training.embedding_optimizer, run.train.store_io)


def train_under_plans(run: RunConfig, plan: Plan, device: torch.device, rank: int, world: int, out_dir: Path,
                      data_path: str | None, resume: bool, tuner=None):
    """Train `run` under `plan` and, each time the tuner moves the job, on under the new plan from
    the checkpoint of the step it stopped at; yields each trainer as it starts (a caller keeps
    none past the next: a trainer that stopped for a move is let go, and the next one is built in
    the memory its tables held, not beside them). The batches a trainer made before its loop go
    on to the next (a step's batch does not depend on the plan). OUT_DIR/plan.json is the plan
    the job trains under."""
    from dlrm_scale.training.trainer import Trainer

    if rank == 0:
        plan.save(out_dir / "plan.json")
    held = None
    while True:
        trainer = Trainer(run, plan, device, rank, world, out_dir, data_path=data_path, resume=resume, tuner=tuner, held=held)
        yield trainer
        trainer.run()
        if trainer.next_plan is None:
            return
        held = trainer.held
        why = None
        try:
            check_plan_runs(trainer.next_plan, run, device.type, [rank])
        except ConfigError as e:
            why = str(e)
        runs_everywhere = torch.tensor([why is None], dtype=torch.int64)  # one answer for all ranks (a rank's store may differ)
        dist.all_reduce(runs_everywhere, op=dist.ReduceOp.MIN, group=host_group())
        if runs_everywhere.item():
            plan = trainer.next_plan
            if rank == 0:
                plan.save(out_dir / "plan.json")
        else:  # nothing is lost: on under the plan in use, from the checkpoint just saved
            tuner.move_refused()
            if rank == 0:
                print(f"retune: the new plan cannot run on every rank ({why or 'another rank refused it'}); going on under the plan in use",
                      flush=True)
        saved = ckpt_layout.step_dir(run.checkpoint.directory, trainer.stopped_at)
        run, resume = replace(run, checkpoint=replace(run.checkpoint, resume_from=str(saved))), True
        trainer = None
        gc.collect()  # a sharded model's modules and hooks refer to each other: freed only by the collector


def main(argv: list[str] | None = None) -> int:
    job = None
    try:
        job = check_job(parse_args(argv))
        quiet.install(job.out_dir / f"third_party_rank{os.environ.get('RANK', 0)}.log")
        rank, world, device = init_distributed(job.collective_timeout_s)
        run = job.on_cluster(world, int(os.environ.get("LOCAL_WORLD_SIZE", world)), device.type)
        kinds = kinds_to_measure(run, device.type)
        if kinds:  # --retune: what the profile says of this CPU's kernels is measured instead
            run = with_kernels_measured_here(run, kinds, rank)
        elif device.type == "cpu" and rank == 0 and (elsewhere := measured_elsewhere(run.profile)):
            print(f"warning: {elsewhere}", flush=True)
        plan = obtain_plan(job, run, rank)
        check_plan_runs(plan, run, device.type, [rank])
        tuner = Tuner(run.retune, job.out_dir, str(run.profile), rank, run.checkpoint.directory) if run.retune.enabled else None
        running = None
        try:
            for trainer in train_under_plans(run, plan, device, rank, world, job.out_dir, job.data_path, job.resume, tuner):
                running = weakref.ref(trainer)  # for the step a peer's failure stopped it at
                del trainer
        except RuntimeError as e:
            if not watchdog.peer_failure(e):
                raise
            trainer = running() if running is not None else None
            line = watchdog.describe(trainer.step if trainer is not None else 0)
            outcome.report(job.out_dir, rank, line, watchdog.EXIT_CODE)
            print(f"error: {line}", file=sys.stderr, flush=True)
            os._exit(watchdog.EXIT_CODE)  # no teardown: it would wait on the peer that is gone
        end_rank(0)
    except PlannerError as e:
        outcome.report(job.out_dir if job is not None else None, int(os.environ.get("RANK", 0)), str(e), 2)
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

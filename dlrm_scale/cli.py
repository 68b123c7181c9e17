"""`dlrm-scale` command line: plan | train | calibrate | simulate | profile | explain | diff | export.

Errors a user can cause end in one line on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dlrm_scale import options, quiet
from dlrm_scale.run_config import Overrides, load_run_config
from planner.spec.errors import ConfigError, PlannerBugError, PlannerError
from planner.plan.document import Plan
from planner.plan.planning import make_plan
from planner.plan.replication import check_group_size, check_sync_every, plan_replicated
from planner.views.report import format_plan, plot_plan
from planner.search import progress
from planner.search.solver import SolverConfig


def check_output_file(flag: str, path: str | None) -> None:
    """An output path a command will write, checked before its work starts: not a directory,
    in a folder that exists and takes a file."""
    if path is None:
        return
    out = Path(path)
    if out.is_dir():
        raise ConfigError(f"{flag} {out} is a directory; give a file path in it")
    if not out.parent.is_dir():
        raise ConfigError(f"{flag} {out}: folder {out.parent} does not exist; create it or choose another {flag}")
    try:
        with tempfile.TemporaryFile(dir=out.parent):
            pass
    except OSError as e:
        raise ConfigError(f"{flag} {out}: folder {out.parent} cannot be written ({e.strerror}); choose another {flag}") from None


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="shard embedding tables over a cluster and write a plan JSON")
    p.add_argument("config", nargs="?", help="YAML config (tables, cluster, training)")
    options.add_all(p, "--tables", "--hardware", "--world-size", "--ranks-per-node", "--hbm-gb", "--batch-size", "--comm-precision",
                    "--embedding-optimizer", "--device", "--time-limit", "--gap", "--cost-model", "--stats", "--sync-every",
                    "--group-size")
    options.add(p, "--out", required=True, more="the plan JSON")
    options.add_all(p, "--plot", "--compare", "--from", "--max-move-gb")

def add_train_parser(sub) -> None:
    p = sub.add_parser("train", add_help=False, help="start torchrun with dlrm_scale.train (its flags follow the launcher's)")
    p.add_argument("-h", "--help", action="store_true")
    options.add_all(p, *LAUNCHER_FLAGS)


def add_profile_parser(sub) -> None:
    p = sub.add_parser("profile", help="access statistics per table (pooling, distinct ids, LRU/LFU hit-rate curves)")
    p.add_argument("config", help="YAML config (tables, cluster, training)")
    options.add_all(p, "--data", "--data-path", "--batches", "--batch-size", "--world-size", "--seed")
    options.add(p, "--out", required=True, more="the stats.json")

def run_profile(args: argparse.Namespace) -> int:
    from dlrm_scale.tools.profile import profile_access
    from planner.spec.access_stats import save_stats

    if args.data == "criteo" and not args.data_path:
        raise ConfigError("profile: --data criteo needs --data-path")
    check_output_file("--out", args.out)
    run = load_run_config(args.config, Overrides.from_args(args))
    problem = run.problem
    start = time.perf_counter()
    stats = profile_access(problem, run.model.num_dense_features, args.batches,
                           args.data_path if args.data == "criteo" else None, run.train.seed)
    save_stats(stats, args.out, f"{args.data} data, {args.batches} steps of {problem.training.batch_size_per_rank * problem.cluster.world_size} samples")
    print(f"{'table':<20} {'ids/sample':>10} {'distinct':>10} {'uniq/step':>10} {'LRU@10%':>8} {'LFU@10%':>8}")
    for name, a in stats.items():
        print(f"{name:<20} {a.pooling_factor:>10.2f} {a.distinct_ids:>10,} {a.unique_ids_per_batch:>10,.0f} "
              f"{a.lru.at(0.1):>8.3f} {a.lfu.at(0.1):>8.3f}")
    print(f"wrote {args.out} in {time.perf_counter() - start:.1f} s")
    return 0


def add_simulate_parser(sub) -> None:
    p = sub.add_parser("simulate", help="per-rank cost breakdown, step time and memory of a plan")
    p.add_argument("plan", help="plan JSON")
    options.add(p, "--config", more="the plan's (with --measured, the run's own)")
    options.add_all(p, "--hardware", "--batch-size", "--comm-precision", "--measured", "--stats", "--json")

def run_simulate(args: argparse.Namespace) -> int:
    import json

    from dlrm_scale.tools.simulate import simulate

    check_output_file("--json", args.json)
    plan = Plan.load(args.plan)
    if args.measured:
        return simulate_measured(args, plan)
    if not args.config:
        raise ConfigError("simulate: give the plan's --config (or --measured RUN_DIR, a run of it)")
    run = run_for_plan(args, plan)
    result = simulate(plan, run.problem, run.model, run.train.dense_optimizer)
    print(result.format())
    if args.json:
        Path(args.json).write_text(json.dumps(result.to_dict(), indent=1) + "\n")
    return 0


def simulate_measured(args: argparse.Namespace, plan: Plan) -> int:
    import json

    from dlrm_scale.tools.fit import compare
    from dlrm_scale.tools.runs import load_run

    for flag, value in (("--config", args.config), ("--batch-size", args.batch_size), ("--comm-precision", args.comm_precision)):
        if value is not None:
            raise ConfigError(f"simulate --measured: {flag} cannot apply, the run recorded what it trained; drop {flag}")
    measured = load_run(args.measured, args.hardware, args.stats)
    if measured.plan.to_dict()["tables"] != plan.to_dict()["tables"]:
        raise ConfigError(f"simulate --measured: {args.measured} trained another plan than {args.plan}; "
                          f"give its own, {Path(args.measured) / 'plan.json'}")
    comparison = compare(measured)
    print(comparison.format(measured))
    if args.json:
        Path(args.json).write_text(json.dumps({"predicted": comparison.predicted, "measured": measured.phases_ms,
                                               "predicted_step_ms": comparison.predicted_step_ms, "measured_step_ms": measured.step_ms},
                                              indent=1) + "\n")
    return 0


def add_explain_parser(sub) -> None:
    p = sub.add_parser("explain", help="why a plan is what it is: its busiest rank, and per table the best alternatives")
    p.add_argument("plan", help="plan JSON")
    options.add(p, "--config", required=True, more="the plan's")
    options.add_all(p, "--table", "--hardware", "--stats", "--cost-model")

def run_for_plan(args: argparse.Namespace, plan: Plan):
    """The config's run on the plan's cluster shape (other flags as what-ifs), checked against
    the plan's tables."""
    from planner.plan.document import check_plan_tables

    run = load_run_config(args.config, Overrides.from_args(args, world_size=plan.world_size, ranks_per_node=plan.ranks_per_node))
    check_plan_tables(plan, run.problem)
    return run


def cost_model_for(name: str, problem):
    from planner.cost.cost_model import AnalyticCostModel

    if name == "torchrec":
        from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel

        return TorchRecCostModel(problem)
    return AnalyticCostModel(problem.cluster, problem.training)


def run_explain(args: argparse.Namespace) -> int:
    from planner.views.explain import explain

    plan = Plan.load(args.plan)
    problem = run_for_plan(args, plan).problem
    if args.table is not None and args.table not in plan.tables:
        raise ConfigError(f"--table {args.table!r} is not in the plan; its tables: {', '.join(list(plan.tables)[:8])}")
    print(explain(plan, problem, cost_model_for(args.cost_model, problem), args.table).format())
    return 0


def add_diff_parser(sub) -> None:
    p = sub.add_parser("diff", help="what changes between two plans: layouts, bytes that move, predicted time")
    p.add_argument("before", help="plan JSON")
    p.add_argument("after", help="plan JSON")
    options.add(p, "--config", more="re-cost both plans under this config's model (default: each plan's own prediction)")

def run_diff(args: argparse.Namespace) -> int:
    from planner.views.diff import diff_plans
    from planner.views.scoring import rank_times_ms

    before, after = Plan.load(args.before), Plan.load(args.after)
    optimizer, before_ms, after_ms = "rowwise_adagrad", None, None
    if args.config:
        costed = []
        for plan in (before, after):
            problem = run_for_plan(args, plan).problem
            costed.append(float(rank_times_ms(plan, problem, cost_model_for("ours", problem)).max()))
        before_ms, after_ms = costed
        optimizer = problem.training.embedding_optimizer
    print(diff_plans(before, after, optimizer, before_ms, after_ms).format())
    return 0


def add_export_parser(sub) -> None:
    p = sub.add_parser("export", help="a checkpoint's model unsharded, for evaluation or serving in one process")
    p.add_argument("checkpoint", help="a step_* folder of a checkpoint directory")
    options.add(p, "--config", required=True, more="the one the checkpoint was trained with")
    options.add(p, "--out", required=True, more="torch.load(..., weights_only=True) reads it")

def run_export(args: argparse.Namespace) -> int:
    from dlrm_scale.tools.export import export_checkpoint

    check_output_file("--out", args.out)
    checkpoint = Path(args.checkpoint)
    if not checkpoint.is_dir():
        raise ConfigError(f"checkpoint {checkpoint} is not a directory; give one of the step_* folders of a checkpoint directory")
    run = load_run_config(args.config)
    doc = export_checkpoint(checkpoint, list(run.problem.tables), run.model, run.problem.training.embedding_optimizer, Path(args.out))
    print(f"wrote {args.out}: the model at step {doc['step']}, {len(doc['tables'])} tables, unsharded")
    return 0


def add_calibrate_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="measure this machine and write a hardware profile")
    where = p.add_mutually_exclusive_group(required=True)
    options.add(where, "--name")
    options.add(where, "--out", more="the profile, at this path")
    options.add_all(p, "--nproc", "--quick", "--from-runs")
    options.add(p, "--hardware", more="with --from-runs, the profile to start from")
    options.add(p, "--kernels-only")

def named_profile_path(name: str) -> str:
    """Where `calibrate --name NAME` writes: the user's profile folder, made if missing."""
    from planner.spec.config import HARDWARE_DIR, user_hardware_dir

    if not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"calibrate --name {name!r}: use letters, digits, '-' and '_' only")
    if (HARDWARE_DIR / f"{name}.yaml").is_file():
        raise ConfigError(f"calibrate --name {name}: a profile of that name comes with dlrm-scale; choose another name")
    folder = user_hardware_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"calibrate --name: cannot create {folder} ({e.strerror}); set DLRM_SCALE_HARDWARE_DIR or use --out") from None
    return str(folder / f"{name}.yaml")


def run_calibrate(args: argparse.Namespace) -> int:
    if args.name is not None:
        args.out = named_profile_path(args.name)
    check_output_file("--out", args.out)
    if args.nproc < 1:
        raise ConfigError(f"--nproc must be at least 1, got {args.nproc}")

    if args.from_runs:
        from dlrm_scale.tools.refit import refit_from_runs
        from dlrm_scale.tools.runs import load_run

        if args.kernels_only or args.quick:
            raise ConfigError("calibrate --from-runs measures nothing itself; drop --kernels-only and --quick")
        start = args.hardware or load_run(args.from_runs[0]).run.problem.cluster.name
        profile, fit = refit_from_runs([Path(d) for d in args.from_runs], start, Path(args.out))
        print(f"refitted {start} to {fit.runs} runs; median |error| " + ", ".join(f"{k} {100 * v:.1f}%" for k, v in fit.residuals.items()))
        print(f"wrote {args.out}")
        return 0
    if args.hardware:
        raise ConfigError("calibrate: --hardware only applies with --from-runs (calibrate measures this machine)")
    from dlrm_scale.tools.calibrate import CalibrationConfig, calibrate, calibrate_kernels

    if args.kernels_only:
        kernels, times = calibrate_kernels(Path(args.out))
        for kind, per_kernel in times.items():
            print(f"{kind:>12}: " + ", ".join(f"{name} {min(t):.2f}-{max(t):.2f} ms" for name, t in per_kernel.items())
                  + f" -> {kernels[kind]}")
        print(f"wrote cpu_kernels to {args.out}")
        return 0

    cfg = CalibrationConfig(nproc=args.nproc)
    if args.quick:
        cfg = CalibrationConfig(nproc=args.nproc, dims=(16, 128), pooling_factors=(1, 16), rows=(100_000,), repeats=2,
                                comm_sizes_bytes=(1 << 14, 1 << 20, 1 << 22), replica_shapes=((10_000, 32), (50_000, 32)))
    profile = calibrate(Path(args.out), cfg)
    for key, value in profile.items():
        print(f"{key:>24}: {value}")
    print(f"wrote {args.out}")
    return 0


def run_plan(args: argparse.Namespace) -> int:
    if args.config is None and args.tables is None:
        raise ConfigError("nothing to plan: give a CONFIG.yaml or --tables FILE.csv")
    check_output_file("--out", args.out)
    check_output_file("--plot", args.plot)
    if not (math.isfinite(args.time_limit) and args.time_limit > 0):
        raise ConfigError(f"--time-limit must be a positive number of seconds, got {args.time_limit}")
    if not (math.isfinite(args.gap) and 0 <= args.gap < 1):
        raise ConfigError(f"--gap takes a fraction of the lower bound in [0, 1), e.g. 0.01 for 1%; got {args.gap}")
    if args.max_move_gb is not None and (args.from_plan is None or not (math.isfinite(args.max_move_gb) and args.max_move_gb >= 0)):
        raise ConfigError("--max-move-gb takes a non-negative number of GiB, with --from OLD.json")
    old = Plan.load(args.from_plan) if args.from_plan else None
    if old is not None and args.compare:
        raise ConfigError("--compare plans from scratch; drop it or --from")
    two_d = args.sync_every is not None or args.group_size is not None
    if two_d:
        if args.sync_every is None:
            raise ConfigError("--group-size shards over groups replicated and synced every N steps: give --sync-every N too")
        check_sync_every(args.sync_every)
        if old is not None or args.compare or args.cost_model != "ours":
            raise ConfigError("--sync-every plans 2D with our cost model from scratch; drop --from, --compare and --cost-model torchrec")
    problem = load_run_config(args.config, Overrides.from_args(args)).problem
    if args.group_size is not None:
        check_group_size(problem.cluster, args.group_size)
    solver = SolverConfig(time_limit_s=args.time_limit, target_gap=args.gap)
    cost_model = None
    if args.cost_model == "torchrec":
        from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel

        cost_model = TorchRecCostModel(problem)
    start = time.perf_counter()
    with ProgressLine.shown_on(sys.stderr) if sys.stderr.isatty() else contextlib.nullcontext():
        if old is not None:
            plan = replan_from(problem, old, cost_model, solver, args.max_move_gb, Path(args.out))
        elif two_d:
            plan = plan_replicated(problem, args.sync_every, None if args.group_size is None else [args.group_size], solver)
        else:
            plan = make_plan(problem, cost_model, solver)
    seconds = time.perf_counter() - start
    out = Path(args.out)
    plan.save(out)
    print(format_plan(plan))
    print(f"planned in {seconds:.2f}s; wrote {out}")
    if args.plot:
        c = problem.cluster
        plot_plan(plan, args.plot, {"hbm": c.hbm_bytes_per_rank, "ddr": c.ddr_bytes_per_node // c.ranks_per_node,
                                    "ssd": c.ssd_bytes_per_node // c.ranks_per_node})
        print(f"wrote {args.plot}")
    if args.compare:
        print(compare_with_torchrec(problem, plan, seconds))
    return 0


class ProgressLine:
    """The search's best plan, proven bound and gap, on one terminal line rewritten as it moves
    (at most every REDRAW_S), erased when the search ends."""

    REDRAW_S = 0.1

    def __init__(self, stream) -> None:
        self.stream, self.start, self.drawn = stream, time.monotonic(), -math.inf

    def __call__(self, stage: str, best_ms: float, bound_ms: float) -> None:
        now = time.monotonic()
        if now - self.drawn < self.REDRAW_S:
            return
        self.drawn = now
        gap = best_ms / bound_ms - 1 if bound_ms > 0 else math.inf
        self.stream.write(f"\r\033[Ksearching: busiest rank {best_ms:.4f} ms, proven bound {bound_ms:.4f} ms, gap {gap:.2%} "
                          f"({stage}, {now - self.start:.1f} s)")
        self.stream.flush()

    @classmethod
    @contextlib.contextmanager
    def shown_on(cls, stream):
        """Searches within the block drawn on `stream`; the line erased after, however it ends."""
        try:
            with progress.watched(cls(stream)):
                yield
        finally:
            stream.write("\r\033[K")
            stream.flush()


def replan_from(problem, old: Plan, cost_model, solver: SolverConfig, max_move_gb: float | None, out: Path) -> Plan:
    """The plan `--from` gives: within `max_move_gb`, the fastest found; without it, the front
    printed and written beside OUT (OUT.front-K.json), OUT itself the fastest point."""
    from planner.replan.replan import replan
    from planner.spec.specs import GIB

    front = replan(problem, old, cost_model, solver, None if max_move_gb is None else int(max_move_gb * GIB))
    print(front.format())
    if max_move_gb is None:
        for k, point in enumerate(front.points):
            path = out.with_name(f"{out.stem}.front-{k}{out.suffix}")
            point.plan.save(path)
            print(f"wrote {path} ({point.moved_bytes / GIB:.3f} GiB moved, busiest rank {point.plan.max_rank_ms:.4f} ms)")
    best = min(front.points, key=lambda p: (p.plan.max_rank_ms, p.moved_bytes))
    print(f"{best.moved_bytes / GIB:.3f} GiB of {front.model_bytes / GIB:.3f} GiB move ({best.moved_bytes / front.model_bytes:.1%}); "
          f"busiest rank {best.plan.max_rank_ms:.4f} ms, unconstrained {front.free.plan.max_rank_ms:.4f} ms")
    return best.plan


def compare_with_torchrec(problem, plan: Plan, our_seconds: float) -> str:
    """Both plans' busiest rank under both cost models, and both planning times."""
    from dlrm_scale.bridge.torchrec_cost import TorchRecCostModel, torchrec_planner_plan
    from planner.cost.cost_model import AnalyticCostModel
    from planner.views.scoring import rank_times_ms

    theirs, their_seconds = torchrec_planner_plan(problem)
    models = (AnalyticCostModel(problem.cluster, problem.training), TorchRecCostModel(problem))
    rows = [
        (name, seconds, *(rank_times_ms(p, problem, m).max() for m in models))
        for name, p, seconds in (("dlrm-scale", plan, our_seconds), ("torchrec", theirs, their_seconds))
    ]
    lines = [f"{'planner':<12} {'plan s':>8} {'ours ms':>10} {'torchrec ms':>12}"]
    lines += [f"{name:<12} {s:>8.2f} {a:>10.4f} {b:>12.4f}" for name, s, a, b in rows]
    return "\n".join(lines)


LAUNCHER_FLAGS = ("--nproc-per-node", "--nnodes", "--rdzv-endpoint", "--rdzv-id")
LAUNCHER_HELP = ("usage: dlrm-scale train [--nproc-per-node N] [--nnodes N|MIN:MAX] [--rdzv-endpoint HOST:PORT] [--rdzv-id ID] "
                 "TRAINER FLAGS\n\nStarts torchrun with dlrm_scale.train after checking every flag and the config here.\n"
                 + "".join(f"  {flag:<20} {options.FLAGS[flag]['help']}\n" for flag in LAUNCHER_FLAGS) + "\nThe trainer's flags:\n")


def node_count(nnodes: str) -> int | None:
    """--nnodes as a number, None for an elastic MIN:MAX range; one line for anything else."""
    text = str(nnodes)
    low, _, high = text.partition(":")
    if not (low.isdigit() and (not high or high.isdigit())) or int(low) < 1 or (high and int(high) < int(low)):
        raise ConfigError(f"--nnodes {text!r} must be a positive number of nodes, or MIN:MAX with 1 <= MIN <= MAX")
    return None if high else int(low)


def preflight(args: argparse.Namespace, rest: list[str]) -> Path:
    """The trainer's flag, config and plan checks, run here so a mistake is one line, not a
    torchrun report; the job's output folder."""
    from dlrm_scale.training.flags import check_given_plan, check_job, local_device, parse_args

    if args.nproc_per_node < 1:
        raise ConfigError(f"--nproc-per-node must be at least 1, got {args.nproc_per_node}")
    nodes = node_count(args.nnodes)
    trainer_args = parse_args(rest)
    device = local_device()
    job = check_job(trainer_args, device)
    if device == "cuda":
        import torch

        from dlrm_scale.train import local_gpu

        local_gpu(args.nproc_per_node - 1, torch.cuda.device_count())  # the last local rank has a GPU of its own
    if trainer_args.plan and nodes:
        from dlrm_scale.train import check_plan_runs

        run = job.on_cluster(args.nproc_per_node * nodes, args.nproc_per_node, device)
        plan = Plan.load(trainer_args.plan)
        check_given_plan(plan, job, run)  # what --ignore-plan-inputs lets differ, the trainer says
        # on one node this machine holds every rank's SSD rows
        check_plan_runs(plan, run, device, list(range(args.nproc_per_node)) if nodes == 1 else [])
    from dlrm_scale.training.checkpoint import JobLock

    for directory, what in ((job.run.checkpoint.directory, "checkpoint directory"),
                            (Path(trainer_args.store_dir) if trainer_args.store_dir else None, "store directory")):
        if directory is not None and directory.is_dir():
            JobLock.check_free(directory, what)  # busy: say so now (the job itself holds it while it runs)
    return job.out_dir


def run_train(args: argparse.Namespace, rest: list[str]) -> int:
    if args.help:
        from dlrm_scale.training.flags import parse_args

        print(LAUNCHER_HELP, end="")
        parse_args(["--help"])
    out_dir = preflight(args, rest)
    torchrun = shutil.which("torchrun") or str(Path(sys.executable).with_name("torchrun"))
    cmd = [torchrun, f"--nproc_per_node={args.nproc_per_node}", f"--nnodes={args.nnodes}"]
    if args.rdzv_endpoint:
        cmd += ["--rdzv_backend=c10d", f"--rdzv_endpoint={args.rdzv_endpoint}", f"--rdzv_id={args.rdzv_id}"]
    else:  # one node: the rendezvous and the process group's store listen on loopback only
        cmd += ["--master_addr=127.0.0.1"]
    cmd += ["-m", "dlrm_scale.train", *rest]
    return launch(cmd, out_dir)


def launch(cmd: list[str], out_dir: Path) -> int:
    """torchrun, outlived by nothing: SIGTERM and SIGINT are passed to the workers, which stop at
    an agreed step with a checkpoint of it (dlrm_scale/training/preemption.py), and torchrun is
    killed with this process however it dies. torchrun's reports and the workers' stderr go to
    OUT_DIR/launcher.log; the terminal gets the workers' stdout and one line at the end: where to
    resume from after a stop (exit preemption.EXIT_CODE), a worker's error (its code: 2 for a
    user error, dlrm_scale/training/outcome.py), or where the log is."""
    from dlrm_scale.training import outcome, preemption

    outcome.clear(out_dir)  # a former run's error and stop are not this one's
    (out_dir / preemption.STOPPED).unlink(missing_ok=True)
    # torchrun's own default (one thread per worker), given here so that it prints no banner about it
    env = {"OMP_NUM_THREADS": "1", **os.environ, outcome.LAUNCHED: "1"}
    with open(out_dir / outcome.LOG, "a") as log:  # torchrun's reports and the workers' stderr
        # torchrun gets SIGTERM when this launcher dies, whatever kills it, and then stops its workers
        proc = subprocess.Popen(cmd, env=env, stderr=log, preexec_fn=lambda: preemption.die_with_parent(signal.SIGTERM))

    def forward(signum, frame):
        preemption.signal_workers(out_dir, signum)

    previous = {sig: signal.signal(sig, forward) for sig in preemption.SIGNALS}
    try:
        code = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    stop = preemption.stop_report(out_dir)
    if stop is None:
        error = outcome.reported(out_dir)
        if error is not None:
            print(f"error: {error['line']}", file=sys.stderr)
            return error["code"]
        if code:
            print(f"error: the job ended with exit code {code}; what it printed is in {out_dir / outcome.LOG}", file=sys.stderr)
        return code
    where = (f"checkpoint {stop['checkpoint']}; resume with the same command and --resume" if stop["checkpoint"]
             else "nothing was saved (no --checkpoint-dir, or --no-checkpoint-on-signal)")
    print(f"stopped by {stop['signal']} after step {stop['step']}: {where}", file=sys.stderr)
    return preemption.EXIT_CODE


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGPIPE"):  # `dlrm-scale diff ... | head`: end quietly, as Unix tools do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = argparse.ArgumentParser(prog="dlrm-scale", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    add_plan_parser(sub)
    add_train_parser(sub)
    add_calibrate_parser(sub)
    add_simulate_parser(sub)
    add_profile_parser(sub)
    add_explain_parser(sub)
    add_diff_parser(sub)
    add_export_parser(sub)
    args, rest = parser.parse_known_args(argv)
    quiet.install()
    try:
        if args.command == "train":
            return run_train(args, rest)
        if rest:
            parser.error(f"unrecognized arguments: {' '.join(rest)}")
        return {"plan": run_plan, "calibrate": run_calibrate, "simulate": run_simulate, "profile": run_profile,
                "explain": run_explain, "diff": run_diff, "export": run_export}[args.command](args)
    except PlannerError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except PlannerBugError as e:
        print(f"error: {e}", file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())

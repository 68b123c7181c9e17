"""Every command-line flag of dlrm-scale, declared once: its type, choices, default and help.

The commands (`dlrm-scale plan | calibrate | ...` and the trainer's own parser) name the flags
they take; a flag therefore means the same everywhere. A command may only make a flag required,
or add a sentence to its help where the flag's object differs (what `--out` writes)."""

from __future__ import annotations

import argparse
from typing import Any

from dlrm_scale.run_config import CPU_EMBEDDINGS, INTERACTIONS, STORE_IO
from planner.search.solver import SolverConfig
from planner.spec.specs import OPTIMIZER_STATE

HARDWARE_HELP = ("hardware profile: a name (configs/hardware, or one 'dlrm-scale calibrate --name' wrote) or a .yaml path "
                 "(default: the config's)")
STATS_HELP = "stats.json from 'dlrm-scale profile': each table's pooling, distinct ids and hit-rate curves (sizes caches)"

FLAGS: dict[str, dict[str, Any]] = {
    # the problem: what a config says, overridden
    "--config": dict(help="YAML config (tables, cluster, training, model, train sections)"),
    "--tables": dict(help="CSV: name,num_embeddings,embedding_dim,pooling_factor[,zipf_exponent]"),
    "--hardware": dict(help=HARDWARE_HELP),
    "--world-size": dict(type=int, help="ranks in all"),
    "--ranks-per-node": dict(type=int, help="ranks on each node"),
    "--hbm-gb": dict(type=float, help="HBM per rank given to embeddings, GiB"),
    "--device": dict(choices=["cuda", "cpu"], help="the ranks' device"),
    "--batch-size": dict(type=int, help="per rank; the global batch (this x ranks) of step s is a function of (seed, s) "
                                        "only, so the same samples at any world size"),
    "--comm-precision": dict(help="what the embedding collectives send, e.g. fwd=fp16,bwd=bf16 (fp32, fp16, bf16, int8)"),
    "--embedding-optimizer": dict(choices=tuple(OPTIMIZER_STATE),
                                  help="the embedding tables' optimizer (its state takes memory)"),
    "--stats": dict(help=STATS_HELP),
    "--cost-model": dict(choices=["ours", "torchrec"], default="ours", help="who prices the options (default ours)"),
    "--time-limit": dict(type=float, default=10.0, help="the planner's time limit, seconds (default 10)"),
    "--gap": dict(type=float, default=SolverConfig.target_gap,
                  help=f"stop once the plan is proven within this fraction of its lower bound (default {SolverConfig.target_gap:g}, "
                       "1%%; 0.001 for 0.1%%); --time-limit stays the ceiling"),
    "--sync-every": dict(type=int, help="2D sparse parallelism: also consider sharding the tables over groups of fewer ranks, "
                                        "the groups replicated (DMPCollection); the rows the replicas share are synced as they are read, "
                                        "the rest every N steps; the fastest predicted step wins. The model is 1D's whatever N"),
    "--group-size": dict(type=int, help="with --sync-every: shard over groups of exactly G ranks (G divides the world size)"),
    "--seed": dict(type=int, help="seed of the tables' initial weights and of the synthetic data"),
    # data
    "--data": dict(choices=["synthetic", "criteo"], default="synthetic", help="where batches come from"),
    "--data-path": dict(help="Criteo: a TSV file, a folder of TSV files, or TorchRec's preprocessed .npy folder"),
    # outputs
    "--out": dict(help="file to write"),
    "--out-dir": dict(default="out/train", help="folder for the run's plan, metrics, logs and tensorboard (default out/train)"),
    "--json": dict(help="also write the result as JSON here"),
    "--plot": dict(help="PNG of each rank's time and memory"),
    # planning
    "--compare": dict(choices=["torchrec"], help="also run TorchRec's planner and compare"),
    "--from": dict(dest="from_plan", metavar="OLD.json",
                   help="replan from the plan a model trains under, moving few bytes (prints the front of bytes moved "
                        "against step time)"),
    "--max-move-gb": dict(type=float, help="with --from: the most GiB of weights and optimizer state the new plan may move"),
    "--table": dict(help="this table only"),
    # training
    "--plan": dict(help="plan JSON from 'dlrm-scale plan'; default: plan on rank 0 at start"),
    "--ignore-plan-inputs": dict(action="store_true",
                                 help="train --plan though it was made for other inputs (another batch, precision or "
                                      "profile), e.g. to compare precisions on one layout; what differs is printed (its "
                                      "tables and world size must still fit)"),
    "--planner": dict(choices=["ours", "torchrec"], default="ours",
                      help="who plans at start when no --plan is given (torchrec: its EmbeddingShardingPlanner)"),
    "--steps": dict(type=int, help="training steps"),
    "--eval-every": dict(type=int, help="steps between evaluations"),
    "--no-pipeline": dict(action="store_true", help="plain forward/backward instead of TrainPipelineSparseDist"),
    "--checkpoint-dir": dict(help="where checkpoints go (one subfolder per saved step)"),
    "--checkpoint-every": dict(type=int, default=0, help="steps between checkpoints (0: only at the end)"),
    "--keep-checkpoints": dict(type=int, default=3, help="how many checkpoints to keep (default 3)"),
    "--resume": dict(action="store_true",
                     help="go on from the newest checkpoint in --checkpoint-dir (an existing directory) that verifies; "
                          "damaged ones are skipped, saying why"),
    "--resume-from": dict(metavar="STEP|PATH", help="go on from this checkpoint (a step, or a step_* folder) only"),
    "--deterministic": dict(action="store_true",
                            help="deterministic kernels; log every step's exact loss (plans that sum in the same order "
                                 "give bitwise equal losses, other plans and world sizes agree to about 1e-5)"),
    "--no-checkpoint-on-signal": dict(action="store_true",
                                      help="on SIGTERM or SIGINT, stop at the agreed step without writing a checkpoint of it "
                                           "(by default one is written when there is a --checkpoint-dir)"),
    "--collective-timeout": dict(type=float, default=300.0,
                                 help="seconds a rank waits for its peers in a collective before the job stops, naming the "
                                      "rank that fell behind (default 300)"),
    "--retune": dict(action="store_true",
                     help="measure the job, refit its hardware profile to it, replan with least movement and reshard "
                          "(through a checkpoint) when the predicted gain over the steps left outweighs the move; the fitted "
                          "profile is written to OUT_DIR/fitted_profile.yaml"),
    "--retune-warmup": dict(type=int, default=20, help="with --retune: steps after each (re)start not measured (default 20)"),
    "--retune-window": dict(type=int, default=100, help="with --retune: steps measured before each decision (default 100)"),
    "--retune-times": dict(type=int, default=3, help="with --retune: decisions at most (default 3)"),
    "--retune-drift": dict(type=float, default=0.15,
                           help="with --retune: measure and decide again when a window's step is this far from the refitted "
                                "prediction (default 0.15)"),
    "--drift-at": dict(type=int, metavar="STEP", help="synthetic data: from this step on, every table's hot ids move"),
    "--drift-grows": dict(metavar="TABLE=FACTOR",
                          help="synthetic data, with --drift-at: from that step on TABLE's bags are FACTOR times as long (a table "
                               "that grows hot), in place of the hot ids moving"),
    "--store-dir": dict(help="directory for the rows of tables the plan keeps on SSD (CPU tiering)"),
    "--store-io": dict(choices=STORE_IO,
                       help="the SSD store's reads: through the page cache with pread, copied from the files kept "
                            "mapped (mapped: no system call a row; the pages count in RSS), or O_DIRECT from the device "
                            "(default: the faster of pread and mapped on this machine, as calibrate measured)"),
    "--interaction": dict(choices=INTERACTIONS,
                          help="DLRM's dot interaction: dlrm_scale's symmetric backward or TorchRec's InteractionArch "
                               "(default: the faster on this machine, as calibrate measured)"),
    "--cpu-embeddings": dict(choices=CPU_EMBEDDINGS,
                             help="on CPU, dlrm_scale's row-wise Adagrad kernel and huge-page tables, or FBGEMM's kernel "
                                  "as TorchRec runs it (default: the faster on this machine, as calibrate measured)"),
    # the launcher (`dlrm-scale train`, before the trainer's own flags)
    "--nproc-per-node": dict(type=int, default=2, help="ranks on this node (default 2)"),
    "--nnodes": dict(default="1", help="nodes (default 1); MIN:MAX for an elastic job"),
    "--rdzv-endpoint": dict(help="HOST:PORT of a multi-node job's rendezvous; without it, the rendezvous stays on 127.0.0.1"),
    "--rdzv-id": dict(default="dlrm-scale", help="the job's id at the rendezvous (default dlrm-scale)"),
    # profiling and calibrating
    "--batches": dict(type=int, default=200, help="global steps to read (default 200; half warm the caches)"),
    "--measured": dict(metavar="RUN_DIR", help="a finished run of this plan: predicted beside measured, per rank and phase"),
    "--name": dict(help="write the profile as NAME among the named ones ($DLRM_SCALE_HARDWARE_DIR, default "
                        "~/.config/dlrm-scale/hardware), so that --hardware NAME finds it"),
    "--nproc": dict(type=int, default=2, help="ranks per node to measure collectives with (default 2)"),
    "--quick": dict(action="store_true", help="fewer sizes and repeats"),
    "--from-runs": dict(nargs="+", metavar="RUN_DIR",
                        help="refit the profile --hardware (default: the runs') to these finished runs' metrics.jsonl "
                             "and plan.json"),
    "--kernels-only": dict(action="store_true",
                           help="only measure which CPU kernels are faster here and record them in the existing profile --out"),
}


def add(parser: argparse.ArgumentParser | Any, flag: str, required: bool = False, more: str | None = None) -> None:
    """`flag` as declared in FLAGS; `required` where the command needs it, `more` a sentence of
    the command's own after its help."""
    spec = dict(FLAGS[flag])
    if required:
        spec["required"] = True
    if more:
        spec["help"] = f"{spec['help']}: {more}" if spec.get("help") else more
    parser.add_argument(flag, **spec)


def add_all(parser: argparse.ArgumentParser | Any, *flags: str) -> None:
    for flag in flags:
        add(parser, flag)

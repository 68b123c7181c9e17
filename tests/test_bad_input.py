"""Bad input, one case a row: each gives exactly this one-line error (a PlannerError, so the
commands print it as 'error: ...' and exit 2), and overwrites nothing."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from dlrm_scale.training.checkpoint import read_meta
from dlrm_scale.training.checkpoint_layout import candidates
from dlrm_scale.cli import node_count
from dlrm_scale.training.criteo import CriteoTSV
from dlrm_scale.training.flags import check_given_plan, check_job, parse_args
from dlrm_scale.run_config import CheckpointConfig, ModelConfig, Overrides, TrainConfig, load_problem, load_run_config
from planner.spec.config import load_tables_csv, section_dataclass
from planner.spec.errors import PlannerError
from planner.plan.document import Plan, check_plan_inputs, check_plan_tables, table_layout
import torch
from planner.plan.planning import make_plan
from planner.spec.specs import TableSpec, TieringSpec
from planner.spec.types import ShardingType
from planner.spec.access_stats import load_stats
from dlrm_scale.tiering.cache import SetAssociativeCache
from dlrm_scale.tiering.store import MemoryRowStore
from dlrm_scale.bridge.resident import resident_plan
from dlrm_scale.tiering.runtime import TieredShard, check_row_cache_rows, check_store_directory
from tests.criteo_fixture import BAD_LINES, write_criteo_tsv

BASE = "hardware: a100_zionex\ntraining: {batch_size_per_rank: 8}\n"
TABLE = "tables:\n  - {name: a, num_embeddings: 100, embedding_dim: 16}\n"


def config(tmp: Path, text: str) -> Path:
    path = tmp / "c.yaml"
    path.write_text(text)
    return path


def plan_for(tmp: Path, text: str = BASE + TABLE, world: int = 2) -> tuple[Plan, object]:
    problem = load_problem(config(tmp, text), cluster_overrides={"world_size": world})
    return make_plan(problem), problem


def checkpoint_dir(tmp: Path, marker: bool, meta: str) -> Path:
    d = tmp / "step_000000005"
    d.mkdir()
    (d / "meta.json").write_text(meta)
    if marker:
        (d / "COMPLETE").write_text("")
    return d


def plan_doc(tmp: Path, **edits) -> dict:
    doc = plan_for(tmp)[0].to_dict()
    doc.update(edits)
    return doc


def overlapping(tmp: Path) -> dict:
    doc = plan_doc(tmp)
    doc["tables"]["a"] = {"sharding_type": "column_wise", "compute_kernel": "fused", "num_embeddings": 100, "embedding_dim": 16,
                          "shards": [{"rank": 0, "row_offset": 0, "col_offset": 0, "rows": 100, "cols": 12, "tier": "hbm"},
                                     {"rank": 1, "row_offset": 0, "col_offset": 8, "rows": 100, "cols": 4, "tier": "hbm"}]}
    return doc


def ssd_plan(rows: int = 1000, sharding_type: ShardingType = ShardingType.TABLE_WISE) -> Plan:
    t = TableSpec("a", rows, 16)
    return Plan(2, 2, {"a": table_layout(t, sharding_type, [0] if sharding_type is ShardingType.TABLE_WISE else [0, 1], "ssd", 0.1)},
                (), 0.0, 0.0)


def too_small_cache():
    cache = SetAssociativeCache(32, 1000, 4)
    shard = TieredShard("t", torch.zeros(32, 4), [], MemoryRowStore(1000, 4, 0), cache, None)
    shard.install(torch.arange(200), training=True)


def too_many_bad_lines(tmp: Path):
    path = write_criteo_tsv(tmp / "d.tsv", 1500, {i: BAD_LINES[0] for i in range(1000, 1030)})
    return list(CriteoTSV(path, [TableSpec(f"c{i}", 10, 4) for i in range(26)], 13, 8, 0, 1, holdout_every=10**9).rows())


def table_doc(tmp: Path, st: str, shards: list[tuple[int, int, int, int, int]], **fields) -> dict:
    """A plan whose table 'a' (100x16) is laid out by hand: (rank, row_offset, col_offset, rows, cols)."""
    doc = plan_doc(tmp)
    doc["tables"]["a"] = {"sharding_type": st, "compute_kernel": "fused", "num_embeddings": 100, "embedding_dim": 16,
                          "shards": [dict(zip(("rank", "row_offset", "col_offset", "rows", "cols"), s), tier="hbm") for s in shards],
                          **fields}
    return doc


def export(checkpoint: Path, tmp: Path):
    from dlrm_scale.tools.export import export_checkpoint

    return export_checkpoint(checkpoint, [TableSpec("a", 10, 8)], ModelConfig(dense_arch=(8,)), "sgd", tmp / "m.pt")


def load_doc(doc: dict) -> Plan:
    return Plan.from_dict(doc, source="p.json")


def trainer_flags(tmp: Path, *flags: str):
    """The trainer's checks of its flags, as `dlrm-scale train` runs them before torchrun."""
    from dlrm_scale.training.flags import check_job, parse_args

    return check_job(parse_args(["--config", "configs/tiny.yaml", "--out-dir", str(tmp / "out"), *flags]))


def given_2d_plan(tmp: Path, world: int, *flags: str, one_group: bool = False):
    """`dlrm-scale train --plan` of a plan for 2 replicas of 2 ranks (`one_group`: its group's
    plan alone) in a job of `world` ranks on one node, as the trainer checks it."""
    plan_cli(tmp, "--world-size", "4", "--ranks-per-node", "4", "--sync-every", "10", "--group-size", "2", "--out", str(tmp / "p.json"))
    plan = Plan.load(tmp / "p.json")
    if one_group:
        plan = dataclasses.replace(plan, replication=None)
    job = trainer_flags(tmp, "--plan", str(tmp / "p.json"), *flags)
    return check_given_plan(plan, job, job.on_cluster(world, world, "cpu"))


def plan_cli(tmp: Path, *flags: str):
    import argparse

    from dlrm_scale.cli import add_plan_parser, run_plan

    parser = argparse.ArgumentParser()
    add_plan_parser(parser.add_subparsers(dest="command"))
    return run_plan(parser.parse_args(["plan", "configs/tiny.yaml", *flags]))


def recalibrated(tmp: Path) -> str:
    """BASE on a copy of its profile with one cost constant changed, as a re-calibration would."""
    profile = Path("configs/hardware/a100_zionex.yaml").read_text()
    key = "kernel_launch_ms:"
    assert key in profile
    lines = [line if not line.startswith(key) else f"{key} 0.123456" for line in profile.splitlines()]
    (tmp / "a100_zionex.yaml").write_text("\n".join(lines) + "\n")
    return BASE.replace("a100_zionex", str(tmp / "a100_zionex.yaml"))


def write(tmp: Path, name: str, data: bytes | str) -> Path:
    path = tmp / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def tiny_with(tmp: Path, old: str, new: str) -> Path:
    return write(tmp, "c.yaml", Path("configs/tiny.yaml").read_text().replace(old, new, 1))


CSV_HEADER = "name,num_embeddings,embedding_dim,pooling_factor\n"


CASES = [
    ("misspelt top-level key", lambda t: load_problem(config(t, BASE + "tabels: []\n")),
     "config {t}/c.yaml: unknown key 'tabels'; did you mean 'tables'?"),
    ("misspelt training key", lambda t: load_problem(config(t, "training: {batch_size_per_rnak: 8}\n" + TABLE)),
     "config {t}/c.yaml: training: unknown key 'batch_size_per_rnak'; did you mean 'batch_size_per_rank'?"),
    ("misspelt table key", lambda t: load_problem(config(t, BASE + "tables:\n  - {name: a, num_embedings: 5, embedding_dim: 4}\n")),
     "config {t}/c.yaml: tables[0]: unknown key 'num_embedings'; did you mean 'num_embeddings'?"),
    ("negative rows", lambda t: load_problem(config(t, BASE + "tables:\n  - {name: a, num_embeddings: -5, embedding_dim: 16}\n")),
     "table 'a': 'num_embeddings' must be a positive integer, got -5"),
    ("zero dim", lambda t: load_problem(config(t, BASE + "tables:\n  - {name: a, num_embeddings: 5, embedding_dim: 0}\n")),
     "table 'a': 'embedding_dim' must be a positive integer, got 0"),
    ("dim FBGEMM cannot use", lambda t: load_problem(config(t, BASE + "tables:\n  - {name: a, num_embeddings: 5, embedding_dim: 18}\n")),
     "table 'a': embedding_dim 18 is not a multiple of 4, which FBGEMM's kernels need; use 20"),
    ("zero batch", lambda t: load_problem(config(t, "training: {batch_size_per_rank: 0}\n" + TABLE)),
     "training: 'batch_size_per_rank' must be a positive integer, got 0"),
    ("unknown optimizer", lambda t: load_problem(config(t, "training: {batch_size_per_rank: 8, embedding_optimizer: lamb}\n" + TABLE)),
     "training: unknown embedding_optimizer 'lamb'; use one of sgd, rowwise_adagrad, adagrad, adam"),
    ("unknown precision", lambda t: load_problem(config(t, "training: {batch_size_per_rank: 8, fwd_comm_precision: fp4}\n" + TABLE)),
     "training: fwd_comm_precision 'fp4' is not one of fp32, fp16, bf16, fp8, int8"),
    ("partial node", lambda t: load_problem(config(t, BASE + "cluster: {world_size: 12}\n" + TABLE)),
     "cluster: world_size 12 is not a multiple of ranks_per_node 8; change either"),
    ("unknown hardware", lambda t: load_problem(config(t, "hardware: tpu\n" + TABLE)),
     "unknown hardware profile 'tpu'; use one of a100_zionex, cpu_epyc_zen3, cpu_epyc_zen4, cpu_gloo, cpu_xeon_m167, cpu_xeon_m207, h100_dgx "
     "or a .yaml path ('dlrm-scale calibrate --name NAME' measures this machine into one)"),
    ("missing config", lambda t: load_problem(t / "nope.yaml"), "config {t}/nope.yaml does not exist; check the path"),
    ("broken YAML", lambda t: load_problem(config(t, "training:\n  batch_size_per_rank: [8\n")),
     "config {t}/c.yaml is not valid YAML at line 3; fix the syntax there"),
    ("tables not a list", lambda t: load_problem(config(t, BASE + "tables: {a: 1}\n")), "config {t}/c.yaml: 'tables' must be a list of tables"),
    ("section not a mapping", lambda t: load_problem(config(t, "training: [8]\n" + TABLE)),
     "config {t}/c.yaml: training must be a mapping of keys to values, not a list"),
    ("duplicate table", lambda t: load_problem(config(t, BASE + TABLE + "  - {name: a, num_embeddings: 5, embedding_dim: 4}\n")),
     "table 'a' is defined twice: table names must be unique"),
    ("no tables", lambda t: load_problem(config(t, BASE)),
     "config {t}/c.yaml: no tables; add a 'tables' list or 'tables_csv', or pass --tables FILE.csv"),
    ("missing table file", lambda t: load_tables_csv(t / "t.csv"), "table file {t}/t.csv does not exist; check the path"),
    ("bad number in table file", lambda t: (t / "t.csv").write_text("name,num_embeddings,embedding_dim\na,lots,16\n") and load_tables_csv(t / "t.csv"),
     "table file {t}/t.csv, line 2: 'lots' is not a whole number; fix the numbers on that line"),
    ("table too large for any rank", lambda t: plan_for(t, BASE + "tables:\n  - {name: huge, num_embeddings: 9000000000, embedding_dim: 128}\n", 2),
     re.compile(r"table 'huge' does not fit: its smallest shard \(row_wisex2(@(ssd|ddr)\+cache0\.05)?\) needs [\d,]+ bytes of hbm but a rank has 42,949,672,960; "
                r"add ranks \(--world-size\), give more memory per rank, or reduce num_embeddings/embedding_dim")),
    ("plan of another schema", lambda t: Plan.from_dict(plan_doc(t, schema="v0")), "plan: not a dlrm-scale/plan/v1 document (schema is 'v0')"),
    ("plan with overlapping shards", lambda t: Plan.from_dict(overlapping(t)), "plan: shards of 'a' overlap"),
    ("plan missing a table", lambda t: check_plan_tables(plan_for(t)[0], plan_for(t, BASE + TABLE + "  - {name: b, num_embeddings: 5, embedding_dim: 16}\n")[1]),
     "plan has no table 'b'; re-plan for this config"),
    ("plan of another shape", lambda t: check_plan_tables(plan_for(t)[0], plan_for(t, BASE + "tables:\n  - {name: a, num_embeddings: 7, embedding_dim: 16}\n")[1]),
     "plan's table 'a' is 100x16 but the model's is 7x16; re-plan for this config"),
    ("plan for another world size", lambda t: check_plan_tables(plan_for(t)[0], plan_for(t, world=4)[1]),
     "plan is for 2 ranks but the job has 4; re-plan with --world-size 4"),
    ("missing plan file", lambda t: Plan.load(t / "p.json"), "plan file {t}/p.json does not exist; create one with 'dlrm-scale plan --out {t}/p.json'"),
    ("plan file not JSON", lambda t: (t / "p.json").write_text("{") and Plan.load(t / "p.json"),
     "plan file {t}/p.json is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)); re-run 'dlrm-scale plan'"),
    ("partial checkpoint", lambda t: read_meta(checkpoint_dir(t, False, "{}")),
     "checkpoint {t}/step_000000005 is partial (no COMPLETE marker); remove it or resume from another"),
    ("corrupted checkpoint metadata", lambda t: read_meta(checkpoint_dir(t, True, "{garbage")),
     "checkpoint {t}/step_000000005 has an unreadable meta.json; it is corrupted, resume from another"),
    ("keep no checkpoints", lambda t: CheckpointConfig(t, 5, 0), "--keep-checkpoints must be >= 1, got 0"),
    ("missing data", lambda t: CriteoTSV(t / "none", [TableSpec(f"c{i}", 10, 4) for i in range(26)], 13, 8, 0, 1),
     "no Criteo TSV data at {t}/none: give a .tsv/.txt file or a folder of them with --data-path"),
    ("too many malformed data lines", too_many_bad_lines,
     re.compile(r"11 of 1010 lines read are malformed \(last: .*/d\.tsv:1010\), over the 1\.0% allowed; fix the data or raise max_bad_fraction")),
    ("fp8 comms on CPU", lambda t: trainer_flags(t, "--comm-precision", "fwd=fp8,bwd=bf16"),
     "--comm-precision: fp8 is refused on CPU: FBGEMM's fp8 comm codec fails on CPU with a shape error in 1.8; use fp16, bf16 or int8"),
    ("model without one logit", lambda t: ModelConfig(over_arch=(8, 2)), "model: over_arch must end in 1 (one logit), got [8, 2]"),
    ("zero steps", lambda t: TrainConfig(steps=0), "train: steps must be positive, got 0"),
    ("model value of the wrong type", lambda t: section_dataclass({"model": {"dense_arch": "wide"}}, "model", ModelConfig, "config"),
     "config: model has a value of the wrong type; check the numbers and lists in it"),
    ("no store directory for SSD rows", lambda t: check_store_directory(ssd_plan(), [0], None, "sgd"),
     "the plan keeps rows on SSD (128,000 bytes of store files) but no store directory is set; pass --store-dir DIR"),
    ("missing store directory", lambda t: check_store_directory(ssd_plan(), [0], t / "none", "sgd"),
     "store directory {t}/none does not exist; create it or pass another --store-dir"),
    ("store directory that cannot be written", lambda t: check_store_directory(ssd_plan(), [0], Path("/proc/self"), "sgd"),
     "store directory /proc/self is not writable; fix its permissions or pass another --store-dir"),
    ("too little disk for SSD rows", lambda t: check_store_directory(ssd_plan(2**40), [0], t, "sgd"),
     re.compile(r"store directory .* has [\d,]+ bytes free but the plan's SSD store files need [\d,]+; free space or pass another --store-dir")),
    ("cached row-wise table on CPU", lambda t: resident_plan(ssd_plan(1000, ShardingType.ROW_WISE)),
     "table 'a' is row_wise with key_value: on CPU only table_wise, column_wise, table_column_wise tables can be cached; re-plan with --device cpu"),
    ("cached table beyond the row cache's int32 index", lambda t: check_row_cache_rows(ssd_plan(2**31)),
     "cached table 'a' has 2,147,483,648 rows, more than a row cache indexes (2,147,483,647); hash its ids to fewer rows, "
     "or plan without tiering (tiering: {{enabled: false}})"),
    ("cache smaller than a batch", lambda t: too_small_cache(),
     "cached table 't': a batch needs 200 distinct rows and 172 found no way in their set (the cache holds 32, of which 4 for such rows); "
     "raise the cache load factor (in its plan)"),
    ("missing stats file", lambda t: load_stats(t / "s.json"),
     "stats file {t}/s.json does not exist; write one with 'dlrm-scale profile CONFIG --out {t}/s.json'"),
    ("unknown cache policy", lambda t: TieringSpec(policy="fifo"), "tiering: policy 'fifo' is not one of lru, lfu"),
    ("row-wise blocks TorchRec does not cut", lambda t: load_doc(table_doc(t, "row_wise", [(0, 0, 0, 3, 16), (1, 3, 0, 97, 16)])),
     "p.json: row_wise table 'a' must be cut into full-width row blocks of 50 rows (ceil of 100 / 2), as TorchRec cuts them; got [3, 97]"),
    ("table-wise table split by rows", lambda t: load_doc(table_doc(t, "table_wise", [(0, 0, 0, 50, 16), (1, 50, 0, 50, 16)])),
     "p.json: table_wise table 'a' must be one shard, not 2; use row_wise or column_wise to split it"),
    ("column-wise table split by rows", lambda t: load_doc(table_doc(t, "column_wise", [(0, 0, 0, 50, 16), (1, 50, 0, 50, 16)])),
     "p.json: column_wise table 'a' must be cut into full-height column shards"),
    ("column shards not a multiple of 4", lambda t: load_doc(table_doc(t, "column_wise", [(0, 0, 0, 100, 6), (1, 0, 6, 100, 10)])),
     "p.json: column_wise table 'a' has column shards [6, 10] wide; TorchRec needs each a positive multiple of 4"),
    ("an empty shard", lambda t: load_doc(table_doc(t, "column_wise", [(0, 0, 0, 100, 8), (1, 0, 8, 100, 8), (0, 0, 0, 0, 0)])),
     "p.json: column_wise table 'a' must be cut into full-height column shards"),
    ("rows of the wrong type in a plan", lambda t: load_doc(table_doc(t, "table_wise", [(0, 0, 0, 100, 16)], num_embeddings="x")),
     "p.json: tables['a'].num_embeddings has the wrong type (str)"),
    ("a zero-row table in a plan", lambda t: load_doc(table_doc(t, "table_wise", [(0, 0, 0, 0, 16)], num_embeddings=0)),
     "p.json: tables['a'] is 0x16; a table needs at least one row and column"),
    ("plan ranks not a list", lambda t: load_doc(plan_doc(t, ranks=5)), "p.json: plan.ranks has the wrong type (int)"),
    ("plan predictions not an object", lambda t: load_doc(plan_doc(t, predicted=[])), "p.json: plan.predicted has the wrong type (list)"),
    ("predicted time of the wrong type", lambda t: load_doc(plan_doc(t, predicted={"max_rank_ms": "fast"})),
     "p.json: plan.predicted.max_rank_ms has the wrong type (str)"),
    ("infinite zipf exponent", lambda t: load_problem(config(t, BASE + "tables:\n  - {name: a, num_embeddings: 5, embedding_dim: 4, zipf_exponent: .inf}\n")),
     "table 'a': 'zipf_exponent' must be a number in [0, 10.0], got inf"),
    ("resume from a step that is not there", lambda t: candidates(checkpoint_dir(t, True, '{"step": 5}').parent, "7"),
     "--resume-from 7: no complete checkpoint of that step in {t} (steps: 5)"),
    ("resume from a path that is not a checkpoint", lambda t: candidates(t, str(t / "elsewhere")),
     "--resume-from {t}/elsewhere is not a complete checkpoint in {t}; give a step number or one of its step_* folders"),
    ("resume from a directory that does not exist", lambda t: candidates(t / "nope"),
     "--checkpoint-dir {t}/nope does not exist; check the path, or drop --resume to start afresh"),
    # the trainer's flags, checked before torchrun starts
    ("zero steps flag", lambda t: trainer_flags(t, "--steps", "0"), "train: steps must be positive, got 0"),
    ("negative batch flag", lambda t: trainer_flags(t, "--batch-size", "-1"), "--batch-size must be a positive integer, got -1"),
    ("zero batch flag", lambda t: trainer_flags(t, "--batch-size", "0"), "--batch-size must be a positive integer, got 0"),
    ("unknown comm precision", lambda t: trainer_flags(t, "--comm-precision", "fwd=fp99"),
     re.compile(r"--comm-precision: 'fp99' is not one of .*")),
    ("comm precision for no direction", lambda t: trainer_flags(t, "--comm-precision", "side=fp16"),
     "--comm-precision: 'side' is not a direction; write fwd=P,bwd=P or one precision for both"),
    ("comm precision given twice", lambda t: trainer_flags(t, "--comm-precision", "fwd=fp16,fwd=int8"),
     "--comm-precision 'fwd=fp16,fwd=int8' gives a direction twice; write fwd=P,bwd=P or one precision for both"),
    ("keep no checkpoints flag", lambda t: trainer_flags(t, "--keep-checkpoints", "0"), "--keep-checkpoints must be >= 1, got 0"),
    ("negative checkpoint interval", lambda t: trainer_flags(t, "--checkpoint-every", "-1"), "--checkpoint-every must be >= 0, got -1"),
    ("negative eval interval", lambda t: trainer_flags(t, "--eval-every", "-1"), "train: eval_every must be >= 0, got -1"),
    ("resume without a directory", lambda t: trainer_flags(t, "--resume"), "--resume needs --checkpoint-dir"),
    ("resume-from without a directory", lambda t: trainer_flags(t, "--resume-from", "5"), "--resume-from needs --checkpoint-dir"),
    ("resume from a mistyped directory", lambda t: trainer_flags(t, "--resume", "--checkpoint-dir", str(t / "ckpt")),
     "--checkpoint-dir {t}/ckpt does not exist, so there is nothing to resume; check the path, or create it "
     "(a job restarted by torchrun resumes from it)"),
    ("output directory that is a file", lambda t: trainer_flags(t, "--out-dir", str(write(t, "f", "x"))),
     "--out-dir {t}/f cannot be written (File exists); choose another --out-dir"),
    ("checkpoint directory inside a file", lambda t: trainer_flags(t, "--checkpoint-dir", str(write(t, "f", "x") / "ck")),
     "--checkpoint-dir {t}/f/ck cannot be written (Not a directory); choose another --checkpoint-dir"),
    ("criteo without data", lambda t: trainer_flags(t, "--data", "criteo"), "--data criteo needs --data-path"),
    ("missing data path", lambda t: trainer_flags(t, "--data", "criteo", "--data-path", str(t / "days")),
     "--data-path {t}/days does not exist; check the path"),
    ("missing plan file", lambda t: trainer_flags(t, "--plan", str(t / "p.json")),
     "plan file {t}/p.json does not exist; create one with 'dlrm-scale plan --out {t}/p.json'"),
    ("DLRM over tables of two widths", lambda t: check_job(parse_args(["--config", str(tiny_with(t, "num_embeddings: 100, embedding_dim: 16",
                                                                                      "num_embeddings: 100, embedding_dim: 32")),
                                                                   "--out-dir", str(t / "out")])),
     "model: DLRM's interaction needs one embedding_dim for all tables, got [16, 32]"),
    ("2D replicas never averaged", lambda t: plan_cli(t, "--world-size", "8", "--sync-every", "0", "--out", str(t / "p.json")),
     "--sync-every must be a whole number of steps >= 1 (replicas are synced that often), got 0"),
    ("2D group not dividing the world", lambda t: plan_cli(t, "--world-size", "8", "--sync-every", "10", "--group-size", "3",
                                                           "--out", str(t / "p.json")),
     "--group-size 3 must divide the world size 8; use one of 8, 4, 2, 1"),
    ("2D groups without a sync", lambda t: plan_cli(t, "--world-size", "8", "--group-size", "4", "--out", str(t / "p.json")),
     "--group-size shards over groups replicated and synced every N steps: give --sync-every N too"),
    ("2D replica groups across part of a node", lambda t: plan_cli(t, "--world-size", "24", "--ranks-per-node", "8", "--sync-every", "10",
                                                                   "--group-size", "8", "--out", str(t / "p.json")),
     "--group-size 8 makes replica groups of 3 ranks, which neither divide a node's 8 ranks nor span whole nodes; use one of 24, 12, 6, 3, 1"),
    ("2D plan given to a job of another size", lambda t: given_2d_plan(t, 8),
     "plan is 2D for 2 replicas of 2 ranks (4 in all) but the job has 8; re-plan with --world-size 8"),
    ("one group's plan given to a 1D job", lambda t: given_2d_plan(t, 4, one_group=True),
     "plan is for 2 ranks but the job has 4; re-plan with --world-size 4"),
    ("2D plan with --retune", lambda t: given_2d_plan(t, 4, "--retune", "--retune-window", "300"),
     "plan {t}/p.json is 2D and --retune replans over every rank: drop --retune, or train a 1D plan"),
    ("zero nodes", lambda t: node_count("0"), "--nnodes '0' must be a positive number of nodes, or MIN:MAX with 1 <= MIN <= MAX"),
    ("nodes not a number", lambda t: node_count("two"), "--nnodes 'two' must be a positive number of nodes, or MIN:MAX with 1 <= MIN <= MAX"),
    ("elastic range upside down", lambda t: node_count("4:2"), "--nnodes '4:2' must be a positive number of nodes, or MIN:MAX with 1 <= MIN <= MAX"),
    # configs: encodings, sizes, types, structure
    ("binary config", lambda t: load_problem(write(t, "c.yaml", b"hardware: cpu_gloo\n\xff\xfe\x00")),
     "config {t}/c.yaml is not UTF-8 text (byte 19 is 0xff); save it as UTF-8"),
    ("config that is a directory", lambda t: load_problem(t), "config {t} is a directory; give the file in it"),
    ("config nested 30,000 deep", lambda t: load_problem(write(t, "c.yaml", "tables: " + "[" * 30000 + "]" * 30000)),
     "config {t}/c.yaml nests too deeply to read; a config is a few levels of mappings and lists"),
    ("rows past int64", lambda t: load_problem(tiny_with(t, "num_embeddings: 20000", "num_embeddings: 9223372036854775808")),
     "table 't_large': 'num_embeddings' must be at most 2^40, got 9223372036854775808"),
    ("rows with thousands of digits", lambda t: load_problem(tiny_with(t, "num_embeddings: 20000", "num_embeddings: " + "9" * 3000)),
     "table 't_large': 'num_embeddings' must be at most 2^40, got 99999999999999999999... (3000 characters)"),
    ("zero ranks per node", lambda t: load_problem(tiny_with(t, "world_size: 2", "world_size: 2\n  ranks_per_node: 0")),
     "cluster: ranks_per_node must be a positive integer, got 0"),
    ("ranks per node as a string", lambda t: load_problem(tiny_with(t, "world_size: 2", "world_size: 2\n  ranks_per_node: \"8\"")),
     "cluster: ranks_per_node must be a positive integer, got '8'"),
    ("top-level data section nothing reads", lambda t: load_problem(tiny_with(t, "hardware: cpu_gloo", "hardware: cpu_gloo\ndata: {path: x}")),
     "config {t}/c.yaml: unknown key 'data'; valid keys: hardware, cluster, training, tables, tables_csv, tiering, constraints, model, train"),
    ("top-level reliability section nothing reads",
     lambda t: load_problem(tiny_with(t, "hardware: cpu_gloo", "hardware: cpu_gloo\nreliability: {retries: 3}")),
     "config {t}/c.yaml: unknown key 'reliability'; valid keys: hardware, cluster, training, tables, tables_csv, tiering, constraints, model, train"),
    ("deterministic as a string", lambda t: section_dataclass({"train": {"deterministic": "false"}}, "train", TrainConfig, "config"),
     "config: train: deterministic must be true or false, got 'false'"),
    ("fractional steps", lambda t: section_dataclass({"train": {"steps": 10.5}}, "train", TrainConfig, "config"),
     "config: train: steps must be an integer up to 2^40, got 10.5"),
    ("learning rate not a number", lambda t: section_dataclass({"train": {"embedding_lr": float("nan")}}, "train", TrainConfig, "config"),
     "config: train: embedding_lr must be a number, got nan"),
    ("drift_grows as the flag writes it", lambda t: section_dataclass({"train": {"drift_at_step": 5, "drift_grows": "t0=8"}}, "train",
                                                                       TrainConfig, "config"),
     "train: drift_grows must be [TABLE, FACTOR > 0] (the flag: --drift-grows TABLE=FACTOR), got 't0=8'"),
    ("pooling factor 1.0e300", lambda t: load_problem(tiny_with(t, "pooling_factor: 4.0", "pooling_factor: 1.0e300")),
     "table 't_large': 'pooling_factor' must be a positive number up to 2^40, got 1e+300"),
    # table CSVs
    ("binary table file", lambda t: load_tables_csv(write(t, "t.csv", CSV_HEADER.encode() + b"a,10,8,\xff\n")),
     "table file {t}/t.csv is not UTF-8 text (byte 56 is 0xff); save it as UTF-8"),
    ("table file that is a directory", lambda t: load_tables_csv(t), "table file {t} is a directory; give the file in it"),
    ("extra value in a table file", lambda t: load_tables_csv(write(t, "t.csv", CSV_HEADER + "a,10,8,1,9\n")),
     "table file {t}/t.csv, line 2: 5 values for 4 columns; give one per column"),
    ("duplicate column in a table file", lambda t: load_tables_csv(write(t, "t.csv", "name,num_embeddings,embedding_dim,name\na,10,8,b\n")),
     "table file {t}/t.csv: column 'name' appears twice in the header; keep one"),
    ("rows in exponent notation", lambda t: load_tables_csv(write(t, "t.csv", CSV_HEADER + "a,1e3,8,1\n")),
     "table file {t}/t.csv, line 2: '1e3' is not a whole number; fix the numbers on that line"),
    ("infinite pooling in a table file", lambda t: load_tables_csv(write(t, "t.csv", CSV_HEADER + "a,10,8,inf\n")),
     "table file {t}/t.csv, line 2: 'inf' is not a finite number; fix the numbers on that line"),
    # the planner's flags and outputs, checked before planning
    ("HBM of NaN GiB", lambda t: plan_cli(t, "--hbm-gb", "nan", "--out", str(t / "p.json")), "--hbm-gb must be a positive number of GiB, got nan"),
    ("HBM of infinite GiB", lambda t: plan_cli(t, "--hbm-gb", "inf", "--out", str(t / "p.json")), "--hbm-gb must be a positive number of GiB, got inf"),
    ("plan output that is a directory", lambda t: plan_cli(t, "--out", str(t)), "--out {t} is a directory; give a file path in it"),
    ("plan output in a missing folder", lambda t: plan_cli(t, "--out", str(t / "no" / "p.json")),
     "--out {t}/no/p.json: folder {t}/no does not exist; create it or choose another --out"),
    ("plot in a missing folder", lambda t: plan_cli(t, "--out", str(t / "p.json"), "--plot", str(t / "no" / "p.png")),
     "--plot {t}/no/p.png: folder {t}/no does not exist; create it or choose another --plot"),
    ("zero solver time", lambda t: plan_cli(t, "--time-limit", "0", "--out", str(t / "p.json")),
     "--time-limit must be a positive number of seconds, got 0.0"),
    ("store directory that is a file", lambda t: check_store_directory(ssd_plan(), [0], write(t, "f", "x"), "sgd"),
     "store directory {t}/f is a file, not a directory; pass a directory as --store-dir"),
    ("export of a partial checkpoint", lambda t: export(checkpoint_dir(t, False, "{}"), t),
     "checkpoint {t}/step_000000005 is partial (no COMPLETE marker); remove it or resume from another"),
    ("export of a checkpoint without a manifest", lambda t: export(checkpoint_dir(t, True, '{"step": 5}'), t),
     "checkpoint {t}/step_000000005 is damaged (it has no MANIFEST.json); export another"),
    # a plan made for another run (planner.plan.inputs)
    ("plan for another batch", lambda t: check_plan_inputs(plan_for(t)[0], plan_for(t, BASE.replace("8}", "16}") + TABLE)[1], "p.json"),
     "p.json does not fit this run: it was made for batch_size_per_rank 8, this run has 16; re-plan for it with 'dlrm-scale plan'"),
    ("plan for other comms", lambda t: check_plan_inputs(plan_for(t)[0], plan_for(t, BASE.replace("8}", "8, fwd_comm_precision: fp16}") + TABLE)[1], "p.json"),
     "p.json does not fit this run: it was made for fwd_comm_precision fp32, this run has fp16; re-plan for it with 'dlrm-scale plan'"),
    ("plan for other pooling", lambda t: check_plan_inputs(plan_for(t)[0], plan_for(t, BASE + TABLE.replace("16}", "16, pooling_factor: 3}"))[1], "p.json"),
     "p.json does not fit this run: the config's tables (pooling factors or skew) differ from those it was made for; re-plan for it with 'dlrm-scale plan'"),
    ("plan priced on another profile", lambda t: check_plan_inputs(plan_for(t)[0], plan_for(t, BASE.replace("a100_zionex", "h100_dgx") + TABLE)[1], "p.json"),
     "p.json does not fit this run: it was priced with hardware profile 'a100_zionex', this run uses 'h100_dgx'; re-plan for it with 'dlrm-scale plan'"),
    ("plan priced before a re-calibration", lambda t: check_plan_inputs(plan_for(t)[0], plan_for(t, recalibrated(t) + TABLE)[1], "p.json"),
     "p.json does not fit this run: it was priced with hardware profile 'a100_zionex' as it was before a re-calibration or edit; "
     "re-plan for it with 'dlrm-scale plan'"),
    ("plan inputs of the wrong type", lambda t: load_doc(plan_doc(t, inputs={**plan_doc(t)["inputs"], "batch_size_per_rank": "8"})),
     "p.json: inputs.batch_size_per_rank must be an integer; re-plan to record it"),
    ("batch size in the train section", lambda t: load_run_config(tiny_with(t, "train:\n", "train:\n  batch_size: 64\n")),
     "config: train: batch_size has one home, training: {{batch_size_per_rank: N}}; move it there"),
    ("negative batch flag to the planner", lambda t: Overrides(batch_size=-4), "--batch-size must be a positive integer, got -4"),
    ("misspelt train key", lambda t: section_dataclass({"train": {"stpes": 5}}, "train", TrainConfig, "config"),
     "config: train: unknown key 'stpes'; did you mean 'steps'?"),
]


@pytest.mark.parametrize("what, make, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_gives_exactly_this_error(tmp_path, what, make, expected):
    with pytest.raises(PlannerError) as e:
        make(tmp_path)
    message = str(e.value)
    assert "\n" not in message
    if isinstance(expected, str):
        assert message == expected.format(t=tmp_path)
    else:
        assert expected.fullmatch(message), message


def test_there_are_at_least_90_cases():
    assert len(CASES) >= 90

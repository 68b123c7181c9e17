"""Checkpoints on real 2- and 4-rank gloo jobs: bitwise resume, resharding, damaged files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from dlrm_scale.training.checkpoint import CheckpointError, complete_checkpoints, read_meta
from dlrm_scale.tools.launch import run_on_ranks
from planner.plan.document import Plan, table_layout
from planner.spec.types import ShardingType
from tests.test_training_distributed import every_scheme_plan, model_config, problem

pytestmark = pytest.mark.distributed


def uniform_plan(scheme: str, world: int) -> Plan:
    p = problem()
    st = ShardingType(scheme)
    tables = {}
    for i, t in enumerate(p.tables):
        # column shards anywhere; row blocks in rank order, as TorchRec's row-wise sharding needs
        ranks = {"table_wise": [i % world], "column_wise": [i % world, (i + 1) % world], "row_wise": list(range(world))}[scheme]
        tables[t.name] = table_layout(t, st, ranks, "ddr")
    return Plan(world, world, tables, (), 0.0, 0.0)


def make_trainer(rank, world, out_dir, ckpt_dir, steps, resume, plan, every=0):
    from dlrm_scale.run_config import CheckpointConfig, TrainConfig
    from dlrm_scale.training.trainer import Trainer
    from tests.conftest import run_config

    p = problem("rowwise_adagrad")
    cfg = TrainConfig(steps=steps, log_every=1, eval_batches=1, deterministic=True)
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    return Trainer(run_config(p, model_config(), cfg, 64, CheckpointConfig(Path(ckpt_dir), every, 3)), plan, torch.device("cpu"),
                   rank, world, Path(out_dir), resume=resume)


def _train(rank, world, out_dir, ckpt_dir, steps, resume, every):
    from dlrm_scale.training.state import full_tables

    trainer = make_trainer(rank, world, out_dir, ckpt_dir, steps, resume, every_scheme_plan(problem()), every)
    trainer.run()
    return full_tables(trainer.model)


def losses(out_dir: Path) -> list[tuple[int, float]]:
    return [(r["step"], r["loss"]) for r in map(json.loads, (out_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_view_into_a_larger_buffer_is_saved_as_its_own_bytes_and_loads_back_equal(tmp_path, dtype):
    """FBGEMM keeps a kernel's tables in one buffer, and a shard in a state dict is a view of it:
    saved from that memory, only its bytes, whatever its dtype; torch's CRC setting left as it was."""
    import torch.distributed.checkpoint as dcp

    from dlrm_scale.training.checkpoint import dcp_save

    buffer = torch.randn(4096, 64).to(dtype)
    state = {"middle": buffer[1000:1500], "row": buffer[7], "whole": buffer.clone(), "counts": torch.arange(5)}
    crc = torch.serialization.get_crc32_options()
    dcp_save(state, tmp_path)
    assert torch.serialization.get_crc32_options() == crc
    back = {k: torch.zeros_like(v) for k, v in state.items()}
    dcp.load(back, checkpoint_id=str(tmp_path))
    assert all(torch.equal(back[k], state[k]) for k in state)
    written = sum(p.stat().st_size for p in tmp_path.glob("*.distcp"))
    assert written < buffer.nbytes * 1.25  # the whole buffer once (its clone), the views only as large as they are


def test_the_round_trip_probe_saves_hashes_verifies_and_loads_through_dcp_and_leaves_the_directory_as_it_was(tmp_path, monkeypatch):
    """What a move's cost per GiB is first priced by: the checkpoint path itself, in the job's
    checkpoint directory, whose checkpoints it leaves alone."""
    from dlrm_scale.training import checkpoint as ck

    kept = tmp_path / "step_000000010"
    kept.mkdir()
    (kept / "meta.json").write_text("{}")
    hashed, loaded, sha256, dcp_load = [], [], ck._sha256, ck.dcp_load
    monkeypatch.setattr(ck, "_sha256", lambda path: hashed.append(path.name) or sha256(path))
    monkeypatch.setattr(ck, "dcp_load", lambda state, path, no_dist=False: loaded.append(state["probe"].nbytes) or dcp_load(state, path, no_dist))
    s_per_gib = ck.round_trip_s_per_gib(tmp_path, 4 << 20)
    assert 0 < s_per_gib < 1e3
    written = sorted(set(hashed))
    assert ".metadata" in written and any(n.endswith(".distcp") for n in written)
    assert sorted(hashed) == sorted(written * 2)  # each file hashed at the save and again at the load
    assert loaded == [4 << 20]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == ["step_000000010", "step_000000010/meta.json"]

    def full(state, path, no_dist=False):
        path.mkdir()
        (path / "part").write_bytes(b"x")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ck, "dcp_save", full)
    with pytest.raises(CheckpointError, match=f"checkpoint directory {tmp_path}: 4 MiB .*No space left.*free space there"):
        ck.round_trip_s_per_gib(tmp_path, 4 << 20)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_000000010"]  # the probe's partial files removed


def test_resume_is_bitwise_for_every_scheme(tmp_path):
    full = run_on_ranks(_train, 2, str(tmp_path / "full"), str(tmp_path / "ck_full"), 6, False, 3)
    run_on_ranks(_train, 2, str(tmp_path / "part"), str(tmp_path / "ck"), 3, False, 0)
    resumed = run_on_ranks(_train, 2, str(tmp_path / "resumed"), str(tmp_path / "ck"), 6, True, 0)
    assert losses(tmp_path / "resumed") == losses(tmp_path / "full")[3:]  # exact floats
    for name, table in full.items():
        assert torch.equal(resumed[name], table), name
    assert [s for s, _ in complete_checkpoints(tmp_path / "ck_full")] == [3, 6]


def _save_under(rank, world, ckpt_dir, scheme):
    from dlrm_scale.training.state import full_tables

    plan = every_scheme_plan(problem()) if scheme == "every" else uniform_plan(scheme, world)
    trainer = make_trainer(rank, world, str(Path(ckpt_dir) / "out"), ckpt_dir, 2, False, plan)
    trainer.run()
    return full_tables(trainer.model)


def _load_under(rank, world, ckpt_dir, scheme):
    from dlrm_scale.training.state import full_tables

    import contextlib
    import io

    trainer = make_trainer(rank, world, str(Path(ckpt_dir) / "out2"), ckpt_dir, 2, False, uniform_plan(scheme, world))
    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        step = trainer.checkpoints.restore(trainer.config.steps)
    return step, full_tables(trainer.model), said.getvalue()


@pytest.mark.parametrize("saved, loaded, world_after", [("table_wise", "row_wise", 2), ("row_wise", "column_wise", 2), ("every", "row_wise", 4)])
def test_checkpoint_reshards_to_another_plan(tmp_path, saved, loaded, world_after):
    from planner.views.diff import diff_plans

    before = run_on_ranks(_save_under, 2, str(tmp_path), saved)
    step, after, said = run_on_ranks(_load_under, world_after, str(tmp_path), loaded)
    assert step == 2
    for name, table in before.items():
        assert torch.equal(after[name], table), name
    saved_plan = every_scheme_plan(problem()) if saved == "every" else uniform_plan(saved, 2)
    change = diff_plans(saved_plan, uniform_plan(loaded, world_after), "rowwise_adagrad")
    assert change.intra_node_bytes + change.inter_node_bytes > 0
    assert (f"saved under another plan: {len(change.changes)} tables changed layout, {change.intra_node_bytes / 2**30:.3f} GiB "
            f"moved within nodes and {change.inter_node_bytes / 2**30:.3f} GiB across") in said


def row_states(trainer) -> dict[str, torch.Tensor]:
    """Each table's row-wise Adagrad state whole on every rank, whatever its layout."""
    import torch.distributed as dist
    from torch.distributed._shard.sharded_tensor import ShardedTensor

    pieces = {}
    for entry in trainer.optimizer.state_dict()["state"].values():
        for key, value in entry.items():
            if key.endswith(".momentum1"):
                local = ([(s.metadata.shard_offsets[0], s.tensor) for s in value.local_shards()]
                         if isinstance(value, ShardedTensor) else [(0, value)])
                pieces[key] = [(offset, t.detach().clone()) for offset, t in local]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, pieces)
    out = {}
    for key in {k for part in gathered for k in part}:
        blocks = dict(sorted(((o, t) for part in gathered for o, t in part.get(key, [])), key=lambda b: b[0]))  # replicas collapse
        out[key] = torch.cat(list(blocks.values()))
    return out


def dp_plan(world: int, data_parallel: bool) -> Plan:
    """Row-wise tables, and table 'dp' data-parallel or table-wise."""
    p = problem()
    tables = {t.name: table_layout(t, ShardingType.ROW_WISE, list(range(world)), "ddr") for t in p.tables}
    dp = p.tables_by_name["dp"]
    tables["dp"] = table_layout(dp, ShardingType.DATA_PARALLEL, list(range(world)), "ddr") if data_parallel else \
        table_layout(dp, ShardingType.TABLE_WISE, [world - 1], "ddr")
    return Plan(world, world, tables, (), 0.0, 0.0)


def _save_states(rank, world, ckpt_dir, data_parallel):
    trainer = make_trainer(rank, world, str(Path(ckpt_dir) / "out"), ckpt_dir, 2, False, dp_plan(world, data_parallel))
    trainer.run()
    return row_states(trainer)


def _load_states(rank, world, ckpt_dir, data_parallel):
    trainer = make_trainer(rank, world, str(Path(ckpt_dir) / "out2"), ckpt_dir, 2, False, dp_plan(world, data_parallel))
    trainer.checkpoints.restore(trainer.config.steps)
    return row_states(trainer)


@pytest.mark.parametrize("saved_dp", [True, False])
def test_a_table_keeps_its_optimizer_state_moving_between_data_parallel_and_sharded(tmp_path, saved_dp):
    before = run_on_ranks(_save_states, 2, str(tmp_path), saved_dp)
    after = run_on_ranks(_load_states, 2, str(tmp_path), not saved_dp)
    assert before["dp.momentum1"].shape == (101,) and before["dp.momentum1"].any()
    assert set(after) == set(before)
    for key, state in before.items():
        assert torch.equal(after[key], state), key


def _row_states_under(rank, world, ckpt_dir, scheme, load):
    trainer = make_trainer(rank, world, str(Path(ckpt_dir) / ("out2" if load else "out")), ckpt_dir, 2, False, uniform_plan(scheme, world))
    if load:
        trainer.checkpoints.restore(trainer.config.steps)
    else:
        trainer.run()
    return row_states(trainer)


@pytest.mark.parametrize("saved, loaded", [("column_wise", "table_wise"), ("table_wise", "column_wise"), ("column_wise", "row_wise")])
def test_row_wise_adagrad_state_is_regrouped_into_and_out_of_column_shards(tmp_path, saved, loaded):
    """FBGEMM keeps row-wise Adagrad's state per row and column shard (two shards of 8 columns
    here, one after the other). Out of them, a row's state is their width-weighted mean; into
    them, each shard starts from the row's. No table's state starts afresh."""
    before = run_on_ranks(_row_states_under, 2, str(tmp_path), saved, False)
    after = run_on_ranks(_row_states_under, 2, str(tmp_path), loaded, True)
    assert set(after) == set(before)
    for key, state in before.items():
        rows = problem().tables_by_name[key.removesuffix(".momentum1")].num_embeddings
        assert state.any(), key
        if saved == "column_wise":
            assert state.shape == (2 * rows,)
            torch.testing.assert_close(after[key], (state[:rows] + state[rows:]) / 2, rtol=1e-6, atol=0)
        else:
            assert torch.equal(after[key], state.repeat(2)), key


def test_partial_and_damaged_checkpoints(tmp_path):
    run_on_ranks(_train, 2, str(tmp_path / "o"), str(tmp_path / "ck"), 4, False, 2)
    ck = tmp_path / "ck"
    assert [s for s, _ in complete_checkpoints(ck)] == [2, 4]
    # a save that a crash interrupted is ignored
    shutil.copytree(ck / "step_000000004", ck / ".step_000000006.tmp")
    (ck / ".step_000000006.tmp" / "COMPLETE").unlink()
    partial = ck / "step_000000008"
    shutil.copytree(ck / "step_000000004", partial)
    (partial / "COMPLETE").unlink()
    assert [s for s, _ in complete_checkpoints(ck)] == [2, 4]
    with pytest.raises(CheckpointError, match="is partial"):
        read_meta(partial)
    # every checkpoint damaged: nothing is resumed, and the job says so in one line
    for step in (2, 4):
        for f in (ck / f"step_00000000{step}").glob("*.distcp"):
            f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(Exception) as e:
        run_on_ranks(_train, 2, str(tmp_path / "o2"), str(ck), 6, True, 0)
    assert "no checkpoint in" in str(e.value) and "verifies" in str(e.value)
    assert not (tmp_path / "o2" / "metrics.jsonl").exists() or "loss" not in (tmp_path / "o2" / "metrics.jsonl").read_text()


def _damage(path: Path, kind: str) -> None:
    data = path.read_bytes()
    if kind == "truncate":
        path.write_bytes(data[: len(data) // 2])
    else:  # flip 4 KiB (or all of a small file) in the middle
        start = max(0, len(data) // 2 - 2048)
        path.write_bytes(data[:start] + bytes(b ^ 0xFF for b in data[start:start + 4096]) + data[start + 4096:])


def _resume_each_damaged(rank, world, root):
    """For every file of the newest checkpoint, flipped and truncated: which step a resume takes."""
    import dataclasses
    import torch.distributed as dist

    root = Path(root)
    trainer = make_trainer(rank, world, str(root / "o"), str(root / "ck"), 4, False, every_scheme_plan(problem()), 2)
    trainer.run()
    newest = root / "ck" / "step_000000004"
    names = sorted(p.name for p in newest.iterdir() if p.is_file() and p.name != "COMPLETE")
    outcomes = {}
    for name in names:
        for kind in ("flip", "truncate"):
            case = root / f"case_{name}_{kind}"
            if rank == 0:
                shutil.copytree(root / "ck", case, ignore=shutil.ignore_patterns(".lock"))
                _damage(case / newest.name / name, kind)
            dist.barrier()
            trainer.checkpoints.config = dataclasses.replace(trainer.checkpoints.config, directory=case)
            try:
                outcomes[(name, kind)] = trainer.checkpoints.restore(trainer.config.steps)
            except CheckpointError as e:
                outcomes[(name, kind)] = str(e)
            dist.barrier()
    return outcomes


def test_every_flipped_or_truncated_file_is_detected_and_the_older_checkpoint_resumed(tmp_path, capfd):
    outcomes = run_on_ranks(_resume_each_damaged, 2, str(tmp_path))
    names = {name for name, _ in outcomes}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "rank0.pt", "rank1.pt", "meta.json", "MANIFEST.json"} <= names
    for (name, kind), outcome in outcomes.items():
        assert outcome == 2, (name, kind, outcome)  # never the damaged step 4, never a traceback
    assert "skipping checkpoint" in capfd.readouterr().out


def _resume_from(rank, world, ck, resume_from, steps):
    trainer = make_trainer(rank, world, str(Path(ck) / "o3"), ck, steps, True, every_scheme_plan(problem()))
    trainer.checkpoints.config = __import__("dataclasses").replace(trainer.checkpoints.config, resume_from=resume_from)
    try:
        return trainer.checkpoints.restore(trainer.config.steps)
    except CheckpointError as e:
        return str(e)


def test_resume_from_a_chosen_step_or_path(tmp_path):
    ck = tmp_path / "ck"
    run_on_ranks(_train, 2, str(tmp_path / "o"), str(ck), 4, False, 2)
    assert run_on_ranks(_resume_from, 2, str(ck), "2", 6) == 2
    assert run_on_ranks(_resume_from, 2, str(ck), str(ck / "step_000000002"), 6) == 2
    assert "no complete checkpoint of that step" in run_on_ranks(_resume_from, 2, str(ck), "3", 6)
    assert "past --steps 3" in run_on_ranks(_resume_from, 2, str(ck), "4", 3)
    _damage(ck / "step_000000002" / "rank1.pt", "flip")
    assert "is damaged (rank1.pt" in run_on_ranks(_resume_from, 2, str(ck), "2", 6)


def test_a_crafted_metadata_file_is_refused_not_run(tmp_path):
    """A pickle that would run code when DCP unpickles .metadata, with a manifest rewritten to
    match it (integrity is no defence against someone who can write the directory)."""
    import hashlib
    import pickle

    ck = tmp_path / "ck"
    run_on_ranks(_train, 2, str(tmp_path / "o"), str(ck), 2, False, 0)
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (eval, (f"open({str(marker)!r}, 'w').write('ran')",))

    step = ck / "step_000000002"
    (step / ".metadata").write_bytes(pickle.dumps(Payload()))
    manifest = json.loads((step / "MANIFEST.json").read_text())
    data = (step / ".metadata").read_bytes()
    manifest["files"][".metadata"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (step / "MANIFEST.json").write_text(json.dumps(manifest))
    outcome = run_on_ranks(_resume_from, 2, str(ck), None, 6)
    assert isinstance(outcome, str) and "refusing builtins.eval" in outcome, outcome
    assert not marker.exists()


def _hold_lock(rank, world, ck):
    from dlrm_scale.training.checkpoint import JobLock

    lock = JobLock(Path(ck))
    try:
        JobLock(Path(ck))
    except CheckpointError as e:
        return str(e)
    finally:
        lock.release()


def test_one_job_per_checkpoint_directory(tmp_path):
    (tmp_path / ".step_000000003.tmp").mkdir()
    message = run_on_ranks(_hold_lock, 1, str(tmp_path))
    assert "is in use by another job (pid" in message
    assert not (tmp_path / ".step_000000003.tmp").exists()  # a dead job's save, removed under the lock


def _rewrite_manifest(step: Path, edit) -> None:
    manifest = json.loads((step / "MANIFEST.json").read_text())
    edit(manifest["files"])
    (step / "MANIFEST.json").write_text(json.dumps(manifest))


def test_a_manifest_is_closed_and_a_crafted_one_is_skipped_and_named(tmp_path):
    """A manifest names only plain files inside its checkpoint, all the loader reads and nothing
    else: one that drops `.metadata` and names a file outside (with its true SHA-256), a symlink,
    a missing rank file, an extra file, each makes the checkpoint damaged: skipped and named, the
    older one resumed."""
    import hashlib
    import os

    from dlrm_scale.training.checkpoint import verify

    ck = tmp_path / "ck"
    run_on_ranks(_train, 2, str(tmp_path / "o"), str(ck), 4, False, 2)
    newest = ck / "step_000000004"
    assert verify(newest) is None
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"x" * 100)

    def outside_instead_of_metadata(files):
        files.pop(".metadata")
        files["../../outside.bin"] = {"bytes": 100, "sha256": hashlib.sha256(b"x" * 100).hexdigest()}

    def symlinked(step):
        (step / "rank1.pt").unlink()
        os.symlink(outside, step / "rank1.pt")

    cases = {
        "outside": (lambda step: _rewrite_manifest(step, outside_instead_of_metadata), "names '../../outside.bin', not a file inside"),
        "metadata dropped": (lambda step: _rewrite_manifest(step, lambda f: f.pop(".metadata")), "does not list .metadata, which resuming reads"),
        "rank file dropped": (lambda step: _rewrite_manifest(step, lambda f: f.pop("rank1.pt")), "does not list rank1.pt"),
        "a rank's data dropped": (lambda step: _rewrite_manifest(step, lambda f: f.pop("__1_0.distcp")), "does not list __1_*.distcp"),
        "symlink": (symlinked, "rank1.pt is a symlink"),
        "extra file": (lambda step: (step / "extra.bin").write_bytes(b"?"), "extra.bin is not in its MANIFEST.json"),
    }
    for name, (craft, message) in cases.items():
        case = tmp_path / name.replace(" ", "_")
        shutil.copytree(ck, case, ignore=shutil.ignore_patterns(".lock"), symlinks=True)
        craft(case / newest.name)
        assert message in (verify(case / newest.name) or ""), name
    case = tmp_path / "outside"
    assert run_on_ranks(_resume_from, 2, str(case), None, 6) == 2  # the crafted step 4 skipped, step 2 resumed


def _save_on_a_full_disk(rank, world, root, mode):
    """Train 6 steps, a checkpoint every 2, on a disk that fills: `enospc`, rank 1's save of step 4
    fails with ENOSPC; `short`, no room for step 4 and nothing to remove; `tight`, no room for
    step 6 until step 2 is removed."""
    import collections
    import errno
    import shutil as shutil_module

    from dlrm_scale.training import checkpoint as module

    root = Path(root)
    ck = root / "ck"
    real_save, real_usage = module.torch.save, shutil_module.disk_usage
    usage = collections.namedtuple("usage", "total used free")

    def save(obj, path, *args, **kwargs):
        if mode == "enospc" and rank == 1 and "000000004" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    def disk_usage(path):
        full = {"short": (ck / "step_000000002").exists(),
                "tight": (ck / "step_000000002").exists() and (ck / "step_000000004").exists()}.get(mode, False)
        return usage(10**12, 10**12, 0) if full else real_usage(path)

    module.torch.save, module.shutil.disk_usage = save, disk_usage
    trainer = make_trainer(rank, world, str(root / "o"), str(ck), 6, False, every_scheme_plan(problem()), 2)
    try:
        trainer.run()
        return "ran"
    except CheckpointError as e:
        return str(e)


@pytest.mark.parametrize("mode", ["enospc", "short", "tight"])
def test_a_full_disk_ends_in_one_line_and_nothing_is_lost(tmp_path, mode):
    from dlrm_scale.training.checkpoint import verify

    outcome = run_on_ranks(_save_on_a_full_disk, 2, str(tmp_path), mode)
    ck = tmp_path / "ck"
    if mode == "tight":  # the oldest removed, the save made
        assert outcome == "ran" and [s for s, _ in complete_checkpoints(ck)] == [4, 6]
        return
    why = "the disk filled up while saving" if mode == "enospc" else "it needs about"
    assert outcome.startswith(f"checkpoint of step 4 in {ck}: {why}") and outcome.endswith(
        f"the newest checkpoint is {ck / 'step_000000002'}; free space and resume with --resume"), outcome
    assert [s for s, _ in complete_checkpoints(ck)] == [2] and verify(ck / "step_000000002") is None
    assert not list(ck.glob(".step_*.tmp"))  # the failed save removed

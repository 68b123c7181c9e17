"""2D sparse parallelism trained (dlrm_scale.training.replicas): 4 ranks as 2 replicas of a
2-rank sharding group. A sync adds up each sharded table's changes and optimizer state over
exactly its replica group and leaves data-parallel tables alone; a row is synced before a
replica reads another one's change and after two changed it; synced every step or every 10, 2D
trains the 1D model; a job exchanges about the bytes its plan counts, resumes bitwise from its
own checkpoint, and its checkpoint loads under a 1D plan with the tables as saved."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import run_on_ranks
from dlrm_scale.training.replicas import changed_alone, looked_up_together, read_after_another
from planner.plan.document import Plan
from planner.plan.replication import held_bytes_per_rank
from tests.test_multinode import ENV, MODEL, _restored_tables, cli, windows
from tests.test_multinode import plan as make_plan

pytestmark = pytest.mark.distributed

TWO_D = MODEL + """cluster: {world_size: 4, ranks_per_node: 4}
constraints:  # every kind of shard a sync meets: rows, columns, a whole table, and a data-parallel one it leaves alone
  tables:
    - {match: t_large, schemes: [row_wise]}
    - {match: t_medium, schemes: [column_wise], max_shards: 2}
    - {match: t_small, schemes: [table_wise]}
    - {match: t_tiny, schemes: [data_parallel]}
"""


def export(config: Path, checkpoint: Path, out: Path) -> dict:
    r = subprocess.run(cli("export", str(checkpoint), "--config", str(config), "--out", str(out)), capture_output=True, text=True, env=ENV)
    assert r.returncode == 0, r.stderr
    return torch.load(out, weights_only=True)["state_dict"]


def _synced(rank, world, config, plan_path):
    """Every rank's shards and their state agreed at 1 and 4, then changed by rank and rank^2 (the
    data-parallel table's weights set to 7 + rank) and every row marked changed, then two syncs:
    what every rank holds after each, gathered on rank 0."""
    import torch.distributed as dist

    from dlrm_scale.training import replicas as replicas_module
    from dlrm_scale.training.replicas import ReplicaGroups
    from dlrm_scale.bridge.resident import embedding_kernels
    from dlrm_scale.run_config import load_run_config
    from dlrm_scale.training.build import build_sharded_model

    run = load_run_config(config)
    plan = Plan.load(plan_path)
    replicas = ReplicaGroups(plan, "cpu", "rowwise_adagrad")
    model = build_sharded_model(run.problem, plan, run.model, 0.05, torch.device("cpu"), replicas=replicas, ranks_per_node=world)

    def fill(weight: float, state: float, data_parallel: float) -> None:
        for kernel in embedding_kernels(model):
            dp = kernel.config.embedding_tables[0].name == "t_tiny"
            for w in kernel.emb_module.split_embedding_weights():
                w.fill_(data_parallel if dp else weight)
            for states in [] if dp else kernel.emb_module.split_optimizer_states():  # a dense optimizer's, elsewhere
                for s in states:
                    s.fill_(state)

    def held() -> dict:
        out = {}
        for kernel in embedding_kernels(model):
            weights = kernel.emb_module.split_embedding_weights()
            dp = kernel.config.embedding_tables[0].name == "t_tiny"
            states = [[]] * len(weights) if dp else kernel.emb_module.split_optimizer_states()
            for t, w, s in zip(kernel.config.embedding_tables, weights, states):
                out[(t.name, t.local_metadata.shard_offsets[1] if t.local_metadata else 0)] = (
                    sorted(set(w.flatten().tolist())), sorted({v for x in s for v in x.flatten().tolist()}))
        return out

    with torch.no_grad():
        fill(1.0, 4.0, 7.0)
        replicas.agree(model)
        fill(1.0 + rank, 4.0 + rank**2, 7.0 + rank)
        for changed_by in replicas.changed_by:  # as a step marks the rows one replica looked up (both changed them here)
            changed_by.fill_(1)
    replicas_module.COALESCE_BYTES = 100_000  # both ways: t_large's weights alone, in place; the rest several to a call
    synced = replicas.sync()
    after_one = held()
    synced_again = replicas.sync()  # nothing changed since they agreed: nothing moves
    gathered = [None] * world
    dist.all_gather_object(gathered, (replicas.job_ranks, synced, after_one, held(), synced_again))
    return gathered


def test_a_sync_adds_up_every_sharded_tables_updates_over_its_replica_group_alone(tmp_path):
    config = tmp_path / "two_d.yaml"
    config.write_text(TWO_D)
    plan = make_plan(config, tmp_path / "p.json", "--sync-every", "5", "--group-size", "2")
    assert plan.replication.group_size == 2 and plan.replication.replicas == 2
    per_group_rank = held_bytes_per_rank(plan, "rowwise_adagrad")
    result = run_on_ranks(_synced, 4, str(config), str(tmp_path / "p.json"))
    for rank, (job_ranks, synced, held, again, synced_again) in enumerate(result):
        # DMPCollection's layout: sharding groups [0, 2] and [1, 3]; replica groups [0, 1] and [2, 3]
        assert job_ranks == ([0, 2] if rank % 2 == 0 else [1, 3])
        assert synced == per_group_rank[rank // 2]  # every row: its weights' and its state's change
        # weights 1 and state 4 + the replicas' changes (0 + 1 and 0 + 1, or 2 + 3 and 4 + 9): a row one
        # replica changed alone has one change that is not zero; here both replicas', to check the sum
        weight, state = (2.0, 5.0) if rank < 2 else (6.0, 17.0)
        sharded = {k: v for k, v in held.items() if k[0] != "t_tiny"}
        assert sharded, "every rank holds a sharded table in this plan"
        for key, (weights, states) in sharded.items():
            assert weights == [weight] and states == [state], (rank, key)
        assert held[("t_tiny", 0)][0] == [7.0 + rank]  # data-parallel: all-reduced with the dense layers, never here
        assert again == held and synced_again == 0  # the rows were agreed: none changed since


def test_a_row_is_synced_before_a_replica_reads_another_ones_change_and_after_two_changed_it():
    changed_by = torch.full((8,), -1, dtype=torch.int16)
    # a step: replica 0 looks up rows 1 and 2, replica 1 rows 2 and 3; none changed before: nothing to sync
    # first; after it, row 2 (both changed it) is synced, rows 1 and 3 are each one replica's change
    looked_up = [torch.tensor([1, 2]), torch.tensor([2, 3])]
    assert read_after_another(changed_by, looked_up).tolist() == []
    assert looked_up_together(changed_by, looked_up).tolist() == [2]
    assert changed_by.tolist() == [-1, 0, -1, 1, -1, -1, -1, -1]
    # next step replica 1 is about to read row 1, which replica 0 changed: synced first (then replica 1's
    # change alone); its own row 3 again and replica 0's new row 4 stay theirs
    looked_up = [torch.tensor([4]), torch.tensor([1, 3])]
    assert read_after_another(changed_by, looked_up).tolist() == [1]
    assert looked_up_together(changed_by, looked_up).tolist() == []
    assert changed_by.tolist() == [-1, 1, -1, 1, 0, -1, -1, -1]
    # three replicas: row 4 (replica 0's) is read by replica 2, row 5 by replicas 0 and 2 together
    looked_up = [torch.tensor([5]), torch.tensor([], dtype=torch.int64), torch.tensor([4, 5, 6])]
    assert read_after_another(changed_by, looked_up).tolist() == [4]
    assert looked_up_together(changed_by, looked_up).tolist() == [5]
    assert changed_by.tolist() == [-1, 1, -1, 1, 2, -1, 2, -1]
    assert changed_alone(changed_by).tolist() == [1, 3, 4, 6] and changed_by.eq(-1).all()


@pytest.mark.parametrize("sync_every", [1, 10])
def test_2d_trains_the_1d_model(tmp_path, sync_every):
    """The rows both replicas looked up in a step synced after it from their gradients (1D's
    row-wise Adagrad update made from their sum at each step's learning rate, warming up; the
    sum of their updates would move them further), a row one replica changed synced before the
    other reads it (else it reads it as it was), the rest every N steps (here at the checkpoint):
    after 3 steps every table and dense layer is 1D's (to rounding), synced every step or every 10."""
    steps = 3
    config = tmp_path / "two_d.yaml"
    config.write_text(TWO_D.replace("train: {", "train: {warmup_steps: 4, "))
    make_plan(config, tmp_path / "p1d.json")
    make_plan(config, tmp_path / "p2d.json", "--sync-every", str(sync_every), "--group-size", "2")
    exported = {}
    for run in ("p1d", "p2d"):
        r = subprocess.run(cli("train", "--nproc-per-node", "4", "--config", str(config), "--plan", str(tmp_path / f"{run}.json"),
                               "--steps", str(steps), "--checkpoint-dir", str(tmp_path / run), "--checkpoint-every", str(steps),
                               "--out-dir", str(tmp_path / run)), capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        exported[run] = export(config, tmp_path / run / f"step_{steps:09d}", tmp_path / f"{run}.pt")
    one_d, two_d = exported["p1d"], exported["p2d"]
    assert one_d.keys() == two_d.keys()
    for key in one_d:
        torch.testing.assert_close(two_d[key], one_d[key], rtol=1e-4, atol=1e-6, msg=key)
    moved = [k for k in one_d if k.endswith(".t_large.weight")]
    assert moved, "a row-wise sharded table is compared"


def test_a_2d_job_counts_what_its_plan_does_resumes_bitwise_and_loads_under_1d(tmp_path):
    config = tmp_path / "two_d.yaml"
    config.write_text(TWO_D)
    assert make_plan(config, tmp_path / "p2d.json", "--sync-every", "5", "--group-size", "2").replication.sync_every_steps == 5

    def train(out: str, *args: str) -> list[dict]:
        r = subprocess.run(cli("train", "--nproc-per-node", "4", "--config", str(config), "--plan", str(tmp_path / "p2d.json"),
                               "--steps", "20", "--checkpoint-dir", str(tmp_path / out / "checkpoints"), "--checkpoint-every", "10",
                               "--deterministic", "--out-dir", str(tmp_path / out), *args),
                           capture_output=True, text=True, env=ENV, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        return windows(tmp_path / out)

    trained = train("first")
    assert [w["step"] for w in trained] == list(range(1, 21))  # --deterministic logs every step
    for w in trained:
        assert w["comm_bytes"] == w["comm_bytes_predicted"], w["step"]
    # every step the replicas exchanged rows looked up, more on the steps that sync every row changed
    # (5, 10, 15, 20): over the run, the plan's estimate (a Zipf law's distinct rows) within a third
    measured = [sum(w["replica_sync_bytes"][r] for w in trained) for r in range(4)]
    predicted = [sum(w["replica_sync_bytes_predicted"][r] for w in trained) for r in range(4)]
    assert measured == pytest.approx(predicted, rel=0.35)
    assert all(w["replica_sync_bytes"][r] > 0 for w in trained for r in range(4))
    assert min(w["replica_sync_bytes"][0] for w in trained if w["step"] % 5 == 0) > max(
        w["replica_sync_bytes"][0] for w in trained if w["step"] % 5)

    # resumed from its step-10 checkpoint (taken after a sync), the job repeats steps 11-20 bitwise
    # (--deterministic on 4 ranks: DDP keeps its first gradient buckets, see training.build)
    shutil.copytree(tmp_path / "first" / "checkpoints" / "step_000000010", tmp_path / "resumed" / "checkpoints" / "step_000000010")
    resumed = train("resumed", "--resume-from", "10")
    assert [w["loss"] for w in resumed] == [w["loss"] for w in trained[10:]]
    exported, again = (export(config, tmp_path / run / "checkpoints" / "step_000000020", tmp_path / f"{run}.pt") for run in ("first", "resumed"))
    assert exported.keys() == again.keys() and all(torch.equal(exported[k], again[k]) for k in exported)

    # and the step-20 checkpoint loads under a 1D plan for the same ranks, every table as saved
    one_d = make_plan(config, tmp_path / "p1d.json")
    assert one_d.replication is None
    saved = tmp_path / "first" / "checkpoints" / "step_000000020"
    restored = run_on_ranks(_restored_tables, 4, str(config), str(tmp_path / "p1d.json"), str(saved), str(tmp_path / "restore"))
    assert set(restored) == {"t_large", "t_medium", "t_small", "t_tiny", "t_grid"}
    for name, table in restored.items():
        assert torch.equal(table, next(v for k, v in exported.items() if k.endswith(f".{name}.weight"))), name

"""CPU kernels chosen by measurement: the dot interaction, the profile's choice, the batch prefetcher."""

import threading
import time
from pathlib import Path

import pytest
import torch
from torchrec.models.dlrm import InteractionArch

from dlrm_scale.kernels import interaction
from dlrm_scale.kernels.interaction import DotInteraction
from dlrm_scale.training.prefetch import Prefetcher
from dlrm_scale.run_config import Overrides, load_run_config
from planner.spec.errors import ConfigError


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("tables", [1, 5, 26])
def test_dot_interaction_matches_torchrecs_values_and_gradients(tables, compiled, monkeypatch):
    """Both of ours: the C++ kernel (CPU) and the symmetric batched matmul (elsewhere, or where
    the extension did not build)."""
    if not compiled:
        monkeypatch.setattr(interaction, "built", lambda: False)
    torch.manual_seed(tables)
    dense = torch.randn(33, 8, dtype=torch.float64, requires_grad=True)
    sparse = torch.randn(33, tables, 8, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(33, 8 + tables * (tables + 1) // 2, dtype=torch.float64)
    results = []
    for module in (InteractionArch(tables), DotInteraction(tables)):
        out = module(dense, sparse)
        grads = torch.autograd.grad(out, (dense, sparse), upstream)
        results.append((out, *grads))
    for theirs, ours in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_kernels_come_from_the_profile_and_flags_override(tmp_path):
    profile = tmp_path / "box.yaml"
    base = Path("configs/hardware/cpu_gloo.yaml").read_text().split("cpu_kernels:")[0]
    config = tmp_path / "c.yaml"
    config.write_text(f"hardware: {profile}\ntables: [{{name: a, num_embeddings: 10, embedding_dim: 8}}]\n")

    def kernels(**flags):
        train = load_run_config(config, Overrides(**flags)).train
        return train.cpu_embeddings, train.interaction, train.store_io

    profile.write_text(base + "cpu_kernels: {embeddings: dlrm_scale, interaction: dlrm_scale, store_io: mapped}\n")
    assert kernels() == ("dlrm_scale", "dlrm_scale", "mapped")
    assert kernels(interaction="torchrec", cpu_embeddings="fbgemm", store_io="direct") == ("fbgemm", "torchrec", "direct")
    profile.write_text(base)  # never measured: TorchRec's kernels, and the store read with pread
    assert kernels() == ("fbgemm", "torchrec", "pread")
    for bad in ("{interaction: mkl}", "{store_io: direct}"):  # direct is the user's to choose, never measured
        profile.write_text(base + f"cpu_kernels: {bad}\n")
        with pytest.raises(ConfigError, match="cpu_kernels must map embeddings to one of"):
            kernels()


def test_prefetcher_keeps_order_and_ends():
    batches = Prefetcher(iter(range(50)), depth=3)
    assert list(batches) == list(range(50))
    with pytest.raises(StopIteration):
        next(batches)


def test_prefetcher_hands_the_producers_error_to_the_consumer():
    def source():
        yield 1
        raise ValueError("bad row in day_3.tsv")

    batches = Prefetcher(source())
    assert next(batches) == 1
    with pytest.raises(ValueError, match="bad row"):
        next(batches)


def test_prefetcher_works_ahead_and_close_stops_a_blocked_worker():
    made = []

    def source():
        for i in range(1000):
            made.append(i)
            yield i

    batches = Prefetcher(source(), depth=2)
    time.sleep(0.2)
    assert 2 <= len(made) <= 4  # the queue's depth, one in the worker's hand, none beyond
    assert next(batches) == 0
    batches.close()
    assert not any(t.name == "dlrm-scale-prefetch" and t.is_alive() for t in threading.enumerate())


def test_a_run_that_fits_the_budget_is_made_before_the_loop_else_streamed():
    from planner.spec.specs import TableSpec
    from dlrm_scale.training.data import SyntheticData
    from dlrm_scale.training.prefetch import batch_bytes, materialise

    data = SyntheticData([TableSpec("t", 1000, 8, 3.0)], 4, 64, seed=0, rank=0)
    size = batch_bytes(data.batch(0))
    held, made = materialise(data.batches(0, 10), 10, 10 * size)
    assert made and [b.labels.tolist() for b in held] == [data.batch(s).labels.tolist() for s in range(10)]
    streamed, made = materialise(data.batches(0, 10), 10, 10 * size - 1)
    assert not made and [b.labels.tolist() for b in streamed] == [data.batch(s).labels.tolist() for s in range(10)]


def test_batches_made_before_the_loop_are_held_and_a_later_start_goes_on_from_them():
    """A job that moves to another plan goes on from the batches it made (they do not depend on
    the plan): none is made again, and those it trained on are let go."""
    from planner.spec.specs import TableSpec
    from dlrm_scale.training.data import SyntheticData
    from dlrm_scale.training.prefetch import HeldBatches, batch_source

    data = SyntheticData([TableSpec("t", 1000, 8, 3.0)], 4, 64, seed=0, rank=0)

    def labels(batches) -> list:
        return [b.labels.tolist() for b in batches]

    def never_made():
        raise AssertionError("a batch held was made again")
        yield

    held = HeldBatches()
    with batch_source(data.batches(0, 10), 10, 1, 0, held=held) as batches:
        trained = [next(batches) for _ in range(5)]  # a pipeline takes batches ahead of the step it stops at
    with batch_source(never_made(), 7, 1, 0, held=held, first_step=3) as batches:
        assert labels(batches) == [data.batch(s).labels.tolist() for s in range(3, 10)]
    assert held.first == 3 and labels(trained[:3]) == [data.batch(s).labels.tolist() for s in range(3)]
    with batch_source(data.batches(2, 8), 8, 1, 0, held=held, first_step=2) as batches:  # before what it holds: made
        assert labels(batches) == [data.batch(s).labels.tolist() for s in range(2, 10)]


def test_phase_laps_add_up_and_skipped_time_counts_nowhere():
    from dlrm_scale.run_record import PHASES
    from dlrm_scale.training.phases import PhaseTimer

    timer = PhaseTimer()
    timer.skip()
    time.sleep(0.02)
    timer.lap("data")
    time.sleep(0.05)
    timer.skip()  # an evaluation, say
    time.sleep(0.02)
    timer.lap("emb_fwd")
    took = timer.take()
    assert set(took) == set(PHASES)
    assert 0.015 < took["data"] < 0.045 and 0.015 < took["emb_fwd"] < 0.045
    assert sum(took.values()) < 0.06  # the 50 ms skipped went nowhere

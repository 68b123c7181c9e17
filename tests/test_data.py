import numpy as np
import pytest
import torch

from dlrm_scale.training.data import CHUNK_SAMPLES, SyntheticData
from planner.spec.specs import TableSpec

TABLES = [TableSpec("a", 10_000, 8, pooling_factor=5.0, zipf_exponent=1.2), TableSpec("b", 50, 8, pooling_factor=1.0)]


def test_batches_are_deterministic_per_seed_and_step():
    d1, d2 = SyntheticData(TABLES, 3, 64, seed=1), SyntheticData(TABLES, 3, 64, seed=1)
    a, b = d1.batch(7), d2.batch(7)
    assert torch.equal(a.dense_features, b.dense_features) and torch.equal(a.labels, b.labels)
    assert torch.equal(a.sparse_features.values(), b.sparse_features.values())
    assert not torch.equal(a.dense_features, d1.batch(8).dense_features)
    assert not torch.equal(a.dense_features, SyntheticData(TABLES, 3, 64, seed=2).batch(7).dense_features)


def _as_rows(batch):
    """Each sample as (dense, label, ids per table), comparable across batches."""
    kjt = batch.sparse_features.to_dict()
    per_table = [torch.split(kjt[k].values(), kjt[k].lengths().tolist()) for k in sorted(kjt)]
    return [(tuple(batch.dense_features[i].tolist()), float(batch.labels[i]), tuple(tuple(t[i].tolist()) for t in per_table))
            for i in range(len(batch.labels))]


@pytest.mark.parametrize("global_batch, worlds", [(64, (1, 2, 4)), (3072, (1, 2, 3, 4, 6)), (CHUNK_SAMPLES + 2, (1, 2, 3, 6))])
def test_the_global_batch_is_the_same_at_every_world_size(global_batch, worlds):
    """Rank slices of one global batch, concatenated in rank order, are that batch: the same
    samples whatever the world size (a slice that straddles a chunk included)."""
    whole = _as_rows(SyntheticData(TABLES, 3, global_batch, seed=5).batch(3))
    for world in worlds:
        parts = [SyntheticData(TABLES, 3, global_batch, seed=5, rank=r, world=world).batch(3) for r in range(world)]
        assert all(len(p.labels) == global_batch // world for p in parts)
        assert sum((_as_rows(p) for p in parts), []) == whole, world


def test_a_batch_that_does_not_split_evenly_is_refused():
    with pytest.raises(ValueError, match="split evenly"):
        SyntheticData(TABLES, 3, 10, seed=0, rank=0, world=4)


def test_pooling_factors_ids_in_range_and_skew():
    data = SyntheticData(TABLES, 3, 4096, seed=0)
    kjt = data.batch(0).sparse_features.to_dict()
    a, b = kjt["f_a"], kjt["f_b"]
    assert abs(a.lengths().float().mean().item() - 5.0) < 0.2
    assert torch.all(b.lengths() == 1)
    assert a.values().min() >= 0 and a.values().max() < 10_000
    counts = np.bincount(a.values().numpy(), minlength=10_000)
    top = np.sort(counts)[::-1]
    # Zipf 1.2: the 10 hottest rows take a large share; uniform ids would give ~0.1%
    assert top[:10].sum() / counts.sum() > 0.3


def test_labels_depend_on_the_features():
    data = SyntheticData(TABLES, 3, 8192, seed=0)
    batch = data.batch(0)
    y = batch.labels.numpy()
    assert 0.2 < y.mean() < 0.8
    # the hidden model uses the dense features: they must correlate with the labels
    corr = np.corrcoef(batch.dense_features.numpy() @ data.dense_weights, y)[0, 1]
    assert corr > 0.1


def test_zipf_ranks_follow_the_bounded_law_exactly():
    """Rejection-inversion draws P(rank k) ~ k^-s on 1..N; a frequency off by more than a few
    standard errors (an approximate inversion, an off-by-one rank) fails."""
    from dlrm_scale.training.data import ZipfIds

    n = 400_000
    for rows, s in [(50, 1.05), (7, 1.0), (1000, 0.6), (300, 2.5)]:
        ranks = ZipfIds(rows, s, seed=0).ranks(n, np.random.default_rng(3))
        assert ranks.min() >= 0 and ranks.max() < rows
        p = 1.0 / np.arange(1, rows + 1) ** s
        p /= p.sum()
        observed = np.bincount(ranks, minlength=rows) / n
        stderr = np.sqrt(p * (1 - p) / n)
        assert np.all(np.abs(observed - p) < 5 * stderr + 1e-6), (rows, s)

"""Our CPU row-wise Adagrad kernel against FBGEMM's on the same batches."""

import numpy as np
import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, OptimType, SplitTableBatchedEmbeddingBagsCodegen

from dlrm_scale.kernels.cpu_adagrad import InstalledKernel

# a table past 2^22 rows takes three radix passes
ROWS = [5_000_000, 300, 7]
DIMS = [8, 8, 4]


def tbe(pooling: PoolingMode, feature_table_map=None) -> SplitTableBatchedEmbeddingBagsCodegen:
    torch.manual_seed(0)
    return SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(ROWS, DIMS)],
        feature_table_map=feature_table_map, optimizer=OptimType.EXACT_ROWWISE_ADAGRAD,
        learning_rate=0.1, eps=1e-6, pooling_mode=pooling,
    )


def batch(step: int, tables: list[int], index_dtype, B: int = 64):
    rng = np.random.default_rng(step)
    lengths = rng.integers(0, 12, size=(len(tables), B))  # empty bags too
    # skewed, spread over every table's rows (the prime scatters the hot ranks)
    ids = [(rng.zipf(1.3, size=lengths[i].sum()) * 104_729) % ROWS[t] for i, t in enumerate(tables)]
    offsets = np.concatenate([[0], np.cumsum(lengths.reshape(-1))])
    weights = torch.from_numpy(rng.random(offsets[-1]).astype(np.float32))
    return torch.from_numpy(np.concatenate(ids)).to(index_dtype), torch.from_numpy(offsets).to(index_dtype), weights


def train(module, steps, tables, index_dtype, weighted):
    for step in range(steps):
        ids, offsets, weights = batch(step, tables, index_dtype)
        out = module(ids, offsets, per_sample_weights=weights if weighted else None)
        grad = torch.from_numpy(np.random.default_rng(100 + step).standard_normal(tuple(out.shape)).astype(np.float32))
        out.backward(grad)


@pytest.mark.parametrize("pooling, weighted, index_dtype, shared", [
    (PoolingMode.SUM, False, torch.int64, False),
    (PoolingMode.MEAN, False, torch.int32, False),
    (PoolingMode.SUM, True, torch.int64, False),
    (PoolingMode.SUM, False, torch.int64, True),
])
def test_updates_match_fbgemm(pooling, weighted, index_dtype, shared):
    # shared: two features look up table 0 (FBGEMM's slow path, ours handles it the same way)
    feature_table_map = [0, 0, 1, 2] if shared else None
    tables = feature_table_map or [0, 1, 2]
    theirs, ours = tbe(pooling, feature_table_map), tbe(pooling, feature_table_map)
    assert torch.equal(theirs.weights_host, ours.weights_host)
    train(theirs, 5, tables, index_dtype, weighted)
    with InstalledKernel():
        train(ours, 5, tables, index_dtype, weighted)
    assert not torch.equal(ours.weights_host, tbe(pooling, feature_table_map).weights_host)  # it trained
    torch.testing.assert_close(ours.weights_host, theirs.weights_host, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ours.momentum1_host, theirs.momentum1_host, rtol=1e-5, atol=1e-6)


def test_closing_restores_fbgemm():
    """Weight decay is refused by ours and run by FBGEMM's: which kernel ran shows."""
    torch.manual_seed(0)
    module = SplitTableBatchedEmbeddingBagsCodegen(
        [(r, d, EmbeddingLocation.HOST, ComputeDevice.CPU) for r, d in zip(ROWS, DIMS)],
        optimizer=OptimType.EXACT_ROWWISE_ADAGRAD, learning_rate=0.1, weight_decay=0.01,
    )
    ids, offsets, _ = batch(0, [0, 1, 2], torch.int64)
    with InstalledKernel():
        out = module(ids, offsets)
        with pytest.raises(RuntimeError, match="cpu_embeddings: fbgemm"):
            out.backward(torch.ones_like(out))
    out = module(ids, offsets)
    out.backward(torch.ones_like(out))

"""DLRM's dot interaction, computed without the full Gram matrix and its triangle gather.

TorchRec's `InteractionArch` computes Z = C C^T per sample (C: the dense vector and the F
pooled embeddings, (F+1) x D), keeps the upper triangle with an advanced-indexing gather, and
leaves the backward to autograd: two batched matmuls (one per side of the product) and an
accumulating `index_put` for the gather, which on a CPU is most of the cost (24 ms of a
~110 ms step for 26 tables, batch 1,024, dim 64, on the benchmark machine).
- On CPU, `csrc/dot_interaction_cpu.cpp` forms only the upper-triangle dot products, one
  sample at a time with its vectors in L1, and its backward dC_i = sum_j g_ij C_j in one pass.
- Elsewhere (or where the extension did not build), Z is symmetric, so dL/dC = (G + G^T) C
  with G the upper-triangular gradient: one batched matmul, after the gradient is scattered
  (every pair has its own slot, so without accumulation) into a symmetric matrix.
Same output, same gradients up to float summation order. Which of TorchRec's and this one runs
is a measured fact of the machine (`dlrm-scale calibrate`), as for the embedding kernels.
"""

from __future__ import annotations

import torch
from torch import nn

from dlrm_scale.kernels.cpu_extension import built, load

class _CpuDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, combined: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(combined)
        return load().dot_interaction_forward(combined)

    @staticmethod
    def backward(ctx, grad_pairs: torch.Tensor):
        (combined,) = ctx.saved_tensors
        return load().dot_interaction_backward(combined, grad_pairs)


class _SymmetricDot(torch.autograd.Function):
    @staticmethod
    def forward(ctx, combined: torch.Tensor, upper: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(combined, upper, lower)
        gram = torch.bmm(combined, combined.transpose(1, 2)).flatten(1)
        return gram.index_select(1, upper)

    @staticmethod
    def backward(ctx, grad_pairs: torch.Tensor):
        combined, upper, lower = ctx.saved_tensors
        n = combined.shape[1]
        sym = grad_pairs.new_zeros(grad_pairs.shape[0], n * n)
        sym.index_copy_(1, upper, grad_pairs)
        sym.index_copy_(1, lower, grad_pairs)
        return torch.bmm(sym.view(-1, n, n), combined), None, None


class DotInteraction(nn.Module):
    """Drop-in for TorchRec's `InteractionArch(num_sparse_features)`: the dense vector, then
    the dot products of every pair of (dense, sparse...) vectors in upper-triangle order."""

    def __init__(self, num_sparse_features: int) -> None:
        super().__init__()
        self.F = num_sparse_features
        n = num_sparse_features + 1
        rows, cols = torch.triu_indices(n, n, offset=1)
        self.register_buffer("upper", rows * n + cols, persistent=False)
        self.register_buffer("lower", cols * n + rows, persistent=False)

    def forward(self, dense_features: torch.Tensor, sparse_features: torch.Tensor) -> torch.Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        if combined.device.type == "cpu" and built():
            pairs = _CpuDot.apply(combined)
        else:
            pairs = _SymmetricDot.apply(combined, self.upper, self.lower)
        return torch.cat((dense_features, pairs), dim=1)

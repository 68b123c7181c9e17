"""Our CPU kernel for FBGEMM's fused row-wise Adagrad embedding backward.

FBGEMM 1.8 updates each distinct row of a large CPU table in ~500 ns (a cold weight row and
a cold momentum entry, one after the other); `csrc/rowwise_adagrad_cpu.cpp` sorts the ids
once and overlaps those misses, ~4x faster on the embedding-bound benchmark's tables. It is
installed as the CPU kernel of `fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu`,
so TorchRec's sharded modules and the tiered caches use it unchanged; CUDA is untouched.

Compiled with the other CPU kernels (dlrm_scale.kernels.cpu_extension). Without a compiler, training
goes on with FBGEMM's kernel after one warning line.
"""

from __future__ import annotations

import warnings

import torch

from dlrm_scale.kernels.cpu_extension import built, load

OP = "split_embedding_backward_codegen_rowwise_adagrad_cpu"


def _backward(grad_output, host_weights, weights_placements, weights_offsets, D_offsets, max_D, hash_size_cumsum,
              total_hash_size_bits, indices, offsets, pooling_mode, indice_weights, stochastic_rounding, momentum1_host,
              momentum1_placements, momentum1_offsets, learning_rate_tensor, eps=0.0, weight_decay=0.0,
              weight_decay_mode=0, max_norm=0.0, output_dtype=0):
    # ours has neither (FBGEMM's own CPU fast path ignores both); refusing is better than a
    # run that silently trains something else than asked
    if weight_decay != 0.0 or max_norm != 0.0:
        raise RuntimeError("dlrm_scale's CPU row-wise Adagrad kernel has no weight decay or max norm; "
                           "set train: cpu_embeddings: fbgemm")
    per_id_weights = indice_weights if indice_weights is not None else torch.empty(0)
    load().rowwise_adagrad_backward(
        grad_output, host_weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pooling_mode,
        per_id_weights, momentum1_host, momentum1_offsets, float(learning_rate_tensor), eps)


class InstalledKernel:
    """Our kernel registered over FBGEMM's for this process; close() restores FBGEMM's."""

    def __init__(self) -> None:
        import fbgemm_gpu  # noqa: F401  (registers the op we override)

        load()
        self._library = torch.library.Library("fbgemm", "IMPL")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel": the point
            self._library.impl(OP, _backward, "CPU")

    def close(self) -> None:
        if self._library is not None:
            self._library._destroy()
            self._library = None

    def __enter__(self) -> "InstalledKernel":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def install(embedding_optimizer: str) -> InstalledKernel | None:
    """Our kernel for row-wise Adagrad on CPU in this process; None (FBGEMM's kernels) for
    another optimizer, which it does not cover, or where it does not build."""
    return InstalledKernel() if embedding_optimizer == "rowwise_adagrad" and built() else None

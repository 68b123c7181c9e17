"""Our CPU kernel for FBGEMM's fused row-wise Adagrad embedding backward.

FBGEMM 1.8 updates each distinct row of a large CPU table in ~500 ns (a cold weight row and
a cold momentum entry, one after the other); `csrc/rowwise_adagrad_cpu.cpp` sorts the ids
once and overlaps those misses, ~4x faster on the embedding-bound benchmark's tables. It is
installed as the CPU kernel of `fbgemm::split_embedding_backward_codegen_rowwise_adagrad_cpu`,
so TorchRec's sharded modules and the tiered caches use it unchanged; CUDA is untouched.

The C++ source is compiled on first use (torch's cpp_extension, ~30 s) into the virtual
environment and reused while it is unchanged. Without a compiler, training goes on with
FBGEMM's kernel after one warning line.
"""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

SOURCE = Path(__file__).resolve().parent / "csrc" / "rowwise_adagrad_cpu.cpp"
OP = "split_embedding_backward_codegen_rowwise_adagrad_cpu"

_extension = None


def build_directory() -> Path:
    # inside the virtual environment, so `make clean` removes it with everything else
    return Path(sys.prefix) / "dlrm_scale_extensions"


def load_extension():
    """The compiled kernel (built once per source change, under build_directory())."""
    global _extension
    if _extension is None:
        from torch.utils.cpp_extension import load

        # pip's ninja lives beside the interpreter, which is not always on PATH (torchrun workers)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        build_directory().mkdir(parents=True, exist_ok=True)
        _extension = load("dlrm_scale_rowwise_adagrad_cpu", [str(SOURCE)], extra_cflags=["-O3"],
                          build_directory=str(build_directory()), verbose=False)
    return _extension


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
    load_extension().rowwise_adagrad_backward(
        grad_output, host_weights, weights_offsets, D_offsets, hash_size_cumsum, indices, offsets, pooling_mode,
        per_id_weights, momentum1_host, momentum1_offsets, float(learning_rate_tensor), eps)


class InstalledKernel:
    """Our kernel registered over FBGEMM's for this process; close() restores FBGEMM's."""

    def __init__(self) -> None:
        import fbgemm_gpu  # noqa: F401  (registers the op we override)

        load_extension()
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


def built() -> bool:
    """Whether the kernel builds (or is built) here; a failure is one warning line, since
    training goes on with FBGEMM's kernel, only slower."""
    try:
        load_extension()
        return True
    except Exception as e:  # a missing compiler, headers or ninja
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"warning: dlrm_scale's CPU row-wise Adagrad kernel did not build ({first_line}); using FBGEMM's",
              file=sys.stderr, flush=True)
        return False


def install(embedding_optimizer: str) -> InstalledKernel | None:
    """Our kernel for row-wise Adagrad on CPU in this process; None (FBGEMM's kernels) for
    another optimizer, which it does not cover, or where it does not build."""
    return InstalledKernel() if embedding_optimizer == "rowwise_adagrad" and built() else None


if __name__ == "__main__":  # `make venv` builds it once, so that jobs and tests do not race to
    if built():
        print(f"built {SOURCE.name} in {build_directory()}")

"""dlrm_scale's CPU kernels (csrc/): the row-wise Adagrad embedding backward, the dot
interaction and the row cache's per-batch pass, compiled by torch's cpp_extension into one
extension on first use (~40 s) inside the virtual environment, and reused while the sources are
unchanged. `make venv` builds it, so that jobs and tests do not race to. Without a compiler,
training goes on with FBGEMM's and TorchRec's own kernels and the row cache's torch ops, after
one warning line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
SOURCES = [CSRC / "bindings.cpp", CSRC / "rowwise_adagrad_cpu.cpp", CSRC / "dot_interaction_cpu.cpp", CSRC / "row_cache_cpu.cpp"]

_extension = None
_failure: str | None = None


def build_directory() -> Path:
    # inside the virtual environment, so `make clean` removes it with everything else
    return Path(sys.prefix) / "dlrm_scale_extensions"


def load():
    """The compiled extension (built once per source change, under build_directory())."""
    global _extension
    if _extension is None:
        from torch.utils.cpp_extension import load as load_cpp

        # pip's ninja lives beside the interpreter, which is not always on PATH (torchrun workers)
        os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        build_directory().mkdir(parents=True, exist_ok=True)
        _extension = load_cpp("dlrm_scale_cpu_kernels", [str(s) for s in SOURCES], extra_cflags=["-O3", "-march=native", "-fopenmp-simd"],
                              extra_include_paths=[str(CSRC)], build_directory=str(build_directory()), verbose=False)
    return _extension


def built() -> bool:
    """Whether the extension builds (or is built) here; a failure is one warning line, once,
    since training goes on with FBGEMM's and TorchRec's kernels, only slower."""
    global _failure
    if _failure is not None:
        return False
    try:
        load()
        return True
    except Exception as e:  # a missing compiler, headers or ninja
        _failure = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"warning: dlrm_scale's CPU kernels did not build ({_failure}); using FBGEMM's and TorchRec's",
              file=sys.stderr, flush=True)
        return False


if __name__ == "__main__":
    if built():
        print(f"built {', '.join(s.name for s in SOURCES)} in {build_directory()}")

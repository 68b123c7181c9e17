"""A rank ends after its work without the interpreter's teardown (where gloo's worker threads,
freeing finished collectives' tensors late, abort the process: dlrm_scale.training.rank_end),
with its exit code and its output kept."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from dlrm_scale.tools.launch import free_port

pytestmark = pytest.mark.distributed


def test_a_rank_ends_with_its_code_and_output_and_no_teardown():
    script = textwrap.dedent(f"""
        import atexit, os
        import torch, torch.distributed as dist
        from dlrm_scale.training.rank_end import end_rank
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}")
        dist.init_process_group("gloo", rank=0, world_size=1)
        dist.all_reduce(torch.ones(4))
        atexit.register(lambda: print("teardown ran"))
        print("trained", end="")  # no newline: still in the buffer of a pipe
        end_rank(3)
        print("after end_rank")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert proc.stdout == "trained"  # flushed; neither the atexit handler nor the line after end_rank ran

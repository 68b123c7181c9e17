"""Checked third-party warnings leave the terminal for the run's log; any other still shows."""

import subprocess
import sys

from dlrm_scale import quiet

CODE = """
import logging, warnings
from pathlib import Path
from dlrm_scale import quiet
quiet.install(Path({log!r}))
warnings.warn("`broadcast_buffers` is deprecated. Use forward_sync_buffers", FutureWarning)
warnings.warn("something nobody checked", FutureWarning)
logging.getLogger("torchrec.distributed.utils").warning("Sharding Type is data_parallel, caching params will be ignored")
logging.getLogger("torchrec.distributed.utils").warning("a torchrec warning nobody checked")
"""


def test_checked_warnings_go_to_the_log_and_others_still_show(tmp_path):
    log = tmp_path / "third_party.log"
    out = subprocess.run([sys.executable, "-c", CODE.format(log=str(log))], capture_output=True, text=True, check=True)
    assert "something nobody checked" in out.stderr and "a torchrec warning nobody checked" in out.stderr
    assert "broadcast_buffers" not in out.stderr and "caching params" not in out.stderr
    kept = log.read_text()
    assert "broadcast_buffers" in kept and "caching params will be ignored" in kept and "nobody" not in kept


def test_every_checked_warning_says_why():
    for c in quiet.CHECKED:
        assert len(c.reason) > 40, c
    assert quiet.checked("UserWarning", "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered x")
    assert quiet.checked("UserWarning", "an autograd kernel was not registered") is None  # another op: still shown

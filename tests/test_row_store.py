"""Row stores: what is written is read back, through the log, compaction and checkpoints."""

from __future__ import annotations

import ctypes
import mmap
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from dlrm_scale.tiering.store import FileRowStore, MemoryRowStore
from planner.cost.cost_model import rows_bytes, slow_tier_bytes
from planner.spec.errors import ConfigError


def stores(tmp_path):
    return [MemoryRowStore(1000, 8, 1), FileRowStore(1000, 8, 1, tmp_path / "rows.f32", log_rows=64)]


@pytest.mark.parametrize("kind", [0, 1])
def test_writes_survive_log_compaction_and_release(tmp_path, kind):
    store = stores(tmp_path)[kind]
    store.initialise(lambda start, stop: torch.rand(stop - start, 8) * 0.2 - 0.1)
    expected = store.read(torch.arange(1000)).clone()
    assert expected[:, :8].abs().max() <= 0.1 and not expected[:, 8].any()
    g = torch.Generator().manual_seed(1)
    for _ in range(20):  # 20 x 30 rows through a 64-record log: several compactions
        ids = torch.randperm(1000, generator=g)[:30]
        records = torch.randn(30, 9, generator=g)
        store.write(ids, records)
        expected[ids] = records
        store.release()
        assert torch.equal(store.read(torch.arange(1000)), expected)
    if kind == 1:
        assert store.compactions > 0
    store.flush()
    assert torch.equal(store.read(torch.arange(1000)), expected)


@pytest.mark.parametrize("kind", [0, 1])
def test_save_and_load_restore_every_record(tmp_path, kind):
    store = stores(tmp_path)[kind]
    store.initialise(lambda start, stop: torch.rand(stop - start, 8) * 0.2 - 0.1)
    store.write(torch.tensor([3, 500]), torch.ones(2, 9))
    store.save(tmp_path / "ckpt.f32")
    saved = store.read(torch.arange(1000)).clone()
    store.write(torch.tensor([3, 7]), torch.zeros(2, 9))
    store.load(tmp_path / "ckpt.f32")
    assert torch.equal(store.read(torch.arange(1000)), saved)
    (tmp_path / "short.f32").write_bytes(b"\0" * 10)
    with pytest.raises(ConfigError, match="holds 10 bytes but this shard needs 36,000"):
        store.load(tmp_path / "short.f32")


def test_the_ssd_store_lives_in_files_that_persist(tmp_path):
    store = FileRowStore(100, 4, 1, tmp_path / "t.f32")
    store.write(torch.tensor([5]), torch.full((1, 5), 2.0))
    store.close()  # flushes the log into the base file
    again = FileRowStore(100, 4, 1, tmp_path / "t.f32")
    assert torch.equal(again.read(torch.tensor([5])), torch.full((1, 5), 2.0))


def test_the_planner_counts_what_the_ssd_store_takes_on_disk(tmp_path):
    rows, cols = 4096, 8
    store = FileRowStore(rows, cols, 1, tmp_path / "t.f32")  # weights and a row-wise Adagrad state
    store.initialise(lambda start, stop: torch.ones(stop - start, cols))
    store.write(torch.arange(rows), torch.full((rows, cols + 1), 2.0))  # a write-back of every row: the log is full
    store.flush()
    os.sync()
    on_disk = sum(f.stat().st_blocks * 512 for f in tmp_path.iterdir())
    assert rows_bytes(rows, cols, "rowwise_adagrad") < on_disk <= slow_tier_bytes(rows, cols, "rowwise_adagrad", "ssd", "cpu")


def test_the_ssd_store_reserves_its_disk_blocks_when_created(tmp_path):
    # before a row is written: a disk that fills up later cannot fail an append mid-step
    FileRowStore(4096, 8, 1, tmp_path / "t.f32")
    allocated = sum(f.stat().st_blocks * 512 for f in tmp_path.iterdir())
    assert allocated >= slow_tier_bytes(4096, 8, "rowwise_adagrad", "ssd", "cpu")


def pages_in_page_cache(path) -> tuple[int, int]:
    """(pages of the file at `path` the page cache holds, pages of the file): mincore(2) on a
    mapping of it, which maps without faulting anything in."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        pages = -(-len(mm) // mmap.PAGESIZE)
        vec = (ctypes.c_ubyte * pages)()
        address = ctypes.addressof(ctypes.c_char.from_buffer(mm))  # the temporary view is gone at once
        assert libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(len(mm)), vec) == 0, ctypes.get_errno()
        return sum(v & 1 for v in vec), pages


@pytest.mark.skipif(tuple(int(x) for x in os.uname().release.split(".")[:2]) < (5, 14), reason="MADV_POPULATE_READ: Linux >= 5.14")
@pytest.mark.parametrize("io", ["pread", "mapped", "direct"])
def test_the_ssd_store_brings_its_log_into_the_page_cache_when_created(tmp_path, io):
    # appends then write into pages the page cache already holds rather than allocating one a
    # page mid-step; a store read with O_DIRECT is larger than the page cache and is left alone
    try:
        store = FileRowStore(8192, 8, 1, tmp_path / "t.f32", io=io)
    except ConfigError:
        pytest.skip(f"{tmp_path} cannot read with O_DIRECT")
    held, pages = pages_in_page_cache(store.log_path)
    assert held == (0 if io == "direct" else pages)
    store.close()


def test_a_store_the_disk_has_no_room_for_is_one_line(tmp_path):
    # a file-size limit stands in for a full disk: the same refusal, reached without filling one
    code = textwrap.dedent(f"""
        import resource, signal
        from pathlib import Path
        from dlrm_scale.tiering.store import FileRowStore
        from planner.spec.errors import ConfigError
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))
        try:
            FileRowStore(4096, 8, 1, Path({str(tmp_path / "t.f32")!r}))
        except ConfigError as e:
            print(e)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=os.getcwd(), timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"store file {tmp_path / 't.f32'} needs 147,456 bytes but its disk has no room for them")
    assert out.stdout.rstrip().endswith("free space or pass another --store-dir")

"""Large tensors collapse onto 2 MiB pages in place, contents kept."""

import ctypes
import errno
import mmap
from pathlib import Path

import pytest
import torch

from dlrm_scale.kernels.huge_pages import HUGE_PAGE_BYTES, MADV_COLLAPSE, _libc, back_with_huge_pages, collapse

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_bytes_in(start: int, end: int) -> int:
    """AnonHugePages of the mappings inside [start, end) (/proc/self/smaps). The range may span
    several: madvise splits a mapping at the range's ends, and memory from malloc's heap can lie in
    a mapping an earlier madvise split elsewhere. A mapping reaching past the range counts for at
    most its overlap."""
    huge, overlap = 0, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            overlap = max(0, min(hi, end) - max(lo, start))
        elif overlap and head == "AnonHugePages:":
            huge += min(int(line.split()[1]) * 1024, overlap)
    return huge


def kernel_refuses_collapse() -> str | None:
    """madvise's error for MADV_COLLAPSE on a fresh anonymous mapping, aligned as it wants: not our
    address arithmetic but the kernel (older than 6.1) or the process (THP disabled for it) saying no."""
    mapping = mmap.mmap(-1, 2 * HUGE_PAGE_BYTES, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    mapping.write(b"\1" * len(mapping))  # faulted in: a range with no page table yet is EINVAL too
    window = (ctypes.c_char * len(mapping)).from_buffer(mapping)
    try:
        first = -(-ctypes.addressof(window) // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
        ok = _libc.madvise(ctypes.c_void_p(first), ctypes.c_size_t(HUGE_PAGE_BYTES), MADV_COLLAPSE) == 0
        return None if ok else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
    finally:
        del window
        mapping.close()


def collapse_or_skip(t: torch.Tensor) -> int:
    moved = collapse(t)
    refused = errno.errorcode.get(ctypes.get_errno(), ctypes.get_errno())  # madvise's error, where it failed
    if moved == 0 and refused in ("EAGAIN", "ENOMEM"):  # madvise(2): no huge page free now
        pytest.skip(f"the kernel has no free 2 MiB page now ({refused}): memory is fragmented")
    if moved == 0 and refused == "EINVAL" and kernel_refuses_collapse() == "EINVAL":
        pytest.skip("MADV_COLLAPSE is refused on any mapping here (EINVAL): Linux older than 6.1, or THP disabled for this process")
    assert moved >= 20 << 20 and moved % HUGE_PAGE_BYTES == 0, f"collapsed {moved} bytes (madvise: {refused})"  # all but the unaligned ends
    return moved


@pytest.mark.skipif(not THP.exists() or "[never]" in THP.read_text(), reason="transparent huge pages are off here")
def test_collapse_backs_the_tensor_with_huge_pages_and_keeps_it():
    t = torch.randn((24 << 20) // 4)  # 24 MiB, 4-byte floats
    before = t.clone()
    moved = collapse_or_skip(t)
    assert huge_bytes_in(t.data_ptr(), t.data_ptr() + t.numel() * t.element_size()) >= moved
    assert torch.equal(t, before)


def test_only_large_cpu_tensors_are_considered():
    module = torch.nn.Module()
    module.big = torch.nn.Parameter(torch.zeros((8 << 20) // 4))
    module.small = torch.nn.Parameter(torch.zeros(1000))
    module.register_buffer("state", torch.zeros((6 << 20) // 4))
    module.register_buffer("alias", module.state)  # the same memory counts once
    _, large = back_with_huge_pages(module)
    assert large == (8 << 20) + (6 << 20)

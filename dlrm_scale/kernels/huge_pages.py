"""Back the large CPU tensors of a model with 2 MiB pages (Linux transparent huge pages).

A step reads tens of thousands of distinct rows scattered over tables of hundreds of MB.
With 4 KiB pages nearly every one is a TLB miss, and a page walk under a hypervisor costs
more than the row itself: on the benchmark machine the prefetch of a cold row was where our
row-wise Adagrad kernel spent half its time. In 2 MiB pages a 512 MB table needs 256 TLB
entries instead of 131,072. The pages are collapsed in place (MADV_COLLAPSE, Linux >= 6.1),
so no tensor moves; where the kernel refuses, memory stays as it was.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Iterable

import torch

HUGE_PAGE_BYTES = 2 << 20
MIN_TENSOR_BYTES = 4 << 20  # smaller tensors stay in cache or a few TLB entries anyway
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25

_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)


def collapse(tensor: torch.Tensor) -> int:
    """Back the 2 MiB-aligned interior of `tensor`'s memory with huge pages; bytes now on them
    (0 when the kernel refuses: an old kernel, THP set to never, no free huge pages)."""
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last <= first:
        return 0
    address, length = ctypes.c_void_p(first), ctypes.c_size_t(last - first)
    # MADV_HUGEPAGE keeps the range huge when THP is in 'madvise' mode; COLLAPSE makes it so now
    if _libc.madvise(address, length, MADV_HUGEPAGE) != 0 or _libc.madvise(address, length, MADV_COLLAPSE) != 0:
        return 0
    return last - first


def large_cpu_tensors(module: torch.nn.Module) -> Iterable[torch.Tensor]:
    seen = set()
    for t in (*module.parameters(), *module.buffers()):
        if t.device.type == "cpu" and t.numel() * t.element_size() >= MIN_TENSOR_BYTES and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            yield t


def back_with_huge_pages(module: torch.nn.Module) -> tuple[int, int]:
    """Collapse every large CPU parameter and buffer of `module` (embedding tables and their
    optimizer state); (bytes on huge pages, bytes of large tensors)."""
    on_huge, total = 0, 0
    for t in large_cpu_tensors(module):
        total += t.numel() * t.element_size()
        on_huge += collapse(t)
    return on_huge, total

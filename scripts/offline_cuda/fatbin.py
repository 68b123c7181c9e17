"""Keep one GPU generation's machine code in FBGEMM's shared libraries, for carrying.

FBGEMM's CUDA wheel holds every kernel compiled for several architectures (1.6.0: sm_80, sm_90a,
sm_100a; 2.5 GB unpacked, 465 MB zipped). A GPU loads only its own generation's cubin, so zeroing
the other entries' bytes (their headers kept: the fat binaries still parse, and the runtime
never selects them) lets the libraries compress to 62 MiB, small enough to carry to a machine
with no package index (scripts/offline_cuda/pack.sh). Seen working on an H200 with sm 90.

    python scripts/offline_cuda/fatbin.py --keep-sm 90 DIR   # every .so under DIR, in place
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections import Counter
from pathlib import Path

FATBIN_MAGIC = 0xBA55ED50
ELF_KIND, PTX_KIND = 2, 1


def section(elf: bytes, name: str) -> tuple[int, int] | None:
    """(offset, size) of an ELF64 section."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    entsize, count, names_index = struct.unpack_from("<HHH", elf, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * entsize) for i in range(count)]
    names_at = headers[names_index][4]
    for h in headers:
        start = names_at + h[0]
        if elf[start:elf.index(b"\0", start)].decode() == name:
            return h[4], h[5]
    return None


def entries(elf: bytes, offset: int, size: int):
    """(payload offset, payload bytes, kind, sm) of each entry of each fat binary in a section."""
    p, end = offset, offset + size
    while p + 16 <= end:
        magic, _, header_bytes, fat_bytes = struct.unpack_from("<IHHQ", elf, p)
        if magic != FATBIN_MAGIC:  # alignment padding between fat binaries
            p += 8
            continue
        q, stop = p + header_bytes, p + header_bytes + fat_bytes
        while q < stop:
            kind, _, entry_header_bytes, payload_bytes = struct.unpack_from("<HHIQ", elf, q)
            sm, = struct.unpack_from("<I", elf, q + 28)
            yield q + entry_header_bytes, payload_bytes, kind, sm
            q += entry_header_bytes + payload_bytes
        p = stop


def keep_sm(path: Path, sm: int | None) -> Counter:
    """Zero every entry of `path`'s fat binaries but `sm`'s cubins (None: only count); the bytes
    each (kind, sm) held."""
    elf = bytearray(path.read_bytes())
    where = section(elf, ".nv_fatbin")
    held: Counter = Counter()
    if where is None:
        return held
    for start, size, kind, entry_sm in entries(elf, *where):
        held[("elf" if kind == ELF_KIND else "ptx", entry_sm)] += size
        if sm is not None and not (kind == ELF_KIND and entry_sm == sm):
            elf[start:start + size] = bytes(size)
    if sm is not None:
        path.write_bytes(elf)
    return held


def fail(why: str) -> None:
    print(f"error: {why}", file=sys.stderr)
    sys.exit(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep-sm", type=int, required=True, help="the GPU's architecture, e.g. 90 for H100/H200")
    parser.add_argument("directory", type=Path)
    args = parser.parse_args()
    if not args.directory.is_dir():
        fail(f"{args.directory} is not a folder: give the unpacked wheel's folder")
    libraries = sorted(args.directory.rglob("*.so"))
    total: Counter = Counter()
    for path in libraries:  # look before zeroing: a missing architecture leaves the files as they were
        total.update(keep_sm(path, None))
    kept = total[("elf", args.keep_sm)]
    if not kept:
        fail(f"no sm_{args.keep_sm} cubins under {args.directory}: pick one of "
             f"{sorted({sm for kind, sm in total if kind == 'elf'})}")
    for path in libraries:
        keep_sm(path, args.keep_sm)
    print(f"kept {kept / 2**20:.0f} MiB of sm_{args.keep_sm} cubins; zeroed {(sum(total.values()) - kept) / 2**20:.0f} MiB")


if __name__ == "__main__":
    main()

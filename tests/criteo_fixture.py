"""Writes small files in the raw Criteo TSV format, with chosen malformed lines."""

from __future__ import annotations

import random
from pathlib import Path

BAD_LINES = [
    "1\t2\t3\n",  # too few fields
    "x" + "\t1" * 13 + "\tab" * 26 + "\n",  # label not a number
    "2" + "\t1" * 13 + "\tab" * 26 + "\n",  # label not 0/1
    "0" + "\t1" * 12 + "\tq" + "\tab" * 26 + "\n",  # dense not an integer
    "0" + "\t1" * 13 + "\tzz" * 26 + "\n",  # categorical not hex
]


def good_line(rng: random.Random) -> str:
    label = rng.randint(0, 1)
    dense = [str(rng.randint(-2, 500)) if rng.random() > 0.1 else "" for _ in range(13)]
    cats = [f"{rng.getrandbits(32):08x}" if rng.random() > 0.05 else "" for _ in range(26)]
    return "\t".join([str(label), *dense, *cats]) + "\n"


def write_criteo_tsv(path: Path, num_lines: int, bad_at: dict[int, str] | None = None, seed: int = 0) -> Path:
    rng = random.Random(seed)
    bad_at = bad_at or {}
    with open(path, "w") as f:
        for i in range(1, num_lines + 1):
            f.write(bad_at.get(i) or good_line(rng))
    return path

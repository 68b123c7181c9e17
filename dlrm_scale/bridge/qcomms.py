"""Quantized-communication codecs for the embedding collectives (TorchRec QComms + FBGEMM).

FBGEMM's int8 codec quantizes its buffer in rows of 32 values, each carrying an fp32 scale and
bias: 40 bytes per 128 of fp32, 0.3125x. Its rows can be as wide as the embeddings: with rows
of a whole embedding (every shard's width a multiple of it) the overhead halves at dim 64
(0.28x), as the planner's cost model assumes (8 bytes per embedding row).
"""

from __future__ import annotations

import math
from typing import Iterable

from fbgemm_gpu.quantize_comm import QuantizationContext
from fbgemm_gpu.split_embedding_configs import SparseType
from torchrec.distributed.fbgemm_qcomm_codec import (
    CommType, FbgemmQuantizedCommCodec, QCommsConfig, get_qcomm_codecs_registry,
)

COMM_TYPES = {"fp32": CommType.FP32, "fp16": CommType.FP16, "bf16": CommType.BF16, "fp8": CommType.FP8, "int8": CommType.INT8}
INT8_DEFAULT_ROW = 32  # FBGEMM's
INT8_MAX_ROW = 128  # wider rows would share one scale across too many values


class WideRowInt8Codec(FbgemmQuantizedCommCodec):
    """FBGEMM's int8 codec with rows of `row_dim` values instead of its fixed 32."""

    def create_context(self) -> QuantizationContext:
        return QuantizationContext(row_dim=self._row_dim)


def int8_row_dim(shard_widths: Iterable[int]) -> int:
    """The widest quantization row that divides every embedding shard's width (so each
    collective's buffer is whole rows, and a row never mixes two embeddings), at most
    INT8_MAX_ROW; FBGEMM's 32 when the shards are narrower than that."""
    row = 0
    for width in shard_widths:
        row = math.gcd(row, width)
    row = math.gcd(row, INT8_MAX_ROW)
    return row if row > INT8_DEFAULT_ROW else INT8_DEFAULT_ROW


def qcomm_codecs_registry(fwd: str, bwd: str, shard_widths: Iterable[int]):
    """TorchRec's codec registry for these precisions (None for fp32), int8 rows widened."""
    registry = get_qcomm_codecs_registry(QCommsConfig(forward_precision=COMM_TYPES[fwd], backward_precision=COMM_TYPES[bwd]))
    if registry is None or "int8" not in (fwd, bwd):
        return registry
    row = int8_row_dim(shard_widths)
    for codecs in registry.values():
        if fwd == "int8":
            codecs.forward = WideRowInt8Codec(SparseType.INT8, row_dim=row, is_fwd=True)
        if bwd == "int8":
            codecs.backward = WideRowInt8Codec(SparseType.INT8, row_dim=row, is_fwd=False)
    return registry

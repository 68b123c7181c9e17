"""Quantized-comm codecs: int8 rows as wide as the embeddings allow."""

import torch
from fbgemm_gpu.split_embedding_configs import SparseType

from dlrm_scale.bridge.qcomms import WideRowInt8Codec, int8_row_dim, qcomm_codecs_registry


def test_int8_rows_are_as_wide_as_every_shard_allows():
    assert int8_row_dim([64, 64, 128]) == 64
    assert int8_row_dim([256, 128]) == 128  # capped
    assert int8_row_dim([16, 64]) == 32  # narrower shards keep FBGEMM's rows (buffers of whole samples still split into 32s)
    assert int8_row_dim([96, 64]) == 32


def test_wide_int8_rows_cut_the_bytes_and_round_trip():
    codec = WideRowInt8Codec(SparseType.INT8, row_dim=64, is_fwd=True)
    x = torch.randn(8 * 64)
    ctx = codec.create_context()
    q = codec.encode(x, ctx)
    assert q.numel() * q.element_size() == codec.calc_quantized_size(x.numel(), ctx) == 8 * (64 + 8)  # 0.28x of fp32
    assert torch.allclose(codec.decode(q, ctx), x, atol=0.05)


def test_registry_swaps_in_the_wide_codec_for_int8_only():
    registry = qcomm_codecs_registry("int8", "fp16", [64, 64])
    codecs = next(iter(registry.values()))
    assert isinstance(codecs.forward, WideRowInt8Codec) and not isinstance(codecs.backward, WideRowInt8Codec)
    assert qcomm_codecs_registry("fp32", "fp32", [64]) is None

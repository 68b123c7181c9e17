"""Measures the bytes this rank sends in TorchRec's collectives, by dtype of payload.

TorchRec's comm ops call torch.distributed's collectives by module attribute, so wrapping
those attributes sees every embedding all-to-all, reduce-scatter and all-gather (DDP's
gradient all-reduce runs in C++ and is not seen, which is what we want). Floating and
8-bit payloads are embeddings or their gradients; int32/int64 payloads are ids and lengths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.distributed as dist

ID_DTYPES = (torch.int32, torch.int64)
WRAPPED = ("all_to_all_single", "reduce_scatter", "reduce_scatter_tensor", "all_gather", "all_gather_into_tensor")


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@dataclass
class CommMeter:
    embedding_bytes: int = 0
    id_bytes: int = 0

    def _count(self, tensor: torch.Tensor, sent: float) -> None:
        if tensor.dtype in ID_DTYPES:
            self.id_bytes += int(sent)
        else:
            self.embedding_bytes += int(sent)

    def reset(self) -> tuple[int, int]:
        out = (self.embedding_bytes, self.id_bytes)
        self.embedding_bytes = self.id_bytes = 0
        return out

    def _sent(self, name: str, args, kwargs) -> None:
        group = kwargs.get("group")
        world = dist.get_world_size(group)
        rank = dist.get_rank(group)
        if name == "all_to_all_single":
            inp = args[1] if len(args) > 1 else kwargs["input"]
            splits = args[3] if len(args) > 3 else kwargs.get("input_split_sizes")
            total = _nbytes(inp)
            if splits:
                row_bytes = total / max(1, inp.shape[0])
                own = splits[rank] * row_bytes
            else:
                own = total / world
            self._count(inp, total - own)
        elif name == "reduce_scatter":
            inputs = args[1] if len(args) > 1 else kwargs["input_list"]
            self._count(inputs[0], sum(_nbytes(t) for i, t in enumerate(inputs) if i != rank))
        elif name == "reduce_scatter_tensor":
            inp = args[1] if len(args) > 1 else kwargs["input"]
            self._count(inp, _nbytes(inp) * (world - 1) / world)
        else:  # all_gather, all_gather_into_tensor: our tensor goes to every other rank
            inp = args[1] if len(args) > 1 else kwargs.get("tensor", kwargs.get("input_tensor"))
            self._count(inp, _nbytes(inp) * (world - 1))

    @contextlib.contextmanager
    def paused(self):
        """Collectives inside (evaluation, say) are not counted."""
        saved = (self.embedding_bytes, self.id_bytes)
        try:
            yield self
        finally:
            self.embedding_bytes, self.id_bytes = saved

    @contextlib.contextmanager
    def attached(self):
        originals = {name: getattr(dist, name) for name in WRAPPED}

        def wrap(name, fn):
            def counted(*args, **kwargs):
                self._sent(name, args, kwargs)
                return fn(*args, **kwargs)

            return counted

        for name, fn in originals.items():
            setattr(dist, name, wrap(name, fn))
        try:
            yield self
        finally:
            for name, fn in originals.items():
                setattr(dist, name, fn)

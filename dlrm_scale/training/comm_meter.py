"""Measures the bytes this rank sends in TorchRec's collectives, by dtype of payload, and how
many of them go to other nodes.

TorchRec's comm ops call torch.distributed's collectives by module attribute, so wrapping
those attributes sees every embedding all-to-all, reduce-scatter and all-gather (DDP's
gradient all-reduce runs in C++ and is not seen, which is what we want). Floating and
8-bit payloads are embeddings or their gradients; int32/int64 payloads are ids and lengths.
A collective's bytes are counted per destination (a ring's relaying is the link's business,
not the payload's): ranks are numbered node by node, as torchrun numbers them.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist

ID_DTYPES = (torch.int32, torch.int64)
# each wrapped collective, and where its process group comes when it is given by position
GROUP_ARG = {"all_to_all_single": 4, "reduce_scatter": 3, "reduce_scatter_tensor": 3, "all_gather": 2, "all_gather_into_tensor": 2}


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _arg(args, kwargs, index: int, *names: str):
    if len(args) > index:
        return args[index]
    return next((kwargs[n] for n in names if kwargs.get(n) is not None), None)


def destinations(name: str, args, kwargs, size: int) -> tuple[torch.Tensor, list[float]]:
    """The payload of a collective call and the bytes it sends to each rank of its group (its
    own rank's entry included; the caller drops it)."""
    if name == "all_to_all_single":
        inp = _arg(args, kwargs, 1, "input")
        splits = _arg(args, kwargs, 3, "input_split_sizes")
        if splits:
            row_bytes = _nbytes(inp) / max(1, inp.shape[0])
            return inp, [n * row_bytes for n in splits]
        return inp, [_nbytes(inp) / size] * size
    if name == "reduce_scatter":
        inputs = _arg(args, kwargs, 1, "input_list")
        return inputs[0], [_nbytes(t) for t in inputs]
    if name == "reduce_scatter_tensor":
        inp = _arg(args, kwargs, 1, "input")
        return inp, [_nbytes(inp) / size] * size
    # all_gather, all_gather_into_tensor: our tensor goes to every other rank
    inp = _arg(args, kwargs, 1, "tensor", "input_tensor")
    return inp, [_nbytes(inp)] * size


class CommMeter:
    """Bytes sent since the last reset: embeddings and their gradients, the part of them sent to
    other nodes (`ranks_per_node` ranks a node), and ids."""

    def __init__(self, ranks_per_node: int) -> None:
        self.ranks_per_node = ranks_per_node
        self.embedding_bytes = self.across_node_bytes = self.id_bytes = 0
        self._groups: dict[int, list[int]] = {}

    def reset(self) -> tuple[int, int, int]:
        """(embedding bytes, of them to other nodes, id bytes) since the last reset."""
        out = (self.embedding_bytes, self.across_node_bytes, self.id_bytes)
        self.embedding_bytes = self.across_node_bytes = self.id_bytes = 0
        return out

    def _members(self, group) -> list[int]:
        """The global ranks of a process group, in its own order."""
        key = id(group)
        if key not in self._groups:
            self._groups[key] = list(range(dist.get_world_size())) if group is None else dist.get_process_group_ranks(group)
        return self._groups[key]

    def _sent(self, name: str, args, kwargs) -> None:
        members = self._members(_arg(args, kwargs, GROUP_ARG[name], "group"))
        me = dist.get_rank()
        tensor, per_rank = destinations(name, args, kwargs, len(members))
        sent = [(rank, int(n)) for rank, n in zip(members, per_rank) if rank != me]
        if tensor.dtype in ID_DTYPES:
            self.id_bytes += sum(n for _, n in sent)
            return
        self.embedding_bytes += sum(n for _, n in sent)
        self.across_node_bytes += sum(n for rank, n in sent if rank // self.ranks_per_node != me // self.ranks_per_node)

    @contextlib.contextmanager
    def paused(self):
        """Collectives inside (evaluation, say) are not counted."""
        saved = (self.embedding_bytes, self.across_node_bytes, self.id_bytes)
        try:
            yield self
        finally:
            self.embedding_bytes, self.across_node_bytes, self.id_bytes = saved

    @contextlib.contextmanager
    def attached(self):
        originals = {name: getattr(dist, name) for name in GROUP_ARG}

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

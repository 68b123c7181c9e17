"""Text between the ranks of a group, as bytes: a plan, a decision or a measurement travels as
JSON, so nothing a rank receives is unpickled."""

from __future__ import annotations

import torch
import torch.distributed as dist


def _group_and_device(pg: dist.ProcessGroup | None) -> tuple[dist.ProcessGroup, torch.device]:
    pg = pg if pg is not None else dist.GroupMember.WORLD
    return pg, torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else torch.device("cpu")


def broadcast_text(pg: dist.ProcessGroup | None, text: str | None) -> str:
    """Rank 0's `text` on every rank of `pg` (None: the default group), sent as bytes (its length first)."""
    pg, device = _group_and_device(pg)
    data = (text or "").encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, group=pg, group_src=0)
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if pg.rank() == 0
              else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    dist.broadcast(buffer, group=pg, group_src=0)
    return bytes(buffer.cpu().numpy()).decode()


def gather_text(pg: dist.ProcessGroup | None, text: str) -> list[str]:
    """Every rank's `text`, in rank order, on every rank of `pg` (None: the default group)."""
    pg, device = _group_and_device(pg)
    data = text.encode()
    sizes = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(pg.size())]
    dist.all_gather(sizes, torch.tensor([len(data)], dtype=torch.int64, device=device), group=pg)
    longest = max(int(size.item()) for size in sizes)
    mine = torch.zeros(longest, dtype=torch.uint8)
    mine[:len(data)] = torch.tensor(list(data), dtype=torch.uint8)
    buffers = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(pg.size())]
    dist.all_gather(buffers, mine.to(device), group=pg)
    return [bytes(b[:int(n.item())].cpu().numpy()).decode() for b, n in zip(buffers, sizes)]

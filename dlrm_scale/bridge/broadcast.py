"""Text from rank 0 to every rank of a group, as bytes: a plan or a decision travels as JSON,
so nothing a rank receives is unpickled."""

from __future__ import annotations

import torch
import torch.distributed as dist


def broadcast_text(pg: dist.ProcessGroup | None, text: str | None) -> str:
    """Rank 0's `text` on every rank of `pg` (None: the default group), sent as bytes (its length first)."""
    pg = pg if pg is not None else dist.GroupMember.WORLD
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(pg) == "nccl" else torch.device("cpu")
    data = (text or "").encode()
    size = torch.tensor([len(data)], dtype=torch.int64, device=device)
    dist.broadcast(size, group=pg, group_src=0)
    buffer = (torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if pg.rank() == 0
              else torch.empty(int(size.item()), dtype=torch.uint8, device=device))
    dist.broadcast(buffer, group=pg, group_src=0)
    return bytes(buffer.cpu().numpy()).decode()

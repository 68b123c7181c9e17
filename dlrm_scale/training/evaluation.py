"""Evaluation: AUC and log loss of the held-out batches, over every rank's samples."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torchmetrics.functional.classification import binary_auroc

from dlrm_scale.training.host_group import host_group


@torch.no_grad()
def evaluate(model: torch.nn.Module, eval_data, num_batches: int, device: torch.device, world: int) -> dict[str, float]:
    """The model's AUC and log loss on the first `num_batches` held-out batches of every rank."""
    model.eval()
    logits, labels = [], []
    for batch in eval_data.batches(0, num_batches):
        _, (_, lg, lb) = model(batch.to(device))
        logits.append(lg.float().cpu())
        labels.append(lb.float().cpu())
    local = torch.stack([torch.cat(logits), torch.cat(labels)])
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=host_group())
    all_ = torch.cat(gathered, dim=1)
    probs = torch.sigmoid(all_[0])
    auc = float(binary_auroc(probs, all_[1].long()))
    logloss = float(torch.nn.functional.binary_cross_entropy(probs.clamp(1e-7, 1 - 1e-7), all_[1]))
    return {"auc": auc, "logloss": logloss}

"""One optimizer semantics for every embedding table, whatever its scheme.

Sharded tables are updated inside the backward by FBGEMM's fused kernels. A data-parallel
table is a replicated dense parameter whose gradient DDP all-reduces; TorchRec hands it to the
dense optimizer, so under TorchRec the scheme a plan picks decides which optimizer trains a
table. Here it gets FBGEMM's update on its all-reduced gradient instead (ReplicatedTables),
with the same learning rate and eps, and keeps its state under the fused kernels' names, so
a checkpoint moves a table between data-parallel and sharded layouts with its state.

Gradients are the same either way: TorchRec divides the sharded tables' gradients by the
world size in the backward all-to-all and DDP averages the replicas', so every table gets
the gradient of the global batch's mean loss.

One deviation remains, documented in the README: under column-wise schemes FBGEMM keeps the
row-wise Adagrad state per column shard (the mean squared gradient over that shard's columns),
not over the whole row.
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
from torchrec.optim.keyed import KeyedOptimizer
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

EPS = 1e-8  # FBGEMM's default, passed explicitly to both kinds of update so they cannot drift apart
# The optimizer TorchRec fuses into the sharded tables' backward, by our config's name.
FUSED = {"rowwise_adagrad": RowWiseAdagrad, "adagrad": torch.optim.Adagrad, "sgd": torch.optim.SGD}


def fused_optimizer(name: str, lr: float) -> tuple[type, dict[str, Any]]:
    """The class and arguments for torchrec's apply_optimizer_in_backward."""
    return FUSED[name], ({"lr": lr} if name == "sgd" else {"lr": lr, "eps": EPS})


STATE_SUFFIX = ".momentum1"


def state_key(table: str) -> str:
    """FBGEMM's name for a table's optimizer state (the fused optimizer's state_dict)."""
    return f"{table}{STATE_SUFFIX}"


class ReplicatedTables(KeyedOptimizer):
    """FBGEMM's update, applied after the backward to data-parallel tables' dense gradients:
    row-wise Adagrad (one squared-gradient mean per row), Adagrad, or SGD. Rows the batch did
    not touch have a zero gradient, so their weights and state stay as they are."""

    def __init__(self, tables: Mapping[str, tuple[str, torch.nn.Parameter]], kind: str, lr: float) -> None:
        """`tables`: parameter key -> (table name, replicated weight)."""
        if kind not in FUSED:
            raise ValueError(f"no update for embedding optimizer {kind!r}")
        self.kind = kind
        params = {key: weight for key, (_, weight) in tables.items()}
        state: dict[Any, Any] = {}
        for table, weight in tables.values():
            if kind == "rowwise_adagrad":
                state[weight] = {state_key(table): torch.zeros(weight.shape[0], dtype=weight.dtype)}
            elif kind == "adagrad":
                state[weight] = {state_key(table): torch.zeros_like(weight)}
            else:
                state[weight] = {}
        super().__init__(params, state, [{"params": list(params.values()), "lr": lr, "eps": EPS}])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for weight in self.params.values():
            weight.grad = None

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        for group in self.param_groups:
            lr, eps = group["lr"], group["eps"]
            for weight in group["params"]:
                grad = weight.grad
                if grad is None:
                    continue
                fused_update(self.kind, weight, next(iter(self.state[weight].values()), None), grad, lr, eps)


def _step_size(kind: str, momentum: torch.Tensor, lr: float, eps: float) -> torch.Tensor:
    """What a gradient is multiplied by in an update, given the state after it."""
    size = lr / (momentum.sqrt() + eps)
    return size.unsqueeze(1) if kind == "rowwise_adagrad" else size


def fused_update(kind: str, weight: torch.Tensor, momentum: torch.Tensor | None, grad: torch.Tensor, lr: float,
                 eps: float = EPS) -> None:
    """FBGEMM's update of `weight` and its state (None for SGD) by `grad`, in place."""
    if kind == "sgd":
        weight.sub_(grad, alpha=lr)
        return
    momentum += grad.square().mean(dim=1) if kind == "rowwise_adagrad" else grad.square()
    weight.sub_(grad * _step_size(kind, momentum, lr, eps))


def gradient_of_update(kind: str, update: torch.Tensor, momentum: torch.Tensor | None, lr: float,
                       eps: float = EPS) -> torch.Tensor:
    """The gradient one `fused_update` applied, from the weights' change (`update`, turned into
    the gradient in place) and the state after it."""
    return update.div_(-lr) if kind == "sgd" else update.div_(-_step_size(kind, momentum, lr, eps))

"""The embedding tables of a user's module, found as TorchRec's enumerator finds them: every
`EmbeddingBagCollection` and `EmbeddingCollection` a sharder is given for, wherever it is
nested, with what that sharder can run on the device.

What cannot be planned is refused here, in one line naming the module or table, before any
planning: no tables at all, a collection no sharder is given for (TorchRec would leave it
unsharded, replicated by DDP), a kind of collection we do not plan, a table in two collections,
a table not in fp32, or a table none of whose sharder's schemes we can plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from torch import nn
from torchrec.distributed.planner.utils import sharder_name
from torchrec.distributed.types import ModuleSharder
from torchrec.modules.embedding_configs import BaseEmbeddingConfig, DataType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

from planner.spec.errors import ConfigError
from planner.spec.schemes import KERNELS
from planner.spec.types import ShardingType

PLANNED = (EmbeddingBagCollection, EmbeddingCollection)
OUR_SCHEMES = tuple(s.value for s in ShardingType)

# Embedding optimizers as TorchRec spells them (fused_params' EmbOptimType, or the class given to
# apply_optimizer_in_backward), and ours.
OPTIMIZERS = {
    "EXACT_ROWWISE_ADAGRAD": "rowwise_adagrad", "ROWWISE_ADAGRAD": "rowwise_adagrad", "RowWiseAdagrad": "rowwise_adagrad",
    "EXACT_ADAGRAD": "adagrad", "ADAGRAD": "adagrad", "Adagrad": "adagrad",
    "EXACT_SGD": "sgd", "SGD": "sgd",
    "ADAM": "adam", "Adam": "adam",
}


@dataclass(frozen=True)
class ModuleTable:
    """One table of the module: where its collection is and what may shard it."""

    path: str  # its collection's module path, as TorchRec's ShardingPlan keys it ("" for the root)
    config: BaseEmbeddingConfig
    pooled: bool
    weighted: bool
    sharder: ModuleSharder
    runnable: dict[str, tuple[str, ...]]  # sharding type -> compute kernels the sharder runs on the device
    collection: nn.Module = field(compare=False, repr=False)

    @property
    def name(self) -> str:
        return self.config.name


def _collections(module: nn.Module, sharders: list[ModuleSharder]) -> list[tuple[str, nn.Module, ModuleSharder]]:
    """(path, collection, sharder) in the order of the module's children, not looking inside a
    collection a sharder takes."""
    by_type = {sharder_name(s.module_type): s for s in sharders}
    found, queue = [], [("", module)]
    while queue:
        path, child = queue.pop(0)
        sharder = by_type.get(sharder_name(type(child)))
        where = f"module '{path or type(module).__name__}'"
        if sharder is None:
            if isinstance(child, PLANNED):
                raise ConfigError(f"{where} is an {type(child).__name__} but no sharder given shards it: add "
                                  f"{type(child).__name__}Sharder() to the sharders, or it trains unsharded")
            queue.extend((f"{path}.{n}" if path else n, m) for n, m in child.named_children())
            continue
        if type(child) not in PLANNED:
            raise ConfigError(f"{where} is a {type(child).__name__}: dlrm-scale plans EmbeddingBagCollection and "
                              f"EmbeddingCollection tables; leave its sharder out, or plan it with TorchRec's planner")
        found.append((path, child, sharder))
    return found


def runnable_pairs(sharder: ModuleSharder, device: str) -> dict[str, tuple[str, ...]]:
    """The sharding types we plan that `sharder` offers on `device`, each with the kernels we plan
    that it runs them with."""
    return {st: tuple(k for k in sharder.compute_kernels(st, device) if k in KERNELS)
            for st in sharder.sharding_types(device) if st in OUR_SCHEMES}


def module_tables(module: nn.Module, sharders: list[ModuleSharder], device: str) -> list[ModuleTable]:
    tables: dict[str, ModuleTable] = {}
    for path, collection, sharder in _collections(module, sharders):
        pooled = isinstance(collection, EmbeddingBagCollection)
        configs = collection.embedding_bag_configs() if pooled else collection.embedding_configs()
        runnable = runnable_pairs(sharder, device)
        for config in configs:
            where = f"table '{config.name}' of module '{path or type(module).__name__}'"
            if config.name in tables:
                raise ConfigError(f"{where}: a table of that name is in module '{tables[config.name].path or type(module).__name__}' too; "
                                  f"TorchRec's plan names tables alone: rename one")
            if config.data_type != DataType.FP32:
                raise ConfigError(f"{where} holds {config.data_type.name} weights; dlrm-scale plans fp32 tables: make it "
                                  f"DataType.FP32, or plan it with TorchRec's planner")
            if not any(runnable.values()):
                offered = ", ".join(sharder.sharding_types(device)) or "nothing"
                raise ConfigError(f"{where}: its sharder {type(sharder).__name__} offers {offered} on {device}, none of "
                                  f"which dlrm-scale plans with {'/'.join(KERNELS)}; give a sharder that runs table_wise")
            weighted = bool(getattr(collection, "is_weighted", lambda: False)())
            tables[config.name] = ModuleTable(path, config, pooled, weighted, sharder, runnable, collection)
    if not tables:
        kinds = sorted({sharder_name(s.module_type).rsplit(".", 1)[-1] for s in sharders}) or ["none"]
        raise ConfigError(f"module {type(module).__name__} has no embedding table for the sharders given (they shard "
                          f"{', '.join(kinds)}); give the model with its EmbeddingBagCollection or EmbeddingCollection")
    return list(tables.values())


def embedding_optimizer(tables: list[ModuleTable]) -> str | None:
    """The optimizer the tables train with, as TorchRec is told it: the class given to
    apply_optimizer_in_backward, else the sharders' fused_params; None where neither says."""
    found: dict[str, str] = {}
    for t in tables:
        weight = (t.collection.embedding_bags if t.pooled else t.collection.embeddings)[t.name].weight
        classes = getattr(weight, "_optimizer_classes", None)
        fused = (getattr(t.sharder, "fused_params", None) or {}).get("optimizer")
        spelt = classes[0].__name__ if classes else getattr(fused, "name", None)
        if spelt is None:
            continue
        if spelt not in OPTIMIZERS:
            raise ConfigError(f"table '{t.name}' trains with {spelt}; dlrm-scale prices {', '.join(sorted(set(OPTIMIZERS.values())))}: "
                              f"pass embedding_optimizer= the nearest one")
        found[t.name] = OPTIMIZERS[spelt]
    conflict = first_conflict(found)
    if conflict:
        (a, oa), (b, ob) = conflict
        raise ConfigError(f"table '{a}' trains with {oa} but '{b}' with {ob}; dlrm-scale prices one embedding optimizer: "
                          f"pass embedding_optimizer=")
    return next(iter(found.values()), None)


def first_conflict(values: dict) -> tuple[tuple[str, Any], tuple[str, Any]] | None:
    """The first entry and the first one that differs from it, or None where all agree."""
    items = sorted(values.items())
    other = next((item for item in items if item[1] != items[0][1]), None)
    return (items[0], other) if other else None

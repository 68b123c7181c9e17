"""The layout TorchRec shards on CPU, where FBGEMM's caching kernels do not run: each cached
table reduced to its resident cache rows, computed by the fused kernel, while
dlrm_scale.tiering keeps every row in its store and maps ids onto the cache's slots."""

from __future__ import annotations

from dataclasses import replace

import torch
from torchrec.distributed.batched_embedding_kernel import BaseBatchedEmbeddingBag

from planner.spec.errors import ConfigError
from planner.plan.document import Plan, TablePlan
from planner.spec.schemes import CACHEABLE
from planner.spec.specs import TableSpec

CPU_CACHEABLE = tuple(st.value for st in CACHEABLE["cpu"])  # what the planner offers on CPU


def resident_plan(plan: Plan) -> Plan:
    """The plan TorchRec shards on CPU: every cached table reduced to its cache rows, computed
    by the fused kernel. Raises ConfigError for a cached table that cannot be cached on CPU."""
    tables = {}
    for name, t in plan.tables.items():
        if not t.cached:
            tables[name] = t
            continue
        if t.sharding_type not in CPU_CACHEABLE:
            raise ConfigError(
                f"table '{name}' is {t.sharding_type} with {t.compute_kernel}: on CPU only "
                f"{', '.join(CPU_CACHEABLE)} tables can be cached; re-plan with --device cpu"
            )
        rows = {s.cache_rows for s in t.shards}
        if len(rows) != 1:
            raise ConfigError(f"table '{name}': its shards have different cache_rows {sorted(rows)}; give them one size")
        cache = rows.pop()
        shards = tuple(replace(s, rows=cache, tier="ddr", cache_rows=0) for s in t.shards)
        tables[name] = TablePlan(t.sharding_type, "fused", cache, t.embedding_dim, shards)
    return replace(plan, tables=tables)


def resident_tables(tables: list[TableSpec] | tuple[TableSpec, ...], plan: Plan) -> list[TableSpec]:
    """The model's tables as TorchRec builds them under `resident_plan(plan)`."""
    out = []
    for t in tables:
        tp = plan.tables.get(t.name)
        out.append(replace(t, num_embeddings=tp.shards[0].cache_rows) if tp is not None and tp.cached else t)
    return out


def embedding_kernels(model: torch.nn.Module):
    """TorchRec's TBE kernels in a sharded model. Sharded collections keep their lookups in a
    plain list (`_lookups`), outside the module tree, so they are walked explicitly."""
    for module in model.modules():
        for lookup in getattr(module, "_lookups", None) or []:
            for kernel in lookup.modules():
                if isinstance(kernel, BaseBatchedEmbeddingBag):
                    yield kernel

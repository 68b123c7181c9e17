"""The planner from Python, without torch: tables and a cluster in, a plan out.

    python examples/plan_tables.py            # a few seconds; writes plan.json beside you
    dlrm-scale explain plan.json --config plan.yaml
"""

from pathlib import Path

import yaml

from planner import TableSpec, config_document, format_plan, plan_tables

tables = [
    TableSpec("user_id", 400_000_000, 128, zipf_exponent=1.05),
    TableSpec("item_id", 50_000_000, 128, pooling_factor=20.0),
    TableSpec("history", 50_000_000, 128, pooling_factor=50.0, pooled=False),  # an EmbeddingCollection's
    TableSpec("item_category", 10_000, 64, pooling_factor=20.0),
    TableSpec("user_country", 300, 64),
]
settings = dict(world_size=16, batch_size_per_rank=4096, constraints={"colocate": [["item_category", "user_country"]]})

plan = plan_tables(tables, "h100_dgx", time_limit_s=10, **settings)
print(format_plan(plan))
plan.save("plan.json")
Path("plan.yaml").write_text(yaml.safe_dump(config_document(tables, "h100_dgx", **settings), sort_keys=False))

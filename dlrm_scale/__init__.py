"""dlrm-scale's training stack. `dlrm_scale.EmbeddingShardingPlanner` is our planner behind
TorchRec's ShardingPlanner interface, `dlrm_scale.WideEmbeddingBagCollectionSharder` TorchRec's
EBC sharder with the row-wise schemes on CPU too (both imported on first use: the package itself
stays torch-free)."""

PUBLIC = {
    "EmbeddingShardingPlanner": "dlrm_scale.bridge.planner",
    "WideEmbeddingBagCollectionSharder": "dlrm_scale.bridge.sharders",
}


def __getattr__(name: str):
    if name in PUBLIC:
        import importlib

        return getattr(importlib.import_module(PUBLIC[name]), name)
    raise AttributeError(f"module 'dlrm_scale' has no attribute {name!r}")

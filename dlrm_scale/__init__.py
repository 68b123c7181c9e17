"""dlrm-scale's training stack. `dlrm_scale.EmbeddingShardingPlanner` is our planner behind
TorchRec's ShardingPlanner interface (imported on first use: the package itself stays torch-free)."""


def __getattr__(name: str):
    if name == "EmbeddingShardingPlanner":
        from dlrm_scale.bridge.planner import EmbeddingShardingPlanner

        return EmbeddingShardingPlanner
    raise AttributeError(f"module 'dlrm_scale' has no attribute {name!r}")

"""TorchRec sharders with every scheme enabled on CPU, and the sharder a run shards with.

TorchRec's EmbeddingBagCollectionSharder offers only data_parallel, table_wise, column_wise
and table_column_wise on CPU, though row_wise, table_row_wise and grid_shard run on gloo too.
"""

from __future__ import annotations

from typing import List

from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingType

from dlrm_scale.bridge.qcomms import qcomm_codecs_registry

ALL_SHARDING_TYPES = [
    ShardingType.DATA_PARALLEL.value,
    ShardingType.TABLE_WISE.value,
    ShardingType.COLUMN_WISE.value,
    ShardingType.TABLE_COLUMN_WISE.value,
    ShardingType.ROW_WISE.value,
    ShardingType.TABLE_ROW_WISE.value,
    ShardingType.GRID_SHARD.value,
]


class WideEmbeddingBagCollectionSharder(EmbeddingBagCollectionSharder):
    """EmbeddingBagCollectionSharder whose CPU sharding types include the row-wise schemes."""

    def sharding_types(self, compute_device_type: str) -> List[str]:
        if compute_device_type == "cpu":
            return list(ALL_SHARDING_TYPES)
        return super().sharding_types(compute_device_type)


def sharder_for(fwd: str, bwd: str, shard_widths: tuple[int, ...] = ()) -> WideEmbeddingBagCollectionSharder:
    """The sharder: quantized comms when asked (bridge.qcomms)."""
    return WideEmbeddingBagCollectionSharder(qcomm_codecs_registry=qcomm_codecs_registry(fwd, bwd, shard_widths))

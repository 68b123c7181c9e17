"""DLRM and DLRM-DCNv2 from TorchRec's modules, with embedding tables on the meta device."""

from __future__ import annotations

from typing import Sequence

import torch
from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from dlrm_scale.training.data import feature_name
from dlrm_scale.kernels.interaction import DotInteraction
from dlrm_scale.run_config import ModelConfig
from planner.spec.specs import TableSpec

# Where DistributedModelParallel finds the embedding collection inside DLRMTrain.
EMBEDDING_MODULE_PATH = "model.sparse_arch.embedding_bag_collection"
TABLE_KEY_PREFIX = EMBEDDING_MODULE_PATH + ".embedding_bags."  # + name + ".weight": a table in a state dict


def table_of_key(key: str) -> str | None:
    """The table a state-dict key holds the weights of, or None for any other key."""
    return key[len(TABLE_KEY_PREFIX):-len(".weight")] if key.startswith(TABLE_KEY_PREFIX) and key.endswith(".weight") else None


def _left_as_allocated(weights: torch.Tensor) -> torch.Tensor:
    return weights


def embedding_configs(tables: Sequence[TableSpec], torchrec_init: bool = True) -> list[EmbeddingBagConfig]:
    """Without `torchrec_init`, TorchRec's sharded collection leaves each shard as its kernel
    allocated it instead of drawing it again: a pass over every table's memory (1 s a GiB here)
    whose values our initial weights (dlrm_scale.training.initial_weights) or a checkpoint replace."""
    init = {} if torchrec_init else {"init_fn": _left_as_allocated}
    return [
        EmbeddingBagConfig(
            name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings, feature_names=[feature_name(t.name)], **init
        )
        for t in tables
    ]


def build_model(
    tables: Sequence[TableSpec], config: ModelConfig, device: torch.device, embedding_device: str = "meta",
    interaction: str = "torchrec",
) -> DLRMTrain:
    """DLRM's dense arch must end in the embedding dimension, which must be shared by all tables.

    Tables go on the meta device by default: DistributedModelParallel materialises only the
    shards each rank holds, and the trainer sets their weights. An unsharded reference model
    passes embedding_device="cpu" (initialised as TorchRec does).
    `interaction` picks the dot interaction's implementation (dlrm_scale.kernels.interaction): the
    same function, so the same model, either way.
    """
    dim = config.embedding_dim(tables)
    dense_arch = list(config.dense_arch)
    if dense_arch[-1] != dim:
        dense_arch.append(dim)  # the interaction needs the dense vector in embedding space
    ebc = EmbeddingBagCollection(tables=embedding_configs(tables, torchrec_init=embedding_device != "meta"),
                                 device=torch.device(embedding_device))
    if config.arch == "dlrm":
        dlrm = DLRM(ebc, config.num_dense_features, dense_arch, list(config.over_arch), dense_device=device)
        if interaction == "dlrm_scale":
            dlrm.inter_arch = DotInteraction(len(tables)).to(device)
    else:
        dlrm = DLRM_DCN(
            ebc, config.num_dense_features, dense_arch, list(config.over_arch),
            dcn_num_layers=config.dcn_num_layers, dcn_low_rank_dim=config.dcn_low_rank_dim, dense_device=device,
        )
    return DLRMTrain(dlrm)

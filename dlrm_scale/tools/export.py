"""`dlrm-scale export`: a checkpoint's model, unsharded, for evaluation or serving in one process.

The output is a plain dict that `torch.load(path, weights_only=True)` reads: the state dict of
TorchRec's unsharded `DLRMTrain` (an `EmbeddingBagCollection` and the dense modules) under
"state_dict", and the table and model configs needed to rebuild it (`load_exported`). The
checkpoint is verified against its manifest first. DCP gathers the sharded tables whole; tables
the plan cached on CPU are read from the checkpoint's row files (weights, then optimizer state,
per row).
"""

from __future__ import annotations

import re
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from dlrm_scale.training import checkpoint as ckpt
from dlrm_scale.run_config import ModelConfig
from dlrm_scale.training.model import TABLE_KEY_PREFIX, build_model
from planner.cost.cost_model import OPTIMIZER_STATE
from planner.spec.errors import ConfigError
from planner.spec.specs import TableSpec

ROW_FILE = re.compile(r"tiered\.(?P<table>.+)\.cols(?P<col>\d+)\.rank\d+\.f32")


def _weight_key(table: str) -> str:
    return f"{TABLE_KEY_PREFIX}{table}.weight"


def _cached_columns(path: Path, table: TableSpec, optimizer: str) -> tuple[int, torch.Tensor]:
    """(first column, weights) of one cached shard's row file: records of cols weights + state."""
    per_weight, per_row = OPTIMIZER_STATE[optimizer]
    record_floats = path.stat().st_size // 4 // table.num_embeddings
    cols = (record_floats - per_row) // (1 + per_weight)
    if cols <= 0 or table.num_embeddings * (cols * (1 + per_weight) + per_row) * 4 != path.stat().st_size:
        raise ConfigError(f"checkpoint row file {path.name} does not hold {table.num_embeddings} rows of table "
                          f"'{table.name}'; export with the config the checkpoint was trained with")
    records = np.fromfile(path, dtype=np.float32).reshape(table.num_embeddings, record_floats)
    return int(ROW_FILE.fullmatch(path.name)["col"]), torch.from_numpy(records[:, :cols].copy())


def export_checkpoint(path: Path, tables: list[TableSpec], model_config: ModelConfig, optimizer: str, out: Path) -> dict:
    meta = ckpt.read_meta(path)
    damage = ckpt.verify(path)
    if damage is not None:
        raise ckpt.CheckpointError(f"checkpoint {path} is damaged ({damage}); export another")
    model = build_model(tables, model_config, torch.device("cpu"), embedding_device="cpu")
    state = model.state_dict()
    by_name = {t.name: t for t in tables}
    row_files = sorted(p for p in path.iterdir() if ROW_FILE.fullmatch(p.name))
    cached = {ROW_FILE.fullmatch(p.name)["table"] for p in row_files}
    unknown = sorted(cached - set(by_name))
    if unknown:
        raise ConfigError(f"checkpoint {path} has rows of table '{unknown[0]}' that the config lacks; give its config")
    try:
        ckpt.dcp_load({"model": {k: v for k, v in state.items() if k not in {_weight_key(t) for t in cached}}}, path)
    except ckpt.LOAD_ERRORS as e:
        raise ckpt.CheckpointError(f"checkpoint {path} does not hold this model ({ckpt.first_line(e)}); "
                                   f"export with the config it was trained with") from None
    for file in row_files:
        table = by_name[ROW_FILE.fullmatch(file.name)["table"]]
        col, weights = _cached_columns(file, table, optimizer)
        state[_weight_key(table.name)][:, col:col + weights.shape[1]] = weights
    doc = {"state_dict": state, "step": int(meta["step"]), "model": asdict(model_config),
           "tables": [asdict(t) for t in tables]}
    torch.save(doc, out)
    return doc


def load_exported(path: Path) -> torch.nn.Module:
    """The exported model, rebuilt unsharded from its file (weights only)."""
    doc = torch.load(path, weights_only=True)
    model = build_model([TableSpec(**t) for t in doc["tables"]], ModelConfig(**doc["model"]), torch.device("cpu"),
                        embedding_device="cpu")
    model.load_state_dict(doc["state_dict"])
    return model.eval()

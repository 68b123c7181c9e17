"""`dlrm-scale export`: a checkpoint's model unsharded in one process predicts what the sharded
model predicted, for every scheme and for tables cached on SSD and DDR."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dlrm_scale.tools.launch import run_on_ranks

pytestmark = pytest.mark.distributed
GLOBAL_BATCH = 128


def _train_and_predict(rank, world, out_dir, which):
    import torch.distributed as dist

    from dlrm_scale.run_config import CheckpointConfig, TrainConfig
    from dlrm_scale.training.data import SyntheticData
    from tests.conftest import run_config
    from dlrm_scale.training.trainer import Trainer
    from tests import test_tiering_distributed as tiering
    from tests import test_training_distributed as schemes

    out = Path(out_dir)
    if which == "every_scheme":
        p, plan, model = schemes.problem("rowwise_adagrad"), schemes.every_scheme_plan(schemes.problem()), schemes.model_config()
    else:
        p = tiering.problem("rowwise_adagrad")
        plan, model = tiering.plan_for(p, True), tiering._model_config()
    (out / f"store{rank}").mkdir(parents=True, exist_ok=True)
    cfg = TrainConfig(steps=3, log_every=1, eval_batches=1,
                      store_dir=str(out / f"store{rank}"))
    trainer = Trainer(run_config(p, model, cfg, GLOBAL_BATCH // world, CheckpointConfig(out / "ckpt")), plan, torch.device("cpu"), rank, world, out)
    trainer.run()
    trainer.model.eval()
    batch = SyntheticData(p.tables, model.num_dense_features, GLOBAL_BATCH, 99, rank, world).batch(0)
    with torch.no_grad():
        _, (_, logits, _) = trainer.model(batch)
    gathered = [torch.empty_like(logits) for _ in range(world)]
    dist.all_gather(gathered, logits)
    return {"logits": torch.cat(gathered), "tables": list(p.tables), "model": model, "optimizer": p.training.embedding_optimizer}


@pytest.mark.parametrize("which", ["every_scheme", "cached"])
def test_the_exported_model_predicts_what_the_sharded_one_did(tmp_path, which):
    from dlrm_scale.training.data import SyntheticData
    from dlrm_scale.tools.export import export_checkpoint, load_exported

    result = run_on_ranks(_train_and_predict, 2, str(tmp_path), which)
    step = tmp_path / "ckpt" / "step_000000003"
    doc = export_checkpoint(step, result["tables"], result["model"], result["optimizer"], tmp_path / "model.pt")
    assert doc["step"] == 3
    model = load_exported(tmp_path / "model.pt")  # weights_only
    batch = SyntheticData(result["tables"], result["model"].num_dense_features, GLOBAL_BATCH, 99).batch(0)
    with torch.no_grad():
        _, (_, logits, _) = model(batch)
    torch.testing.assert_close(logits, result["logits"], rtol=1e-5, atol=1e-5)

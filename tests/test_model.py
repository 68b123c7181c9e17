import pytest
import torch

from dlrm_scale.training.data import SyntheticData
from dlrm_scale.run_config import ModelConfig
from dlrm_scale.training.model import build_model
from planner.spec.errors import ConfigError
from planner.spec.specs import TableSpec

TABLES = [TableSpec("a", 100, 8, 2.0), TableSpec("b", 50, 8)]


@pytest.mark.parametrize("arch", ["dlrm", "dcnv2"])
def test_both_architectures_train_unsharded(arch):
    torch.manual_seed(0)
    cfg = ModelConfig(arch=arch, num_dense_features=4, dense_arch=(16,), over_arch=(8, 1), dcn_num_layers=2, dcn_low_rank_dim=4)
    model = build_model(TABLES, cfg, torch.device("cpu"), embedding_device="cpu")
    data = SyntheticData(TABLES, 4, 256, seed=0, rank=0)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    losses = []
    for step in range(30):
        loss, (_, logits, labels) = model(data.batch(step % 3))
        assert logits.shape == labels.shape == (256,)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert sum(losses[-3:]) < sum(losses[:3])  # fitting three batches must lower their loss


def test_model_config_errors():
    with pytest.raises(ConfigError, match="arch"):
        ModelConfig(arch="wide_and_deep")
    with pytest.raises(ConfigError, match="end in 1"):
        ModelConfig(over_arch=(8, 2))
    with pytest.raises(ConfigError, match="one embedding_dim"):
        build_model([TableSpec("a", 10, 8), TableSpec("b", 10, 16)], ModelConfig(), torch.device("cpu"))

import pytest

from planner.spec.errors import ConfigError
from planner.spec.problem import PlanningProblem
from planner.spec.specs import TableSpec, TrainingSpec
from tests.conftest import make_cluster, table


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(num_embeddings=0), "num_embeddings"),
        (dict(num_embeddings=-5), "num_embeddings"),
        (dict(embedding_dim=18), "multiple of 4"),
        (dict(pooling_factor=0), "pooling_factor"),
        (dict(zipf_exponent=-1.0), "zipf_exponent"),
    ],
)
def test_table_rejects_bad_sizes_with_the_field_named(kwargs, fragment):
    values = dict(name="t", num_embeddings=10, embedding_dim=16, pooling_factor=1.0)
    values.update(kwargs)
    with pytest.raises(ConfigError, match=fragment):
        TableSpec(**values)


def test_dim_error_suggests_the_next_multiple_of_four():
    with pytest.raises(ConfigError, match="use 20"):
        TableSpec("t", 10, 18)


def test_cluster_validation():
    with pytest.raises(ConfigError, match="device"):
        make_cluster(device="tpu")
    with pytest.raises(ConfigError, match="hbm_bytes_per_rank"):
        make_cluster(hbm_gib=0)
    with pytest.raises(ConfigError, match="inter_node_gb_per_s"):
        make_cluster(inter_node_gb_per_s=0)


def test_cpu_cluster_computes_from_ddr_shared_by_the_node():
    c = make_cluster(device="cpu", hbm_gib=0, ranks_per_node=4)
    assert c.device_tier == "ddr"
    assert c.capacity_bytes_per_rank("hbm") == 0
    assert c.capacity_bytes_per_rank("ddr") == c.ddr_bytes_per_node // 4


def test_training_validation():
    with pytest.raises(ConfigError, match="embedding_optimizer"):
        TrainingSpec(batch_size_per_rank=8, embedding_optimizer="lamb")
    with pytest.raises(ConfigError, match="fwd_comm_precision"):
        TrainingSpec(batch_size_per_rank=8, fwd_comm_precision="fp4")
    with pytest.raises(ConfigError, match="batch_size_per_rank"):
        TrainingSpec(batch_size_per_rank=0)


def test_problem_rejects_duplicate_and_missing_tables():
    with pytest.raises(ConfigError, match="twice"):
        PlanningProblem((table("a"), table("a")), make_cluster(), TrainingSpec(8))
    with pytest.raises(ConfigError, match="no tables"):
        PlanningProblem((), make_cluster(), TrainingSpec(8))

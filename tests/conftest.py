from dataclasses import fields

import pytest

from planner.spec.specs import GIB, ClusterSpec, CostConstants, TableSpec, TieringSpec, TrainingSpec
from planner.spec.problem import PlanningProblem


@pytest.fixture(autouse=True, scope="session")
def no_user_profiles(tmp_path_factory):
    """The user's own profile folder stays out of the tests: each sees the shipped profiles only."""
    mp = pytest.MonkeyPatch()
    mp.setenv("DLRM_SCALE_HARDWARE_DIR", str(tmp_path_factory.mktemp("user_profiles")))
    yield
    mp.undo()


def make_cluster(num_nodes=1, ranks_per_node=4, hbm_gib=40.0, **kw) -> ClusterSpec:
    values = dict(
        num_nodes=num_nodes,
        ranks_per_node=ranks_per_node,
        device="cuda",
        hbm_bytes_per_rank=int(hbm_gib * GIB),
        ddr_bytes_per_node=512 * GIB,
        ssd_bytes_per_node=0,
        hbm_gb_per_s=1000.0,
        ddr_gb_per_s=25.0,
        ssd_gb_per_s=5.0,
        intra_node_gb_per_s=100.0,
        inter_node_gb_per_s=10.0,
    )
    values.update(kw)
    costs = {f.name: values.pop(f.name) for f in fields(CostConstants) if f.name in values}
    return ClusterSpec(**values, costs=CostConstants(**costs))


@pytest.fixture
def cluster() -> ClusterSpec:
    return make_cluster()


def make_problem(tables, cluster=None, batch=1024, tiering=None, access=None, **training) -> PlanningProblem:
    return PlanningProblem(tuple(tables), cluster or make_cluster(), TrainingSpec(batch_size_per_rank=batch, **training),
                           tiering or TieringSpec(), access or {})


def table(name, rows=100_000, dim=64, pooling=1.0) -> TableSpec:
    return TableSpec(name, rows, dim, pooling)


def run_config(problem: PlanningProblem, model, train, batch_size: int | None = None, checkpoint=None):
    """A RunConfig for trainers built in tests: `batch_size` (per rank) goes where every run
    keeps it, the problem's training spec."""
    from dataclasses import replace

    from dlrm_scale.run_config import CheckpointConfig, RunConfig

    if batch_size is not None:
        problem = replace(problem, training=replace(problem.training, batch_size_per_rank=batch_size))
    return RunConfig(problem, model, train, checkpoint or CheckpointConfig())

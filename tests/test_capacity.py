"""Every plan the planner returns fits every tier of every rank, or it refuses in one line."""

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from planner.cost.capacity import check_capacity
from dlrm_scale.run_config import load_problem
from planner.spec.errors import PlannerBugError
from planner.plan.planning import make_plan
from planner.spec.types import Storage
from tests.capacity_problems import broken_rule, cases, overfilled, plan_or_refusal

ISSUE_CONFIG = """\
hardware: cpu_gloo
cluster: {world_size: 2, ddr_gib_per_node: 0.65, ssd_gib_per_node: 16}
training: {batch_size_per_rank: 2048, embedding_optimizer: rowwise_adagrad}
tiering: {policy: lru, load_factors: [0.25]}
tables:
%s
model: {arch: dlrm, num_dense_features: 13, dense_arch: [128, 64], over_arch: [128, 1]}
""" % "\n".join(
    f"  - {{name: u{i}, num_embeddings: 1500000, embedding_dim: 64, pooling_factor: 6.0, zipf_exponent: 1.05}}" for i in range(6)
)


def test_six_tables_four_times_ddr_go_to_ssd_behind_caches(tmp_path):
    """Found by a user: row-wise placement skipped the DDR capacity in the class model."""
    path = tmp_path / "c.yaml"
    path.write_text(ISSUE_CONFIG)
    problem = load_problem(path)
    plan = make_plan(problem)
    assert overfilled(plan, problem) is None
    assert {(t.compute_kernel, t.cache_load_factor) for t in plan.tables.values()} == {("key_value", 0.25)}


@settings(max_examples=120, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(cases())
def test_every_plan_fits_every_tier_or_the_planner_says_what_it_lacks(case):
    """...and keeps every constraint (a rule on tables; the reserve is off the capacities)."""
    outcome = plan_or_refusal(case)
    if isinstance(outcome, Exception):
        message = str(outcome)
        assert message and "\n" not in message
        return
    assert overfilled(outcome, case.problem) is None
    assert broken_rule(outcome, case.problem) is None


def test_the_last_check_refuses_an_overfull_plan(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(ISSUE_CONFIG)
    cluster = load_problem(path).cluster
    have = cluster.capacity_bytes_per_rank("ddr")
    check_capacity([Storage(ddr_bytes=have), Storage(ssd_bytes=1)], cluster)
    with pytest.raises(PlannerBugError, match=r"^planner bug: .*rank 1 holds 348,966,093 bytes of ddr but has 348,966,092"):
        check_capacity([Storage(ddr_bytes=have), Storage(ddr_bytes=have + 1)], cluster)


def test_a_planner_bug_is_one_line_exit_3_and_no_plan_written(tmp_path):
    """The CLI's path for a plan that fails the last check, with the check made to fail by
    planning for a cluster whose memory shrinks after the search (a stand-in for a search bug)."""
    config = tmp_path / "c.yaml"
    config.write_text(ISSUE_CONFIG)
    out = tmp_path / "plan.json"
    script = (
        "import sys, planner.plan.planning as p, planner.cost.capacity as c\n"
        "p.check_capacity = lambda mem, cluster: c.check_capacity(mem, __import__('dataclasses').replace(cluster, ddr_bytes_per_node=1))\n"
        "from dlrm_scale.cli import main\n"
        f"sys.exit(main(['plan', {str(config)!r}, '--out', {str(out)!r}]))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=Path(__file__).parents[1])
    assert result.returncode == 3, result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: planner bug: the plan overfills memory")
    assert not out.exists()

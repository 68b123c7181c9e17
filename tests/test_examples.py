"""The user scripts of examples/ run as a user runs them, and import nothing private."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import dlrm_scale
import planner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
PUBLIC = {"planner": set(planner.__all__), "dlrm_scale": set(dlrm_scale.PUBLIC)}


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_an_example_imports_only_public_names(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] in PUBLIC:
            assert node.module in PUBLIC, f"{path.name} imports from {node.module}; only from {' or '.join(PUBLIC)}"
            assert {a.name for a in node.names} <= PUBLIC[node.module], f"{path.name}: {[a.name for a in node.names]}"
        if isinstance(node, ast.Import):
            assert not any(a.name.split(".")[0] in PUBLIC and a.name not in PUBLIC for a in node.names), path.name


def test_planning_from_python_writes_a_plan_the_cli_explains(tmp_path):
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "plan_tables.py")], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("5 tables on 16 ranks")
    explain = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "explain", "plan.json", "--config", "plan.yaml"], cwd=tmp_path,
                             capture_output=True, text=True)
    assert explain.returncode == 0 and explain.stdout.startswith("busiest rank"), explain.stderr


@pytest.mark.distributed
@pytest.mark.parametrize("planner_name", ["dlrm-scale", "torchrec"])
def test_the_two_tower_example_trains_on_two_ranks_with_either_planner(planner_name, tmp_path):
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.run([str(torchrun), "--nproc_per_node", "2", str(ROOT / "examples" / "two_tower.py"), "--planner", planner_name,
                          "--steps", "40", "--plan-out", str(tmp_path / "plan.json")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert f"planner {planner_name}: planned in" in run.stdout
    assert (tmp_path / "plan.json").exists() == (planner_name == "dlrm-scale")

"""Every benchmark is a module of the benchmarks package: it imports, and its --help runs."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED = {"__init__", "common", "workloads"}  # not benchmarks themselves
BENCHMARKS = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if p.stem not in SHARED)


@pytest.mark.parametrize("name", BENCHMARKS)
def test_a_benchmark_imports_and_shows_its_help(name):
    out = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "usage:" in out.stdout


def test_a_result_names_its_command_machine_date_and_commit(tmp_path, monkeypatch):
    from benchmarks import common

    monkeypatch.setattr(sys, "argv", ["benchmarks/planner_bench.py", "--only", "kaggle"])
    common.write_result(tmp_path / "r.json", {"figure": 1.0})
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["figure"] == 1.0 and list(doc)[0] == "provenance"
    assert doc["provenance"]["command"] == "python -m benchmarks.planner_bench --only kaggle"
    assert len(doc["provenance"]["commit"].split("+")[0]) == 40 and doc["provenance"]["machine"] and doc["provenance"]["date"]

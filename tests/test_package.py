"""dlrm-scale as users install it: a wheel built from the repository, installed into a fresh
virtual environment without torch, plans the shipped configs with every named hardware profile
from outside the checkout."""

import json
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROFILES = sorted(p.stem for p in (ROOT / "configs" / "hardware").glob("*.yaml"))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The wheel, and a fresh environment with it and the planner's dependencies only."""
    root = tmp_path_factory.mktemp("package")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root / "wheel"), str(ROOT)],
                   check=True, capture_output=True, cwd=root)
    wheel, = (root / "wheel").glob("dlrm_scale-*.whl")
    venv.create(root / "env", with_pip=True)
    python = root / "env" / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True, cwd=root)
    return root, root / "env" / "bin"


def test_the_installed_wheel_plans_with_every_named_profile_and_no_torch(installed):
    root, bin_dir = installed
    outside = root / "elsewhere"
    outside.mkdir()
    no_torch = subprocess.run([str(bin_dir / "python"), "-c", "import torch"], capture_output=True, text=True, cwd=outside)
    assert no_torch.returncode != 0  # the planner's install brings no torch
    for profile in PROFILES:
        out = outside / f"{profile}.json"
        r = subprocess.run([str(bin_dir / "dlrm-scale"), "plan", str(ROOT / "configs" / "tiny.yaml"), "--hardware", profile,
                            "--out", str(out), "--time-limit", "2"], capture_output=True, text=True, cwd=outside)
        assert r.returncode == 0, f"{profile}: {r.stderr[-2000:]}"
        assert json.loads(out.read_text())["inputs"]["hardware"] == profile
    # a shipped config names its profile itself
    r = subprocess.run([str(bin_dir / "dlrm-scale"), "plan", str(ROOT / "configs" / "criteo_kaggle.yaml"), "--out", str(outside / "k.json"),
                        "--time-limit", "2"], capture_output=True, text=True, cwd=outside)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "26 tables on 8 ranks" in r.stdout
    unknown = subprocess.run([str(bin_dir / "dlrm-scale"), "plan", str(ROOT / "configs" / "tiny.yaml"), "--hardware", "nobox",
                              "--out", str(outside / "x.json")], capture_output=True, text=True, cwd=outside)
    assert unknown.returncode == 2 and "use one of " + ", ".join(PROFILES) in unknown.stderr

"""The layers of docs/architecture.md, enforced: no module imports from a layer above its own
(imports inside functions included), the planner's own layers too (spec -> cost -> search ->
plan -> views -> replan), and the torch-free modules stay torch-free."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# Lowest first; a module may import from its own layer and those before it.
LAYERS = [
    ("planner.spec",),
    ("planner.cost",),
    ("planner.search",),
    ("planner.plan",),
    ("planner.views",),
    ("planner.replan",),
    ("planner",),  # the package itself: its public names, from every layer
    ("dlrm_scale.run_config", "dlrm_scale.quiet", "dlrm_scale.options", "dlrm_scale.run_record"),
    ("dlrm_scale.kernels",),
    ("dlrm_scale.bridge",),
    ("dlrm_scale.tiering",),
    ("dlrm_scale.training",),
    ("dlrm_scale.tools",),
    ("dlrm_scale.tuning",),
    ("dlrm_scale.cli", "dlrm_scale.train"),
]
TORCH_FREE = ["planner", "planner.plan.planning", "planner.views.report", "planner.views.scoring", "planner.views.comm_volume",
              "planner.views.explain", "planner.views.diff", "planner.replan.replan", "planner.plan.replication", "dlrm_scale.run_config", "dlrm_scale.options", "dlrm_scale.run_record", "dlrm_scale.training.flags", "dlrm_scale.tools.simulate",
              "dlrm_scale.tools.fit", "dlrm_scale.tools.runs", "dlrm_scale.tools.refit", "dlrm_scale.tuning.decide"]
TORCH = ("torch", "torchrec", "fbgemm_gpu")


def layer_of(module: str) -> int:
    for i, prefixes in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer; add it to docs/architecture.md and LAYERS")


def modules() -> list[tuple[str, Path]]:
    out = []
    for package in ("planner", "dlrm_scale"):
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            if name.endswith(".__init__"):
                name = name[: -len(".__init__")]
            if name != "dlrm_scale":
                out.append((name, path))
    return out


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return {m for m in found if m.split(".")[0] in ("planner", "dlrm_scale")}


def violations(name: str, path: Path) -> list[str]:
    own, known = layer_of(name), {m for m, _ in modules()}
    out = []
    for imported in sorted(imports(path)):
        target = imported if imported in known else imported.rpartition(".")[0]  # a name from a module
        if target in known and layer_of(target) > own:
            out.append(f"{name} (layer {own}) imports {target} (layer {layer_of(target)})")
    return out


@pytest.mark.parametrize("name, path", modules(), ids=[m for m, _ in modules()])
def test_no_module_imports_from_a_layer_above(name, path):
    assert violations(name, path) == []


def test_the_planner_imports_nothing_of_the_training_stack():
    for name, path in modules():
        if name.startswith("planner"):
            assert not any(m.startswith("dlrm_scale") for m in imports(path)), name


def test_a_planner_layer_violation_is_caught(tmp_path):
    """The planner's layers: a cost module reaching into the search, and a spec module reading a plan, are named."""
    module = tmp_path / "cost_model.py"
    module.write_text("from planner.search.assignment import Assignment\n\ndef f():\n    from planner.plan.document import Plan\n")
    assert set(violations("planner.cost.cost_model", module)) == {
        "planner.cost.cost_model (layer 1) imports planner.plan.document (layer 3)",
        "planner.cost.cost_model (layer 1) imports planner.search.assignment (layer 2)"}


def test_a_layer_violation_is_caught(tmp_path):
    """The check itself: a tiering module importing the trainer, even inside a function, is named."""
    module = tmp_path / "runtime.py"
    module.write_text("def f():\n    from dlrm_scale.training import trainer\n    from planner.plan import Plan\n")
    assert "dlrm_scale.tiering.runtime (layer 10) imports dlrm_scale.training.trainer (layer 11)" in violations(
        "dlrm_scale.tiering.runtime", module)


def test_torch_free_modules_import_without_torch():
    code = (f"import sys; import {', '.join(TORCH_FREE)}; "
            f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {TORCH!r}); assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_the_analysis_commands_run_where_torch_cannot_be_imported(tmp_path):
    """`calibrate --from-runs`, `simulate --measured` and `plan` on recorded runs, with every import
    of torch, torchrec or fbgemm_gpu refused."""
    runs = sorted((ROOT / "tests" / "data" / "recorded_runs").iterdir())
    code = f"""
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {TORCH!r}:
            raise ImportError("no " + name + " here")
sys.meta_path.insert(0, Refuse())
from dlrm_scale.cli import main
assert main(["calibrate", "--from-runs", *{[str(r) for r in runs]!r}, "--out", {str(tmp_path / "p.yaml")!r}]) == 0
assert main(["simulate", {str(runs[0] / "plan.json")!r}, "--measured", {str(runs[0])!r}]) == 0
assert main(["plan", "configs/tiny.yaml", "--out", {str(tmp_path / "plan.json")!r}, "--hardware", {str(tmp_path / "p.yaml")!r}]) == 0
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "refitted cpu_gloo to 2 runs" in out.stdout and "largest misses" in out.stdout

from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "cost_model_exploration.ipynb"


def test_notebook_is_committed_without_outputs():
    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in nb.cells if c.cell_type == "code")


def test_notebook_runs_top_to_bottom_on_a_small_config(monkeypatch):
    monkeypatch.setenv("DLRM_SCALE_NB_CONFIG", "configs/criteo_kaggle.yaml")
    monkeypatch.setenv("DLRM_SCALE_NB_WORLD_SIZES", "4,8")
    monkeypatch.setenv("DLRM_SCALE_NB_TIME_LIMIT", "2")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum(1 for o in outputs if o.output_type == "display_data" and "image/png" in o.data) >= 4

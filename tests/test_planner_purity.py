import subprocess
import sys


def test_planner_imports_without_torch():
    code = (
        "import sys; import planner, planner.planning, planner.report, planner.scoring, planner.comm_volume; "
        "assert not any(m == 'torch' or m.startswith('torch.') for m in sys.modules), 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)

import json
import subprocess
import sys
from pathlib import Path

from planner.plan.document import Plan


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "dlrm_scale.cli", *args], capture_output=True, text=True, cwd=cwd)


def test_plan_command_writes_valid_plan_and_plot(tmp_path: Path):
    out, png = tmp_path / "plan.json", tmp_path / "plan.png"
    r = cli("plan", "configs/criteo_kaggle.yaml", "--world-size", "16", "--time-limit", "2", "--out", str(out), "--plot", str(png))
    assert r.returncode == 0, r.stderr
    plan = Plan.load(out)
    assert plan.world_size == 16 and len(plan.tables) == 26
    assert "busiest rank" in r.stdout and "lower bound" in r.stdout
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_from_tables_csv_and_flags(tmp_path: Path):
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\n" + "".join(f"t{i},{1000 * (i + 1)},32,{i + 1}\n" for i in range(10)))
    out = tmp_path / "p.json"
    r = cli("plan", "--tables", str(csv), "--hardware", "h100_dgx", "--world-size", "4", "--batch-size", "128", "--out", str(out), "--time-limit", "2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 4 and doc["ranks_per_node"] == 4


def test_infeasible_plan_is_one_line_and_exit_2(tmp_path: Path):
    out = tmp_path / "p.json"
    r = cli("plan", "configs/criteo_terabyte.yaml", "--world-size", "2", "--hbm-gb", "1", "--out", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the tables need at least") and "bytes of hbm" in lines[0]
    assert not out.exists()


def test_user_errors_never_print_tracebacks(tmp_path: Path):
    cases = [
        ("plan", "configs/missing.yaml", "--out", str(tmp_path / "p.json")),
        ("plan", "configs/tiny.yaml", "--hardware", "nope", "--out", str(tmp_path / "p.json")),
        ("plan", "configs/tiny.yaml", "--world-size", "3", "--ranks-per-node", "2", "--out", str(tmp_path / "p.json")),
        ("plan", "configs/tiny.yaml", "--out", str(tmp_path / "no" / "dir" / "p.json")),
        ("plan", "--out", str(tmp_path / "p.json")),
        ("plan", "configs/tiny.yaml", "--gap", "1", "--out", str(tmp_path / "p.json")),
    ]
    for args in cases:
        r = cli(*args)
        assert r.returncode == 2, args
        assert "Traceback" not in r.stderr and r.stderr.startswith("error: "), (args, r.stderr)


def test_gap_stops_the_search_once_the_plan_is_proven_within_it(tmp_path: Path):
    """Criteo-1TB on 8 ranks: at --gap 0.001 the search goes on past the warm start (the
    class model); at --gap 0.5 the warm start's plan is within it and the search ends there. At the
    default limit: at 4 s, costing and the types' greedy trials (a fixed second or so on a 2-core
    Zen 3) left a busy machine's wall clock no time for the class model."""
    default, loose = tmp_path / "default.json", tmp_path / "loose.json"
    r = cli("plan", "configs/criteo_terabyte.yaml", "--world-size", "8", "--gap", "0.001", "--out", str(default))
    assert r.returncode == 0, r.stderr
    r = cli("plan", "configs/criteo_terabyte.yaml", "--world-size", "8", "--gap", "0.5", "--out", str(loose))
    assert r.returncode == 0, r.stderr
    plan_default, plan_loose = Plan.load(default), Plan.load(loose)
    assert plan_default.solver.startswith("class") and plan_loose.solver.startswith("greedy") and plan_loose.gap <= 0.5


def test_compare_with_torchrec_prints_both_planners(tmp_path: Path):
    r = cli("plan", "configs/criteo_kaggle.yaml", "--time-limit", "2", "--out", str(tmp_path / "p.json"), "--compare", "torchrec")
    assert r.returncode == 0, r.stderr
    rows = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.startswith(("dlrm-scale ", "torchrec "))}
    assert set(rows) == {"dlrm-scale", "torchrec"}
    assert all(float(v) > 0 for v in rows["torchrec"])


def test_torchrec_cost_model_flag(tmp_path: Path):
    out = tmp_path / "p.json"
    r = cli("plan", "configs/criteo_kaggle.yaml", "--cost-model", "torchrec", "--time-limit", "2", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["cost_model"] == "torchrec"


def test_profile_writes_stats_that_plan_reads(tmp_path: Path):
    stats = tmp_path / "stats.json"
    r = cli("profile", "configs/tiny.yaml", "--batches", "40", "--out", str(stats))
    assert r.returncode == 0, r.stderr
    doc = json.loads(stats.read_text())
    assert set(doc["tables"]) == {"t_large", "t_medium", "t_small", "t_tiny"}
    large = doc["tables"]["t_large"]
    assert abs(large["pooling_factor"] - 4.0) < 0.1 and large["batch_size"] == 512  # 256 per rank x 2 ranks
    assert large["lru_hit_rate"] == sorted(large["lru_hit_rate"]) and 0 < large["lru_hit_rate"][-1] <= 1
    out = tmp_path / "plan.json"
    r = cli("plan", "configs/tiny.yaml", "--stats", str(stats), "--out", str(out), "--time-limit", "2")
    assert r.returncode == 0, r.stderr
    doc["tables"]["nope"] = doc["tables"].pop("t_tiny")
    stats.write_text(json.dumps(doc))
    r = cli("plan", "configs/tiny.yaml", "--stats", str(stats), "--out", str(out))
    assert r.returncode == 2 and r.stderr.strip().endswith("describes table 'nope' that the config does not have; profile this config")


CACHED_CONFIG = """hardware: cpu_gloo
cluster: {world_size: 2, ddr_gib_per_node: 0.02, ssd_gib_per_node: 4}
training: {batch_size_per_rank: 256, embedding_optimizer: rowwise_adagrad}
tiering: {policy: lru, load_factors: [0.25]}
tables:
  - {name: a, num_embeddings: 200000, embedding_dim: 16, pooling_factor: 4.0, zipf_exponent: 1.05}
  - {name: b, num_embeddings: 200000, embedding_dim: 16, pooling_factor: 4.0, zipf_exponent: 1.05}
model: {arch: dlrm, num_dense_features: 13, dense_arch: [32, 16], over_arch: [32, 1]}
"""


def test_simulate_and_explain_price_caches_with_the_stats_the_plan_was_made_with(tmp_path: Path):
    config, stats, plan = tmp_path / "c.yaml", tmp_path / "stats.json", tmp_path / "plan.json"
    config.write_text(CACHED_CONFIG)
    assert cli("profile", str(config), "--batches", "40", "--out", str(stats)).returncode == 0
    r = cli("plan", str(config), "--stats", str(stats), "--out", str(plan), "--time-limit", "2")
    assert r.returncode == 0 and all(t["compute_kernel"] == "key_value" for t in json.loads(plan.read_text())["tables"].values())

    def embedding_ms(hit_rate: float) -> float:
        doc = json.loads(stats.read_text())
        for t in doc["tables"].values():
            t["lru_hit_rate"] = [hit_rate] * len(t["lru_hit_rate"])
        given = tmp_path / f"stats{hit_rate}.json"
        given.write_text(json.dumps(doc))
        out = tmp_path / f"sim{hit_rate}.json"
        r = cli("simulate", str(plan), "--config", str(config), "--stats", str(given), "--json", str(out))
        assert r.returncode == 0, r.stderr
        return json.loads(out.read_text())["ranks"][0]["phases_ms"]["embedding"]

    assert embedding_ms(0.0) > embedding_ms(1.0) * 1.2  # every id a miss costs more than every id a hit
    r = cli("explain", str(plan), "--config", str(config), "--stats", str(tmp_path / "stats1.0.json"))
    assert r.returncode == 0, r.stderr


def test_output_cut_short_by_a_pipe_ends_quietly(tmp_path):
    """More output than a pipe buffers (a line per table of 3,000), read by `head -1`."""
    tables = tmp_path / "t.csv"
    tables.write_text("name,num_embeddings,embedding_dim,pooling_factor\n" + "".join(f"table_{i},100,8,1\n" for i in range(3000)))
    r = subprocess.run(f"{sys.executable} -m dlrm_scale.cli plan --tables {tables} --hardware cpu_gloo --world-size 2 "
                       f"--time-limit 1 --out {tmp_path / 'p.json'} | head -1", shell=True, capture_output=True, text=True)
    assert r.stdout.strip() and "Traceback" not in r.stderr and "BrokenPipe" not in r.stderr, r.stderr[-500:]


def test_every_flag_is_declared_once_in_options():
    """No command declares a flag of its own: each comes from dlrm_scale/options.py, so a flag
    cannot take another type, choice or default in another command."""
    import ast
    from pathlib import Path

    from dlrm_scale import options

    own = []
    for path in Path("dlrm_scale").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args
                    and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("--")
                    and path.name != "options.py"):
                own.append(f"{path}: {node.args[0].value}")
    assert own == []
    assert all(spec.get("help") for spec in options.FLAGS.values())


def test_plan_shows_its_search_on_a_terminal_and_nowhere_else(tmp_path: Path):
    """stderr a terminal: the search's best busiest rank, proven bound and gap on one line,
    rewritten, then erased; piped (a log, CI): nothing."""
    import os
    import re

    args = ("plan", "configs/criteo_terabyte.yaml", "--hardware", "a100_zionex", "--world-size", "16", "--time-limit", "3")
    leader, follower = os.openpty()
    r = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", *args, "--out", str(tmp_path / "a.json")],
                       stdout=subprocess.PIPE, stderr=follower, text=True)
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 1 << 16)
        except OSError:  # the terminal's other end is closed and drained
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert r.returncode == 0
    lines = [m.groups() for m in re.finditer(rb"searching: busiest rank ([\d.]+) ms, proven bound ([\d.]+) ms, gap ([\d.]+)% \(([^,]+)",
                                             shown)]
    assert lines and lines[0][3] == b"warm start"
    assert all(float(bound) <= float(best) for best, bound, _, _ in lines)
    assert shown.endswith(b"\r\x1b[K")  # the line erased before the summary prints
    piped = cli(*args, "--out", str(tmp_path / "b.json"))
    assert piped.returncode == 0 and piped.stderr == ""

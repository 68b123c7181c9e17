from pathlib import Path

import pytest

from dlrm_scale.run_config import load_problem
from planner.spec.config import load_tables_csv
from planner.spec.errors import ConfigError

KAGGLE = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
          10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]


def test_criteo_kaggle_config_has_the_reference_cardinalities():
    p = load_problem("configs/criteo_kaggle.yaml")
    assert [t.num_embeddings for t in p.tables] == KAGGLE
    assert {t.embedding_dim for t in p.tables} == {16}
    assert p.cluster.world_size == 8 and p.cluster.ranks_per_node == 8


def test_criteo_terabyte_config():
    p = load_problem("configs/criteo_terabyte.yaml")
    assert len(p.tables) == 26 and p.tables[0].num_embeddings == 45833188
    assert {t.embedding_dim for t in p.tables} == {128}


def test_flags_override_config_and_profile():
    p = load_problem("configs/criteo_kaggle.yaml", cluster_overrides={"world_size": 64}, training_overrides={"batch_size_per_rank": 99})
    assert p.cluster.num_nodes == 8 and p.cluster.world_size == 64
    assert p.training.batch_size_per_rank == 99
    small = load_problem("configs/criteo_kaggle.yaml", cluster_overrides={"world_size": 2})
    assert small.cluster.ranks_per_node == 2 and small.cluster.num_nodes == 1


def test_hardware_profiles_load(tmp_path: Path):
    for name in ("a100_zionex", "h100_dgx", "cpu_gloo"):
        p = load_problem("configs/tiny.yaml", hardware=name)
        assert p.cluster.name == name
    assert load_problem("configs/tiny.yaml", hardware="h100_dgx").cluster.hbm_bytes_per_rank == 80 * 1024**3


def test_misspelt_key_suggests_the_right_one(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("hardware: a100_zionex\ntraining:\n  batch_size_per_rnak: 8\ntables: []\n")
    with pytest.raises(ConfigError, match="did you mean 'batch_size_per_rank'"):
        load_problem(cfg)


def test_unknown_profile_lists_known_ones():
    with pytest.raises(ConfigError, match="a100_zionex"):
        load_problem("configs/tiny.yaml", hardware="tpu_v5")


def test_bad_yaml_names_the_line(tmp_path: Path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("training:\n  batch_size_per_rank: [1\n")
    with pytest.raises(ConfigError, match="line"):
        load_problem(cfg)


def test_world_size_must_fill_whole_nodes():
    with pytest.raises(ConfigError, match="multiple of ranks_per_node"):
        load_problem("configs/criteo_kaggle.yaml", cluster_overrides={"world_size": 12})


def test_tables_csv(tmp_path: Path):
    f = tmp_path / "t.csv"
    f.write_text("name,num_embeddings,embedding_dim,pooling_factor\na,100,16,2.5\nb,7,8,\n")
    tables = load_tables_csv(f)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.pooling_factor) for t in tables] == [("a", 100, 16, 2.5), ("b", 7, 8, 1.0)]
    p = load_problem(None, tables_csv=f, training_overrides={"batch_size_per_rank": 64})
    assert p.cluster.name == "a100_zionex"


def test_tables_csv_errors_name_file_and_line(tmp_path: Path):
    f = tmp_path / "t.csv"
    f.write_text("name,num_embeddings,embedding_dim\na,lots,16\n")
    with pytest.raises(ConfigError, match="line 2"):
        load_tables_csv(f)
    f.write_text("name,rows\na,1\n")
    with pytest.raises(ConfigError, match="num_embeddings"):
        load_tables_csv(f)
    with pytest.raises(ConfigError, match="does not exist"):
        load_tables_csv(tmp_path / "missing.csv")


def test_one_run_config_from_a_config_and_flags(tmp_path: Path):
    from dlrm_scale.run_config import Overrides, load_run_config

    run = load_run_config("configs/tiny.yaml")
    assert run.batch_size_per_rank == run.problem.training.batch_size_per_rank == 256  # its one home
    assert run.model.dense_arch == (32, 16) and run.train.log_every == 100
    flags = Overrides(world_size=4, ranks_per_node=2, batch_size=64, comm_precision="fwd=fp16,bwd=bf16", steps=7,
                      deterministic=True, hbm_gb=1.5)
    run = load_run_config("configs/tiny.yaml", flags)
    c, t = run.problem.cluster, run.problem.training
    assert (c.world_size, c.num_nodes, c.hbm_bytes_per_rank) == (4, 2, int(1.5 * 1024**3))
    assert (t.batch_size_per_rank, t.fwd_comm_precision, t.bwd_comm_precision) == (64, "fp16", "bf16")
    assert (run.train.steps, run.train.deterministic, run.train.log_every) == (7, True, 1)
    # without a config (--tables alone) every section takes its defaults, the batch from its one default
    csv = tmp_path / "t.csv"
    csv.write_text("name,num_embeddings,embedding_dim,pooling_factor\na,10,8,1\n")
    from planner.spec.specs import DEFAULT_BATCH_SIZE_PER_RANK

    assert load_run_config(None, Overrides(tables_csv=str(csv))).batch_size_per_rank == DEFAULT_BATCH_SIZE_PER_RANK


def test_the_planner_alone_reads_only_its_own_sections():
    from planner.spec.config import load_problem as planner_load_problem

    with pytest.raises(ConfigError, match="unknown key 'model'"):
        planner_load_problem("configs/tiny.yaml")
    assert planner_load_problem("configs/tiny.yaml", other_sections=("model", "train")).cluster.world_size == 2


def test_named_profiles_are_found_among_the_shipped_ones_then_the_users(tmp_path, monkeypatch):
    from planner.spec.config import HARDWARE_DIR, hardware_path

    monkeypatch.setenv("DLRM_SCALE_HARDWARE_DIR", str(tmp_path))
    (tmp_path / "mybox.yaml").write_text((HARDWARE_DIR / "cpu_gloo.yaml").read_text())
    (tmp_path / "cpu_gloo.yaml").write_text("name: a user's copy\n")
    assert hardware_path("mybox") == tmp_path / "mybox.yaml"
    assert hardware_path("cpu_gloo") == HARDWARE_DIR / "cpu_gloo.yaml"  # the shipped one wins
    for fitted in ("cpu_xeon_m207", "cpu_xeon_m167", "cpu_epyc_zen4", "cpu_epyc_zen3"):
        assert "measured_on:" in hardware_path(fitted).read_text()
    with pytest.raises(ConfigError, match=r"unknown hardware profile 'nobox'; use one of .*cpu_xeon_m207.*mybox"):
        hardware_path("nobox")


def test_an_unpooled_table_is_planned_and_refused_where_it_cannot_go(tmp_path):
    """`pooled: false` (an EmbeddingCollection's table) plans, survives the run record, and is
    refused in one line by the trainer (DLRM's tables are pooled) and by TorchRec's estimators."""
    import subprocess
    import sys

    from dlrm_scale.run_config import load_run_config
    from dlrm_scale.run_record import run_document, run_from_document

    config = tmp_path / "ec.yaml"
    config.write_text("hardware: cpu_gloo\ncluster: {world_size: 2}\ntraining: {batch_size_per_rank: 256}\ntables:\n"
                      "  - {name: history, num_embeddings: 100000, embedding_dim: 32, pooling_factor: 20.0, pooled: false}\n"
                      "  - {name: user, num_embeddings: 50000, embedding_dim: 32, pooling_factor: 1.0}\n")
    run = load_run_config(config)
    assert [t.pooled for t in run.problem.tables] == [False, True]
    assert [t.pooled for t in run_from_document(run_document(run), "record").problem.tables] == [False, True]

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "dlrm_scale.cli", *args], capture_output=True, text=True)

    assert cli("plan", str(config), "--out", str(tmp_path / "p.json")).returncode == 0
    for r, message in ((cli("train", "--config", str(config), "--steps", "2", "--out-dir", str(tmp_path / "o")),
                        "table 'history' is unpooled (pooled: false, an EmbeddingCollection's); dlrm-scale train builds DLRM"),
                       (cli("plan", str(config), "--out", str(tmp_path / "q.json"), "--cost-model", "torchrec"),
                        "table 'history' is unpooled: TorchRec's estimators are asked here for pooled tables only")):
        assert r.returncode == 2 and r.stderr.count("\n") == 1 and message in r.stderr, r.stderr
    config.write_text(config.read_text().replace("pooled: false", "pooled: 0"))
    r = cli("plan", str(config), "--out", str(tmp_path / "p.json"))
    assert r.returncode == 2 and "'pooled' must be true or false, got 0" in r.stderr

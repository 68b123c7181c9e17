import logging
import math

import numpy as np
import pytest
import torch

from dlrm_scale.training.criteo import CriteoDataError, CriteoNpy, CriteoTSV, criteo_data, parse_line
from planner.spec.errors import ConfigError
from planner.spec.specs import TableSpec
from tests.criteo_fixture import BAD_LINES, write_criteo_tsv

TABLES = [TableSpec(f"c{i}", 1000 + i, 8) for i in range(26)]


def test_parse_line_transforms_and_hashes():
    line = "1\t" + "\t".join(["0", "-3", "", "9"] + ["1"] * 9) + "\t" + "\t".join(["ff", ""] + ["10"] * 24) + "\n"
    label, dense, sparse = parse_line(line, [t.num_embeddings for t in TABLES])
    assert label == 1.0
    assert dense[:4] == [0.0, 0.0, 0.0, pytest.approx(math.log(10))]
    assert sparse[0] == 255 % 1000 and sparse[1] == 0 and sparse[2] == 16


@pytest.mark.parametrize("bad", BAD_LINES)
def test_malformed_lines_are_rejected(bad):
    assert parse_line(bad, [t.num_embeddings for t in TABLES]) is None


def test_reader_skips_bad_lines_with_file_and_line(tmp_path, caplog):
    path = write_criteo_tsv(tmp_path / "day.tsv", 200, {5: BAD_LINES[0], 77: BAD_LINES[3]})
    reader = CriteoTSV(path, TABLES, 13, 10, rank=0, world=1, holdout_every=10**9)
    with caplog.at_level(logging.WARNING, logger="dlrm_scale.training.criteo"):
        rows = list(reader.rows())
    assert len(rows) == 198 and reader.stats.bad == 2
    assert f"{path}:5" in caplog.text and f"{path}:77" in caplog.text


def test_too_many_bad_lines_is_an_error(tmp_path):
    path = write_criteo_tsv(tmp_path / "day.tsv", 2000, {i: BAD_LINES[i % 5] for i in range(1000, 1100)})
    reader = CriteoTSV(path, TABLES, 13, 10, rank=0, world=1, holdout_every=10**9, max_bad_fraction=0.01)
    with pytest.raises(CriteoDataError, match="malformed.*day.tsv:10"):
        list(reader.rows())


def test_ranks_read_disjoint_parts_and_holdout_is_separate(tmp_path):
    path = write_criteo_tsv(tmp_path / "day.tsv", 400)
    seen = []
    for rank in range(2):
        for split in ("train", "eval"):
            rows = list(CriteoTSV(path, TABLES, 13, 4, rank, 2, split=split, holdout_every=4).rows())
            seen.append({tuple(r[2]) for r in rows})
            assert len(rows) == (150 if split == "train" else 50)
    assert sum(len(s) for s in seen) == len(set().union(*seen)) == 400


def test_a_steps_global_batch_holds_the_same_lines_at_every_world_size(tmp_path):
    path = write_criteo_tsv(tmp_path / "day.tsv", 400)

    def global_batch(world, split, step):
        batches = [list(CriteoTSV(path, TABLES, 13, 24 // world, r, world, split=split, holdout_every=7).batches(step, 1))[0]
                   for r in range(world)]
        return sorted(tuple(x) for b in batches for x in b.dense_features.tolist())

    for split, step in (("train", 5), ("eval", 1)):
        one = global_batch(1, split, step)
        assert len(one) == 24 and all(global_batch(w, split, step) == one for w in (2, 3, 4))


def test_npy_rows_are_dealt_across_days_as_one_stream(tmp_path):
    rng = np.random.default_rng(0)
    for day, n in enumerate((7, 5, 3)):  # day lengths that do not divide the world sizes
        np.save(tmp_path / f"day_{day}_dense.npy", rng.random((n, 13), dtype=np.float32))
        np.save(tmp_path / f"day_{day}_sparse.npy", rng.integers(0, 10**7, (n, 26)))
        np.save(tmp_path / f"day_{day}_labels.npy", rng.integers(0, 2, (n, 1)).astype(np.int32))
    for world in (2, 3):
        dealt = [[r[1][0] for r in criteo_data(tmp_path, TABLES, 13, 1, rank, world, "train").rows()] for rank in range(world)]
        interleaved = [dealt[i % world][i // world] for i in range(12)]
        assert interleaved == [r[1][0] for r in criteo_data(tmp_path, TABLES, 13, 1, 0, 1, "train").rows()]


def test_batches_have_one_id_per_table_and_wrap_around(tmp_path):
    path = write_criteo_tsv(tmp_path / "day.tsv", 50)
    reader = CriteoTSV(path, TABLES, 13, 8, 0, 1, holdout_every=10**9)
    batches = list(reader.batches(0, 10))  # 80 rows from 50: a second epoch
    assert len(batches) == 10
    b = batches[0]
    assert b.dense_features.shape == (8, 13) and b.labels.shape == (8,)
    kjt = b.sparse_features.to_dict()
    assert set(kjt) == {f"f_c{i}" for i in range(26)}
    assert torch.all(kjt["f_c0"].lengths() == 1)
    assert torch.equal(batches[0].dense_features, list(reader.batches(0, 1))[0].dense_features)


def test_wrong_model_shape_and_missing_data_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="26 categorical"):
        CriteoTSV(tmp_path, TABLES[:3], 13, 8, 0, 1)
    with pytest.raises(CriteoDataError, match="no Criteo TSV data"):
        CriteoTSV(tmp_path / "nothing", TABLES, 13, 8, 0, 1)


def test_npy_days_as_torchrec_writes_them(tmp_path):
    rng = np.random.default_rng(0)
    for day in range(3):
        np.save(tmp_path / f"day_{day}_dense.npy", rng.random((30, 13), dtype=np.float32))
        np.save(tmp_path / f"day_{day}_sparse.npy", rng.integers(0, 10**7, (30, 26)))
        np.save(tmp_path / f"day_{day}_labels.npy", rng.integers(0, 2, (30, 1)).astype(np.int32))
    reader = criteo_data(tmp_path, TABLES, 13, 5, 1, 2, "train")
    assert isinstance(reader, CriteoNpy)
    rows = list(reader.rows())
    assert len(rows) == 30  # days 0 and 1, every second row
    assert all(0 <= v < 1026 for r in rows for v in r[2])
    assert len(list(criteo_data(tmp_path, TABLES, 13, 5, 1, 2, "eval").rows())) == 15

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.spec.schemes import column_split_counts, row_blocks, shard_counts, shard_geometry
from planner.spec.specs import TableSpec
from planner.spec.types import ShardingType
from tests.conftest import make_cluster


def coverage(table: TableSpec, geoms) -> np.ndarray:
    grid = np.zeros((table.num_embeddings, table.embedding_dim), dtype=np.int32)
    for g in geoms:
        grid[g.row_offset : g.row_offset + g.rows, g.col_offset : g.col_offset + g.cols] += 1
    return grid


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 300), dim4=st.integers(1, 16), shards=st.integers(1, 12))
def test_row_and_column_schemes_cover_every_weight_exactly_once(rows, dim4, shards):
    t = TableSpec("t", rows, 4 * dim4)
    for scheme in (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE):
        geoms = shard_geometry(t, scheme, shards)
        assert len(geoms) == shards
        assert np.all(coverage(t, geoms) == 1)
    for k in [1] + column_split_counts(t.embedding_dim, shards):
        for scheme in (ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE):
            geoms = shard_geometry(t, scheme, k)
            assert all(g.cols % 4 == 0 for g in geoms)
            assert np.all(coverage(t, geoms) == 1)


def test_row_blocks_follow_torchrec_rule():
    # TorchRec: blocks of ceil(rows / n); trailing shards may be empty.
    assert row_blocks(10, 4) == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert row_blocks(3, 4) == [(0, 1), (1, 1), (2, 1), (3, 0)]
    assert row_blocks(8, 4) == [(0, 2), (2, 2), (4, 2), (6, 2)]
    assert row_blocks(9, 4) == [(0, 3), (3, 3), (6, 3), (9, 0)]  # the block that would hold the rest is empty
    assert row_blocks(0, 2) == [(0, 0), (0, 0)]


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(0, 5_000), shards=st.integers(1, 1_100))
def test_row_blocks_are_shard_i_of_ceil_rows_over_n_each(rows, shards):
    block = -(-rows // shards)
    assert row_blocks(rows, shards) == [(min(i * block, rows), min(block, rows - min(i * block, rows))) for i in range(shards)]


def test_data_parallel_is_one_full_replica_per_rank():
    t = TableSpec("t", 50, 8)
    geoms = shard_geometry(t, ShardingType.DATA_PARALLEL, 3)
    assert len(geoms) == 3 and all(np.all(coverage(t, [g]) == 1) for g in geoms)


def test_column_split_counts_keep_width_aligned():
    assert column_split_counts(16, 8) == [2, 4]
    assert column_split_counts(48, 64) == [2, 3, 4, 6, 12]
    with pytest.raises(ValueError):
        shard_geometry(TableSpec("t", 5, 16), ShardingType.COLUMN_WISE, 3)
    with pytest.raises(ValueError, match="not whole column blocks"):
        shard_geometry(TableSpec("t", 5, 16), ShardingType.GRID_SHARD, 5, 2)


def test_shard_counts_per_cluster_shape():
    t = TableSpec("t", 1000, 64)
    one_node = make_cluster(num_nodes=1, ranks_per_node=4)
    two_nodes = make_cluster(num_nodes=2, ranks_per_node=4)
    assert shard_counts(t, ShardingType.TABLE_ROW_WISE, one_node) == []
    assert shard_counts(t, ShardingType.TABLE_ROW_WISE, two_nodes) == [4]
    assert shard_counts(t, ShardingType.ROW_WISE, two_nodes) == [8]
    assert shard_counts(t, ShardingType.TABLE_COLUMN_WISE, two_nodes) == [2, 4]
    assert shard_counts(t, ShardingType.COLUMN_WISE, two_nodes) == [2, 4, 8]
    assert shard_counts(t, ShardingType.GRID_SHARD, one_node) == []
    assert shard_counts(t, ShardingType.GRID_SHARD, two_nodes) == [8]  # two column blocks, a node's 4 row blocks each
    assert shard_counts(t, ShardingType.GRID_SHARD, make_cluster(num_nodes=4, ranks_per_node=2)) == [4, 8]


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 300), dim4=st.integers(1, 16), local=st.integers(2, 8), nodes=st.integers(2, 4))
def test_a_grid_is_column_blocks_each_cut_into_a_nodes_row_blocks(rows, dim4, local, nodes):
    t = TableSpec("t", rows, 4 * dim4)
    for k in column_split_counts(t.embedding_dim, nodes):
        geoms = shard_geometry(t, ShardingType.GRID_SHARD, k * local, local)
        assert np.all(coverage(t, geoms) == 1)
        for c in range(k):  # block c: row blocks as TorchRec cuts them over a node, one column block wide
            block = geoms[c * local:(c + 1) * local]
            assert [(g.row_offset, g.rows) for g in block] == row_blocks(rows, local)
            assert {(g.col_offset, g.cols) for g in block} == {(c * t.embedding_dim // k, t.embedding_dim // k)}

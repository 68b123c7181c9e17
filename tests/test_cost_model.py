import pytest

from planner.cost import cost_model as cm
from planner.cost.cost_model import AnalyticCostModel, OptionRequest
from planner.spec.schemes import cache_rows, shard_geometry
from planner.spec.errors import ConfigError
from planner.spec.specs import TableSpec, TrainingSpec
from planner.spec.types import ShardingType
from tests.conftest import make_cluster

MS = 1e3


def test_transfer_ms():
    # 1 GB at 100 GB/s is 10 ms
    assert cm.transfer_ms(1e9, 100.0) == pytest.approx(10.0)


def test_row_comm_bytes_per_precision():
    assert cm.row_comm_bytes(10, 16, "fp32") == 10 * 64
    assert cm.row_comm_bytes(10, 16, "bf16") == 10 * 32
    assert cm.row_comm_bytes(10, 16, "int8") == 10 * (16 + 8)  # scale and bias per row
    assert cm.row_comm_bytes(10, 16, "fp8") == 10 * (16 + 4)


def test_optimizer_state():
    assert cm.optimizer_state_bytes(100, 8, "sgd") == 0
    assert cm.optimizer_state_bytes(100, 8, "rowwise_adagrad") == 400
    assert cm.optimizer_state_bytes(100, 8, "adagrad") == 3200
    assert cm.optimizer_state_bytes(100, 8, "adam") == 6400


def test_lookup_fwd_and_bwd():
    # 1e6 distinct rows of 64 fp32 columns at 256 GB/s: 256e6 bytes -> 1 ms, plus 0.01 ms launch
    assert cm.lookup_fwd_ms(2e6, 1e6, 64, 256.0, 0.01) == pytest.approx(1.01)
    # plus 3 ns for each of the 2e6 ids: 6 ms
    assert cm.lookup_fwd_ms(2e6, 1e6, 64, 256.0, 0.01, per_id_ns=3.0) == pytest.approx(7.01)
    # plus 0.5 ns for each of the 64 weights of each id's row: 64 ms, and twice that at twice the width
    assert cm.lookup_fwd_ms(2e6, 1e6, 64, 256.0, 0.01, per_id_ns=3.0, per_weight_ns=0.5) == pytest.approx(71.01)
    assert cm.lookup_fwd_ms(2e6, 0.0, 128, 256.0, 0.0, per_weight_ns=0.5) == pytest.approx(128.0)
    # bwd with rowwise adagrad: 2 * (256 + 4) bytes per distinct row (1 ms), 5 ns per id (10 ms), 100 ns per row (100 ms)
    assert cm.lookup_bwd_ms(2e6, 1e6, 64, "rowwise_adagrad", 260.0 * 2, 0.0, 5.0, 100.0) == pytest.approx(111.0)
    # plus 0.25 ns per weight of each id's gradient row gathered: 2e6 * 64 * 0.25 ns = 32 ms
    assert cm.lookup_bwd_ms(2e6, 1e6, 64, "rowwise_adagrad", 260.0 * 2, 0.0, 5.0, 100.0, 0.25) == pytest.approx(143.0)


def test_skewed_ids_cost_less_than_uniform_ones_at_the_same_count():
    """Exact kernels merge duplicate ids: a skewed table touches fewer rows per batch, so its
    lookups cost less, and a data-parallel replica (local batch) has a higher distinct ratio."""
    cluster = make_cluster(ranks_per_node=2, lookup_bwd_row_ns=50.0, lookup_fwd_ns=1.0, lookup_bwd_ns=1.0)
    model = AnalyticCostModel(cluster, TrainingSpec(batch_size_per_rank=1024))

    def bwd(zipf):
        t = TableSpec("t", 1_000_000, 64, 10.0, zipf)
        (opt,) = model.estimate([OptionRequest(t, ShardingType.TABLE_WISE, "fused", "hbm", tuple(shard_geometry(t, ShardingType.TABLE_WISE, 1)))])
        return opt.shards[0].perf.bwd_compute_ms

    assert bwd(1.2) < 0.5 * bwd(None)
    t = TableSpec("t", 1_000_000, 64, 10.0, 1.1)
    ids = 2048 * 10.0
    assert cm.distinct_rows_per_step(t, ids) < ids
    assert cm.distinct_rows_per_step(t, ids, 2) == pytest.approx(cm.distinct_rows_per_step(t, ids) / 2)
    assert cm.distinct_rows_per_step(t, ids / 2) / (ids / 2) > cm.distinct_rows_per_step(t, ids) / ids


def test_expected_distinct_rows_match_the_training_data():
    """The planner's expected distinct rows per batch are what the trainer's Zipf ids give."""
    import numpy as np

    from dlrm_scale.training.data import ZipfIds
    from planner.spec.access_stats import zipf_unique_ids

    for rows, s, n in [(100_000, 1.05, 20_480), (1000, 0.8, 5000), (2_000_000, 1.2, 65_536)]:
        drawn = len(np.unique(ZipfIds(rows, s, seed=0).sample(n, np.random.default_rng(1))))
        assert zipf_unique_ids(rows, s, float(n)) == pytest.approx(drawn, rel=0.03)


def test_all_to_all_uses_slower_of_the_two_links():
    c = make_cluster(num_nodes=2, ranks_per_node=4, intra_node_gb_per_s=100.0, inter_node_gb_per_s=10.0, collective_latency_ms=0.0)
    # 8e6 bytes spread over 8 ranks: 3/8 intra (3e6 at 100 GB/s = 0.03 ms), 4/8 inter (4e6 at 10 = 0.4 ms)
    assert cm.all_to_all_ms(8e6, c) == pytest.approx(0.4)
    one = make_cluster(num_nodes=1, ranks_per_node=4, intra_node_gb_per_s=100.0, collective_latency_ms=0.0)
    assert cm.all_to_all_ms(4e6, one) == pytest.approx(3e6 / 100e6)


def test_ring_collectives():
    c = make_cluster(num_nodes=2, ranks_per_node=4, collective_latency_ms=0.0)
    assert cm.reduce_scatter_ms(4e6, 4, c) == pytest.approx(3e6 / 100e6)  # inside a node: NVLink-class
    assert cm.reduce_scatter_ms(8e6, 8, c) == pytest.approx(7e6 / 10e6)  # spans nodes: the NIC
    assert cm.all_reduce_ms(8e6, 8, c) == pytest.approx(2 * 7e6 / 10e6)
    assert cm.all_reduce_ms(8e6, 1, c) == 0.0
    # a host that sums what arrives (a CPU) pays per byte received in the reductions only
    summing = make_cluster(num_nodes=2, ranks_per_node=4, collective_latency_ms=0.0, reduce_byte_ns=0.5)
    assert cm.reduce_scatter_ms(8e6, 8, summing) == pytest.approx(7e6 / 10e6 + 7e6 * 0.5e-6)
    assert cm.all_gather_ms(8e6, 8, summing) == pytest.approx(7e6 / 10e6)
    assert cm.all_reduce_ms(8e6, 8, summing) == pytest.approx(2 * 7e6 / 10e6 + 7e6 * 0.5e-6)


def test_table_wise_shard_by_hand():
    c = make_cluster(num_nodes=1, ranks_per_node=4, hbm_gb_per_s=1000.0, intra_node_gb_per_s=100.0)
    tr = TrainingSpec(batch_size_per_rank=1000, embedding_optimizer="sgd")
    t = TableSpec("t", 1000, 16, pooling_factor=2.0)
    model = AnalyticCostModel(c, tr)
    (opt,) = model.estimate([OptionRequest(t, ShardingType.TABLE_WISE, "fused", "hbm", tuple(shard_geometry(t, ShardingType.TABLE_WISE, 1)))])
    perf = opt.shards[0].perf
    lookups = 4000 * 2.0  # the global batch, two ids each, uniform over 1000 rows
    distinct = 1000 * (1 - (1 - 1 / 1000) ** lookups)  # each row drawn at least once
    assert perf.fwd_compute_ms == pytest.approx(distinct * 64 / 1e9, rel=1e-3)
    assert perf.bwd_compute_ms == pytest.approx(distinct * 2 * 64 / 1e9, rel=1e-3)
    ids = 3 / 4 * lookups * 8 / 100e6
    outputs = 3 / 4 * 4000 * 64 / 100e6
    assert perf.input_dist_ms == pytest.approx(ids)
    assert perf.fwd_comms_ms == pytest.approx(outputs)
    assert perf.bwd_comms_ms == pytest.approx(outputs)
    assert opt.shards[0].storage.hbm_bytes == 1000 * 16 * 4 + 2 * 4000 * 16 * 4


def test_row_wise_spreads_lookups_and_pays_reduce_scatter():
    c = make_cluster(num_nodes=1, ranks_per_node=4)
    tr = TrainingSpec(batch_size_per_rank=1000)
    t = TableSpec("t", 1000, 16)
    model = AnalyticCostModel(c, tr)
    tw, rw = model.estimate([
        OptionRequest(t, s, "fused", "hbm", tuple(shard_geometry(t, s, n)))
        for s, n in ((ShardingType.TABLE_WISE, 1), (ShardingType.ROW_WISE, 4))
    ])
    assert len(rw.shards) == 4
    assert rw.shards[0].perf.fwd_compute_ms == pytest.approx(tw.shards[0].perf.fwd_compute_ms / 4)
    assert rw.shards[0].storage.hbm_bytes < tw.shards[0].storage.hbm_bytes


def test_row_wise_sums_forward_gathers_backward_and_splits_its_ids():
    """On a CPU the forward reduce-scatter sums partial results and the backward all-gather does
    not; every rank splits its own ids of a row-wise table by row block before routing them."""
    t = TableSpec("t", 100_000, 16, pooling_factor=3.0)

    def rw_and_tw(**costs):
        model = AnalyticCostModel(make_cluster(num_nodes=1, ranks_per_node=4, **costs), TrainingSpec(batch_size_per_rank=1000))
        return model.estimate([OptionRequest(t, s, "fused", "hbm", tuple(shard_geometry(t, s, n)))
                               for s, n in ((ShardingType.ROW_WISE, 4), (ShardingType.TABLE_WISE, 1))])

    (rw, tw), (rw_cpu, tw_cpu) = rw_and_tw(), rw_and_tw(reduce_byte_ns=0.5, bucketize_id_ns=2.0)
    summed = 4000 * 16 * 4 * 3 / 4 * 0.5e-6  # the global batch's fp32 sums, 3/4 of them from the other ranks
    assert rw_cpu.shards[0].perf.fwd_comms_ms - rw.shards[0].perf.fwd_comms_ms == pytest.approx(summed)
    assert rw_cpu.shards[0].perf.bwd_comms_ms == pytest.approx(rw.shards[0].perf.bwd_comms_ms)
    assert rw_cpu.shards[0].perf.input_dist_ms - rw.shards[0].perf.input_dist_ms == pytest.approx(1000 * 3.0 * 2.0e-6)
    assert tw_cpu.shards[0].perf == tw.shards[0].perf


def test_lower_precision_cuts_comms_only():
    c = make_cluster()
    t = TableSpec("t", 1000, 64)
    req = OptionRequest(t, ShardingType.TABLE_WISE, "fused", "hbm", tuple(shard_geometry(t, ShardingType.TABLE_WISE, 1)))
    fp32 = AnalyticCostModel(c, TrainingSpec(512)).estimate([req])[0].shards[0].perf
    half = AnalyticCostModel(c, TrainingSpec(512, fwd_comm_precision="fp16", bwd_comm_precision="bf16")).estimate([req])[0].shards[0].perf
    assert half.compute_ms == fp32.compute_ms
    assert half.bwd_comms_ms == pytest.approx(fp32.bwd_comms_ms / 2)


def test_cache_miss_cost_moves_each_missed_row_in_and_a_victim_out():
    # 1e6 misses of 64 fp32 + 1 state value: 2 * 260 bytes each at 52 GB/s -> 10 ms, plus 2 * 1 us each
    assert cm.cache_miss_ms(1e6, 64, "rowwise_adagrad", 52.0, 1.0) == pytest.approx(10.0 + 2000.0)
    assert cache_rows(1000, 0.25) == 250 and cache_rows(3, 0.01) == 1 and cache_rows(0, 0.5) == 0


def test_a_cached_shard_counts_its_index_beside_its_rows_in_device_memory():
    model = AnalyticCostModel(make_cluster(ssd_bytes_per_node=10**12), TrainingSpec(1024))
    t = TableSpec("t", 10_000_000, 64, 4.0)
    g = tuple(shard_geometry(t, ShardingType.TABLE_WISE, 1))
    lru, lfu = (model.estimate([OptionRequest(t, ShardingType.TABLE_WISE, "key_value", "ssd", g, 0.1, 0.9, 0.5, policy)])[0]
                for policy in ("lru", "lfu"))
    rows_only = cm.shard_storage_bytes(1_000_000, 64, "rowwise_adagrad", 1024 * 4)
    # FBGEMM's cached TBE on a GPU: 16 bytes a slot and 4 a row; LFU counts per row, not per slot
    assert lru.shards[0].storage.hbm_bytes - rows_only == 16 * 1_000_000 + 4 * 10_000_000
    assert lfu.shards[0].storage.hbm_bytes - rows_only == 8 * 1_000_000 + 12 * 10_000_000


def test_a_cached_shard_trades_device_memory_for_miss_time():
    cluster = make_cluster(ssd_bytes_per_node=10**12, ssd_latency_us=50.0)
    model = AnalyticCostModel(cluster, TrainingSpec(1024))
    t = TableSpec("t", 10_000_000, 64, 4.0)
    g = tuple(shard_geometry(t, ShardingType.TABLE_WISE, 1))
    plain = model.estimate([OptionRequest(t, ShardingType.TABLE_WISE, "fused", "hbm", g)])[0]
    cached = [model.estimate([OptionRequest(t, ShardingType.TABLE_WISE, "key_value", "ssd", g, 0.1, hit, 0.5)])[0]
              for hit in (0.9, 0.5)]
    for c in cached:
        assert c.shards[0].storage.hbm_bytes < plain.shards[0].storage.hbm_bytes / 5
        assert c.shards[0].storage.ssd_bytes == cm.rows_bytes(10_000_000, 64, "rowwise_adagrad")
    # misses cost time in proportion to (1 - hit rate)
    lookups = 1024 * 4 * 4  # global batch x pooling (4 ranks)
    extra = [c.shards[0].perf.fwd_compute_ms - plain.shards[0].perf.fwd_compute_ms for c in cached]
    assert extra[0] == pytest.approx(cm.cache_miss_ms(lookups * 0.5 * 0.1, 64, "rowwise_adagrad", 5.0, 50.0))
    assert extra[1] == pytest.approx(5 * extra[0])


def _table_wise_and_row_wise(cluster, table):
    model = AnalyticCostModel(cluster, TrainingSpec(batch_size_per_rank=1000))
    tier = "ddr" if cluster.device == "cpu" else "hbm"
    requests = [OptionRequest(table, s, "fused", tier, tuple(shard_geometry(table, s, n)))
                for s, n in ((ShardingType.TABLE_WISE, 1), (ShardingType.ROW_WISE, cluster.world_size))]
    return model, requests, model.estimate(requests)


def test_a_host_all_to_all_puts_a_shards_collective_work_on_every_rank():
    """On CPUs a rank copies what it receives as it copies what it sends: of a table-wise shard's
    collective work (ids in, sums out, gradients back) half stays on its rank, the other half is
    shared by the W - 1 ranks that receive; the work adds up to what one rank paid before."""
    t = TableSpec("t", 100_000, 32, pooling_factor=3.0)
    model, requests, (tw, rw) = _table_wise_and_row_wise(make_cluster(ranks_per_node=4, device="cpu"), t)
    whole = model.shard_perf(requests[0], requests[0].geometries[0])
    own, every = tw.shards[0].perf, tw.every_rank
    for part in ("input_dist_ms", "fwd_comms_ms", "bwd_comms_ms"):
        assert getattr(every, part) == pytest.approx(getattr(whole, part) / 6)  # 1 / (2 (W - 1))
        assert getattr(own, part) == pytest.approx(getattr(whole, part) / 3)  # and (W - 2) / (2 (W - 1)) more
    assert own.compute_ms == whole.compute_ms and every.compute_ms == 0
    assert tw.ranks_sharing == 4 and tw.total_ms == pytest.approx(whole.total_ms)
    assert tw.max_shard_ms == pytest.approx(own.total_ms + every.total_ms)
    assert rw.every_rank_ms == 0 and rw.ranks_sharing == 0  # its reduce-scatter is every rank's already


def test_over_device_links_a_shards_collective_work_stays_on_its_rank():
    t = TableSpec("t", 100_000, 32, pooling_factor=3.0)
    model, requests, (tw, _) = _table_wise_and_row_wise(make_cluster(ranks_per_node=4), t)
    assert tw.shards[0].perf == model.shard_perf(requests[0], requests[0].geometries[0])
    assert tw.every_rank_ms == 0 and tw.ranks_sharing == 0


def test_a_column_split_table_costs_every_rank_its_permute_back_into_column_order():
    """TorchRec puts a column-split table's sums back in column order on every rank, for its own
    samples at the table's full width, forward and backward; one whole shard needs no permute."""
    t = TableSpec("t", 100_000, 64, pooling_factor=3.0)
    cluster = make_cluster(ranks_per_node=4, column_permute_value_ns=2.0)
    model = AnalyticCostModel(cluster, TrainingSpec(batch_size_per_rank=1000))
    split, whole = model.estimate([OptionRequest(t, ShardingType.COLUMN_WISE, "fused", "hbm", tuple(shard_geometry(t, ShardingType.COLUMN_WISE, n)))
                                   for n in (4, 1)])
    permute = 1000 * 64 * 2.0 / 1e6
    assert split.every_rank.fwd_comms_ms == pytest.approx(permute) and split.every_rank.bwd_comms_ms == pytest.approx(permute)
    assert split.every_rank.compute_ms == 0 and split.every_rank.input_dist_ms == 0
    assert split.ranks_sharing == 4 and split.max_shard_ms == pytest.approx(split.shard_ms.max() + 2 * permute)
    assert whole.every_rank_ms == 0 and whole.ranks_sharing == 0


def test_an_unpooled_table_sends_a_row_per_id_by_hand():
    """An EmbeddingCollection's table (pooled=False): 2 ranks of one node, 256 samples a rank, 8 ids
    a sample, dim 16 in fp32, link 100 GB/s, no fixed costs. Table-wise, its rank sends a row per
    id of the global batch: 512 x 8 x 16 x 4 = 262,144 bytes, half of it to the other rank:
    131,072 B / 100 GB/s = 0.00131072 ms, and the same back for the gradients. Row-wise on 2 ranks
    each block owns half the ids: half that. Pooled, the table sends a row per sample: 1/8 of it.
    Its buffers hold a row per id: 2 x 4,096 x 16 x 4 bytes beyond its rows."""
    from planner.cost.cost_model import AnalyticCostModel, OptionRequest, rows_bytes
    from planner.spec.specs import TableSpec, TrainingSpec
    from planner.spec.schemes import shard_geometry
    from planner.spec.types import ShardingType

    cluster = make_cluster(ranks_per_node=2, intra_node_gb_per_s=100.0)
    model = AnalyticCostModel(cluster, TrainingSpec(batch_size_per_rank=256))

    def option(pooled, st):
        table = TableSpec("t", 1000, 16, 8.0, pooled=pooled)
        geometries = tuple(shard_geometry(table, st, 1 if st is ShardingType.TABLE_WISE else 2))
        return model.estimate([OptionRequest(table=table, sharding_type=st, compute_kernel="fused", tier="hbm", geometries=geometries)])[0]

    tw = option(False, ShardingType.TABLE_WISE).shards[0].perf
    assert tw.fwd_comms_ms == pytest.approx(0.00131072) and tw.bwd_comms_ms == pytest.approx(0.00131072)
    rw = option(False, ShardingType.ROW_WISE).shards[0].perf
    assert rw.fwd_comms_ms == pytest.approx(0.00131072 / 2)
    assert option(True, ShardingType.TABLE_WISE).shards[0].perf.fwd_comms_ms == pytest.approx(0.00131072 / 8)
    storage = option(False, ShardingType.TABLE_WISE).shards[0].storage.hbm_bytes
    assert storage == rows_bytes(1000, 16, "rowwise_adagrad") + 2 * 4096 * 16 * 4


def test_a_table_read_by_two_features_sends_two_sums_a_sample_by_hand():
    """An EmbeddingBagCollection table shared by two features (outputs_per_sample=2): 2 ranks of
    one node, 256 samples a rank, dim 16 in fp32, link 100 GB/s, no fixed costs. Table-wise, its
    rank sends two sums per sample of the global batch: 512 x 2 x 16 x 4 = 65,536 bytes, half to
    the other rank: 32,768 B / 100 GB/s = 0.00032768 ms; its buffers hold two rows a sample."""
    from planner.cost.cost_model import AnalyticCostModel, OptionRequest, rows_bytes
    from planner.spec.specs import TableSpec, TrainingSpec
    from planner.spec.schemes import shard_geometry
    from planner.spec.types import ShardingType

    cluster = make_cluster(ranks_per_node=2, intra_node_gb_per_s=100.0)
    model = AnalyticCostModel(cluster, TrainingSpec(batch_size_per_rank=256))
    table = TableSpec("t", 1000, 16, 3.0, outputs_per_sample=2.0)
    option = model.estimate([OptionRequest(table, ShardingType.TABLE_WISE, "fused", "hbm",
                                           tuple(shard_geometry(table, ShardingType.TABLE_WISE, 1)))])[0]
    perf = option.shards[0].perf
    assert perf.fwd_comms_ms == pytest.approx(0.00032768) and perf.bwd_comms_ms == pytest.approx(0.00032768)
    assert option.shards[0].storage.hbm_bytes == rows_bytes(1000, 16, "rowwise_adagrad") + 2 * 1024 * 16 * 4
    with pytest.raises(ConfigError, match="unpooled table sends a row per id"):
        TableSpec("u", 1000, 16, 3.0, pooled=False, outputs_per_sample=2.0)


def test_an_unpooled_table_is_offered_only_what_torchrec_shards_it_with():
    from planner.spec.schemes import shard_counts
    from planner.spec.specs import TableSpec
    from planner.spec.types import ShardingType

    cluster = make_cluster(num_nodes=2, ranks_per_node=4)
    table = TableSpec("t", 10_000, 64, 4.0, pooled=False)
    assert shard_counts(table, ShardingType.TABLE_ROW_WISE, cluster) == [] == shard_counts(table, ShardingType.TABLE_COLUMN_WISE, cluster)
    assert shard_counts(table, ShardingType.ROW_WISE, cluster) == [8]
    assert shard_counts(TableSpec("p", 10_000, 64, 4.0), ShardingType.TABLE_ROW_WISE, cluster) == [4]

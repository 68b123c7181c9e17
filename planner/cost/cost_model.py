"""The planner's cost model: time per step and bytes per tier of every shard.

Each formula is written once, here, with its assumptions. Times are in milliseconds,
sizes in bytes, bandwidths in GB/s (1e9 bytes per second, one direction, per rank).

Notation: W ranks in all, L per node, b samples per rank, B = b * W samples per step,
p ids per sample (pooling factor), r and c the rows and columns a shard holds.

`CostModel` is the interface the solver consumes; `AnalyticCostModel` implements it from
a hardware profile. dlrm_scale.bridge.torchrec_cost implements it from TorchRec's estimators.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from operator import itemgetter
from typing import Iterable, Protocol, Sequence

from planner.spec.specs import OPTIMIZER_STATE, PRECISION_ELEMENT_BYTES, PRECISION_ROW_OVERHEAD_BYTES, ClusterSpec, TableSpec, TrainingSpec
from planner.spec.access_stats import TableAccess, zipf_unique_ids
from planner.spec.schemes import ALL_TO_ALL_SCHEMES, COLUMN_SCHEMES, NODE_ROW_SCHEMES, ROW_SCHEMES, cache_rows, cached_kernel_for, row_group
from planner.spec.types import Perf, ShardCost, ShardGeometry, ShardingOption, ShardingType, Storage

WEIGHT_BYTES = 4  # fp32 embedding weights
ID_BYTES = 8  # int64 ids in the input all-to-all


@dataclass(frozen=True)
class OptionRequest:
    """A sharding option to be costed: the table, scheme, kernel, tier and shard blocks.

    `tier` holds the rows. When `cache_fraction` < 1 that tier is slower than the device's,
    and a cache of that fraction of each shard's rows lives in the device tier, serving
    `hit_rate` of the rows a batch requests; `unique_ratio` is distinct rows per id.
    """

    table: TableSpec
    sharding_type: ShardingType
    compute_kernel: str
    tier: str
    geometries: tuple[ShardGeometry, ...]
    cache_fraction: float = 1.0
    hit_rate: float = 1.0
    unique_ratio: float = 1.0
    policy: str = "lru"  # the cache's replacement policy (its index's size depends on it)

    @property
    def cached(self) -> bool:
        return self.cache_fraction < 1.0


class CostModel(Protocol):
    """Anything that turns option requests into costed options, in the same order."""

    name: str

    def estimate(self, requests: Sequence[OptionRequest]) -> list[ShardingOption]: ...


def cached_request(table: TableSpec, sharding_type: ShardingType, geometries: tuple, tier: str, fraction: float,
                   access: TableAccess, policy: str) -> OptionRequest:
    """A cached option to cost: rows in `tier`, `fraction` of each shard's rows cached."""
    return OptionRequest(table, sharding_type, cached_kernel_for(tier), tier, geometries, cache_fraction=fraction,
                         hit_rate=access.curve(policy).at(fraction), unique_ratio=access.unique_ratio, policy=policy)


def transfer_ms(num_bytes: float, gb_per_s: float) -> float:
    """Time to move `num_bytes` at a sustained `gb_per_s`. Assumes the link is saturated."""
    return num_bytes / (gb_per_s * 1e6)


def row_comm_bytes(num_rows: float, cols: int, precision: str) -> float:
    """Bytes of `num_rows` embedding rows of width `cols` encoded at `precision`.

    Quantized codecs carry a per-row overhead (int8: fp32 scale and bias; fp8: one scale).
    """
    return num_rows * (cols * PRECISION_ELEMENT_BYTES[precision] + PRECISION_ROW_OVERHEAD_BYTES[precision])


def optimizer_state_bytes(rows: int, cols: int, optimizer: str) -> int:
    """Optimizer state of a block of rows x cols, in fp32 (see specs.OPTIMIZER_STATE)."""
    per_weight, per_row = OPTIMIZER_STATE[optimizer]
    return 4 * (per_weight * rows * cols + per_row * rows)


def lookup_fwd_ms(num_lookups: float, distinct_rows: float, cols: int, tier_gb_per_s: float, launch_ms: float,
                  per_id_ns: float = 0.0, per_weight_ns: float = 0.0) -> float:
    """Forward pooled lookup: each id adds one row of `cols` fp32 weights into its sample's sum.

    Assumes the kernel is bound by the tier's bandwidth for each distinct row of the batch (a
    repeated row is served by the processor's caches, and skewed ids repeat often), plus a
    fixed cost per id (index handling), a cost per weight of each id's row (the adds: on a CPU
    they, not the bytes, bound the many ids whose rows are cached) and a fixed launch cost per
    shard.
    """
    return (transfer_ms(distinct_rows * cols * WEIGHT_BYTES, tier_gb_per_s) + num_lookups * (per_id_ns + cols * per_weight_ns) * 1e-6
            + launch_ms)


def lookup_bwd_ms(num_lookups: float, distinct_rows: float, cols: int, optimizer: str, tier_gb_per_s: float,
                  launch_ms: float, per_id_ns: float = 0.0, per_row_ns: float = 0.0, per_weight_ns: float = 0.0) -> float:
    """Backward with the optimizer fused in, as exact kernels (FBGEMM's, ours) run it: the ids
    sorted and merged by row (a fixed cost per id), each id's gradient row added into its
    table row's (a cost per weight), then each distinct row and its optimizer state read and
    written once, with the optimizer's math (a fixed cost per row), plus a fixed launch cost
    per shard.
    """
    bytes_touched = distinct_rows * 2 * (cols * WEIGHT_BYTES + optimizer_state_bytes(1, cols, optimizer))
    return (transfer_ms(bytes_touched, tier_gb_per_s) + num_lookups * (per_id_ns + cols * per_weight_ns) * 1e-6
            + distinct_rows * per_row_ns * 1e-6 + launch_ms)


def distinct_rows_per_step(table: TableSpec, num_ids: float, shards_sharing: int = 1) -> float:
    """Distinct rows among the `num_ids` of one step's batch that reach a table, split evenly
    over `shards_sharing` row blocks (ids are hashed, so hot rows are spread). Assumes the
    table's Zipf law (uniform when none is given) and independent draws."""
    return zipf_unique_ids(table.num_embeddings, float(table.zipf_exponent or 0.0), float(num_ids)) / shards_sharing


def cache_miss_ms(misses: float, cols: int, optimizer: str, tier_gb_per_s: float, latency_us: float) -> float:
    """Moving the rows a batch misses between the backing tier and the cache.

    Each miss reads its row and optimizer state from the backing tier and evicts one cached
    row; training dirties every row it looks up, so the victim is written back. Two moves
    per miss, at the tier's bandwidth plus its per-row latency (amortised over the parallel
    requests the tier serves). Assumes nothing of the move overlaps the step's compute.
    """
    row_bytes = cols * WEIGHT_BYTES + optimizer_state_bytes(1, cols, optimizer)
    return transfer_ms(2 * misses * row_bytes, tier_gb_per_s) + 2 * misses * latency_us * 1e-3


def cache_lookup_ms(num_lookups: float, per_id_ns: float) -> float:
    """Finding every id of a cached shard in its cache (deduplicating the batch, mapping rows
    to slots), hit or miss: a fixed cost per id. Nearly free inside FBGEMM's GPU kernels, a
    host-side pass over the ids on a CPU."""
    return num_lookups * per_id_ns * 1e-6


def dense_update_ms(rows: int, cols: int, optimizer: str, tier_gb_per_s: float, per_weight_ns: float = 0.0) -> float:
    """The dense side of a data-parallel replica: its gradient copied into DDP's buckets and
    the dense optimizer's step, every row and its state read and written, plus a fixed cost
    per weight (on a CPU the unfused optimizer's several passes over a dense gradient
    dominate)."""
    moved = 2 * (rows * cols * WEIGHT_BYTES + optimizer_state_bytes(rows, cols, optimizer))
    return transfer_ms(moved, tier_gb_per_s) + rows * cols * per_weight_ns * 1e-6


def replica_update_ms(rows: int, cols: int, optimizer: str, cluster: ClusterSpec) -> float:
    """A replicated table's update with the dense optimizer, in host memory or HBM: its weights
    (dense_update_ms), and a fixed cost per table (the optimizer's and DDP's work per parameter
    tensor, and the lookup module DDP wraps), large on a CPU."""
    per_weight = dense_update_ms(rows, cols, optimizer, cluster.costs.tier_gb_per_s(cluster.device_tier), cluster.costs.dense_update_ns)
    return per_weight + cluster.costs.replica_table_ms


def dense_gradient_ms(rows: int, cols: int, per_weight_ns: float) -> float:
    """A replica's backward builds a dense gradient of its whole table (zeroed, the lookups'
    gradients added in): a fixed cost per weight, whatever the batch touched."""
    return rows * cols * per_weight_ns * 1e-6


def all_to_all_ms(bytes_out: float, cluster: ClusterSpec) -> float:
    """All-to-all where one rank sends `bytes_out` spread evenly over all W ranks.

    The (L-1)/W share for the node's other ranks crosses the intra-node link, the (W-L)/W
    share the inter-node link; both links work at once, so the slower one sets the time.
    The 1/W share for the rank itself is free. TorchRec sends all of a rank's shards in one
    collective per step and sharding type, so a shard pays bandwidth only; the collective's
    latency (collective_latency_ms) is paid per type, by the step (sharding_types_ms).
    """
    world, local = cluster.world_size, cluster.ranks_per_node
    intra = transfer_ms(bytes_out * (local - 1) / world, cluster.costs.intra_node_gb_per_s)
    inter = transfer_ms(bytes_out * (world - local) / world, cluster.costs.inter_node_gb_per_s)
    return max(intra, inter)


def exchange_shares(cluster: ClusterSpec) -> tuple[float, float]:
    """How an all-to-all shard's collective work (its ids in, its sums out, their gradients back)
    falls on the ranks: (the share on its own rank, the share on every rank, its own included).

    Over links that send and receive at once (NVLink, InfiniBand: a GPU cluster), a rank's time
    follows what it sends, so all of it falls on the shard's rank: (1, 0). On a host (gloo on
    CPUs) a rank copies what it receives as it copies what it sends, and the collective ends on
    all ranks together; half the work is the shard's rank's (the (W-1)/W it sends), half the
    other W-1 ranks' (the 1/W each receives): every rank 1/(2(W-1)), its own (W-2)/(2(W-1))
    more. On 2 ranks that is half on each, wherever the shard is; measured side by side there
    (benchmarks/regret_paired.py, mix5, 12 tables of one dim), a plan with 8 and 4 tables on its
    ranks took 6.4 and 6.2 ms in the forward all-to-all, one with 6 and 6 took 6.1 and 6.3.
    """
    world = cluster.world_size
    if cluster.device != "cpu" or world < 2:
        return 1.0, 0.0
    every = 1.0 / (2 * (world - 1))
    return (world - 2) * every, every


def input_distribution_ms(num_ids: float, cluster: ClusterSpec, bucketized_ids: float = 0.0) -> float:
    """Routing a shard's ids to it: the int64 ids over the all-to-all, plus host-side work per
    id (splitting, permuting and copying the jagged ids; small on a GPU, large on a CPU) and
    the shard's part of the collective's host work (shard_comm_ms). A row-wise table's ids are
    first split by row block where they are read (`bucketized_ids` of them on this rank)."""
    return (all_to_all_ms(num_ids * ID_BYTES, cluster) + num_ids * cluster.costs.input_id_ns * 1e-6
            + bucketized_ids * cluster.costs.bucketize_id_ns * 1e-6 + shard_comm_ms(0.0, cluster))


def _type_names(sharding_types: Iterable) -> set[str]:
    return {str(getattr(t, "value", t)) for t in sharding_types}


def embedding_collectives(sharding_types: Iterable) -> int:
    """How many times each embedding collective (input distribution, pooled forward, pooled
    backward) runs per step: once per sharding type with a table in the plan. TorchRec batches
    a type's tables into one input and one output distribution, but keeps a separate pair per
    type (ShardedEmbeddingBagCollection's dists), so each further type pays the collectives'
    fixed cost (collective_ms) again on every rank. Replicated tables have none."""
    return len(_type_names(sharding_types) - {ShardingType.DATA_PARALLEL.value})


def replica_all_reduces(sharding_types: Iterable) -> int:
    """All-reduces a step runs beyond the dense layers' one: TorchRec wraps the replicated
    tables' lookups in a DDP of their own, so one more wherever a table is replicated."""
    return int(ShardingType.DATA_PARALLEL.value in _type_names(sharding_types))


def collective_ms(peers: int, cluster: ClusterSpec) -> float:
    """One collective's fixed cost, beyond its bytes: launching and synchronising it
    (collective_latency_ms), and a latency per further rank it exchanges with
    (collective_peer_us): an all-to-all sends each a message of its own, a ring takes a step per
    rank. Small next to the bytes on a node; at thousands of ranks each message carries little
    and the second term dominates, which is what 2D sparse parallelism shortens."""
    return cluster.costs.collective_latency_ms + peers * cluster.costs.collective_peer_us * 1e-3


def output_peers(sharding_type: str, cluster: ClusterSpec) -> int:
    """The ranks a rank exchanges with in a type's pooled forward (and its backward): every
    other rank, but under the node-row schemes the node's (its reduce-scatter) and one on each
    other node (its all-to-all among the ranks of the same local index)."""
    if sharding_type in NODE_ROW_SCHEMES:
        return (cluster.ranks_per_node - 1) + (cluster.num_nodes - 1)
    return cluster.world_size - 1


def embedding_collectives_ms(sharding_types: Iterable, cluster: ClusterSpec) -> tuple[float, float, float]:
    """The fixed cost of the embedding collectives a plan's sharding types run, per step: (input
    distribution, pooled forward, pooled backward). Ids go to their shards over every rank."""
    types = _type_names(sharding_types) - {ShardingType.DATA_PARALLEL.value}
    ids = embedding_collectives(types) * collective_ms(cluster.world_size - 1, cluster)
    out = sum(collective_ms(output_peers(t, cluster), cluster) for t in types)
    return ids, out, out


def sharding_types_ms(sharding_types: Iterable, cluster: ClusterSpec) -> float:
    """Every rank's fixed cost of the collectives a plan's sharding types run: the three
    embedding collectives per sharded type, and the replicas' own all-reduce (a fixed cost
    only: DDP's all-reduce is a tree at scale, not a message per rank)."""
    types = _type_names(sharding_types)
    return sum(embedding_collectives_ms(types, cluster)) + replica_all_reduces(types) * cluster.costs.collective_latency_ms


def shard_comm_ms(num_bytes: float, cluster: ClusterSpec) -> float:
    """Host work a shard adds to an embedding collective it joins, beyond the link: a fixed
    part (its feature's splits and permutes; many small shards pay more than few large ones)
    and a part per byte it puts in or takes out (copies into and out of the batched buffer,
    the whole shard's output, not only what crosses the link)."""
    return cluster.costs.comm_shard_ms + num_bytes * cluster.costs.comm_byte_ns * 1e-6


def ring_link_gb_per_s(group_size: int, cluster: ClusterSpec) -> float:
    """Bandwidth of a ring over a group of ranks: the inter-node link once it spans nodes."""
    return cluster.costs.intra_node_gb_per_s if group_size <= cluster.ranks_per_node else cluster.costs.inter_node_gb_per_s


def all_gather_ms(bytes_out: float, group_size: int, cluster: ClusterSpec) -> float:
    """Ring all-gather of `bytes_out` per rank over a group (a row-wise table's backward: the
    mirror of its forward reduce-scatter). Each rank sends (g-1)/g of the buffer over the ring's
    slowest link; latency as for the all-to-all (per step and sharding type, not per shard)."""
    if group_size == 1:
        return 0.0
    return transfer_ms(bytes_out * (group_size - 1) / group_size, ring_link_gb_per_s(group_size, cluster))


def reduction_ms(bytes_in: float, group_size: int, cluster: ClusterSpec) -> float:
    """Summing the (g-1)/g of a buffer that a ring reduction receives from the other ranks: on a
    GPU inside the collective's kernel (reduce_byte_ns 0), on a CPU by the host, per byte."""
    return bytes_in * (group_size - 1) / group_size * cluster.costs.reduce_byte_ns * 1e-6 if group_size > 1 else 0.0


def reduce_scatter_ms(bytes_in: float, group_size: int, cluster: ClusterSpec) -> float:
    """Ring reduce-scatter of `bytes_in` per rank over a group: the all-gather's traffic, plus
    summing what arrives."""
    return all_gather_ms(bytes_in, group_size, cluster) + reduction_ms(bytes_in, group_size, cluster)


def all_reduce_ms(num_bytes: float, group_size: int, cluster: ClusterSpec) -> float:
    """Ring all-reduce: a reduce-scatter then an all-gather, 2(g-1)/g of the buffer per rank
    (DDP buckets every replica's gradient into few collectives per step)."""
    return reduce_scatter_ms(num_bytes, group_size, cluster) + all_gather_ms(num_bytes, group_size, cluster)


def hidden_all_reduce_ms(replica_all_reduce_ms: float, sharded_backward_ms: Sequence[float]) -> float:
    """What of the replicas' gradient all-reduce a step hides behind the sharded tables' backward.

    TorchRec's replicas have a DDP of their own, which launches their all-reduce as soon as their
    gradients exist, early in the backward; the collective then runs on the communication
    library's thread (a GPU's stream) while each rank computes its sharded lookups' backward. It
    ends at once on every rank, so the step hides it up to the busiest rank's sharded backward.
    Assumes full overlap (on a CPU gloo's thread shares the rank's cores; the fit's constants
    absorb that). On the Intel benchmark machine, a rank with 8.8 ms of table-wise backward
    beside 3 replicas measured 6.0-6.4 ms of all-reduce left to wait for: 7.8 predicted with
    this, 12.9 without. dlrm_scale.tools.simulate and the fit price it; the planner's solver does
    not (it would need a min() over ranks in its model), so it overprices a replica beside an
    unbalanced sharded backward, by at most that replica's all-reduce: under 1 ms in its own
    plans there."""
    return min(replica_all_reduce_ms, max(sharded_backward_ms, default=0.0))


def dense_compute_ms(flops: float, gflops: float) -> float:
    """Dense MLP work of a step at a sustained `gflops`. Assumes GEMM-bound layers."""
    return flops / (gflops * 1e6) if gflops > 0 else 0.0


def value_passes_ms(values: float, per_value_ns: float) -> float:
    """Memory-bound passes over `values` fp32 values (copies, splits, permutes): neither FLOPs nor a
    link's bytes bound them, so each kind is priced per value it moves, forward and backward:
    - the interaction's input (the dense vector and each pooled embedding, features x dim per
      sample; interaction_value_ns): stacking them and splitting their gradient back. FLOPs alone
      priced a 24-table dim-256 model's dense phase 31% short on the Intel benchmark machine,
      an 80-table dim-16 one 18% long;
    - the pooled embeddings a rank regroups for the dense part (every table's, for its samples;
      pooled_value_ns): the collectives deliver them by sharding type and rank, and TorchRec's
      SparseArch splits them per feature and concatenates them in the model's order. Every plan
      pays the same, but not in proportion to its collectives' bytes (a row-wise plan sends each
      table's sums twice, a replica none), so it is priced apart from them;
    - a column-split table's pooled sums put back in column order (column_permute)."""
    return values * per_value_ns * 1e-6


def column_permute(table: TableSpec, cluster: ClusterSpec, training: TrainingSpec) -> Perf:
    """What a table split by columns adds to every rank's collectives: the pooled sums arrive
    rank by rank, so TorchRec permutes them back into the table's column order (its output
    all-to-all's callback), each rank its own samples' full width, and their gradient back."""
    ms = value_passes_ms(training.batch_size_per_rank * table.outputs_per_sample * table.embedding_dim, cluster.costs.column_permute_value_ns)
    return Perf(fwd_comms_ms=ms, bwd_comms_ms=ms)


def dense_overhead_ms(cluster: ClusterSpec) -> float:
    """Fixed time per step of the dense layers beyond their FLOPs: launching each layer's
    forward and backward and the optimizer's passes (the larger part for small MLPs on a CPU)."""
    return cluster.costs.dense_overhead_ms


def host_overhead_ms(num_tables: int, cluster: ClusterSpec) -> float:
    """Per-step host work outside kernels and collectives (Python, input splitting, optimizer
    bookkeeping): a fixed part and a part per table. The same for every plan of a model."""
    return cluster.costs.step_overhead_ms + num_tables * cluster.costs.table_overhead_ms


def rows_bytes(rows: int, cols: int, optimizer: str) -> int:
    """Bytes of a block of fp32 weights and their optimizer state."""
    return rows * cols * WEIGHT_BYTES + optimizer_state_bytes(rows, cols, optimizer)


CPU_SSD_LOG_RECORDS_PER_ROW = 1  # dlrm_scale.tiering.store's log holds as many records as its shard has rows


def slow_tier_bytes(rows: int, cols: int, optimizer: str, tier: str, device: str) -> int:
    """Bytes a cached shard's rows take in their slower tier. On CPU the SSD store is a base
    file of every row plus an append-only log of written-back rows that grows to
    CPU_SSD_LOG_RECORDS_PER_ROW records a row before it is folded back (dlrm_scale.tiering.store),
    so its files take twice the rows' bytes once the log has filled. Elsewhere (DDR, FBGEMM's
    stores on a GPU) the rows' bytes."""
    log_records = CPU_SSD_LOG_RECORDS_PER_ROW if tier == "ssd" and device == "cpu" else 0
    return rows_bytes(rows, cols, optimizer) * (1 + log_records)


def cache_index_bytes(rows: int, slots: int, policy: str, tier: str, device: str) -> int:
    """Device-tier bytes a cached shard's bookkeeping takes beside its cached rows, for a shard
    of `rows` with a cache of `slots`.

    CPU (dlrm_scale.tiering): per slot an int32 tag, an int32 clock and a dirty flag; LFU adds
    a uint8 count per slot and per row; rows kept in a file add their int32 log location.
    GPU (FBGEMM's cached TBE, as its own memory report counts it): per slot an int64 cache
    state and an int64 LRU clock, per row an int32 table map; LFU keeps its int64 count per
    row instead of per slot. Assumes no prefetch pipeline (its int32 lock count per slot), and
    takes FBGEMM's SSD TBE to keep as much.
    """
    lfu = policy == "lfu"
    if device == "cuda":
        return slots * (8 + (0 if lfu else 8)) + rows * (4 + (8 if lfu else 0))
    return slots * (9 + (1 if lfu else 0)) + rows * ((4 if tier == "ssd" else 0) + (1 if lfu else 0))


def shard_storage_bytes(rows: int, cols: int, optimizer: str, outputs: int) -> int:
    """Bytes a shard holds in the tier it computes from: its rows (or its cache's rows), and
    its output and gradient buffers for the `outputs` it serves per step (a pooled table's
    samples, an unpooled one's ids)."""
    return rows_bytes(rows, cols, optimizer) + 2 * outputs * cols * WEIGHT_BYTES


_ROWS_COLS = itemgetter(2, 3)  # a ShardGeometry's (rows, cols)


class AnalyticCostModel:
    """Costs from the formulas above and the constants of a hardware profile."""

    name = "ours"

    def __init__(self, cluster: ClusterSpec, training: TrainingSpec) -> None:
        self.cluster = cluster
        self.training = training

    def estimate(self, requests: Sequence[OptionRequest]) -> list[ShardingOption]:
        options = []
        own_share, every_share = exchange_shares(self.cluster)
        for req in requests:
            split = req.sharding_type in ALL_TO_ALL_SCHEMES and every_share > 0
            # RW and DP repeat one block shape on many ranks: each shape costed once (on its first
            # block), every rank's part of its collectives counted once per block of the shape
            shapes = list(map(_ROWS_COLS, req.geometries))
            first = dict(zip(reversed(shapes), reversed(req.geometries)))
            counts = Counter(shapes)
            cost: dict[tuple[int, int], ShardCost] = {}
            shared = Perf()
            for key, g in first.items():
                perf = self.shard_perf(req, g)
                own = perf + perf.comms_scaled(own_share - 1.0) if split else perf
                cost[key] = ShardCost(own, self.shard_storage(req, g))
                if split:
                    shared = shared + perf.comms_scaled(every_share * counts[key])
            shards = list(map(cost.__getitem__, shapes))
            if req.sharding_type in COLUMN_SCHEMES and len(req.geometries) > 1:
                shared = shared + column_permute(req.table, self.cluster, self.training)
            options.append(
                ShardingOption(req.table.name, req.sharding_type, req.compute_kernel, req.tier, req.geometries,
                               tuple(shards), req.cache_fraction, shared, self.cluster.world_size if shared.total_ms else 0)
            )
        return options

    def shard_perf(self, req: OptionRequest, g: ShardGeometry) -> Perf:
        cl, tr, table = self.cluster, self.training, req.table
        world, local = cl.world_size, cl.ranks_per_node
        local_batch = tr.batch_size_per_rank
        global_batch = local_batch * world
        pooling = table.pooling_factor
        bw = cl.costs.tier_gb_per_s(cl.device_tier if req.cached else req.tier)
        launch = cl.costs.kernel_launch_ms
        opt = tr.embedding_optimizer
        fwd_p, bwd_p = tr.fwd_comm_precision, tr.bwd_comm_precision
        st = req.sharding_type
        group = row_group(st, world, local)
        batch_ids = (local_batch if st is ShardingType.DATA_PARALLEL else global_batch) * pooling
        if g.rows == 0:  # an empty trailing row block still joins the collectives
            lookups = distinct = 0.0
        else:  # row blocks share the ids evenly
            lookups, distinct = batch_ids / group, distinct_rows_per_step(table, batch_ids, group)

        fwd_compute = lookup_fwd_ms(lookups, distinct, g.cols, bw, launch, cl.costs.lookup_fwd_ns, cl.costs.lookup_fwd_weight_ns)
        if req.cached:  # rows are made resident before the lookup
            misses = lookups * req.unique_ratio * (1.0 - req.hit_rate)
            fwd_compute += cache_miss_ms(misses, g.cols, opt, cl.costs.tier_gb_per_s(req.tier), cl.costs.tier_latency_us(req.tier))
            fwd_compute += cache_lookup_ms(lookups, cl.costs.cache_id_ns)
        bwd_compute = lookup_bwd_ms(lookups, distinct, g.cols, opt, bw, launch, cl.costs.lookup_bwd_ns, cl.costs.lookup_bwd_row_ns,
                                    cl.costs.lookup_bwd_weight_ns)
        if st is ShardingType.DATA_PARALLEL:
            bwd_compute += dense_gradient_ms(g.rows, g.cols, cl.costs.dense_grad_ns)
            bwd_compute += replica_update_ms(g.rows, g.cols, opt, cl)
            grad_bytes = row_comm_bytes(g.rows, g.cols, bwd_p)
            return Perf(fwd_compute, 0.0, bwd_compute, all_reduce_ms(grad_bytes, world, cl))

        row_blocks = st in ROW_SCHEMES
        # every rank splits its own samples' ids of a row-wise table by row block
        ids_in = input_distribution_ms(lookups, cl, local_batch * pooling if row_blocks else 0.0)
        if not table.pooled:  # a row out per id looked up, sent back to its sample's rank: an all-to-all for every scheme
            out_fwd, out_bwd = row_comm_bytes(lookups, g.cols, fwd_p), row_comm_bytes(lookups, g.cols, bwd_p)
            return Perf(fwd_compute, all_to_all_ms(out_fwd, cl) + shard_comm_ms(out_fwd, cl), bwd_compute,
                        all_to_all_ms(out_bwd, cl) + shard_comm_ms(out_bwd, cl), ids_in)
        # every scheme's shard puts its pooled sums for the global batch into the collective
        sums = global_batch * table.outputs_per_sample
        out_fwd, out_bwd = row_comm_bytes(sums, g.cols, fwd_p), row_comm_bytes(sums, g.cols, bwd_p)
        if row_blocks:  # partial sums reduce-scattered forward; the backward all-gathers gradients
            fwd = reduce_scatter_ms(out_fwd, group, cl)
            bwd = all_gather_ms(out_bwd, group, cl)
            if st in NODE_ROW_SCHEMES:  # then each rank's 1/L of the node's sums goes out
                fwd += all_to_all_ms(row_comm_bytes(sums / local, g.cols, fwd_p), cl)
                bwd += all_to_all_ms(row_comm_bytes(sums / local, g.cols, bwd_p), cl)
        else:
            fwd = all_to_all_ms(out_fwd, cl)
            bwd = all_to_all_ms(out_bwd, cl)
        return Perf(fwd_compute, fwd + shard_comm_ms(out_fwd, cl), bwd_compute, bwd + shard_comm_ms(out_bwd, cl), ids_in)

    def shard_storage(self, req: OptionRequest, g: ShardGeometry) -> Storage:
        samples = self.training.batch_size_per_rank * (
            1 if req.sharding_type is ShardingType.DATA_PARALLEL else self.cluster.world_size
        )
        # its buffers hold a row per id (unpooled) or per pooled sum
        samples = math.ceil(samples * (req.table.outputs_per_sample if req.table.pooled else req.table.pooling_factor))
        opt = self.training.embedding_optimizer
        if not req.cached:
            return Storage(**{f"{req.tier}_bytes": shard_storage_bytes(g.rows, g.cols, opt, samples)})
        slots = cache_rows(g.rows, req.cache_fraction)
        fast = shard_storage_bytes(slots, g.cols, opt, samples) + cache_index_bytes(g.rows, slots, req.policy, req.tier, self.cluster.device)
        slow = slow_tier_bytes(g.rows, g.cols, opt, req.tier, self.cluster.device)
        return Storage(**{f"{self.cluster.device_tier}_bytes": fast}) + Storage(**{f"{req.tier}_bytes": slow})

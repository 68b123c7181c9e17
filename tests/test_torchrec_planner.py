"""dlrm_scale.EmbeddingShardingPlanner on one process: what it reads from a module, its sharders,
TorchRec's Topology and ParameterConstraints, and what it refuses (one line, before DMP)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection, EmbeddingConfig
from torchrec.distributed.embedding import EmbeddingCollectionSharder
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner.types import ParameterConstraints, Topology
from torchrec.distributed.types import BoundsCheckMode, CacheAlgorithm, CacheParams, KeyValueParams
from torchrec.modules.embedding_configs import DataType
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

from dlrm_scale import EmbeddingShardingPlanner
from dlrm_scale.bridge import parameter_constraints as pcs
from dlrm_scale.bridge.qcomms import qcomm_codecs_registry
from dlrm_scale import WideEmbeddingBagCollectionSharder
from dlrm_scale.bridge.sharders import sharder_for
from planner.cost.cost_model import AnalyticCostModel
from planner.search.candidates import enumerate_options
from planner.spec.errors import ConfigError

META = torch.device("meta")
SHARDERS = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


def bags(*tables, weighted=False):
    return EmbeddingBagCollection(tables=[EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f, **kw)
                                          for n, r, d, f, *rest in tables for kw in [rest[0] if rest else {}]],
                                  is_weighted=weighted, device=META)


def sequences(*tables):
    return EmbeddingCollection(tables=[EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=f) for n, r, d, f in tables],
                               device=META)


class Model(nn.Module):
    """EBC tables (one read by two features) and an EC table nested two levels down."""

    def __init__(self) -> None:
        super().__init__()
        self.sparse = bags(("user", 200_000, 64, ["user_id"]), ("geo", 5_000, 32, ["country", "city"]))
        self.towers = nn.ModuleDict({"seq": nn.Sequential(sequences(("history", 100_000, 64, ["hist"])))})
        self.dense = nn.Linear(8, 8)


def cpu(world=2, local=None, **kw):
    return Topology(world_size=world, compute_device="cpu", local_world_size=local or world, **kw)


def cuda(world=8, **kw):
    return Topology(world_size=world, compute_device="cuda", local_world_size=min(world, 8), **kw)


def problem_of(planner, module=None, sharders=SHARDERS):
    return planner.problem(module or Model(), sharders)[0]


def options_of(problem, table):
    return enumerate_options(problem, AnalyticCostModel(problem.cluster, problem.training))[table]


def test_tables_are_read_from_every_collection_wherever_it_is_nested():
    planner = EmbeddingShardingPlanner(topology=cpu(), batch_size=128)
    plan = planner.plan(Model(), SHARDERS)
    assert set(plan.plan) == {"sparse", "towers.seq.0"}
    assert set(plan.plan["sparse"]) == {"user", "geo"} and set(plan.plan["towers.seq.0"]) == {"history"}
    tables = planner.problem(Model(), SHARDERS)[0].tables_by_name
    assert (tables["geo"].pooling_factor, tables["geo"].outputs_per_sample) == (2.0, 2.0)  # one id and one sum per feature
    assert not tables["history"].pooled and tables["user"].pooled
    assert planner.last_plan.tables["user"].num_embeddings == 200_000 and planner.last_plan.step_gap is not None


def test_only_what_the_sharders_run_is_planned():
    """TorchRec's CPU EBC sharder has no row-wise schemes (its EC sharder has row_wise): none is
    offered to an EBC table; our widened sharder gets them back."""
    planner = EmbeddingShardingPlanner(topology=cpu(), batch_size=128)
    stock = problem_of(planner)
    offered = {o.sharding_type.value for o in options_of(stock, "user")}
    assert {"data_parallel", "table_wise", "column_wise"} <= offered <= {"data_parallel", "table_wise", "column_wise", "table_column_wise"}
    assert "row_wise" in {o.sharding_type.value for o in options_of(stock, "history")}
    assert all(o.compute_kernel in ("dense", "fused") for o in options_of(stock, "user"))
    wide = problem_of(planner, sharders=[WideEmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()])
    assert "row_wise" in {o.sharding_type.value for o in options_of(wide, "user")}


def test_the_sharders_comm_precisions_price_the_plan():
    planner = EmbeddingShardingPlanner(topology=cpu(), batch_size=128)
    sequence = EmbeddingCollectionSharder(qcomm_codecs_registry=qcomm_codecs_registry("fp16", "bf16", [64]))
    training = problem_of(planner, sharders=[sharder_for("fp16", "bf16"), sequence]).training
    assert (training.fwd_comm_precision, training.bwd_comm_precision) == ("fp16", "bf16")
    with pytest.raises(ConfigError, match="sends fp32/fp32 but .* fp16/bf16; dlrm-scale prices one pair of comm precisions"):
        problem_of(planner, sharders=[sharder_for("fp16", "bf16"), EmbeddingCollectionSharder()])


def test_the_optimizer_is_read_from_apply_optimizer_in_backward():
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    model = Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse.parameters(), {"lr": 0.1})
    apply_optimizer_in_backward(torch.optim.SGD, model.towers.parameters(), {"lr": 0.1})
    assert problem_of(EmbeddingShardingPlanner(topology=cpu()), model).training.embedding_optimizer == "sgd"
    model = Model()
    apply_optimizer_in_backward(torch.optim.SGD, model.sparse.parameters(), {"lr": 0.1})
    apply_optimizer_in_backward(RowWiseAdagrad, model.towers.parameters(), {"lr": 0.1})
    with pytest.raises(ConfigError, match="trains with .* but .* with"):
        problem_of(EmbeddingShardingPlanner(topology=cpu()), model)


# ---- Topology ---------------------------------------------------------------------------------
def test_the_topology_gives_shape_and_capacities_and_the_bandwidths_it_sets():
    planner = EmbeddingShardingPlanner(topology=cuda(16, hbm_cap=20 * 1024**3, ddr_cap=64 * 1024**3, intra_host_bw=100e6))
    cluster = problem_of(planner).cluster
    assert (cluster.num_nodes, cluster.ranks_per_node, cluster.device) == (2, 8, "cuda")
    assert cluster.hbm_bytes_per_rank == 20 * 1024**3 and cluster.ddr_bytes_per_node == 8 * 64 * 1024**3
    assert cluster.costs.intra_node_gb_per_s == pytest.approx(100.0)  # set: 100e6 bytes/ms
    profile = problem_of(EmbeddingShardingPlanner(topology=cuda(16))).cluster.costs
    assert cluster.costs.inter_node_gb_per_s == profile.inter_node_gb_per_s  # TorchRec's default: the profile's


@pytest.mark.parametrize("topology, hardware, line", [
    (lambda: cpu(bwd_compute_multiplier=3.0), None, "topology: bwd_compute_multiplier tunes TorchRec's estimator"),
    (lambda: cpu(pod_size=2, world=4, local=2), None, "topology: pod_size 2 groups hosts"),
    (lambda: cuda(8), "cpu_gloo", "hardware profile 'cpu_gloo' prices a cpu cluster but the topology's compute_device is cuda"),
])
def test_a_topology_we_cannot_plan_is_refused(topology, hardware, line):
    with pytest.raises(ConfigError) as e:
        problem_of(EmbeddingShardingPlanner(topology=topology(), hardware=hardware))
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_ranks_of_different_sizes_are_refused():
    from torchrec.distributed.planner.types import CustomTopologyData

    topology = cuda(2, custom_topology_data=CustomTopologyData({"hbm_cap": [10 * 1024**3, 20 * 1024**3]}, world_size=2))
    with pytest.raises(ConfigError, match=r"topology: hbm_cap differs between ranks \(10 GiB, 20 GiB\)"):
        problem_of(EmbeddingShardingPlanner(topology=topology))


# ---- ParameterConstraints: every field honoured or refused ---------------------------------------
def plan_with(constraints, topology=None, sharders=SHARDERS, module=None, **kw):
    planner = EmbeddingShardingPlanner(topology=topology or cpu(4), batch_size=128, constraints=constraints, **kw)
    return planner, planner.plan(module or Model(), sharders)


def test_sharding_types_and_compute_kernels_are_honoured():
    planner, plan = plan_with({"history": ParameterConstraints(sharding_types=["row_wise"]),
                               "geo": ParameterConstraints(compute_kernels=["dense"])})
    assert plan.plan["towers.seq.0"]["history"].sharding_type == "row_wise"
    assert plan.plan["sparse"]["geo"].sharding_type == "data_parallel"


def test_min_partition_keeps_column_shards_that_wide():
    problem = problem_of(EmbeddingShardingPlanner(topology=cpu(4), constraints={"user": ParameterConstraints(min_partition=32)}))
    widths = {g.cols for o in options_of(problem, "user") if o.sharding_type.value in ("column_wise", "table_column_wise")
              for g in o.geometries}
    assert widths == {32}  # 64 columns: 2 shards of 32; never 4 of 16
    free = problem_of(EmbeddingShardingPlanner(topology=cpu(4)))
    assert 16 in {g.cols for o in options_of(free, "user") if o.sharding_type.value == "column_wise" for g in o.geometries}


def test_pooling_factors_num_poolings_batch_sizes_and_feature_names_price_the_table():
    problem = problem_of(EmbeddingShardingPlanner(topology=cpu(), batch_size=100, constraints={
        "geo": ParameterConstraints(pooling_factors=[3.0, 5.0], num_poolings=[1.0, 2.0], batch_sizes=[100, 50],
                                    feature_names=["city", "country"]),
        "history": ParameterConstraints(pooling_factors=[40.0])}))
    geo = problem.tables_by_name["geo"]
    assert geo.pooling_factor == pytest.approx((3 * 100 + 5 * 50) / 100) and geo.outputs_per_sample == pytest.approx((100 + 2 * 50) / 100)
    assert problem.tables_by_name["history"].pooling_factor == 40.0


def test_cache_params_set_the_load_factor_and_policy_and_reach_fbgemm():
    """A table too big for HBM is cached at the user's load factor, with their algorithm; what
    else they gave FBGEMM (prefetch pipeline) reaches the ParameterSharding."""
    big = bags(("huge", 40_000_000, 128, ["h"]), ("small", 1000, 64, ["s"]))
    cache = CacheParams(algorithm=CacheAlgorithm.LFU, load_factor=0.3, prefetch_pipeline=True)
    planner, plan = plan_with({"huge": ParameterConstraints(cache_params=cache, sharding_types=["table_wise"])},
                              topology=cuda(2, hbm_cap=8 * 1024**3), sharders=[EmbeddingBagCollectionSharder()], module=big)
    sharding = plan.plan[""]["huge"]
    assert sharding.compute_kernel in ("fused_uvm_caching", "key_value")
    assert sharding.cache_params == dataclasses.replace(cache, load_factor=0.3)
    assert planner.last_plan.tables["huge"].cache_load_factor == 0.3
    problem = problem_of(planner, big, [EmbeddingBagCollectionSharder()])
    assert problem.tiering.policy == "lfu" and 0.3 in problem.tiering.load_factors


def test_enforce_hbm_keeps_the_table_in_device_memory_and_the_runtime_fields_pass_through():
    kv = KeyValueParams(ssd_storage_directory="/tmp/kv")
    planner, plan = plan_with({"user": ParameterConstraints(enforce_hbm=True, stochastic_rounding=False,
                                                            bounds_check_mode=BoundsCheckMode.WARNING, key_value_params=kv)},
                              topology=cuda(2))
    problem = problem_of(planner)
    assert {o.tier for o in options_of(problem, "user")} == {"hbm"}
    sharding = plan.plan["sparse"]["user"]
    assert (sharding.enforce_hbm, sharding.stochastic_rounding, sharding.bounds_check_mode, sharding.key_value_params) == (
        True, False, BoundsCheckMode.WARNING, kv)


def test_a_weighted_collection_may_say_so_and_fp32_outputs_on_this_device_pass():
    weighted = bags(("w", 1000, 16, ["f"]), weighted=True)
    _, plan = plan_with({"w": ParameterConstraints(is_weighted=True, output_dtype=DataType.FP32, device_group="cpu")}, module=weighted,
                        sharders=[EmbeddingBagCollectionSharder()])
    assert plan.plan[""]["w"].output_dtype == DataType.FP32


@pytest.mark.parametrize("constraint, line", [
    (ParameterConstraints(sharding_types=["table_row_wise"]),
     "constraints['history'].sharding_types ['table_row_wise']: none of them is one its sharder runs and dlrm-scale plans"),
    (ParameterConstraints(sharding_types=["diagonal"]), "constraints['history'].sharding_types: 'diagonal' is not one of TorchRec's"),
    (ParameterConstraints(compute_kernels=["fused_uvm"]), "constraints['history'].compute_kernels ['fused_uvm']: none of them"),
    (ParameterConstraints(min_partition=100), "constraints['history'].min_partition must be a whole number of columns in 1..64"),
    (ParameterConstraints(pooling_factors=[1.0, 2.0]), "constraints['history'].pooling_factors has 2 values for the table's 1 features"),
    (ParameterConstraints(num_poolings=[2.0]), "constraints['history'].num_poolings counts pooled sums"),
    (ParameterConstraints(batch_sizes=[0]), "constraints['history'].batch_sizes must be positive numbers"),
    (ParameterConstraints(feature_names=["other"]), "constraints['history'].feature_names ['other'] are not the table's features"),
    (ParameterConstraints(is_weighted=True), "constraints['history'].is_weighted is true but module 'towers.seq.0' is not weighted"),
    (ParameterConstraints(cache_params=CacheParams(reserved_memory=2.0)), "constraints['history'].cache_params.reserved_memory"),
    (ParameterConstraints(cache_params=CacheParams(precision=DataType.FP16)), "constraints['history'].cache_params.precision FP16"),
    (ParameterConstraints(enforce_hbm=True), "constraints['history'].enforce_hbm keeps a table in GPU memory; the topology is cpu"),
    (ParameterConstraints(output_dtype=DataType.FP16), "constraints['history'].output_dtype FP16"),
    (ParameterConstraints(device_group="cuda"), "constraints['history'].device_group 'cuda'"),
    (ParameterConstraints(use_virtual_table=True), "constraints['history'].use_virtual_table"),
])
def test_a_constraint_we_cannot_honour_is_refused_in_one_line(constraint, line):
    with pytest.raises(ConfigError) as e:
        problem_of(EmbeddingShardingPlanner(topology=cpu(), constraints={"history": constraint}))
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_every_parameter_constraints_field_is_honoured_or_refused():
    """A field TorchRec adds is refused until it is mapped: none is silently ignored."""
    known = set(pcs.PRICED_FIELDS + pcs.CHOICE_FIELDS + pcs.RUNTIME_FIELDS + pcs.REFUSED_FIELDS)
    assert {f.name for f in dataclasses.fields(ParameterConstraints)} == known
    unknown = dataclasses.make_dataclass("Newer", [("new_knob", int, dataclasses.field(default=0))], bases=(ParameterConstraints,))
    with pytest.raises(ConfigError, match=r"constraints\['user'\].new_knob: dlrm-scale does not read it yet; drop it"):
        problem_of(EmbeddingShardingPlanner(topology=cpu(), constraints={"user": unknown(new_knob=3)}))


# ---- bad modules ---------------------------------------------------------------------------------
class TwoCollections(nn.Module):
    def __init__(self, second):
        super().__init__()
        self.a = bags(("t", 100, 16, ["f"]))
        self.b = second


@pytest.mark.parametrize("module, sharders, line", [
    (lambda: nn.Sequential(nn.Linear(4, 4)), SHARDERS,
     "module Sequential has no embedding table for the sharders given (they shard EmbeddingBagCollection, EmbeddingCollection)"),
    (lambda: Model(), [EmbeddingBagCollectionSharder()],
     "module 'towers.seq.0' is an EmbeddingCollection but no sharder given shards it: add EmbeddingCollectionSharder()"),
    (lambda: TwoCollections(bags(("t", 200, 16, ["g"]))), SHARDERS,
     "table 't' of module 'b': a table of that name is in module 'a' too"),
    (lambda: TwoCollections(bags(("u", 200, 16, ["g"], {"data_type": DataType.FP16}))), SHARDERS,
     "table 'u' of module 'b' holds FP16 weights; dlrm-scale plans fp32 tables"),
])
def test_a_module_we_cannot_plan_gets_one_line_before_any_sharding(module, sharders, line):
    with pytest.raises(ConfigError) as e:
        EmbeddingShardingPlanner(topology=cpu()).plan(module(), sharders)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_constraints_for_a_table_the_module_lacks_are_refused():
    with pytest.raises(ConfigError, match=r"constraints\['users'\]: the module has no table of that name"):
        problem_of(EmbeddingShardingPlanner(topology=cpu(), constraints={"users": ParameterConstraints()}))


def test_our_placement_constraints_apply_beside_torchrecs():
    planner, plan = plan_with({}, placement={"colocate": [["user", "geo"]]})
    assert plan.plan["sparse"]["user"].ranks == plan.plan["sparse"]["geo"].ranks


def test_a_plan_is_saved_with_its_config_for_the_cli(tmp_path):
    import json
    import subprocess
    import sys

    planner, _ = plan_with({})
    planner.save(tmp_path / "plan.json")
    planner.save_config(tmp_path / "plan.yaml")
    out = subprocess.run([sys.executable, "-m", "dlrm_scale.cli", "explain", str(tmp_path / "plan.json"), "--config",
                          str(tmp_path / "plan.yaml")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("busiest rank"), out.stderr
    assert json.loads((tmp_path / "plan.json").read_text())["tables"].keys() == {"user", "geo", "history"}

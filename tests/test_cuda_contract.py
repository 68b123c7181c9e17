"""What the CUDA path hands TorchRec and FBGEMM, asserted without a GPU: the ShardingPlan of every
scheme under every CUDA kernel (placements as TorchRec's own planner writes them, cache
parameters, the SSD store's directory on SSD tables alone), the comm codecs per precision, one
GPU a rank, and host tensors' collectives kept off NCCL.
scripts/gpu_check.py runs the same on a GPU."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap

import pytest
import torch
from torchrec.distributed.planner.utils import placement as torchrec_placement
from torchrec.distributed.utils import add_params_from_parameter_sharding

from dlrm_scale.bridge.qcomms import COMM_TYPES, qcomm_codecs_registry
from dlrm_scale.bridge.sharding_plan import from_sharding_plan, to_sharding_plan
from dlrm_scale.bridge.sharders import sharder_for
from dlrm_scale.tools.launch import free_port
from dlrm_scale.train import local_gpu
from planner.spec.errors import ConfigError
from planner.plan.document import Plan, table_layout
from planner.spec.specs import TableSpec
from planner.spec.types import ShardingType

WORLD, LOCAL = 4, 2
SCHEMES = {  # scheme -> ranks of its shards (row-wise: every rank; hierarchical: one node's; grid: a node's a column block)
    ShardingType.TABLE_WISE: [3], ShardingType.COLUMN_WISE: [2, 0], ShardingType.TABLE_COLUMN_WISE: [2, 3],
    ShardingType.ROW_WISE: [0, 1, 2, 3], ShardingType.TABLE_ROW_WISE: [2, 3], ShardingType.GRID_SHARD: [2, 3, 0, 1],
}
KERNELS = {"fused": ("hbm", None), "fused_uvm_caching": ("ddr", 0.25), "key_value": ("ssd", 0.5)}


def plan_of(scheme: ShardingType, kernel: str) -> tuple[Plan, dict]:
    tier, load_factor = KERNELS[kernel]
    t = TableSpec("t", 10_001, 32)
    table = table_layout(t, scheme, SCHEMES[scheme], tier, load_factor, LOCAL)
    assert table.compute_kernel == kernel
    return Plan(WORLD, LOCAL, {"t": table}, (), 0.0, 0.0), {"t": (t.num_embeddings, t.embedding_dim)}


@pytest.mark.parametrize("scheme, kernel", list(itertools.product(SCHEMES, KERNELS)), ids=lambda v: getattr(v, "value", v))
def test_every_scheme_and_cuda_kernel_maps_as_torchrec_plans_it(scheme, kernel):
    plan, shapes = plan_of(scheme, kernel)
    ps = to_sharding_plan(plan, "cuda").plan[""]["t"]
    assert ps.sharding_type == scheme.value and ps.compute_kernel == kernel and ps.ranks == SCHEMES[scheme]
    shards = ps.sharding_spec.shards
    assert [str(m.placement) for m in shards] == [torchrec_placement("cuda", r, LOCAL) for r in SCHEMES[scheme]]
    assert [(m.shard_offsets, m.shard_sizes) for m in shards] == [
        ([s.row_offset, s.col_offset], [s.rows, s.cols]) for s in plan.tables["t"].shards]
    load_factor = KERNELS[kernel][1]
    assert (ps.cache_params.load_factor if ps.cache_params else None) == load_factor
    assert from_sharding_plan(to_sharding_plan(plan, "cuda"), shapes, WORLD, LOCAL, "cuda").tables == plan.tables


def test_a_data_parallel_table_is_replicated_with_the_dense_kernel():
    t = TableSpec("t", 100, 32)
    plan = Plan(WORLD, LOCAL, {"t": table_layout(t, ShardingType.DATA_PARALLEL, list(range(WORLD)), "hbm")}, (), 0.0, 0.0)
    ps = to_sharding_plan(plan, "cuda").plan[""]["t"]
    assert (ps.sharding_type, ps.compute_kernel, ps.sharding_spec, ps.ranks) == ("data_parallel", "dense", None, list(range(WORLD)))


@pytest.mark.parametrize("kernel", KERNELS)
def test_the_ssd_store_directory_reaches_the_ssd_kernel_alone(kernel, tmp_path):
    """FBGEMM's other kernels refuse `ssd_storage_directory` (their constructor has no such
    argument: seen on an H200), so it travels in the SSD tables' own sharding."""
    plan, _ = plan_of(ShardingType.TABLE_WISE, kernel)
    fused = add_params_from_parameter_sharding({}, to_sharding_plan(plan, "cuda", "", str(tmp_path)).plan[""]["t"])
    assert fused.get("ssd_storage_directory") == (str(tmp_path) if kernel == "key_value" else None)
    assert "ssd_storage_directory" not in add_params_from_parameter_sharding({}, to_sharding_plan(plan, "cuda").plan[""]["t"])
    assert not sharder_for("fp32", "fp32").fused_params


@pytest.mark.parametrize("fwd, bwd", [(f, b) for f in COMM_TYPES for b in COMM_TYPES if (f, b) != ("fp32", "fp32")])
def test_every_comm_precision_gets_fbgemm_codecs(fwd, bwd):
    registry = qcomm_codecs_registry(fwd, bwd, [32])
    a2a = registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
    assert a2a.forward._comm_precision.value == fwd and a2a.backward._comm_precision.value == bwd
    assert qcomm_codecs_registry("fp32", "fp32", [32]) is None


def test_each_rank_gets_its_own_gpu_or_one_line_naming_the_fix():
    assert local_gpu(1, 2) == torch.device("cuda:1")
    with pytest.raises(ConfigError, match=r"this machine has 1; start at most 1 ranks per node \(--nproc_per_node 1\)"):
        local_gpu(1, 1)


@pytest.mark.distributed
def test_host_tensors_meet_over_a_gloo_group_of_their_own_when_the_default_is_nccl():
    """NCCL refuses CPU tensors, and TorchRec reads its device from the default group, which
    therefore stays NCCL-only. Here a gloo default group stands in for NCCL, which needs a GPU."""
    script = textwrap.dedent(f"""
        import os
        import torch, torch.distributed as dist
        from dlrm_scale.training.host_group import host_group, init_host_group
        from dlrm_scale.training.rank_end import end_rank
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{free_port()}")
        dist.init_process_group("gloo", rank=0, world_size=1)
        init_host_group(cuda=True)
        group = host_group()
        assert group is not None and group is not dist.group.WORLD and dist.get_backend(group) == "gloo"
        flag = torch.tensor([7])
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
        init_host_group(cuda=False)
        assert host_group() is None  # on CPU the default group is gloo already
        print("ok", end="")
        end_rank(0)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, "ok"), proc.stderr[-2000:]

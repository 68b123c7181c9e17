"""TorchRec's `Topology` read as our cluster: its shape and capacities as it states them, its
bandwidths where the user set them, and the rest of the costs from a hardware profile.

TorchRec's default bandwidths (600 GB/s between GPUs of a host, 51 GB/s of DDR, ...) are
placeholders for the machine it does not know; a profile holds measured ones (`dlrm-scale
calibrate`), so a bandwidth equal to TorchRec's default is read as "not given". The settings of
TorchRec's own estimators (backward multipliers, uneven-sharding multiplier) have no meaning in
our cost model, whose constants are fitted: a Topology that changes them is refused, as is one
whose ranks differ (our clusters are nodes of identical ranks).
"""

from __future__ import annotations

from typing import Any

import torchrec.distributed.planner.constants as tr
from torchrec.distributed.planner.types import Topology

from planner.spec.errors import ConfigError

# Our profile for each device when none is named: TorchRec's users come with a GPU cluster or a
# CPU test run on gloo.
DEFAULT_PROFILE = {"cuda": "a100_zionex", "cpu": "cpu_gloo"}
BYTES_PER_MS_PER_GB_PER_S = 1e6
GIB = 1024**3

# TorchRec's estimator settings our cost model has no use for, and their defaults.
ESTIMATOR_SETTINGS = {
    "bwd_compute_multiplier": ("_bwd_compute_multiplier", tr.BWD_COMPUTE_MULTIPLIER),
    "weighted_feature_bwd_compute_multiplier": ("_weighted_feature_bwd_compute_multiplier", tr.WEIGHTED_FEATURE_BWD_COMPUTE_MULTIPLIER),
    "uneven_sharding_perf_multiplier": ("_uneven_sharding_perf_multiplier", 1.0),
}


def _bandwidths(topology: Topology) -> dict[str, float]:
    """Our bandwidth fields (GB/s) for the Topology's bandwidths that differ from TorchRec's defaults.
    On a GPU our DDR bandwidth is the host memory as the device reads it (TorchRec's HBM-to-DDR);
    on a CPU the memory the ranks compute from."""
    ddr = (topology.hbm_to_ddr_mem_bw, tr.HBM_TO_DDR_MEM_BW) if topology.compute_device == "cuda" else (topology.ddr_mem_bw, tr.DDR_MEM_BW)
    pairs = {
        "hbm_gb_per_s": (topology.hbm_mem_bw, tr.HBM_MEM_BW),
        "ddr_gb_per_s": ddr,
        "ssd_gb_per_s": (topology.ssd_mem_bw, tr.SSD_MEM_BW),
        "intra_node_gb_per_s": (topology.intra_host_bw, tr.INTRA_NODE_BANDWIDTH),
        "inter_node_gb_per_s": (topology.inter_host_bw, tr.CROSS_NODE_BANDWIDTH),
    }
    return {ours: value / BYTES_PER_MS_PER_GB_PER_S for ours, (value, default) in pairs.items() if value != default}


def _one_per_rank(topology: Topology, tier: str) -> int:
    values = {getattr(d.storage, tier) for d in topology.devices}
    if len(values) != 1:
        raise ConfigError(f"topology: {tier}_cap differs between ranks ({', '.join(f'{v / GIB:g} GiB' for v in sorted(values))}); "
                          f"dlrm-scale plans ranks of one size: give every rank the smallest")
    return int(values.pop())


def cluster_settings(topology: Topology) -> dict[str, Any]:
    """The config's `cluster` section (profile keys) that the Topology states."""
    if topology.compute_device not in DEFAULT_PROFILE:
        raise ConfigError(f"topology: compute_device {topology.compute_device!r} is not planned; use one of {', '.join(DEFAULT_PROFILE)}")
    for name, (attr, default) in ESTIMATOR_SETTINGS.items():
        if getattr(topology, attr, default) != default:
            raise ConfigError(f"topology: {name} tunes TorchRec's estimator, not dlrm-scale's fitted cost model; drop it "
                              f"(dlrm-scale calibrate measures the machine)")
    world, local = topology.world_size, topology.local_world_size
    if topology.intra_group_size != local:
        raise ConfigError(f"topology: pod_size {topology._pod_size} groups hosts; dlrm-scale plans one fast link per host: drop pod_size")
    if world % local:
        raise ConfigError(f"topology: world_size {world} is not a multiple of local_world_size {local}; change either")
    settings: dict[str, Any] = {
        "device": topology.compute_device, "world_size": world, "ranks_per_node": local,
        "ddr_gib_per_node": _one_per_rank(topology, "ddr") * local / GIB,
        "ssd_gib_per_node": _one_per_rank(topology, "ssd") * local / GIB,
        **_bandwidths(topology),
    }
    if topology.compute_device == "cuda":
        settings["hbm_gib_per_rank"] = _one_per_rank(topology, "hbm") / GIB
    return settings

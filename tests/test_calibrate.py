import numpy as np
import pytest

from dlrm_scale.calibrate import fit_comms, fit_embedding, nonnegative_lstsq
from planner.cost_model import lookup_bwd_ms, lookup_fwd_ms


def test_nonnegative_least_squares():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nonnegative_lstsq(a, np.array([2.0, 3.0, 5.0])) == pytest.approx([2.0, 3.0])
    # the unconstrained answer has a negative part: it is dropped and the rest refitted
    x = nonnegative_lstsq(a, np.array([2.0, -3.0, -1.0]))
    assert np.all(x >= 0) and x[1] == 0


def test_embedding_fit_recovers_the_cost_model_constants():
    launch, fwd_ns, bwd_ns, gb_per_s = 0.2, 3.0, 150.0, 20.0
    samples = []
    for dim in (16, 64, 128):
        for pooling in (1, 8, 32):
            lookups = 2048 * pooling
            samples.append({"rows": 10**5, "dim": dim, "pooling": pooling, "lookups": lookups,
                            "fwd_ms": lookup_fwd_ms(lookups, dim, gb_per_s, launch, fwd_ns),
                            "bwd_ms": lookup_bwd_ms(lookups, dim, "rowwise_adagrad", gb_per_s, launch, bwd_ns)})
    fit = fit_embedding(samples, "rowwise_adagrad")
    assert fit["kernel_launch_ms"] == pytest.approx(launch, rel=1e-6)
    assert fit["lookup_fwd_ns"] == pytest.approx(fwd_ns, rel=1e-6)
    assert fit["lookup_bwd_ns"] == pytest.approx(bwd_ns, rel=1e-6)
    assert fit["ddr_gb_per_s"] == pytest.approx(gb_per_s, rel=1e-6)


def test_comms_fit_recovers_latency_and_bandwidth():
    latency, gb_per_s, world = 0.3, 2.0, 2
    samples = [{"bytes": b, "all_to_all_ms": latency + b * (world - 1) / world / (gb_per_s * 1e6),
                "all_reduce_ms": latency + 2 * b * (world - 1) / world / (gb_per_s * 1e6)} for b in (1 << 14, 1 << 20, 1 << 24)]
    fit = fit_comms(samples, world)
    assert fit["collective_latency_ms"] == pytest.approx(latency, rel=1e-6)
    assert fit["intra_node_gb_per_s"] == pytest.approx(gb_per_s, rel=1e-6)

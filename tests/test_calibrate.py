import json
from pathlib import Path

import numpy as np
import pytest

from dlrm_scale.kernels import cpu_adagrad
from dlrm_scale.kernels.cpu_extension import built
from dlrm_scale.tools.calibrate import CalibrationConfig, embedding_samples, fit_comms, fit_embedding
from dlrm_scale.tools.fit import nonnegative_lstsq
from planner.cost.cost_model import lookup_bwd_ms, lookup_fwd_ms
from tests.conftest import make_cluster


def test_nonnegative_least_squares():
    a = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nonnegative_lstsq(a, np.array([2.0, 3.0, 5.0])) == pytest.approx([2.0, 3.0])
    # the unconstrained answer has a negative part: it is dropped and the rest refitted
    x = nonnegative_lstsq(a, np.array([2.0, -3.0, -1.0]))
    assert np.all(x >= 0) and x[1] == 0


def test_embedding_fit_recovers_the_cost_model_constants():
    launch, fwd_ns, bwd_ns, row_ns, gb_per_s = 0.2, 3.0, 15.0, 60.0, 20.0
    fwd_weight_ns, bwd_weight_ns = 0.1, 0.4
    samples = []
    for dim in (16, 64, 128):
        for pooling in (1, 8, 32):
            for distinct_ratio in (0.9, 0.3):  # few and many repeated ids: per id and per row apart
                lookups = 2048 * pooling
                distinct = lookups * distinct_ratio
                samples.append({"rows": 10**5, "dim": dim, "pooling": pooling, "lookups": lookups, "distinct": distinct,
                                "fwd_ms": lookup_fwd_ms(lookups, distinct, dim, gb_per_s, launch, fwd_ns, fwd_weight_ns),
                                "bwd_ms": lookup_bwd_ms(lookups, distinct, dim, "rowwise_adagrad", gb_per_s, launch, bwd_ns, row_ns,
                                                        bwd_weight_ns)})
    fit = fit_embedding(samples, "rowwise_adagrad")
    assert fit["kernel_launch_ms"] == pytest.approx(launch, rel=1e-6)
    assert fit["lookup_fwd_ns"] == pytest.approx(fwd_ns, rel=1e-6)
    assert fit["lookup_bwd_ns"] == pytest.approx(bwd_ns, rel=1e-6)
    assert fit["lookup_bwd_row_ns"] == pytest.approx(row_ns, rel=1e-6)
    assert fit["lookup_fwd_weight_ns"] == pytest.approx(fwd_weight_ns, rel=1e-6)
    assert fit["lookup_bwd_weight_ns"] == pytest.approx(bwd_weight_ns, rel=1e-6)
    assert fit["ddr_gb_per_s"] == pytest.approx(gb_per_s, rel=1e-6)


@pytest.mark.parametrize("embeddings", ["fbgemm", "dlrm_scale"])
def test_embedding_samples_time_the_kernel_the_trainer_will_run(embeddings, monkeypatch):
    if embeddings == "dlrm_scale" and not built():
        pytest.skip("no compiler: the trainer runs FBGEMM's kernel")
    calls = []
    ours = cpu_adagrad._backward

    def counted(*args, **kwargs):
        calls.append(1)
        return ours(*args, **kwargs)

    monkeypatch.setattr(cpu_adagrad, "_backward", counted)  # registered when installed: counts our kernel's calls
    cfg = CalibrationConfig(batch_size=64, dims=(8,), pooling_factors=(1, 4), rows=(1000,), repeats=2)
    samples = embedding_samples(cfg, embeddings)
    assert [(s["dim"], s["pooling"]) for s in samples] == [(8, 1), (8, 4)]
    assert all(s["fwd_ms"] > 0 and s["bwd_ms"] > 0 and 0 < s["distinct"] <= s["lookups"] for s in samples)
    # each sample's backward runs once per batch after a warm-up: 3 calls, 2 samples
    assert len(calls) == (6 if embeddings == "dlrm_scale" else 0)


def test_comms_fit_recovers_latency_bandwidth_and_summing():
    from planner.cost.cost_model import all_reduce_ms, all_to_all_ms

    latency, gb_per_s, reduce_ns, world = 0.3, 2.0, 0.4, 2
    cluster = make_cluster(num_nodes=1, ranks_per_node=world, intra_node_gb_per_s=gb_per_s, reduce_byte_ns=reduce_ns)
    samples = [{"bytes": b, "all_to_all_ms": latency + all_to_all_ms(b, cluster),
                "all_reduce_ms": latency + all_reduce_ms(b, world, cluster)} for b in (1 << 14, 1 << 20, 1 << 24)]
    fit = fit_comms(samples, world)
    assert fit["collective_latency_ms"] == pytest.approx(latency, rel=1e-6)
    assert fit["intra_node_gb_per_s"] == pytest.approx(gb_per_s, rel=1e-6)
    assert fit["reduce_byte_ns"] == pytest.approx(reduce_ns, rel=1e-6)


def test_store_fit_recovers_bandwidth_and_latency_from_per_miss_times():
    from dlrm_scale.tools.calibrate import fit_store
    from planner.cost.cost_model import cache_miss_ms

    # 4000 ids at 250 ns each, 1000 of them missing
    samples = [{"dim": d, "ids": 4000, "misses": 1000, "hit_seconds": 4000 * 250e-9,
                "seconds": 4000 * 250e-9 + cache_miss_ms(1000, d, "rowwise_adagrad", 0.8, 0.3) / 1e3} for d in (16, 128)]
    fitted = fit_store(samples, "rowwise_adagrad")
    assert fitted["ssd_gb_per_s"] == pytest.approx(0.8) and fitted["ssd_latency_us"] == pytest.approx(0.3)
    assert fitted["cache_id_ns"] == pytest.approx(250.0)


def test_store_miss_samples_time_real_misses(tmp_path):
    from dlrm_scale.tools.store_timing import store_miss_samples

    samples = store_miss_samples(tmp_path, dims=(16,), rows=20_000, batches=3)
    # uniform ids, a quarter of the rows cached: about three in four miss, and the cache was
    # full before the timing began, so (nearly) every miss evicts a row, as in steady training
    assert samples[0]["misses"] > 0.6 * samples[0]["ids"] and samples[0]["seconds"] > samples[0]["hit_seconds"] > 0
    assert samples[0]["evictions"] > 0.95 * samples[0]["misses"]
    assert not list(tmp_path.iterdir())  # its files are gone


def test_the_store_is_timed_both_ways_it_reads_from_the_page_cache(tmp_path):
    from dlrm_scale.tools.kernel_choice import time_store_reads

    times = time_store_reads(tmp_path, repeats=2, rows=20_000, batches=2)
    assert set(times) == {"pread", "mapped"} and all(len(t) == 2 and min(t) > 0 for t in times.values())
    assert not list(tmp_path.iterdir())


def test_store_samples_run_on_every_rank_at_once(tmp_path):
    from dlrm_scale.tools.store_timing import store_samples_on_ranks

    samples = store_samples_on_ranks(tmp_path, 2, rows=20_000)
    assert [s["dim"] for s in samples] == [16, 128]
    assert all(s["misses"] > 0.6 * s["ids"] and s["seconds"] > s["hit_seconds"] > 0 for s in samples)
    assert not list(tmp_path.iterdir())  # every rank's files are gone


def test_a_profile_measured_on_another_cpu_is_named_with_the_fix(tmp_path):
    """A profile's kernels and constants are its machine's (FBGEMM's CPU embedding kernel, chosen
    on an AMD EPYC, took 3.4x ours on an Intel Xeon): the trainer names the two CPUs and the fix."""
    from dlrm_scale.run_config import load_problem, measured_elsewhere, this_cpu

    base = Path("configs/hardware/cpu_gloo.yaml").read_text()
    other, here, unstamped = tmp_path / "other.yaml", tmp_path / "here.yaml", tmp_path / "unstamped.yaml"
    other.write_text(base + 'measured_on: "Some Other CPU (family 25, model 17)"\n')
    here.write_text(base + f"measured_on: {json.dumps(this_cpu())}\n")
    unstamped.write_text(base)
    line = measured_elsewhere(other)
    assert "Some Other CPU (family 25, model 17)" in line and this_cpu() in line and f"calibrate --kernels-only --out {other}" in line
    assert measured_elsewhere(here) is None and measured_elsewhere(unstamped) is None
    assert load_problem("configs/tiny.yaml", hardware=str(other)).cluster.device == "cpu"  # the key is a profile's


def test_kernels_only_rewrites_the_choice_and_records_this_cpu(tmp_path, monkeypatch):
    from dlrm_scale.run_config import measured_elsewhere, this_cpu
    from dlrm_scale.tools import calibrate as calibrate_module
    from planner.spec.config import read_yaml

    profile = tmp_path / "p.yaml"
    profile.write_text(Path("configs/hardware/cpu_gloo.yaml").read_text() + 'measured_on: "Some Other CPU"\n')
    chosen = {"embeddings": "fbgemm", "interaction": "dlrm_scale", "store_io": "pread"}
    monkeypatch.setattr(calibrate_module, "choose_cpu_kernels", lambda store_directory=None: (dict(chosen), {}))
    calibrate_module.calibrate_kernels(profile)
    doc = read_yaml(profile, "hardware profile")
    assert doc["measured_on"] == this_cpu() and measured_elsewhere(profile) is None
    assert doc["cpu_kernels"]["embeddings"] == "fbgemm"  # the new choice; the profile's own store_io kept
    assert doc["cpu_kernels"]["store_io"] == read_yaml(Path("configs/hardware/cpu_gloo.yaml"), "p")["cpu_kernels"]["store_io"]

"""``hybrid project --sweep``: GPU compute as stated, the scheduler's threads, the PS's NIC and memory, a sweep."""
import json
from types import SimpleNamespace

import pytest

from hybrid.cli import main
from hybrid.config import load_config
from hybrid.projection.gpu import DEVICES, Device, flops_per_sample, gpu_profile
from hybrid.projection.sweep import nic_gbps, ps_memory_gb, threads_needed
from hybrid.scheduling.amdahl import parallel_part, time_on
from hybrid.projection.time_model import Cluster, Load, Profile


def test_flops_per_sample_counts_forward_and_backward_of_each_linear_layer():
    # width 1 + 2 tables x 2 = 5; wide 5->1, deep 5->4->1: each layer 2 in x out FLOPs forward, twice that backward
    # (the input's gradient, the embeddings' included, and the weights')
    config = load_config("configs/w1-smoke.yaml", ["model.embedding_dim=2", "model.top_mlp=[4]",
                                                   "train.batch_per_worker=8"])
    store = SimpleNamespace(n_dense=1, n_tables=2)
    assert flops_per_sample(config, store) == 6 * (5 * 1 + 5 * 4 + 4 * 1)


def test_a_gpu_computes_flops_at_its_stated_rate_and_keeps_the_host_fixed_cost():
    profile = Profile(op_ms=0.01, row_ms=1e-4, sample_ms=0.05, compute_ms=1.5)
    gpu = Device("test", fp32_tflops=10.0, efficiency=0.5, source="a test")
    on_gpu = gpu_profile(profile, gpu, flops=5e6)
    assert on_gpu.sample_ms == pytest.approx(5e6 / 5e12 * 1e3)
    assert (on_gpu.compute_ms, on_gpu.op_ms) == (1.5, 0.01)
    assert gpu_profile(profile, gpu, flops=5e6, host_ms=0.4).compute_ms == 0.4  # a small model's host cost
    assert all(d.source for d in DEVICES.values())
    with pytest.raises(ValueError, match="efficiency"):
        Device("bad", 10.0, 1.5, "")


def test_amdahl_from_one_and_two_threads():
    assert parallel_part(10.0, 6.0) == pytest.approx(0.8)  # 10 (0.2 + 0.8 / 2) = 6
    assert parallel_part(10.0, 11.0) == 0.0 and parallel_part(10.0, 4.0) == 1.0
    assert time_on(4, 10.0, 0.8) == pytest.approx(10.0 * (0.2 + 0.2))
    assert parallel_part(10.0, 4.0, threads=4) == pytest.approx(0.8)  # 10 (0.2 + 0.8 / 4) = 4
    assert parallel_part(10.0, 5.0, threads=1) == 0.0  # one thread says nothing
    assert threads_needed(12.0, 10.0, 0.8) == 1
    assert threads_needed(4.0, 10.0, 0.8) == 4  # 2 + 8 / n <= 4
    assert threads_needed(3.0, 10.0, 0.8) == 8
    assert threads_needed(2.0, 10.0, 0.8) is None  # the serial 2 ms alone fill the budget


def test_the_ps_nic_carries_its_busier_direction_at_the_iterations_pace():
    load = Load(samples=128, row_bytes=1000, ps_pull_rows=100, ps_prefetch_rows=50, ps_check_rows=1000,
                ps_push_rows=120, ps_writeback_rows=10)
    cluster = Cluster(workers=8, ps=1, gbps=10)
    out = 150 * 1000 + 1000 * 16
    assert nic_gbps(load, cluster, iteration_ms=2.0) == pytest.approx(out * 8 / 2e-3 / 1e9)


def test_ps_memory_is_the_largest_contiguous_shard():
    assert ps_memory_gb(10, 4, 1e8) == pytest.approx(3 * 1e8 / 1e9)  # 3, 3, 3, 1 rows


def test_a_sweep_projects_every_mode_and_cluster_and_writes_json_and_png(criteo_like, tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"profile": {"op_ms": 0.02, "row_ms": 1e-4, "sample_ms": 0.05, "compute_ms": 0.3}}))
    out = tmp_path / "sweep"
    status = main(["project", "configs/w1-smoke.yaml", "--profile", str(profile), "--sweep", "--modes",
                   "vanilla,herald", "--workers", "2,4", "--gbps", "1,10", "--ps", "1", "--workers-per-host", "2",
                   "--iterations", "6", "--out", str(out), "--json", f"data.path={criteo_like}",
                   "train.batch_per_worker=16", "scheduler.warmup_iterations=2"])
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert len(result["rows"]) == 2 * 2 * 2
    assert json.loads((tmp_path / "sweep.json").read_text())["rows"] == result["rows"]
    assert (tmp_path / "sweep.png").stat().st_size > 0
    for row in result["rows"]:
        assert row["iteration_ms"] == pytest.approx(sum(row["stages"].values()), abs=0.01)
        assert row["stages"]["schedule"] == 0.0  # GPU workers: the plans are made while the device computes
        assert row["speedup"] == 1.0 if row["mode"] == "vanilla" else row["speedup"] > 0
    slow, fast = ({r["mode"]: r for r in result["rows"] if r["workers"] == 4 and r["gbps"] == g} for g in (1, 10))
    assert slow["vanilla"]["iteration_ms"] > fast["vanilla"]["iteration_ms"]


def test_a_sweep_refuses_an_unknown_gpu(criteo_like, tmp_path, capsys):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"profile": {"op_ms": 0.02, "row_ms": 1e-4, "sample_ms": 0.05}}))
    assert main(["project", "configs/w1-smoke.yaml", "--profile", str(profile), "--sweep", "--gpu", "tpu",
                 f"data.path={criteo_like}"]) != 0
    assert "unknown GPU 'tpu'" in capsys.readouterr().err

"""Benchmarks run end to end on tiny inputs and report what they claim to."""
import json

import pytest

from hybrid.bench import case_overrides, quality_bench, scheduler_bench
from hybrid.cli import main


def test_scheduler_bench_reports_every_stage(capsys):
    assert main(["bench", "scheduler", "--workers", "2", "--threads", "1", "--iterations", "3",
                 "--batch-per-worker", "8", "--scale", "0.001", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert [(r["workers"], r["laia"]) for r in rows] == [(2, "exact"), (2, "chunked")]
    for row in rows:
        stages = [row[f"{s}_ms"] for s in scheduler_bench.STAGES]
        assert all(ms > 0 for ms in stages)
        assert abs(row["total_ms"] - sum(stages)) < 1e-3


def test_quality_is_brute_force_over_policy_transmissions():
    result = quality_bench.run(workers=3, iterations=12)
    for name in ("laia", "laia-confident", "random"):
        r = result[name]
        assert 0 < r["brute_force"] <= r["transmissions"]
        assert r["quality"] == round(r["brute_force"] / r["transmissions"], 4)


def test_train_bench_runs_each_case_under_mpi_and_pairs_the_ratios(tmp_path):
    """A tiny workload, one size, two cases (one a mode with a setting): real runs, summaries, paired ratios."""
    from hybrid.bench import train_bench

    config = tmp_path / "tiny.yaml"
    config.write_text(f"""name: tiny
data:
  path: {tmp_path / 'tiny-store'}
  synthetic: {{like: criteo-kaggle, rows: 3000, scale: 0.001, seed: 1}}
model: {{name: dlrm, embedding_dim: 4, bottom_mlp: [8], top_mlp: [8]}}
cluster: {{workers: 2, ps: 1}}
train: {{batch_per_worker: 16}}
cache: {{ratio: 0.05}}
""")
    herald = "herald+train.deterministic=true"
    result = train_bench.run(config_path=str(config), sizes=("smoke",), modes=("vanilla", herald),
                             iterations=6, repeats=1, progress=lambda line: None)
    cases = {case["mode"]: case for case in result["cases"]}
    assert set(cases) == {"vanilla", herald} and result["ranks"] == 3
    for case in cases.values():
        assert case["samples_per_s"] > 0 and case["rows_moved"] > 0 and case["table_rows"] == 34169
        assert case["ps_shard_mb"] > 0 and case["worker_peak_rss_mb"] > 0
    assert cases[herald]["rows_moved"] < cases["vanilla"]["rows_moved"]  # the herald schedule ran
    expected = cases[herald]["samples_per_s"] / cases["vanilla"]["samples_per_s"]
    assert result["ratios"] == {f"{herald}/vanilla smoke": round(expected, 3)}
    assert f"{herald}/vanilla smoke" in train_bench.format_table(result)


def test_a_case_is_a_mode_with_optional_settings():
    assert case_overrides("herald") == ["scheduler.mode=herald"]
    assert case_overrides("herald+train.deterministic=true+cache.ratio=0.2") == \
        ["scheduler.mode=herald", "train.deterministic=true", "cache.ratio=0.2"]
    for bad in ("", "+train.deterministic=true", "herald+deterministic"):
        with pytest.raises(ValueError, match="MODE"):
            case_overrides(bad)


def test_train_bench_ratios_are_medians_of_paired_runs():
    from hybrid.bench.train_bench import ratios

    rows = [{"size": "smoke", "mode": "vanilla", "samples_per_s_runs": [10.0, 20.0, 30.0]},
            {"size": "smoke", "mode": "herald", "samples_per_s_runs": [12.0, 20.0, 60.0]},
            {"size": "full", "mode": "vanilla", "samples_per_s_runs": [5.0, 20.0, 30.0]},
            {"size": "full", "mode": "herald", "samples_per_s_runs": [6.0, 10.0, 30.0]}]
    assert ratios(rows, ("smoke", "full"), ("vanilla", "herald")) == {
        "full/smoke vanilla": 1.0, "full/smoke herald": 0.5,
        "herald/vanilla smoke": 1.2, "herald/vanilla full": 1.0}

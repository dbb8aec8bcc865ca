"""Benchmarks run end to end on tiny inputs and report what they claim to."""
import json

from hybrid.bench import quality_bench, scheduler_bench
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
    for name in ("laia", "random"):
        r = result[name]
        assert 0 < r["brute_force"] <= r["transmissions"]
        assert r["quality"] == round(r["brute_force"] / r["transmissions"], 4)

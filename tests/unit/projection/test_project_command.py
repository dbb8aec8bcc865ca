"""``hybrid project``: one case's predicted iteration on a described cluster, from a profile file."""
import json

import pytest

from hybrid.cli import main


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"profile": {"op_ms": 0.02, "row_ms": 1e-4, "sample_ms": 0.05, "compute_ms": 0.3,
                                            "other_ms": 0.2}}))
    return path


def test_a_prediction_names_its_stages_their_sum_and_the_bound(criteo_like, profile, capsys):
    status = main(["project", "configs/w1-smoke.yaml", "--profile", str(profile), "--workers", "4", "--ps", "2",
                   "--workers-per-host", "4", "--gbps", "0.01", "--latency-ms", "0.1", "--iterations", "40",
                   "--json", f"data.path={criteo_like}", "train.batch_per_worker=16", "scheduler.warmup_iterations=5"])
    assert status == 0
    result = json.loads(capsys.readouterr().out)
    assert result["iteration_ms"] == pytest.approx(sum(result["stages"].values()))
    assert result["iterations"] == 35 and result["cluster"]["workers"] == 4
    # 10 Mbit/s, the workers on one host (no ring between hosts): the rows' bytes outweigh 16 samples' compute
    stages = result["stages"]
    assert result["bound"] in ("pull", "push") and min(stages["pull"], stages["push"]) > stages["compute"]
    assert result["stages"]["schedule"] == 0.0 and result["schedule_ms"] > 0  # GPU workers: hidden


def test_a_file_that_is_not_a_profile_is_refused(criteo_like, tmp_path, capsys):
    other = tmp_path / "summary.json"
    other.write_text("{}")
    status = main(["project", "configs/w1-smoke.yaml", "--profile", str(other), f"data.path={criteo_like}"])
    assert status != 0
    assert "not a profile" in capsys.readouterr().err

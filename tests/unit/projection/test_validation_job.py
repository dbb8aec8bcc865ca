"""The calibration and the one-host validation, end to end at a small size (real jobs: mpirun, floors side by side)."""
import json

import pytest

from hybrid.cli import main

pytestmark = [pytest.mark.job, pytest.mark.any_mpi_family]


def test_a_small_calibration_then_validation_predicts_each_case_within_a_factor_of_two(criteo_like, tmp_path,
                                                                                     capsys):
    profile = tmp_path / "profile.json"
    data = [f"data.path={criteo_like}", "train.batch_per_worker=64"]
    assert main(["project", "--calibrate", "configs/w1-smoke.yaml", "--profile", str(profile), "--iterations", "80",
                 "--repeats", "1", "--json", *data]) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["profile"]["sample_ms"] > 0 and [p[0] for p in written["profile"]["collectives"]][0] == 2
    assert main(["project", "--validate", "configs/w1-smoke.yaml", "--profile", str(profile), "--cases",
                 "vanilla+cluster.workers=2,herald+cluster.workers=2", "--iterations", "80", "--repeats", "1",
                 "--json", "--out", str(tmp_path / "validation"), *data]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert json.loads((tmp_path / "validation.json").read_text()) == result
    assert (tmp_path / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert {"median_error", "max_error", "max_ratio_error"} <= set(result)
    assert [c["case"] for c in result["cases"]] == ["vanilla+cluster.workers=2", "herald+cluster.workers=2"]
    # a bound a noisy machine keeps, which a wrong unit or a stage counted twice would not
    assert result["max_error"] < 1.0 and result["max_ratio_error"] < 0.5

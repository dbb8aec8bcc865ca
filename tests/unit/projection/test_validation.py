"""The validation's errors and ratios, from measured and predicted cases."""

from hybrid.cli import main
from hybrid.projection.validation import compare, format_table


def test_errors_are_relative_to_the_measured_time_and_ratios_absolute():
    cases = [{"measured_ms": 10.0, "predicted_ms": 11.0, "measured_ratio": 1.0, "predicted_ratio": 1.0},
             {"measured_ms": 20.0, "predicted_ms": 17.0, "measured_ratio": 0.90, "predicted_ratio": 1.05},
             {"measured_ms": 5.0, "predicted_ms": 5.1, "measured_ratio": 1.20, "predicted_ratio": 1.16}]
    assert compare(cases) == {"median_error": 0.1, "max_error": 0.15, "max_ratio_error": 0.15}


def test_the_table_lists_every_case_and_the_summary_line():
    result = {"config": "w1-smoke", "repeats": 3, "profile": "p.json", "speed": 1.1, "median_error": 0.05,
              "max_error": 0.08,
              "max_ratio_error": 0.04,
              "cases": [{"case": "vanilla+cluster.workers=3", "measured_ms": 18.5, "predicted_ms": 18.0,
                         "error": -0.027, "measured_ratio": 1.0, "predicted_ratio": 1.0}]}
    table = format_table(result)
    assert "vanilla+cluster.workers=3" in table and "median |error| 5.0%" in table


def test_calibrate_and_validate_together_are_refused(tmp_path, capsys):
    assert main(["project", "configs/w1-smoke.yaml", "--profile", str(tmp_path / "p.json"), "--calibrate",
                 "--validate"]) != 0
    assert "one at a time" in capsys.readouterr().err

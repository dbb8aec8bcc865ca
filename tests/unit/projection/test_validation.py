"""The validation's errors and ratios, from measured and predicted cases."""

from hybrid.cli import main
import pytest

from hybrid.projection.validation import _ratios, compare, format_table, rate_gbps


def test_errors_are_relative_to_the_measured_time_and_ratios_absolute():
    cases = [{"case": "vanilla", "measured_ms": 10.0, "predicted_ms": 11.0, "measured_ratio": 1.0,
              "predicted_ratio": 1.0, "first": True},
             {"case": "het", "measured_ms": 20.0, "predicted_ms": 17.0, "measured_ratio": 0.90,
              "predicted_ratio": 1.05},
             {"case": "herald", "measured_ms": 5.0, "predicted_ms": 5.1, "measured_ratio": 1.20,
              "predicted_ratio": 1.16}]
    assert compare(cases) == {"median_error": 0.1, "max_error": 0.15, "max_ratio_error": 0.04,
                              "max_any_ratio_error": 0.15}
    # the same case in another group (another link) counts too, not only the last one
    again = {"case": "herald", "measured_ms": 5.0, "predicted_ms": 5.0, "measured_ratio": 1.0, "predicted_ratio": 1.3}
    assert compare([*cases, again])["max_ratio_error"] == 0.3


def test_the_table_lists_every_case_and_the_summary_line():
    result = {"config": "w1-smoke", "repeats": 3, "profile": "p.json", "speed": {"one host": 1.1}, "median_error": 0.05,
              "max_error": 0.08,
              "max_ratio_error": 0.04,
              "cases": [{"case": "vanilla+cluster.workers=3", "measured_ms": 18.5, "predicted_ms": 18.0,
                         "error": -0.027, "measured_ratio": 1.0, "predicted_ratio": 1.0, "group": "one host"}]}
    table = format_table(result)
    assert "vanilla+cluster.workers=3" in table and "median |error| 5.0%" in table
    assert "herald over vanilla 0.04" in table


def test_calibrate_and_validate_together_are_refused(tmp_path, capsys):
    assert main(["project", "configs/w1-smoke.yaml", "--profile", str(tmp_path / "p.json"), "--calibrate",
                 "--validate"]) != 0
    assert "one at a time" in capsys.readouterr().err


def test_ratios_are_taken_within_a_group_against_its_first_case():
    group = [{"case": "vanilla", "measured_ms": 10.0, "predicted_ms": 12.0, "global_batch": 384,
              "runs_samples_per_s": [100, 110]},
             {"case": "herald", "measured_ms": 8.0, "predicted_ms": 8.0, "global_batch": 384,
              "runs_samples_per_s": [125, 132]},
             {"case": "vanilla+cluster.workers=2", "measured_ms": 6.0, "predicted_ms": 6.0, "global_batch": 256,
              "runs_samples_per_s": [80, 80]}]
    _ratios(group)
    assert group[0]["first"] and not group[1]["first"] and group[2]["first"]  # another cluster: its own base
    assert group[2]["measured_ratio"] == 1.0
    assert group[1]["predicted_ratio"] == 1.5 and group[1]["measured_ratio"] == pytest.approx(1.225)
    assert group[0]["error"] == 0.2 and group[1]["error"] == 0.0
    assert compare(group)["max_ratio_error"] == pytest.approx(0.275)  # the first case's ratio is 1 by definition


def test_tc_rates_in_gbit_per_second():
    assert (rate_gbps("1gbit"), rate_gbps("100mbit"), rate_gbps(None)) == (1.0, 0.1, None)
    with pytest.raises(ValueError, match="tc rate"):
        rate_gbps("fast")

"""The calibration's fits from measured stages, and reading a profile back."""
import json

import pytest

from hybrid.bench.train_bench import STAGES, fits
from hybrid.projection.calibration import _batches, _compute_of, _fit_operations, read_profile


def test_compute_is_the_floor_s_fit_over_the_batches_in_ms_and_never_below_zero():
    rows = [{"size": "smoke", "case": "plain+cluster.workers=1", "batch_per_worker": b,
             "iteration_ms": {**dict.fromkeys(STAGES, 0.0), "compute": ms}, "rows_per_iteration": 0,
             "outside_compute_ms": 0.0} for b, ms in ((64, 4.0), (128, 7.2))]
    fixed, per_sample = _compute_of(fits(rows)["plain+cluster.workers=1 smoke"]["compute"])
    assert per_sample == pytest.approx(0.05) and fixed == pytest.approx(0.8)
    assert _compute_of({"fixed_ms": -0.3, "per_unit_us": 60.0}) == (0.0, pytest.approx(0.06))


def test_operations_rows_and_updates_are_recovered_from_pull_and_push_stages():
    op, row, update = 0.03, 0.0002, 0.0001
    # pulls: operations and rows; pushes: vanilla writes the rows it updates, herald updates without writing
    units = [(2, 700, 0), (2, 350, 0), (1, 900, 900), (1, 450, 450), (0, 0, 900), (0, 20, 450)]
    equations = [(o, r, u, o * op + r * row + u * update) for o, r, u in units]
    assert _fit_operations(equations) == pytest.approx((op, row, update))


def test_a_fit_that_would_go_below_zero_leaves_that_cost_at_zero():
    # time falls with operations: all of it is per row
    op, row = _fit_operations([(1, 1000, 0.5), (4, 1000, 0.4), (2, 2000, 1.0)])
    assert op == 0.0 and row > 0


def test_a_batch_of_one_cannot_be_halved():
    assert _batches(128) == (64, 128)
    with pytest.raises(ValueError, match="batch"):
        _batches(1)


def test_a_profile_is_read_back_and_another_file_refused(tmp_path):
    path = tmp_path / "profile.json"
    path.write_text(json.dumps({"profile": {"op_ms": 0.02, "row_ms": 1e-4, "sample_ms": 0.05,
                                            "shares": [[2, 1.1], [3, 1.6]]}}))
    profile = read_profile(path)
    assert profile.shares == ((2, 1.1), (3, 1.6)) and profile.op_ms == 0.02
    (tmp_path / "other.json").write_text(json.dumps({"cases": []}))
    with pytest.raises(ValueError, match="not a profile"):
        read_profile(tmp_path / "other.json")

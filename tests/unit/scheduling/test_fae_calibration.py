"""FAE's calibrator and shuffle schedule (hybrid/scheduling/fae_calibration.py, hybrid/scheduling/shuffle_schedule.py)."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid.scheduling.fae_calibration import (
    access_counts, calibrate, estimate_hot_rows, hot_inputs, sample_positions,
)
from hybrid.scheduling.shuffle_schedule import ShuffleSchedule

BIG, SMALL = 400_000, 1_000  # rows: a table to sample, and one under 1 MB at 64 bytes a row
HOT = 4_000  # planted hot rows of the big table


def _inputs(seed: int, n: int = 400_000) -> tuple[np.ndarray, np.ndarray]:
    """Inputs whose big-table id is one of HOT scattered rows 90% of the time, else uniform."""
    rng = np.random.default_rng(seed)
    planted = rng.choice(BIG, size=HOT, replace=False)
    hot = rng.random(n) < 0.9
    big = np.where(hot, planted[rng.integers(0, HOT, n)], rng.integers(0, BIG, n))
    return np.stack([big, rng.integers(0, SMALL, n)], axis=1), planted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_interval_brackets_the_hot_rows_at_every_cutoff(seed):
    sparse, _ = _inputs(seed)
    sample = sparse[sample_positions(len(sparse), 0.05, seed)]
    counts = access_counts(sample, [BIG, SMALL])[0]
    rng = np.random.default_rng(seed)
    for cutoff in (1, 2, 3, 4, 6, 8):
        true = int(np.count_nonzero(counts >= cutoff))
        estimate = estimate_hot_rows(counts, cutoff, rng)
        assert not estimate.exact
        assert estimate.lower <= true <= estimate.upper, (cutoff, true, estimate)
        assert estimate.upper - estimate.lower < 0.5 * BIG  # an interval, not [0, N]


def test_calibration_finds_the_planted_hot_set_within_the_budget():
    """A 10% sample reads each planted row ~9 times, a uniform row once at most: cutoff 2 separates them."""
    sparse, planted = _inputs(7)
    sample = sparse[sample_positions(len(sparse), 0.1, 7)]
    row_bytes = 64
    budget = int(1.2 * HOT) * row_bytes + SMALL * row_bytes  # room for the planted set, not for the noise
    result = calibrate(sample, [BIG, SMALL], row_bytes=row_bytes, budget_bytes=budget, seed=7)
    big, small = result.hot
    assert small.all(), "a table under 1 MB is hot whole"
    assert result.estimated_bytes <= budget
    assert (big.sum() + SMALL) * row_bytes <= budget
    found = set(np.flatnonzero(big).tolist())
    assert len(found & set(planted.tolist())) >= 0.95 * HOT  # recall of the planted rows
    assert len(found - set(planted.tolist())) <= 0.05 * HOT  # few uniform rows mistaken for hot
    assert result.cutoff == 2
    classified = hot_inputs(sparse, result.hot)
    assert 0.85 < classified.mean() < 0.95  # about the 90% of inputs that read a planted row


def test_a_budget_for_the_small_tables_only_makes_no_large_row_hot():
    sparse, _ = _inputs(3, n=50_000)
    result = calibrate(sparse, [BIG, SMALL], row_bytes=64, budget_bytes=SMALL * 64)
    assert not result.hot[0].any() and result.hot[1].all()
    assert not hot_inputs(sparse, result.hot).any()
    with pytest.raises(ValueError, match="below the 0.06 MB of the tables under 1 MB"):
        calibrate(sparse, [BIG, SMALL], row_bytes=64, budget_bytes=1000)


def test_a_table_too_small_to_sample_is_counted_exactly():
    counts = np.array([0, 5, 1, 7, 3])
    estimate = estimate_hot_rows(counts, 3, np.random.default_rng(0))
    assert estimate.exact and estimate.estimate == estimate.lower == estimate.upper == 3


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 4).flatmap(lambda tables: st.tuples(
    st.lists(st.lists(st.booleans(), min_size=5, max_size=5), min_size=tables, max_size=tables),
    st.lists(st.lists(st.integers(0, 4), min_size=tables, max_size=tables), min_size=0, max_size=30))))
def test_an_input_is_hot_when_every_row_it_reads_is_hot(case):
    masks, rows = case
    hot = [np.array(m) for m in masks]
    sparse = np.array(rows, dtype=np.int64).reshape(len(rows), len(masks))
    expected = [all(masks[t][row[t]] for t in range(len(masks))) for row in rows]
    assert hot_inputs(sparse, hot).tolist() == expected


def test_bad_inputs_are_refused_with_what_was_expected():
    with pytest.raises(ValueError, match=r"table 0: ids must be in \[0, 3\)"):
        access_counts(np.array([[3]]), [3])
    with pytest.raises(ValueError, match="expected \\[inputs, 2\\]"):
        hot_inputs(np.zeros((4, 3), dtype=np.int64), [np.ones(2, bool)] * 2)
    with pytest.raises(ValueError, match="fraction"):
        sample_positions(10, 0.0, 0)


def test_the_rate_starts_at_50_halves_on_a_rise_and_doubles_after_4_falls():
    schedule = ShuffleSchedule()
    assert schedule.rate == 50
    assert schedule.observe(1.0) == 50  # nothing to compare with yet
    assert schedule.observe(1.1) == 25  # rose
    assert [schedule.observe(x) for x in (1.0, 0.9, 0.8)] == [25, 25, 25]
    assert schedule.observe(0.7) == 50  # the 4th fall in a row
    assert schedule.observe(0.7) == 50  # equal: unchanged, and the count of falls goes on
    assert [schedule.observe(x) for x in (0.6, 0.5, 0.4)] == [50, 50, 50]
    assert schedule.observe(0.3) == 100
    for x in (0.2, 0.1, 0.05, 0.01):
        schedule.observe(x)
    assert schedule.rate == 100  # bounded above by R(100)
    for x in range(7):
        schedule.observe(1.0 + x)
    assert schedule.rate == 1  # bounded below by R(1)


def test_a_rise_resets_the_count_of_falls():
    schedule = ShuffleSchedule()
    for x in (1.0, 0.9, 0.8, 0.7, 0.75, 0.6):
        schedule.observe(x)
    assert schedule.rate == 25


def test_strips_start_cold_and_cover_every_mini_batch_once():
    assert ShuffleSchedule(rate=100).strips(7, 3) == [("cold", 7), ("hot", 3)]
    assert ShuffleSchedule(rate=50).strips(10, 4) == [("cold", 5), ("hot", 2), ("cold", 5), ("hot", 2)]
    assert ShuffleSchedule(rate=1).strips(3, 2) == [("cold", 1), ("hot", 1), ("cold", 1), ("hot", 1), ("cold", 1)]
    assert ShuffleSchedule(rate=25).strips(0, 5) == [("hot", 2), ("hot", 2), ("hot", 1)]
    with pytest.raises(ValueError, match="rate"):
        ShuffleSchedule(rate=0)


def test_the_calibration_is_kept_beside_the_data_and_reused(tmp_path, capsys):
    from hybrid.cli import main
    from hybrid.data.store import BatchStore
    from hybrid.data.synthetic import synthesize

    synthesize(tmp_path / "store", like="criteo-kaggle", rows=20000, scale=0.01, seed=1)
    args = ["fae", "configs/w1-smoke.yaml", f"data.path={tmp_path / 'store'}", "fae.budget_mb=4", "--json"]
    assert main(args) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    store = BatchStore(tmp_path / "store", split="train", test_fraction=0.1)
    assert first["inputs"] == store.n_samples and 0 < first["hot_inputs"] < first["inputs"]
    assert first["hot_bytes"] <= first["estimated_bytes"] <= 4 * 2**20
    assert len([n for n in first["hot_rows_per_table"] if n]) > 0
    kept = Path(first["path"])
    hot_rows = np.load(kept / "hot_rows.npy")
    masks = [np.isin(np.arange(n) + offset, hot_rows) for n, offset in zip(store.cardinalities, store.table_offsets)]
    assert np.array_equal(np.load(kept / "hot_inputs.npy"), hot_inputs(np.asarray(store.sparse()), masks))
    assert main(args) == 0  # the same calibration again: read, not made
    assert "calibrating" not in capsys.readouterr().err
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name], "no temporary directory left"

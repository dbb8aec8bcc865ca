"""The statistics measure what their names say, on inputs with known answers."""
import numpy as np

from hybrid.data.access_stats import (cooccurrence_ratio, locality_ratio, recurrence_shares, reuse_distances,
                                      top_share)


def test_top_share_counts_the_hottest_rows():
    counts = np.array([90] + [1] * 10 + [0] * 5)  # 11 accessed rows, 100 accesses
    assert top_share(counts, 0.01) == 0.90  # at least one row
    assert top_share(counts, 0.10) == 0.90  # round(1.1) = 1 row
    assert top_share(np.zeros(4), 0.1) == 0.0


def test_reuse_distances_are_gaps_between_accesses_of_a_row():
    ids = np.array([5, 1, 5, 5, 2, 1])
    assert sorted(reuse_distances(ids)) == [1, 2, 4]


def test_recurrence_bins_partition_the_accessed_rows():
    counts = np.array([0, 1, 1, 3, 50, 500, 5000])
    shares = recurrence_shares(counts)
    assert shares == {"1": 2 / 6, "2-9": 1 / 6, "10-99": 1 / 6, "100-999": 1 / 6, "1000+": 1 / 6}


def test_cooccurrence_ratio_separates_dependent_from_independent_columns():
    rng = np.random.default_rng(0)
    a = rng.integers(0, 200, 20_000)
    assert cooccurrence_ratio(a, (a * 7) % 200) > 5  # b is a function of a
    assert abs(cooccurrence_ratio(a, rng.integers(0, 200, 20_000)) - 1.0) < 0.05


def test_locality_ratio_sees_bursts_and_not_shuffles():
    rng = np.random.default_rng(0)
    bursts = np.repeat(rng.permutation(2000), 10)  # each id 10 times in a row
    assert locality_ratio(bursts) > 100
    assert abs(locality_ratio(rng.permutation(bursts)) - 1.0) < 0.2

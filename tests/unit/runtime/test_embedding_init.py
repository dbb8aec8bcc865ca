"""The PS's in-place shard fill gives exactly the reference's initial values."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from hybrid.runtime.embedding_init import fill_initial_rows, initial_rows


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32), first_row=st.integers(0, 2**31 - 1000), n=st.integers(0, 300),
       dim=st.integers(1, 40), dtype=st.sampled_from([np.float32, np.float64]), threads=st.integers(1, 3))
def test_a_shard_filled_in_place_equals_the_rows_computed_anywhere(seed, first_row, n, dim, dtype, threads):
    shard = np.full((n, dim), np.nan, dtype=dtype)
    fill_initial_rows(shard, seed, first_row, threads=threads)
    assert np.array_equal(shard, initial_rows(seed, np.arange(first_row, first_row + n), dim, dtype))


def test_shards_cover_a_table_seamlessly():
    """However a table is cut into shards, the PS ranks together hold the reference's table."""
    whole = initial_rows(3, np.arange(1000), 16, np.float32)
    parts = []
    for first, stop in ((0, 334), (334, 668), (668, 1000)):
        part = np.empty((stop - first, 16), np.float32)
        fill_initial_rows(part, 3, first)
        parts.append(part)
    assert np.array_equal(np.concatenate(parts), whole)


def test_a_bad_first_row_is_refused():
    with pytest.raises(ValueError, match="first_row must be >= 0"):
        fill_initial_rows(np.empty((2, 4), np.float32), 0, -1)

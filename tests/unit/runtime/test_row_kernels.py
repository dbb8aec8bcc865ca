"""The PS-side row kernels of the packed transport: what MPI_Accumulate / Put / Get would do, and never out of bounds."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid._ext import row_kernels


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 9), max_size=30), st.sampled_from([np.float32, np.float64]))
def test_add_rows_adds_every_occurrence_like_an_accumulate(rows, dtype):
    shard = np.arange(10 * 3, dtype=dtype).reshape(10, 3)
    values = np.random.default_rng(len(rows)).random((len(rows), 3)).astype(dtype)
    expected = shard.copy()
    np.add.at(expected, np.array(rows, dtype=np.int64), values)
    row_kernels.add_rows(shard, np.array(rows, dtype=np.int64), values)
    assert np.allclose(shard, expected, rtol=1e-6)


def test_put_and_gather_move_whole_rows():
    shard = np.zeros((5, 4))
    row_kernels.put_rows(shard, np.array([3, 0], dtype=np.int64), np.array([[1.0] * 4, [2.0] * 4]))
    out = np.empty((3, 4))
    row_kernels.gather_rows(shard, np.array([0, 3, 1], dtype=np.int64), out)
    assert out.tolist() == [[2.0] * 4, [1.0] * 4, [0.0] * 4]


@pytest.mark.parametrize("bad", [-1, 5])
def test_rows_outside_the_shard_are_refused_before_anything_is_written(bad):
    shard = np.zeros((5, 2))
    with pytest.raises(IndexError, match=f"row {bad} is outside this shard of 5 rows"):
        row_kernels.add_rows(shard, np.array([1, bad], dtype=np.int64), np.ones((2, 2)))
    assert not shard.any()
    with pytest.raises(IndexError):
        row_kernels.gather_rows(shard, np.array([bad], dtype=np.int64), np.empty((1, 2)))


def test_shapes_must_match():
    with pytest.raises(ValueError, match="values must be"):
        row_kernels.put_rows(np.zeros((5, 2)), np.array([1], dtype=np.int64), np.ones((1, 3)))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(0, 2**32 - 1), st.sampled_from([np.float32, np.float64]),
       st.floats(1e-4, 10.0), st.integers(1, 3))
def test_sgd_rows_rounds_bit_for_bit_as_numpys_fancy_update(n_rows, seed, dtype, lr, extra_columns):
    """A worker's local SGD (hybrid.modes.vanilla): the kernel must equal ``cache[slots[p]] -= lr * g[p]``
    exactly, or the float64 reference tests (and a float32 run against its rerun) would drift."""
    rng = np.random.default_rng(seed)
    dim = 3
    cache = rng.standard_normal((50, dim + extra_columns)).astype(dtype)  # rows may carry optimizer state after dim
    slots = rng.choice(50, n_rows, replace=False).astype(np.int32)
    gradients = (rng.standard_normal((n_rows, dim)) * 10 ** rng.uniform(-6, 3)).astype(dtype)
    positions = rng.choice(n_rows, rng.integers(0, n_rows + 1), replace=False).astype(np.int32)
    expected = cache.copy()
    expected[slots[positions], :dim] -= lr * gradients[positions]
    row_kernels.sgd_rows(cache, slots, positions, gradients, lr)
    assert np.array_equal(cache, expected)


def test_sgd_rows_refuses_positions_or_slots_outside_before_writing():
    cache = np.zeros((4, 2))
    with pytest.raises(IndexError, match="position 5"):
        row_kernels.sgd_rows(cache, np.array([0, 1], dtype=np.int32), np.array([0, 5], dtype=np.int32),
                             np.ones((2, 2)), 0.1)
    with pytest.raises(IndexError, match="outside the cache"):
        row_kernels.sgd_rows(cache, np.array([0, 9], dtype=np.int32), np.array([0, 1], dtype=np.int32),
                             np.ones((2, 2)), 0.1)
    assert not cache.any()

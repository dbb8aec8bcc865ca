"""The NumPy and C counter hashes must agree bit for bit (ranks mix both)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from hybrid._ext.hash_kernels import array_digest, hash3_array, uniform3_array
from hybrid.counter_hash import hash3, stream_id, uniform3

U64 = st.integers(min_value=0, max_value=2**64 - 1)


@given(seed=U64, stream=U64, counters=st.lists(U64, min_size=1, max_size=50))
def test_numpy_and_c_hash_agree(seed, stream, counters):
    c = np.array(counters, dtype=np.uint64)
    assert np.array_equal(hash3(seed, stream, c), hash3_array(seed, stream, c))
    assert np.array_equal(uniform3(seed, stream, c), uniform3_array(seed, stream, c))


def test_uniform_is_in_unit_interval_and_roughly_uniform():
    u = uniform3(1, 2, np.arange(200_000))
    assert u.min() >= 0.0 and u.max() < 1.0
    histogram = np.histogram(u, bins=10, range=(0, 1))[0] / len(u)
    assert np.allclose(histogram, 0.1, atol=0.005)


def test_streams_and_seeds_are_independent():
    counters = np.arange(1000)
    assert not np.array_equal(hash3(1, stream_id("a"), counters), hash3(1, stream_id("b"), counters))
    assert not np.array_equal(hash3(1, 5, counters), hash3(2, 5, counters))
    assert stream_id("table", 3) == stream_id("table", 3) != stream_id("table", 4)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=100), st.integers(0, 99), st.integers(0, 7), st.lists(st.integers(0, 2**64 - 1), max_size=3))
def test_an_array_digest_follows_every_byte_and_word(data, flip, bit, words):
    # plan digests are compared across ranks every iteration: a change of any byte (the tail's too) or of
    # any word after it must show, and equal inputs give equal digests
    array = np.frombuffer(data, dtype=np.uint8)
    assert array_digest(array, *words) == array_digest(array.copy(), *words)
    if len(data):
        changed = array.copy()
        changed[flip % len(data)] ^= 1 << bit
        assert array_digest(changed, *words) != array_digest(array, *words)
    assert array_digest(np.append(array, 0), *words) != array_digest(array, *words)  # the length counts
    if words:
        assert array_digest(array, *words[:-1], words[-1] ^ 1) != array_digest(array, *words)

"""``cluster.wire_precision``: the bfloat16 rounding every sender, the PS and the rounding reference share
(docs/design.md section 14), and what is refused."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hybrid._ext import row_kernels
from hybrid.config import ConfigError, WirePrecision, load_config
from hybrid.modes import MODES
from hybrid.scheduling.policy import SchedulerError
from hybrid.wire_format import Wire

BF16 = Wire(WirePrecision.bf16)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64))
def test_the_rounding_is_torchs_bfloat16_for_every_float32_bit_pattern(patterns):
    """Round to nearest, ties to even, NaNs kept, overflow to infinity: what torch's conversion does."""
    values = np.array(patterns, dtype=np.uint32).view(np.float32)
    ours = BF16.round(values)
    theirs = torch.from_numpy(values.copy()).to(torch.bfloat16).to(torch.float32).numpy()
    assert np.array_equal(np.isnan(ours), np.isnan(theirs))
    finite = ~np.isnan(ours)
    assert np.array_equal(ours[finite].view(np.uint32), theirs[finite].view(np.uint32))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.floats(-1e30, 1e30, width=64), min_size=1, max_size=64))
def test_float64_rounds_through_fp32_once_and_a_rounded_value_travels_unchanged(values):
    values = np.array(values)
    rounded = BF16.round(values)
    assert rounded.dtype == np.float64
    assert np.array_equal(rounded, BF16.round(values.astype(np.float32)).astype(np.float64))
    assert np.array_equal(BF16.round(rounded), rounded)  # idempotent: a row sent twice is the row sent once
    bits = BF16.encode(values)
    assert bits.dtype == np.uint16
    assert np.array_equal(BF16.decode(bits, np.empty(len(values))), rounded)
    relative = np.abs(rounded - values) / np.maximum(np.abs(values), 1e-30)
    assert relative.max() <= 2.0**-8  # half a unit in the last of 8 significant bits


def test_the_ps_kernels_round_what_they_send_and_widen_what_they_receive():
    rng = np.random.default_rng(3)
    shard = rng.standard_normal((6, 5))
    rows = np.array([4, 1, 4], dtype=np.int64)
    out = np.empty((3, 5), dtype=np.uint16)
    row_kernels.gather_rows_bf16(shard, rows, out)
    assert np.array_equal(BF16.decode(out, np.empty((3, 5))), BF16.round(shard[rows]))
    deltas = BF16.encode(rng.standard_normal((3, 5)))
    expected = shard.copy()
    np.add.at(expected, rows, BF16.decode(deltas, np.empty((3, 5))))
    row_kernels.add_rows_bf16(shard, rows, deltas)
    assert np.array_equal(shard, expected), "added in the master's precision, duplicates twice"
    row_kernels.put_rows_bf16(shard, rows[:2], deltas[:2])
    assert np.array_equal(shard[[4, 1]], BF16.decode(deltas[:2], np.empty((2, 5))))
    with pytest.raises(IndexError, match="outside this shard"):
        row_kernels.add_rows_bf16(shard, np.array([6], dtype=np.int64), deltas[:1])


def test_fp32_moves_values_as_they_are():
    wire = Wire()
    values = np.array([0.1, 1 / 3])
    assert not wire.sixteen_bit and wire.itemsize(np.float64) == 8 and BF16.itemsize(np.float64) == 2
    assert np.array_equal(wire.round(values), values)


def test_fp16_and_what_has_no_defined_rounding_are_refused_by_name():
    with pytest.raises(ConfigError, match="cluster.wire_precision: fp16 is refused: .*loss scaling"):
        load_config(None, ["cluster.wire_precision=fp16"])
    with pytest.raises(ValueError, match="fp16 is refused"):
        Wire(WirePrecision.fp16)
    with pytest.raises(ConfigError, match="train.embedding_optimizer=rowwise_adagrad"):
        load_config(None, ["cluster.wire_precision=bf16", "train.embedding_optimizer=rowwise_adagrad"])
    refusing = [mode for mode in MODES.values() if not mode.sixteen_bit_wire]
    assert {m.name.value for m in refusing} == {"fae"}
    for mode in refusing:
        config = load_config(None, ["cluster.wire_precision=bf16", f"scheduler.mode={mode.name.value}"])
        with pytest.raises(SchedulerError, match=f"wire_precision=bf16 is not supported with "
                                                 f"scheduler.mode={mode.name.value}: "):
            mode.check(config)


def test_writing_into_a_strided_array_is_refused_rather_than_lost():
    values = np.ones((4, 4))[:, :2]
    with pytest.raises(ValueError, match="C-contiguous"):
        BF16.round_(values)
    with pytest.raises(ValueError, match="C-contiguous"):
        BF16.decode(np.zeros((4, 2), dtype=np.uint16), values)

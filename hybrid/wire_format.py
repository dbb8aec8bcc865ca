"""What rows and gradients are rounded to when they travel: ``cluster.wire_precision`` (docs/design.md section 14).

``fp32`` sends every value in the model's own precision (float32 or
float64), bit for bit as stored. ``bf16`` sends bfloat16: 16 bits, fp32's
exponent range and 8 significant bits. The PS keeps its master rows and
workers compute in the model's precision; only what crosses the wire is
rounded, at the points section 14 lists, and a round trip leaves the
rounding :meth:`Wire.round` computes (float64 is rounded to fp32 first,
then to bfloat16: one function, used by the senders, the PS and the
single-process reference alike). ``fp16`` is refused
(``hybrid.config.FP16_REFUSED`` says why).

The arithmetic is the Cython kernels' (``hybrid._ext.row_kernels``), one
pass per array, without NumPy temporaries.
"""
from __future__ import annotations

import numpy as np

from hybrid._ext import row_kernels
from hybrid.config import FP16_REFUSED, Config, WirePrecision


class Wire:
    """One run's wire precision: what its rows, deltas and MLP gradients are rounded to when they travel."""

    def __init__(self, precision: WirePrecision = WirePrecision.fp32):
        precision = WirePrecision(precision)
        if precision is WirePrecision.fp16:
            raise ValueError(f"cluster.wire_precision: {FP16_REFUSED}")
        self.precision = precision
        self.sixteen_bit = precision is WirePrecision.bf16

    @classmethod
    def of(cls, config: Config) -> "Wire":
        return cls(config.cluster.wire_precision)

    def __repr__(self) -> str:
        return f"Wire({self.precision.value})"

    def itemsize(self, dtype) -> int:
        """Bytes per value on the wire for values stored as ``dtype``."""
        return 2 if self.sixteen_bit else np.dtype(dtype).itemsize

    def round(self, values: np.ndarray) -> np.ndarray:
        """What ``values`` are after crossing the wire: a new array of their dtype (a copy at fp32)."""
        out = np.array(values, dtype=values.dtype, order="C", copy=True)
        return self.round_(out)

    def round_(self, values: np.ndarray) -> np.ndarray:
        """Round contiguous ``values`` in place; returns them."""
        if self.sixteen_bit and values.size:
            row_kernels.round_bf16(_flat(values))
        return values

    def encode(self, values: np.ndarray) -> np.ndarray:
        """``values`` as bfloat16 bits (uint16, same shape)."""
        values = np.ascontiguousarray(values)
        out = np.empty(values.shape, dtype=np.uint16)
        if values.size:
            row_kernels.encode_bf16(values.reshape(-1), out.reshape(-1))
        return out

    def decode(self, bits: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Write the values of bfloat16 ``bits`` into contiguous ``out`` (any float dtype); returns ``out``."""
        if bits.size:
            row_kernels.decode_bf16(np.ascontiguousarray(bits).reshape(-1), _flat(out))
        return out


def value_bytes(config: Config) -> int:
    """Bytes of one value as training sends it between hosts (the packed transport, P2P, the MLP's sum)."""
    return Wire.of(config).itemsize(config.model.precision.value)


def row_bytes(config: Config) -> int:
    """Bytes of one row's values as training sends them between hosts (ids and message headers not counted)."""
    return config.row_width * value_bytes(config)


def _flat(values: np.ndarray) -> np.ndarray:
    """A 1-D view of contiguous ``values`` (a reshaped copy would take the writes in their place)."""
    if not values.flags.c_contiguous:
        raise ValueError("the wire's kernels write into C-contiguous arrays only")
    return values.reshape(-1)

"""GPU workers' compute where no GPU was measured: the model's FLOPs at a stated device's rate.

A projection to GPU workers needs their compute per iteration. Until a GPU
host measures it (``launch/gpu_check.sh``), it is stated, not measured:

- per sample: the model's forward and backward FLOPs (counted by
  ``torch.utils.flop_counter`` on the config's own model) over the device's
  peak FP32 rate (its maker's data sheet, named in ``Device.source``) times
  an achieved fraction (``Device.efficiency``, an assumption, said so);
- per iteration: the host's fixed cost of running one iteration's Python
  and operator dispatch, which a GPU worker's host pays as a CPU worker
  does: the floor's fixed cost calibrated on this machine
  (``Profile.compute_ms``) of a model whose arithmetic per iteration is
  small (the same layers at a small embedding dimension: a wide model's
  fixed cost on a CPU also holds its optimizer step, which a GPU makes in
  microseconds).

docs/projection.md ("GPU workers") says what this leaves out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from hybrid.config import Config
from hybrid.data.store import BatchStore
from hybrid.projection.time_model import Profile


@dataclass(frozen=True)
class Device:
    """A GPU as the projection uses it: peak FP32 TFLOP/s, the fraction of it assumed achieved, and where
    the peak comes from."""

    name: str
    fp32_tflops: float
    efficiency: float
    source: str

    def __post_init__(self):
        if self.fp32_tflops <= 0 or not 0 < self.efficiency <= 1:
            raise ValueError(f"{self.name}: fp32_tflops must be > 0 and efficiency in (0, 1], got "
                             f"{self.fp32_tflops} and {self.efficiency}")


# the achieved fraction: an assumption for dense layers of a few hundred to a few thousand units at
# batches of 128-256, not a measurement; launch/gpu_check.sh measures the real compute when a GPU is lent
ASSUMED_EFFICIENCY = 0.3
DEVICES = {
    "rtx3090": Device("NVIDIA GeForce RTX 3090", 35.6, ASSUMED_EFFICIENCY,
                      "NVIDIA Ampere GA102 GPU architecture whitepaper: 35.6 TFLOPS peak FP32 (the Herald paper's "
                      "testbed GPU, section 6.1)"),
    "h100": Device("NVIDIA H100 SXM5", 67.0, ASSUMED_EFFICIENCY,
                   "NVIDIA H100 Tensor Core GPU datasheet: 67 TFLOPS FP32"),
    "h200": Device("NVIDIA H200 SXM", 67.0, ASSUMED_EFFICIENCY,
                   "NVIDIA H200 Tensor Core GPU datasheet: 67 TFLOPS FP32"),
}


def device(name: str) -> Device:
    """The named device (``DEVICES``), or a clear error naming the known ones."""
    try:
        return DEVICES[name]
    except KeyError:
        raise ValueError(f"unknown GPU {name!r}: one of {', '.join(sorted(DEVICES))}") from None


def flops_per_sample(config: Config, store: BatchStore) -> float:
    """Forward and backward FLOPs of one sample through the config's dense model (the loss included)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from hybrid.models import build_model

    batch = config.train.batch_per_worker
    model = build_model(config.model, n_dense=store.n_dense, n_tables=store.n_tables, seed=config.seed)
    dense = torch.zeros(batch, store.n_dense)
    emb = torch.zeros(batch, store.n_tables, config.model.embedding_dim, requires_grad=True)
    with FlopCounterMode(display=False) as counter:
        logits = model(dense, emb)
        torch.nn.functional.binary_cross_entropy_with_logits(logits, torch.zeros(batch)).backward()
    return counter.get_total_flops() / batch


def gpu_profile(profile: Profile, gpu: Device, flops: float, host_ms: Optional[float] = None) -> Profile:
    """``profile`` with a GPU worker's compute: ``flops`` per sample at the device's achieved rate; the fixed
    cost per iteration (the host's) ``host_ms``, or the profile's own."""
    return replace(profile, sample_ms=flops / (gpu.fp32_tflops * 1e12 * gpu.efficiency) * 1e3,
                   compute_ms=profile.compute_ms if host_ms is None else host_ms)

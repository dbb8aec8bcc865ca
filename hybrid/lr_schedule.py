"""Learning-rate schedules: the rate of iteration ``t`` as a function of ``t`` alone (docs/training.md).

Both learning rates (the MLP's ``train.dense_lr`` and the embeddings'
``train.embedding_lr``) are scaled by one factor per iteration:

- warm-up: ``(t + 1) / lr_warmup`` for the first ``lr_warmup`` iterations;
- then ``constant`` (1), ``step`` (``lr_step_gamma`` to the number of
  ``lr_step_every`` iterations since the warm-up, one epoch when 0), or
  ``cosine`` (half a cosine from 1 at the warm-up's end down to
  ``lr_min_ratio`` at the run's last iteration).

The factor depends on the iteration, the run's length and the pass length
only, never on a clock or a rank, so every worker and the single-process
reference compute the same bits, and a resumed run continues the schedule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hybrid.config import Config, LrSchedule


@dataclass(frozen=True)
class RateSchedule:
    """The learning rates of each iteration of one run."""

    kind: LrSchedule
    dense_lr: float
    embedding_lr: float
    warmup: int
    step_every: int  # step schedule: iterations between decays
    gamma: float
    min_ratio: float
    total: int  # iterations of the run

    @staticmethod
    def of(config: Config, per_epoch: int) -> "RateSchedule":
        """The schedule of ``config`` when one pass over the train split is ``per_epoch`` global batches."""
        train = config.train
        return RateSchedule(kind=train.lr_schedule, dense_lr=train.dense_lr, embedding_lr=train.embedding_lr,
                            warmup=train.lr_warmup, step_every=train.lr_step_every or max(1, per_epoch),
                            gamma=train.lr_step_gamma, min_ratio=train.lr_min_ratio,
                            total=config.run_length(per_epoch))

    def factor(self, step: int) -> float:
        """What the configured rates are multiplied by in iteration ``step`` (0-based)."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        after = step - self.warmup
        if self.kind is LrSchedule.step:
            return self.gamma ** (after // self.step_every)
        if self.kind is LrSchedule.cosine:
            span = max(1, self.total - 1 - self.warmup)  # the last iteration reaches min_ratio
            progress = min(1.0, after / span)
            return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0

    def dense(self, step: int) -> float:
        return self.dense_lr * self.factor(step)

    def embedding(self, step: int) -> float:
        return self.embedding_lr * self.factor(step)


def set_rate(optimizer, lr: float) -> None:
    """Give every parameter group of ``optimizer`` the rate ``lr`` (before its step)."""
    for group in optimizer.param_groups:
        group["lr"] = lr

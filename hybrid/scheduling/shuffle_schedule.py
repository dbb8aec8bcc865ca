"""FAE's shuffle scheduler: how many cold, then hot, mini-batches to run before switching.

FAE (VLDB'22, section III-D; docs/design.md section 7) trains hot inputs
(every row they read is replicated on the workers) and cold inputs (through
the PS) in strips, because each switch costs a synchronization of the hot
rows between the replicas and the PS. The *rate* ``R(r)`` is the percentage
of a kind's mini-batches one strip runs: ``R(100)`` runs every cold
mini-batch before any hot one, ``R(1)`` switches after 1% of them (after
every mini-batch when there are at most 100). It starts at ``R(50)``, and
after each strip pair the held-out loss decides:

- the loss rose over the previous one: halve the rate (at least ``R(1)``);
- it fell ``patience`` (4) times in a row: double it (at most ``R(100)``),
  and count again;
- otherwise keep it.

The paper writes the bounds of its Equation 7 as ``min(r/2, R(1))`` and
``max(2r, R(100))``; its text (halve down to ``R(1)``, double up to
``R(100)``) is what is meant and what this implements. Strips start cold.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

MIN_RATE, START_RATE, MAX_RATE = 1, 50, 100


@dataclass
class ShuffleSchedule:
    """The rate and the loss history it follows; :meth:`strips` lays out a pass."""

    rate: int = START_RATE
    patience: int = 4
    _last_loss: Optional[float] = None
    _falls: int = 0

    def __post_init__(self):
        if not MIN_RATE <= self.rate <= MAX_RATE:
            raise ValueError(f"rate must be in [{MIN_RATE}, {MAX_RATE}], got {self.rate}")
        if self.patience < 1:
            raise ValueError(f"patience must be >= 1, got {self.patience}")

    def observe(self, loss: float) -> int:
        """Record the held-out loss after a strip pair; returns the rate for the next one."""
        if not math.isfinite(loss):
            raise ValueError(f"the held-out loss must be finite, got {loss}")
        if self._last_loss is not None:
            if loss > self._last_loss:
                self.rate, self._falls = max(MIN_RATE, self.rate // 2), 0
            elif loss < self._last_loss:
                self._falls += 1
                if self._falls >= self.patience:
                    self.rate, self._falls = min(MAX_RATE, self.rate * 2), 0
        self._last_loss = loss
        return self.rate

    def strip(self, total: int, remaining: int) -> int:
        """Mini-batches of one kind in the next strip: ``rate``% of its ``total``, at least 1, at most ``remaining``."""
        if remaining <= 0:
            return 0
        return min(remaining, max(1, math.ceil(total * self.rate / 100)))

    def strips(self, cold: int, hot: int) -> list[tuple[str, int]]:
        """One pass over ``cold`` and ``hot`` mini-batches at the current rate: [(kind, count)], cold first."""
        if cold < 0 or hot < 0:
            raise ValueError(f"mini-batch counts must be >= 0, got cold={cold}, hot={hot}")
        left = {"cold": cold, "hot": hot}
        total = dict(left)
        out = []
        while left["cold"] or left["hot"]:
            for kind in ("cold", "hot"):
                n = self.strip(total[kind], left[kind])
                if n:
                    out.append((kind, n))
                    left[kind] -= n
        return out

"""Stopping a run on a signal: a checkpoint, then exit 0 (docs/design.md section 13).

SLURM signals a job before its time limit or a preemption (``sbatch
--signal``), and a requeued job resumes from the newest checkpoint. The first
SIGTERM, SIGINT or SIGUSR1 a rank receives only sets a flag: the workers agree
on it in the barrier that ends each iteration, save a checkpoint a few
iterations later (as soon as every worker's scheduler can), and leave with
exit 0. A second signal interrupts at once. OpenMPI's ``mpirun`` kills the
ranks a moment after it forwards a SIGTERM, but forwards SIGUSR1 and lets
them run, so ``launch/mpirun.sh`` passes a SIGTERM it receives on as SIGUSR1.
"""
from __future__ import annotations

import signal
from typing import Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """Set by the first of :data:`SIGNALS` once :meth:`install` ran (main thread only)."""

    def __init__(self):
        self.signal: Optional[str] = None

    def install(self) -> "StopRequest":
        for signum in SIGNALS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is not None:
            raise KeyboardInterrupt(f"{name} after {self.signal}")
        self.signal = name

    @property
    def requested(self) -> bool:
        return self.signal is not None

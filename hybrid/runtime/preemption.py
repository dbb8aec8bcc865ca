"""Stopping a run on a signal: a checkpoint, then exit 0 (docs/design.md section 13).

SLURM signals a job before its time limit or a preemption (``sbatch
--signal``), and a requeued job resumes from the newest checkpoint. The first
SIGTERM, SIGINT or SIGUSR1 a rank receives only sets a flag: the workers agree
on it in the barrier that ends each iteration, save a checkpoint a few
iterations later (as soon as every worker's scheduler can), and leave with
exit 0. A second signal interrupts at once. OpenMPI's ``mpirun`` kills the
ranks a moment after it forwards a SIGTERM, but forwards SIGUSR1 and lets
them run, so ``launch/mpirun.sh`` passes a SIGTERM it receives on as SIGUSR1.
A PS rank takes no part in the workers' barrier: it forwards its request to
worker 0 (:meth:`StopRequest.forward`), which adds it to the next barrier.
"""
from __future__ import annotations

import signal
from typing import Callable, Optional

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class StopRequest:
    """Set by the first of :data:`SIGNALS` once :meth:`install` ran (main thread only)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self.interrupted: Optional[str] = None  # the second signal's message, once it came
        self._notify: Optional[Callable[[int], None]] = None

    def install(self) -> "StopRequest":
        for signum in SIGNALS:
            signal.signal(signum, self._handle)
        return self

    def _handle(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signum is not None:
            self.interrupted = f"{name} after {self.signal}"
            raise KeyboardInterrupt(self.interrupted)
        self.signum = signum
        if self._notify is not None:
            self._notify(signum)

    def raise_if_interrupted(self) -> None:
        """Raise the second signal's interrupt again if the handler's was lost.

        Python runs a signal handler between any two bytecodes, also inside a
        finalizer or a weakref callback, where an exception is printed as
        "ignored" and dropped: the run would then go on to a graceful stop and
        exit 0 (seen in tests/robustness/test_signals.py). The loop calls this
        where it reads the stop request.
        """
        if self.interrupted is not None:
            raise KeyboardInterrupt(self.interrupted)

    def forward(self, notify: Optional[Callable[[int], None]]) -> None:
        """Call ``notify(signum)`` at the first signal (at once if it came already); None stops forwarding.

        Python runs signal handlers in the main thread between bytecodes, so
        ``notify`` may use MPI as the main thread's own code would.
        """
        self._notify = notify
        if notify is not None and self.signum is not None:
            notify(self.signum)

    @property
    def signal(self) -> Optional[str]:
        return None if self.signum is None else signal.Signals(self.signum).name

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def code(self, rank: int) -> int:
        """This rank's request as one int a MAX-allreduce can carry: 0 for none, else signal and rank.

        Of several requests the maximum names the lowest rank (of the
        largest signal number) among those that arrived before the workers
        agreed: a signal to every rank is told as the lowest rank that had
        handled it by then (rank 0's, unless its handler ran late).
        """
        return 0 if self.signum is None else (self.signum << _RANK_BITS) | (_LAST_RANK - rank)


_RANK_BITS = 20
_LAST_RANK = (1 << _RANK_BITS) - 1


def describe(code: int) -> str:
    """What a nonzero :meth:`StopRequest.code` says, for messages: ``SIGTERM on rank 3``."""
    return f"{signal.Signals(code >> _RANK_BITS).name} on rank {_LAST_RANK - (code & _LAST_RANK)}"

"""A watchdog that turns a stuck rank into a report and an ended job (docs/design.md section 2).

A rank waiting in a collective that another rank never enters would wait
forever. The training loop beats the watchdog once per iteration; when no
beat arrives for ``seconds``, a thread prints what the rank was doing and
every thread's stack, then ends the whole job with ``MPI_Abort``.
"""
from __future__ import annotations

import faulthandler
import sys
import threading
import time
from typing import Callable


class Watchdog:
    """``beat()`` at least every ``seconds`` (0 = off), or ``on_stuck`` runs (default: report and abort)."""

    def __init__(self, seconds: float, describe: Callable[[], str], on_stuck: Callable[[str], None] | None = None):
        self.seconds, self.describe = seconds, describe
        self.on_stuck = on_stuck or _report_and_abort
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> "Watchdog":
        if self.seconds > 0:
            self._thread = threading.Thread(target=self._watch, name="hybrid-watchdog", daemon=True)
            self._thread.start()
        return self

    def beat(self) -> None:
        self._last = time.monotonic()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.seconds / 4)):
            idle = time.monotonic() - self._last
            if idle > self.seconds:
                self.on_stuck(f"no iteration finished for {idle:.0f} s (train.watchdog_seconds={self.seconds:g}) "
                              f"while {self.describe()}: a collective is stuck or a rank is hung")
                return

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _report_and_abort(message: str) -> None:
    from mpi4py import MPI

    from hybrid.runtime.comm import abort_job

    world = MPI.COMM_WORLD
    print(f"hybrid train: rank {world.rank} of {world.size} ({MPI.Get_processor_name()}): {message}; "
          f"stacks follow; ending every rank", file=sys.stderr, flush=True)
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    abort_job(1)

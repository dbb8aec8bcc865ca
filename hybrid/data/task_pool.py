"""Where ``hybrid preprocess`` runs its tasks: this process, local worker processes, or MPI ranks.

Every pool returns the results of ``map`` in task order, on every member, so
what comes after a phase does not depend on who ran which task. A task that
raises makes ``map`` raise its error everywhere: on MPI ranks the error of
the first failed task (in task order) is raised on every rank, after all
ranks have finished their share, so no rank waits for one that gave up.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import signal
from typing import Callable, Sequence


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


def _indexed(fn: Callable, item: tuple) -> tuple:
    return item[0], fn(item[1])


def _quiet_worker() -> None:
    """A worker leaves Ctrl-C to the parent, which stops it, and dies of SIGTERM without a traceback: a
    preemption or ``kill`` signals every process of the job, and only the parent has anything to say."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class TaskPool:
    """Tasks in this process, or on ``processes`` local worker processes (forked: they inherit the imports).

    Use it as a context manager: leaving the block on an error or an
    interrupt terminates the workers at once (their unfinished tasks are lost).
    """

    rank, size = 0, 1

    def __init__(self, processes: int = 1):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes = processes
        self._workers = None

    def map(self, fn: Callable, tasks: Sequence, done: Callable[[int, object], None] = lambda i, r: None) -> list:
        """``[fn(t) for t in tasks]``; ``done(i, result)`` as each finishes (in the caller's process)."""
        results: list = [None] * len(tasks)
        if self.processes == 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                results[i] = fn(task)
                done(i, results[i])
            return results
        if self._workers is None:
            self._workers = multiprocessing.get_context("fork").Pool(self.processes, initializer=_quiet_worker)
        for i, result in self._workers.imap_unordered(functools.partial(_indexed, fn), enumerate(tasks)):
            results[i] = result
            done(i, result)
        return results

    def stop(self) -> None:
        """End the workers now, unfinished tasks and all (after an error, before cleaning up after them)."""
        if self._workers is not None:
            self._workers.terminate()
            self._workers.join()
            self._workers = None

    def barrier(self) -> None:
        """Nothing to wait for: the caller is the only member."""

    def share(self, value):
        """Rank 0's ``value`` on every member."""
        return value

    def __enter__(self) -> "TaskPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._workers is not None and exc_type is None:
            self._workers.close()
            self._workers.join()
            self._workers = None
        self.stop()


class MpiTaskPool(TaskPool):
    """Tasks spread over the ranks of ``comm`` (an mpi4py communicator): task ``i`` on rank ``i % size``."""

    def __init__(self, comm):
        super().__init__(1)
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()

    def map(self, fn: Callable, tasks: Sequence, done: Callable[[int, object], None] = lambda i, r: None) -> list:
        mine = []
        for i in range(self.rank, len(tasks), self.size):
            try:
                mine.append((i, fn(tasks[i]), None))
            except Exception as err:  # every rank raises it below, after the exchange
                mine.append((i, None, err))
                break
            done(i, mine[-1][1])
        results: list = [None] * len(tasks)
        failed = []
        for share in self.comm.allgather(mine):
            for i, result, err in share:
                results[i] = result
                if err is not None:
                    failed.append((i, err))
        if failed:
            raise min(failed, key=lambda f: f[0])[1]
        return results

    def barrier(self) -> None:
        self.comm.Barrier()

    def share(self, value):
        return self.comm.bcast(value, root=0)

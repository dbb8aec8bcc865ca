"""Where ``hybrid preprocess`` runs its tasks: this process, local worker processes, or MPI ranks.

Every pool returns the results of ``map`` in task order, on every member, so
what comes after a phase does not depend on who ran which task. A task that
raises makes ``map`` raise its error everywhere: on MPI ranks the error of
the first failed task (in task order) is raised on every rank, after all
ranks have finished their share, so no rank waits for one that gave up.
"""
from __future__ import annotations

import multiprocessing
import multiprocessing.connection
import os
import signal
from typing import Callable, Sequence


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


class WorkerDied(RuntimeError):
    """A worker process ended without a result (killed, out of memory)."""


def _serve(connection, other_ends: list) -> None:
    """A worker: run each ``(fn, task)`` the parent sends, send back ``(True, result)`` or ``(False, error)``.

    Ctrl-C reaches the whole process group: the worker leaves it to the
    parent, which then stops it. Nothing is shared but the pipe, so a worker
    killed at any moment leaves no lock held (``multiprocessing.Pool`` hangs
    on one a killed worker held).
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for end in other_ends:
        end.close()
    while True:
        try:
            job = connection.recv()
        except EOFError:
            return
        if job is None:
            return
        fn, task = job
        try:
            reply = (True, fn(task))
        except Exception as err:  # the parent raises it
            reply = (False, err)
        try:
            connection.send(reply)
        except Exception as err:  # a result or an error that does not pickle
            connection.send((False, RuntimeError(f"{type(err).__name__}: {err} (sending {reply[1]!r})")))


class TaskPool:
    """Tasks in this process, or on ``processes`` local worker processes (forked: they inherit the imports).

    Use it as a context manager: leaving the block on an error or an
    interrupt kills the workers at once (their unfinished tasks are lost).
    """

    rank, size = 0, 1

    def __init__(self, processes: int = 1):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes}")
        self.processes = processes
        self._workers: list = []  # (process, connection)

    def map(self, fn: Callable, tasks: Sequence, done: Callable[[int, object], None] = lambda i, r: None) -> list:
        """``[fn(t) for t in tasks]``; ``done(i, result)`` as each finishes (in the caller's process); the
        first error a task raises, raised here."""
        results: list = [None] * len(tasks)
        if self.processes == 1 or len(tasks) <= 1:
            for i, task in enumerate(tasks):
                results[i] = fn(task)
                done(i, results[i])
            return results
        if not self._workers:
            self._start()
        waiting = list(enumerate(tasks))[::-1]
        busy: dict = {}  # connection -> task index

        def hand_out(connection) -> None:
            if waiting:
                i, task = waiting.pop()
                connection.send((fn, task))
                busy[connection] = i

        for _, connection in self._workers:
            hand_out(connection)
        while busy:
            for connection in multiprocessing.connection.wait(list(busy)):
                i = busy.pop(connection)
                try:
                    ok, value = connection.recv()
                except EOFError:
                    self.stop()
                    raise WorkerDied(f"a worker process died running task {i} of {len(tasks)} ({fn.__name__}); "
                                     f"was it killed, or out of memory?") from None
                if not ok:
                    self.stop()  # the others' replies to this map must not reach the next one
                    raise value
                results[i] = value
                done(i, value)
                hand_out(connection)
        return results

    def _start(self) -> None:
        context = multiprocessing.get_context("fork")
        pipes = [context.Pipe() for _ in range(self.processes)]
        for mine, theirs in pipes:
            # the worker closes every end but its own: it sees EOF once the parent is gone, the parent once it is
            others = [end for pipe in pipes for end in pipe if end is not theirs]
            process = context.Process(target=_serve, args=(theirs, others), daemon=True)
            process.start()
            theirs.close()
            self._workers.append((process, mine))

    def stop(self) -> None:
        """Kill the workers now, unfinished tasks and all (after an error, before cleaning up after them)."""
        for process, connection in self._workers:
            process.kill()
            process.join()
            connection.close()
        self._workers = []

    def barrier(self) -> None:
        """Nothing to wait for: the caller is the only member."""

    def share(self, value):
        """Rank 0's ``value`` on every member."""
        return value

    def __enter__(self) -> "TaskPool":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            for process, connection in self._workers:
                connection.send(None)
                process.join()
                connection.close()
            self._workers = []
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

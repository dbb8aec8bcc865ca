"""Local worker processes: results in task order, a task's error raised in the caller, a dead worker named."""
import os
import signal
import time

import pytest

from hybrid.data.task_pool import TaskPool, WorkerDied


def _square_slowly(x):
    time.sleep(0.01 * (x % 3))  # finish out of order
    return x * x


def _fail_at_seven(x):
    if x == 7:
        raise ValueError("seven is bad")
    return x


def _die_at_five(x):
    if x == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


@pytest.mark.parametrize("processes", [1, 3])
def test_results_come_in_task_order_and_each_is_reported_once(processes):
    seen = []
    with TaskPool(processes) as pool:
        assert pool.map(_square_slowly, list(range(12)), lambda i, r: seen.append((i, r))) == [x * x for x in range(12)]
        assert pool.map(_square_slowly, [3]) == [9]  # the workers serve one map after another
    assert sorted(seen) == [(x, x * x) for x in range(12)]


@pytest.mark.parametrize("processes", [1, 3])
def test_a_task_error_is_raised_in_the_caller_and_the_pool_serves_on(processes):
    with TaskPool(processes) as pool:
        with pytest.raises(ValueError, match="seven is bad"):
            pool.map(_fail_at_seven, list(range(10)))
        assert pool.map(_square_slowly, list(range(6))) == [x * x for x in range(6)]  # no stale reply


def test_a_killed_worker_is_an_error_not_a_hang():
    started = time.monotonic()
    with pytest.raises(WorkerDied, match="died running task 5 of 10"):
        with TaskPool(2) as pool:
            pool.map(_die_at_five, list(range(10)))
    assert time.monotonic() - started < 30

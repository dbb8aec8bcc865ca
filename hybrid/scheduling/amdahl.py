"""Amdahl's law from two timings: the share of a stage that runs in parallel, and its time on more threads.

``t_n = t_1 ((1 - p) + p / n)``: a stage timed on one thread and on ``n``
gives ``p``. On a machine of few cores the estimate is only as good as
the two timings (noise, memory bandwidth, cores the OS lends elsewhere),
so it says where the serial part is, not how 16 cores would do
(docs/benchmarks.md has a 16-core host's timings).
"""
from __future__ import annotations


def parallel_part(one_thread_ms: float, n_threads_ms: float, threads: int = 2) -> float:
    """Amdahl's parallel fraction from the times on one thread and on ``threads`` threads, in [0, 1]."""
    if one_thread_ms <= 0 or threads < 2:
        return 0.0
    return min(1.0, max(0.0, (1.0 - n_threads_ms / one_thread_ms) / (1.0 - 1.0 / threads)))


def time_on(threads: int, one_thread_ms: float, part: float) -> float:
    """A stage's ms on ``threads`` threads (Amdahl)."""
    return one_thread_ms * ((1.0 - part) + part / threads)

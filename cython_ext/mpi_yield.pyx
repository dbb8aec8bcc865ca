# cython: language_level=3
"""A rank that waits in MPICH gives its core away, as Open MPI's ``mpi_yield_when_idle`` does (docs/cluster.md).

MPICH (ch4:ucx) waits by calling UCX's ``ucp_worker_progress`` in a loop
and has no setting to give the core away meanwhile (its
``MPIR_CVAR_POLLS_BEFORE_YIELD=1`` changed nothing, measured). Where ranks
share cores, a worker's Horovod thread spinning in an allreduce then takes
the core from another worker's compute. This module defines
``ucp_worker_progress`` itself: loaded with ``RTLD_GLOBAL`` before MPICH
(``hybrid.runtime.launch_facts.prepare``), it is what MPICH's calls bind to;
it calls UCX's own and, when that found nothing to do, yields the core; a
thread that found nothing ``SPINS_BEFORE_SLEEP`` times in a row sleeps
``SLEEP_US`` instead. ``sched_yield`` alone gives little under Linux's fair
scheduler: the waiting rank is soon back, polling. Measured with 3 workers
+ 1 PS on 2 cores (MovieLens-100k, herald, samples/s; docs/cluster.md):
yielding only 28-29k, sleeping 20 us after 100 empty polls 53-61k, after
30 polls 46-68k, 50 us after 300 polls 49-61k, 10 us after every empty
poll 41-44k. Loaded only where the ranks do not fit their cores: with a
core each, spinning is fastest.
"""

cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    const int RTLD_LAZY
    const int RTLD_NOLOAD

cdef extern from "<sched.h>" nogil:
    int sched_yield()

cdef extern from "<unistd.h>" nogil:
    int usleep(unsigned microseconds)

cdef extern from *:
    """
    static __thread long mpi_yield_empty_polls = 0;  /* per thread: each waits on its own */
    """
    long empty_polls "mpi_yield_empty_polls"

cdef enum:
    SPINS_BEFORE_SLEEP = 100
    SLEEP_US = 20

ctypedef unsigned (*progress_function)(void* worker) noexcept nogil

cdef progress_function ucx_progress = NULL


cdef public unsigned ucp_worker_progress(void* worker) noexcept nogil:
    """UCX's progress; then, if it handled no event, the core goes to a thread that has work: ``sched_yield``,
    or after ``SPINS_BEFORE_SLEEP`` empty polls in a row a sleep of ``SLEEP_US``."""
    global ucx_progress, empty_polls
    cdef unsigned events
    if ucx_progress == NULL:  # only MPICH calls this, after it loaded UCX; threads racing here store the same
        ucx_progress = <progress_function>dlsym(dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD), "ucp_worker_progress")
    events = ucx_progress(worker)
    if events:
        empty_polls = 0
        return events
    empty_polls += 1
    if empty_polls > SPINS_BEFORE_SLEEP:
        usleep(SLEEP_US)
    else:
        sched_yield()
    return events


def active():
    """Whether MPICH's waits in this process come here (they have called it at least once): then they
    give the core away, and the training summary and the choice of allreduce say so."""
    return ucx_progress != NULL

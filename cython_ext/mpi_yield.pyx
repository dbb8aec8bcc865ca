# cython: language_level=3
"""A rank that waits in MPICH yields its core, as Open MPI's ``mpi_yield_when_idle`` does (docs/cluster.md).

MPICH (ch4:ucx) waits by calling UCX's ``ucp_worker_progress`` in a loop
and has no setting to give the core away meanwhile (its
``MPIR_CVAR_POLLS_BEFORE_YIELD=1`` changed nothing, measured). Where ranks
share cores, a worker's Horovod thread spinning in an allreduce then takes
the core from another worker's compute. This module defines
``ucp_worker_progress`` itself: loaded with ``RTLD_GLOBAL`` before MPICH
(``hybrid.runtime.launch_facts.prepare``), it is what MPICH's calls bind to;
it calls UCX's own and yields the core when that found nothing to do.
Loaded only where the ranks do not fit their cores: with a core each,
spinning is fastest.
"""
from libc.stdint cimport int64_t

from atomics cimport fetch_add_i64


cdef extern from "<dlfcn.h>" nogil:
    void* dlopen(const char* filename, int flags)
    void* dlsym(void* handle, const char* symbol)
    const int RTLD_LAZY
    const int RTLD_NOLOAD

cdef extern from "<sched.h>" nogil:
    int sched_yield()

ctypedef unsigned (*progress_function)(void* worker) noexcept nogil

cdef progress_function ucx_progress = NULL
cdef int64_t yield_count = 0


cdef public unsigned ucp_worker_progress(void* worker) noexcept nogil:
    """UCX's progress; then, if it handled no event, ``sched_yield`` (the core goes to a thread that has work)."""
    global ucx_progress
    cdef unsigned events
    if ucx_progress == NULL:  # only MPICH calls this, after it loaded UCX; threads racing here store the same
        ucx_progress = <progress_function>dlsym(dlopen("libucp.so.0", RTLD_LAZY | RTLD_NOLOAD), "ucp_worker_progress")
    events = ucx_progress(worker)
    if events == 0:
        sched_yield()
        fetch_add_i64(&yield_count, 1)
    return events


def yields():
    """How often a wait in this process gave its core away (0: MPICH's calls do not come here)."""
    return yield_count

"""Scheduling: where each sample trains and which embedding rows move (docs/design.md sections 3-5 and 7).

Pure computation, run identically on every worker and in the simulator: the
allocation policies (LAIA and its variants), the plans the Cython cluster
state produces (``plans``: what one worker executes in one iteration), the
scheduler that steps the state one batch ahead, the thread that runs it ahead
of training, and FAE's hot/cold strips. Nothing here sends a byte.

May import: ``hybrid._ext``, ``hybrid.counter_hash``, ``hybrid.data``, ``hybrid.config``.
"""

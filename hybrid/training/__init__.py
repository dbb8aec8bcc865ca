"""Training: the loop every rank runs, the job around it, and the run counted without MPI.

``loop`` (one rank's iterations: pull, compute, allreduce, push, barrier,
with the mode plugged in at fixed points), ``job`` (``hybrid train``: checks,
resume, the summary), ``simulator`` (``hybrid simulate``), ``reference``
(single-process SGD, the exactness tests' model), ``summary_text`` and
``learning_curves`` (the summary's curves, ``hybrid plot``).

May import every package above it: ``hybrid.modes``, ``hybrid.runtime``,
``hybrid.scheduling``, ``hybrid.models``, ``hybrid.config``, ``hybrid.data``.
"""

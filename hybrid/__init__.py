"""Hybrid-parallel recommendation-model training with the Herald embedding scheduler.

Packages, lowest first; a package imports only from those above it in this
list, never from one below (``tests/unit/test_layout.py`` checks it):

- ``hybrid._ext``: the Cython kernels (cluster state, LAIA, hashing, row routing).
- ``hybrid.counter_hash``: counter-based hashing, the only randomness ranks share.
- ``hybrid.data``: the sample store, public formats, synthetic data, fetching.
- ``hybrid.config``, ``hybrid.torch_files``, ``hybrid.models``: the typed config; reading torch files
  without running their code; the dense models.
- ``hybrid.embedding_optimizer``: how a row's summed gradient updates it (SGD, row-wise Adagrad).
- ``hybrid.lr_schedule``: the learning rates of each iteration (warm-up, constant, step, cosine).
- ``hybrid.wire_format``: what rows and gradients are rounded to when they travel (``cluster.wire_precision``).
- ``hybrid.exported``: a trained model taken out of the cluster (one file, no MPI).
- ``hybrid.scheduling``: allocation, the cluster state's plans, the scheduler
  thread, FAE's strips; pure computation, the same on every rank.
- ``hybrid.runtime``: what moves bytes between ranks: roles and collectives,
  the PS store and its transports, shard plans, checkpoint files, signals.
- ``hybrid.sharding``: planners that place tables on PS ranks (NeuroShard).
- ``hybrid.modes``: the modes, each one module, and their registry: a mode's
  scheduling choices and what it does at each stage of the training loop.
- ``hybrid.training``: the training loop, the job around it, the simulator,
  the single-process reference and the summary.
- ``hybrid.bench``: the benchmarks (``hybrid bench ...``).
- ``hybrid.projection``: a time model of one iteration, calibrated here, to project runs on other clusters.
- ``hybrid.cli``: the ``hybrid`` command, one module per command group.

The design as built is in docs/design.md; docs/layout.md walks through the packages.
"""
__version__ = "0.1.0"

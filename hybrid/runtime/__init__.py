"""Runtime: the machinery that moves bytes between ranks (docs/design.md sections 2, 8, 11-13).

Roles and collectives (``comm``: the one module that imports Horovod), the
PS tier (``rma_store`` with its ``packed_transport``, laid out by a
``shard_plan``), rows sent cache to cache (``p2p_transport``), the tables'
initial values, checkpoint files, stopping on a signal, the watchdog and the
NIC counters. Mechanisms only: which rows move when is the modes' and the
scheduler's business.

May import: ``hybrid._ext``, ``hybrid.counter_hash``, ``hybrid.data``,
``hybrid.config``, ``hybrid.models``, ``hybrid.scheduling`` (the plans it executes).
"""

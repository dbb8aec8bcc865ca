"""Data: the binary sample store, public formats, the synthetic generator, fetching (docs/design.md section 10).

May import: ``hybrid._ext``, ``hybrid.counter_hash``.
"""
from hybrid.data.store import BatchStore, GlobalBatch, StoreError, StoreWriter

__all__ = ["BatchStore", "GlobalBatch", "StoreError", "StoreWriter"]

"""Data: the binary sample store, public formats and the synthetic generator."""
from hybrid.data.store import BatchStore, GlobalBatch, StoreError, StoreWriter

__all__ = ["BatchStore", "GlobalBatch", "StoreError", "StoreWriter"]

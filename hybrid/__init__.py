"""Hybrid-parallel recommendation-model training with the Herald embedding scheduler.

Subpackages: ``hybrid.data`` (store, formats, synthetic data). The command
line is ``hybrid`` (``hybrid.cli``); the design is in docs/design.md.
"""
__version__ = "0.1.0"

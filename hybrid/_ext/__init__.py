"""Compiled kernels built by setup.py from ``cython_ext/``.

Imports nothing of ``hybrid``; everything else may import it.
"""

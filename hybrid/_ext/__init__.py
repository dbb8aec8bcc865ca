"""Compiled kernels built by setup.py from ``cython_ext/`` (see README: build)."""

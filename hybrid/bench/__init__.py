"""Benchmarks (``hybrid bench NAME``): speed goals live here, never in unit tests."""

"""Numba kernels: pure functions over arrays, no I/O, no Python objects, no config reads.

Importing this package imports Numba; the rest of qstream imports it lazily.
"""

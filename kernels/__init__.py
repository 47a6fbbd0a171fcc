"""Numba kernels: the hot loops of mcsim, one module per stage.

Installed as ``mcsim.kernels`` (never as a top-level ``kernels`` package). Kernels are pure functions over
NumPy arrays, scalars and ``numpy.random.Generator`` objects: no I/O, no config objects, no xarray.
Callers allocate outputs; kernels fill them.
"""

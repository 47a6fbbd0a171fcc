"""Timing helper of the benchmark modules (it lives in :mod:`mcsim.bench.timing`)."""

from mcsim.bench.timing import best_of

__all__ = ["best_of"]

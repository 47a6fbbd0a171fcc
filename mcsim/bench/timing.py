"""Timing and the description of the machine a benchmark ran on."""

from __future__ import annotations

import time

import numba

from mcsim.optrace.profiles import runtime_environment


def best_of(function, repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` calls, seconds (the least disturbed by other load on the machine).

    >>> best_of(lambda: None, repeats=2) >= 0.0
    True
    """
    best = float("inf")
    for _ in range(max(1, int(repeats))):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def machine() -> dict:
    """CPU model, cores, Python, NumPy, BLAS, Numba and the 1-minute load average when the suite started."""
    out = runtime_environment()
    out.pop("backend", None)
    out["numba_version"] = numba.__version__
    return out

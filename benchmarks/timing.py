"""Timing helper shared by the benchmark modules."""

from __future__ import annotations

import time


def best_of(function, repeats: int = 3) -> float:
    """Fastest wall time of ``repeats`` calls, seconds (the least disturbed by other load on the machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best

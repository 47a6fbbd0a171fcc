"""Bisection over a monotone predicate: the operating point's batch and the slo fleet's instances."""

from __future__ import annotations


def integer_boundary(predicate, lo: int, hi: int, at_lo: bool) -> tuple[int, int]:
    """Adjacent whole numbers ``(a, a + 1)`` in ``[lo, hi]`` where ``predicate`` changes, for a monotone predicate
    with ``predicate(lo) == at_lo != predicate(hi)`` (bisection; neither end is evaluated again)."""
    while hi - lo > 1:
        middle = (lo + hi) // 2
        if predicate(middle) == at_lo:
            lo = middle
        else:
            hi = middle
    return lo, hi


def largest(predicate, lo: float, hi: float) -> float:
    """Largest b in [lo, hi] with predicate(b) true, for a predicate true below a threshold (bisection)."""
    if predicate(hi):
        return hi
    if not predicate(lo):
        return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if predicate(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(hi, 1.0):
            break
    return lo

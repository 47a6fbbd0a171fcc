"""Has a sample reached steady state? Quarter drifts of a per-request statistic, and the count that would do.

A Monte Carlo sample simulates a finite run of requests that starts cold (empty caches, an empty queue); its
statistics describe the steady state only if the run is long enough for the start-up transient to have died out.
The check compares a statistic (a ratio of per-request sums, e.g. cached input tokens / input tokens) over the last
quarter of the measured requests with the third quarter: their difference, the *drift*, is ~0 in steady state.

Requests needed. The drift is also computed for the run's first half as if it were a run of its own (its own
warm-up fraction and quarters): the state of a cache or a FCFS queue after request ``i`` depends only on the
requests up to ``i`` (exactly for the cache, nearly for the queue), so that is what a run half as long would see
on the same requests. Assuming the drift falls as a power of the run length, ``|drift(n)| = c n^-beta``, the two
scales give ``beta = log2(|drift(n/2)| / |drift(n)|)`` and the count at which ``|drift|`` reaches the tolerance,
``n (|drift(n)| / tolerance)^(1 / beta)``. ``beta`` is bounded to [0.5, 4]: a drift that does not shrink between the
two scales (a sign change, noise) is taken to shrink like sampling noise (``beta = 0.5``), which errs towards
more requests; a fast exponential settling is under-stated by any power law, so the bound above only keeps one
lucky pair of scales from promising too little. It is an estimate from one sample: re-run at that count to check.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mcsim.kernels.steady_state import window_ratios
#: Bounds on the exponent of the drift's power law (see the module docstring).
BETA_MIN, BETA_MAX = 0.5, 4.0
#: Fewest measured requests for which quarters mean anything.
MIN_MEASURED = 8


@dataclass(frozen=True)
class SteadyState:
    """One check of one sample.

    Attributes
    ----------
    drift : float
        Statistic over the last quarter of the measured requests minus over the third quarter (NaN when the run
        is too short to have quarters).
    half_drift : float
        The same for the run's first half taken as a run of its own.
    steady : bool
        ``|drift| <= tolerance`` (True when the drift is NaN: nothing to judge).
    requests_needed : float
        Estimated run length at which ``|drift|`` falls to the tolerance; the run's own length when it is steady.
    """

    drift: float
    half_drift: float
    steady: bool
    requests_needed: float


def quarter_bounds(stop: int, warm: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Index windows (start, stop) of the third and the last quarter of requests ``warm .. stop - 1``."""
    span = stop - warm
    b2, b3 = warm + (2 * span) // 4, warm + (3 * span) // 4
    return (b2, b3), (b3, stop)


def extrapolate(n: int, drift: float, half_drift: float, tolerance: float) -> float:
    """Run length at which ``|drift|`` would reach ``tolerance`` by the power law through the two scales.

    Returns ``n`` when ``|drift| <= tolerance`` or the drift is NaN; rounded up to two significant digits.
    """
    if not math.isfinite(drift) or abs(drift) <= tolerance:
        return float(n)
    beta = BETA_MIN
    if math.isfinite(half_drift) and half_drift != 0.0:
        beta = min(max(math.log2(abs(half_drift) / abs(drift)), BETA_MIN), BETA_MAX)
    needed = n * (abs(drift) / tolerance) ** (1.0 / beta)
    step = 10.0 ** max(math.floor(math.log10(needed)) - 1, 0)
    return float(math.ceil(needed / step) * step)


def check(numerator: np.ndarray, denominator: np.ndarray, windows, tolerance: float) -> SteadyState:
    """Drifts of ``sum(numerator) / sum(denominator)`` over the given quarter windows, and the verdict.

    Parameters
    ----------
    numerator, denominator : array_like, shape (n,)
        Per-request values in request (arrival) order.
    windows : sequence of four (start, stop) pairs
        Third and last quarter of the whole run, then of its first half taken as a run of its own.
    tolerance : float
        Largest ``|drift|`` that counts as steady.
    """
    starts = np.array([w[0] for w in windows], dtype=np.int64)
    stops = np.array([w[1] for w in windows], dtype=np.int64)
    ratios = np.empty(len(windows))
    window_ratios(numerator, denominator, starts, stops, ratios)
    return verdict(ratios, len(numerator), tolerance)


def verdict(ratios, n: int, tolerance: float) -> SteadyState:
    """The check of :func:`check` from the four windows' ratios (NaN for an empty window) of a run of ``n``."""
    drift, half_drift = float(ratios[1] - ratios[0]), float(ratios[3] - ratios[2])
    return SteadyState(drift, half_drift, not abs(drift) > tolerance, extrapolate(n, drift, half_drift, tolerance))


def not_checked(n: int) -> SteadyState:
    """The verdict on a run too short for quarters: nothing to judge."""
    return SteadyState(math.nan, math.nan, True, float(n))

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

Under a rate profile (``workload.rate_profile``) two consecutive quarters see different loads, so their difference
would be the profile's as much as a start-up transient's. There the check compares like with like: the last quarter
of the measured window in whole periods, ``k`` of them (a quarter of its span rounded down, at least one), with the
``k`` periods before them (:func:`profile_windows`): each window sees every hour of the profile ``k`` times. A run
whose measured window spans fewer than two periods cannot be judged that way: its drift is NaN, and the summary
says it was not judged. The second scale of the estimate is again the run's first
half, judged the same way (NaN where it is too short: the exponent then takes its floor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mcsim.kernels.steady_state import window_ratios
#: What a result's ``steady_state_windows`` attribute says its checks compared: at a constant rate, and under a
#: rate profile (:func:`time_windows`).
STEADY_WINDOWS_QUARTERS = "the third and the last quarter of the measured requests"
STEADY_WINDOWS_PROFILE = "the last whole periods of the measured window and as many periods before them"
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
        Statistic over the last quarter of the measured requests minus over the third quarter, or under a rate
        profile over the last whole periods minus as many before them (NaN when the run is too short to judge).
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


def profile_periods(span_s: float, period_s: float) -> int:
    """Under a rate profile, the whole periods in each window of a check over a measured span: a quarter of the
    span, rounded down to whole periods, at least one; 0 when the span holds fewer than two periods (nothing to
    compare like with like).

    Examples
    --------
    >>> profile_periods(900.0, 100.0), profile_periods(250.0, 100.0), profile_periods(150.0, 100.0)
    (2, 1, 0)
    """
    if not span_s >= 2.0 * period_s:
        return 0
    return max(int(span_s // (4.0 * period_s)), 1)


def profile_windows(start: float, end: float, period_s: float):
    """Under a rate profile, the two time windows a check compares in a measured window ``[start, end]``: its last
    ``k`` whole periods and the ``k`` before them (:func:`profile_periods`), so that each sees every hour of the
    profile ``k`` times; None when the window spans fewer than two periods.

    Examples
    --------
    >>> profile_windows(0.0, 900.0, 100.0)
    ((500.0, 700.0), (700.0, 900.0))
    >>> profile_windows(0.0, 150.0, 100.0) is None
    True
    """
    k = profile_periods(end - start, period_s)
    if k == 0:
        return None
    length = k * period_s
    return (end - 2.0 * length, end - length), (end - length, end)


def time_windows(first: float, start: float, end: float, period_s: float = 0.0):
    """The four time windows of a check by arrival time, ``[(lo, hi), ...]``: two in the measured window
    ``[start, end]``, then two in the run's first half taken as a run of its own (it ends half-way from the first
    arrival ``first`` to ``end``; its measured part starts at the same share of its span). Without a profile
    (``period_s`` 0) the third and the last quarter of each; with one, :func:`profile_windows` of each, or
    ``(nan, nan)`` pairs where a run spans fewer than two periods.
    """
    half_end = first + 0.5 * (end - first)
    half_start = first + (start - first) / (end - first) * (half_end - first) if end > first else first
    out = []
    for lo, hi in ((start, end), (half_start, half_end)):
        if period_s > 0:
            pair = profile_windows(lo, hi, period_s)
            out += list(pair) if pair is not None else [(math.nan, math.nan)] * 2
        else:
            out += [(lo + 0.5 * (hi - lo), lo + 0.75 * (hi - lo)), (lo + 0.75 * (hi - lo), hi)]
    return out


#: Under a rate profile the cache check sums its tokens in time bins (from time 0) of a period / PERIOD_BINS, and
#: its windows are whole bins; past MAX_BINS bins the bins merge pairwise (a run of over 256 periods).
PERIOD_BINS = 256
MAX_BINS = 1 << 16


class ProfileBins:
    """Under a rate profile, a check's numerator and denominator summed per time bin, over the measured requests of
    a run and of its first half taken as a run of its own, added request by request in order (integer sums, so the
    verdict does not depend on how the requests are cut into chunks).

    The windows are those of :func:`profile_windows` in whole bins: the ``k`` periods that end with the bin of the
    run's last arrival, and the ``k`` periods before them, for a span from the first measured arrival's bin.

    Parameters
    ----------
    n : int
        Requests of the run.
    warm, warm_half : int
        Warm-up requests of the run and of its first half (``n // 2`` requests).
    period_s : float
        The profile's period, s.
    """

    def __init__(self, n: int, warm: int, warm_half: int, period_s: float):
        self.runs = ((int(warm), int(n)), (int(warm_half), int(n) // 2))
        self.period_s = float(period_s)
        self.merges = 0  # the bins are a period / PERIOD_BINS x 2**merges wide
        self.sums = np.zeros((2, 2, 0), np.int64)  # [run, numerator or denominator, bin]
        self.first = [None, None]  # each run's first measured bin
        self.last = [None, None]  # each run's last bin so far
        self.at = 0

    @property
    def width_s(self) -> float:
        return self.period_s / PERIOD_BINS * 2.0 ** self.merges

    def add(self, arrival_s: np.ndarray, numerator: np.ndarray, denominator: np.ndarray) -> None:
        """The next requests' arrival times (s, in order) and integer values."""
        lo, hi = self.at, self.at + len(arrival_s)
        self.at = hi
        if lo >= hi:
            return
        times = np.asarray(arrival_s, dtype=np.float64)
        while times[-1] / self.width_s >= MAX_BINS:
            self._merge()
        bins = np.floor(times / self.width_s).astype(np.int64)
        for r, (start, stop) in enumerate(self.runs):
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            if a >= b:
                continue
            if self.first[r] is None:
                self.first[r] = int(bins[a])
            self.last[r] = int(bins[b - 1])
            if self.last[r] >= self.sums.shape[2]:
                grown = np.zeros((2, 2, min(max(self.last[r] + 1, 2 * self.sums.shape[2]), MAX_BINS)), np.int64)
                grown[:, :, :self.sums.shape[2]] = self.sums
                self.sums = grown
            for k, values in enumerate((numerator, denominator)):
                counts = np.bincount(bins[a:b], weights=np.asarray(values[a:b], dtype=np.float64))
                self.sums[r, k, :len(counts)] += np.rint(counts).astype(np.int64)

    def _merge(self) -> None:
        """Bins twice as wide: each pair summed (exact), first and last bins halved."""
        size = self.sums.shape[2]
        merged = np.zeros((2, 2, (size + 1) // 2), np.int64)
        np.add.at(merged, (slice(None), slice(None), np.arange(size) // 2), self.sums)
        self.sums = merged
        self.first = [None if b is None else b // 2 for b in self.first]
        self.last = [None if b is None else b // 2 for b in self.last]
        self.merges += 1

    def ratios(self) -> np.ndarray:
        """The four windows' ratios, as :func:`verdict` reads them (NaN where a run is too short to judge)."""
        out = np.full(4, np.nan)
        per_period = PERIOD_BINS / 2.0 ** self.merges  # bins a period (below 1 once merged more than 8 times)
        for r in range(2):
            if self.last[r] is None:
                continue
            span_bins = self.last[r] + 1 - self.first[r]
            k = profile_periods(span_bins * self.width_s, self.period_s)
            step = int(round(1.0 / per_period)) if per_period < 1 else 1  # windows of whole bins
            k -= k % step
            while k > 0 and 2 * int(round(k * per_period)) > span_bins:  # the bins' rounding: a period less
                k -= step
            if k <= 0:
                continue
            length = int(round(k * per_period))
            late = (self.last[r] + 1 - length, self.last[r] + 1)
            early = (late[0] - length, late[0])
            for w, (a, b) in enumerate((early, late)):
                bottom = self.sums[r, 1, a:b].sum()
                out[2 * r + w] = self.sums[r, 0, a:b].sum() / bottom if bottom else np.nan
        return out


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

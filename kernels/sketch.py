"""Mergeable quantile sketch: a log-bucketed histogram of values with a stated relative accuracy.

DDSketch's scheme (Masson, Rim and Lee, "DDSketch: a fast and fully-mergeable quantile sketch with relative-error
guarantees", VLDB 2019). With ``gamma = (1 + alpha) / (1 - alpha)``, bucket ``i`` counts the values in
``(gamma**(i-1), gamma**i]``, those with ``ceil(log(x) / log(gamma)) == i``, and answers a quantile that falls in it
with ``2 gamma**i / (gamma + 1)``: within relative error ``alpha`` of every value of the bucket (at either end the
error is ``(gamma - 1) / (gamma + 1) == alpha``, and less inside). The counts are integers, so merging two sketches
adds their counts and the merge of any split of the data is the sketch of the whole, exactly.

Layout. A sketch is a dense int64 ``counts`` array over a fixed range of keys, chosen from ``alpha`` and a stated
value range ``[min_value, max_value]`` (``first_key = key(min_value)``, ``last_key = key(max_value)``), in the
order of the values it counts:

- ``counts[ZERO]``: values ``<= 0`` (zeros; negatives and ``-inf`` too), reported as 0;
- ``counts[UNDERFLOW]``: ``0 < x < min_value``, reported as ``min_value`` (an upper bound of the value);
- ``counts[FIRST + i - first_key]``, ``first_key <= i <= last_key``: ``min_value <= x <= max_value`` in bucket
  ``i``, reported within relative error ``alpha``;
- ``counts[-1]``: ``x > max_value`` (``+inf`` too), reported as ``max_value`` (a lower bound).

NaN is not counted: the add kernels return how many they skipped. ``buckets = last_key - first_key + 4`` int64
counts, so the memory is ``8 * buckets`` bytes, about ``8 * ln(max_value / min_value) / (2 * alpha)`` (``ln(gamma)
~ 2 alpha``): with the defaults (``alpha = 0.005`` over ``[1e-6, 1e5]`` s, latencies from 10 us to a day with a
decade to spare at each end) 2537 buckets, 20 296 bytes; ``alpha = 0.01`` halves it (1270 buckets, 10 160 bytes).

Beside the counts a float64 ``stats`` array keeps the counted values' exact ``STAT_MIN`` and ``STAT_MAX`` (+inf and
-inf while empty) and their sum as a compensated pair, ``STAT_SUM + STAT_SUM_ERROR``: each addition is Knuth's
error-free TwoSum and the rounding errors are summed apart (Ogita, Rump and Oishi's Sum2), so the sum is within
about one rounding of the exact sum (``math.fsum``) whatever the number of values and however they were split into
chunks, though not bit-identical between splits.

Rank rule. The quantile ``q`` of ``n`` counted values is the value of rank ``k = max(1, ceil(q * n))`` in ascending
order (``q * n`` a float64 product), Hyndman and Fan's definition 1, the inverse of the empirical distribution
function: NumPy's ``np.quantile(values, q, method="inverted_cdf")``. It picks one of the values, never an
interpolation between two, so the estimate is the estimate of the bucket holding that value and the bound holds
for it. Ranks 1 and ``n`` are answered with the exact minimum and maximum, and every estimate is clamped to
``[min, max]``, which only moves it towards the value.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from mcsim.accelerate import kernel

#: Default relative accuracy and value range (seconds): see the module docstring for the memory they imply.
DEFAULT_ALPHA = 0.005
DEFAULT_MIN_VALUE = 1e-6
DEFAULT_MAX_VALUE = 1e5

# Indices into counts: values <= 0, values in (0, min_value), the first regular bucket; the overflow is the last.
ZERO = 0
UNDERFLOW = 1
FIRST = 2
# Indices into stats.
STAT_SUM = 0
STAT_SUM_ERROR = 1
STAT_MIN = 2
STAT_MAX = 3
N_STATS = 4


class Layout(NamedTuple):
    """The bucket layout of a sketch's parameters (see :func:`layout`)."""

    gamma: float
    inverse_log_gamma: float
    first_key: int
    last_key: int
    buckets: int


def layout(alpha: float, min_value: float, max_value: float) -> Layout:
    """The buckets of a sketch of relative accuracy ``alpha`` over ``[min_value, max_value]``.

    Parameters
    ----------
    alpha : float
        Relative accuracy, in (0, 1).
    min_value, max_value : float
        The range of values counted in regular buckets, ``0 < min_value < max_value < inf``.

    Returns
    -------
    Layout
        ``gamma = (1 + alpha) / (1 - alpha)``, ``1 / log(gamma)``, the keys of ``min_value`` and ``max_value``,
        and the length of the counts array (the regular buckets, the zero, underflow and overflow buckets).

    Raises
    ------
    ValueError
        On parameters out of range.

    Examples
    --------
    >>> layout(DEFAULT_ALPHA, DEFAULT_MIN_VALUE, DEFAULT_MAX_VALUE).buckets
    2537
    >>> layout(0.01, 1e-6, 1e5).buckets
    1270
    """
    alpha, min_value, max_value = float(alpha), float(min_value), float(max_value)
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), not {alpha}")
    if not 0.0 < min_value < max_value < math.inf:
        raise ValueError(f"need 0 < min_value < max_value < inf, not min_value={min_value}, max_value={max_value}")
    gamma = (1.0 + alpha) / (1.0 - alpha)
    inverse_log_gamma = 1.0 / math.log(gamma)
    first_key = math.ceil(math.log(min_value) * inverse_log_gamma)
    last_key = math.ceil(math.log(max_value) * inverse_log_gamma)
    return Layout(gamma, inverse_log_gamma, first_key, last_key, last_key - first_key + 4)


def empty_stats() -> np.ndarray:
    """The ``stats`` of an empty sketch: a zero sum, ``min = +inf``, ``max = -inf``."""
    stats = np.zeros(N_STATS)
    stats[STAT_MIN] = np.inf
    stats[STAT_MAX] = -np.inf
    return stats


@kernel(inline="always")
def _two_sum(a, b):
    """``a + b`` rounded and its rounding error, exactly (Knuth's TwoSum); no error where the sum is not finite."""
    total = a + b
    if not math.isfinite(total):
        return total, 0.0
    b_part = total - a
    return total, (a - (total - b_part)) + (b - b_part)


@kernel
def _add(values, mask, masked, counts, stats, inverse_log_gamma, first_key, min_value, max_value):
    overflow = counts.shape[0] - 1
    total = stats[STAT_SUM]
    error = stats[STAT_SUM_ERROR]
    low = stats[STAT_MIN]
    high = stats[STAT_MAX]
    skipped = 0
    for r in range(values.shape[0]):
        if masked and not mask[r]:
            continue
        x = values[r]
        if math.isnan(x):
            skipped += 1
            continue
        if x <= 0.0:
            b = ZERO
        elif x < min_value:
            b = UNDERFLOW
        elif x > max_value:
            b = overflow
        else:
            # the bounds keep a value of the range in a regular bucket whatever the rounding of its logarithm
            b = min(max(int(math.ceil(math.log(x) * inverse_log_gamma)) - first_key + FIRST, FIRST), overflow - 1)
        counts[b] += 1
        total, e = _two_sum(total, x)
        error += e
        low = min(low, x)
        high = max(high, x)
    stats[STAT_SUM] = total
    stats[STAT_SUM_ERROR] = error
    stats[STAT_MIN] = low
    stats[STAT_MAX] = high
    return skipped


@kernel
def add_values(values, counts, stats, inverse_log_gamma, first_key, min_value, max_value):
    """Count a batch of values into a sketch.

    Parameters
    ----------
    values : float64[n]
        The values (seconds, say); NaN is skipped.
    counts : int64[buckets]
        The sketch's counts (see the module docstring), updated in place.
    stats : float64[N_STATS]
        The sketch's sum, sum error, min and max, updated in place.
    inverse_log_gamma : float
        ``1 / log(gamma)``, from :func:`layout`.
    first_key : int
        The key of ``min_value``, from :func:`layout`.
    min_value, max_value : float
        The sketch's value range.

    Returns
    -------
    int
        How many values were NaN, and not counted.

    Examples
    --------
    >>> shape = layout(0.01, 1e-3, 1e3)
    >>> counts = np.zeros(shape.buckets, np.int64); stats = empty_stats()
    >>> add_values(np.array([0.0, 1e-4, 0.5, 2e3, np.nan]), counts, stats, shape.inverse_log_gamma,
    ...            shape.first_key, 1e-3, 1e3)
    1
    >>> int(counts[ZERO]), int(counts[UNDERFLOW]), int(counts[FIRST:-1].sum()), int(counts[-1])
    (1, 1, 1, 1)
    >>> float(stats[STAT_SUM] + stats[STAT_SUM_ERROR]), float(stats[STAT_MIN]), float(stats[STAT_MAX])
    (2000.5001, 0.0, 2000.0)
    """
    return _add(values, np.zeros(0, np.bool_), False, counts, stats, inverse_log_gamma, first_key, min_value,
                max_value)


@kernel
def add_values_masked(values, mask, counts, stats, inverse_log_gamma, first_key, min_value, max_value):
    """:func:`add_values` of ``values[mask]`` (NaN where ``mask`` is False neither counted nor skipped).

    Parameters
    ----------
    values : float64[n]
        The values; NaN where ``mask`` is True is skipped.
    mask : bool[n]
        Which values to count.
    counts, stats, inverse_log_gamma, first_key, min_value, max_value
        As in :func:`add_values`.

    Returns
    -------
    int
        How many values of ``values[mask]`` were NaN, and not counted.
    """
    return _add(values, mask, True, counts, stats, inverse_log_gamma, first_key, min_value, max_value)


@kernel
def merge_into(counts, stats, other_counts, other_stats):
    """Merge sketch B (``other_counts``, ``other_stats``) into sketch A (``counts``, ``stats``) of the same layout.

    Parameters
    ----------
    counts : int64[buckets]
        A's counts, to which B's are added in place.
    stats : float64[N_STATS]
        A's sum, sum error, min and max, combined with B's in place (the sums by TwoSum, as in :func:`add_values`).
    other_counts : int64[buckets]
        B's counts, unchanged.
    other_stats : float64[N_STATS]
        B's stats, unchanged.

    Examples
    --------
    >>> counts = np.array([0, 1, 2, 0], np.int64); stats = np.array([3.0, 0.0, 0.5, 2.0])
    >>> merge_into(counts, stats, np.array([1, 0, 1, 0], np.int64), np.array([1.0, 0.0, 0.0, 1.0]))
    >>> counts.tolist(), stats.tolist()
    ([1, 1, 3, 0], [4.0, 0.0, 0.0, 2.0])
    """
    for b in range(counts.shape[0]):
        counts[b] += other_counts[b]
    total, e = _two_sum(stats[STAT_SUM], other_stats[STAT_SUM])
    stats[STAT_SUM_ERROR] = stats[STAT_SUM_ERROR] + other_stats[STAT_SUM_ERROR] + e
    stats[STAT_SUM] = total
    stats[STAT_MIN] = min(stats[STAT_MIN], other_stats[STAT_MIN])
    stats[STAT_MAX] = max(stats[STAT_MAX], other_stats[STAT_MAX])


@kernel
def quantiles_of(counts, stats, q, gamma, first_key, min_value, max_value, out):
    """Estimate quantiles from a sketch, by the rank rule of the module docstring (NumPy's ``inverted_cdf``).

    Parameters
    ----------
    counts : int64[buckets]
        The sketch's counts.
    stats : float64[N_STATS]
        The sketch's stats (its min and max are read).
    q : float64[m]
        Probabilities in [0, 1], in any order.
    gamma : float
        ``(1 + alpha) / (1 - alpha)``, from :func:`layout`.
    first_key : int
        The key of ``min_value``, from :func:`layout`.
    min_value, max_value : float
        The sketch's value range.
    out : float64[m]
        Filled with the estimates: within relative error ``alpha`` of the quantile where it lies in
        ``[min_value, max_value]``; 0 where it is ``<= 0``; ``min_value`` below the range (an upper bound),
        ``max_value`` above it (a lower bound); each clamped to ``[min, max]``, exactly ``min`` at rank 1 and
        ``max`` at rank ``n``. NaN where ``q`` is NaN or the sketch is empty.

    Examples
    --------
    >>> shape = layout(0.01, 1e-3, 1e3)
    >>> counts = np.zeros(shape.buckets, np.int64); stats = empty_stats()
    >>> values = np.array([0.0, 0.1, 0.2, 0.3, 0.4])
    >>> add_values(values, counts, stats, shape.inverse_log_gamma, shape.first_key, 1e-3, 1e3)
    0
    >>> out = np.empty(3)
    >>> quantiles_of(counts, stats, np.array([0.0, 0.5, 0.7]), shape.gamma, shape.first_key, 1e-3, 1e3, out)
    >>> out.round(4).tolist(), np.quantile(values, [0.0, 0.5, 0.7], method="inverted_cdf").tolist()
    ([0.0, 0.1999, 0.2982], [0.0, 0.2, 0.3])
    """
    n = 0
    for b in range(counts.shape[0]):
        n += counts[b]
    cumulative = np.cumsum(counts)
    overflow = counts.shape[0] - 1
    low = stats[STAT_MIN]
    high = stats[STAT_MAX]
    scale = 2.0 / (gamma + 1.0)
    for j in range(q.shape[0]):
        if n == 0 or math.isnan(q[j]):
            out[j] = np.nan
            continue
        rank = min(max(int(math.ceil(n * q[j])), 1), n)
        if rank == 1:
            out[j] = low
            continue
        if rank == n:
            out[j] = high
            continue
        b = np.searchsorted(cumulative, rank)  # the first bucket whose cumulative count reaches the rank
        if b == ZERO:
            estimate = 0.0
        elif b == UNDERFLOW:
            estimate = min_value
        elif b == overflow:
            estimate = max_value
        else:
            estimate = scale * gamma ** (first_key + b - FIRST)
        out[j] = min(max(estimate, low), high)

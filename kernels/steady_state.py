"""Windowed ratios over per-request values: the sums behind the steady-state checks.

A steady-state check compares a statistic over two windows of consecutive requests (the third and the last
quarter of a sample's measured requests, and the same quarters of a run half as long). Each statistic is a ratio
of sums over a window, e.g. cached input tokens / input tokens (the token hit rate) or queue seconds / requests
(the mean queue wait), so one loop serves every check.
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel


def window_ratios(numerator, denominator, starts, stops, out):
    """``out[w] = sum(numerator[starts[w]:stops[w]]) / sum(denominator[starts[w]:stops[w]])``.

    Parameters
    ----------
    numerator, denominator : float64 array, shape (n,)
        Per-request values, in request order.
    starts, stops : int64 array, shape (w,)
        Window bounds, ``0 <= start <= stop <= n``.
    out : float64 array, shape (w,)
        Filled with each window's ratio; NaN where the window's denominator sums to 0 (an empty window).

    Raises
    ------
    ValueError
        On shapes that disagree or a window out of range.

    Examples
    --------
    >>> out = np.empty(2)
    >>> window_ratios(np.array([1.0, 0.0, 3.0]), np.array([2.0, 2.0, 4.0]), np.array([0, 1], np.int64),
    ...               np.array([2, 3], np.int64), out)
    >>> out.tolist()  # (1 + 0) / (2 + 2), (0 + 3) / (2 + 4)
    [0.25, 0.5]
    """
    numerator = np.ascontiguousarray(numerator, dtype=np.float64)
    denominator = np.ascontiguousarray(denominator, dtype=np.float64)
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    stops = np.ascontiguousarray(stops, dtype=np.int64)
    if numerator.ndim != 1 or numerator.shape != denominator.shape:
        raise ValueError("numerator and denominator must be 1-D arrays of one length")
    if starts.ndim != 1 or starts.shape != stops.shape or not (
            isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == starts.shape
            and out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("starts, stops and out must be 1-D of one length; out writeable C-contiguous float64")
    n = numerator.shape[0]
    if starts.size and (starts.min() < 0 or stops.max() > n or np.any(stops < starts)):
        raise ValueError(f"windows must satisfy 0 <= start <= stop <= {n}")
    _window_ratios(numerator, denominator, starts, stops, out)


@kernel
def _window_ratios(numerator, denominator, starts, stops, out):
    for w in range(starts.shape[0]):
        top = 0.0
        bottom = 0.0
        for i in range(starts[w], stops[w]):
            top += numerator[i]
            bottom += denominator[i]
        out[w] = top / bottom if bottom != 0.0 else np.nan

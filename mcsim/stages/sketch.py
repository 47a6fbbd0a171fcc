"""Latency quantiles of many requests in fixed memory: a mergeable quantile sketch.

A sample of 10^8 requests cannot keep an array per request for each latency (TTFT, TPOT, end to end, queue wait).
:class:`QuantileSketch` counts the values chunk by chunk into a log-bucketed histogram of a stated relative
accuracy instead (DDSketch's scheme, in :mod:`mcsim.kernels.sketch`), and sketches of chunks or of samples merge
into the sketch of all their values exactly. The default, ``alpha = 0.005`` over ``[1e-6, 1e5]`` seconds, is 2537
int64 buckets (20 296 bytes): every quantile of a value in that range is within 0.5 % of NumPy's
``np.quantile(values, q, method="inverted_cdf")``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from mcsim.kernels.sketch import (
    DEFAULT_ALPHA, DEFAULT_MAX_VALUE, DEFAULT_MIN_VALUE, N_STATS, STAT_MAX, STAT_MIN, STAT_SUM, STAT_SUM_ERROR,
    add_values, add_values_masked, empty_stats, layout, merge_into, quantiles_of,
)

#: The names of a sketch's state (:meth:`QuantileSketch.to_state`), in order.
STATE_NAMES = ("parameters", "counts", "stats", "skipped")


class QuantileSketch:
    """Count, sum, min, max and quantiles of a stream of values, within relative error ``alpha``, in fixed memory.

    Parameters
    ----------
    alpha : float, default 0.005
        Relative accuracy of the quantiles, in (0, 1).
    min_value, max_value : float, default 1e-6 and 1e5
        The range within which quantiles keep that accuracy, ``0 < min_value < max_value < inf``. A quantile that
        falls below it is reported as ``min_value`` (an upper bound), above it as ``max_value`` (a lower bound);
        zeros and negative values are counted apart and reported as 0.

    Attributes
    ----------
    alpha, min_value, max_value : float
        The parameters.
    counts : numpy.ndarray of int64
        The buckets (layout in :mod:`mcsim.kernels.sketch`), ``8 * len(counts)`` bytes whatever the values counted.

    Notes
    -----
    Quantiles follow Hyndman and Fan's definition 1: the quantile ``q`` of ``n`` values is the value of rank
    ``max(1, ceil(q * n))``, NumPy's ``method="inverted_cdf"``; ``q = 0`` and ``q = 1`` give the exact min and
    max. Count, min and max are exact; the sum is compensated (within about one rounding of ``math.fsum`` of the
    values, whatever the chunks). Merging adds integer counts, so the merge of the sketches of any split of the
    values has the counts, and so the quantiles, of the sketch of all of them.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> values = rng.lognormal(-3.0, 1.5, 100_000)  # latencies in seconds, spanning decades
    >>> sketch = QuantileSketch()
    >>> for chunk in np.array_split(values, 4):  # chunk by chunk: no array of every value is needed
    ...     skipped = sketch.add(chunk)
    >>> q = [0.5, 0.9, 0.99, 0.999]
    >>> exact = np.quantile(values, q, method="inverted_cdf")
    >>> bool(np.all(np.abs(sketch.quantiles(q) - exact) <= 0.005 * exact))
    True
    >>> sketch.count, bool(np.isclose(sketch.mean, values.mean(), rtol=1e-14)), sketch.max == float(values.max())
    (100000, True, True)

    Only some values (a mask), NaN skipped and said, sketches merged, and the state as plain arrays:

    >>> other = QuantileSketch()
    >>> other.add([0.2, np.nan, 5.0, 7.0], mask=[True, True, True, False])
    1
    >>> other.count, other.skipped, other.quantiles(0.5)
    (2, 1, 0.2)
    >>> sketch.merge(other).count
    100002
    >>> state = sketch.to_state()
    >>> sorted((name, array.shape) for name, array in state.items())
    [('counts', (2537,)), ('parameters', (3,)), ('skipped', ()), ('stats', (4,))]
    >>> QuantileSketch.from_state(state) == sketch
    True
    >>> QuantileSketch(alpha=0.01).merge(sketch)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: cannot merge sketches of different parameters: ...
    """

    def __init__(self, alpha: float = DEFAULT_ALPHA, min_value: float = DEFAULT_MIN_VALUE,
                 max_value: float = DEFAULT_MAX_VALUE):
        self._layout = layout(alpha, min_value, max_value)
        self.alpha, self.min_value, self.max_value = float(alpha), float(min_value), float(max_value)
        self.counts = np.zeros(self._layout.buckets, dtype=np.int64)
        self._stats = empty_stats()
        self._skipped = 0

    # -- adding and merging ----------------------------------------------------------------------------------------

    def add(self, values, mask=None) -> int:
        """Count ``values`` (any shape), or ``values[mask]``; NaN is not counted.

        Parameters
        ----------
        values : array_like of float
            The values, in the unit of ``min_value`` and ``max_value`` (seconds for latencies).
        mask : array_like of bool, optional
            Of the shape of ``values``: count only where True (the measured requests, say).

        Returns
        -------
        int
            How many of the values (of those the mask selects) were NaN, and skipped; :attr:`skipped` adds them up.

        Raises
        ------
        ValueError
            On a mask of another shape.
        """
        values = np.asarray(values, dtype=np.float64)
        shape = self._layout
        if mask is None:
            skipped = add_values(np.ascontiguousarray(values).ravel(), self.counts, self._stats,
                                 shape.inverse_log_gamma, shape.first_key, self.min_value, self.max_value)
        else:
            mask = np.asarray(mask)
            if mask.shape != values.shape or mask.dtype != np.bool_:
                raise ValueError(f"mask must be a boolean array of the values' shape {values.shape}, not "
                                 f"{mask.dtype} {mask.shape}")
            skipped = add_values_masked(np.ascontiguousarray(values).ravel(), np.ascontiguousarray(mask).ravel(),
                                        self.counts, self._stats, shape.inverse_log_gamma, shape.first_key,
                                        self.min_value, self.max_value)
        self._skipped += int(skipped)
        return int(skipped)

    def merge(self, other: QuantileSketch) -> QuantileSketch:
        """Add ``other``'s values to this sketch (``other`` is unchanged) and return this sketch.

        Raises
        ------
        TypeError
            Where ``other`` is not a :class:`QuantileSketch`.
        ValueError
            Where the two sketches' parameters differ.
        """
        if not isinstance(other, QuantileSketch):
            raise TypeError(f"can merge a QuantileSketch only, not {type(other).__name__}")
        if other.parameters != self.parameters:
            raise ValueError(f"cannot merge sketches of different parameters: (alpha, min_value, max_value) = "
                             f"{self.parameters} and {other.parameters}")
        merge_into(self.counts, self._stats, other.counts, other._stats)
        self._skipped += other._skipped
        return self

    def copy(self) -> QuantileSketch:
        """An independent copy."""
        return QuantileSketch.from_state(self.to_state())

    # -- what it holds ---------------------------------------------------------------------------------------------

    @property
    def parameters(self) -> tuple[float, float, float]:
        """``(alpha, min_value, max_value)``."""
        return self.alpha, self.min_value, self.max_value

    @property
    def nbytes(self) -> int:
        """Bytes of the counts (the sketch's size, fixed by its parameters)."""
        return self.counts.nbytes

    @property
    def count(self) -> int:
        """How many values were counted (NaN excluded)."""
        return int(self.counts.sum())

    @property
    def skipped(self) -> int:
        """How many NaN values were skipped, over every add and merge."""
        return self._skipped

    @property
    def sum(self) -> float:
        """Sum of the counted values (compensated: within about one rounding of the exact sum)."""
        return float(self._stats[STAT_SUM] + self._stats[STAT_SUM_ERROR])

    @property
    def mean(self) -> float:
        """Mean of the counted values; NaN when none was."""
        count = self.count
        return self.sum / count if count else math.nan

    @property
    def min(self) -> float:
        """Least counted value, exactly; NaN when none was."""
        return float(self._stats[STAT_MIN]) if self.count else math.nan

    @property
    def max(self) -> float:
        """Greatest counted value, exactly; NaN when none was."""
        return float(self._stats[STAT_MAX]) if self.count else math.nan

    def quantiles(self, q):
        """Estimates of the quantiles ``q`` of the counted values (the rank rule of the class's Notes).

        Parameters
        ----------
        q : float or array_like of float
            Probabilities in [0, 1].

        Returns
        -------
        float or numpy.ndarray
            Of the shape of ``q``: each within relative error ``alpha`` of
            ``np.quantile(values, q, method="inverted_cdf")`` where that lies in ``[min_value, max_value]``; 0 where
            it is ``<= 0``; ``min_value`` or ``max_value`` (clamped to ``[min, max]``) below or above the range.
            NaN when no value was counted.

        Raises
        ------
        ValueError
            On a probability outside [0, 1] (or NaN).
        """
        probabilities = np.asarray(q, dtype=np.float64)
        if not np.all((probabilities >= 0.0) & (probabilities <= 1.0)):
            raise ValueError("quantiles must be in the range [0, 1]")
        flat = np.ascontiguousarray(probabilities).ravel()
        out = np.empty(flat.shape[0])
        shape = self._layout
        quantiles_of(self.counts, self._stats, flat, shape.gamma, shape.first_key, self.min_value, self.max_value,
                     out)
        return float(out[0]) if probabilities.ndim == 0 else out.reshape(probabilities.shape)

    # -- state as plain arrays -------------------------------------------------------------------------------------

    def to_state(self) -> dict[str, np.ndarray]:
        """The sketch as plain arrays (copies), for a result or a checkpoint to carry.

        Returns
        -------
        dict of str to numpy.ndarray
            ``parameters``: float64 ``[alpha, min_value, max_value]``; ``counts``: the int64 buckets; ``stats``:
            float64 ``[sum, sum error, min, max]`` (the sum is their first two added; min and max are +inf and
            -inf while empty); ``skipped``: int64 scalar, the NaN skipped. ``np.savez(path, **state)`` writes them.
        """
        return {
            "parameters": np.array(self.parameters, dtype=np.float64),
            "counts": self.counts.copy(),
            "stats": self._stats.copy(),
            "skipped": np.array(self._skipped, dtype=np.int64),
        }

    @classmethod
    def from_state(cls, state: Mapping) -> QuantileSketch:
        """The sketch of a :meth:`to_state` (a dict, an ``np.load`` of an ``.npz``, ...), with copies of its arrays.

        Raises
        ------
        ValueError
            Where the arrays do not make a sketch of their parameters.
        """
        missing = [name for name in STATE_NAMES if name not in state]
        if missing:
            raise ValueError(f"a sketch's state needs {', '.join(STATE_NAMES)}; missing {', '.join(missing)}")
        parameters = np.asarray(state["parameters"], dtype=np.float64)
        if parameters.shape != (3,):
            raise ValueError(f"parameters must be [alpha, min_value, max_value], not of shape {parameters.shape}")
        sketch = cls(*(float(p) for p in parameters))
        counts, stats = np.asarray(state["counts"]), np.asarray(state["stats"])
        skipped = np.asarray(state["skipped"])
        if counts.shape != sketch.counts.shape or not np.issubdtype(counts.dtype, np.integer) or np.any(counts < 0):
            raise ValueError(f"counts must be {sketch.counts.shape[0]} counts >= 0 for these parameters, not "
                             f"{counts.dtype} {counts.shape}")
        if stats.shape != (N_STATS,) or skipped.shape != () or not np.issubdtype(skipped.dtype, np.integer):
            raise ValueError(f"stats must be {N_STATS} floats and skipped one integer")
        sketch.counts[:] = counts
        sketch._stats[:] = stats
        sketch._skipped = int(skipped)
        return sketch

    def __eq__(self, other) -> bool:
        if not isinstance(other, QuantileSketch):
            return NotImplemented
        return (self.parameters == other.parameters and np.array_equal(self.counts, other.counts)
                and np.array_equal(self._stats, other._stats) and self._skipped == other._skipped)

    __hash__ = None

    def __repr__(self) -> str:
        return (f"QuantileSketch(alpha={self.alpha}, min_value={self.min_value}, max_value={self.max_value}; "
                f"count={self.count}, skipped={self._skipped})")

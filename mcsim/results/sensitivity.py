"""Global sensitivity of a Monte Carlo output to its uncertain inputs, from the samples a run already drew.

Pure functions over NumPy arrays: ``X`` is ``(n_samples, n_inputs)``, one column per uncertain input, and ``y`` is
``(n_samples,)``, one output value per sample. Nothing here re-runs the model ("given data" estimators):

- :func:`spearman` — rank correlation of each input with the output (monotone association, others ignored);
- :func:`prcc` — partial rank correlation: the rank correlation that remains once the other inputs' (ranked)
  linear effects are removed from both sides (Marino et al. 2008, J. Theor. Biol. 254:178-196);
- :func:`first_order_sobol` — first-order Sobol index Var(E[y | x_i]) / Var(y), estimated as a bias-corrected
  correlation ratio over equal-count bins of x_i;
- :func:`prcc_bootstrap` — seeded percentile bootstrap intervals for PRCC.

Rows with a non-finite value in ``y`` or in any column of ``X`` are dropped first (complete cases): an infeasible
sample has no defined output. An index that cannot be estimated is NaN; pass ``return_reasons=True`` to get a
reason per input as well (``""`` where the value is defined).

Example
-------
>>> rng = np.random.default_rng(0)
>>> X = rng.uniform(size=(500, 3))
>>> y = 3 * X[:, 0] + X[:, 1] + 0.1 * rng.normal(size=500)
>>> np.round(prcc(X, y), 1)
array([1. , 0.9, 0. ])
"""

from __future__ import annotations

import numpy as np

#: Fewest samples for which :func:`first_order_sobol` returns an estimate.
SOBOL_MIN_SAMPLES = 64
#: Most bins :func:`default_bins` uses: more bins cut the discretisation bias but raise the variance.
SOBOL_MAX_BINS = 40


def rank(values: np.ndarray) -> np.ndarray:
    """Ranks 1..n along axis 0, ties given their average rank (as ``scipy.stats.rankdata(method="average")``).

    Parameters
    ----------
    values : array_like, shape (n,) or (n, k)

    Returns
    -------
    numpy.ndarray of float, same shape.
    """
    a = np.asarray(values, dtype=float)
    if a.ndim == 1:
        return _rank1d(a)
    return np.column_stack([_rank1d(a[:, j]) for j in range(a.shape[1])]) if a.shape[1] else a.copy()


def _rank1d(v: np.ndarray) -> np.ndarray:
    order = np.argsort(v, kind="mergesort")
    sorted_v = v[order]
    starts_group = np.r_[True, sorted_v[1:] != sorted_v[:-1]]
    group = np.cumsum(starts_group) - 1
    first = np.flatnonzero(starts_group)
    last = np.r_[first[1:], v.size] - 1
    out = np.empty(v.size)
    out[order] = ((first + last) / 2.0 + 1.0)[group]
    return out


def _complete_cases(X, y) -> tuple[np.ndarray, np.ndarray]:
    X = np.asarray(X, dtype=float)
    y = np.asarray(y, dtype=float)
    if X.ndim == 1:
        X = X[:, None]
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise ValueError(f"expected X of shape (n, k) and y of shape (n,), got {X.shape} and {y.shape}")
    keep = np.isfinite(y) & np.all(np.isfinite(X), axis=1)
    return X[keep], y[keep]


def _constant(a: np.ndarray) -> np.ndarray:
    """Columns (or a vector) with no spread at all."""
    if a.shape[0] == 0:
        return np.ones(a.shape[1:], dtype=bool)
    return np.all(a == a[:1], axis=0)


def _finish(values, reasons, return_reasons):
    return (values, tuple(reasons)) if return_reasons else values


def spearman(X, y, *, return_reasons: bool = False):
    """Spearman rank correlation of each input with the output.

    Parameters
    ----------
    X : array_like, shape (n, k)
        Input values per sample.
    y : array_like, shape (n,)
        Output value per sample.
    return_reasons : bool
        Also return a tuple of k strings saying why an entry is NaN.

    Returns
    -------
    numpy.ndarray, shape (k,)
        Correlations in [-1, 1]; NaN for a constant input or output, or fewer than 3 complete samples.
    """
    X, y = _complete_cases(X, y)
    n, k = X.shape
    values = np.full(k, np.nan)
    reasons = [""] * k
    if n < 3:
        return _finish(values, [f"only {n} complete samples"] * k, return_reasons)
    if _constant(y):
        return _finish(values, ["output is constant"] * k, return_reasons)
    ry = rank(y)
    ry = (ry - ry.mean()) / np.sqrt(np.sum((ry - ry.mean()) ** 2))
    for j in range(k):
        if _constant(X[:, j]):
            reasons[j] = "input is constant"
            continue
        rx = rank(X[:, j])
        rx -= rx.mean()
        values[j] = float(np.clip(rx @ ry / np.sqrt(rx @ rx), -1.0, 1.0))
    return _finish(values, reasons, return_reasons)


def prcc(X, y, *, return_reasons: bool = False):
    """Partial rank correlation coefficient of each input with the output.

    Ranks every column and the output, then for input i takes the correlation of what is left of rank(x_i) and of
    rank(y) after a linear regression (with intercept) on the ranks of all other varying inputs. Computed in one go
    from the inverse P of the rank correlation matrix: PRCC_i = -P[i, y] / sqrt(P[i, i] P[y, y]), which equals the
    residual definition exactly.

    Parameters
    ----------
    X : array_like, shape (n, k)
    y : array_like, shape (n,)
    return_reasons : bool
        Also return a tuple of k strings saying why an entry is NaN.

    Returns
    -------
    numpy.ndarray, shape (k,)
        PRCC in [-1, 1]. NaN for a constant input (it is left out of the regressions of the others), for all
        inputs when the output is constant, when n <= k + 2 (k = varying inputs: too few degrees of freedom for
        the residuals), when the input ranks are collinear, or when the output's rank is an exact linear function
        of the other input ranks (no residual); +-1 where it is an exact linear function including x_i.
    """
    X, y = _complete_cases(X, y)
    n, k = X.shape
    values = np.full(k, np.nan)
    if _constant(y):
        return _finish(values, ["output is constant"] * k, return_reasons)
    constant = _constant(X)
    reasons = ["input is constant" if c else "" for c in constant]
    varying = np.flatnonzero(~constant)
    kv = varying.size
    if kv == 0:
        return _finish(values, reasons, return_reasons)
    if n <= kv + 2:
        why = f"{n} complete samples are too few for {kv} varying inputs (PRCC needs n > k + 2)"
        return _finish(values, [r or why for r in reasons], return_reasons)
    ranks = np.column_stack([rank(X[:, varying]), rank(y)])
    corr = np.corrcoef(ranks, rowvar=False)
    if np.linalg.eigvalsh(corr[:kv, :kv]).min() < 1e-10:
        why = "the input ranks are collinear: a partial correlation is undefined"
        return _finish(values, [r or why for r in reasons], return_reasons)
    if np.linalg.eigvalsh(corr).min() < 1e-12:
        # rank(y) = c + sum_j b_j rank(x_j) exactly: the residual of rank(y) given the others is b_i times that of
        # rank(x_i), so the partial correlation is sign(b_i), and undefined (0 / 0) where b_i = 0.
        design = np.column_stack([np.ones(n), ranks[:, :kv]])
        slope = np.linalg.lstsq(design, ranks[:, kv], rcond=None)[0][1:]
        defined = np.abs(slope) > 1e-9 * np.abs(slope).max()
        values[varying[defined]] = np.sign(slope[defined])
        why = "the output rank is an exact linear function of the other input ranks (no residual)"
        for j in varying[~defined]:
            reasons[j] = why
        return _finish(values, reasons, return_reasons)
    precision = np.linalg.inv(corr)
    partial = -precision[:kv, kv] / np.sqrt(np.diag(precision)[:kv] * precision[kv, kv])
    values[varying] = np.clip(partial, -1.0, 1.0)
    return _finish(values, reasons, return_reasons)


def prcc_bootstrap(X, y, n_boot: int = 200, level: float = 0.90, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap interval of :func:`prcc` per input.

    Samples are resampled with replacement (ranks recomputed on each resample), ``n_boot`` times, from a
    ``numpy.random.default_rng(seed)`` stream, so the same call gives the same interval.

    Parameters
    ----------
    X : array_like, shape (n, k)
    y : array_like, shape (n,)
    n_boot : int
        Bootstrap replicates.
    level : float
        Two-sided coverage, e.g. 0.90 for the 5 % and 95 % percentiles.
    seed : int

    Returns
    -------
    (low, high) : two numpy.ndarray of shape (k,)
        NaN where fewer than half of the replicates gave a defined PRCC.
    """
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    X, y = _complete_cases(X, y)
    n, k = X.shape
    rng = np.random.default_rng(seed)
    reps = np.full((n_boot, k), np.nan)
    for b in range(n_boot):
        idx = rng.integers(0, n, n) if n else np.zeros(0, dtype=int)
        reps[b] = prcc(X[idx], y[idx])
    low = np.full(k, np.nan)
    high = np.full(k, np.nan)
    alpha = (1.0 - level) / 2.0
    for j in range(k):
        r = reps[:, j][np.isfinite(reps[:, j])]
        if r.size * 2 >= n_boot and r.size:
            low[j], high[j] = np.quantile(r, [alpha, 1.0 - alpha])
    return low, high


def default_bins(n: int) -> int:
    """Equal-count bins for the correlation ratio: about sqrt(n), at least 2, at most :data:`SOBOL_MAX_BINS`."""
    return int(np.clip(round(np.sqrt(max(n, 0))), 2, SOBOL_MAX_BINS))


def first_order_sobol(X, y, bins: int | None = None, *, min_samples: int = SOBOL_MIN_SAMPLES,
                      return_reasons: bool = False):
    """First-order Sobol index of each input, from given data.

    S_i = Var(E[y | x_i]) / Var(y). The samples are split into ``bins`` equal-count bins of x_i (by rank; tied
    values always share a bin, so a discrete input gets at most one bin per value) and the between-bin share of
    the variance, the correlation ratio eta^2 = SSB / SST, estimates S_i. Even when y does not depend on x_i at
    all, SSB has expectation (M - 1) sigma^2 for M bins, so eta^2 is biased up by about (M - 1) / (n - 1); the
    estimator subtracts that pure-noise share, with sigma^2 estimated by the within-bin mean square
    MSW = SSW / (n - M): S_i = (SSB - (M - 1) MSW) / SST. That is Kelley's epsilon^2, the unbiased correlation
    ratio (T. L. Kelley 1935, "An unbiased correlation ratio measure", PNAS 21:554-559). Binning itself biases the
    estimate down a little when E[y | x_i] varies within a bin; given-data estimators of this kind are discussed by
    Plischke, Borgonovo & Smith (2013), "Global sensitivity measures from given data", EJOR 226:536-550.

    Parameters
    ----------
    X : array_like, shape (n, k)
        Input values per sample. Inputs are assumed independent (as mcsim draws them).
    y : array_like, shape (n,)
    bins : int, optional
        Bins per input; default :func:`default_bins` (n).
    min_samples : int
        Below this many complete samples every index is NaN: the estimate would be mostly noise.
    return_reasons : bool
        Also return a tuple of k strings saying why an entry is NaN.

    Returns
    -------
    numpy.ndarray, shape (k,)
        Estimates of S_i. Not clipped: a small negative value means "indistinguishable from 0".
    """
    X, y = _complete_cases(X, y)
    n, k = X.shape
    values = np.full(k, np.nan)
    if n < min_samples:
        return _finish(values, [f"{n} complete samples; first-order Sobol needs at least {min_samples}"] * k,
                       return_reasons)
    if _constant(y):
        return _finish(values, ["output is constant"] * k, return_reasons)
    n_bins = default_bins(n) if bins is None else int(bins)
    if n_bins < 2:
        raise ValueError(f"bins must be at least 2, got {bins}")
    reasons = [""] * k
    deviation = y - y.mean()
    total = float(deviation @ deviation)
    for j in range(k):
        if _constant(X[:, j]):
            reasons[j] = "input is constant"
            continue
        # (average rank - 1) * M / n lies in [0, M): equal counts, and ties share a bin.
        which = np.minimum(((rank(X[:, j]) - 1.0) * n_bins / n).astype(np.int64), n_bins - 1)
        counts = np.bincount(which, minlength=n_bins)
        sums = np.bincount(which, weights=deviation, minlength=n_bins)
        used = counts > 0
        between = float(np.sum(sums[used] ** 2 / counts[used]))
        m = int(used.sum())
        if n <= m:
            reasons[j] = "as many bins as samples"
            continue
        within_mean_square = (total - between) / (n - m)
        values[j] = (between - (m - 1) * within_mean_square) / total
    return _finish(values, reasons, return_reasons)

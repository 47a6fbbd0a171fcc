"""Sensitivity indices against scipy, a slow least-squares reference and models with known indices."""

import numpy as np
import pytest
import scipy.stats
from hypothesis import assume, given
from hypothesis import strategies as st

from mcsim.results import sensitivity
from mcsim.results.sensitivity import first_order_sobol, prcc, prcc_bootstrap, rank, spearman


def prcc_reference(X, y):
    """PRCC by its definition: for each input, regress rank(x_i) and rank(y) on the other ranks (with intercept)
    by explicit least squares and correlate the residuals."""
    R = np.column_stack([scipy.stats.rankdata(X[:, j]) for j in range(X.shape[1])])
    ry = scipy.stats.rankdata(y)
    out = []
    for i in range(X.shape[1]):
        others = np.column_stack([np.ones(len(y)), np.delete(R, i, axis=1)])
        res_x = R[:, i] - others @ np.linalg.lstsq(others, R[:, i], rcond=None)[0]
        res_y = ry - others @ np.linalg.lstsq(others, ry, rcond=None)[0]
        out.append(res_x @ res_y / np.sqrt((res_x @ res_x) * (res_y @ res_y)))
    return np.array(out)


def ishigami(X, a=7.0, b=0.1):
    return np.sin(X[:, 0]) + a * np.sin(X[:, 1]) ** 2 + b * X[:, 2] ** 4 * np.sin(X[:, 0])


@given(st.integers(0, 10_000), st.integers(5, 60), st.integers(1, 4), st.booleans())
def test_rank_and_spearman_match_scipy(seed, n, k, ties):
    rng = np.random.default_rng(seed)
    X = rng.integers(0, 4, size=(n, k)).astype(float) if ties else rng.normal(size=(n, k))
    y = rng.integers(0, 5, size=n).astype(float) if ties else X[:, 0] + rng.normal(size=n)
    np.testing.assert_array_equal(rank(X), np.column_stack([scipy.stats.rankdata(X[:, j]) for j in range(k)]))
    got = spearman(X, y)
    for j in range(k):
        if np.all(X[:, j] == X[0, j]) or np.all(y == y[0]):
            assert np.isnan(got[j])
        else:
            assert got[j] == pytest.approx(scipy.stats.spearmanr(X[:, j], y).statistic, abs=1e-12)


@given(st.integers(0, 10_000), st.integers(1, 6), st.integers(0, 40))
def test_prcc_matches_least_squares_reference(seed, k, extra):
    rng = np.random.default_rng(seed)
    n = k + 3 + extra
    # correlated inputs, so the partialling-out matters
    X = rng.normal(size=(n, k)) @ (np.eye(k) + 0.5 * rng.uniform(size=(k, k)))
    y = X @ rng.normal(size=k) + rng.normal(size=n)
    # With a handful of samples the output's ranks can be an exact linear function of the inputs' ranks; the
    # partial correlations are then 0/0 and the least-squares reference returns rounding noise: not a reference.
    ranks = np.column_stack([rank(X), rank(y)])
    assume(np.linalg.eigvalsh(np.corrcoef(ranks, rowvar=False)).min() > 1e-8)
    np.testing.assert_allclose(prcc(X, y), prcc_reference(X, y), atol=1e-9)


def test_prcc_order_and_signs_on_a_linear_model():
    rng = np.random.default_rng(7)
    n = 500
    X = rng.uniform(size=(n, 3))
    y = 3 * X[:, 0] + X[:, 1] + 0 * X[:, 2] + 0.3 * rng.normal(size=n)
    p = prcc(X, y)
    assert p[0] > p[1] > 0.3
    # under no effect the sample PRCC has sd ~ 1 / sqrt(n - k); allow 4 sd
    assert abs(p[2]) < 4 / np.sqrt(n - 3)
    p_neg = prcc(X, -y)
    np.testing.assert_allclose(p_neg, -p, atol=1e-12)
    # Spearman sees the same order but, not partialling out x1, a weaker x2
    s = spearman(X, y)
    assert s[0] > s[1] > 0 and s[1] < p[1]


def test_prcc_degenerate_inputs_give_nan_with_reasons():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    X[:, 1] = 2.5
    y = X[:, 0] - X[:, 2] + 0.5 * rng.normal(size=40)
    values, reasons = prcc(X, y, return_reasons=True)
    assert np.isnan(values[1]) and reasons[1] == "input is constant"
    # the constant column is left out of the other regressions
    np.testing.assert_allclose(values[[0, 2]], prcc_reference(X[:, [0, 2]], y), atol=1e-12)
    assert reasons[0] == reasons[2] == ""
    # n <= k + 2 (k counts varying inputs only)
    values, reasons = prcc(X[:4], y[:4], return_reasons=True)
    assert np.all(np.isnan(values)) and "too few" in reasons[0] and reasons[1] == "input is constant"
    assert np.all(np.isfinite(prcc(X[:5], y[:5])[[0, 2]]))
    values, reasons = prcc(X, np.ones(40), return_reasons=True)
    assert np.all(np.isnan(values)) and set(reasons) == {"output is constant"}
    # rank(y) an exact function of rank(x0): partial correlation 1 for x0, 0 / 0 for x2
    values, reasons = prcc(X[:, [0, 2]], np.exp(X[:, 0]), return_reasons=True)
    assert values[0] == 1.0 and np.isnan(values[1]) and "no residual" in reasons[1]
    twins = np.column_stack([X[:, 0], 2 * X[:, 0] + 1, X[:, 2]])
    values, reasons = prcc(twins, y, return_reasons=True)
    assert np.all(np.isnan(values)) and "collinear" in reasons[0]


def test_non_finite_rows_are_dropped():
    rng = np.random.default_rng(5)
    X = rng.normal(size=(80, 3))
    y = X[:, 0] + rng.normal(size=80)
    Xb, yb = X.copy(), y.copy()
    yb[3], Xb[10, 2], yb[20] = np.nan, np.inf, -np.inf
    keep = np.ones(80, bool)
    keep[[3, 10, 20]] = False
    for f in (spearman, prcc, first_order_sobol):
        np.testing.assert_array_equal(f(Xb, yb), f(X[keep], y[keep]))


def test_sobol_ishigami():
    rng = np.random.default_rng(2024)
    n = 4000
    X = rng.uniform(-np.pi, np.pi, size=(n, 3))
    a, b = 7.0, 0.1
    variance = a**2 / 8 + b * np.pi**4 / 5 + b**2 * np.pi**8 / 18 + 0.5
    expected = [0.5 * (1 + b * np.pi**4 / 5) ** 2 / variance, a**2 / 8 / variance, 0.0]  # 0.314, 0.442, 0
    assert expected[0] == pytest.approx(0.3139, abs=1e-4) and expected[1] == pytest.approx(0.4424, abs=1e-4)
    # over 40 replications at n = 4000 the estimator's sd is <= 0.013 and its bias <= 0.002: 0.05 is ~4 sd
    np.testing.assert_allclose(first_order_sobol(X, ishigami(X)), expected, atol=0.05)


def test_sobol_linear_model_analytic():
    rng = np.random.default_rng(11)
    coefficients = np.array([1.0, 2.0, 3.0])
    X = rng.uniform(size=(4000, 3))
    expected = coefficients**2 / np.sum(coefficients**2)  # independent uniform inputs
    # measured sd over replications <= 0.012
    np.testing.assert_allclose(first_order_sobol(X, X @ coefficients), expected, atol=0.04)


def test_sobol_bias_correction_on_pure_noise():
    n, reps = 200, 200
    bins = sensitivity.default_bins(n)
    estimates = []
    for r in range(reps):
        rng = np.random.default_rng(r)
        estimates.append(first_order_sobol(rng.normal(size=(n, 1)), rng.normal(size=n))[0])
    estimates = np.array(estimates)
    uncorrected_bias = (bins - 1) / (n - 1)  # E[eta^2] under no effect
    standard_error = estimates.std() / np.sqrt(reps)
    assert abs(estimates.mean()) < 4 * standard_error
    assert abs(estimates.mean()) < uncorrected_bias / 4


def test_sobol_discrete_input_keeps_ties_in_one_bin():
    rng = np.random.default_rng(8)
    n = 3000
    x = rng.integers(0, 3, size=n).astype(float)  # Var = 2/3
    y = x + rng.normal(size=n)  # S = (2/3) / (2/3 + 1) = 0.4
    assert first_order_sobol(x[:, None], y)[0] == pytest.approx(0.4, abs=0.05)


def test_sobol_needs_64_samples():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(63, 2))
    values, reasons = first_order_sobol(X, X[:, 0], return_reasons=True)
    assert np.all(np.isnan(values)) and "64" in reasons[0]
    assert np.all(np.isfinite(first_order_sobol(rng.normal(size=(64, 2)), rng.normal(size=64))))


def test_bootstrap_is_seeded_and_covers_the_estimate():
    rng = np.random.default_rng(4)
    X = rng.uniform(size=(120, 3))
    y = 3 * X[:, 0] - X[:, 1] + 0.5 * rng.normal(size=120)
    low, high = prcc_bootstrap(X, y, n_boot=150, seed=9)
    low2, high2 = prcc_bootstrap(X, y, n_boot=150, seed=9)
    np.testing.assert_array_equal(low, low2)
    np.testing.assert_array_equal(high, high2)
    estimate = prcc(X, y)
    assert np.all(low <= high)
    assert low[0] > 0.5 and high[1] < 0 and low[2] < 0 < high[2]
    assert np.all((low - 0.05 <= estimate) & (estimate <= high + 0.05))

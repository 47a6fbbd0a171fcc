"""Distributions: quantiles, draws and means against scipy.stats; nested parameters; parameter errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from scipy import stats

from mcsim.scenario.distributions import Dist, DistributionError, parse

KEY = "section.key"


def frozen_choice(values, weights):
    """scipy's discrete law over the value indices, and the values themselves."""
    w = np.asarray(weights, float) / np.sum(weights)
    return stats.rv_discrete(values=(np.arange(len(values)), w)), np.asarray(values, float)


# Scenario table -> the same law in scipy's own parametrization (written out from scipy's docs, not from mcsim).
CONTINUOUS = {
    "uniform": ({"dist": "uniform", "low": 2.0, "high": 5.0}, stats.uniform(loc=2.0, scale=3.0)),
    "loguniform": ({"dist": "loguniform", "low": 1.0, "high": 1000.0}, stats.loguniform(1.0, 1000.0)),
    "normal": ({"dist": "normal", "mean": 3.0, "sd": 2.0}, stats.norm(loc=3.0, scale=2.0)),
    "normal-truncated": ({"dist": "normal", "mean": 3.0, "sd": 2.0, "low": 0.0, "high": 4.0},
                         stats.truncnorm((0.0 - 3.0) / 2.0, (4.0 - 3.0) / 2.0, loc=3.0, scale=2.0)),
    "normal-low-only": ({"dist": "normal", "mean": 1.0, "sd": 1.0, "low": 0.0},
                        stats.truncnorm(-1.0, np.inf, loc=1.0, scale=1.0)),
    "normal-high-only": ({"dist": "normal", "mean": 0.0, "sd": 0.5, "high": -0.2},
                         stats.truncnorm(-np.inf, -0.4, loc=0.0, scale=0.5)),
    "lognormal": ({"dist": "lognormal", "median": 300.0, "sigma": 0.8}, stats.lognorm(s=0.8, scale=300.0)),
    "beta": ({"dist": "beta", "a": 17, "b": 3}, stats.beta(17, 3)),
    "beta-scaled": ({"dist": "beta", "a": 2, "b": 5, "low": 10.0, "high": 30.0},
                    stats.beta(2, 5, loc=10.0, scale=20.0)),
    "beta-high-only": ({"dist": "beta", "a": 3, "b": 2, "high": 4.0}, stats.beta(3, 2, loc=0.0, scale=4.0)),
    "triangular": ({"dist": "triangular", "low": 1.0, "mode": 2.0, "high": 5.0},
                   stats.triang(c=0.25, loc=1.0, scale=4.0)),
    "triangular-mode-at-low": ({"dist": "triangular", "low": 0.0, "mode": 0.0, "high": 2.0},
                               stats.triang(c=0.0, loc=0.0, scale=2.0)),
    "triangular-mode-at-high": ({"dist": "triangular", "low": 25e3, "mode": 40e3, "high": 40e3},
                                stats.triang(c=1.0, loc=25e3, scale=15e3)),
}

CHOICE = {"dist": "choice", "values": [1, 2, 4], "weights": [0.2, 0.3, 0.5]}

# Uniforms in (0, 1) that avoid the choice law's cdf steps (0.2, 0.5) exactly.
U = (np.arange(400) + 0.5) / 400


def dist(table, allow_nested=False) -> Dist:
    return parse(table, KEY, allow_nested=allow_nested)


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_ppf_matches_scipy_quantiles(name):
    table, ref = CONTINUOUS[name]
    np.testing.assert_allclose(dist(table).ppf(U), ref.ppf(U), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_ppf_extreme_uniforms_stay_in_support(name):
    table, ref = CONTINUOUS[name]
    u = np.array([1e-12, 1e-6, 1 - 1e-6, 1 - 1e-12])
    x = dist(table).ppf(u)
    lo, hi = ref.support()
    assert np.all(np.isfinite(x)) and np.all(x >= lo) and np.all(x <= hi)
    np.testing.assert_allclose(x, ref.ppf(u), rtol=1e-7)


def test_choice_ppf_matches_scipy_quantiles():
    ref, values = frozen_choice(CHOICE["values"], CHOICE["weights"])
    np.testing.assert_array_equal(dist(CHOICE).ppf(U), values[ref.ppf(U).astype(int)])


def test_choice_without_weights_is_uniform_over_values():
    d = dist({"dist": "choice", "values": [10, 20, 30, 40]})
    np.testing.assert_array_equal(d.ppf(U), np.repeat([10.0, 20.0, 30.0, 40.0], 100))
    assert d.mean() == 25.0


def test_choice_never_picks_a_zero_weight_value():
    d = dist({"dist": "choice", "values": [1, 2, 3], "weights": [0, 1, 0]})
    u = np.concatenate([[0.0], U, [np.nextafter(1.0, 0.0)]])
    assert set(d.ppf(u)) == {2.0}


def test_fixed_value():
    d = dist(7.5)
    assert d.is_fixed and d.kind == "fixed"
    np.testing.assert_array_equal(d.ppf(U[:5]), 7.5)
    np.testing.assert_array_equal(d.sample(np.random.default_rng(0), 5), 7.5)
    assert d.mean() == 7.5
    assert dist({"dist": "fixed", "value": 3}).mean() == 3.0


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_mean_matches_scipy(name):
    table, ref = CONTINUOUS[name]
    assert dist(table).mean() == pytest.approx(ref.mean(), rel=1e-9)


def test_truncated_normal_mean_closed_form():
    # E[X | a < X < b] = mu + sd (phi(alpha) - phi(beta)) / (Phi(beta) - Phi(alpha))
    mu, sd, lo, hi = 3.0, 2.0, 0.0, 4.0
    a, b = (lo - mu) / sd, (hi - mu) / sd
    phi = lambda z: math.exp(-z * z / 2) / math.sqrt(2 * math.pi)  # noqa: E731
    Phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
    expected = mu + sd * (phi(a) - phi(b)) / (Phi(b) - Phi(a))
    assert dist({"dist": "normal", "mean": mu, "sd": sd, "low": lo, "high": hi}).mean() == pytest.approx(expected)


def test_choice_mean():
    assert dist(CHOICE).mean() == pytest.approx(0.2 * 1 + 0.3 * 2 + 0.5 * 4)


@pytest.mark.parametrize("table, expected", [
    ({"dist": "uniform", "low": 3, "high": 3}, 3.0),
    ({"dist": "loguniform", "low": 2, "high": 2}, 2.0),
    ({"dist": "triangular", "low": 4, "mode": 4, "high": 4}, 4.0),
    ({"dist": "lognormal", "median": 5, "sigma": 0}, 5.0),
])
def test_degenerate_laws(table, expected):
    d = dist(table)
    assert d.mean() == pytest.approx(expected)
    np.testing.assert_allclose(d.ppf(U[:7]), expected)


N_SAMPLE = 4000
# Kolmogorov-Smirnov critical value at alpha = 0.001: 1.95 / sqrt(n).
KS_CRITICAL = 1.95 / math.sqrt(N_SAMPLE)


@pytest.mark.parametrize("name", list(CONTINUOUS))
def test_sample_follows_scipy_law(name):
    table, ref = CONTINUOUS[name]
    x = dist(table).sample(np.random.default_rng(12345), N_SAMPLE)
    assert x.shape == (N_SAMPLE,)
    assert stats.kstest(x, ref.cdf).statistic < KS_CRITICAL
    # mean within 4 standard errors
    assert abs(x.mean() - ref.mean()) < 4 * ref.std() / math.sqrt(N_SAMPLE)
    lo, hi = ref.support()
    assert x.min() >= lo and x.max() <= hi


def test_sample_choice_frequencies():
    x = dist(CHOICE).sample(np.random.default_rng(7), N_SAMPLE)
    assert set(np.unique(x)) <= {1.0, 2.0, 4.0}
    for value, p in zip(CHOICE["values"], np.array(CHOICE["weights"]) / sum(CHOICE["weights"])):
        freq = np.mean(x == value)
        assert abs(freq - p) < 4 * math.sqrt(p * (1 - p) / N_SAMPLE)


def test_sample_is_reproducible_with_a_seed():
    d = dist(CONTINUOUS["triangular"][0])
    a = d.sample(np.random.default_rng(3), 100)
    b = d.sample(np.random.default_rng(3), 100)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, d.sample(np.random.default_rng(4), 100))


@given(lo=st.floats(-1e6, 1e6), width=st.floats(1e-3, 1e6), c=st.floats(0.0, 1.0),
       u=st.lists(st.floats(1e-9, 1 - 1e-9), min_size=1, max_size=20))
def test_triangular_ppf_matches_scipy_over_parameters(lo, width, c, u):
    hi = lo + width
    mode = min(max(lo + c * width, lo), hi)
    d = dist({"dist": "triangular", "low": lo, "mode": mode, "high": hi})
    ref = stats.triang(c=(mode - lo) / (hi - lo), loc=lo, scale=hi - lo)
    np.testing.assert_allclose(d.ppf(u), ref.ppf(u), rtol=1e-7, atol=1e-7 * width)


@given(a=st.floats(0.2, 50), b=st.floats(0.2, 50), u=st.lists(st.floats(1e-6, 1 - 1e-6), min_size=1, max_size=20))
def test_beta_ppf_matches_scipy_over_parameters(a, b, u):
    d = dist({"dist": "beta", "a": a, "b": b, "low": -1.0, "high": 3.0})
    np.testing.assert_allclose(d.ppf(u), stats.beta(a, b, loc=-1.0, scale=4.0).ppf(u), rtol=1e-6, atol=1e-9)


# -- nested (uncertain) parameters -------------------------------------------------------------------------

NESTED = {"dist": "lognormal", "median": {"dist": "uniform", "low": 200, "high": 400}, "sigma": 1.0}


def test_nested_parameter_needs_allow_nested():
    with pytest.raises(DistributionError) as err:
        dist(NESTED, allow_nested=False)
    assert err.value.key == f"{KEY}.median"
    assert "per-request" in str(err.value)


def test_nested_parameter_is_listed_and_resolved():
    d = dist(NESTED, allow_nested=True)
    nested = d.nested()
    assert list(nested) == [f"{KEY}.median"]
    inner = nested[f"{KEY}.median"]
    assert (inner.kind, inner.params) == ("uniform", {"low": 200, "high": 400})
    with pytest.raises(ValueError, match="resolve"):
        d.sample(np.random.default_rng(0), 3)

    resolved = d.resolve({f"{KEY}.median": 250.0})
    assert not resolved.nested()
    assert resolved.params == {"median": 250.0, "sigma": 1.0}
    ref = stats.lognorm(s=1.0, scale=250.0)
    np.testing.assert_allclose(resolved.ppf(U), ref.ppf(U), rtol=1e-9)
    assert resolved.mean() == pytest.approx(ref.mean())
    # a distribution without nested parameters resolves to itself
    plain = dist(CONTINUOUS["beta"][0])
    assert plain.resolve({}) is plain


def test_nested_parameter_resolved_to_an_invalid_value_names_the_key():
    d = dist(NESTED, allow_nested=True)
    with pytest.raises(DistributionError) as err:
        d.resolve({f"{KEY}.median": -1.0})
    assert err.value.key == KEY and "median > 0" in str(err.value)


def test_doubly_nested_parameter_is_refused():
    table = {"dist": "lognormal", "sigma": 1.0,
             "median": {"dist": "uniform", "low": {"dist": "uniform", "low": 1, "high": 2}, "high": 400}}
    with pytest.raises(DistributionError) as err:
        dist(table, allow_nested=True)
    assert err.value.key == f"{KEY}.median.low"


def test_nested_parameter_errors_name_the_nested_key():
    table = {"dist": "lognormal", "sigma": 1.0, "median": {"dist": "uniform", "low": 400, "high": 200}}
    with pytest.raises(DistributionError) as err:
        dist(table, allow_nested=True)
    assert err.value.key == f"{KEY}.median"


# -- bad parameters --------------------------------------------------------------------------------------------

BAD = [
    ({"dist": "uniform", "low": 5, "high": 1}, KEY, "low <= high"),
    ({"dist": "loguniform", "low": 10, "high": 1}, KEY, "low <= high"),
    ({"dist": "loguniform", "low": 0, "high": 1}, KEY, "low > 0"),
    ({"dist": "triangular", "low": 5, "mode": 6, "high": 1}, KEY, "low <= high"),
    ({"dist": "triangular", "low": 1, "mode": 6, "high": 5}, KEY, "low <= mode <= high"),
    ({"dist": "normal", "mean": 0, "sd": 0}, KEY, "sd > 0"),
    ({"dist": "normal", "mean": 0, "sd": -1}, KEY, "sd > 0"),
    ({"dist": "normal", "mean": 0, "sd": 1, "low": 2, "high": 1}, KEY, "low < high"),
    ({"dist": "lognormal", "median": 0, "sigma": 1}, KEY, "median > 0"),
    ({"dist": "lognormal", "median": 1, "sigma": -0.1}, KEY, "sigma >= 0"),
    ({"dist": "beta", "a": 0, "b": 1}, KEY, "a > 0"),
    ({"dist": "beta", "a": 1, "b": -2}, KEY, "b > 0"),
    ({"dist": "beta", "a": 1, "b": 1, "low": 3, "high": 2}, KEY, "low < high"),
    ({"dist": "beta", "a": 1, "b": 1, "low": 3}, KEY, "low < high"),  # high defaults to 1
    ({"dist": "beta", "a": 1, "b": 1, "high": -1}, KEY, "low < high"),  # low defaults to 0
    ({"dist": "lognormall", "median": 1, "sigma": 1}, f"{KEY}.dist", "did you mean 'lognormal'"),
    ({"dist": "gamma", "a": 1}, f"{KEY}.dist", "unknown distribution"),
    ({"dist": "uniform", "low": 1, "hihg": 2}, f"{KEY}.hihg", "did you mean 'high'"),
    ({"dist": "lognormal", "median": 1, "sigma": 1, "mean": 3}, f"{KEY}.mean", "unknown parameter"),
    ({"dist": "uniform", "low": 1}, KEY, "needs high"),
    ({"dist": "triangular", "mode": 1}, KEY, "needs low, high"),
    ({"dist": "choice", "values": [1, 2, 3], "weights": [1, 2]}, KEY, "as many weights as values (3)"),
    ({"dist": "choice", "values": []}, KEY, "non-empty list"),
    ({"dist": "choice", "values": 3}, KEY, "non-empty list"),
    ({"dist": "choice", "values": [1, 2], "weights": [1, -1]}, KEY, ">= 0"),
    ({"dist": "choice", "values": [1, 2], "weights": [0, 0]}, KEY, "not all be 0"),
    ({"dist": "choice", "values": [1, "two"]}, KEY, "finite number"),
    ({"dist": "uniform", "low": "1", "high": 2}, KEY, "finite number"),
    ({"dist": "uniform", "low": [1], "high": 2}, KEY, "finite number"),
    ({"dist": "uniform", "low": True, "high": 2}, KEY, "finite number"),
    ({"dist": "uniform", "low": 0, "high": math.inf}, KEY, "finite number"),
    ({"low": 0, "high": 1}, KEY, "'dist' key"),
    ("3", KEY, "a number or a distribution"),
    (True, KEY, "a number or a distribution"),
    ([1, 2], KEY, "a number or a distribution"),
    (math.nan, KEY, "finite"),
    (math.inf, KEY, "finite"),
]


@pytest.mark.parametrize("table, key, fragment", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_parameters_raise_naming_the_dotted_key(table, key, fragment):
    with pytest.raises(DistributionError) as err:
        parse(table, KEY, allow_nested=True)
    assert err.value.key == key
    assert str(err.value).startswith(f"{key}: ")
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)
    assert isinstance(err.value, ValueError)

"""The quantile sketch: every quantile within the stated relative error of NumPy's ``inverted_cdf`` quantile of the
exact data (several distributions), and equal to the estimate of that value's bucket; merges of any split equal to
the sketch of the whole; count, sum, min and max; masks, NaN, zeros, under- and overflow; the state's round trip."""

from __future__ import annotations

import doctest
import io
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcsim.kernels import sketch as sketch_kernels
from mcsim.kernels.sketch import FIRST, UNDERFLOW, ZERO, layout
from mcsim.stages import sketch as sketch_stage
from mcsim.stages.sketch import QuantileSketch

#: Probabilities checked: a fine grid, the tails, and fractions whose product with n rounds across an integer.
Q = np.unique(np.concatenate([np.linspace(0.0, 1.0, 1001), [0.29, 0.57, 0.58, 0.99, 0.999, 0.9999, 1 - 1e-6]]))
#: Slack on the relative error for the rounding of logarithms and powers (gamma**i is off by ~|i| roundings, and a
#: value within that of a bucket's edge may fall in the next bucket).
ROUNDING = 1e-12


def distributions(n=20_000, seed=1):
    """Named data sets within the default range [1e-6, 1e5]: continuous ones spanning decades, point masses,
    zeros and heavy ties."""
    rng = np.random.default_rng(seed)
    atoms = rng.choice([0.0123, 1.0, 7.5, 300.0], size=n, p=[0.5, 0.3, 0.15, 0.05])
    zeros = np.where(rng.random(n) < 0.3, 0.0, rng.lognormal(-2.0, 1.0, n))
    return {
        "lognormal over eight decades": rng.lognormal(-3.0, 2.0, n),
        "log-uniform over the whole range": 10.0 ** rng.uniform(-6.0, 5.0, n),
        "exponential": rng.exponential(0.05, n),
        "pareto tail": (rng.pareto(1.5, n) + 1.0) * 1e-3,
        "point masses": atoms,
        "a third zeros": zeros,
        "heavy ties (rounded to 1 ms)": np.round(rng.lognormal(-3.0, 1.5, n), 3),
        "one value": np.full(n, 0.25),
    }


def bucket_estimate(x, sketch):
    """DDSketch's estimate for the bucket of each value ``x > 0`` of the range, in NumPy."""
    gamma = (1 + sketch.alpha) / (1 - sketch.alpha)
    key = np.ceil(np.log(x) * (1.0 / np.log(gamma)))
    return 2.0 * gamma**key / (gamma + 1.0)


def expected_estimates(values, q, sketch):
    """What the sketch should answer: the exact min and max at ranks 1 and n, 0 for a value <= 0, else the
    estimate of the bucket of the value of that rank, clamped to [min, max]."""
    exact = np.quantile(values, q, method="inverted_cdf")
    n = len(values)
    rank = np.clip(np.ceil(n * q), 1, n)
    out = np.where(exact > 0, bucket_estimate(np.where(exact > 0, exact, 1.0), sketch), 0.0)
    out = np.clip(out, values.min(), values.max())
    return np.where(rank == 1, values.min(), np.where(rank == n, values.max(), out)), exact


def sketch_of(values, **parameters):
    sketch = QuantileSketch(**parameters)
    sketch.add(values)
    return sketch


def test_the_layout_of_the_default_and_its_memory():
    shape = layout(0.005, 1e-6, 1e5)
    assert shape.gamma == pytest.approx(1.005 / 0.995, rel=1e-15)
    assert (shape.first_key, shape.last_key, shape.buckets) == (-1381, 1152, 2537)
    sketch = QuantileSketch()
    assert sketch.parameters == (0.005, 1e-6, 1e5)
    assert sketch.nbytes == 8 * 2537 == 20_296
    assert QuantileSketch(alpha=0.01).nbytes == 8 * 1270
    for bad in [(0.0, 1e-6, 1e5), (1.0, 1e-6, 1e5), (0.01, 0.0, 1.0), (0.01, 1.0, 1.0), (0.01, 1.0, math.inf)]:
        with pytest.raises(ValueError):
            QuantileSketch(*bad)


@pytest.mark.parametrize("alpha", [0.005, 0.01, 0.05])
def test_every_bucket_estimate_is_within_alpha_of_both_its_ends(alpha):
    shape = layout(alpha, 1e-6, 1e5)
    gamma = shape.gamma
    keys = np.arange(shape.first_key, shape.last_key + 1, dtype=np.float64)
    estimate = 2.0 * gamma**keys / (gamma + 1.0)
    for end in (gamma ** (keys - 1), gamma**keys):
        error = np.abs(estimate - end) / end
        assert np.all(error <= alpha + ROUNDING) and np.all(error >= alpha * (1 - 1e-9))


@pytest.mark.parametrize("alpha", [0.005, 0.01, 0.05])
@pytest.mark.parametrize("name", list(distributions()))
def test_every_quantile_is_within_alpha_of_the_exact_one(name, alpha):
    values = distributions()[name]
    sketch = sketch_of(values, alpha=alpha)
    got = sketch.quantiles(Q)
    expected, exact = expected_estimates(values, Q, sketch)
    zero = exact == 0
    assert np.all(got[zero] == 0.0)
    assert np.all(np.abs(got[~zero] - exact[~zero]) <= (alpha + ROUNDING) * exact[~zero])
    # and more strongly: each is the estimate of the bucket that holds the exact quantile
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=0)


def test_the_bound_is_tight_and_the_errors_are_spread():
    values = distributions()["log-uniform over the whole range"]
    for alpha in (0.005, 0.05):
        exact = np.quantile(values, Q[1:-1], method="inverted_cdf")
        error = np.abs(sketch_of(values, alpha=alpha).quantiles(Q[1:-1]) - exact) / exact
        assert error.max() > 0.95 * alpha  # the stated accuracy is what the sketch gives, not a loose bound
        assert 0.3 * alpha < error.mean() < 0.7 * alpha


def test_values_on_bucket_edges_and_on_the_range_ends():
    shape = layout(0.01, 1e-6, 1e5)
    keys = np.arange(shape.first_key, shape.last_key + 1)
    edges = np.concatenate([shape.gamma ** keys.astype(float), [1e-6, 1e5]])
    edges = edges[(edges >= 1e-6) & (edges <= 1e5)]
    sketch = sketch_of(edges, alpha=0.01)
    assert sketch.counts[UNDERFLOW] == sketch.counts[-1] == 0
    exact = np.quantile(edges, Q, method="inverted_cdf")
    assert np.all(np.abs(sketch.quantiles(Q) - exact) <= (0.01 + ROUNDING) * exact)


def test_the_rank_rule_is_numpys_inverted_cdf():
    # each value is a bucket's own estimate, far from the others: the sketch answers exactly the value it picks
    shape = layout(0.01, 1e-6, 1e5)
    centres = 2.0 * shape.gamma ** np.arange(-600.0, 500.0, 3.0) / (shape.gamma + 1.0)
    rng = np.random.default_rng(2)
    for n in range(1, 41):
        values = rng.choice(centres, size=n, replace=False)
        q = np.unique(np.concatenate([Q, np.arange(n + 1) / n]))
        got = sketch_of(values, alpha=0.01).quantiles(q)
        np.testing.assert_allclose(got, np.quantile(values, q, method="inverted_cdf"), rtol=1e-12, atol=0)


def test_count_sum_mean_min_max():
    for values in distributions().values():
        sketch = sketch_of(values)
        assert sketch.count == len(values)
        exact_sum = math.fsum(values)
        assert abs(sketch.sum - exact_sum) <= math.ulp(exact_sum)  # compensated: within one rounding
        assert sketch.mean == pytest.approx(exact_sum / len(values), rel=1e-15)
        assert (sketch.min, sketch.max) == (values.min(), values.max())
        assert (sketch.quantiles(0.0), sketch.quantiles(1.0)) == (values.min(), values.max())


def test_the_sum_is_compensated():
    sketch = sketch_of([1e16, 1.0, -1e16])
    assert sketch.sum == 1.0  # a plain running sum gives 0
    tenths = np.full(1_000_000, 0.1)
    assert sketch_of(tenths).sum == math.fsum(tenths)  # a plain running sum is off by 1.3e-6
    chunked = QuantileSketch()
    for chunk in np.array_split(tenths, 7):
        chunked.merge(sketch_of(chunk))
    assert chunked.sum == math.fsum(tenths)


def test_an_empty_sketch():
    sketch = QuantileSketch()
    assert (sketch.count, sketch.sum, sketch.skipped) == (0, 0.0, 0)
    assert all(math.isnan(x) for x in (sketch.mean, sketch.min, sketch.max, sketch.quantiles(0.5)))
    assert np.all(np.isnan(sketch.quantiles([0.0, 1.0])))
    assert sketch.add([]) == 0 and sketch.count == 0
    assert sketch.copy().merge(sketch) == sketch


@st.composite
def data_and_split(draw):
    """A seed's data (lognormal, zeros, NaN, under- and overflow) and a random assignment of it to chunks."""
    seed = draw(st.integers(0, 2**32 - 1))
    n = draw(st.integers(0, 3000))
    chunks = draw(st.integers(1, 12))
    rng = np.random.default_rng(seed)
    values = rng.lognormal(-2.0, 3.0, n)
    special = rng.random(n)
    values[special < 0.05] = 0.0
    values[(special >= 0.05) & (special < 0.08)] = np.nan
    parameters = draw(st.sampled_from([{}, {"alpha": 0.01, "min_value": 1e-3, "max_value": 10.0}]))
    return values, rng.integers(0, chunks, size=n), chunks, parameters


@given(data_and_split(), st.randoms(use_true_random=False))
def test_merging_any_split_is_the_sketch_of_the_whole(case, random):
    values, assignment, chunks, parameters = case
    whole = QuantileSketch(**parameters)
    assert whole.add(values) == np.isnan(values).sum()
    parts = [sketch_of(values[assignment == c], **parameters) for c in range(chunks)]
    random.shuffle(parts)
    merged = QuantileSketch(**parameters)
    for part in parts:
        merged.merge(part)
    # also as a tree of pairwise merges, in another order
    tree = [part.copy() for part in reversed(parts)]
    while len(tree) > 1:
        tree = [tree[i].merge(tree[i + 1]) if i + 1 < len(tree) else tree[i] for i in range(0, len(tree), 2)]
    for sketch in (merged, tree[0]):
        assert np.array_equal(sketch.counts, whole.counts)
        assert np.array_equal([sketch.count, sketch.skipped, sketch.min, sketch.max],
                              [whole.count, whole.skipped, whole.min, whole.max], equal_nan=True)
        assert np.array_equal(sketch.quantiles(Q), whole.quantiles(Q), equal_nan=True)
        finite = values[~np.isnan(values)]
        exact_sum = math.fsum(finite)
        assert abs(sketch.sum - exact_sum) <= math.ulp(exact_sum)


def test_adding_chunk_by_chunk_is_adding_at_once():
    values = distributions()["lognormal over eight decades"]
    chunked = QuantileSketch()
    for chunk in np.array_split(values, 9):
        chunked.add(chunk)
    whole = sketch_of(values)
    assert np.array_equal(chunked.counts, whole.counts) and (chunked.min, chunked.max) == (whole.min, whole.max)
    assert np.array_equal(chunked.quantiles(Q), whole.quantiles(Q))


def test_a_mask_counts_only_the_values_it_selects():
    rng = np.random.default_rng(3)
    values = rng.lognormal(-3.0, 2.0, (40, 50))
    values[rng.random(values.shape) < 0.1] = np.nan
    mask = rng.random(values.shape) < 0.6
    masked = QuantileSketch()
    assert masked.add(values, mask=mask) == np.isnan(values[mask]).sum()  # NaN outside the mask is not skipped
    selected = QuantileSketch()
    selected.add(values[mask])
    assert masked == selected
    assert masked.add(values, mask=np.zeros(values.shape, bool)) == 0 and masked == selected
    for bad in (mask[:, :10], mask.astype(int), mask.ravel()):
        with pytest.raises(ValueError, match="mask"):
            masked.add(values, mask=bad)


def test_nan_is_skipped_and_said():
    sketch = QuantileSketch()
    assert sketch.add([0.1, np.nan, 0.3, np.nan]) == 2
    assert sketch.add([np.nan]) == 1
    assert (sketch.count, sketch.skipped, sketch.sum) == (2, 3, 0.1 + 0.3)
    other = sketch_of([np.nan, 0.2])
    assert sketch.merge(other).skipped == 4
    assert sketch == sketch_of([0.1, 0.3, 0.2]).merge(sketch_of([np.nan] * 4))
    only_nan = sketch_of([np.nan, np.nan])
    assert only_nan.count == 0 and math.isnan(only_nan.quantiles(0.5))


def test_zeros_and_negatives_are_counted_apart_and_reported_as_zero():
    values = np.array([-2.0, -1.0, 0.0, 0.0, 1.0, 2.0])
    sketch = sketch_of(values)
    assert sketch.counts[ZERO] == 4
    assert sketch.quantiles(0.0) == -2.0  # rank 1: the exact min
    assert sketch.quantiles([0.2, 0.5, 0.6]).tolist() == [0.0, 0.0, 0.0]
    assert sketch.quantiles(1.0) == 2.0
    assert sketch.sum == 0.0 and (sketch.min, sketch.max) == (-2.0, 2.0)


def test_values_out_of_the_range_go_to_the_underflow_and_overflow_buckets():
    rng = np.random.default_rng(4)
    low, high = 1e-3, 1e2
    values = np.concatenate([10 ** rng.uniform(-6, -3, 500), 10 ** rng.uniform(-3, 2, 2000),
                             10 ** rng.uniform(2, 5, 500), [low, high]])
    sketch = sketch_of(values, alpha=0.01, min_value=low, max_value=high)
    assert sketch.counts[UNDERFLOW] == np.sum(values < low)
    assert sketch.counts[-1] == np.sum(values > high)
    assert sketch.counts[FIRST:-1].sum() == np.sum((values >= low) & (values <= high))
    got, exact = sketch.quantiles(Q), np.quantile(values, Q, method="inverted_cdf")
    inner = (exact >= low) & (exact <= high)
    assert np.all(np.abs(got[inner] - exact[inner]) <= (0.01 + ROUNDING) * exact[inner])
    below, above = exact < low, exact > high
    assert np.all((got[below] >= exact[below]) & (got[below] <= low))  # "min_value or below"
    assert np.all((got[above] <= exact[above]) & (got[above] >= high))  # "max_value or above"
    assert np.sum(got[below] == low) == np.sum(below) - 1  # all but rank 1, the exact min
    assert (got[0], got[-1]) == (values.min(), values.max())
    # infinities: +inf overflows, -inf counts with the zeros; both are the exact max and min
    sketch.add([np.inf, -np.inf])
    assert (sketch.counts[-1], sketch.counts[ZERO]) == (np.sum(values > high) + 1, 1)
    assert (sketch.min, sketch.max, sketch.quantiles(1.0)) == (-np.inf, np.inf, np.inf)
    assert math.isnan(sketch.sum)
    assert sketch_of([np.inf, 1.0]).sum == np.inf


def test_all_values_above_the_range_are_clamped_to_their_min_and_max():
    sketch = sketch_of([2e5, 3e5, 4e5, 5e5])
    assert sketch.quantiles([0.0, 0.5, 0.75, 1.0]).tolist() == [2e5, 2e5, 2e5, 5e5]
    sketch = sketch_of([2e-7, 3e-7, 4e-7, 5e-7])
    assert sketch.quantiles([0.0, 0.5, 0.75, 1.0]).tolist() == [2e-7, 5e-7, 5e-7, 5e-7]


def test_a_merge_of_sketches_of_other_parameters_is_refused():
    sketch = sketch_of([0.1, 0.2])
    before = sketch.to_state()
    for parameters in ({"alpha": 0.01}, {"min_value": 1e-5}, {"max_value": 1e4}):
        with pytest.raises(ValueError, match="different parameters"):
            sketch.merge(sketch_of([0.3], **parameters))
    with pytest.raises(TypeError):
        sketch.merge(before)
    assert sketch == QuantileSketch.from_state(before)


def test_the_state_round_trips_as_plain_arrays():
    values = distributions()["a third zeros"]
    sketch = sketch_of(np.concatenate([values, [np.nan]]), alpha=0.01, min_value=1e-4, max_value=1e3)
    state = sketch.to_state()
    assert {name: (array.dtype.kind, array.shape) for name, array in state.items()} == {
        "parameters": ("f", (3,)), "counts": ("i", (sketch.counts.size,)), "stats": ("f", (4,)), "skipped": ("i", ())}
    restored = QuantileSketch.from_state(state)
    assert restored == sketch and restored.skipped == 1
    assert np.array_equal(restored.quantiles(Q), sketch.quantiles(Q)) and restored.sum == sketch.sum
    buffer = io.BytesIO()
    np.savez(buffer, **state)
    buffer.seek(0)
    with np.load(buffer) as saved:
        assert QuantileSketch.from_state(saved) == sketch
    sketch.add([1.0])  # the state is a copy
    assert QuantileSketch.from_state(state) == restored != sketch
    restored.add([1.0])
    assert restored == sketch


def test_a_state_that_is_not_a_sketch_is_refused():
    state = sketch_of([0.5]).to_state()
    for name, wrong in [("counts", state["counts"][:-1]), ("counts", -state["counts"]),
                        ("counts", state["counts"].astype(float)), ("stats", state["stats"][:3]),
                        ("parameters", state["parameters"][:2]), ("parameters", np.array([2.0, 1e-6, 1e5]))]:
        with pytest.raises(ValueError):
            QuantileSketch.from_state({**state, name: wrong})
    with pytest.raises(ValueError, match="missing skipped"):
        QuantileSketch.from_state({k: v for k, v in state.items() if k != "skipped"})


def test_quantiles_take_any_shape_of_probabilities_in_0_1():
    sketch = sketch_of(np.arange(1.0, 101.0))
    assert isinstance(sketch.quantiles(0.5), float)
    assert sketch.quantiles(np.full((2, 3), 0.5)).shape == (2, 3)
    for bad in (-0.1, 1.1, np.nan, [0.5, 2.0]):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            sketch.quantiles(bad)


@pytest.mark.parametrize("module", [sketch_kernels, sketch_stage])
def test_the_docstring_examples(module):
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

"""Speculative decoding: kernel vs reference, exact pass distributions and Leviathan's closed form."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from mcsim.kernels.speculative import (
    CHUNK_MIN_PASSES_PER_DRAFT,
    verify_passes_in_chunks,
)
from mcsim.kernels.speculative import verify_passes as kernel_verify_passes
from scipy import stats

from mcsim.reference.speculative import verify_passes as reference_verify_passes
from mcsim.stages.speculative import (
    expected_tokens_per_pass,
    realized_gain,
    speculative_passes,
)

# A fixed-seed test with a chi-square p-value below this fails; at 1e-4 a correct kernel practically
# never trips it, while a wrong distribution with these sample sizes gives p-values far smaller.
P_VALUE_FLOOR = 1e-4
# Standard errors allowed between a sample mean and its expectation.
Z_TOLERANCE = 4.5
# Chunk thresholds for verify_passes_in_chunks: every pass drawn in chunks, or every pass one by one.
EVERY_PASS_IN_CHUNKS = 1
NO_CHUNKS = 10**9


def leading_accepted_pmf(alpha: float, k: int, decay: float) -> np.ndarray:
    """P(j = m), m = 0..k, from P(j >= m) = prod_{i<m} alpha * decay**i."""
    at_least = np.array([math.prod(alpha * decay**i for i in range(m)) for m in range(k + 2)])
    at_least[k + 1] = 0.0
    return at_least[:-1] - at_least[1:]


def exact_passes_pmf(output_tokens: int, alpha: float, k: int, decay: float) -> np.ndarray:
    """P(passes = p), p = 0..output_tokens, by dynamic programming over the tokens left."""
    pmf_j = leading_accepted_pmf(alpha, k, decay)
    by_remaining = [np.zeros(output_tokens + 1) for _ in range(output_tokens + 1)]
    by_remaining[0][0] = 1.0
    for remaining in range(1, output_tokens + 1):
        for j, probability in enumerate(pmf_j):
            after = remaining - min(1 + j, remaining)
            by_remaining[remaining][1:] += probability * by_remaining[after][:-1]
    return by_remaining[output_tokens]


def chi_square_p_value(observed_passes: np.ndarray, pmf: np.ndarray) -> float:
    """Goodness of fit of observed pass counts to pmf, merging sparse bins into their neighbours."""
    counts = np.bincount(observed_passes, minlength=pmf.size).astype(float)
    assert counts.size == pmf.size, "a pass count outside the support of the exact distribution"
    expected = pmf * observed_passes.size
    merged_observed, merged_expected = [], []
    observed_sum = expected_sum = 0.0
    for observed_bin, expected_bin in zip(counts, expected):
        observed_sum += observed_bin
        expected_sum += expected_bin
        if expected_sum >= 5.0:
            merged_observed.append(observed_sum)
            merged_expected.append(expected_sum)
            observed_sum = expected_sum = 0.0
    assert len(merged_observed) >= 2, "too few samples for a chi-square test"
    merged_observed[-1] += observed_sum
    merged_expected[-1] += expected_sum
    return float(stats.chisquare(merged_observed, merged_expected).pvalue)


def assert_passes_follow(passes: np.ndarray, pmf: np.ndarray) -> None:
    """Passes drawn from pmf: all equal where pmf is a point mass, else a chi-square fit."""
    if pmf.max() > 1.0 - 1e-12:
        np.testing.assert_array_equal(passes, np.argmax(pmf))
    else:
        assert chi_square_p_value(passes, pmf) > P_VALUE_FLOOR


def run_kernel(output_tokens, acceptance, k, decay, seed, chunk_min_passes_per_draft=None):
    """The public kernel, or verify_passes_in_chunks with an explicit chunk threshold."""
    output_tokens = np.asarray(output_tokens, dtype=np.int64)
    acceptance = np.broadcast_to(np.asarray(acceptance, dtype=np.float64), output_tokens.shape).copy()
    passes = np.empty_like(output_tokens)
    accepted = np.empty_like(output_tokens)
    rng = np.random.default_rng(seed)
    if chunk_min_passes_per_draft is None:
        kernel_verify_passes(output_tokens, acceptance, k, decay, rng, passes, accepted)
    else:
        verify_passes_in_chunks(output_tokens, acceptance, k, decay, chunk_min_passes_per_draft, rng, passes, accepted)
    return passes, accepted


# --- closed form -------------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, 1, 2, 4, 8])
def test_closed_form_is_leviathan_geometric_sum(k):
    alpha = np.array([0.0, 0.3, 0.6, 0.85, 0.99])
    leviathan = (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
    np.testing.assert_allclose(expected_tokens_per_pass(alpha, k), leviathan, rtol=1e-12)
    assert expected_tokens_per_pass(1.0, k) == k + 1
    assert expected_tokens_per_pass(0.0, k) == 1.0


def test_closed_form_with_decay_hand_values():
    assert expected_tokens_per_pass(0.8, 2, decay=0.9) == pytest.approx(1 + 0.8 + 0.8 * 0.72)
    assert expected_tokens_per_pass(1.0, 3, decay=0.5) == pytest.approx(1 + 1 + 0.5 + 0.125)
    assert expected_tokens_per_pass(np.full((2, 3), 0.5), 1).shape == (2, 3)


# --- kernel against the closed form --------------------------------------------------------------


@pytest.mark.parametrize(
    ("alpha", "k", "decay"),
    [
        (0.5, 1, 1.0),
        (0.1, 1, 1.0),
        (0.85, 1, 1.0),
        (0.99, 1, 1.0),
        (0.8, 4, 1.0),
        (0.95, 8, 1.0),
        (0.3, 3, 1.0),
        (0.9, 4, 0.8),
        (1.0, 5, 0.7),
    ],
)
def test_kernel_mean_passes_agrees_with_leviathan(alpha, k, decay):
    # Passes N for L tokens is the first n with S_n >= L, where S_n sums per-pass gains of mean E;
    # S_N lies in [L, L + k], so by Wald's identity E[N] lies in [L / E, (L + k) / E] exactly.
    output_tokens, requests = 2000, 400
    passes, _ = run_kernel(np.full(requests, output_tokens), alpha, k, decay, seed=11)
    tokens_per_pass = expected_tokens_per_pass(alpha, k, decay)
    standard_error = passes.std(ddof=1) / math.sqrt(requests)
    assert output_tokens / tokens_per_pass - Z_TOLERANCE * standard_error <= passes.mean()
    assert passes.mean() <= (output_tokens + k) / tokens_per_pass + Z_TOLERANCE * standard_error


def test_deepseek_v3_mtp_band():
    # DeepSeek-V3: one MTP draft token with 85-90 % second-token acceptance, ~1.8x decode speed.
    band = expected_tokens_per_pass(np.array([0.85, 0.90]), 1)
    np.testing.assert_allclose(band, [1.85, 1.90])
    output_tokens, requests = 4000, 200
    for alpha in (0.85, 0.90):
        passes, _ = run_kernel(np.full(requests, output_tokens), alpha, 1, 1.0, seed=5)
        simulated = output_tokens * requests / passes.sum()
        relative_error = passes.std(ddof=1) / math.sqrt(requests) / passes.mean()
        assert 1.85 * (1 - Z_TOLERANCE * relative_error) <= simulated
        assert simulated <= 1.90 * (1 + Z_TOLERANCE * relative_error) + 1 / passes.mean()
    # The reported speed cannot exceed the raw tokens per pass, and a few percent of overhead per
    # draft token brings the band to it.
    assert realized_gain(band, 1, 0.0, 0.0).min() >= 1.8
    assert realized_gain(band, 1, 0.03, 0.0)[0] == pytest.approx(1.80, abs=0.01)
    assert realized_gain(band, 1, 0.03, 0.025)[1] == pytest.approx(1.80, abs=0.01)


# --- exact distribution of passes (it is fixed by the distribution of j) --------------------------


@pytest.mark.parametrize(
    ("output_tokens", "alpha", "k", "decay"),
    [(12, 0.6, 3, 1.0), (9, 0.85, 1, 1.0), (15, 0.9, 4, 1.0), (7, 0.35, 5, 1.0), (12, 0.9, 3, 0.7), (10, 1.0, 4, 0.6)],
)
def test_pass_distribution_matches_exact(output_tokens, alpha, k, decay):
    pmf = exact_passes_pmf(output_tokens, alpha, k, decay)
    passes, _ = run_kernel(np.full(20_000, output_tokens), alpha, k, decay, seed=3)
    assert chi_square_p_value(passes, pmf) > P_VALUE_FLOOR
    reference_passes, _ = reference_verify_passes([output_tokens] * 3000, [alpha] * 3000, k, decay, random.Random(3))
    assert chi_square_p_value(np.array(reference_passes), pmf) > P_VALUE_FLOOR


def test_leading_accepted_distribution_with_one_pass_left_open():
    # With output_tokens == k + 1 the first pass ends the request exactly when j == k, so the share of
    # one-pass requests is P(j == k) = alpha**k (Bernoulli, checked to its standard error).
    alpha, k, requests = 0.7, 3, 40_000
    passes, _ = run_kernel(np.full(requests, k + 1), alpha, k, 1.0, seed=8)
    share = np.mean(passes == 1)
    assert abs(share - alpha**k) <= Z_TOLERANCE * math.sqrt(alpha**k * (1 - alpha**k) / requests)


def test_kernel_matches_reference_per_request():
    # Mixed per-request acceptance and lengths; paired differences have mean zero if both simulate
    # the same process.
    rng = np.random.default_rng(21)
    requests = 3000
    output_tokens = rng.integers(1, 60, requests)
    acceptance = rng.beta(8, 2, requests)
    for k, decay in [(4, 1.0), (3, 0.85)]:
        passes, accepted = run_kernel(output_tokens, acceptance, k, decay, seed=2)
        reference_passes, reference_accepted = reference_verify_passes(
            output_tokens.tolist(), acceptance.tolist(), k, decay, random.Random(2)
        )
        for fast, slow in [(passes, reference_passes), (accepted, reference_accepted)]:
            difference = fast - np.asarray(slow)
            standard_error = difference.std(ddof=1) / math.sqrt(requests)
            assert abs(difference.mean()) <= Z_TOLERANCE * standard_error


# --- passes drawn in chunks ----------------------------------------------------------------------


@pytest.mark.parametrize(("k", "decay"), [(1, 1.0), (3, 1.0), (3, 0.7)])
@pytest.mark.parametrize("alpha", [0.0, 0.5, 0.85, 1.0])
@pytest.mark.parametrize("output_tokens", [1, 2, 3, 10, 41])
def test_chunked_pass_distribution_matches_exact(output_tokens, alpha, k, decay):
    # Every pass drawn in chunks, down to the last token; alpha == 1 with decay < 1 draws no binomial
    # for the certain first position.
    pmf = exact_passes_pmf(output_tokens, alpha, k, decay)
    passes, accepted = run_kernel(np.full(10_000, output_tokens), alpha, k, decay, 17, EVERY_PASS_IN_CHUNKS)
    assert_passes_follow(passes, pmf)
    np.testing.assert_array_equal(passes + accepted, output_tokens)


@pytest.mark.parametrize("threshold", [EVERY_PASS_IN_CHUNKS, CHUNK_MIN_PASSES_PER_DRAFT, NO_CHUNKS])
@pytest.mark.parametrize(
    ("output_tokens", "alpha", "k", "decay"),
    [(200, 0.85, 1, 1.0), (333, 0.5, 1, 1.0), (301, 0.85, 2, 1.0), (400, 0.8, 3, 0.9)],
)
def test_pass_distribution_does_not_depend_on_chunk_threshold(output_tokens, alpha, k, decay, threshold):
    # The default threshold draws these requests partly in chunks, partly pass by pass.
    pmf = exact_passes_pmf(output_tokens, alpha, k, decay)
    passes, _ = run_kernel(np.full(10_000, output_tokens), alpha, k, decay, 23, threshold)
    assert_passes_follow(passes, pmf)


def test_chunked_mean_passes_for_very_long_outputs():
    # A million tokens at k == 1: E[N] lies in [L / E, (L + 1) / E] by Wald's identity (see above).
    output_tokens, alpha, requests = 1_000_000, 0.85, 300
    passes, accepted = run_kernel(np.full(requests, output_tokens), alpha, 1, 1.0, 31, EVERY_PASS_IN_CHUNKS)
    tokens_per_pass = expected_tokens_per_pass(alpha, 1)
    standard_error = passes.std(ddof=1) / math.sqrt(requests)
    assert output_tokens / tokens_per_pass - Z_TOLERANCE * standard_error <= passes.mean()
    assert passes.mean() <= (output_tokens + 1) / tokens_per_pass + Z_TOLERANCE * standard_error
    # Each pass gains 1 + Bernoulli(alpha), so Var(N) ~ L * alpha * (1 - alpha) / E**3 (renewal CLT);
    # the sample variance of 300 normal draws is within 30 % of it with room to spare.
    assert passes.var(ddof=1) == pytest.approx(output_tokens * alpha * (1 - alpha) / tokens_per_pass**3, rel=0.3)
    np.testing.assert_array_equal(passes + accepted, output_tokens)


def test_chunked_matches_reference_per_request():
    rng = np.random.default_rng(42)
    requests = 1000
    output_tokens = rng.integers(1, 400, requests)
    acceptance = rng.beta(17, 3, requests)
    for k in (1, 2):
        passes, accepted = run_kernel(output_tokens, acceptance, k, 1.0, seed=6)
        reference_passes, reference_accepted = reference_verify_passes(
            output_tokens.tolist(), acceptance.tolist(), k, 1.0, random.Random(6)
        )
        for fast, slow in [(passes, reference_passes), (accepted, reference_accepted)]:
            difference = fast - np.asarray(slow)
            standard_error = difference.std(ddof=1) / math.sqrt(requests)
            assert abs(difference.mean()) <= Z_TOLERANCE * standard_error


@pytest.mark.parametrize("threshold", [EVERY_PASS_IN_CHUNKS, NO_CHUNKS])
def test_chunked_exact_cases(threshold):
    output_tokens = np.array([1, 2, 3, 4, 5, 99, 1000, 1001])
    half = -(-output_tokens // 2)
    # k == 1 never looks at decay: alpha == 1 is certain, and the chunks must not draw Binomial(n, 1).
    passes, accepted = run_kernel(output_tokens, 1.0, 1, 0.5, 0, threshold)
    np.testing.assert_array_equal(passes, half)
    np.testing.assert_array_equal(accepted, output_tokens - half)
    # A rejection among these ~5e5 positions has probability ~5e-7.
    passes, _ = run_kernel(np.tile(output_tokens, 100), 1.0 - 1e-12, 1, 1.0, 0, threshold)
    np.testing.assert_array_equal(passes, np.tile(half, 100))
    passes, _ = run_kernel(np.tile(output_tokens, 100), 1e-200, 3, 1.0, 0, threshold)
    np.testing.assert_array_equal(passes, np.tile(output_tokens, 100))


# --- exact cases and invariants ----------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 5])
def test_caps_are_exact_for_certain_acceptance(k):
    output_tokens = np.array([1, 2, k, k + 1, k + 2, 3 * k + 3, 100])
    for alpha, expected in [(1.0, -(-output_tokens // (k + 1))), (0.0, output_tokens)]:
        passes, accepted = run_kernel(output_tokens, alpha, k, 1.0, seed=0)
        np.testing.assert_array_equal(passes, expected)
        np.testing.assert_array_equal(accepted, output_tokens - expected)
        reference_passes, reference_accepted = reference_verify_passes(
            output_tokens.tolist(), [alpha] * output_tokens.size, k, 1.0, random.Random(0)
        )
        assert reference_passes == passes.tolist()
        assert reference_accepted == accepted.tolist()


def test_no_drafts_means_one_pass_per_token():
    output_tokens = np.array([1, 5, 17, 400])
    passes, accepted = run_kernel(output_tokens, [0.2, 0.9, 1.0, 0.5], 0, 0.8, seed=1)
    np.testing.assert_array_equal(passes, output_tokens)
    np.testing.assert_array_equal(accepted, 0)


def test_underflowing_acceptance_power():
    # alpha**k underflows to 0.0 here; the inversion must still give j == 0 almost surely.
    passes, _ = run_kernel(np.full(100, 50), 1e-200, 3, 1.0, seed=4)
    np.testing.assert_array_equal(passes, 50)


@given(
    output_tokens=st.lists(st.integers(1, 3000), min_size=1, max_size=40),
    alpha=st.floats(0.0, 1.0),
    k=st.integers(0, 10),
    decay=st.floats(0.05, 1.0),
    seed=st.integers(0, 2**32 - 1),
    threshold=st.sampled_from([None, EVERY_PASS_IN_CHUNKS, NO_CHUNKS]),
)
def test_invariants(output_tokens, alpha, k, decay, seed, threshold):
    output_tokens = np.array(output_tokens, dtype=np.int64)
    passes, accepted = run_kernel(output_tokens, alpha, k, decay, seed, threshold)
    np.testing.assert_array_equal(passes + accepted, output_tokens)
    assert np.all(passes >= -(-output_tokens // (k + 1)))
    assert np.all(passes <= output_tokens)
    assert np.all(accepted >= 0)


def test_same_seed_same_result():
    rng = np.random.default_rng(0)
    output_tokens = rng.integers(1, 500, 1000)
    acceptance = rng.uniform(0.0, 1.0, 1000)
    for k, decay in [(4, 1.0), (4, 0.9), (1, 1.0)]:
        first = speculative_passes(output_tokens, acceptance, k, decay, np.random.default_rng(99))
        second = speculative_passes(output_tokens, acceptance, k, decay, np.random.default_rng(99))
        other = speculative_passes(output_tokens, acceptance, k, decay, np.random.default_rng(100))
        np.testing.assert_array_equal(first[0], second[0])
        np.testing.assert_array_equal(first[1], second[1])
        assert not np.array_equal(first[0], other[0])


# --- orchestration ---------------------------------------------------------------------------


def test_speculative_passes_broadcasts_scalar_acceptance():
    passes, accepted = speculative_passes([10, 10, 3], 1.0, 4, 1.0, np.random.default_rng(0))
    assert passes.tolist() == [2, 2, 1]
    assert accepted.tolist() == [8, 8, 2]
    assert passes.dtype == np.int64 and accepted.dtype == np.int64


@pytest.mark.parametrize(
    ("output_tokens", "acceptance", "k", "decay", "message"),
    [
        ([0, 3], 0.5, 2, 1.0, "output_tokens must be >= 1"),
        ([[1, 3]], 0.5, 2, 1.0, "one-dimensional"),
        ([1, 3], [0.5, 1.2], 2, 1.0, "acceptance must lie in"),
        ([1, 3], [0.5, np.nan], 2, 1.0, "acceptance must lie in"),
        ([1, 3], [0.5, 0.5, 0.5], 2, 1.0, "acceptance has shape"),
        ([1, 3], 0.5, -1, 1.0, "draft_tokens"),
        ([1, 3], 0.5, 2.0, 1.0, "draft_tokens"),
        ([1, 3], 0.5, 2, 0.0, "decay"),
        ([1, 3], 0.5, 2, 1.5, "decay"),
    ],
)
def test_speculative_passes_rejects_bad_input(output_tokens, acceptance, k, decay, message):
    with pytest.raises(ValueError, match=message):
        speculative_passes(output_tokens, acceptance, k, decay, np.random.default_rng(0))


def test_realized_gain_hand_values():
    assert realized_gain(3.0, 4, 0.05, 0.1) == pytest.approx(3.0 / 1.6)
    assert realized_gain(2.5, 0, 0.3, 0.3) == 2.5
    np.testing.assert_allclose(realized_gain(np.array([2.0, 3.0]), 2, 0.25, 0.25), [1.0, 1.5])
    with pytest.raises(ValueError, match="draft_cost"):
        realized_gain(2.0, 1, -0.1, 0.0)

"""Speculative decoding: tokens per verification pass and the decode speed-up they buy.

Each verification pass of the target model checks ``k`` drafted tokens and keeps the leading run of
accepted ones plus one token of its own, so a request gains ``1 + j`` tokens per pass (capped by the
tokens it has left). Draft position ``i`` is accepted with probability ``alpha * decay**i``, where
``alpha`` is the request's acceptance rate.

Three quantities are kept apart:

* :func:`expected_tokens_per_pass` -- the closed-form mean of ``1 + j`` for one uncapped pass
  (Leviathan et al. 2023 for ``decay == 1``);
* :func:`speculative_passes` -- the simulated passes per request (the raw draws, caps included);
  raw tokens per pass is ``output_tokens.sum() / passes.sum()``;
* :func:`realized_gain` -- the decode speed-up after paying for drafting and for verifying ``k + 1``
  tokens per sequence instead of 1.

Public check: DeepSeek-V3 predicts one extra token (``k = 1``) by multi-token prediction with a
reported second-token acceptance of 85-90 %, i.e. 1.85-1.90 tokens per pass, and reports about 1.8x
decode speed. Within this model that speed-up corresponds to an overhead
``draft_cost + verify_cost`` of about 3-6 % of a decode step for the one extra token.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.kernels.speculative import verify_passes

@dataclass(frozen=True)
class Inputs:
    """The parameters the speculative stage reads (also its memo key within a sample); ``draft_tokens`` is 0
    when the lever is off."""

    draft_tokens: int
    acceptance_decay: float

    @classmethod
    def from_params(cls, p: dict) -> "Inputs":
        on = bool(p["speculative.enabled"])
        return cls(int(p["speculative.draft_tokens"]) if on else 0, float(p["speculative.acceptance_decay"]))


def expected_tokens_per_pass(alpha, k: int, decay: float = 1.0):
    """Expected tokens gained in one uncapped verification pass.

    ``E = sum_{j=0..k} prod_{i<j} alpha * decay**i``: the pass yields ``1 + j`` tokens and
    ``P(j >= m) = prod_{i<m} alpha * decay**i``. With ``decay == 1`` this is Leviathan et al. (2023),
    ``E = (1 - alpha**(k+1)) / (1 - alpha)``, and ``k + 1`` at ``alpha == 1``.

    Parameters
    ----------
    alpha : float or array_like
        Acceptance rate of the first draft position, in [0, 1].
    k : int
        Draft tokens per pass (>= 0).
    decay : float, default 1.0
        Per-position acceptance decay, in (0, 1].

    Returns
    -------
    float or numpy.ndarray
        Tokens per pass, same shape as ``alpha`` (a float for a scalar ``alpha``). The cap by the
        tokens a request has left is not included: this is the long-output limit.

    Examples
    --------
    >>> round(expected_tokens_per_pass(0.8, 4), 6)  # (1 - 0.8**5) / 0.2
    3.3616
    >>> round(expected_tokens_per_pass(0.8, 2, decay=0.9), 6)  # 1 + 0.8 + 0.8 * 0.72
    2.376
    """
    _check_draft_tokens(k)
    _check_decay(decay)
    alpha_array = np.asarray(alpha, dtype=np.float64)
    _check_unit_interval(alpha_array, "alpha")
    # Summing the terms directly stays accurate near alpha == 1, where the geometric-series quotient
    # would cancel catastrophically.
    total = np.ones_like(alpha_array)
    term = np.ones_like(alpha_array)
    for position in range(k):
        term = term * (alpha_array * decay**position)
        total = total + term
    if total.ndim == 0:
        return float(total)
    return total


def speculative_passes(output_tokens, acceptance, draft_tokens: int, decay: float, rng):
    """Simulate verification passes per request.

    Parameters
    ----------
    output_tokens : array_like of int, shape (n,)
        Tokens each request generates (>= 1).
    acceptance : float or array_like of float, shape (n,)
        Per-request acceptance rate ``alpha`` in [0, 1]; a scalar applies to every request.
    draft_tokens : int
        Draft tokens ``k`` per pass (>= 0); ``k == 0`` is plain decoding (one pass per token).
    decay : float
        Per-position acceptance decay in (0, 1].
    rng : numpy.random.Generator
        Source of randomness; advanced in place.

    Returns
    -------
    passes : numpy.ndarray of int64, shape (n,)
        Verification passes (target-model decode steps) per request.
    accepted : numpy.ndarray of int64, shape (n,)
        Accepted draft tokens each request used; ``passes + accepted == output_tokens``.

    Notes
    -----
    Long requests are drawn in chunks of passes (a few binomial draws per chunk) rather than pass by
    pass, with the same law of ``(passes, accepted)``; see
    :func:`mcsim.kernels.speculative.verify_passes_in_chunks`. The same seed gives the same result.

    Examples
    --------
    >>> import numpy as np
    >>> passes, accepted = speculative_passes([10, 10], [1.0, 0.0], 4, 1.0, np.random.default_rng(0))
    >>> passes.tolist(), accepted.tolist()
    ([2, 10], [8, 0])
    """
    output_array = np.ascontiguousarray(output_tokens, dtype=np.int64)
    if output_array.ndim != 1:
        raise ValueError(f"output_tokens must be one-dimensional, got shape {output_array.shape}")
    if output_array.size and output_array.min() < 1:
        raise ValueError(f"output_tokens must be >= 1, got minimum {output_array.min()}")
    acceptance_array = np.asarray(acceptance, dtype=np.float64)
    if acceptance_array.ndim == 0:
        acceptance_array = np.full(output_array.shape, float(acceptance_array))
    acceptance_array = np.ascontiguousarray(acceptance_array)
    if acceptance_array.shape != output_array.shape:
        raise ValueError(
            f"acceptance has shape {acceptance_array.shape}, expected {output_array.shape} "
            "(one rate per request) or a scalar"
        )
    _check_unit_interval(acceptance_array, "acceptance")
    _check_draft_tokens(draft_tokens)
    _check_decay(decay)
    if not isinstance(rng, np.random.Generator):
        raise TypeError(f"rng must be a numpy.random.Generator, got {type(rng).__name__}")

    passes = np.empty(output_array.shape, dtype=np.int64)
    accepted = np.empty(output_array.shape, dtype=np.int64)
    verify_passes(output_array, acceptance_array, int(draft_tokens), float(decay), rng, passes, accepted)
    return passes, accepted


def realized_gain(tokens_per_pass, draft_tokens: int, draft_cost, verify_cost):
    """Decode speed-up after the cost of drafting and verifying.

    ``gain = tokens_per_pass / (1 + draft_tokens * (draft_cost + verify_cost))``.

    A plain decode step costs 1 and yields one token per sequence. A speculative pass yields
    ``tokens_per_pass`` tokens but costs more:

    * the drafter runs ``k`` times, each costing ``draft_cost`` of a plain decode step (a small draft
      model or an MTP head: a few percent; the target model drafting itself: about 1);
    * the target model verifies ``k + 1`` tokens per sequence instead of 1; each extra token costs
      ``verify_cost`` of a plain step -- close to 0 while decode is memory-bound (weights are read
      once per step whatever the token count), approaching 1 when the step is compute-bound.

    Parameters
    ----------
    tokens_per_pass : float or array_like
        Tokens gained per verification pass (raw, from the draws or :func:`expected_tokens_per_pass`).
    draft_tokens : int
        Draft tokens ``k`` per pass (>= 0).
    draft_cost : float or array_like
        Cost of drafting one token, as a fraction of a plain decode step (>= 0).
    verify_cost : float or array_like
        Cost of verifying one extra token per sequence, as a fraction of a plain decode step (>= 0).

    Returns
    -------
    float or numpy.ndarray
        Realized decode throughput relative to plain decoding (1.0 = no gain).

    Examples
    --------
    DeepSeek-V3 MTP: one draft token, 1.9 tokens per pass, 5 % overhead -> about the reported 1.8x.

    >>> round(realized_gain(1.9, 1, 0.03, 0.02), 3)
    1.81
    """
    gain = np.asarray(tokens_per_pass, dtype=np.float64) / pass_cost(draft_tokens, draft_cost, verify_cost)
    return float(gain) if gain.ndim == 0 else gain


def pass_cost(draft_tokens: int, draft_cost, verify_cost):
    """Cost of one speculative pass in plain decode steps: ``1 + draft_tokens * (draft_cost + verify_cost)``.

    See :func:`realized_gain` for the meaning of the costs.
    """
    _check_draft_tokens(draft_tokens)
    draft_cost_array = np.asarray(draft_cost, dtype=np.float64)
    verify_cost_array = np.asarray(verify_cost, dtype=np.float64)
    if np.any(draft_cost_array < 0) or np.any(verify_cost_array < 0):
        raise ValueError("draft_cost and verify_cost must be >= 0 (fractions of a decode step)")
    cost = 1.0 + draft_tokens * (draft_cost_array + verify_cost_array)
    return float(cost) if cost.ndim == 0 else cost


def _check_draft_tokens(k) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
        raise ValueError(f"draft_tokens must be an integer >= 0, got {k!r}")


def _check_decay(decay) -> None:
    if not 0.0 < float(decay) <= 1.0:
        raise ValueError(f"decay must be in (0, 1], got {decay!r}")


def _check_unit_interval(values: np.ndarray, name: str) -> None:
    if values.size and not (np.all(values >= 0.0) and np.all(values <= 1.0)):
        raise ValueError(f"{name} must lie in [0, 1] (NaN is not allowed)")

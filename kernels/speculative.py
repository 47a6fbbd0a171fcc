"""Speculative decoding: verification passes per request.

A drafter proposes ``k`` tokens; the target model verifies them in one forward pass and keeps the
longest run of leading drafts it accepts, plus one token of its own. A request therefore gains
``1 + j`` tokens per verification pass, where ``j`` is the number of leading accepted drafts, capped by
the tokens it still has to generate. The kernel simulates that pass loop for every request.

Draft position ``i`` (``i = 0 .. k-1``) is accepted with probability ``alpha * decay**i``, independently
of the other positions, where ``alpha`` is the request's acceptance rate.

Long requests are simulated in chunks of passes rather than pass by pass; the chunks draw a few
binomials each and leave the law of the pass count unchanged (see :func:`verify_passes_in_chunks`).
"""

from __future__ import annotations

import math

from mcsim.accelerate import kernel

# A chunk costs up to k binomial draws (a few logarithms each) where a pass costs about one uniform, so
# a chunk is drawn only if it spans at least this many passes per draft position; shorter stretches
# are simulated pass by pass. Either way the law of the result is the same: this only trades speed.
CHUNK_MIN_PASSES_PER_DRAFT = 8


@kernel
def verify_passes(output_tokens, acceptance, draft_tokens, decay, rng, out_passes, out_accepted):
    """Simulate speculative verification passes for each request.

    Parameters
    ----------
    output_tokens : int64[n]
        Tokens each request generates (>= 1), in tokens.
    acceptance : float64[n]
        Per-request acceptance rate ``alpha`` of the first draft position, in [0, 1].
    draft_tokens : int
        Draft length ``k`` per pass (>= 0), in tokens.
    decay : float
        Per-position decay of acceptance in (0, 1]: draft position ``i`` is accepted with probability
        ``alpha * decay**i``.
    rng : numpy.random.Generator
        Source of randomness; advanced in place.
    out_passes : int64[n]
        Filled with the number of verification passes per request.
    out_accepted : int64[n]
        Filled with the accepted draft tokens each request actually used, in tokens. Because every pass
        contributes one token of the target model's own, ``out_passes + out_accepted == output_tokens``.

    Notes
    -----
    :func:`verify_passes_in_chunks` with the default ``CHUNK_MIN_PASSES_PER_DRAFT``: long stretches of
    passes are drawn as chunks of a few binomials, the rest pass by pass, with the same law as the
    pass-by-pass loop throughout.

    Examples
    --------
    >>> import numpy as np
    >>> out = np.array([10, 10]); alpha = np.array([1.0, 0.0])
    >>> passes = np.empty(2, np.int64); accepted = np.empty(2, np.int64)
    >>> verify_passes(out, alpha, 4, 1.0, np.random.default_rng(0), passes, accepted)
    >>> passes.tolist(), accepted.tolist()
    ([2, 10], [8, 0])
    """
    verify_passes_in_chunks(
        output_tokens, acceptance, draft_tokens, decay, CHUNK_MIN_PASSES_PER_DRAFT, rng, out_passes, out_accepted
    )


@kernel
def verify_passes_in_chunks(
    output_tokens, acceptance, draft_tokens, decay, chunk_min_passes_per_draft, rng, out_passes, out_accepted
):
    """:func:`verify_passes` with an explicit threshold between chunks and single passes.

    Parameters
    ----------
    output_tokens, acceptance, draft_tokens, decay, rng, out_passes, out_accepted
        As in :func:`verify_passes`.
    chunk_min_passes_per_draft : int
        A chunk is drawn only if it spans at least ``chunk_min_passes_per_draft * draft_tokens``
        passes; ``1`` draws every pass of a request in chunks, a huge value none. The law of the
        result does not depend on it, only the speed and the random stream consumed.

    Notes
    -----
    The passes of a request are the first ``n`` at which the uncapped gains ``1 + j_1 + ... + 1 + j_n``
    reach its output tokens ``L``: the cap only trims the last pass (a pass with one token left yields
    one token whatever ``j`` is). ``accepted = L - passes`` is a function of that ``n``, so drawing
    ``n`` with the pass-by-pass law draws both outputs with it. Two phases do that.

    *Chunks.* With ``r`` tokens left, the next ``c = ceil(r / (k + 1))`` passes cannot finish the
    request before the last of them, since ``c - 1`` passes yield at most ``(k + 1)(c - 1) <= r - 1``
    tokens; nor is any of those ``c - 1`` passes capped. So only the chunk's total ``T = c + sum(j)``
    matters, not the order of its passes: the request ends with the chunk's last pass if ``T >= r``;
    otherwise ``r - T >= 1`` tokens are left for passes whose drafts are independent of the chunk's,
    which is the state the pass-by-pass loop would be in after the same ``c`` passes. The sum
    ``sum(j) = N_1 + ... + N_k`` counts, for each position ``m``, the passes ``N_m`` of the chunk that
    accepted at least ``m`` leading drafts; each of the ``N_{m-1}`` passes that got that far accepts
    position ``m - 1`` independently with probability ``alpha * decay**(m-1)``, so
    ``N_m ~ Binomial(N_{m-1}, alpha * decay**(m-1))`` given ``N_{m-1}``, with ``N_0 = c``: at most
    ``k`` binomial draws per chunk, and one with ``k == 1`` (MTP). ``r`` shrinks geometrically from
    chunk to chunk, to about ``r * (1 - alpha) / 2`` with ``k == 1``.

    *Single passes.* With ``decay == 1`` the number of leading accepted drafts is geometric truncated
    at ``k`` (``P(j >= m) = alpha**m``), drawn by inversion with one uniform per pass:
    ``j = min(k, floor(log(U) / log(alpha)))``. With ``decay < 1`` positions are drawn one by one
    until the first rejection. A pass with a single token left needs no draw.
    """
    k = draft_tokens
    # ceil(remaining / (k + 1)) >= chunk_min_passes_per_draft * k exactly when
    # remaining >= chunk_min_tokens; a chunk needs at least one token left to make progress.
    chunk_min_tokens = max((chunk_min_passes_per_draft * k - 1) * (k + 1) + 1, 1)
    for r in range(output_tokens.shape[0]):
        remaining = output_tokens[r]
        alpha = acceptance[r]
        if k == 0 or alpha <= 0.0 or remaining <= 1:
            # No draft is ever accepted (or none could be used): one token per pass.
            out_passes[r] = remaining
            out_accepted[r] = 0
            continue
        if alpha >= 1.0 and decay == 1.0:
            # Every draft accepted: k + 1 tokens per pass, the last pass capped.
            passes = (remaining + k) // (k + 1)
            out_passes[r] = passes
            out_accepted[r] = remaining - passes
            continue
        passes = 0
        # Chunks of passes that cannot end the request before their last pass (see Notes).
        while remaining >= chunk_min_tokens:
            chunk = (remaining + k) // (k + 1)
            gained = chunk
            reached = chunk
            position_acceptance = alpha
            for _ in range(k):
                # Binomial(n, 1.0) never returns in Numba's sampler (it inverts with q == 0), and a
                # certain acceptance needs no draw anyway.
                if position_acceptance < 1.0:
                    reached = rng.binomial(reached, position_acceptance)
                if reached == 0:
                    break
                gained += reached
                position_acceptance *= decay
            passes += chunk
            if gained >= remaining:
                remaining = 0
            else:
                remaining -= gained
        if decay == 1.0:
            inverse_log_alpha = 1.0 / math.log(alpha)
            all_accepted_below = alpha**k
            while remaining > 1:
                u = rng.random()
                # The two ends of the inversion need no logarithm: U < alpha**k means j == k and
                # U >= alpha means j == 0 (with k == 1 no logarithm is ever taken).
                if u < all_accepted_below:
                    j = k
                elif u >= alpha:
                    j = 0
                else:
                    # log(u) / log(alpha) >= 0, and +inf when u == 0 (reachable only if alpha**k
                    # underflows to 0): compare as a float before truncating to an integer.
                    leading = math.log(u) * inverse_log_alpha
                    j = k if leading >= k else int(leading)
                gained = j + 1
                if gained > remaining:
                    gained = remaining
                remaining -= gained
                passes += 1
        else:
            while remaining > 1:
                j = 0
                position_acceptance = alpha
                while j < k and rng.random() < position_acceptance:
                    j += 1
                    position_acceptance *= decay
                gained = j + 1
                if gained > remaining:
                    gained = remaining
                remaining -= gained
                passes += 1
        # At most one token left: one more plain pass.
        passes += remaining
        out_passes[r] = passes
        out_accepted[r] = output_tokens[r] - passes

"""Speculative decoding: verification passes per request.

A drafter proposes ``k`` tokens; the target model verifies them in one forward pass and keeps the
longest run of leading drafts it accepts, plus one token of its own. A request therefore gains
``1 + j`` tokens per verification pass, where ``j`` is the number of leading accepted drafts, capped by
the tokens it still has to generate. The kernel simulates that pass loop for every request.

Draft position ``i`` (``i = 0 .. k-1``) is accepted with probability ``alpha * decay**i``, independently
of the other positions, where ``alpha`` is the request's acceptance rate.
"""

from __future__ import annotations

import math

from mcsim.accelerate import kernel


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
    With ``decay == 1`` the number of leading accepted drafts is geometric truncated at ``k``
    (``P(j >= m) = alpha**m``), drawn by inversion with one uniform per pass:
    ``j = min(k, floor(log(U) / log(alpha)))``. With ``decay < 1`` positions are drawn one by one until
    the first rejection. A pass with a single token left needs no draw: whatever ``j`` is, it yields one
    token.

    Examples
    --------
    >>> import numpy as np
    >>> out = np.array([10, 10]); alpha = np.array([1.0, 0.0])
    >>> passes = np.empty(2, np.int64); accepted = np.empty(2, np.int64)
    >>> verify_passes(out, alpha, 4, 1.0, np.random.default_rng(0), passes, accepted)
    >>> passes.tolist(), accepted.tolist()
    ([2, 10], [8, 0])
    """
    k = draft_tokens
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

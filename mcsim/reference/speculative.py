"""Reference for :mod:`mcsim.kernels.speculative`: the verification pass loop in plain Python.

Every draft position gets its own uniform draw, in order, until the first rejection, which is the
definition of "leading accepted drafts" read literally.
"""

from __future__ import annotations

import random


def verify_passes(
    output_tokens: list[int],
    acceptance: list[float],
    draft_tokens: int,
    decay: float,
    rng: random.Random,
) -> tuple[list[int], list[int]]:
    """Verification passes and used accepted drafts per request.

    Parameters
    ----------
    output_tokens : list of int
        Tokens each request generates (>= 1).
    acceptance : list of float
        Per-request acceptance rate ``alpha`` in [0, 1].
    draft_tokens : int
        Drafts ``k`` proposed per pass (>= 0).
    decay : float
        Draft position ``i`` is accepted with probability ``alpha * decay**i``.
    rng : random.Random
        Source of the per-position draws.

    Returns
    -------
    passes, accepted : list of int
        Verification passes per request, and accepted drafts that each request used.
    """
    all_passes = []
    all_accepted = []
    for tokens, alpha in zip(output_tokens, acceptance):
        remaining = tokens
        passes = 0
        accepted = 0
        while remaining > 0:
            leading = 0
            for position in range(draft_tokens):
                if rng.random() < alpha * decay**position:
                    leading += 1
                else:
                    break
            gained = min(1 + leading, remaining)
            accepted += min(leading, remaining - 1)
            remaining -= gained
            passes += 1
        all_passes.append(passes)
        all_accepted.append(accepted)
    return all_passes, all_accepted

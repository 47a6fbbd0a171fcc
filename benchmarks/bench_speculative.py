"""Speculative draws: draft tokens per second, kernel vs the pure-Python reference.

A draft token is one of the ``k`` drafts of one verification pass (``items = passes.sum() * k``).
Each timed call starts a fresh Generator from a fixed seed, so every run processes exactly ``items``.

Run ``python benchmarks/bench_speculative.py`` for a stand-alone report (best of 3, one core).
"""

from __future__ import annotations

import random
import time

import numpy as np

from mcsim.kernels.speculative import verify_passes
from mcsim.reference.speculative import verify_passes as reference_verify_passes

SEED = 20240601
FAST_REQUESTS = 200_000
REFERENCE_REQUESTS = 2_000
OUTPUT_TOKENS = 500


def _workload(requests: int):
    rng = np.random.default_rng(SEED)
    output_tokens = np.full(requests, OUTPUT_TOKENS, dtype=np.int64)
    # Beta(17, 3): per-request acceptance around 0.85, as reported for well-matched drafters.
    acceptance = rng.beta(17.0, 3.0, requests)
    return output_tokens, acceptance


def _case(name: str, draft_tokens: int, decay: float) -> dict:
    output_tokens, acceptance = _workload(FAST_REQUESTS)
    passes = np.empty_like(output_tokens)
    accepted = np.empty_like(output_tokens)

    def fast():
        verify_passes(output_tokens, acceptance, draft_tokens, decay, np.random.default_rng(SEED), passes, accepted)

    fast()  # compile, and count the draft tokens this seed gives
    items_fast = int(passes.sum()) * draft_tokens

    reference_output = output_tokens[:REFERENCE_REQUESTS].tolist()
    reference_acceptance = acceptance[:REFERENCE_REQUESTS].tolist()

    def reference():
        return reference_verify_passes(reference_output, reference_acceptance, draft_tokens, decay, random.Random(SEED))

    items_reference = sum(reference()[0]) * draft_tokens
    return {
        "name": name,
        "unit": "draft tokens",
        "items_fast": items_fast,
        "items_reference": items_reference,
        "fast": fast,
        "reference": reference,
    }


def cases() -> list[dict]:
    """Benchmark cases: geometric fast path (k = 4 and the k = 1 of MTP) and decaying acceptance."""
    return [
        _case("speculative k=4 decay=1", 4, 1.0),
        _case("speculative k=1 decay=1 (MTP)", 1, 1.0),
        _case("speculative k=4 decay=0.9", 4, 0.9),
    ]


def _best_of(function, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    for case in cases():
        fast_rate = case["items_fast"] / _best_of(case["fast"])
        reference_rate = case["items_reference"] / _best_of(case["reference"])
        print(
            f"{case['name']:32s} kernel {fast_rate / 1e6:8.1f} M {case['unit']}/s   "
            f"reference {reference_rate / 1e6:6.2f} M {case['unit']}/s   ratio {fast_rate / reference_rate:6.0f}x"
        )


if __name__ == "__main__":
    main()

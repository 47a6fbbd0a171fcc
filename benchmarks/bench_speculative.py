"""Speculative draws: draft tokens per second, kernel vs the pure-Python reference.

A draft token is one of the ``k`` drafts of one verification pass (``items = passes.sum() * k``).
Each timed call starts a fresh Generator from a fixed seed, so every run processes exactly ``items``.
The workload is 500-1000 output tokens per request with acceptance ~ Beta(17, 3); the kernel draws long
stretches of passes as chunks of binomials, the reference every draft position one by one.

Run ``python benchmarks/bench_speculative.py`` for a stand-alone report (best of 3, one core), which
also times one million MTP requests (k = 1) with chunks and pass by pass.
"""

from __future__ import annotations

import random

import numpy as np
from mcsim.kernels.speculative import verify_passes, verify_passes_in_chunks

from mcsim.reference.speculative import verify_passes as reference_verify_passes
from timing import best_of  # noqa: E402  (benchmarks/ is on sys.path when run)

SEED = 20240601
FAST_REQUESTS = 200_000
REFERENCE_REQUESTS = 2_000
MILLION_REQUESTS = 1_000_000
OUTPUT_TOKENS_RANGE = (500, 1000)
# verify_passes_in_chunks threshold that never draws a chunk: the pass-by-pass kernel.
NO_CHUNKS = 10**9


def _workload(requests: int):
    rng = np.random.default_rng(SEED)
    low, high = OUTPUT_TOKENS_RANGE
    output_tokens = rng.integers(low, high + 1, requests, dtype=np.int64)
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
    """Benchmark cases: the k = 1 of MTP, k = 4, and decaying acceptance."""
    return [
        _case("speculative k=1 decay=1 (MTP)", 1, 1.0),
        _case("speculative k=4 decay=1", 4, 1.0),
        _case("speculative k=4 decay=0.9", 4, 0.9),
    ]



def main() -> None:
    for case in cases():
        fast_rate = case["items_fast"] / best_of(case["fast"])
        reference_rate = case["items_reference"] / best_of(case["reference"])
        print(
            f"{case['name']:32s} kernel {fast_rate / 1e6:8.1f} M {case['unit']}/s   "
            f"reference {reference_rate / 1e6:6.2f} M {case['unit']}/s   ratio {fast_rate / reference_rate:6.0f}x"
        )
    _million_mtp_requests()


def _million_mtp_requests() -> None:
    """One million k = 1 requests: the chunked kernel against the same kernel pass by pass."""
    output_tokens, acceptance = _workload(MILLION_REQUESTS)
    passes = np.empty_like(output_tokens)
    accepted = np.empty_like(output_tokens)

    def chunked():
        verify_passes(output_tokens, acceptance, 1, 1.0, np.random.default_rng(SEED), passes, accepted)

    def pass_by_pass():
        rng = np.random.default_rng(SEED)
        verify_passes_in_chunks(output_tokens, acceptance, 1, 1.0, NO_CHUNKS, rng, passes, accepted)

    pass_by_pass()  # compile
    pass_by_pass_s = best_of(pass_by_pass)
    chunked_s = best_of(chunked)
    low, high = OUTPUT_TOKENS_RANGE
    print(
        f"1 M requests x {low}-{high} tokens, k=1 ({passes.sum() / 1e6:.0f} M passes): chunked {chunked_s:.3f} s, "
        f"pass by pass {pass_by_pass_s:.3f} s, speed-up {pass_by_pass_s / chunked_s:.1f}x"
    )


if __name__ == "__main__":
    main()

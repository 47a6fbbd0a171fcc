"""Steady-state checks: quarter hit rates against a slow reference, the extrapolation's closed form, the flag on a
cold and a warm cache, the estimate of the requests needed against a run at that count, and the batching
simulator's queue-wait drift on a stable and a saturated queue."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

import mcsim
from mcsim.kernels.steady_state import window_ratios
from mcsim.perf.fleet_batching import simulate_batching
from mcsim.results.summary import format_table
from mcsim.stages import kvcache
from mcsim.stages.steady_state import extrapolate

SCENARIOS = __import__("pathlib").Path(__file__).resolve().parents[1] / "scenarios"


def reference_quarter_hit_rates(hits, prompt, warmup_fraction):
    """Token hit rate of the third and the last quarter of the measured requests, with plain Python."""
    n = len(prompt)
    warm = min(int(warmup_fraction * n), n - 1)
    measured = list(range(warm, n))
    q = len(measured)
    third = measured[2 * q // 4:3 * q // 4]
    last = measured[3 * q // 4:]
    rate = lambda rows: sum(hits[r] for r in rows) / sum(prompt[r] for r in rows)  # noqa: E731
    return rate(third), rate(last)


def infinite_cache_hit_blocks(prompts):
    """Leading blocks of each prompt seen before (an unbounded cache): the closed form of reuse."""
    seen, out = set(), []
    for blocks in prompts:
        run = 0
        while run < len(blocks) and blocks[run] in seen:
            run += 1
        out.append(run)
        seen.update(blocks)
    return out


def small_trace(n=400, pool=60, seed=3):
    """Requests: a Zipf-popular shared prefix of 1-6 blocks, then 1-4 blocks of their own."""
    rng = np.random.default_rng(seed)
    prefixes = [list(range(1000 * k, 1000 * k + int(rng.integers(1, 7)))) for k in range(pool)]
    weights = 1.0 / np.arange(1, pool + 1)
    choice = rng.choice(pool, size=n, p=weights / weights.sum())
    prompts, fresh = [], 10**7
    for c in choice:
        own = int(rng.integers(1, 5))
        prompts.append(prefixes[c] + list(range(fresh, fresh + own)))
        fresh += own
    return prompts


def test_window_ratios_kernel_against_python():
    rng = np.random.default_rng(0)
    num, den = rng.random(50), rng.random(50) + 0.1
    starts, stops = np.array([0, 10, 49, 20], np.int64), np.array([50, 11, 49, 35], np.int64)
    out = np.empty(4)
    window_ratios(num, den, starts, stops, out)
    expected = [sum(num[a:b]) / sum(den[a:b]) if b > a else math.nan for a, b in zip(starts, stops)]
    np.testing.assert_allclose(out, expected, rtol=1e-12)
    with pytest.raises(ValueError, match="windows"):
        window_ratios(num, den, np.array([0], np.int64), np.array([51], np.int64), np.empty(1))


@pytest.mark.parametrize("warmup_fraction", [0.0, 0.2, 0.5])
def test_cache_drift_matches_reference_on_a_small_trace(warmup_fraction):
    prompts = small_trace()
    block = 16
    ptr = np.concatenate([[0], np.cumsum([len(p) for p in prompts])]).astype(np.int64)
    ids = np.array([b for p in prompts for b in p], np.int64)
    prompt_tokens = np.array([len(p) * block + 5 for p in prompts], np.int64)  # 5 tokens beyond the whole blocks
    requests = SimpleNamespace(n=len(prompts), block_ptr=ptr, block_ids=ids, block_tokens=block,
                               prompt_tokens=prompt_tokens)
    result = kvcache.cache_hits(requests, "pooled", 1, np.array([10**6, 0, 0]), np.random.default_rng(0))
    hits = [b * block for b in infinite_cache_hit_blocks(prompts)]
    assert result.cached_tokens.sum(axis=1).tolist() == hits  # the cache is the unbounded one here
    check = kvcache.steady_state(result.cached_tokens, prompt_tokens, warmup_fraction, 0.02)
    third, last = reference_quarter_hit_rates(hits, prompt_tokens.tolist(), warmup_fraction)
    assert check.drift == pytest.approx(last - third, abs=1e-12)
    half_third, half_last = reference_quarter_hit_rates(hits[:200], prompt_tokens[:200].tolist(), warmup_fraction)
    assert check.half_drift == pytest.approx(half_last - half_third, abs=1e-12)
    assert check.steady == (abs(last - third) <= 0.02)


def test_extrapolation_closed_forms():
    # The drift fell 4x from n/2 to n: beta = 2, so 4x the tolerance needs 2x the requests.
    assert extrapolate(1000, 0.08, 0.32, 0.02) == 2000.0
    # A drift that did not shrink is taken to shrink like noise (beta = 0.5): (0.08 / 0.02)^2 = 16x.
    assert extrapolate(1000, 0.08, 0.08, 0.02) == 16000.0
    assert extrapolate(1000, -0.08, 0.01, 0.02) == 16000.0
    # beta capped at 4: 2x the tolerance needs 2^(1/4) x the requests, rounded up to two digits.
    assert extrapolate(1000, 0.04, 10.0, 0.02) == 1200.0
    assert extrapolate(1000, 0.01, 0.5, 0.02) == 1000.0  # already steady
    assert extrapolate(1000, math.nan, 0.5, 0.02) == 1000.0


# A cache that never fills and a Zipf pool of long system prompts: the hit rate rises while prompts are first
# seen (cold misses), so a short run is not steady; with three prompts it is warm after a handful of requests.
COLD = ["workload.classes.chat.turns=1", "workload.classes.rag.turns=1", "workload.classes.chat.system_prompt_share=1",
        "workload.system_prompt_tokens=2000", "workload.classes.rag.prompt_tokens=200", "cache.dram_gb_per_node=8192",
        "performance.simulate_batching=false", "deployment.fleet=utilization", "workload.system_prompt_zipf=0.5"]


def run_dense(requests, prompts):
    return mcsim.run(SCENARIOS / "dense-node.toml", samples=2, requests=requests,
                     overrides=COLD + [f"workload.system_prompts={prompts}"])


def test_cold_cache_is_flagged_warm_cache_is_not():
    cold = run_dense(1000, 1000)
    assert (cold["steady_state"] == 0).all()
    assert (cold["cache_hit_rate_drift"] > 0.02).all()  # still rising
    assert (cold["requests_for_steady_state"] > 1000).all()
    assert cold["steady_state"].dtype == np.int8 and cold["cache_hit_rate_drift"].attrs["units"] == "1"
    text = format_table(cold)
    assert "NOT AT STEADY STATE: 2 of 2 sample runs" in text
    assert f"--set mc.requests={int(cold['requests_for_steady_state'].max())}" in text

    warm = run_dense(6000, 3)
    assert (warm["steady_state"] == 1).all()
    assert (abs(warm["cache_hit_rate_drift"]) < 0.02).all()
    assert (warm["requests_for_steady_state"] == 6000).all()
    assert np.isnan(warm["queue_wait_drift"]).all()  # no batching simulator
    assert "STEADY STATE" not in format_table(warm)


def test_estimate_of_requests_needed_holds_at_that_count():
    cold = run_dense(1000, 1000)
    needed = int(cold["requests_for_steady_state"].max())
    again = run_dense(needed, 1000)
    # Found: the estimate errs high here (drifts of a few thousandths at the estimated 11-18 k requests; 8 k
    # would already do), as bounding the exponent from below intends.
    assert (again["steady_state"] == 1).all()
    assert (abs(again["cache_hit_rate_drift"]) <= 0.02).all()
    # And the hit rate the short run reported was far from the steady one: the bias the flag warns of.
    assert float(again["cache_hit_rate"].mean()) > float(cold["cache_hit_rate"].mean()) + 0.2


def _queue_run(rate_per_s, n=4000, seed=1):
    """One instance, 0.1 s per step whatever the batch, at most 8 sequences, 10-token outputs: a capacity of
    8 / (10 x 0.1 s) = 8 requests/s."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n))
    ones = np.full(n, 100)
    return simulate_batching(arrival, ones, ones, np.full(n, 10), step_time_table=[[0.1, 0.1], [0.1, 0.1]],
                             decode_edges=[0, 8], prefill_edges=[0, 8192], max_seqs=8,
                             warmup_s=float(arrival[n // 3]), steady_tolerance=0.1)


def reference_queue_drift(result):
    """Mean queue wait of arrivals in the window's last quarter minus the third's, over the mean time in system."""
    per, summary = result["per_request"], result["summary"]
    start, end = summary["window_s"]
    cut2, cut3 = start + 0.5 * (end - start), start + 0.75 * (end - start)
    wait = lambda lo, hi: float(np.mean([q for a, q in zip(per["arrival_s"], per["queue_s"])  # noqa: E731
                                         if lo < a <= hi]))
    return (wait(cut3, end) - wait(cut2, cut3)) / summary["mean_time_in_system_s"]


def test_queue_drift_stable_and_saturated():
    stable = _queue_run(4.0)  # half the capacity
    check = stable["summary"]["queue_steady_state"]
    assert check.drift == pytest.approx(reference_queue_drift(stable), rel=1e-9, abs=1e-12)
    assert check.steady and not stable["summary"]["saturated"]

    # Twice the capacity: a request arriving at t waits (lambda / mu - 1) t = t. Over the window [T/3, T] the
    # last quarter waits (2T/3) / 4 = T/6 longer than the third, and the mean time in system is ~2T/3: drift 1/4.
    overloaded = _queue_run(16.0)
    check = overloaded["summary"]["queue_steady_state"]
    assert overloaded["summary"]["saturated"]
    assert check.drift == pytest.approx(reference_queue_drift(overloaded), rel=1e-9)
    assert check.drift == pytest.approx(0.25, rel=0.05)
    assert not check.steady and math.isinf(check.requests_needed)

"""Steady-state checks: quarter hit rates against a slow reference, the extrapolation's closed form, the flag on a
cold and a warm cache, the estimate of the requests needed against a run at that count, and the batching
simulator's queue-wait drift on a stable and a saturated queue."""

from __future__ import annotations

import dataclasses
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


# ---------------------------------------------------------------------------------------------------------------
# Under a rate profile: whole periods against whole periods (mcsim.stages.steady_state.time_windows)
# ---------------------------------------------------------------------------------------------------------------

# One request a second at t = 0.5, 1.5, ..., 1099.5 s, a period of 400 s and a warm-up of 20 %: the measured window
# is [220.5, 1099.5] s, 879 s, so each window is one whole period: [700, 1100) s and [300, 700) s. Every request
# has 100 prompt tokens; the first half of each period reuses 100 of them, the second half 20 (a hit rate that
# follows the hour, as a profile's load makes it).
PERIOD_S, N_PERIODIC = 400.0, 1100


def periodic_requests(cold_until_s=0.0):
    t = np.arange(N_PERIODIC) + 0.5
    cached = np.where(t % PERIOD_S < PERIOD_S / 2, 100, 20)
    cached = np.where(t < cold_until_s, cached // 2, cached)  # a cache still filling reuses half
    return t, cached.astype(np.int64), np.full(N_PERIODIC, 100, np.int64)


def test_a_profiles_own_swing_is_not_drift_a_cold_start_is():
    t, cached, prompt = periodic_requests()
    # The quarters of the measured requests (t 660.5-879.5 and 880.5-1099.5) sit at other hours: by hand, 80 and
    # 120 of their 220 requests in the first half of the period, hit rates 0.2 + 0.8 x 80/220 and 0.2 + 0.8 x
    # 120/220: a drift of 0.8 x 40 / 220 that is the profile's alone.
    quarters = kvcache.steady_state(cached, prompt, 0.2, 0.02)
    assert quarters.drift == pytest.approx(0.8 * 40 / 220, rel=1e-12) and not quarters.steady
    periods = kvcache.steady_state(cached, prompt, 0.2, 0.02, t, PERIOD_S)
    assert periods.drift == 0.0 and periods.steady
    assert math.isnan(periods.half_drift)  # the first half spans 439 s, fewer than two periods

    # A cache that reuses half as much before t = 500 s. By hand, per 100 requests of [300, 700): 10 + 50 + 100 +
    # 20 cached tokens of 400 x 100 (0.45), and of [700, 1100): 20 + 200 + 20 (0.6).
    t, cached, prompt = periodic_requests(cold_until_s=500.0)
    cold = kvcache.steady_state(cached, prompt, 0.2, 0.02, t, PERIOD_S)
    assert cold.drift == pytest.approx(0.60 - 0.45, rel=1e-12) and not cold.steady


def test_a_run_of_fewer_than_two_periods_is_not_judged():
    t, cached, prompt = periodic_requests(cold_until_s=500.0)
    short = kvcache.steady_state(cached, prompt, 0.2, 0.02, t, PERIOD_S * 1.2)  # 879 s < 2 x 480 s
    assert math.isnan(short.drift) and short.steady and short.requests_needed == N_PERIODIC


def test_profile_bins_merge_and_chunks_change_nothing(monkeypatch):
    """Chunks of any size, and bins merged pairwise when a run outgrows them, give the same verdict (integer sums;
    windows of whole bins)."""
    from mcsim.stages import steady_state as steady

    t, cached, prompt = periodic_requests(cold_until_s=500.0)
    whole = kvcache.steady_state(cached, prompt, 0.2, 0.02, t, PERIOD_S)
    monkeypatch.setattr(steady, "MAX_BINS", 300)  # 704 bins needed: two merges, 64 bins a period
    sizes = np.random.default_rng(5)
    stream, at = kvcache.SteadyStream(N_PERIODIC, 0.2, 0.02, PERIOD_S), 0
    while at < N_PERIODIC:
        step = int(sizes.integers(1, 200))
        stream.add(cached[at:at + step, None], prompt[at:at + step], t[at:at + step])  # per tier, one tier
        at += step
    assert stream.bins.merges == 2
    np.testing.assert_equal(dataclasses.astuple(stream.result()), dataclasses.astuple(whole))
    assert whole.drift == pytest.approx(0.15, rel=1e-12)


def reference_profile_queue_drift(arrival, queue, start, end, period_s, scale):
    """Mean wait of the arrivals in the last k whole periods of ``(start, end]`` minus the k before, / scale, with
    k a quarter of the span in whole periods (at least 1), from the definition."""
    k = max(int((end - start) // (4 * period_s)), 1)
    mean = lambda lo, hi: np.mean([q for a, q in zip(arrival, queue) if lo < a <= hi])  # noqa: E731
    length = k * period_s
    return (mean(end - length, end) - mean(end - 2 * length, end - length)) / scale


def test_queue_drift_under_a_profile_compares_whole_periods():
    from mcsim.perf.batching import queue_steady_state

    rng = np.random.default_rng(2)
    arrival = np.sort(rng.uniform(0.0, 3000.0, 6000))
    periodic_wait = 0.5 + 0.4 * np.sin(2 * np.pi * arrival / 250.0)  # the profile's own swing, period 250 s
    summary = {"window_s": (600.0, float(arrival[-1])), "mean_time_in_system_s": 2.0, "measured_requests": 4800,
               "saturated": False}
    for growth in (0.0, 1e-4):  # a queue that grows by 0.1 ms a second on top
        queue = periodic_wait + growth * arrival
        check = queue_steady_state({"arrival_s": arrival, "queue_s": queue}, summary, 0.05, 250.0)
        expected = reference_profile_queue_drift(arrival, queue, 600.0, float(arrival[-1]), 250.0, 2.0)
        assert check.drift == pytest.approx(expected, rel=1e-9, abs=1e-12)
    # k = 2 periods (a span of 2400 s): the growth moves the later 500 s by 0.05 s, a drift of 0.025 of 2 s; the
    # swing moves it by less than the sampling noise of ~1000 waits
    assert check.drift == pytest.approx(0.025, abs=0.004)
    flat = queue_steady_state({"arrival_s": arrival, "queue_s": periodic_wait}, summary, 0.05, 250.0)
    quarters = queue_steady_state({"arrival_s": arrival, "queue_s": periodic_wait}, summary, 0.05)
    assert abs(flat.drift) < 0.004 < abs(quarters.drift)


def test_a_run_under_a_profile_says_which_windows_and_what_was_not_judged(tmp_path):
    from mcsim.results.report import write_report
    from mcsim.stages.steady_state import STEADY_WINDOWS_PROFILE

    profile = ["workload.system_prompts=3", "workload.rate_profile=[1, 3]"]
    judged = mcsim.run(SCENARIOS / "dense-node.toml", samples=2, requests=6000,
                       overrides=COLD + profile + ["workload.rate_profile_period_s=60"])
    assert judged.attrs["steady_state_windows"] == STEADY_WINDOWS_PROFILE
    assert np.isfinite(judged["cache_hit_rate_drift"]).all() and (judged["steady_state"] == 1).all()
    assert "STEADY STATE" not in format_table(judged)

    # About 1,300 s of arrivals against a period of 6,000 s: nothing to compare like with like.
    unjudged = mcsim.run(SCENARIOS / "dense-node.toml", samples=2, requests=6000,
                         overrides=COLD + profile + ["workload.rate_profile_period_s=6000"])
    assert np.isnan(unjudged["cache_hit_rate_drift"]).all()
    text = format_table(unjudged)
    assert "STEADY STATE NOT JUDGED: 2 of 2 sample runs" in text and "NOT AT STEADY STATE" not in text
    unjudged.to_netcdf(tmp_path / "r.nc")
    summary = write_report(tmp_path / "r.nc", tmp_path / "report")
    assert "2 of 2 sample runs were not judged" in summary.read_text()

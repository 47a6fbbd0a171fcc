"""Batching simulator: kernel vs the event-loop reference, hand-computed timelines, Little's law, saturation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers import CONSTANT, TABLE, TAU, linear_step_s, random_settings, random_workload

from mcsim.perf.fleet_batching import simulate_batching
from mcsim.reference.batching import simulate_reference

# A step-time table linear in both coordinates, so bilinear interpolation reproduces the plane exactly and
# the hand sums below can use the formula directly (inside the edges).
@pytest.mark.parametrize(
    ("policy", "preempt", "closed_users"),
    [("continuous", False, 0), ("continuous", True, 0), ("static", False, 0), ("continuous", True, 3),
     ("static", False, 2)],
)
def test_kernel_matches_reference_exactly(policy, preempt, closed_users):
    preemptions = chunked_steps = 0
    for seed in range(40):
        rng = np.random.default_rng([seed, closed_users, int(preempt)])
        n = int(rng.integers(1, 50))
        arrival, prefill, context, output, passes, think = random_workload(rng, n, rng.uniform(5.0, 200.0))
        settings = random_settings(rng, output, context, policy=policy, preempt=preempt, closed_users=closed_users)
        warmup_s = float(arrival[n // 4])
        result = simulate_batching(arrival, prefill, context, output, passes, think_s=think, warmup_s=warmup_s,
                                   max_steps=100_000, **TABLE, **settings)
        reference = simulate_reference(arrival, prefill, context, output, passes, think, warmup_s=warmup_s, **TABLE,
                                       **settings)
        per_request, summary = result["per_request"], result["summary"]
        for key in ("arrival_s", "first_token_s", "finish_s", "queue_s"):
            np.testing.assert_array_equal(per_request[key], np.array(reference[key]), err_msg=f"{key}, seed {seed}")
        log = result["step_log"]
        kernel_log = list(zip(log["start_s"].tolist(), log["decode_seqs"].tolist(), log["prefill_tokens"].tolist(),
                              log["step_s"].tolist(), log["waiting"].tolist(), strict=True))
        assert kernel_log == reference["log"], f"seed {seed}"
        assert summary["steps"] == reference["steps"]
        assert summary["preemptions"] == reference["preemptions"]
        assert summary["waiting_at_window_end"] == reference["waiting_at_window_end"]
        window = reference["window_end_s"] - warmup_s
        if window > 0:
            assert summary["mean_in_system"] == pytest.approx(reference["in_system_integral"] / window, rel=1e-12)
        assert np.all(per_request["finish_s"] >= per_request["first_token_s"])
        assert np.all(per_request["first_token_s"] > per_request["arrival_s"])
        preemptions += summary["preemptions"]
        chunked_steps += int(np.count_nonzero((log["prefill_tokens"] > 0) & (log["decode_seqs"] > 0)))
    # The random settings must exercise what they claim to: preemption, and prefill mixed into decode steps.
    assert (preemptions > 0) == (preempt and policy == "continuous")
    assert (chunked_steps > 0) == (policy == "continuous")


@pytest.mark.parametrize(("policy", "preempt"), [("continuous", False), ("continuous", True), ("static", False)])
def test_steps_pay_for_the_batch_own_kv_lengths(policy, preempt):
    # With a KV slope the kernel keeps the summed KV of the decoding sequences up to date step by step; the
    # reference sums every sequence's KV afresh at every step. Same schedule, same times up to rounding.
    slope = np.array([2e-7, 1.5e-7, 1e-7, 5e-8])
    steps_with_decodes = 0
    for seed in range(25):
        rng = np.random.default_rng([seed, 7, int(preempt)])
        n = int(rng.integers(1, 40))
        arrival, prefill, context, output, passes, think = random_workload(rng, n, rng.uniform(5.0, 200.0))
        settings = random_settings(rng, output, context, policy=policy, preempt=preempt, closed_users=0)
        kv = {"kv_slope": slope, "kv_ref_context": float(rng.uniform(0, 400))}
        result = simulate_batching(arrival, prefill, context, output, passes, warmup_s=0.0, max_steps=100_000,
                                   **TABLE, **kv, **settings)
        reference = simulate_reference(arrival, prefill, context, output, passes, think, warmup_s=0.0, **TABLE,
                                       **kv, **settings)
        log = result["step_log"]
        ref_log = np.array([row[3] for row in reference["log"]])
        assert log["decode_seqs"].tolist() == [row[1] for row in reference["log"]], f"seed {seed}"
        np.testing.assert_allclose(log["step_s"], ref_log, rtol=1e-9, err_msg=f"seed {seed}")
        np.testing.assert_allclose(result["per_request"]["finish_s"], reference["finish_s"], rtol=1e-9)
        plain = simulate_batching(arrival, prefill, context, output, passes, warmup_s=0.0, max_steps=100_000,
                                  **TABLE, **settings)["step_log"]
        decoding = log["decode_seqs"] > 0
        steps_with_decodes += int(decoding.sum())
        # the slope changes decode steps only
        if len(plain["step_s"]) == len(log["step_s"]):
            np.testing.assert_array_equal(log["step_s"][~decoding], plain["step_s"][~decoding])
    assert steps_with_decodes > 0


def test_one_sequence_attends_over_its_growing_context():
    # One request alone: prompt 100, 5 output tokens, one per pass (4 decode passes). Pass j attends over
    # 100 + 1 + j tokens; with a table at a reference context of 0 each decode step costs tau + slope x KV.
    tau, slope = 0.25, 1e-3
    result = simulate_batching([0.0], [100], [100], [5], [4], step_time_table=np.full((1, 1), tau),
                               decode_edges=[1.0], prefill_edges=[0.0], kv_slope=[slope], kv_ref_context=0.0,
                               max_steps=10)
    steps = result["step_log"]["step_s"]
    np.testing.assert_allclose(steps, [tau] + [tau + slope * (101 + j) for j in range(4)], rtol=1e-12)


def test_single_request_is_the_hand_sum_of_its_steps():
    # Arrivals far apart: each request runs alone. Prompt 1000 with budget 512: chunks 512 and 488, then
    # `passes` decode steps with one sequence.
    output = np.array([1, 2, 40, 40])
    passes = np.array([0, 1, 39, 13])  # the last one speculative: ceil(39 / 3) passes
    result = simulate_batching(np.arange(4) * 100.0, [1000] * 4, [1200] * 4, output, passes, token_budget=512,
                               **TABLE)
    ttft = linear_step_s(0, 512) + linear_step_s(0, 488)
    per_request = result["per_request"]
    np.testing.assert_allclose(per_request["ttft_s"], ttft, rtol=1e-12)
    np.testing.assert_allclose(per_request["e2e_s"], ttft + passes * linear_step_s(1, 0), rtol=1e-12)
    np.testing.assert_allclose(per_request["queue_s"], 0.0)
    np.testing.assert_allclose(per_request["tpot_s"][1:], passes[1:] * linear_step_s(1, 0) / (output[1:] - 1))
    assert math.isnan(per_request["tpot_s"][0])


def test_chunk_cap_splits_a_prompt_across_steps():
    result = simulate_batching([0.0], [1000], [1000], [1], chunk_tokens=300, max_steps=10, **TABLE)
    assert result["step_log"]["prefill_tokens"].tolist() == [300, 300, 300, 100]


def test_speculative_passes_shrink_decode_time_in_proportion():
    output = np.full(5, 301)
    for tokens_per_pass in (1, 2, 3.7):
        passes = np.ceil((output - 1) / tokens_per_pass).astype(np.int64)
        result = simulate_batching(np.arange(5) * 1000.0, [100] * 5, [100] * 5, output, passes, verify_tokens=4,
                                   **TABLE)
        decode_s = result["per_request"]["finish_s"] - result["per_request"]["first_token_s"]
        # Differences of clock times near 4000 s: rounding of the summed steps is ~1e-12 s per step.
        np.testing.assert_allclose(decode_s, math.ceil(300 / tokens_per_pass) * linear_step_s(1, 0), rtol=1e-9)


def test_static_batch_pads_every_member_to_its_longest():
    output = np.array([2, 50, 7, 20, 1, 9])
    result = simulate_batching(np.zeros(6), [100] * 6, [100] * 6, output, policy="static", max_seqs=4, **TABLE)
    per_request = result["per_request"]
    # First batch: requests 0-3, prefilled in one step of 400 tokens, decoded for the longest's 49 passes at
    # four sequences (finished members stay as padding).
    first_batch_s = linear_step_s(0, 400) + 49 * linear_step_s(4, 0)
    np.testing.assert_allclose(per_request["e2e_s"][:4], first_batch_s, rtol=1e-12)
    np.testing.assert_allclose(per_request["ttft_s"][:4], linear_step_s(0, 400), rtol=1e-12)
    # Second batch starts when the first ends: requests 4 and 5, 8 passes at two sequences.
    np.testing.assert_allclose(per_request["queue_s"][4:], first_batch_s, rtol=1e-12)
    second_batch_s = linear_step_s(0, 200) + 8 * linear_step_s(2, 0)
    np.testing.assert_allclose(per_request["e2e_s"][4:], first_batch_s + second_batch_s, rtol=1e-12)
    # Continuous batching returns the short requests early.
    continuous = simulate_batching(np.zeros(6), [100] * 6, [100] * 6, output, max_seqs=4, **TABLE)
    assert continuous["per_request"]["e2e_s"][0] < 0.1 * first_batch_s


def test_preemption_timeline_by_hand():
    # Two requests of context 3 and output 6 (5 passes), one token per block, arrive at t=0; each needs 9
    # blocks at the end. With 10 blocks both start (4 blocks each), grow to 5 at pass 1, and at pass 2 the
    # pool is empty: the newer request is preempted (after 1 pass) and waits until the older one finishes
    # at the end of step 5. It then recomputes 3 + 2 tokens in step 6 and runs its 4 remaining passes.
    common = {"block_tokens": 1, **CONSTANT}
    args = ([0.0, 0.0], [3, 3], [3, 3], [6, 6])
    tight = simulate_batching(*args, kv_blocks=10, max_steps=20, **common)
    assert tight["summary"]["preemptions"] == 1
    assert tight["per_request"]["first_token_s"].tolist() == [TAU, TAU]
    assert tight["per_request"]["finish_s"].tolist() == [6 * TAU, 11 * TAU]
    assert tight["step_log"]["prefill_tokens"].tolist() == [6, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0]
    assert tight["step_log"]["decode_seqs"].tolist() == [0, 2, 1, 1, 1, 1, 0, 1, 1, 1, 1]
    # Room for both at full size: no preemption.
    roomy = simulate_batching(*args, kv_blocks=18, **common)
    assert roomy["summary"]["preemptions"] == 0
    assert roomy["per_request"]["finish_s"].tolist() == [6 * TAU, 6 * TAU]
    # Reserving whole requests instead: the second one is admitted only when the first frees its 9 blocks.
    reserved = simulate_batching(*args, kv_blocks=10, preempt=False, **common)
    assert reserved["summary"]["preemptions"] == 0
    assert reserved["per_request"]["finish_s"].tolist() == [6 * TAU, 12 * TAU]


def poisson_workload(n, rate, seed=0):
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    context = rng.integers(100, 2000, n)
    output = rng.integers(20, 200, n)
    return arrival, context, context, output


def capacity_per_s(**settings):
    """Completions per second of a backlogged instance (every request waiting at t = 0)."""
    arrival, prefill, context, output = poisson_workload(3000, 1.0)
    result = simulate_batching(np.zeros_like(arrival), prefill, context, output, **settings, **TABLE)
    return len(arrival) / np.nanmax(result["per_request"]["finish_s"])


def test_preemption_only_when_kv_runs_out():
    arrival, prefill, context, output = poisson_workload(3000, 20.0)
    blocks = (context + output + 15) // 16
    settings = {"max_seqs": 32, "block_tokens": 16}
    # The 32 largest requests fit at full size: the pool can never run out.
    roomy = simulate_batching(arrival, prefill, context, output, kv_blocks=int(np.sort(blocks)[-32:].sum()),
                              **settings, **TABLE)
    assert roomy["summary"]["preemptions"] == 0
    tight = simulate_batching(arrival, prefill, context, output, kv_blocks=int(blocks.max()), **settings, **TABLE)
    assert tight["summary"]["preemptions"] > 0
    assert np.all(np.isfinite(tight["per_request"]["finish_s"]))


def test_littles_law_on_a_long_stable_run():
    capacity = capacity_per_s(max_seqs=64)
    arrival, prefill, context, output = poisson_workload(20_000, 0.7 * capacity, seed=1)
    result = simulate_batching(arrival, prefill, context, output, max_seqs=64, warmup_s=float(arrival[1000]),
                               **TABLE)
    summary = result["summary"]
    # The kernel integrates its own waiting + running counts over time; arrival rate and mean time in
    # system come from the per-request times. Edge effects are O(time in system / window) ~ 0.1 %.
    assert summary["little_law_ratio"] == pytest.approx(1.0, abs=0.02)
    assert summary["mean_in_system"] > 5  # a loaded instance, not a trivially empty one
    assert not summary["saturated"]
    expected_throughput = output[arrival >= arrival[1000]].mean() * summary["arrival_rate_per_s"]
    assert summary["throughput_tok_s"] == pytest.approx(expected_throughput, rel=0.03)
    assert summary["measured_requests"] == 19_000


def test_saturation_flagged_above_capacity_only():
    capacity = capacity_per_s(max_seqs=64)
    flags = {}
    for load in (0.5, 1.5):
        arrival, prefill, context, output = poisson_workload(5000, load * capacity, seed=2)
        summary = simulate_batching(arrival, prefill, context, output, max_seqs=64, **TABLE)["summary"]
        flags[load] = (summary["saturated"], summary["completion_ratio"])
    assert flags[0.5][0] is False and flags[0.5][1] == pytest.approx(1.0, abs=0.1)
    assert flags[1.5][0] is True and flags[1.5][1] == pytest.approx(1.5, abs=0.2)


def test_closed_loop_keeps_at_most_its_users_in_system():
    users, n = 5, 400
    rng = np.random.default_rng(3)
    think = rng.exponential(0.3, n)
    context = rng.integers(100, 2000, n)
    output = rng.integers(2, 100, n)
    result = simulate_batching(np.zeros(n), context, context, output, closed_users=users, think_s=think,
                               max_seqs=64, **TABLE)
    per_request = result["per_request"]
    arrival, finish = per_request["arrival_s"], per_request["finish_s"]
    np.testing.assert_array_equal(arrival[users:], finish[:-users] + think[users:])
    events = sorted([(a, 1) for a in arrival] + [(f, -1) for f in finish])  # a finish sorts before an arrival
    assert max(np.cumsum([step for _, step in events])) == users


def test_warmup_requests_are_simulated_but_not_measured():
    arrival, prefill, context, output = poisson_workload(200, 5.0)
    warmup_s = float(arrival[50])
    full = simulate_batching(arrival, prefill, context, output, **TABLE)
    measured = simulate_batching(arrival, prefill, context, output, warmup_s=warmup_s, **TABLE)
    np.testing.assert_array_equal(full["per_request"]["finish_s"], measured["per_request"]["finish_s"])
    assert measured["summary"]["measured_requests"] == 150
    np.testing.assert_allclose(measured["summary"]["e2e_s"],
                               np.quantile(measured["per_request"]["e2e_s"][50:], [0.5, 0.9, 0.99]))


@pytest.mark.parametrize(
    ("change", "message"),
    [({"arrival_s": [1.0, 0.0]}, "sorted"), ({"passes": [5, 5]}, "passes"), ({"kv_blocks": 3, "block_tokens": 1}, "KV blocks"),
     ({"policy": "dynamic"}, "policy"), ({"prefill_tokens": [0, 10]}, "prefill_tokens")],
)
def test_invalid_inputs_are_rejected(change, message):
    args = {"arrival_s": [0.0, 1.0], "prefill_tokens": [10, 10], "context_tokens": [10, 10],
            "output_tokens": [5, 5], **TABLE, **change}
    with pytest.raises(ValueError, match=message):
        simulate_batching(**args)

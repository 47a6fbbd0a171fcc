"""The one reference event loop (mcsim.reference.fleet_batching) under the policies no fleet kernel runs yet:
static batching and exclusive prefill/decode steps over several replicas, by hand and against independent
one-instance runs."""

from __future__ import annotations

import numpy as np
import pytest

from mcsim.kernels.step_loop import stable_order
from mcsim.scenario.policies import POLICIES
from mcsim.reference.batching import simulate_reference
from mcsim.reference.fleet_batching import simulate_fleet_reference

# A constant step time, a power of two in seconds, so every sum of steps below is exact.
TAU = 0.25
CONSTANT = {"step_time_table": [[TAU]], "decode_edges": [1.0], "prefill_edges": [0.0]}
ROOMY = {"token_budget": 64, "max_seqs": 4, "kv_blocks": 100, "block_tokens": 16, "chunk_tokens": 0,
         "verify_tokens": 1}


def run(arrival, output, router, policy):
    """Prompts of 10 tokens, one token per decode pass, two replicas."""
    n = len(arrival)
    prompt = [10] * n
    return simulate_fleet_reference(arrival, prompt, prompt, output, [o - 1 for o in output], [0.0] * n,
                                    n_instances=2, router=router, policy=policy, **ROOMY, **CONSTANT)


def instance_log(result, i):
    return [row[:3] for row in result["log"] if row[5] == i]


def test_static_batches_on_two_replicas_by_hand():
    # Requests 0-3 at t = 0, request 4 at 1.5 tau; outputs 2, 1, 4, 3, 2 (passes 1, 0, 3, 2, 1).
    # Round-robin: instance 0 gets 0, 2 and 4; instance 1 gets 1 and 3.
    # Instance 0 forms the batch {0, 2}: one prefill step of 20 tokens (first tokens at tau), then as many
    # decode steps as its longest member has passes (3), at two sequences throughout: both finish at 4 tau.
    # Instance 1's batch {1, 3}: prefill, then 2 decode steps; request 1 (no passes) stays as padding and
    # finishes with request 3 at 3 tau. Request 4 arrives at 1.5 tau while instance 0's batch decodes: although
    # two of its four slots are free, a static batch admits no one, so request 4 waits until 4 tau (queue
    # 2.5 tau), is prefilled alone by 5 tau and finishes at 6 tau.
    arrival, output = [0.0, 0.0, 0.0, 0.0, 1.5 * TAU], [2, 1, 4, 3, 2]
    rr = run(arrival, output, "round-robin", "static")
    assert rr["instance"] == [0, 1, 0, 1, 0]
    assert rr["first_token_s"] == [TAU, TAU, TAU, TAU, 5 * TAU]
    assert rr["finish_s"] == [4 * TAU, 3 * TAU, 4 * TAU, 3 * TAU, 6 * TAU]
    assert rr["queue_s"] == [0.0, 0.0, 0.0, 0.0, 2.5 * TAU]
    assert instance_log(rr, 0) == [(0.0, 0, 20), (TAU, 2, 0), (2 * TAU, 2, 0), (3 * TAU, 2, 0), (4 * TAU, 0, 10),
                                   (5 * TAU, 1, 0)]
    assert instance_log(rr, 1) == [(0.0, 0, 20), (TAU, 2, 0), (2 * TAU, 2, 0)]
    assert rr["instance_steps"] == [6, 3]
    assert [row[0] for row in rr["log"]] == sorted(row[0] for row in rr["log"])  # the fleet's steps in time order
    # Request 4 at 3.5 tau instead, under least-outstanding (which places 0-3 as round-robin does): instance 0's
    # last step [3 tau, 4 tau] is running, so its batch still counts as in flight (its members finish when that
    # step ends), while instance 1 has been empty since 3 tau: request 4 goes there, starts at once and
    # finishes at 3.5 + 2 tau.
    arrival[4] = 3.5 * TAU
    lo = run(arrival, output, "least-outstanding", "static")
    assert lo["instance"] == [0, 1, 0, 1, 1]
    assert lo["queue_s"][4] == 0.0
    assert lo["finish_s"] == [4 * TAU, 3 * TAU, 4 * TAU, 3 * TAU, 5.5 * TAU]


def test_exclusive_prefill_on_two_replicas_by_hand():
    # Request 0 (output 4: 3 passes) and 1 (output 1: no pass) at t = 0, requests 2 and 3 (output 2) at
    # 1.5 tau; round-robin puts 0 and 2 on instance 0, 1 and 3 on instance 1.
    # Instance 0: prefill 0 [0, tau]; decode 0 [tau, 2 tau] (pass 1); request 2 arrived meanwhile, so the
    # next step is prefill only [2 tau, 3 tau] (first token of 2; request 0 does not advance); then decode
    # both [3 tau, 4 tau] (0's pass 2, 2's only pass: 2 finishes); decode 0 [4 tau, 5 tau]: 0 finishes.
    # Instance 1: prefill 1 [0, tau] (it finishes there); idle until 1.5 tau; prefill 3 [1.5, 2.5] tau;
    # decode 3 [2.5, 3.5] tau.
    arrival, output = [0.0, 0.0, 1.5 * TAU, 1.5 * TAU], [4, 1, 2, 2]
    ex = run(arrival, output, "round-robin", "exclusive-prefill")
    assert ex["instance"] == [0, 1, 0, 1]
    assert ex["first_token_s"] == [TAU, TAU, 3 * TAU, 2.5 * TAU]
    assert ex["finish_s"] == [5 * TAU, TAU, 4 * TAU, 3.5 * TAU]
    assert instance_log(ex, 0) == [(0.0, 0, 10), (TAU, 1, 0), (2 * TAU, 0, 10), (3 * TAU, 2, 0), (4 * TAU, 1, 0)]
    assert instance_log(ex, 1) == [(0.0, 0, 10), (1.5 * TAU, 0, 10), (2.5 * TAU, 1, 0)]
    # Mixed steps (fcfs) run request 0's pass 2 beside request 2's prefill at 2 tau: 0 finishes a step earlier.
    mixed = run(arrival, output, "round-robin", "fcfs")
    assert mixed["finish_s"] == [4 * TAU, TAU, 4 * TAU, 3.5 * TAU]
    assert instance_log(mixed, 0)[2] == (2 * TAU, 1, 10)


def random_case(rng, n):
    arrival = np.cumsum(rng.exponential(1.0 / rng.uniform(20.0, 300.0), n))
    if rng.uniform() < 0.3:
        arrival = np.round(arrival, 1)  # simultaneous arrivals exercise the ties
    context = rng.integers(1, 300, n)
    output = rng.integers(1, 40, n)
    passes = np.where(output > 1, -(-(output - 1) // int(rng.integers(1, 4))), 0)
    block_tokens = int(rng.integers(1, 32))
    largest = int(((context + output + block_tokens - 1) // block_tokens).max())
    settings = {"token_budget": int(rng.integers(1, 600)), "max_seqs": int(rng.integers(1, 8)),
                "kv_blocks": largest + int(rng.integers(0, largest)), "block_tokens": block_tokens,
                "chunk_tokens": int(rng.integers(0, 200)), "verify_tokens": int(rng.integers(1, 4))}
    table = {"step_time_table": 0.01 + 2e-4 * np.array([1.0, 64.0])[:, None] + 4e-6 * np.array([0.0, 4096.0]),
             "decode_edges": [1.0, 64.0], "prefill_edges": [0.0, 4096.0]}
    return arrival, context, output, passes, settings, table


@pytest.mark.parametrize("name", list(POLICIES))
def test_replicas_without_a_shared_state_are_independent_instances(name):
    """With a fixed instance per request, no prefix cache and an open loop, replicas share nothing: each one's
    requests get the one-instance reference's times on that instance's requests alone, under every policy of
    the table, with and without preemption."""
    policy = POLICIES[name]
    for seed in range(12):
        rng = np.random.default_rng([seed, 31])
        n, k = int(rng.integers(1, 40)), int(rng.integers(2, 5))
        arrival, context, output, passes, settings, table = random_case(rng, n)
        prefill = np.clip(context - rng.integers(0, 100, n), 1, context)
        fixed = rng.integers(0, k, n)
        priority = rng.integers(0, 3, n)
        preempt = bool(seed % 2)
        max_new = int(rng.integers(0, 3))
        fleet = simulate_fleet_reference(arrival, prefill, context, output, passes, np.zeros(n), n_instances=k,
                                         router="prefix-affinity", fixed_instance=fixed.tolist(), policy=name,
                                         priority=priority, preempt=preempt, max_new_per_step=max_new,
                                         **settings, **table)
        assert fleet["instance"] == fixed.tolist()
        for i in range(k):
            mine = np.flatnonzero(fixed == i)
            if mine.size == 0:
                continue
            alone = simulate_reference(arrival[mine], prefill[mine], context[mine], output[mine], passes[mine],
                                       np.zeros(mine.size), policy=policy.admission, order=policy.order,
                                       queue_key=policy.queue_key(prefill[mine], priority[mine]),
                                       mixing=policy.mixing, max_new_per_step=max_new, preempt=preempt,
                                       closed_users=0, warmup_s=0.0, **settings, **table)
            for key in ("first_token_s", "finish_s", "queue_s"):
                assert [fleet[key][r] for r in mine] == alone[key], f"{key}, seed {seed}, instance {i}"
            assert [row[:5] for row in fleet["log"] if row[5] == i] == alone["log"]


def test_stable_order_is_pythons_stable_sort():
    """The static batch's members by passes: the step loop's merge sort against Python's sorted (stable), with
    many ties, at every length up to a few merge widths."""
    rng = np.random.default_rng(7)
    for n in list(range(0, 20)) + [31, 32, 33, 64, 100]:
        keys = rng.integers(0, max(n // 3, 1), n + 3)  # longer than n: the tail must not count
        order, scratch = np.full(n + 2, -9, np.int64), np.full(n + 2, -9, np.int64)
        stable_order(keys, n, order, scratch)
        assert order[:n].tolist() == sorted(range(n), key=lambda j: keys[j])
        assert order[n:].tolist() == [-9, -9]  # nothing written past n

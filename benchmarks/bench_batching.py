"""Benchmark of the batching simulator: simulated requests per second, kernel vs the event-loop reference.

Workload: Poisson arrivals at 80 % of the instance's measured capacity; prompts lognormal (median 800
tokens, a random uncached share), outputs lognormal with mean ~500 tokens; token budget 8192, 256
sequences, 16-token KV blocks in a pool of 40,000 blocks (room for the batch) or 12,000 (memory-bound); a step-time table linear in
decoding sequences and prefill tokens. One item is one request simulated from arrival to its last token
(~500 decode passes shared with the batch, ~3 steps per request at this load). Cases: continuous batching
with growth and preemption (vLLM's policy), the same with a memory-bound pool, continuous with whole-request
reservation, and static batching.
Run ``python benchmarks/bench_batching.py`` for a table; the suite runner calls :func:`cases`.
"""

from __future__ import annotations

import numpy as np

from mcsim.kernels import batching as kernel
from mcsim.reference.batching import simulate_reference
from timing import best_of  # noqa: E402  (benchmarks/ is on sys.path when run)

N_REQUESTS_FAST = 200_000
N_REQUESTS_REFERENCE = 2_000
LOAD = 0.8
DECODE_EDGES = 2.0 ** np.arange(10)  # 1 .. 512 sequences
PREFILL_EDGES = np.array([0.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0])
STEP_TIME_TABLE = 0.006 + 3e-5 * DECODE_EDGES[:, None] + 1.5e-6 * PREFILL_EDGES[None, :]
SETTINGS = {"token_budget": 8192, "max_seqs": 256, "block_tokens": 16, "chunk_tokens": 0, "verify_tokens": 1,
            "closed_users": 0}
# name: (policy, preempt, KV pool in blocks); the last continuous case is memory-bound and preempts.
VARIANTS = {"continuous_preempt": ("continuous", True, 40_000), "continuous_reserve": ("continuous", False, 40_000),
            "continuous_preempt_kv_bound": ("continuous", True, 12_000), "static": ("static", False, 40_000)}


def synthetic_workload(n_requests, rate_per_s, seed=0):
    """Arrival times (s) and prefill, context and output tokens; ``rate_per_s == 0``: all at t = 0."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n_requests)) if rate_per_s else np.zeros(n_requests)
    context = np.clip(rng.lognormal(np.log(800), 0.8, n_requests), 16, 8000).astype(np.int64)
    prefill = np.maximum(1, (context * rng.uniform(0.3, 1.0, n_requests)).astype(np.int64))
    output = np.clip(rng.lognormal(np.log(500) - 0.125, 0.5, n_requests), 1, 4000).astype(np.int64)
    return arrival, prefill, context, output


def _params(policy, preempt, kv_blocks):
    params = np.zeros(kernel.N_PARAMS, np.int64)
    params[kernel.P_TOKEN_BUDGET] = SETTINGS["token_budget"]
    params[kernel.P_MAX_SEQS] = SETTINGS["max_seqs"]
    params[kernel.P_KV_BLOCKS] = kv_blocks
    params[kernel.P_BLOCK_TOKENS] = SETTINGS["block_tokens"]
    params[kernel.P_CHUNK_TOKENS] = SETTINGS["chunk_tokens"]
    params[kernel.P_VERIFY_TOKENS] = SETTINGS["verify_tokens"]
    params[kernel.P_POLICY] = kernel.POLICY_STATIC if policy == "static" else kernel.POLICY_CONTINUOUS
    params[kernel.P_PREEMPT] = int(preempt)
    return params


def _run_kernel(workload, policy, preempt, kv_blocks):
    arrival, prefill, context, output = workload
    n = arrival.shape[0]
    outputs = [np.empty(n) for _ in range(4)]
    stats = np.zeros(kernel.N_STATS)
    no_log_f, no_log_i = np.zeros(0), np.zeros(0, np.int64)
    kernel.simulate(arrival, prefill, context, output, output - 1, np.zeros(n), _params(policy, preempt, kv_blocks), 0.0,
                    STEP_TIME_TABLE, DECODE_EDGES, PREFILL_EDGES, *outputs, stats, no_log_f, no_log_i, no_log_i,
                    no_log_f, no_log_i)
    return outputs, stats


def _run_reference(workload, policy, preempt, kv_blocks):
    arrival, prefill, context, output = (a.tolist() for a in workload)
    return simulate_reference(arrival, prefill, context, output, [o - 1 for o in output], [0.0] * len(arrival),
                              policy=policy, preempt=preempt, kv_blocks=kv_blocks, warmup_s=0.0, step_time_table=STEP_TIME_TABLE,
                              decode_edges=DECODE_EDGES, prefill_edges=PREFILL_EDGES, **SETTINGS)


def capacity_per_s(policy, preempt, kv_blocks, n_requests=20_000):
    """Completions per second when every request waits at t = 0 (the instance always backlogged)."""
    outputs, _ = _run_kernel(synthetic_workload(n_requests, 0.0), policy, preempt, kv_blocks)
    return n_requests / np.nanmax(outputs[2])


def cases():
    """Benchmark cases for the suite runner (the kernel is compiled here, not in the timed call)."""
    result = []
    for name, (policy, preempt, kv_blocks) in VARIANTS.items():
        rate = LOAD * capacity_per_s(policy, preempt, kv_blocks)  # also the warm-up: compiles or loads the kernel
        fast_workload = synthetic_workload(N_REQUESTS_FAST, rate, seed=1)
        reference_workload = synthetic_workload(N_REQUESTS_REFERENCE, rate, seed=1)
        result.append({
            "name": f"batching_{name}",
            "unit": "requests",
            "items_fast": N_REQUESTS_FAST,
            "items_reference": N_REQUESTS_REFERENCE,
            "fast": lambda w=fast_workload, p=policy, e=preempt, k=kv_blocks: _run_kernel(w, p, e, k),
            "reference": lambda w=reference_workload, p=policy, e=preempt, k=kv_blocks: _run_reference(w, p, e, k),
        })
    return result


def main():
    for name, (policy, preempt, kv_blocks) in VARIANTS.items():
        capacity = capacity_per_s(policy, preempt, kv_blocks)
        workload = synthetic_workload(N_REQUESTS_FAST, LOAD * capacity, seed=1)
        _, stats = _run_kernel(workload, policy, preempt, kv_blocks)
        print(f"{name}: capacity {capacity:.1f} requests/s; at {LOAD:.0%}: {stats[kernel.STAT_STEPS]:.0f} steps "
              f"({stats[kernel.STAT_STEPS] / N_REQUESTS_FAST:.2f} per request), mean decode batch "
              f"{stats[kernel.STAT_WINDOW_DECODE_SEQS_SUM] / stats[kernel.STAT_WINDOW_DECODE_STEPS]:.0f}, "
              f"{stats[kernel.STAT_PREEMPTIONS]:.0f} preemptions")
    for case in cases():
        rates = {}
        for side in ("fast", "reference"):
            seconds = best_of(case[side])
            rates[side] = case[f"items_{side}"] / seconds
            print(f"{case['name']:36s} {side:9s} {rates[side] / 1e6:8.3f} M {case['unit']}/s ({seconds:.3f} s)")
        print(f"{case['name']:36s} speed-up  {rates['fast'] / rates['reference']:8.0f}x")


if __name__ == "__main__":
    main()

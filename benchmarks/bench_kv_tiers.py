"""Benchmark of the KV-tier kernel: block look-ups per second, kernel vs the ``OrderedDict`` reference.

One look-up is one prompt block of one request processed (reuse check plus move to HBM and any demotions).
Workload: Zipf-popular shared system prompts followed by unique tails, about 20 blocks per request, routed at
random over 4 cache instances whose HBM, DRAM and NVMe capacities all overflow, so every tier both hits and
demotes. Run ``python benchmarks/bench_kv_tiers.py`` for a table; the suite runner calls :func:`cases`.
"""

from __future__ import annotations


import numpy as np

from mcsim.kernels.kv_tiers import simulate_tiers
from mcsim.reference.kv_tiers import simulate_tiers_reference
from timing import best_of  # noqa: E402  (benchmarks/ is on sys.path when run)

N_REQUESTS_FAST = 200_000
N_REQUESTS_REFERENCE = 20_000
N_INSTANCES = 4
CAPACITY_BLOCKS = np.array([4_000, 16_000, 64_000], np.int64)


def synthetic_workload(n_requests, n_instances=N_INSTANCES, seed=0):
    """Requests made of a Zipf-popular shared prefix and a unique tail, as dense per-instance block keys.

    Returns
    -------
    block_ptr : int64 array, shape (n_requests + 1,)
    block_keys : int64 array
        Dense keys; the same prompt block on two instances gets two keys.
    instance : int32 array, shape (n_requests,)
    n_keys : int
    """
    rng = np.random.default_rng(seed)
    n_prompts = 5_000
    prompt_blocks = rng.integers(2, 15, n_prompts)  # 8 blocks on average
    prompt_start = np.concatenate(([0], np.cumsum(prompt_blocks)))
    popularity = 1.0 / np.arange(1, n_prompts + 1) ** 1.1
    prompt = rng.choice(n_prompts, n_requests, p=popularity / popularity.sum())
    instance = rng.integers(0, n_instances, n_requests).astype(np.int32)
    prefix_len = prompt_blocks[prompt]
    tail_len = rng.integers(4, 21, n_requests)  # 12 blocks on average
    lengths = prefix_len + tail_len
    block_ptr = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)

    # Prefix block b of prompt p on instance i -> key i * n_prefix_keys + prompt_start[p] + b;
    # tail blocks get fresh keys after all prefix keys.
    n_prefix_keys = int(prompt_start[-1])
    request_of_block = np.repeat(np.arange(n_requests), lengths)
    position = np.arange(block_ptr[-1]) - block_ptr[request_of_block]
    in_prefix = position < prefix_len[request_of_block]
    rq = request_of_block[in_prefix]
    block_keys = np.empty(block_ptr[-1], np.int64)
    block_keys[in_prefix] = (
        instance[rq].astype(np.int64) * n_prefix_keys + prompt_start[prompt[rq]] + position[in_prefix]
    )
    n_tail = int((~in_prefix).sum())
    block_keys[~in_prefix] = n_instances * n_prefix_keys + np.arange(n_tail)
    return block_ptr, block_keys, instance, n_instances * n_prefix_keys + n_tail


def _run_kernel(workload):
    block_ptr, block_keys, instance, n_keys = workload
    hits = np.zeros((instance.shape[0], 3), np.int64)
    simulate_tiers(block_ptr, block_keys, instance, N_INSTANCES, n_keys, CAPACITY_BLOCKS, hits)
    return hits


def _as_lists(workload):
    block_ptr, block_keys, instance, _ = workload
    keys = block_keys.tolist()
    ptr = block_ptr.tolist()
    return [keys[ptr[r] : ptr[r + 1]] for r in range(len(instance))], instance.tolist()


def cases():
    """Benchmark cases for the suite runner (the kernel is compiled here, not in the timed call)."""
    fast_workload = synthetic_workload(N_REQUESTS_FAST)
    reference_workload = synthetic_workload(N_REQUESTS_REFERENCE)
    block_lists, instance = _as_lists(reference_workload)
    capacity = tuple(int(c) for c in CAPACITY_BLOCKS)
    _run_kernel(synthetic_workload(100))  # warm-up: compile (or load from cache)
    return [
        {
            "name": "kv_tiers",
            "unit": "block look-ups",
            "items_fast": int(fast_workload[1].shape[0]),
            "items_reference": int(reference_workload[1].shape[0]),
            "fast": lambda: _run_kernel(fast_workload),
            "reference": lambda: simulate_tiers_reference(block_lists, instance, capacity),
        }
    ]



def main():
    workload = synthetic_workload(N_REQUESTS_FAST)
    hits = _run_kernel(workload)
    total = workload[1].shape[0]
    shares = hits.sum(axis=0) / total
    print(
        f"workload: {N_REQUESTS_FAST} requests, {total} blocks, {workload[3]} keys; "
        f"block hit share HBM {shares[0]:.3f} DRAM {shares[1]:.3f} NVMe {shares[2]:.3f}"
    )
    rates = {}
    for case in cases():
        for side in ("fast", "reference"):
            seconds = best_of(case[side])
            rates[side] = case[f"items_{side}"] / seconds
            print(f"{case['name']:10s} {side:9s} {rates[side] / 1e6:8.2f} M {case['unit']}/s ({seconds:.3f} s)")
        print(f"{case['name']:10s} speed-up  {rates['fast'] / rates['reference']:8.1f}x")


if __name__ == "__main__":
    main()

"""Stage 2 orchestration: route requests to instances, size the tiers, run the KV-tier kernel.

The kernel (:func:`mcsim.kernels.kv_tiers.lookup_tiers`) keeps its state in flat arrays indexed by a dense key,
so block identities are remapped here: each (instance, block) pair gets its own key, since each instance has its
own cache. ``routing = 'pooled'`` is one cache with the capacity of all instances together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

ROUTING = ("random", "round-robin", "prefix-affinity", "cache-aware", "pooled")
#: Routers of the instances' current load, which only the replicas' simulation has (:mod:`mcsim.perf.fleet_batching`).
LOAD_ROUTERS = ("least-outstanding", "least-kv")


@dataclass(frozen=True)
class Inputs:
    """The parameters the KV-tier stage reads (also its memo key within a sample).

    Attributes
    ----------
    capacity_blocks : tuple of int
        Blocks per tier (HBM, DRAM, NVMe) of one cache; all zeros when the cache lever is off.
    routing : str
    caches : int
        Caches the traffic is split over (instances holding prefill).
    routing_balance : float
    """

    capacity_blocks: tuple
    routing: str
    caches: int
    routing_balance: float

    @classmethod
    def from_params(cls, p: dict, block_tokens: int, kv_bytes_per_token: float) -> "Inputs":
        routing = p["deployment.routing"]
        if routing in LOAD_ROUTERS:
            # Replicas only: their run routes on the current load and keeps its own caches; this replay (the
            # estimate the fleet is sized on) spreads the requests evenly instead.
            routing = "round-robin"
        disagg = p["deployment.disaggregated"]
        caches = (p["deployment.prefill_instances"] or p["deployment.instances"]) if disagg \
            else p["deployment.instances"]
        if not p["cache.enabled"]:
            return cls((0, 0, 0), routing, int(caches), float(p["deployment.routing_balance"]))
        # The prefix cache serves prefill: it lives on the prefill pool when disaggregated.
        gpus = p["deployment.prefill_gpus_per_instance"] if disagg else p["deployment.gpus_per_instance"]
        nodes = max(-(-gpus // p["hardware.gpus_per_node"]), 1)
        capacity = capacity_blocks(p["cache.hbm_gb_per_instance"] * 1e9, p["cache.dram_gb_per_node"] * 1e9 * nodes,
                                   p["cache.nvme_gb_per_node"] * 1e9 * nodes, kv_bytes_per_token, block_tokens)
        return cls(tuple(int(c) for c in capacity), routing, int(caches),
                   float(p["deployment.routing_balance"]))


@dataclass(frozen=True)
class CacheResult:
    """Per-request reuse.

    Attributes
    ----------
    cached_tokens : int64[n, 3]
        Prompt tokens reused from HBM, DRAM, NVMe.
    instance : int32[n]
        Instance that served each request.
    capacity_blocks : int64[3]
        Capacity per instance and tier, blocks.
    """

    cached_tokens: np.ndarray
    instance: np.ndarray
    capacity_blocks: np.ndarray


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a well-spread hash of integer ids, for affinity routing."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def first_block_instances(block_ptr, block_ids, n_instances: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefix affinity's rule: whether each request has a whole block, and the instance a hash of its first block
    picks (meaningless where it has none)."""
    block_ptr = np.asarray(block_ptr, dtype=np.int64)
    has_block = np.diff(block_ptr) > 0
    if len(block_ids) == 0:
        return has_block, np.zeros(len(has_block), np.int64)
    first = np.asarray(block_ids)[np.minimum(block_ptr[:-1], len(block_ids) - 1)]
    return has_block, (_mix64(first) % np.uint64(n_instances)).astype(np.int64)


def route(policy: str, block_ptr: np.ndarray, block_ids: np.ndarray, n_instances: int, rng) -> np.ndarray:
    """Instance of each request.

    ``prefix-affinity`` sends requests whose first block is the same (same system prompt, same session) to the
    same instance, by a hash of that block; requests with no whole block are spread at random.
    ``cache-aware`` returns -1 for every request: the tier kernel picks the instance holding the longest cached
    prefix, guarded against overload.
    """
    n = len(block_ptr) - 1
    if policy == "pooled" or n_instances == 1:
        return np.zeros(n, dtype=np.int32)
    if policy == "cache-aware":
        return np.full(n, -1, dtype=np.int32)  # decided inside the tier kernel, request by request
    if policy == "round-robin":
        return (np.arange(n) % n_instances).astype(np.int32)
    random_choice = rng.integers(0, n_instances, n).astype(np.int32)
    if policy == "random":
        return random_choice
    if policy == "prefix-affinity":
        has_block, by_prefix = first_block_instances(block_ptr, block_ids, n_instances)
        return np.where(has_block, by_prefix, random_choice).astype(np.int32)
    raise ValueError(f"unknown routing policy {policy!r}; expected one of {', '.join(ROUTING)}")


def capacity_blocks(hbm_bytes: float, dram_bytes: float, nvme_bytes: float, kv_bytes_per_token: float,
                    block_tokens: int) -> np.ndarray:
    """Blocks per tier = bytes / (KV bytes per token x block tokens)."""
    per_block = kv_bytes_per_token * block_tokens
    return np.floor(np.array([hbm_bytes, dram_bytes, nvme_bytes], dtype=float) / per_block).astype(np.int64)


def _dense_keys(block_ids: np.ndarray, instance: np.ndarray, counts: np.ndarray, caches: int):
    """One dense key per (instance, block) pair, as the kernel wants.

    Block ids that are already small non-negative integers (the generator's, Mooncake's) are used directly,
    offset by instance; otherwise (or when that key space would be much larger than the data) they are
    renumbered with ``np.unique``.
    """
    lo, span = int(block_ids.min()), int(block_ids.max()) + 1
    if lo >= 0 and caches * span <= 2 * len(block_ids) + (1 << 20):
        if caches == 1:
            return block_ids, span
        return np.repeat(instance.astype(np.int64), counts) * span + block_ids, caches * span
    owner = np.repeat(instance.astype(np.int64), counts) if caches > 1 else np.zeros(len(block_ids), np.int64)
    span = int(block_ids.max() - block_ids.min()) + 1
    uniq, keys = np.unique(owner * span + (block_ids - block_ids.min()), return_inverse=True)
    return keys.astype(np.int64), len(uniq)


def cache_hits(requests, policy: str, n_instances: int, capacity_per_instance: np.ndarray, rng,
               balance: float = 0.25) -> CacheResult:
    """Run the tiers for one sample's requests (in arrival order).

    Parameters
    ----------
    requests : mcsim.stages.workload.Requests
    policy : str
        One of :data:`ROUTING`.
    n_instances : int
    capacity_per_instance : int64[3]
        Blocks per tier of one instance's cache (multiplied by ``n_instances`` when pooled).
    rng : numpy.random.Generator
        The sample's routing stream.
    balance : float
        Load guard of cache-aware routing (see :func:`mcsim.kernels.kv_tiers.lookup_tiers`).
    """
    from mcsim.kernels.kv_tiers import lookup_tiers

    n = requests.n
    instance = route(policy, requests.block_ptr, requests.block_ids, n_instances, rng)
    capacity = np.asarray(capacity_per_instance, dtype=np.int64).copy()
    caches = n_instances
    if policy == "pooled":
        capacity = capacity * n_instances
        caches = 1
    hits = np.zeros((n, 3), dtype=np.int64)
    counts = np.diff(requests.block_ptr)
    if policy == "cache-aware" and caches > 1 and len(requests.block_ids) and capacity[0] > 0:
        ids = requests.block_ids
        if ids.min() < 0 or ids.max() >= 2 * len(ids) + (1 << 20):
            ids = np.unique(ids, return_inverse=True)[1].astype(np.int64)
        stride = int(ids.max()) + 1
        lookup_tiers(requests.block_ptr, ids, instance, caches, caches * stride, capacity, hits, key_stride=stride,
                     balance=balance)
    elif len(requests.block_ids) and capacity[0] > 0:
        instance = np.where(instance < 0, np.arange(n) % max(caches, 1), instance).astype(np.int32)
        keys, n_keys = _dense_keys(requests.block_ids, instance, counts, caches)
        lookup_tiers(requests.block_ptr, keys, instance if caches > 1 else np.zeros(n, np.int32), caches, n_keys,
                     capacity, hits)
    instance = np.where(instance < 0, np.arange(n) % max(caches, 1), instance).astype(np.int32)
    cached = hits * requests.block_tokens
    # A fully cached prompt still computes its last token (the first output needs one forward position).
    excess = np.maximum(cached.sum(axis=1) - (requests.prompt_tokens - 1), 0)
    for tier in range(3):
        take = np.minimum(excess, cached[:, tier])
        cached[:, tier] -= take
        excess -= take
    return CacheResult(cached_tokens=cached, instance=instance, capacity_blocks=capacity)


def warmup_requests(n: int, warmup_fraction: float) -> int:
    """Leading requests of a run of ``n`` that only warm the caches (at least one request is measured)."""
    return min(int(warmup_fraction * n), n - 1)


def steady_state(cached_tokens: np.ndarray, prompt_tokens: np.ndarray, warmup_fraction: float, tolerance: float):
    """Has the cache reached steady state? Token hit rate of the last quarter of measured requests vs the third.

    Parameters
    ----------
    cached_tokens : int64[n, 3] or int64[n]
        Cached prompt tokens of *every* request of the sample, warm-up included (per tier or summed).
    prompt_tokens : int64[n]
    warmup_fraction : float
        ``mc.warmup_fraction``: the leading share of requests left out of the statistics.
    tolerance : float
        ``mc.steady_state_tolerance``: largest absolute hit-rate drift that counts as steady.

    Returns
    -------
    mcsim.stages.steady_state.SteadyState
        ``drift`` is the last-quarter minus third-quarter hit rate; ``requests_needed`` the requests per sample
        at which the drift would fall to the tolerance (see :mod:`mcsim.stages.steady_state` for the estimate).
    """
    from mcsim.stages import steady_state as steady

    cached = np.asarray(cached_tokens)
    cached = cached.sum(axis=1) if cached.ndim == 2 else cached
    n = len(prompt_tokens)
    half = n // 2
    warm, warm_half = warmup_requests(n, warmup_fraction), warmup_requests(max(half, 1), warmup_fraction)
    if n - warm < steady.MIN_MEASURED:
        return steady.not_checked(n)
    windows = [*steady.quarter_bounds(n, warm)]
    # A run half as long: the same requests (the cache's state after request i depends on requests 0..i only).
    windows += [*steady.quarter_bounds(half, warm_half)] if half - warm_half >= steady.MIN_MEASURED else [(0, 0)] * 2
    return steady.check(cached.astype(np.float64), np.asarray(prompt_tokens, dtype=np.float64), windows, tolerance)

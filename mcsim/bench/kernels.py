"""Kernel benchmark cases: each compiled kernel against its pure-Python reference and, where natural, NumPy.

A *case* is a dict::

    {"stage": str, "name": str, "unit": str,
     "items_fast": int, "fast": callable,            # the compiled kernel, already warmed up
     "items_reference": int, "reference": callable,  # mcsim.reference: plain Python, obviously correct
     "items_numpy": int, "numpy": callable | None,   # a NumPy-vectorized version of the same law, or None
     "target": {"per_s": float | None, "ratio": float | None, "text": str} | None}

Calling ``fast()``, ``reference()`` or ``numpy()`` performs one timed run that processes the matching
``items_*`` units of work (block look-ups, draft tokens, ...). The references may run on smaller inputs than
the kernel; throughput (items per second) makes them comparable. Targets are the project's "Performance
targets" (per core; every kernel here runs on one thread).

Workloads (fixed seeds):

* ``kv_tiers`` — Zipf-popular shared system prompts followed by unique tails, about 20 blocks per request,
  routed at random over 4 cache instances whose HBM, DRAM and NVMe capacities all overflow, so every tier both
  hits and demotes. One item is one prompt block looked up (reuse check, move to HBM, demotions).
* ``speculative`` — 500-1000 output tokens per request, acceptance ~ Beta(17, 3); one item is one of the
  ``k`` drafts of one verification pass. The kernel draws long stretches of passes as chunks of binomials.
* ``experts`` — a DeepSeek-V3-like layer: 256 routed experts, top-8, 288 slots on 32 EP GPUs in 4 nodes with
  8 groups. Routing counts token-expert assignments; placement and rank loads count calls and steps.
* ``batching`` — Poisson arrivals at 80 % of the instance's measured capacity, lognormal prompts (median
  800 tokens) and outputs (mean ~500 tokens); one item is one request simulated from arrival to last token.
  The fleet case runs 8 replicas at 80 % of 8 instances' capacity behind cache-aware routing, each with an
  HBM/DRAM/NVMe prefix cache that overflows, on the ``kv_tiers`` prompts (one item: one request, routed,
  looked up and simulated).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from mcsim.kernels import batching_helpers as slots
from mcsim.kernels import step_loop as kernel
from mcsim.kernels.experts import build_alias, eplb_placement, rank_loads, route_steps
from mcsim.kernels.kv_tiers import lookup_tiers
from mcsim.kernels.speculative import verify_passes
from mcsim.perf.fleet_batching import simulate_fleet_batching
from mcsim.reference import experts as ref
from mcsim.reference.batching import simulate_reference
from mcsim.reference.experts import route_steps_reference
from mcsim.reference.fleet_batching import simulate_fleet_reference
from mcsim.reference.kv_tiers import lookup_tiers_reference
from mcsim.reference.speculative import verify_passes as reference_verify_passes
from mcsim.stages.experts import class_popularity

STAGES = ("kv_tiers", "speculative", "experts", "batching")

# The project's performance targets (benchmarks/README.md), per core.
TARGET_KV_TIERS = {"per_s": 50e6, "ratio": 50.0, "text": ">= 50 M block look-ups/s and >= 50x the OrderedDict reference"}
TARGET_SPECULATIVE = {"per_s": 200e6, "ratio": None, "text": ">= 200 M draft tokens/s"}
TARGET_ROUTING = {"per_s": 100e6, "ratio": None, "text": ">= 100 M token-expert assignments/s"}
TARGET_BATCHING = {"per_s": 1e6, "ratio": None, "text": ">= 1 M simulated requests/s (500-token outputs)"}


@dataclass(frozen=True)
class KernelSizes:
    """Input sizes of the kernel cases (requests, steps or tokens per timed call)."""

    kv_requests: int
    kv_reference_requests: int
    spec_requests: int
    spec_reference_requests: int
    spec_numpy_requests: int
    route_steps: int
    route_reference_tokens: int
    route_numpy_steps: int
    rank_steps: int
    rank_reference_steps: int
    batch_requests: int
    batch_reference_requests: int
    batch_capacity_requests: int


FULL = KernelSizes(200_000, 20_000, 200_000, 2_000, 20_000, 256, 250, 16, 4096, 20, 200_000, 2_000, 20_000)
QUICK = KernelSizes(200_000, 20_000, 50_000, 400, 5_000, 64, 100, 4, 1024, 10, 40_000, 400, 5_000)
TINY = KernelSizes(3_000, 300, 2_000, 40, 400, 4, 20, 2, 64, 4, 2_000, 60, 1_000)
SIZES = {"full": FULL, "quick": QUICK, "tiny": TINY}


def cases(stage: str | None = None, sizes: KernelSizes = FULL) -> list[dict]:
    """Benchmark cases of one stage (``None``: all of :data:`STAGES`), kernels compiled before returning.

    Examples
    --------
    >>> rows = cases("speculative", TINY)  # doctest: +SKIP
    >>> rows[0]["items_fast"] / best_of(rows[0]["fast"])  # draft tokens/s  # doctest: +SKIP
    """
    builders = {"kv_tiers": kv_tiers_cases, "speculative": speculative_cases, "experts": experts_cases,
                "batching": batching_cases}
    if stage is not None and stage not in builders:
        raise ValueError(f"unknown stage {stage!r}; expected one of {', '.join(STAGES)}")
    out = []
    for name in STAGES if stage is None else (stage,):
        out.extend(builders[name](sizes))
    return out


# --------------------------------------------------------------------------------------------------------
# KV tiers
# --------------------------------------------------------------------------------------------------------

KV_INSTANCES = 4
KV_CAPACITY_BLOCKS = np.array([4_000, 16_000, 64_000], np.int64)


def kv_workload(n_requests: int, n_instances: int = KV_INSTANCES, seed: int = 0):
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


def run_kv_kernel(workload):
    """Blocks reused from HBM, DRAM and NVMe per request (int64[n, 3]) for a :func:`kv_workload`."""
    block_ptr, block_keys, instance, n_keys = workload
    hits = np.zeros((instance.shape[0], 3), np.int64)
    lookup_tiers(block_ptr, block_keys, instance, KV_INSTANCES, n_keys, KV_CAPACITY_BLOCKS, hits)
    return hits


def pooled_kv_workload(n_requests: int, seed: int = 0):
    """:func:`kv_workload`'s prompts as block ids (one key space, ``key_stride`` of them) on :data:`KV_INSTANCES`
    instances drawn at random: ``(block_ptr, block_ids, instance, key_stride)``."""
    block_ptr, block_ids, _, key_stride = kv_workload(n_requests, n_instances=1, seed=seed)
    instance = np.random.default_rng(seed + 1).integers(0, KV_INSTANCES, n_requests).astype(np.int32)
    return block_ptr, block_ids, instance, key_stride


def run_pooled_kv_kernel(workload):
    """:func:`run_kv_kernel` with the last of :data:`KV_CAPACITY_BLOCKS`' tiers pooled (one capacity that every
    instance shares, behind their own two)."""
    block_ptr, block_ids, instance, key_stride = workload
    hits = np.zeros((instance.shape[0], 3), np.int64)
    lookup_tiers(block_ptr, block_ids, instance, KV_INSTANCES, KV_INSTANCES * key_stride, KV_CAPACITY_BLOCKS, hits,
                 key_stride=key_stride, n_private=2)
    return hits


def kv_tiers_cases(sizes: KernelSizes = FULL) -> list[dict]:
    """The KV-tier kernel against the ``OrderedDict`` reference (no NumPy version: LRU is sequential), with every
    tier each instance's own and with the last one pooled."""
    capacity = tuple(int(c) for c in KV_CAPACITY_BLOCKS)
    out = []
    for name, workload, run, private in (
            ("KV tiers, 3 tiers, 4 instances", kv_workload, run_kv_kernel, None),
            ("KV tiers, 2 tiers + 1 pooled, 4 instances", pooled_kv_workload, run_pooled_kv_kernel, 2)):
        fast_workload = workload(sizes.kv_requests)
        reference_workload = workload(sizes.kv_reference_requests)
        keys, ptr = reference_workload[1].tolist(), reference_workload[0].tolist()
        block_lists = [keys[ptr[r] : ptr[r + 1]] for r in range(len(ptr) - 1)]
        instance = reference_workload[2].tolist()
        run(workload(100))  # compile (or load from the cache) outside the timed call
        out.append({
            "stage": "kv_tiers", "name": name, "unit": "block look-ups",
            "items_fast": int(fast_workload[1].shape[0]), "fast": lambda w=fast_workload, run=run: run(w),
            "items_reference": int(reference_workload[1].shape[0]),
            "reference": lambda b=block_lists, i=instance, p=private: lookup_tiers_reference(
                b, i, capacity, n_instances=KV_INSTANCES, n_private=p),
            "items_numpy": 0, "numpy": None, "target": TARGET_KV_TIERS,
        })
    return out


# --------------------------------------------------------------------------------------------------------
# Speculative draws
# --------------------------------------------------------------------------------------------------------

SPEC_SEED = 20240601
SPEC_OUTPUT_TOKENS = (500, 1000)


def speculative_workload(n_requests: int):
    """Output tokens (500-1000) and per-request acceptance ~ Beta(17, 3) (about 0.85, a well-matched drafter)."""
    rng = np.random.default_rng(SPEC_SEED)
    low, high = SPEC_OUTPUT_TOKENS
    return rng.integers(low, high + 1, n_requests, dtype=np.int64), rng.beta(17.0, 3.0, n_requests)


def verify_passes_numpy(output_tokens, acceptance, draft_tokens, decay, rng):
    """Verification passes and used accepted drafts per request, vectorized over the requests still running.

    Each loop iteration is one pass of every unfinished request: ``k`` uniforms per request, the leading
    accepted drafts are the length of the first run of ``u_i < alpha * decay**i`` (the reference's law).

    Returns
    -------
    passes, accepted : int64 arrays
    """
    remaining = np.array(output_tokens, np.int64)
    passes = np.zeros_like(remaining)
    accepted = np.zeros_like(remaining)
    threshold = np.asarray(acceptance, np.float64)[:, None] * decay ** np.arange(draft_tokens)
    active = np.flatnonzero(remaining > 0)
    while active.size:
        if draft_tokens:
            accept = rng.random((active.size, draft_tokens)) < threshold[active]
            leading = np.cumprod(accept, axis=1).sum(axis=1)
        else:
            leading = np.zeros(active.size, np.int64)
        left = remaining[active]
        accepted[active] += np.minimum(leading, left - 1)
        remaining[active] = left - np.minimum(1 + leading, left)
        passes[active] += 1
        active = active[remaining[active] > 0]
    return passes, accepted


def _speculative_case(name: str, draft_tokens: int, decay: float, sizes: KernelSizes) -> dict:
    output_tokens, acceptance = speculative_workload(sizes.spec_requests)
    passes = np.empty_like(output_tokens)
    accepted = np.empty_like(output_tokens)

    # Every timed call starts a fresh Generator from the same seed, so it processes exactly ``items``.
    def fast():
        verify_passes(output_tokens, acceptance, draft_tokens, decay, np.random.default_rng(SPEC_SEED), passes,
                      accepted)

    fast()  # compile, and count the draft tokens this seed gives
    items_fast = int(passes.sum()) * draft_tokens

    ref_output = output_tokens[: sizes.spec_reference_requests].tolist()
    ref_acceptance = acceptance[: sizes.spec_reference_requests].tolist()

    def reference():
        return reference_verify_passes(ref_output, ref_acceptance, draft_tokens, decay, random.Random(SPEC_SEED))

    np_output = output_tokens[: sizes.spec_numpy_requests]
    np_acceptance = acceptance[: sizes.spec_numpy_requests]

    def vectorized():
        return verify_passes_numpy(np_output, np_acceptance, draft_tokens, decay, np.random.default_rng(SPEC_SEED))

    return {
        "stage": "speculative", "name": name, "unit": "draft tokens",
        "items_fast": items_fast, "fast": fast,
        "items_reference": sum(reference()[0]) * draft_tokens, "reference": reference,
        "items_numpy": int(vectorized()[0].sum()) * draft_tokens, "numpy": vectorized,
        "target": TARGET_SPECULATIVE,
    }


def speculative_cases(sizes: KernelSizes = FULL) -> list[dict]:
    """The k = 1 of MTP, k = 4, and k = 4 with acceptance decaying by draft position."""
    return [
        _speculative_case("speculative, k=1 (MTP)", 1, 1.0, sizes),
        _speculative_case("speculative, k=4", 4, 1.0, sizes),
        _speculative_case("speculative, k=4, decay 0.9", 4, 0.9, sizes),
    ]


# --------------------------------------------------------------------------------------------------------
# Experts per rank
# --------------------------------------------------------------------------------------------------------

N_EXPERTS, TOP_K, N_SLOTS, N_GPUS, N_GROUPS, N_NODES = 256, 8, 288, 32, 8, 4
ROUTE_TOKENS_PER_STEP = 4096


def route_steps_numpy(tokens_per_step, class_shares, class_weights, top_k, n_steps, rng):
    """Token-expert counts per step, vectorized over the tokens of a step by the Gumbel-top-k trick.

    The top ``k`` of ``log w + Gumbel`` noise has the law of ``k`` draws one after the other proportionally to
    ``w`` among the experts not chosen yet (Plackett-Luce), the law of the reference and of the kernel.

    Returns
    -------
    int64[n_steps, E]
    """
    class_weights = np.asarray(class_weights, np.float64)
    n_classes, n_experts = class_weights.shape
    with np.errstate(divide="ignore"):
        log_weights = np.log(class_weights)
    counts = np.empty((n_steps, n_experts), np.int64)
    for s in range(n_steps):
        token_class = rng.choice(n_classes, tokens_per_step, p=class_shares)
        keys = log_weights[token_class] + rng.gumbel(size=(tokens_per_step, n_experts))
        chosen = np.argpartition(-keys, top_k - 1, axis=1)[:, :top_k]
        counts[s] = np.bincount(chosen.ravel(), minlength=n_experts)
    return counts


def rank_loads_numpy(counts, phy2log, logcnt, num_gpus):
    """Max and mean GPU load per step: slot loads gathered by fancy indexing, summed per GPU."""
    slot_load = counts[:, phy2log] / logcnt[phy2log]
    gpu_load = slot_load.reshape(counts.shape[0], num_gpus, -1).sum(axis=2)
    return gpu_load.max(axis=1), gpu_load.mean(axis=1)


def _routing_case(name, skews, shares, sizes: KernelSizes) -> dict:
    laws = class_popularity(N_EXPERTS, skews, np.random.default_rng(0))
    prob = np.empty(laws.shape)
    alias = np.empty(laws.shape, np.int64)
    for c in range(laws.shape[0]):
        build_alias(laws[c], prob[c], alias[c])
    shares = np.asarray(shares, np.float64)
    cdf = np.cumsum(shares)
    cdf[-1] = 1.0
    tokens = ROUTE_TOKENS_PER_STEP
    counts = np.empty((sizes.route_steps, N_EXPERTS), np.int64)
    rng = np.random.default_rng(1)
    route_steps(tokens, cdf, prob, alias, TOP_K, rng, counts[:1])  # compile
    ref_rng = random.Random(1)
    laws_list, shares_list = laws.tolist(), shares.tolist()
    np_rng = np.random.default_rng(1)
    return {
        "stage": "experts", "name": name, "unit": "token-expert assignments",
        "items_fast": tokens * sizes.route_steps * TOP_K,
        "fast": lambda: route_steps(tokens, cdf, prob, alias, TOP_K, rng, counts),
        "items_reference": sizes.route_reference_tokens * TOP_K,
        "reference": lambda: route_steps_reference(sizes.route_reference_tokens, shares_list, laws_list, TOP_K, 1,
                                                   ref_rng),
        "items_numpy": tokens * sizes.route_numpy_steps * TOP_K,
        "numpy": lambda: route_steps_numpy(tokens, shares, laws, TOP_K, sizes.route_numpy_steps, np_rng),
        "target": TARGET_ROUTING,
    }


def experts_cases(sizes: KernelSizes = FULL) -> list[dict]:
    """Routing (uniform, and a skewed four-class mix), EPLB placement and rank loads."""
    out = [
        _routing_case("expert routing, uniform, 1 class", [0.0], [1.0], sizes),
        _routing_case("expert routing, Zipf 0.4-1.0, 4 classes", [0.4, 0.6, 0.8, 1.0], [0.4, 0.3, 0.2, 0.1], sizes),
    ]
    load = np.random.default_rng(2).integers(1_000, 100_000, N_EXPERTS).astype(np.float64)
    phy2log, logcnt = eplb_placement(load, N_SLOTS, N_GROUPS, N_NODES, N_GPUS)  # compile
    load_list = load.tolist()
    out.append({
        "stage": "experts", "name": "EPLB placement, 256 experts -> 288 slots / 32 GPUs", "unit": "placements",
        "items_fast": 1, "fast": lambda: eplb_placement(load, N_SLOTS, N_GROUPS, N_NODES, N_GPUS),
        "items_reference": 1,
        "reference": lambda: ref.eplb_placement_reference(load_list, N_SLOTS, N_GROUPS, N_NODES, N_GPUS),
        "items_numpy": 0, "numpy": None, "target": None,
    })
    steps = sizes.rank_steps
    counts = np.random.default_rng(3).integers(0, 256, (steps, N_EXPERTS))
    out_max, out_mean = np.empty(steps), np.empty(steps)
    rank_loads(counts[:2], phy2log, logcnt, N_GPUS, out_max[:2], out_mean[:2])  # compile
    ref_steps = sizes.rank_reference_steps
    counts_list, phy2log_list, logcnt_list = counts[:ref_steps].tolist(), phy2log.tolist(), logcnt.tolist()
    out.append({
        "stage": "experts", "name": "rank loads, 288 slots / 32 GPUs", "unit": "steps",
        "items_fast": steps, "fast": lambda: rank_loads(counts, phy2log, logcnt, N_GPUS, out_max, out_mean),
        "items_reference": ref_steps,
        "reference": lambda: ref.rank_loads_reference(counts_list, phy2log_list, logcnt_list, N_GPUS),
        "items_numpy": steps, "numpy": lambda: rank_loads_numpy(counts, phy2log, logcnt, N_GPUS),
        "target": None,
    })
    return out


# --------------------------------------------------------------------------------------------------------
# Batching simulator
# --------------------------------------------------------------------------------------------------------

BATCH_LOAD = 0.8
BATCH_DECODE_EDGES = 2.0 ** np.arange(10)  # 1 .. 512 sequences
BATCH_PREFILL_EDGES = np.array([0.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0])
BATCH_STEP_TIME_TABLE = 0.006 + 3e-5 * BATCH_DECODE_EDGES[:, None] + 1.5e-6 * BATCH_PREFILL_EDGES[None, :]
BATCH_SETTINGS = {"token_budget": 8192, "max_seqs": 256, "block_tokens": 16, "chunk_tokens": 0, "verify_tokens": 1,
                  "closed_users": 0}
# name: (policy, preempt, KV pool in blocks); the memory-bound case preempts often.
BATCH_VARIANTS = {
    "continuous, preemption": ("continuous", True, 40_000),
    "continuous, whole-request reservation": ("continuous", False, 40_000),
    "continuous, preemption, memory-bound KV pool": ("continuous", True, 12_000),
    "static": ("static", False, 40_000),
}


def batching_workload(n_requests: int, rate_per_s: float, seed: int = 0):
    """Arrival times (s) and prefill, context and output tokens; ``rate_per_s == 0``: all at t = 0."""
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate_per_s, n_requests)) if rate_per_s else np.zeros(n_requests)
    context = np.clip(rng.lognormal(np.log(800), 0.8, n_requests), 16, 8000).astype(np.int64)
    prefill = np.maximum(1, (context * rng.uniform(0.3, 1.0, n_requests)).astype(np.int64))
    output = np.clip(rng.lognormal(np.log(500) - 0.125, 0.5, n_requests), 1, 4000).astype(np.int64)
    return arrival, prefill, context, output


def _batching_params(policy, preempt, kv_blocks):
    params = np.zeros(slots.N_PARAMS, np.int64)
    params[slots.P_TOKEN_BUDGET] = BATCH_SETTINGS["token_budget"]
    params[slots.P_MAX_SEQS] = BATCH_SETTINGS["max_seqs"]
    params[slots.P_KV_BLOCKS] = kv_blocks
    params[slots.P_BLOCK_TOKENS] = BATCH_SETTINGS["block_tokens"]
    params[slots.P_CHUNK_TOKENS] = BATCH_SETTINGS["chunk_tokens"]
    params[slots.P_VERIFY_TOKENS] = BATCH_SETTINGS["verify_tokens"]
    params[slots.P_POLICY] = slots.POLICY_STATIC if policy == "static" else slots.POLICY_CONTINUOUS
    params[slots.P_PREEMPT] = int(preempt)
    params[slots.P_ROUTE_PICK] = slots.PICK_GIVEN
    return params


def run_batching_kernel(workload, policy, preempt, kv_blocks):
    """Per-request outputs (four float arrays) and the statistics vector of the step loop with one instance."""
    arrival, prefill, context, output = workload
    n = arrival.shape[0]
    outputs = [np.empty(n) for _ in range(4)]
    stats = np.zeros(slots.N_STATS)
    zeros = np.zeros(n, np.int64)
    no_log_f, no_log_i = np.zeros((1, 0)), np.zeros((1, 0), np.int64)
    kernel.simulate(arrival, prefill, context, output, output - 1, np.zeros(n), zeros, zeros, False,
                    np.zeros(n + 1, np.int64), zeros[:0], 1, np.zeros(1, np.int64), False,
                    _batching_params(policy, preempt, kv_blocks), 0.0, 0, 0.0, -1, BATCH_STEP_TIME_TABLE,
                    BATCH_DECODE_EDGES, BATCH_PREFILL_EDGES, np.zeros(len(BATCH_DECODE_EDGES)), 0.0,
                    np.empty((0, 4), np.int32), outputs[0], np.empty(n, np.int64), outputs[1], outputs[2], outputs[3],
                    np.empty((n, 1), np.int64), np.zeros(1, np.int64), stats, no_log_f, no_log_i, no_log_i, no_log_f,
                    no_log_i)
    return outputs, stats


def run_batching_reference(workload, policy, preempt, kv_blocks):
    """The event-loop reference on the same workload (lists in, lists out)."""
    arrival, prefill, context, output = (a.tolist() for a in workload)
    return simulate_reference(arrival, prefill, context, output, [o - 1 for o in output], [0.0] * len(arrival),
                              policy=policy, preempt=preempt, kv_blocks=kv_blocks, warmup_s=0.0,
                              step_time_table=BATCH_STEP_TIME_TABLE, decode_edges=BATCH_DECODE_EDGES,
                              prefill_edges=BATCH_PREFILL_EDGES, **BATCH_SETTINGS)


def batching_capacity_per_s(policy, preempt, kv_blocks, n_requests: int = 20_000) -> float:
    """Completions per second when every request waits at t = 0 (the instance always backlogged)."""
    outputs, _ = run_batching_kernel(batching_workload(n_requests, 0.0), policy, preempt, kv_blocks)
    return n_requests / np.nanmax(outputs[2])


def batching_cases(sizes: KernelSizes = FULL) -> list[dict]:
    """The batching simulator against its event-loop reference (no NumPy version: a DES is sequential)."""
    out = []
    for name, (policy, preempt, kv_blocks) in BATCH_VARIANTS.items():
        # Also the warm-up: compiles (or loads) the kernel.
        rate = BATCH_LOAD * batching_capacity_per_s(policy, preempt, kv_blocks, sizes.batch_capacity_requests)
        fast_workload = batching_workload(sizes.batch_requests, rate, seed=1)
        reference_workload = batching_workload(sizes.batch_reference_requests, rate, seed=1)
        out.append({
            "stage": "batching", "name": f"batching, {name}", "unit": "simulated requests",
            "items_fast": sizes.batch_requests,
            "fast": lambda w=fast_workload, p=policy, e=preempt, k=kv_blocks: run_batching_kernel(w, p, e, k),
            "items_reference": sizes.batch_reference_requests,
            "reference": lambda w=reference_workload, p=policy, e=preempt, k=kv_blocks: run_batching_reference(
                w, p, e, k),
            "items_numpy": 0, "numpy": None, "target": TARGET_BATCHING,
        })
    out.append(fleet_case(sizes))
    return out


FLEET_REPLICAS = 8
FLEET_CACHE_BLOCKS = (2_000, 4_000, 8_000)  # one replica's HBM, DRAM, NVMe prefix cache, blocks


def fleet_workload(n_requests: int, rate_per_s: float, seed: int = 0):
    """Arrivals and outputs of :func:`batching_workload`; prompts of :func:`kv_workload` (their blocks x 16
    tokens plus a partial block), as CSR blocks."""
    arrival, _, _, output = batching_workload(n_requests, rate_per_s, seed)
    block_ptr, block_ids, _, _ = kv_workload(n_requests, n_instances=1, seed=seed)
    rng = np.random.default_rng(seed + 1)
    prompt = np.diff(block_ptr) * BATCH_SETTINGS["block_tokens"] + rng.integers(0, 16, n_requests)
    return arrival, prompt.astype(np.int64), output, block_ptr, block_ids


def _fleet_settings():
    return {key: BATCH_SETTINGS[key] for key in ("token_budget", "max_seqs", "block_tokens", "chunk_tokens",
                                                 "verify_tokens")}


def fleet_case(sizes: KernelSizes) -> dict:
    """The replicas' kernel (8 instances, cache-aware, tiered caches) against the fleet event-loop reference."""
    rate = BATCH_LOAD * FLEET_REPLICAS * batching_capacity_per_s("continuous", False, 40_000,
                                                                 sizes.batch_capacity_requests)
    table = {"step_time_table": BATCH_STEP_TIME_TABLE, "decode_edges": BATCH_DECODE_EDGES,
             "prefill_edges": BATCH_PREFILL_EDGES}

    def fast(workload=fleet_workload(sizes.batch_requests, rate, seed=1)):
        arrival, prompt, output, ptr, ids = workload
        return simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=FLEET_REPLICAS,
                                       router="cache-aware", block_ptr=ptr, block_ids=ids,
                                       capacity_blocks=FLEET_CACHE_BLOCKS, kv_blocks=40_000, **table,
                                       **_fleet_settings())

    reference_workload = fleet_workload(sizes.batch_reference_requests, rate, seed=1)

    def reference(workload=reference_workload):
        arrival, prompt, output, ptr, ids = workload
        lists = [ids[ptr[r]:ptr[r + 1]].tolist() for r in range(len(arrival))]
        return simulate_fleet_reference(arrival.tolist(), prompt.tolist(), prompt.tolist(), output.tolist(),
                                        (output - 1).tolist(), [0.0] * len(arrival), n_instances=FLEET_REPLICAS,
                                        router="cache-aware", kv_blocks=40_000, block_lists=lists,
                                        capacity_blocks=FLEET_CACHE_BLOCKS, **table, **_fleet_settings())

    fast()  # compiles (or loads) the kernel
    return {"stage": "batching", "name": f"fleet of {FLEET_REPLICAS} replicas, cache-aware, tiered caches",
            "unit": "simulated requests", "items_fast": sizes.batch_requests, "fast": fast,
            "items_reference": sizes.batch_reference_requests, "reference": reference,
            "items_numpy": 0, "numpy": None, "target": TARGET_BATCHING}

"""Small pieces of the step loop (:mod:`mcsim.kernels.step_loop`): its parameter and statistic slots, the
step-time table, the (time, index) heaps, KV growth and a keyed queue's skew heap.

Most are ``inline="always"``: the step loop calls them on its hot path, and a call that passes arrays costs
atomic reference-count updates (the skew heap is the exception, said there). An inlined body saves them only if
it has no branch: Numba prunes the increments and decrements of its array arguments within one basic block.
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel

# Indices into params_int.
P_TOKEN_BUDGET = 0
P_MAX_SEQS = 1
P_KV_BLOCKS = 2
P_BLOCK_TOKENS = 3
P_CHUNK_TOKENS = 4
P_VERIFY_TOKENS = 5
P_POLICY = 6
P_PREEMPT = 7
P_CLOSED_USERS = 8
P_ORDER = 9
P_MIXING = 10
P_MAX_NEW = 11
P_ROUTE_PICK = 12
P_ROUTE_MEASURE = 13
P_ROUTE_PREFIX = 14
P_POOLED_TIERS = 15
N_PARAMS = 16

# Codes of the policy fields (mcsim.scenario.policies names them). P_POLICY: when requests are admitted.
POLICY_CONTINUOUS = 0
POLICY_STATIC = 1
# P_ORDER: the waiting queue's order.
ORDER_FCFS = 0
ORDER_KEY = 1  # by (queue_key, order of arrival): lower key first
# P_MIXING: what one step may hold.
MIXING_MIXED = 0  # decodes and prefill chunks share a step
MIXING_EXCLUSIVE = 1  # a step is prefill only (when there is prefill to do) or decode only
# Codes of a router's fields (mcsim.scenario.routing names them). P_ROUTE_PICK: how the instance is chosen.
PICK_GIVEN = 0  # the caller's placement of each request (round-robin, random, prefix affinity)
PICK_LEAST = 1  # the instance of least load, by P_ROUTE_MEASURE
# P_ROUTE_MEASURE: the load a least-load router compares.
MEASURE_OUTSTANDING = 0  # requests in flight (waiting + running)
MEASURE_FREE_KV = 1  # free KV blocks (most free first)
# P_ROUTE_PREFIX: 1 = the longest cached prefix wins unless the fleet is imbalanced (SGLang's cache-aware rule).
# P_POOLED_TIERS: how many of the last cache tiers the instances share (a pool behind their own tiers; 0 = none).

# Indices into out_stats.
STAT_STEPS = 0
STAT_PREEMPTIONS = 1
STAT_WINDOW_END_S = 2
STAT_IN_SYSTEM_INTEGRAL = 3
STAT_WINDOW_STEPS = 4
STAT_WINDOW_STEP_S_SUM = 5
STAT_WINDOW_DECODE_SEQS_SUM = 6
STAT_WINDOW_DECODE_STEPS = 7
STAT_WAITING_AT_WINDOW_END = 8
STAT_END_S = 9
STAT_STATUS = 10
N_STATS = 11

# Request states.
_PENDING, _WAITING, _PREFILLING, _DECODING, _DONE = 0, 1, 2, 3, 4
# The size's slot in the state array of a (time, index) heap.
_HEAP_SIZE = 1



@kernel(inline="always")
def _bracket(edges, x):
    """Lower index, upper index and weight of ``x`` between ``edges`` (clamped at both ends)."""
    last = edges.shape[0] - 1
    if last == 0 or x <= edges[0]:
        return 0, min(1, last), 0.0
    if x >= edges[last]:
        return last - 1, last, 1.0
    low, high = 0, last  # edges[low] <= x < edges[high]
    while high - low > 1:
        mid = (low + high) >> 1
        if edges[mid] <= x:
            low = mid
        else:
            high = mid
    return low, low + 1, (x - edges[low]) / (edges[low + 1] - edges[low])


@kernel(inline="always")
def step_time(step_time_table, decode_edges, prefill_edges, decode_seqs, prefill_tokens):
    """Step time in seconds at (decode_seqs, prefill_tokens): bilinear in the table, clamped at its edges."""
    i0, i1, fx = _bracket(decode_edges, float(decode_seqs))
    j0, j1, fy = _bracket(prefill_edges, float(prefill_tokens))
    low = step_time_table[i0, j0] * (1.0 - fy) + step_time_table[i0, j1] * fy
    high = step_time_table[i1, j0] * (1.0 - fy) + step_time_table[i1, j1] * fy
    return low * (1.0 - fx) + high * fx


@kernel(inline="always")
def kv_slope_at(kv_slope, decode_edges, decode_seqs):
    """Seconds per KV token at ``decode_seqs`` decoding sequences: linear in ``kv_slope``, clamped."""
    i0, i1, fx = _bracket(decode_edges, float(decode_seqs))
    return kv_slope[i0] * (1.0 - fx) + kv_slope[i1] * fx


@kernel(inline="always")
def prefill_chunk(prefill_left, budget_left, chunk_tokens):
    """Prefill tokens a sequence gets in a step: what it has left, within the step's token budget and the
    per-request chunk cap (``chunk_tokens``; 0 = none)."""
    c = min(prefill_left, budget_left)
    if chunk_tokens > 0:
        c = min(c, chunk_tokens)
    return c


@kernel(inline="always")
def unlink_running(run_prev, run_next, run_tail, r):
    """Take ``r`` out of the doubly linked list of running sequences; returns the list's new tail.

    Without a branch (a missing neighbour's link is written at ``r``'s own, unchanged), as the step loop's list
    operations: see :func:`mcsim.kernels.step_loop._file`.
    """
    before = run_prev[r]
    after = run_next[r]
    run_next[before + (before < 0) * (r - before)] = after
    run_prev[after + (after < 0) * (r - after)] = before
    return run_tail + (after < 0) * (before - run_tail)


@kernel(inline="always")
def _kv_rate(output, passes):
    """Tokens of KV one pass adds to a sequence, on average (0 for a one-token output)."""
    return (output - 1) / passes if passes > 0 else 0.0


@kernel(inline="always")
def _tokens_after(output, passes, passes_done):
    """Output tokens produced after ``passes_done`` passes, the first token included."""
    if passes == 0:
        return 1
    return 1 + passes_done * (output - 1) // passes


@kernel(inline="always")
def _heap_less(heap_t, heap_r, a, b):
    return heap_t[a] < heap_t[b] or (heap_t[a] == heap_t[b] and heap_r[a] < heap_r[b])


@kernel(inline="always")
def _heap_push(heap_t, heap_r, state, time, request):
    """Push (time, request) onto the binary min-heap of future closed-loop arrivals."""
    i = state[_HEAP_SIZE]
    state[_HEAP_SIZE] = i + 1
    heap_t[i] = time
    heap_r[i] = request
    while i > 0:
        parent = (i - 1) >> 1
        if not _heap_less(heap_t, heap_r, i, parent):
            break
        heap_t[i], heap_t[parent] = heap_t[parent], heap_t[i]
        heap_r[i], heap_r[parent] = heap_r[parent], heap_r[i]
        i = parent


@kernel(inline="always")
def _heap_pop(heap_t, heap_r, state):
    """Remove the heap's top."""
    size = state[_HEAP_SIZE] - 1
    state[_HEAP_SIZE] = size
    heap_t[0] = heap_t[size]
    heap_r[0] = heap_r[size]
    i = 0
    while True:
        child = 2 * i + 1
        if child >= size:
            break
        if child + 1 < size and _heap_less(heap_t, heap_r, child + 1, child):
            child += 1
        if not _heap_less(heap_t, heap_r, child, i):
            break
        heap_t[i], heap_t[child] = heap_t[child], heap_t[i]
        heap_r[i], heap_r[child] = heap_r[child], heap_r[i]
        i = child


@kernel(inline="always")
def _store_window(out_stats, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                  window_decode_steps, steps, end_s):
    """Copy the statistics accumulated in locals during the run into ``out_stats``."""
    out_stats[STAT_IN_SYSTEM_INTEGRAL] = in_system_integral
    out_stats[STAT_WINDOW_STEPS] = window_steps
    out_stats[STAT_WINDOW_STEP_S_SUM] = window_step_s_sum
    out_stats[STAT_WINDOW_DECODE_SEQS_SUM] = window_decode_seqs_sum
    out_stats[STAT_WINDOW_DECODE_STEPS] = window_decode_steps
    out_stats[STAT_STEPS] = steps
    out_stats[STAT_END_S] = end_s


@kernel(inline="always")
def _next_block_step(context, output, passes, block_tokens, held, passes_done, decode_start_step):
    """Step at which a decoding sequence next needs a block (-1: never), from the blocks it holds."""
    tokens_needing_block = held * block_tokens - context + 1  # output tokens that overflow what is held
    if tokens_needing_block > output or passes == 0:
        return -1
    # Smallest pass q with 1 + floor(q * (output - 1) / passes) >= tokens_needing_block.
    q = ((tokens_needing_block - 1) * passes + output - 2) // (output - 1)
    return decode_start_step + (q - passes_done - 1)


@kernel(inline="always")
def _key_before(key, tie, a, b):
    """Whether request ``a`` comes before ``b`` in a keyed waiting queue: lower key, then lower rank of release."""
    return key[a] < key[b] or (key[a] == key[b] and tie[a] < tie[b])


@kernel
def skew_merge(a, b, left, right, key, tie):
    """Merge the skew heaps rooted at ``a`` and ``b`` (-1: empty) on ``(key, tie)``; returns the new root.

    A waiting queue kept as a skew heap lives in two links per request, so an instance's queue needs no storage of
    its own and never fills; its pops come out in ``(key, tie)`` order as a binary heap's would. Not inlined: a
    keyed policy pays a call per push and pop, and the step loop that FCFS policies run stays small.
    """
    if a < 0:
        return b
    if b < 0:
        return a
    if _key_before(key, tie, b, a):
        a, b = b, a
    root = a
    parent = -1
    while a >= 0 and b >= 0:
        if _key_before(key, tie, b, a):
            a, b = b, a
        # a is the smaller root: its right subtree merges with b and the children swap.
        following = right[a]
        right[a] = left[a]
        if parent >= 0:
            left[parent] = a
        parent = a
        a = following
    left[parent] = a if a >= 0 else b
    return root

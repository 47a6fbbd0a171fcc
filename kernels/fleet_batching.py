"""Several replicas of one pool on one clock behind a global router: a step-level simulator of the fleet.

Each of ``K`` instances runs the continuous-batching scheduler of :mod:`mcsim.kernels.batching` with an FCFS
waiting queue (or, ``P_ORDER == ORDER_KEY``, a heap on a key and arrival), mixed prefill/decode steps and
open-loop arrivals -- whole-request KV reservation at admission,
or (``P_PREEMPT``) KV growth and preemption by recompute under that module's rules -- with the same step-time
table. What is new is that the instances share one clock and every arrival is placed by a router that looks
at their *current* state.

Event order
-----------
Arrivals are processed in order of (arrival time, index). Before request ``r`` arriving at ``t`` is routed,
every step of the fleet that *starts* before ``t`` runs, in order of (start time, instance index) (a step
that starts at ``t`` or later sees the arrival, as arrivals at or before a step's start join its queue in the
one-instance simulator). Then the router picks an instance from the state the instances have at ``t``, their
load being the requests in flight (waiting + running). A step runs whole when it starts, so a step that
started before ``t`` and ends after it still counts the requests finishing at its end as in flight, and
their KV blocks as held:

- ``ROUTER_ROUND_ROBIN``: instance ``r mod K``;
- ``ROUTER_RANDOM``: instance ``floor(u[r] * K)`` for a uniform ``u[r]`` in [0, 1) drawn by the caller;
- ``ROUTER_LEAST_OUTSTANDING``: the least load;
- ``ROUTER_LEAST_KV``: most free KV blocks;
- ``ROUTER_FIXED``: ``fixed_instance[r]``, chosen by the caller (prefix affinity);
- ``ROUTER_CACHE_AWARE``: SGLang's rule. When the fleet is imbalanced -- the largest load exceeds the
  smallest by more than ``balance_requests`` *and* by more than ``(1 + balance)`` times -- the least loaded
  instance; otherwise the instance whose prefix cache holds the longest leading run of the request's blocks
  *now*, ties to the lower load (so a request no cache knows goes to the least loaded instance).

Ties go to the lowest instance index. The request joins the tail of that instance's waiting queue; an idle
instance's clock jumps to the arrival (or stays at the end of its last step if that is later). After the
last arrival every instance drains.

Closed loop (``P_CLOSED_USERS = U > 0``): requests ``0 .. U-1`` arrive at ``arrival_s``, and request ``r >= U``
arrives ``think_s[r]`` after request ``r - U`` (the same user's previous one) finishes, in order of (time, index)
among the pending ones. The fleet's steps then run in time order, as with a pooled cache, so a follower is routed
before any step that starts after it arrives.

Prefix caches on the same clock
-------------------------------
When ``capacity_blocks[0] > 0`` every instance keeps its own tiered LRU prefix cache (one LRU list per tier, in
the order of ``capacity_blocks``: the rules and code of :mod:`mcsim.kernels.kv_tiers`), or, with ``pooled``, all
of them share one (a KV store). A request is looked up and its blocks are inserted when its instance first
*admits* it (step 3 below), so a hit depends on what that cache had admitted before, in the fleet's time order.
Its reused tokens are its reused blocks x ``block_tokens``, less what would leave no prompt token to compute (at
least one is computed, taken from the first tier's share first, then the next tier's, and so on), and its
prefill is the rest of the prompt. With ``capacity_blocks[0] == 0`` nothing is cached and the prefill is the whole prompt.

Step of one instance (continuous, mixed)
----------------------------------------
1. KV growth (``P_PREEMPT`` only): every decoding sequence, oldest admission first, that needs more KV
   blocks for this step's pass takes them; if the pool is short, the most recently admitted running sequence
   is preempted (possibly the one asking) until the need fits. The victim loses its KV and prefill progress
   and goes back to the head of the queue (victims of one step keep their admission order; under a keyed order,
   back under its own key and arrival); its output so far
   stays produced, and its recompute prefills the prompt tokens its first admission computed plus that
   output (no second cache look-up) and emits no first token.
2. Every decoding sequence runs one pass and costs ``verify_tokens`` of the ``token_budget``.
3. The remaining budget goes, in admission order, to running sequences whose prefill is unfinished, each
   ``min(prefill left, budget left, chunk_tokens)`` (``chunk_tokens == 0``: no cap); then, unless the step
   preempted, requests are admitted from the queue head, without skipping, while budget is left, fewer than
   ``max_seqs`` run, fewer than ``P_MAX_NEW`` were admitted in this step (0: no cap) and the pool holds the
   request's blocks -- ``ceil((context + output) / block_tokens)``,
   or with ``P_PREEMPT`` those of the context and the output produced so far; a first admission is looked up
   in and inserted into the prefix cache, then every admitted request gets its first chunk.
4. Step time: bilinear in ``step_time_table`` at (decoding sequences, prefill tokens), clamped, plus
   ``kv_slope(d) x (S - d x kv_ref_context)`` with ``S`` the summed KV length of the decoding sequences
   (``context + 1 + j x (output - 1) / P`` after ``j`` of ``P`` passes), kept up to date step by step (as in
   the one-instance simulator; equal to a fresh sum up to rounding).
5. At the end of the step a completed prefill emits the first token (the request finishes there if it has
   no passes left, else decodes from the next step); a sequence that ran its last pass finishes.

Statistics
----------
Over the steps that start before the last arrival and at or after ``warmup_s`` (the measured window, which
ends at the last arrival), ``out_stats`` sums, over all instances and at the ``STAT_*`` indices of
:mod:`mcsim.kernels.batching_helpers`: steps, their step time, decoding sequences over the steps that decode
and those steps; the requests in flight integrated over time (each step weighs its instance's in-flight count
at its start by its length within the window); the requests waiting when the last one has been routed; and
the total steps, the window end and the end of the last step.

Cost: a step costs O(prefilling sequences + finishing ones x log ``max_seqs``): the decoding sequences are a
count, two running sums and a min-heap of the steps they finish at, not a list walked every step. An arrival
costs O(K), and O(K x its blocks) under cache-aware routing.
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel
from mcsim.kernels.batching_helpers import (
    _HEAP_SIZE, ORDER_KEY, P_BLOCK_TOKENS, P_CHUNK_TOKENS, P_CLOSED_USERS, P_KV_BLOCKS, P_MAX_NEW, P_MAX_SEQS,
    P_ORDER, P_PREEMPT, P_TOKEN_BUDGET, P_VERIFY_TOKENS, STAT_PREEMPTIONS, STAT_WAITING_AT_WINDOW_END,
    STAT_WINDOW_END_S, _heap_pop, _heap_push, _kv_rate, _next_block_step, _store_window, _tokens_after, kv_slope_at,
    prefill_chunk, step_time, unlink_running,
)
from mcsim.kernels.fleet_heaps import _grown, heap_push, heap_remove
from mcsim.kernels.kv_tiers import admit_blocks, cached_prefix, next_tiers, reset_caches

# Router codes (mcsim.perf.fleet_batching names them).
ROUTER_ROUND_ROBIN = 0
ROUTER_RANDOM = 1
ROUTER_LEAST_OUTSTANDING = 2
ROUTER_LEAST_KV = 3
ROUTER_FIXED = 4
ROUTER_CACHE_AWARE = 5

# Return codes.
STATUS_OK = 0
STATUS_STALLED = 1  # a step with nothing to run (a validated input never produces one)


@kernel
def simulate_fleet(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, think_s, router_uniform,
                   fixed_instance, queue_key, key_uncached,
                   block_ptr, block_keys, key_stride, capacity_blocks, pooled, params_int, router, balance,
                   balance_requests, warmup_s, warmup_request, step_time_table, decode_edges, prefill_edges, kv_slope,
                   kv_ref_context, cache_state, out_arrival_s, out_instance, out_first_token_s, out_finish_s,
                   out_queue_s, out_cached, out_instance_steps, out_stats, log_start_s, log_decode_seqs,
                   log_prefill_tokens, log_step_s, log_waiting):
    """Simulate ``K`` instances behind a global router (rules in the module docstring).

    Parameters
    ----------
    arrival_s : float64[n]
        Arrival times, s, sorted (open loop); in a closed loop (``P_CLOSED_USERS = U > 0``) those of requests
        ``0 .. U-1`` (any order).
    think_s : float64[n]
        Closed loop: request ``r >= U`` arrives ``think_s[r]`` after request ``r - U`` finishes.
    prompt_tokens : int64[n]
        Prompt tokens; the prefill is what the instance's prefix cache does not hold (all of it without a cache).
    context_tokens, output_tokens, passes : int64[n]
        As in :func:`mcsim.kernels.batching.simulate`.
    router_uniform : float64[n]
        Uniforms in [0, 1), one per request, read by ``ROUTER_RANDOM`` only.
    fixed_instance : int64[n]
        Instances in [0, K), read by ``ROUTER_FIXED`` only.
    queue_key : int64[n]; key_uncached : bool
        ``P_ORDER == ORDER_KEY``: each instance's waiting queue is a heap on (key, arrival index), lowest first.
        The key is ``queue_key`` (minus priority, say), or with ``key_uncached`` the prompt tokens its instance's
        cache does not hold when it joins the queue (``queue_key`` holding the prompt tokens).
    block_ptr, block_keys : int64[n + 1], int64[nnz]
        CSR prompt blocks of each request, in prompt order; block ids in ``[0, key_stride)``, distinct within a
        request. Read only with a cache (``capacity_blocks[0] > 0``).
    key_stride : int
        Block ids per instance: instance ``i`` keeps block ``b`` under key ``i * key_stride + b``.
    capacity_blocks : int64[T]
        One instance's prefix-cache capacity per tier, first tier first, blocks (0 = tier absent; first tier 0 =
        no cache); with ``pooled``, the one shared cache's.
    pooled : bool
        One prefix cache shared by every instance (a KV store all of them read and fill) instead of one each.
    params_int : int64[N_PARAMS]
        Read at ``P_TOKEN_BUDGET``, ``P_MAX_SEQS``, ``P_KV_BLOCKS`` (per instance), ``P_BLOCK_TOKENS`` (also
        the cache's block), ``P_CHUNK_TOKENS`` and ``P_VERIFY_TOKENS``; the other fields are not used.
    router : int
        A ``ROUTER_*`` code.
    balance, balance_requests : float, int
        Cache-aware routing's relative and absolute imbalance thresholds.
    warmup_s : float
        Start of the measured window of ``out_stats``, s.
    warmup_request : int
        ``>= 0``: the window starts instead when this request arrives (a closed loop's arrivals are not known in
        advance); ``warmup_s`` is then not read.
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context
        The step-time model, as in :func:`mcsim.kernels.batching.simulate`.
    cache_state : int32[K * key_stride, 4] (``key_stride`` rows when pooled)
        Workspace of the caches (overwritten); may be empty without a cache.
    out_arrival_s : float64[n]
        Written: each request's arrival time (a closed loop's followers' included).
    out_instance : int64[n]
        Written: the instance each request was routed to.
    out_first_token_s, out_finish_s, out_queue_s : float64[n]
        Written: first-token time, finish time (s) and wait from arrival to admission (s).
    out_cached : int64[n, T]
        Written: prompt tokens each request reused from each tier.
    out_instance_steps : int64[K]
        Written: steps each instance ran; its length sets ``K``.
    out_stats : float64[N_STATS]
        Written at the ``STAT_*`` indices named in the module docstring.
    log_start_s, log_step_s : float64[K, L]; log_decode_seqs, log_prefill_tokens, log_waiting : int64[K, L]
        Written: each instance's first ``L`` steps (start, decoding sequences, prefill tokens, step time,
        requests waiting at its start), ``min(L, out_instance_steps[i])`` of them; ``L`` may be 0.

    Returns
    -------
    int
        ``STATUS_OK``, or ``STATUS_STALLED`` when a step had nothing to run.
    """
    n = arrival_s.shape[0]
    k = out_instance_steps.shape[0]
    token_budget = params_int[P_TOKEN_BUDGET]
    max_seqs = params_int[P_MAX_SEQS]
    block_tokens = params_int[P_BLOCK_TOKENS]
    chunk_tokens = params_int[P_CHUNK_TOKENS]
    verify_tokens = params_int[P_VERIFY_TOKENS]

    clock = np.full(k, -np.inf)  # start of each instance's next step
    free_blocks = np.full(k, params_int[P_KV_BLOCKS], dtype=np.int64)
    queue_head = np.full(k, -1, dtype=np.int64)  # per-instance FCFS queues as singly linked lists
    queue_tail = np.full(k, -1, dtype=np.int64)
    queue_len = np.zeros(k, dtype=np.int64)
    queue_next = np.full(n, -1, dtype=np.int64)
    # Keyed orders: per-instance heaps on (key, arrival index), grown when one fills.
    keyed = params_int[P_ORDER] == ORDER_KEY
    key = np.zeros(n, dtype=np.int64)
    q_cap = 64 if keyed else 1
    q_k1 = np.empty((k, q_cap), dtype=np.int64)
    q_k2 = np.empty((k, q_cap), dtype=np.int64)
    q_s = np.empty((k, q_cap), dtype=np.int64)
    q_pos = np.full(n, -1, dtype=np.int64)
    preempt = params_int[P_PREEMPT] != 0
    users = params_int[P_CLOSED_USERS]
    closed = users > 0
    ordered = pooled or closed  # steps in the fleet's time order: a shared cache, or followers of finishing requests
    if warmup_request >= 0:
        warmup_s = np.inf  # until that request arrives
    max_new = params_int[P_MAX_NEW] if params_int[P_MAX_NEW] > 0 else max_seqs  # admissions per step
    # Running = prefilling (a list in admission order) + decoding (counted, their KV summed incrementally, the
    # steps they finish at and, with preemption, next need a KV block at in heaps): a step costs
    # O(prefilling + (finishing + growing) x log max_seqs), not O(running).
    prefilling = np.empty((k, max_seqs), dtype=np.int64)
    n_prefilling = np.zeros(k, dtype=np.int64)
    n_decoding = np.zeros(k, dtype=np.int64)
    decoding = np.zeros(n, dtype=np.bool_)
    kv_sum = np.zeros(k)  # summed KV length of the decoding sequences at the next step's pass
    kv_rate = np.zeros(k)  # KV tokens one pass of every decoding sequence adds
    step_of = np.zeros(k, dtype=np.int64)  # steps each instance has run
    # The heaps: per instance, sequences with their keys beside them; a sequence's slot in ``*_pos``.
    finish_k1 = np.empty((k, max_seqs), dtype=np.int64)  # the step (of its instance) it finishes at
    finish_k2 = np.empty((k, max_seqs), dtype=np.int64)
    finish_s = np.empty((k, max_seqs), dtype=np.int64)
    finish_size = np.zeros(k, dtype=np.int64)
    finish_pos = np.full(n, -1, dtype=np.int64)
    n_grow = max_seqs if preempt else 1
    grow_k1 = np.empty((k, n_grow), dtype=np.int64)  # the step it next needs a KV block at
    grow_k2 = np.empty((k, n_grow), dtype=np.int64)  # its admission rank: oldest first
    grow_s = np.empty((k, n_grow), dtype=np.int64)
    grow_size = np.zeros(k, dtype=np.int64)
    grow_pos = np.full(n, -1, dtype=np.int64)
    stamp = np.zeros(n, dtype=np.int64)  # admission rank: the grow heap's tie-break, oldest first
    admissions = 0
    # Preemption: running sequences in admission order (doubly linked; the victim is the tail), the passes a
    # sequence had run before its current stint of decoding and the step that stint began at.
    run_prev = np.full(n, -1, dtype=np.int64)
    run_next = np.full(n, -1, dtype=np.int64)
    run_tail = np.full(k, -1, dtype=np.int64)
    passes_done = np.zeros(n, dtype=np.int64)
    decode_start = np.zeros(n, dtype=np.int64)
    first_done = np.zeros(n, dtype=np.bool_)
    admitted_once = np.zeros(n, dtype=np.bool_)
    miss = np.zeros(n, dtype=np.int64)  # prompt tokens the first admission had to compute
    preemptions = 0
    # The requests that finish at the end of each instance's last step, and the KV blocks they free: while that
    # step runs (its end is after an arrival) they are still in flight, and their blocks still held.
    ending = np.zeros(k, dtype=np.int64)
    freeing = np.zeros(k, dtype=np.int64)
    load = np.zeros(k, dtype=np.int64)  # the router's view at an arrival
    free_now = np.zeros(k, dtype=np.int64)
    prefill_left = np.zeros(n, dtype=np.int64)
    held = np.zeros(n, dtype=np.int64)
    chunk = np.zeros(n, dtype=np.int64)
    out_instance_steps[:] = 0
    out_cached[:, :] = 0
    out_stats[:] = 0.0

    n_tiers = capacity_blocks.shape[0]
    caching = capacity_blocks[0] > 0
    head = np.empty(n_tiers * k, np.int32)
    tail = np.empty(n_tiers * k, np.int32)
    count = np.empty(n_tiers * k, np.int64)
    next_tier = next_tiers(capacity_blocks)
    if caching:
        reset_caches(cache_state, head, tail, count)
    hits = np.zeros((1, n_tiers), np.int64)

    window_end = np.inf if closed else arrival_s[n - 1]  # a closed loop's: when its last request arrives
    in_system_integral = 0.0
    window_steps = 0
    window_step_s = 0.0
    window_decode_seqs = 0
    window_decode_steps = 0
    steps = 0
    end_s = 0.0

    # With a shared cache, the busy instances by (next step start, index): steps run in the fleet's time order, so
    # the cache sees admissions as they happen.
    # (The one-instance simulator's arrival heap on (time, index); ``*_size[_HEAP_SIZE]`` is each one's size.)
    busy_t = np.empty(k)
    busy_i = np.empty(k, dtype=np.int64)
    busy_size = np.zeros(5, np.int64)
    # A closed loop's pending arrivals by (time, index): at most one per user.
    arrive_t = np.empty(max(users, 1))
    arrive_r = np.empty(max(users, 1), dtype=np.int64)
    pending = np.zeros(5, np.int64)
    if closed:
        for r in range(min(users, n)):
            _heap_push(arrive_t, arrive_r, pending, arrival_s[r], r)
    released = 0  # requests routed so far
    while True:
        if closed:
            r = arrive_r[0] if pending[_HEAP_SIZE] > 0 else n
            t_next = arrive_t[0] if pending[_HEAP_SIZE] > 0 else np.inf
        else:
            r = released
            t_next = arrival_s[r] if r < n else np.inf
        sweep = 0
        while True:
            # The next step to run: the fleet's earliest in time order; else instance by instance, which runs the
            # same steps (nothing an instance does reaches another before the arrival) and keeps each instance's
            # cache rows warm.
            if ordered:
                if busy_size[_HEAP_SIZE] == 0 or busy_t[0] >= t_next:
                    break
                i = busy_i[0]
            else:
                while sweep < k and not (n_prefilling[sweep] + n_decoding[sweep] + queue_len[sweep] > 0
                                         and clock[sweep] < t_next):
                    sweep += 1
                if sweep == k:
                    break
                i = sweep
            t = clock[i]
            in_flight = n_prefilling[i] + n_decoding[i] + queue_len[i]
            this_step = step_of[i] + 1
            preempted = False
            if preempt:
                # KV growth, oldest admission first; the newest running sequence is preempted until it fits.
                while grow_size[i] > 0 and grow_k1[i, 0] <= this_step:
                    g = grow_s[i, 0]
                    heap_remove(grow_k1, grow_k2, grow_s, grow_pos, grow_size, i, g)
                    this_pass = passes_done[g] + (this_step - decode_start[g]) + 1
                    tokens = context_tokens[g] + _tokens_after(output_tokens[g], passes[g], this_pass)
                    need = (tokens + block_tokens - 1) // block_tokens - held[g]
                    while free_blocks[i] < need:
                        victim = run_tail[i]
                        run_tail[i] = run_prev[victim]
                        if run_tail[i] >= 0:
                            run_next[run_tail[i]] = -1
                        if decoding[victim]:
                            passes_done[victim] += this_step - decode_start[victim]
                            heap_remove(finish_k1, finish_k2, finish_s, finish_pos, finish_size, i, victim)
                            if grow_pos[victim] >= 0:
                                heap_remove(grow_k1, grow_k2, grow_s, grow_pos, grow_size, i, victim)
                            decoding[victim] = False
                            n_decoding[i] -= 1
                            rate = _kv_rate(output_tokens[victim], passes[victim])
                            kv_sum[i] -= context_tokens[victim] + 1 + passes_done[victim] * rate
                            kv_rate[i] -= rate
                        else:  # the newest running sequence still prefilling is the prefilling list's last
                            n_prefilling[i] -= 1
                        free_blocks[i] += held[victim]
                        held[victim] = 0
                        if keyed:  # back in the queue under its own key and arrival
                            if queue_len[i] == q_cap:
                                q_k1, q_k2, q_s, q_cap = _grown(q_k1, q_k2, q_s)
                            heap_push(q_k1, q_k2, q_s, q_pos, queue_len, i, key[victim], victim, victim)
                        else:  # back at the head of the queue
                            queue_next[victim] = queue_head[i]
                            queue_head[i] = victim
                            if queue_tail[i] < 0:
                                queue_tail[i] = victim
                            queue_len[i] += 1
                        preemptions += 1
                        preempted = True
                        if victim == g:
                            break
                    if decoding[g]:
                        free_blocks[i] -= need
                        held[g] += need
                        grow = _next_block_step(context_tokens[g], output_tokens[g], passes[g], block_tokens,
                                                held[g], passes_done[g], decode_start[g])
                        if grow >= 0:
                            heap_push(grow_k1, grow_k2, grow_s, grow_pos, grow_size, i, grow, stamp[g], g)
                if n_decoding[i] == 0:
                    kv_sum[i] = 0.0
                    kv_rate[i] = 0.0
            decode_seqs = n_decoding[i]
            kv = kv_sum[i]
            budget_left = max(0, token_budget - decode_seqs * verify_tokens)
            prefill = 0
            for j in range(n_prefilling[i]):
                s = prefilling[i, j]
                c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens) if budget_left > 0 else 0
                chunk[s] = c
                prefill += c
                budget_left -= c
            admitted = 0
            while (not preempted and budget_left > 0 and queue_len[i] > 0 and admitted < max_new
                   and n_prefilling[i] + n_decoding[i] < max_seqs):
                s = q_s[i, 0] if keyed else queue_head[i]
                if preempt:
                    tokens = context_tokens[s] + _tokens_after(output_tokens[s], passes[s], passes_done[s])
                else:
                    tokens = context_tokens[s] + output_tokens[s]
                need = (tokens + block_tokens - 1) // block_tokens
                if need > free_blocks[i]:
                    break
                if keyed:
                    heap_remove(q_k1, q_k2, q_s, q_pos, queue_len, i, s)
                else:
                    queue_head[i] = queue_next[s]
                    queue_len[i] -= 1
                    if queue_len[i] == 0:
                        queue_tail[i] = -1
                free_blocks[i] -= need
                held[s] = need
                admitted += 1
                stamp[s] = admissions
                admissions += 1
                if preempt:
                    run_prev[s] = run_tail[i]
                    run_next[s] = -1
                    if run_tail[i] >= 0:
                        run_next[run_tail[i]] = s
                    run_tail[i] = s
                prefilling[i, n_prefilling[i]] = s
                n_prefilling[i] += 1
                if admitted_once[s]:  # a recompute after preemption: the prompt and the output produced so far
                    prefill_left[s] = miss[s]
                    if first_done[s]:
                        prefill_left[s] += _tokens_after(output_tokens[s], passes[s], passes_done[s])
                    c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens)
                    chunk[s] = c
                    prefill += c
                    budget_left -= c
                    continue
                admitted_once[s] = True
                cached = 0
                if caching:
                    hits[0, :] = 0
                    owner = 0 if pooled else i
                    admit_blocks(cache_state, head, tail, count, capacity_blocks, next_tier, block_keys,
                                 block_ptr[s], block_ptr[s + 1], owner * key_stride, owner, hits, 0)
                    # Reused tokens, less what would leave no prompt token to compute (the first tier's share
                    # first).
                    reused = 0
                    for tier in range(n_tiers):
                        reused += hits[0, tier]
                    excess = reused * block_tokens - (prompt_tokens[s] - 1)
                    for tier in range(n_tiers):
                        tokens = hits[0, tier] * block_tokens
                        take = min(max(excess, 0), tokens)
                        out_cached[s, tier] = tokens - take
                        excess -= take
                        cached += tokens - take
                miss[s] = max(prompt_tokens[s] - cached, 1)
                prefill_left[s] = miss[s]
                out_queue_s[s] = t - out_arrival_s[s]
                c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens)
                chunk[s] = c
                prefill += c
                budget_left -= c
            if decode_seqs == 0 and prefill == 0:
                return STATUS_STALLED
            step_s = step_time(step_time_table, decode_edges, prefill_edges, decode_seqs, prefill)
            if decode_seqs > 0:
                slope = kv_slope_at(kv_slope, decode_edges, decode_seqs)
                if slope != 0.0:
                    step_s = max(step_s + slope * (kv - decode_seqs * kv_ref_context), 1e-12)
            t_end = t + step_s
            logged = out_instance_steps[i]
            if logged < log_start_s.shape[1]:
                log_start_s[i, logged] = t
                log_decode_seqs[i, logged] = decode_seqs
                log_prefill_tokens[i, logged] = prefill
                log_step_s[i, logged] = step_s
                log_waiting[i, logged] = queue_len[i]
            out_instance_steps[i] += 1
            steps += 1
            end_s = max(end_s, t_end)
            if released < n:  # the step starts inside the arrival window
                if t_end > warmup_s:
                    in_system_integral += in_flight * (t_end - max(t, warmup_s))
                if t >= warmup_s:
                    window_steps += 1
                    window_step_s += step_s
                    if decode_seqs > 0:
                        window_decode_seqs += decode_seqs
                        window_decode_steps += 1

            # Every decoding sequence ran its pass; those at their last one finish.
            ending[i] = 0
            freeing[i] = 0
            step_of[i] += 1
            kv_sum[i] += kv_rate[i]
            while finish_size[i] > 0 and finish_k1[i, 0] == step_of[i]:
                s = finish_s[i, 0]
                heap_remove(finish_k1, finish_k2, finish_s, finish_pos, finish_size, i, s)
                if grow_pos[s] >= 0:
                    heap_remove(grow_k1, grow_k2, grow_s, grow_pos, grow_size, i, s)
                if preempt:
                    run_tail[i] = unlink_running(run_prev, run_next, run_tail[i], s)
                decoding[s] = False
                rate = _kv_rate(output_tokens[s], passes[s])
                kv_sum[i] -= context_tokens[s] + 1 + passes[s] * rate
                kv_rate[i] -= rate
                n_decoding[i] -= 1
                ending[i] += 1
                freeing[i] += held[s]
                free_blocks[i] += held[s]
                held[s] = 0
                out_finish_s[s] = t_end
                if closed and s + users < n:  # this user's next request
                    _heap_push(arrive_t, arrive_r, pending, t_end + think_s[s + users], s + users)
            if n_decoding[i] == 0:  # no drift from the sums' rounding
                kv_sum[i] = 0.0
                kv_rate[i] = 0.0
            # Prefill progress: a completed prefill emits the first token and decodes from the next step.
            kept = 0
            for j in range(n_prefilling[i]):
                s = prefilling[i, j]
                if chunk[s] > 0:
                    prefill_left[s] -= chunk[s]
                    chunk[s] = 0
                    if prefill_left[s] == 0:
                        if not first_done[s]:  # (not after a recompute)
                            first_done[s] = True
                            out_first_token_s[s] = t_end
                        passes_left = passes[s] - passes_done[s]
                        if passes_left == 0:
                            ending[i] += 1
                            freeing[i] += held[s]
                            free_blocks[i] += held[s]
                            held[s] = 0
                            if preempt:
                                run_tail[i] = unlink_running(run_prev, run_next, run_tail[i], s)
                            out_finish_s[s] = t_end
                            if closed and s + users < n:  # this user's next request
                                _heap_push(arrive_t, arrive_r, pending, t_end + think_s[s + users], s + users)
                        else:
                            rate = _kv_rate(output_tokens[s], passes[s])
                            kv_sum[i] += context_tokens[s] + 1 + passes_done[s] * rate
                            kv_rate[i] += rate
                            n_decoding[i] += 1
                            decoding[s] = True
                            decode_start[s] = step_of[i] + 1
                            heap_push(finish_k1, finish_k2, finish_s, finish_pos, finish_size, i,
                                       step_of[i] + passes_left, s, s)
                            if preempt:
                                grow = _next_block_step(context_tokens[s], output_tokens[s], passes[s],
                                                        block_tokens, held[s], passes_done[s], decode_start[s])
                                if grow >= 0:
                                    heap_push(grow_k1, grow_k2, grow_s, grow_pos, grow_size, i, grow, stamp[s], s)
                        continue
                prefilling[i, kept] = s
                kept += 1
            n_prefilling[i] = kept
            clock[i] = t_end
            if ordered:
                _heap_pop(busy_t, busy_i, busy_size)  # i was the top
                if n_prefilling[i] + n_decoding[i] + queue_len[i] > 0:
                    _heap_push(busy_t, busy_i, busy_size, t_end, i)
            if closed and pending[_HEAP_SIZE] > 0 and (arrive_t[0] < t_next
                                                       or (arrive_t[0] == t_next and arrive_r[0] < r)):
                r = arrive_r[0]  # a follower of this step arrives before the arrival in hand
                t_next = arrive_t[0]
        if r == n:
            break
        if closed:
            _heap_pop(arrive_t, arrive_r, pending)
        out_arrival_s[r] = t_next
        if r == warmup_request:
            warmup_s = t_next

        chosen = 0
        if router == ROUTER_ROUND_ROBIN:
            chosen = r % k
        elif router == ROUTER_RANDOM:
            chosen = min(int(router_uniform[r] * k), k - 1)
        elif router == ROUTER_FIXED:
            chosen = fixed_instance[r]
        else:
            # The instances as they are at the arrival: a step still running holds its finishing requests.
            for i in range(k):
                running_late = clock[i] > t_next
                load[i] = queue_len[i] + n_prefilling[i] + n_decoding[i] + (ending[i] if running_late else 0)
                free_now[i] = free_blocks[i] - (freeing[i] if running_late else 0)
            if router == ROUTER_LEAST_KV:
                for i in range(1, k):
                    if free_now[i] > free_now[chosen]:
                        chosen = i
            else:
                least = 0
                most = 0
                for i in range(1, k):
                    if load[i] < load[least]:
                        least = i
                    if load[i] > load[most]:
                        most = i
                chosen = least
                imbalanced = load[most] - load[least] > balance_requests and load[most] > (1.0 + balance) * load[least]
                if router == ROUTER_CACHE_AWARE and caching and not pooled and not imbalanced:
                    best_len = -1
                    for i in range(k):
                        length = cached_prefix(cache_state, block_keys, block_ptr[r], block_ptr[r + 1],
                                               i * key_stride)
                        if length > best_len or (length == best_len and load[i] < load[chosen]):
                            chosen = i
                            best_len = length
        out_instance[r] = chosen
        if n_prefilling[chosen] + n_decoding[chosen] == 0 and queue_len[chosen] == 0:
            clock[chosen] = max(clock[chosen], t_next)
            if ordered:
                _heap_push(busy_t, busy_i, busy_size, clock[chosen], chosen)
        if keyed:
            key[r] = queue_key[r]
            if key_uncached and caching:  # the prompt tokens the instance's cache does not hold now
                owner = 0 if pooled else chosen
                held_prefix = cached_prefix(cache_state, block_keys, block_ptr[r], block_ptr[r + 1],
                                            owner * key_stride) * block_tokens
                key[r] = max(queue_key[r] - held_prefix, 1)
            if queue_len[chosen] == q_cap:
                q_k1, q_k2, q_s, q_cap = _grown(q_k1, q_k2, q_s)
            heap_push(q_k1, q_k2, q_s, q_pos, queue_len, chosen, key[r], r, r)
        else:
            if queue_tail[chosen] >= 0:
                queue_next[queue_tail[chosen]] = r
            else:
                queue_head[chosen] = r
            queue_tail[chosen] = r
            queue_len[chosen] += 1
        released += 1
        if released == n:
            waiting = 0
            for i in range(k):
                waiting += queue_len[i]
            out_stats[STAT_WAITING_AT_WINDOW_END] = waiting
            window_end = t_next

    _store_window(out_stats, in_system_integral, window_steps, window_step_s, window_decode_seqs,
                  window_decode_steps, steps, end_s)
    out_stats[STAT_PREEMPTIONS] = preemptions
    out_stats[STAT_WINDOW_END_S] = window_end
    return STATUS_OK

"""The step loop: ``K >= 1`` replicas of one pool on one clock behind a router, each a step-level scheduler.

One kernel runs every batching simulation of mcsim: one serving instance is ``K = 1``. Each instance builds its
steps as vLLM's scheduler does; what differs between scheduler policies and between routers are integer hooks in
``params_int`` that the loop reads (:mod:`mcsim.scenario.policies` and :mod:`mcsim.scenario.routing` name them), not
loops of their own. The kernel, :func:`simulate_stream`, is a generator that can take its requests a part at a time
(:class:`mcsim.perf.fleet_stream.FleetStream` feeds it so); :func:`simulate` gives it every request at once.

Step of one instance (continuous batching)
------------------------------------------
1. Arrivals: a request routed to the instance at or before the step's start is in its waiting queue (FCFS, or
   ``P_ORDER == ORDER_KEY``: a binary heap on ``(key, rank of release)``, the lowest key at the head, FCFS among
   equal keys).
2. KV growth (``P_PREEMPT`` only): every decoding sequence, oldest admission first, that needs more KV blocks for
   the tokens of this step's pass takes them from the pool. If the pool is short, the most recently admitted
   running sequence is preempted (possibly the one asking) until the need fits. Preemption is by *recompute*:
   the victim loses its KV and its prefill progress and goes back to the head of the waiting queue (several
   victims of one step keep their admission order there; under a keyed order, back under its own key and rank);
   output already produced stays produced.
3. Decodes: every decoding sequence runs one pass and costs ``verify_tokens`` tokens of the step's
   ``token_budget`` (``k + 1`` with speculative decoding, 1 without). Decodes are never deferred.
4. Prefill chunks: the remaining budget goes, in admission order, to admitted sequences whose prefill is
   unfinished, each getting ``min(prefill left, budget left, chunk_tokens)`` (``chunk_tokens == 0``: no
   per-request cap); then waiting requests are admitted from the queue head, without skipping, while budget is
   left, fewer than ``max_seqs`` sequences run, fewer than ``P_MAX_NEW`` were admitted in this step (0: no cap)
   and the pool holds the request's blocks; each admitted request gets its first chunk in the same step. No
   admission happens in a step that preempted. A first admission looks the request up in the instance's prefix
   cache (below) and inserts its blocks; its prefill is the prompt less the reused tokens.
5. Step time: bilinear interpolation of ``step_time_table`` at (decoding sequences, prefill tokens), clamped to
   the table's edges, plus ``kv_slope(d) x (S - d x kv_ref_context)``, where ``S`` is the summed KV length of the
   ``d`` decoding sequences. A decoding sequence that has run ``j`` of its ``P`` passes attends over
   ``context + 1 + j x (output - 1) / P`` tokens (the linear form of the tokens it has produced, so that ``S`` is
   updated in O(1) per step); a static batch's finished members stay at ``context + output``.
6. At the end of the step, a sequence whose prefill completed emits its first token (not after a recompute) and
   decodes from the next step (it finishes there if it has no passes); a decoding sequence that ran its last pass
   finishes.

KV blocks: a request with ``c`` context tokens that has produced ``g`` output tokens holds
``ceil((c + g) / block_tokens)`` blocks; after ``j`` of its ``P`` passes it has produced
``g(j) = 1 + floor(j * (output - 1) / P)`` tokens. Without ``P_PREEMPT`` admission reserves the whole request,
``ceil((c + output) / block_tokens)`` blocks; with it, admission takes ``ceil((c + g(j)) / block_tokens)`` and
the sequence grows before each pass that crosses a block. A recompute prefills the tokens its first admission
computed plus ``g(j)`` and runs no pass of its own.

Policy hooks
------------
- ``P_POLICY == POLICY_STATIC``: when no batch is in progress and requests wait, a batch is formed from the queue
  head (FCFS): up to ``max_seqs`` requests while the pool holds their whole reservations (``P_PREEMPT`` ignored).
  It is prefilled (steps of ``token_budget`` prefill tokens, chunked as above, no decodes), each member's first
  token emitted at the end of the step that completes its prefill; then decoded for as many steps as its longest
  member has passes, every member counting as a decoding sequence throughout. All members finish, and their
  blocks return, at the end of the batch's last step.
- ``P_MIXING == MIXING_EXCLUSIVE``: a step is prefill only (the whole ``token_budget``, no decodes) when a running
  sequence has prefill left or the queue head can be admitted, else decode only (no admission). Decoding
  sequences do not advance in a prefill step: the per-instance *decode clock* counts the steps that run the
  decodes. A decode step whose KV growth preempts every decoding sequence is not run.
- ``P_MAX_NEW > 0``: step 4 admits at most that many requests.

Routers
-------
Arrivals are taken in order of (arrival time, index). Before request ``r`` arriving at ``t`` is routed, every step
of the fleet that *starts* before ``t`` runs. The router then picks an instance from the state the instances have
at ``t``, their load being the requests in flight (waiting + running); a step runs whole when it starts, so a step
that started before ``t`` and ends after it still counts its finishing requests as in flight and their blocks as
held. The router's hooks:

- ``P_ROUTE_PICK == PICK_GIVEN``: instance ``given_instance[r]`` (the caller computes round-robin, random and
  prefix affinity, which need nothing of the instances' state);
- ``PICK_LEAST``: the least load (``P_ROUTE_MEASURE == MEASURE_OUTSTANDING``) or the most free KV blocks
  (``MEASURE_FREE_KV``), ties to the lowest index; with ``P_ROUTE_PREFIX`` (SGLang's cache-aware rule), unless
  the fleet is imbalanced (the largest load exceeds the smallest by more than ``balance_requests`` *and* by more
  than ``(1 + balance)`` times), the instance whose prefix cache holds the longest leading run of the request's
  blocks *now*, ties to the lower load.

The request joins the tail of that instance's waiting queue; an idle instance's clock jumps to the arrival (or
stays at the end of its last step if that is later). After the last arrival every instance drains.

Closed loop (``P_CLOSED_USERS = U > 0``): requests ``0 .. U-1`` arrive at ``arrival_s``, and request ``r >= U``
arrives ``think_s[r]`` after request ``r - U`` (the same user's previous one) finishes, in order of (time, index)
among the pending ones. The fleet's steps then run in time order (as with a pooled cache), so a follower is
routed before any step that starts after it arrives; otherwise each instance runs its steps up to the next
arrival in turn, which gives the same steps and keeps its rows warm.

Prefix caches on the same clock
-------------------------------
When ``capacity_blocks[0] > 0`` every instance keeps its own tiered LRU prefix cache (the tiers of
``capacity_blocks``, with the rules and code of :mod:`mcsim.kernels.kv_tiers`), or, with ``pooled``, all of them
share one. With ``P_POOLED_TIERS = m > 0`` (and not ``pooled``) the last ``m`` tiers are one pool behind every
instance's own tiers (the rules of pooled tiers in :mod:`mcsim.kernels.kv_tiers`; ``capacity_blocks`` gives the
whole pool's capacity of those tiers), and the fleet's steps run in time order, as with a shared cache, since an
instance's evictions reach the others. A request is looked up and its blocks inserted when its instance first admits
it. Its reused tokens are its reused blocks x ``block_tokens``, less what would leave no prompt token to compute (at
least one is computed, taken from the first tier's share first, then the next's).

Measured window and statistics
------------------------------
The window runs from ``warmup_s`` (or, ``warmup_request >= 0``, from that request's arrival) to the last arrival or,
if later, the end of the last of the steps that started before it (with one instance: the start of the step that
first sees the last request, or its arrival). Over the steps that start inside it (at or after its start, before
the last request is routed) ``out_stats`` sums, at the ``STAT_*`` indices of :mod:`mcsim.kernels.batching_helpers`
and over all instances: steps, their step time, decoding sequences over the steps that decode and those steps; the
requests in flight integrated over time (each step weighs its instance's in-flight count at its start by its length
within the window); the requests waiting when the last one has been routed; the total steps, the window end, the end
of the last step and a status.

Cost
----
Per-sequence progress is implicit: every decoding sequence advances one pass per decode step, so a sequence that
starts decoding after step ``s`` with ``R`` passes left finishes at step ``s + R`` and is filed under that step in a
timing wheel (per instance, a ring of doubly linked lists over its decode clock; a ring shorter than the longest
stretch holds, in a slot, the sequences of every step congruent to it and the loop takes those of the current
step); likewise the next step at which it needs a KV block. A step costs O(1 + finishing + block growths + prefill
chunks), not O(running). An arrival costs O(1) under a given placement, O(K) under a least-load router and
O(K x its blocks) under the cache-aware one.
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel
from mcsim.kernels.batching_helpers import (
    _DECODING, _DONE, _HEAP_SIZE, _PENDING, _PREFILLING, _WAITING, MIXING_EXCLUSIVE, ORDER_KEY, P_BLOCK_TOKENS,
    P_CHUNK_TOKENS, P_CLOSED_USERS, P_KV_BLOCKS, P_MAX_NEW, P_MAX_SEQS, P_MIXING, P_ORDER, P_POLICY, P_POOLED_TIERS,
    P_PREEMPT, P_ROUTE_MEASURE, P_ROUTE_PICK, P_ROUTE_PREFIX, P_TOKEN_BUDGET, P_VERIFY_TOKENS, PICK_GIVEN,
    MEASURE_FREE_KV, POLICY_STATIC, STAT_PREEMPTIONS, STAT_STATUS, STAT_WAITING_AT_WINDOW_END, STAT_WINDOW_END_S,
    _heap_pop, _heap_push, _kv_rate, _next_block_step, _store_window, _tokens_after, kv_slope_at, prefill_chunk,
    skew_merge, step_time, unlink_running,
)
from mcsim.kernels.kv_tiers import (_ABSENT, _TIER, admit_blocks, admit_blocks_pooled, cached_prefix,
                                    cached_prefix_pooled, next_tiers, reset_caches)

STATUS_OK = 0
STATUS_STALLED = 1  # a step with nothing to run (a validated input never produces one)
NEED_REQUESTS = 2  # what :func:`simulate_stream` yields when it has run every step it can before the next requests

#: :func:`simulate_stream`'s ``control``: the requests in all; how many of them the caller has put in the slots so
#: far; where the measured window starts (:data:`WINDOW_GIVEN`: at ``warmup_s``; :data:`WINDOW_LATER`: at a time
#: the caller gives later; :data:`WINDOW_NOW`: at the time in ``C_WINDOW_S``, a float64's bits).
C_REQUESTS = 0
C_FILLED = 1
C_WINDOW = 2
C_WINDOW_S = 3
N_CONTROL = 4
WINDOW_GIVEN = 0
WINDOW_LATER = 1
WINDOW_NOW = 2

#: Largest timing-wheel slots of all instances together; beyond it each instance's ring is shortened (results do
#: not depend on its length).
WHEEL_SLOTS = 1 << 22


@kernel
def wheel_length(k, max_passes, pf_cap):
    """Slots of each instance's timing wheels: the power of two that holds the longest decode stretch (``max_passes``
    + 2), halved while the fleet's wheels together exceed :data:`WHEEL_SLOTS` and it stays above twice the
    prefilling ring (``pf_cap``)."""
    wheel = 1
    while wheel < max_passes + 2:
        wheel <<= 1
    while k * wheel > WHEEL_SLOTS and wheel > 2 * pf_cap:
        wheel >>= 1
    return wheel


@kernel(inline="always")
def _tree_leaves(k):
    """Leaves of the least-load router's tournament tree: the smallest power of two >= ``k``."""
    kpow = 1
    while kpow < k:
        kpow *= 2
    return kpow


@kernel(inline="always")
def _least_build(tree, load, k):
    """The tournament tree over ``load[:k]``: node ``p`` holds the instance of least load below it (the lowest
    index among equals, as a scan from 0 finds it); leaves ``kpow + j`` hold ``j``, or -1 past ``k``."""
    kpow = tree.shape[0] // 2
    for j in range(kpow):
        tree[kpow + j] = j if j < k else -1
    for pos in range(kpow - 1, 0, -1):
        a = tree[2 * pos]
        b = tree[2 * pos + 1]
        tree[pos] = a if b < 0 or (a >= 0 and load[a] <= load[b]) else b


@kernel(inline="always")
def _least_set(tree, load, j, value):
    """Set instance ``j``'s load and replay its path to the root: O(log K)."""
    load[j] = value
    pos = (tree.shape[0] // 2 + j) >> 1
    while pos >= 1:
        a = tree[2 * pos]
        b = tree[2 * pos + 1]
        winner = a if b < 0 or (a >= 0 and load[a] <= load[b]) else b
        if winner == tree[pos] and winner != j:
            break  # this subtree's winner and its load are as they were: so is every winner above it
        tree[pos] = winner
        pos >>= 1


@kernel(inline="always")
def _least_refresh(tree, load, exp_t, exp_i, exp_state, marked, j, t_next, q_len, running, ending, clock):
    """Instance ``j``'s load as the router sees it at an arrival at ``t_next`` (its queue, its running sequences,
    and those finishing at the end of a step still running then), into the tree; a step still running then is
    remembered in the expiry heap, whose entry drops its finishing sequences once the arrivals pass its end."""
    late = clock[j] > t_next
    _least_set(tree, load, j, q_len[j] + running[j] + (ending[j] if late else 0))
    if late and ending[j] > 0 and marked[j] == 0:
        marked[j] = 1
        _heap_push(exp_t, exp_i, exp_state, clock[j], j)


@kernel
def instance_arrays(k, pf_cap, static, wheel, preempt, n_lists, kv_blocks):
    """Every array of :func:`simulate` whose size grows with the ``k`` instances, as the loop starts:

    waiting queues (head, tail, length), the prefilling ring ``(k, pf_cap)``, a static batch and its members by
    passes (``(k, pf_cap)`` each under static batching, else one slot), the timing wheels' heads (finishing
    sequences; block growth with preemption, else one slot), seventeen scalars per instance (clock, free KV blocks,
    running, decoding, KV sum and rate, decode clock, ring head and length, running tail, the static batch's decode
    steps left, step time, KV slope, steps done and stopped members, finishing requests and their blocks), the
    prefix caches' LRU lists (head, tail as int32, count; ``n_lists`` of them), each instance's feed (pointers,
    fill), the router's view (load, free KV), the busy instances' heap (time, index), each instance's own sums of
    the measured window (requests in system over time, step time): summed per instance and then over the instances in
    order, a fleet's figures do not depend on the order in which its instances' steps run; and the least-load
    router's tournament tree, the heap of the steps whose end it waits for, and their marks.

    :func:`instance_bytes` is their size; a test holds the two equal. Two tuples (queues, ring, batch, wheels and
    scalars; then lists, feed, router and heap): Numba cannot build a tuple of more than 30 items in one literal.
    """
    rows = k if static else 1
    n_batch = pf_cap if static else 1
    steps = (np.full(k, -1, np.int64), np.full(k, -1, np.int64), np.zeros(k, np.int64),
             np.empty((k, pf_cap), np.int64), np.empty((rows, n_batch), np.int64),
             np.empty((rows, n_batch), np.int64), np.full(k * wheel, -1, np.int64),
             np.full(k * wheel if preempt else 1, -1, np.int64), np.full(k, -np.inf), np.full(k, kv_blocks, np.int64),
             np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k), np.zeros(k), np.zeros(k, np.int64),
             np.zeros(k, np.int64), np.zeros(k, np.int64), np.full(k, -1, np.int64), np.full(k, -1, np.int64),
             np.zeros(k), np.zeros(k), np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64),
             np.zeros(k, np.int64))
    kpow = _tree_leaves(k)
    routing = (np.empty(n_lists, np.int32), np.empty(n_lists, np.int32), np.empty(n_lists, np.int64),
               np.zeros(k + 1, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64), np.zeros(k, np.int64),
               np.empty(k), np.empty(k, np.int64), np.zeros(k), np.zeros(k),
               np.full(2 * kpow, -1, np.int64), np.empty(k), np.empty(k, np.int64), np.zeros(5, np.int64),
               np.zeros(k, np.int64))
    return steps, routing


def instance_bytes(k: int, pf_cap: int, static: bool, wheel: int, preempt: bool, n_lists: int) -> int:
    """Bytes of :func:`instance_arrays` (without allocating them).

    Examples
    --------
    >>> instance_bytes(1, 1, False, 2, True, 3)  # 28 scalars, feed pointers, ring, batch rows, wheels, lists, tree
    416
    """
    k, pf_cap, wheel, n_lists = int(k), int(pf_cap), int(wheel), int(n_lists)
    batch = (k if static else 1) * (pf_cap if static else 1)
    leaves = 1 << max(k - 1, 0).bit_length()  # _tree_leaves(k)
    least = 2 * leaves + 3 * k + 5  # the least-load router's tree, its expiry heap and marks
    return (8 * (28 * k + 1 + k * pf_cap + 2 * batch + k * wheel + (k * wheel if preempt else 1) + least)
            + 16 * n_lists)


@kernel
def _first_admission(s, owner, caching, cache_state, head, tail, count, capacity_blocks, next_tier, n_private,
                     pool_key, pool_list, block_keys, block_ptr, key_stride, hits, block_tokens, prompt_tokens,
                     out_cached):
    """Look request ``s`` up in cache ``owner`` and insert its blocks; returns the prompt tokens to compute.

    The cache's own tiers are ``0..n_private-1``; the others are the pool's, whose keys start at ``pool_key`` and
    lists at ``pool_list``.

    A function of its own, called only with a cache: inlined, the cache's code would sit in the step loop's body
    twice and slow every step of a run without one.
    """
    cached = 0
    if caching:
        n_tiers = capacity_blocks.shape[0]
        hits[0, :] = 0
        if n_private < n_tiers:
            admit_blocks_pooled(cache_state, head, tail, count, capacity_blocks, next_tier, n_private, pool_key,
                                pool_list, block_keys, block_ptr[s], block_ptr[s + 1],
                                owner * key_stride, owner, hits, 0)
        else:
            admit_blocks(cache_state, head, tail, count, capacity_blocks, next_tier, block_keys, block_ptr[s],
                         block_ptr[s + 1], owner * key_stride, owner, hits, 0)
        # Reused tokens, less what would leave no prompt token to compute (the first tier's share first).
        excess = -(prompt_tokens[s] - 1)
        for tier in range(n_tiers):
            excess += hits[0, tier] * block_tokens
        for tier in range(n_tiers):
            tokens = hits[0, tier] * block_tokens
            take = min(max(excess, 0), tokens)
            out_cached[s, tier] = tokens - take
            excess -= take
            cached += tokens - take
    return max(prompt_tokens[s] - cached, 1)


@kernel(inline="always")
def _file(head, nxt, prv, at, base, mask, r, when):
    """File ``r`` under step ``when`` of an instance's timing wheel (ring ``head[base:base + mask + 1]``).

    The wheel's list operations, and the queues' and the running list's below, are written without a branch: with
    Numba's runtime, which prunes the reference counts of an inlined helper's array arguments only within one basic
    block, an ``if`` in the body left an atomic increment and decrement at every call (on the step loop's hot path,
    most of its time). The loop now compiles without the runtime (``kernel(refcounts=False)``); the branchless form
    stays, as fast either way. Where a list end has no neighbour, the write goes to ``r``'s own link, which is
    rewritten or unread.
    """
    at[r] = when
    slot = base + (when & mask)
    following = head[slot]
    nxt[r] = following
    prv[r] = -1
    prv[following + (following < 0) * (r - following)] = r - (following < 0) * (r + 1)
    head[slot] = r


@kernel(inline="always")
def _unfile(head, nxt, prv, at, base, mask, r):
    """Take ``r``, filed in a wheel list, out of it (the caller checks ``at[r] >= 0``)."""
    before = prv[r]
    after = nxt[r]
    slot = base + (at[r] & mask)
    nxt[before + (before < 0) * (r - before)] = after
    head[slot] += (before < 0) * (after - head[slot])
    prv[after + (after < 0) * (r - after)] = before
    at[r] = -1


@kernel
def _keyed_enqueue(r, i, tie_rank, by_uncached, owner, queue_key, cache_state, block_keys, block_ptr, key_stride,
                   pool_key, block_tokens, key, tie, q_left, q_right, q_head, q_len, req_state):
    """Request ``r`` joins instance ``i``'s keyed queue under its key (with ``by_uncached``, the prompt tokens cache
    ``owner``, and the pool if ``pool_key >= 0``, do not hold now) and ``tie_rank``. Not inlined, as
    :func:`skew_merge`."""
    key[r] = queue_key[r]
    if by_uncached:
        if pool_key >= 0:
            held_prefix = cached_prefix_pooled(cache_state, block_keys, block_ptr[r], block_ptr[r + 1],
                                               owner * key_stride, pool_key) * block_tokens
        else:
            held_prefix = cached_prefix(cache_state, block_keys, block_ptr[r], block_ptr[r + 1],
                                        owner * key_stride) * block_tokens
        key[r] = max(queue_key[r] - held_prefix, 1)
    tie[r] = tie_rank
    q_left[r] = -1
    q_right[r] = -1
    q_head[i] = skew_merge(q_head[i], r, q_left, q_right, key, tie)
    q_len[i] += 1
    req_state[r] = _WAITING


@kernel(inline="always")
def _finish_static_batch(batch, i, size, t_end, req_state, held, out_finish_s, closed, users, think_s, arrive_t,
                         arrive_r, pending):
    """Every member of instance ``i``'s static batch finishes, and returns its blocks, at ``t_end`` (a closed
    loop's users then send their next requests)."""
    n = req_state.shape[0]
    for j in range(size):
        s = batch[i, j]
        req_state[s] = _DONE
        held[s] = 0
        out_finish_s[s] = t_end
        if closed and s + users < n:  # this user's next request
            _heap_push(arrive_t, arrive_r, pending, t_end + think_s[s + users], s + users)


@kernel(inline="always")
def _fcfs_push(r, i, q_head, q_tail, q_len, q_next):
    """Request ``r`` joins the tail of instance ``i``'s FCFS queue (a singly linked list; no branch, as
    :func:`_file`)."""
    last = q_tail[i]
    q_next[last + (last < 0) * (r - last)] = r
    q_head[i] += (last < 0) * (r - q_head[i])
    q_tail[i] = r
    q_next[r] = -1
    q_len[i] += 1


@kernel
def _static_decode_steps(i, t, dleft, n_decoding, n_running, in_system, step_s0, slope, kvs, kvr, kv_ref_context,
                         track_kv, done, stop, stop_s, one_step, window_until, warmup_s, own_steps, end_s,
                         in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                         window_decode_steps, by_passes, passes, output_tokens, logs, pos, feed_stop, feed, arrival_s,
                         queue, req_state, out_instance):
    """A static batch's decode steps on instance ``i`` from ``t``: until the batch ends, or the next step would
    start at or after ``stop_s`` (or after one, with ``one_step``); the instance's own arrivals
    (``feed[pos:feed_stop]``) join its queue at each step start. Returns the state and accumulators it moved."""
    log_start_s, log_decode_seqs, log_prefill_tokens, log_step_s, log_waiting = logs
    q_head, q_tail, q_len, q_next = queue
    log_cap = log_start_s.shape[1]
    ran = 0
    while True:
        while pos < feed_stop and arrival_s[feed[pos]] <= t:  # (static batches queue first come, first served)
            fed = feed[pos]
            pos += 1
            out_instance[fed] = i
            req_state[fed] = _WAITING
            _fcfs_push(fed, i, q_head, q_tail, q_len, q_next)
            in_system += 1
        waiting = q_len[i]
        step_s = step_s0
        if track_kv:
            if slope != 0.0:
                step_s = max(step_s + slope * (kvs - n_decoding * kv_ref_context), 1e-12)
            kvs += kvr
        t_end = t + step_s
        if own_steps < log_cap:
            log_start_s[i, own_steps] = t
            log_decode_seqs[i, own_steps] = n_decoding
            log_prefill_tokens[i, own_steps] = 0
            log_step_s[i, own_steps] = step_s
            log_waiting[i, own_steps] = waiting
        if t < window_until:  # the step starts inside the arrival window
            if t_end > warmup_s:
                in_system_integral += in_system * (t_end - max(t, warmup_s))
            if t >= warmup_s:
                window_steps += 1
                window_step_s_sum += step_s
                window_decode_seqs_sum += n_decoding
                window_decode_steps += 1
        dleft -= 1
        if track_kv:
            done += 1
            while stop < n_running and passes[by_passes[i, stop]] == done:
                kvr -= _kv_rate(output_tokens[by_passes[i, stop]], passes[by_passes[i, stop]])
                stop += 1
        own_steps += 1
        ran += 1
        end_s = max(end_s, t_end)
        t = t_end
        if dleft == 0 or one_step or t >= stop_s:
            break
    return (t, dleft, kvs, kvr, done, stop, own_steps, ran, end_s, in_system_integral, window_steps,
            window_step_s_sum, window_decode_seqs_sum, window_decode_steps, pos)



@kernel(inline="always")
def _ring(g, w):
    """Request ``g``'s place in a ring of ``w`` (``g % w``, without the division while ``g < w``: every request of a
    whole run)."""
    return g if g < w else g % w


@kernel
def _late_window(control, own_in_system, last_start, last_end, last_in_system):
    """The window's start once the caller gives it (``control[C_WINDOW] == WINDOW_NOW``; else inf), and what each
    instance's last step inside the arrival window, if it started before that time and ended after it, adds to the
    instance's requests in system over time (no step has started at or after it: the caller gives the time before it
    puts in a request that arrives then)."""
    if control[C_WINDOW] != WINDOW_NOW:
        return np.inf
    start = control[C_WINDOW_S:C_WINDOW_S + 1].view(np.float64)[0]
    for j in range(own_in_system.shape[0]):
        if last_start[j] < start < last_end[j]:
            own_in_system[j] += last_in_system[j] * (last_end[j] - start)
    return start


@kernel(inline="always")
def _slot_array(n, w, fill):
    """An int64 array of one value per slot (``n == w``), left for :func:`_load_slots` to set slot by slot, or of
    the one element a policy never reads (``n < w``), set to ``fill``."""
    return np.empty(n, np.int64) if n == w else np.full(n, fill, np.int64)


@kernel
def _load_slots(lo, hi, slot_of, closed, caching, wheel, arrival_s, passes, out_arrival_s, out_first_token_s,
                out_finish_s, out_queue_s, out_cached, req_state, first_done, held, admitted_once, rank, prefill_left,
                chunk, miss, q_next, passes_done, decode_start, stamp, f_next, f_prev, f_step, run_prev, run_next,
                b_next, b_prev, b_step, key, tie, q_left, q_right):
    """Ready the slots of requests ``lo .. hi - 1`` (request ``g`` in slot ``slot_of[g % W]``): outputs unset, state
    that of a request not yet arrived (arrays a policy never reads have one element and are left alone:
    :func:`_slot_array`). Each array is written by name: a loop over a tuple of them costs a reference count per
    array and slot (the batching kernels ran at 0.36-0.78x with one). A slot is written only when a
    request comes into it, so the pages of slots never used are never touched. Returns whether each of them has at
    most ``wheel - 2`` passes (a timing-wheel slot then holds one step's sequences)."""
    w = arrival_s.shape[0]
    fits = True
    for g in range(lo, hi):
        s = slot_of[_ring(g, w)]
        out_arrival_s[s] = np.nan if closed else arrival_s[s]
        out_first_token_s[s] = np.nan
        out_finish_s[s] = np.nan
        out_queue_s[s] = np.nan
        req_state[s] = _PENDING
        first_done[s] = False
        held[s] = 0
        if caching:
            out_cached[s, :] = 0
        prefill_left[s] = 0
        chunk[s] = 0
        miss[s] = 0
        q_next[s] = -1
        if admitted_once.shape[0] == w:  # continuous policies
            admitted_once[s] = False
            passes_done[s] = 0
            decode_start[s] = 0
            stamp[s] = 0
            f_next[s] = -1
            f_prev[s] = -1
            f_step[s] = -1
        if b_step.shape[0] == w:  # preemption
            run_prev[s] = -1
            run_next[s] = -1
            b_next[s] = -1
            b_prev[s] = -1
            b_step[s] = -1
        if rank.shape[0] == w:  # keyed queues
            rank[s] = g
            key[s] = 0
            tie[s] = 0
            q_left[s] = -1
            q_right[s] = -1
        fits = fits and passes[s] + 2 <= wheel
    return fits


def simulate(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, think_s, given_instance, queue_key,
             key_uncached, block_ptr, block_keys, key_stride, capacity_blocks, pooled, params_int, balance,
             balance_requests, warmup_s, warmup_request, step_time_table, decode_edges, prefill_edges, kv_slope,
             kv_ref_context, cache_state, out_arrival_s, out_instance, out_first_token_s, out_finish_s, out_queue_s,
             out_cached, out_instance_steps, out_stats, log_start_s, log_decode_seqs, log_prefill_tokens, log_step_s,
             log_waiting):
    """Simulate ``K`` instances behind a router (rules in the module docstring); ``K = 1`` is one instance.

    Every request at once: :func:`simulate_stream` run to its end from Python (called from Python only, so that
    the loop is compiled once, as that generator).

    Parameters
    ----------
    arrival_s : float64[n]
        Arrival times, s, sorted (open loop); in a closed loop (``P_CLOSED_USERS = U > 0``) those of requests
        ``0 .. U-1`` (any order).
    prompt_tokens : int64[n]
        Prompt tokens; the prefill is what the instance's prefix cache does not hold (all of them, >= 1, without a
        cache: pass the tokens left to compute then).
    context_tokens : int64[n]
        Full prompt length, tokens (>= prompt_tokens); sets the KV footprint.
    output_tokens : int64[n]
        Tokens generated (>= 1), the first one by prefill.
    passes : int64[n]
        Decode passes after the first token (0 iff output_tokens == 1; output_tokens - 1 without speculative
        decoding, fewer with it).
    think_s : float64[n]
        Closed loop: request ``r >= U`` arrives ``think_s[r]`` after request ``r - U`` finishes.
    given_instance : int64[n]
        Instances in [0, K), read under ``PICK_GIVEN``.
    queue_key : int64[n]; key_uncached : bool
        ``P_ORDER == ORDER_KEY``: the key of each request (lower first); with ``key_uncached``, the prompt tokens its
        instance's cache does not hold when it joins the queue (``queue_key`` holding the prompt tokens).
    block_ptr, block_keys : int64[n + 1], int64[nnz]
        CSR prompt blocks of each request, in prompt order; block ids in ``[0, key_stride)``, distinct within a
        request. Read only with a cache.
    key_stride : int
        Block ids per cache: cache ``i`` keeps block ``b`` under key ``i * key_stride + b``.
    capacity_blocks : int64[T]
        One cache's capacity per tier, blocks, first tier first (0 = tier absent; first tier 0 = no cache); with
        ``pooled``, the one shared cache's.
    pooled : bool
        One prefix cache shared by every instance instead of one each.
    params_int : int64[N_PARAMS]
        At the ``P_*`` indices of :mod:`mcsim.kernels.batching_helpers`: token_budget, max_seqs, kv_blocks (per
        instance), block_tokens (also the cache's block), chunk_tokens (0 = no cap), verify_tokens, policy,
        preempt, closed_users, order, mixing, max_new, the router's pick, measure and prefix hooks, and how many
        of the last tiers are pooled.
    balance, balance_requests : float, int
        The cache-aware rule's relative and absolute imbalance thresholds.
    warmup_s : float
        Start of the measured window, s.
    warmup_request : int
        ``>= 0``: the window starts instead when this request arrives; ``warmup_s`` is then not read.
    step_time_table : float64[n_decode_edges, n_prefill_edges]
        Step time, s, at each (decoding sequences, prefill tokens) edge pair.
    decode_edges, prefill_edges : float64[:]
        Strictly increasing grids of the table (sequences; tokens).
    kv_slope : float64[n_decode_edges]
        Seconds one more KV token of a decoding sequence adds to a step, at each decode edge (0: the table alone).
    kv_ref_context : float
        KV length per decoding sequence at which the table was computed, tokens.
    cache_state : int32[K * key_stride, 4] (``key_stride`` rows when pooled; ``(K + 1) * key_stride`` with pooled
        tiers)
        Workspace of the caches (overwritten); may be empty without a cache.
    out_arrival_s, out_first_token_s, out_finish_s, out_queue_s : float64[n]
        Written: each request's arrival (a closed loop's followers' included), first-token and finish times (s)
        and its wait from arrival to first admission (s).
    out_instance : int64[n]
        Written: the instance each request was routed to.
    out_cached : int64[n, T]
        Written: prompt tokens each request reused from each tier.
    out_instance_steps : int64[K]
        Written: steps each instance ran; its length sets ``K``.
    out_stats : float64[N_STATS]
        Written at the ``STAT_*`` indices.
    log_start_s, log_step_s : float64[K, L]; log_decode_seqs, log_prefill_tokens, log_waiting : int64[K, L]
        Written: each instance's first ``L`` steps (start, decoding sequences, prefill tokens, step time, requests
        waiting after admission); ``L`` may be 0.

    Returns
    -------
    int
        ``STATUS_OK``, or ``STATUS_STALLED`` when a step had nothing to run.

    Examples
    --------
    >>> import numpy as np
    >>> from mcsim.kernels.batching_helpers import N_PARAMS, N_STATS
    >>> one = np.ones(1, np.int64); out = [np.zeros(1) for _ in range(4)]; stats = np.zeros(N_STATS)
    >>> params = np.zeros(N_PARAMS, np.int64); params[:6] = [8192, 8, 100, 16, 0, 1]
    >>> table = np.array([[0.01, 0.01], [0.01, 0.01]]); edges = np.array([0.0, 1.0])
    >>> no_log = [np.zeros((1, 0)), np.zeros((1, 0), np.int64), np.zeros((1, 0), np.int64), np.zeros((1, 0)),
    ...           np.zeros((1, 0), np.int64)]
    >>> simulate(np.zeros(1), 10 * one, 10 * one, 3 * one, 2 * one, np.zeros(1), 0 * one, 0 * one, False,
    ...          np.zeros(2, np.int64), np.zeros(0, np.int64), 1, np.zeros(1, np.int64), False, params, 0.25, 64, 0.0,
    ...          -1, table, edges, edges, np.zeros(2), 0.0, np.zeros((0, 4), np.int32), out[0], 0 * one, out[1],
    ...          out[2], out[3], np.zeros((1, 1), np.int64), np.zeros(1, np.int64), stats, *no_log)
    0
    >>> round(float(out[2][0]), 6)  # finish: one prefill step and two decode steps
    0.03
    """
    control = np.zeros(N_CONTROL, np.int64)
    control[C_REQUESTS] = arrival_s.shape[0]
    control[C_FILLED] = arrival_s.shape[0]  # every one
    slot_of = np.arange(arrival_s.shape[0])
    workspace = stream_workspace(arrival_s, passes, capacity_blocks, pooled, params_int, step_time_table, decode_edges,
                                 prefill_edges, kv_slope, out_instance_steps, slot_of, control)
    loop = simulate_stream(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, think_s, given_instance,
                           queue_key, key_uncached, block_ptr, block_keys, key_stride, capacity_blocks, pooled,
                           params_int, balance, balance_requests, warmup_s, warmup_request, step_time_table,
                           decode_edges, prefill_edges, kv_slope, kv_ref_context, cache_state, out_arrival_s,
                           out_instance, out_first_token_s, out_finish_s, out_queue_s, out_cached, out_instance_steps,
                           out_stats, log_start_s, log_decode_seqs, log_prefill_tokens, log_step_s, log_waiting,
                           slot_of, control, workspace)
    return int(next(loop))  # every request filled: the one value it yields is the status


@kernel(inline="always")
def stable_order(keys, n, order, scratch):
    """``order[:n]`` = the stable ascending order of ``keys[:n]`` (``np.argsort(keys[:n], kind="stable")``), by a
    bottom-up merge sort in ``scratch`` (``n`` entries): no array allocated.

    Examples
    --------
    >>> import numpy as np
    >>> order = np.empty(5, np.int64)
    >>> stable_order(np.array([3, 1, 3, 0, 1]), 5, order, np.empty(5, np.int64))
    >>> order.tolist()
    [3, 1, 4, 0, 2]
    """
    for j in range(n):
        order[j] = j
    width = 1
    while width < n:
        lo = 0
        while lo < n:
            mid = min(lo + width, n)
            hi = min(lo + 2 * width, n)
            a = lo
            b = mid
            o = lo
            while a < mid and b < hi:
                if keys[order[b]] < keys[order[a]]:  # ties from the left run first: stable
                    scratch[o] = order[b]
                    b += 1
                else:
                    scratch[o] = order[a]
                    a += 1
                o += 1
            while a < mid:
                scratch[o] = order[a]
                a += 1
                o += 1
            while b < hi:
                scratch[o] = order[b]
                b += 1
                o += 1
            lo = hi
        for j in range(n):
            order[j] = scratch[j]
        width *= 2


@kernel(inline="always")
def _policy_flags(params_int, capacity_blocks, pooled):
    """What the step loop and its workspace read of the policy: ``(static, preempt, keyed, users, closed,
    pick_given, caching, n_tiers, n_private, shared_tiers, ordered)``."""
    static = params_int[P_POLICY] == POLICY_STATIC
    preempt = params_int[P_PREEMPT] != 0 and not static
    keyed = params_int[P_ORDER] == ORDER_KEY and not static
    users = params_int[P_CLOSED_USERS]
    closed = users > 0
    pick_given = params_int[P_ROUTE_PICK] == PICK_GIVEN
    caching = capacity_blocks[0] > 0
    n_tiers = capacity_blocks.shape[0]
    n_private = n_tiers - params_int[P_POOLED_TIERS] if caching and not pooled else n_tiers
    shared_tiers = n_private < n_tiers  # a pool behind the instances' own tiers
    # Steps in the fleet's time order: a shared cache or pool, or followers of finishing requests.
    ordered = pooled or closed or shared_tiers
    return static, preempt, keyed, users, closed, pick_given, caching, n_tiers, n_private, shared_tiers, ordered


@kernel
def stream_workspace(arrival_s, passes, capacity_blocks, pooled, params_int, step_time_table, decode_edges,
                     prefill_edges, kv_slope, out_instance_steps, slot_of, control):
    """The arrays :func:`simulate_stream` works in, for the same arguments (those named here), before its first
    ``next``: ``(per_slot, steps_state, routing_state, rest)``. The loop allocates nothing itself, so that it can
    run without reference counts (:func:`mcsim.accelerate.kernel`); whoever calls it keeps these alive while it
    runs."""
    w = arrival_s.shape[0]
    n = control[C_REQUESTS]
    k = out_instance_steps.shape[0]
    max_seqs = params_int[P_MAX_SEQS]
    static, preempt, keyed, users, closed, pick_given, caching, n_tiers, n_private, shared_tiers, ordered = \
        _policy_flags(params_int, capacity_blocks, pooled)
    fed_alone = pick_given and not ordered
    no_instance = np.zeros(0)
    window_later = control[C_WINDOW] != WINDOW_GIVEN and _late_window(control, no_instance, no_instance,
                                                                      no_instance, no_instance) == np.inf
    n_later = k if window_later else 1
    last_start = np.zeros(n_later)
    last_end = np.zeros(n_later)
    last_in_system = np.zeros(n_later)

    # Per request, one slot each (request g in slot slot_of[g % w]). Arrays that a policy never reads have one element:
    # allocating and touching n-long arrays costs more than a static run's whole decode phase.
    n_cont = 1 if static else w  # read by continuous policies only
    n_pre = w if preempt else 1  # read with preemption only
    n_key = w if keyed else 1  # read by keyed queues only
    req_state = np.empty(w, np.int8)
    # (np.empty where _load_slots sets a slot's value as its request comes in: a slot never used is never touched)
    prefill_left = np.empty(w, np.int64)
    chunk = np.empty(w, np.int64)
    held = np.empty(w, np.int64)
    first_done = np.empty(w, np.bool_)
    miss = np.empty(w, np.int64)  # prompt tokens the first admission had to compute
    passes_done = _slot_array(n_cont, w, 0)  # passes run before the current decode stretch began
    decode_start = _slot_array(n_cont, w, 0)  # decode-clock step of the current stretch's first pass
    admitted_once = np.zeros(n_cont, np.bool_) if n_cont < w else np.empty(w, np.bool_)
    rank = _slot_array(n_key, w, 0)  # rank of arrival (the request's index): a keyed queue's tie-break
    stamp = _slot_array(n_cont, w, 0)  # admission rank: block growth goes oldest first
    run_prev = _slot_array(n_pre, w, -1)  # running sequences in admission order (victims from the tail)
    run_next = _slot_array(n_pre, w, -1)
    # Waiting queues: FCFS as singly linked lists (heads, tails and lengths per instance, below), keyed as skew
    # heaps on (key, rank of release).
    q_next = np.empty(w, np.int64)
    key = _slot_array(n_key, w, 0)
    tie = _slot_array(n_key, w, 0)
    q_left = _slot_array(n_key, w, -1)
    q_right = _slot_array(n_key, w, -1)
    # Per instance (instance_arrays): sequences admitted with prefill left, in admission order (a ring), a static
    # batch, and the timing wheels: per decode-clock step, the sequences finishing at its end and those needing a
    # block at its start.
    pf_cap = max(1, min(max_seqs, n))
    survivors = np.empty(pf_cap, np.int64)
    growing = np.empty(pf_cap, np.int64)
    needs = np.empty(pf_cap, np.int64)  # blocks each of them needs
    n_batch = pf_cap if static else 1
    member_passes = np.empty(n_batch, np.int64)
    order = np.empty(n_batch, np.int64)  # a static batch's members by passes, and the sort's scratch
    order_scratch = np.empty(n_batch, np.int64)
    loaded = min(control[C_FILLED], n)  # requests whose slots are ready
    max_passes = 0
    for r in range(loaded):  # (the wheel's length changes no result: the first requests set it)
        max_passes = max(max_passes, passes[slot_of[_ring(r, w)]])
    wheel = wheel_length(k, max_passes, pf_cap)
    f_next = _slot_array(n_cont, w, -1)
    f_prev = _slot_array(n_cont, w, -1)
    f_step = _slot_array(n_cont, w, -1)
    b_next = _slot_array(n_pre, w, -1)
    b_prev = _slot_array(n_pre, w, -1)
    b_step = _slot_array(n_pre, w, -1)
    # Decode-only steps are most steps: their times are looked up, not interpolated.
    decode_only_s = np.empty(max_seqs + 1 if max_seqs < n else n + 1)
    slope_of = np.empty(decode_only_s.shape[0])  # seconds per KV token at d decoding sequences
    for d in range(decode_only_s.shape[0]):
        decode_only_s[d] = step_time(step_time_table, decode_edges, prefill_edges, d, 0)
        slope_of[d] = kv_slope_at(kv_slope, decode_edges, d)

    # The instances' state (what each array holds: instance_arrays), loaded into locals while one of them runs its
    # steps.
    n_lists = n_tiers * (k + 1 if shared_tiers else k)  # the pool's lists after every instance's
    steps_state, routing_state = instance_arrays(k, pf_cap, static, wheel, preempt, n_lists, params_int[P_KV_BLOCKS])
    next_tier = next_tiers(capacity_blocks)
    hits = np.zeros((1, n_tiers), np.int64)
    # A closed loop's pending arrivals by (time, index): at most one per user, and one per request (users beyond the
    # requests stay idle).
    arrive_t = np.empty(max(min(users, n), 1))
    arrive_r = np.empty(max(min(users, n), 1), np.int64)
    pending = np.zeros(5, np.int64)
    feed = np.empty(w if fed_alone else 0, np.int64)  # each instance's requests of a round, in order of arrival
    busy_size = np.zeros(5, np.int64)
    per_slot = (req_state, prefill_left, chunk, held, first_done, miss, passes_done, decode_start, admitted_once, rank,
                stamp, run_prev, run_next, q_next, key, tie, q_left, q_right, f_next, f_prev, f_step, b_next, b_prev,
                b_step)
    rest = (last_start, last_end, last_in_system, survivors, growing, needs, member_passes, decode_only_s, slope_of,
            next_tier, hits, arrive_t, arrive_r, pending, feed, busy_size, order, order_scratch,
            np.array([wheel], np.int64))
    return per_slot, steps_state, routing_state, rest


@kernel(refcounts=False)
def simulate_stream(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, think_s, given_instance, queue_key,
                    key_uncached, block_ptr, block_keys, key_stride, capacity_blocks, pooled, params_int, balance,
                    balance_requests, warmup_s, warmup_request, step_time_table, decode_edges, prefill_edges, kv_slope,
                    kv_ref_context, cache_state, out_arrival_s, out_instance, out_first_token_s, out_finish_s,
                    out_queue_s, out_cached, out_instance_steps, out_stats, log_start_s, log_decode_seqs,
                    log_prefill_tokens, log_step_s, log_waiting, slot_of, control, workspace):
    """:func:`simulate` as a generator that takes its requests a part at a time: the same rules and the same
    results, in memory that grows with the requests in flight, not with the requests.

    The arrays of :func:`simulate` that hold one value per request (``arrival_s`` to ``queue_key``, ``out_arrival_s``
    to ``out_cached``) have ``W`` slots instead: request ``g`` of the ``n = control[C_REQUESTS]`` lives in slot
    ``slot_of[g % W]`` (int64[W]), any slot not held by a request in flight. The caller puts requests
    ``0 .. control[C_FILLED] - 1`` in their slots before the first ``next``; whenever the loop has run everything it
    can without the next request, it yields :data:`NEED_REQUESTS`, and the caller, before the next ``next``, reads the
    outputs of finished requests (their ``out_finish_s`` is set) whose slots it will reuse, puts the next requests in
    and raises ``control[C_FILLED]`` (by at least one). The last thing it yields is the status of :func:`simulate`,
    once every request has run; ``out_stats`` and the step log are written then. With ``W = n``, ``slot_of`` the
    identity and every request filled it yields that status alone. ``workspace`` is :func:`stream_workspace` of the
    same arguments, made before the first ``next``: the loop's own arrays.

    With ``control[C_WINDOW] == WINDOW_LATER`` the measured window's start (``warmup_s``) is not known yet: the
    caller sets it (``WINDOW_NOW`` and the time) before it puts in a request that arrives at or after it (a pool fed
    by another learns when its first measured request arrives only as it comes). Not under static batching.

    A closed loop or a prefix cache needs every request at once (``W = n``, all filled): followers are found by
    index and the caches key blocks by request. A given placement runs the instances one at a time up to the
    arrival of the last request filled, which it holds back until the next requests come (or the last one has).
    """
    w = arrival_s.shape[0]
    n = control[C_REQUESTS]
    k = out_instance_steps.shape[0]
    max_seqs = params_int[P_MAX_SEQS]
    block_tokens = params_int[P_BLOCK_TOKENS]
    static, preempt, keyed, users, closed, pick_given, caching, n_tiers, n_private, shared_tiers, ordered = \
        _policy_flags(params_int, capacity_blocks, pooled)
    by_free_kv = params_int[P_ROUTE_MEASURE] == MEASURE_FREE_KV
    by_prefix = params_int[P_ROUTE_PREFIX] != 0 and caching and not pooled
    # Least outstanding, open loop: the loads live in a tournament tree updated as instances change (O(log K) an
    # arrival, not a scan of every instance); a closed loop's next arrival can come earlier than the one in hand,
    # and the cache-aware and least-KV rules read every instance, so they scan.
    by_tree = not pick_given and not by_free_kv and not by_prefix and not closed and k > 1
    # The next instance to run from the busy instances' heap (O(log K)) rather than a sweep of every instance: in
    # the fleet's time order, one step at a time, where it matters (ordered); else each picked instance runs every
    # step before the arrival, as the sweep does (the same steps: nothing an instance does reaches another before
    # the arrival).
    heap_pick = ordered or by_tree
    pool_key = k * key_stride  # the pool's key of block b is pool_key + b
    shared_key = pool_key if shared_tiers else -1
    if warmup_request >= 0:
        warmup_s = np.inf  # until that request arrives
    per_slot, steps_state, routing_state, rest = workspace
    (req_state, prefill_left, chunk, held, first_done, miss, passes_done, decode_start, admitted_once, rank, stamp,
     run_prev, run_next, q_next, key, tie, q_left, q_right, f_next, f_prev, f_step, b_next, b_prev, b_step) = per_slot
    (last_start, last_end, last_in_system, survivors, growing, needs, member_passes, decode_only_s, slope_of, next_tier,
     hits, arrive_t, arrive_r, pending, feed, busy_size, order, order_scratch, sizes) = rest
    # A window whose start comes later: each instance's last step inside the arrival window until it does.
    window_later = control[C_WINDOW] != WINDOW_GIVEN
    if window_later:  # (no instance has stepped yet: none to add to)
        warmup_s = _late_window(control, last_start[:0], last_start[:0], last_end[:0], last_in_system[:0])
        window_later = warmup_s == np.inf
    pf_cap = survivors.shape[0]
    wheel = sizes[0]
    mask = wheel - 1
    loaded = min(control[C_FILLED], n)  # requests whose slots are ready
    track_kv = False  # a static batch's KV is followed only when it costs something
    for e in range(kv_slope.shape[0]):
        track_kv = track_kv or kv_slope[e] != 0.0
    (q_head, q_tail, q_len, pf, batch, by_passes, finish_head, block_head, clock, free_blocks, running, decoding,
     kv_sum, kv_rate, dclock, pf_head, pf_len, run_tail, decode_left, static_step_s, static_slope, static_done,
     static_stop, ending, freeing) = steps_state
    (head, tail, count, feed_ptr, fill, load, free_now, busy_t, busy_i, own_in_system, own_step_s, least_tree,
     expire_t, expire_i, expire_state, expire_marked) = routing_state
    out_instance_steps[:] = 0
    out_stats[:] = 0.0
    if by_tree:
        load[:] = 0
        expire_marked[:] = 0
        expire_state[:] = 0
        _least_build(least_tree, load, k)
    # a slot then holds the sequences of one step only
    full_wheel = _load_slots(0, loaded, slot_of, closed, caching, wheel, arrival_s, passes, out_arrival_s,
                             out_first_token_s, out_finish_s, out_queue_s, out_cached, req_state, first_done, held,
                             admitted_once, rank, prefill_left, chunk, miss, q_next, passes_done, decode_start, stamp,
                             f_next, f_prev, f_step, run_prev, run_next, b_next, b_prev, b_step, key, tie, q_left,
                             q_right)

    if caching:
        reset_caches(cache_state, head, tail, count)
    hits[:] = 0
    pending[:] = 0
    status = STATUS_OK
    token_budget = params_int[P_TOKEN_BUDGET]
    chunk_tokens = params_int[P_CHUNK_TOKENS]
    verify_tokens = params_int[P_VERIFY_TOKENS]
    kv_blocks = params_int[P_KV_BLOCKS]
    exclusive = params_int[P_MIXING] == MIXING_EXCLUSIVE and not static
    max_new = params_int[P_MAX_NEW] if params_int[P_MAX_NEW] > 0 and not static else n + 1
    log_cap = log_start_s.shape[1]
    logs = (log_start_s, log_decode_seqs, log_prefill_tokens, log_step_s, log_waiting)
    fcfs_queue = (q_head, q_tail, q_len, q_next)
    in_system_integral = 0.0
    window_steps = 0
    window_step_s_sum = 0.0
    window_decode_seqs_sum = 0
    window_decode_steps = 0
    steps = 0
    end_s = 0.0
    preemptions = 0
    admissions = 0
    window_end = np.nan
    waiting_at_end = 0

    # A given placement (round-robin, random, prefix affinity) without a shared cache or a closed loop: each
    # instance's arrivals are known, so it runs its whole timeline in turn, releasing its own requests at its step
    # starts (its feed). Otherwise the router's event loop: every step that starts before the next arrival runs,
    # then the arrival is placed.
    # Requests filled a part at a time: a given placement runs its instances in rounds, each up to the arrival of
    # the last request filled (held back to the next round), and the event loop waits for the next request.
    fed_alone = pick_given and not ordered
    if fed_alone:
        window_end = -np.inf  # the last arrival, or the end of the steps started before it (below)
    fed_upto = 0  # requests in the feeds of the rounds so far
    horizon = np.inf  # the round's instances run the steps that start before it
    busy_size[:] = 0
    if closed:
        for r in range(min(users, n)):
            _heap_push(arrive_t, arrive_r, pending, arrival_s[r], r)
    # (inf: not filled yet)
    last_arrival = arrival_s[slot_of[_ring(n - 1, w)]] if loaded == n and not closed else np.inf
    released = 0  # requests routed so far
    next_alone = k  # the next instance to run alone in the round (k: the round is over)
    r = 0
    t_next = np.inf
    sweep = 0
    need_arrival = True
    while status == STATUS_OK:
        # The caller's next requests, once the loop has run all it can without them: a given placement's round is
        # over with only the held-back request left, or the event loop's next arrival is not filled yet.
        if loaded < n and ((fed_alone and next_alone == k and fed_upto == loaded - 1)
                           or (not fed_alone and need_arrival and not closed and released == loaded)):
            yield NEED_REQUESTS
            if window_later:
                warmup_s = _late_window(control, own_in_system, last_start, last_end, last_in_system)
                window_later = warmup_s == np.inf
            filled = min(control[C_FILLED], n)
            fits = _load_slots(loaded, filled, slot_of, closed, caching, wheel, arrival_s, passes, out_arrival_s,
                               out_first_token_s, out_finish_s, out_queue_s, out_cached, req_state, first_done, held,
                               admitted_once, rank, prefill_left, chunk, miss, q_next, passes_done, decode_start, stamp,
                               f_next, f_prev, f_step, run_prev, run_next, b_next, b_prev, b_step, key, tie, q_left,
                               q_right)
            full_wheel = full_wheel and fits
            loaded = filled
            if loaded == n:
                last_arrival = arrival_s[slot_of[_ring(n - 1, w)]]
        if fed_alone:
            if next_alone == k:
                if fed_upto == n:
                    break
                # The next round's feeds: the requests filled, but the last one until every request is.
                stop = loaded if loaded == n else loaded - 1
                horizon = np.inf if loaded == n else arrival_s[slot_of[_ring(loaded - 1, w)]]
                feed_ptr[:] = 0
                for g in range(fed_upto, stop):
                    feed_ptr[given_instance[slot_of[_ring(g, w)]] + 1] += 1
                for i in range(k):
                    feed_ptr[i + 1] += feed_ptr[i]
                for i in range(k):
                    fill[i] = feed_ptr[i]
                for g in range(fed_upto, stop):
                    s = slot_of[_ring(g, w)]
                    feed[fill[given_instance[s]]] = s
                    fill[given_instance[s]] += 1
                fed_upto = stop
                if loaded == n:
                    window_end = max(window_end, last_arrival)
                next_alone = 0
            i = next_alone
            next_alone += 1
            t_limit = horizon
            feed_start = feed_ptr[i]
            feed_stop = feed_ptr[i + 1]
            record_waiting = True
            window_until = last_arrival
        else:
            if need_arrival:
                if closed:
                    r = arrive_r[0] if pending[_HEAP_SIZE] > 0 else n
                    t_next = arrive_t[0] if pending[_HEAP_SIZE] > 0 else np.inf
                else:
                    r = released
                    t_next = arrival_s[slot_of[_ring(r, w)]] if r < n else np.inf
                sweep = 0
                need_arrival = False
            # The next instance to run: the fleet's earliest in time order (one step); else instance by instance,
            # every step before the arrival, which runs the same steps (nothing an instance does reaches another
            # before the arrival) and keeps each instance's cache rows warm.
            i = -1
            if heap_pick:
                if busy_size[_HEAP_SIZE] > 0 and busy_t[0] < t_next:
                    i = busy_i[0]
            else:
                while sweep < k and not (running[sweep] + q_len[sweep] > 0 and clock[sweep] < t_next):
                    sweep += 1
                if sweep < k:
                    i = sweep
            if i < 0:
                # Every step before the arrival has run: place it.
                if r == n:
                    break
                rs = slot_of[_ring(r, w)]  # its slot
                if closed:
                    _heap_pop(arrive_t, arrive_r, pending)
                    out_arrival_s[rs] = t_next
                if r == warmup_request:
                    warmup_s = t_next
                chosen = 0
                if pick_given:
                    chosen = given_instance[rs]
                elif by_tree:
                    # steps that ended by this arrival no longer hold their finishing sequences
                    while expire_state[_HEAP_SIZE] > 0 and expire_t[0] <= t_next:
                        j = expire_i[0]
                        _heap_pop(expire_t, expire_i, expire_state)
                        expire_marked[j] = 0
                        _least_refresh(least_tree, load, expire_t, expire_i, expire_state, expire_marked, j, t_next,
                                       q_len, running, ending, clock)
                    chosen = least_tree[1]
                elif k > 1:
                    # The instances as they are at the arrival: a step still running holds its finishing requests.
                    for j in range(k):
                        running_late = clock[j] > t_next
                        load[j] = q_len[j] + running[j] + (ending[j] if running_late else 0)
                        free_now[j] = free_blocks[j] - (freeing[j] if running_late else 0)
                    if by_free_kv:
                        for j in range(1, k):
                            if free_now[j] > free_now[chosen]:
                                chosen = j
                    else:
                        least = 0
                        most = 0
                        for j in range(1, k):
                            if load[j] < load[least]:
                                least = j
                            if load[j] > load[most]:
                                most = j
                        chosen = least
                        imbalanced = (load[most] - load[least] > balance_requests
                                      and load[most] > (1.0 + balance) * load[least])
                        if by_prefix and not imbalanced:
                            best_len = -1
                            for j in range(k):
                                # kv_tiers.cached_prefix(_pooled) written out (with Numba's runtime an inlined
                                # helper with a loop cost reference counts at every call; see _file)
                                offset = j * key_stride
                                length = 0
                                for b in range(block_ptr[rs], block_ptr[rs + 1]):
                                    present = cache_state[block_keys[b] + offset, _TIER] != _ABSENT
                                    if not present and shared_tiers:
                                        present = cache_state[block_keys[b] + pool_key, _TIER] != _ABSENT
                                    if not present:
                                        break
                                    length += 1
                                if length > best_len or (length == best_len and load[j] < load[chosen]):
                                    chosen = j
                                    best_len = length
                out_instance[rs] = chosen
                if running[chosen] == 0 and q_len[chosen] == 0:
                    clock[chosen] = max(clock[chosen], t_next)
                    if heap_pick:
                        _heap_push(busy_t, busy_i, busy_size, clock[chosen], chosen)
                if keyed:
                    _keyed_enqueue(rs, chosen, released, key_uncached and caching, 0 if pooled else chosen, queue_key,
                                   cache_state, block_keys, block_ptr, key_stride, shared_key, block_tokens, key, tie,
                                   q_left, q_right, q_head, q_len, req_state)
                else:
                    _fcfs_push(rs, chosen, q_head, q_tail, q_len, q_next)
                    req_state[rs] = _WAITING
                if by_tree:
                    _least_refresh(least_tree, load, expire_t, expire_i, expire_state, expire_marked, chosen, t_next,
                                   q_len, running, ending, clock)
                released += 1
                if released == n:
                    waiting_at_end = 0
                    for j in range(k):
                        waiting_at_end += q_len[j]
                    window_end = t_next  # the arrival, or the end of the steps started before it
                    for j in range(k):
                        window_end = max(window_end, clock[j])
                need_arrival = True
                continue
            t_limit = t_next
            feed_start = 0
            feed_stop = 0
            record_waiting = False
            window_until = last_arrival if released < n else -np.inf
        one_step = ordered

        # The steps of instance i: every one that starts before t_limit (only the first in the fleet's time
        # order), or, with a feed, its whole run.
        owner = 0 if pooled else i
        base = i * wheel
        t = clock[i]
        free = free_blocks[i]
        n_running = running[i]
        n_decoding = decoding[i]
        kvs = kv_sum[i]
        kvr = kv_rate[i]
        dc = dclock[i]
        pfh = pf_head[i]
        pfl = pf_len[i]
        rtail = run_tail[i]
        dleft = decode_left[i]
        end_count = ending[i]
        free_count = freeing[i]
        own_steps = out_instance_steps[i]
        in_system_integral = own_in_system[i]
        window_step_s_sum = own_step_s[i]
        waited = not record_waiting
        pos = feed_start
        next_feed_s = out_arrival_s[feed[pos]] if pos < feed_stop else np.inf
        ran = 0
        status = STATUS_OK
        while True:
            while next_feed_s <= t:
                fed = feed[pos]
                pos += 1
                next_feed_s = out_arrival_s[feed[pos]] if pos < feed_stop else np.inf
                out_instance[fed] = i
                if keyed:
                    _keyed_enqueue(fed, i, rank[fed], key_uncached and caching, owner, queue_key, cache_state,
                                   block_keys, block_ptr, key_stride, shared_key, block_tokens, key, tie, q_left,
                                   q_right, q_head, q_len, req_state)
                else:
                    _fcfs_push(fed, i, q_head, q_tail, q_len, q_next)
                    req_state[fed] = _WAITING
            if n_running + q_len[i] == 0:
                if pos < feed_stop:
                    t = max(t, next_feed_s)
                    continue
                break
            if t >= t_limit or (one_step and ran > 0):
                break
            if not waited and t >= window_until:  # the requests waiting when the last one has arrived, and when
                waiting_at_end += q_len[i]  # the steps started before it end
                window_end = max(window_end, t)
                waited = True
            in_system = q_len[i] + n_running
            if static and dleft > 0:
                # The static batch's decode steps: a function of their own (nothing to build, the step time fixed
                # but for the KV term), whose few live variables stay in registers; in this loop they cost about
                # twice as much.
                stop_s = min(t_limit, window_until if not waited else np.inf)
                (t, dleft, kvs, kvr, done, stop, own_steps, ran_now, end_s, in_system_integral, window_steps,
                 window_step_s_sum, window_decode_seqs_sum, window_decode_steps, pos) = _static_decode_steps(
                    i, t, dleft, n_decoding, n_running, in_system, static_step_s[i], static_slope[i], kvs, kvr,
                    kv_ref_context, track_kv, static_done[i], static_stop[i], stop_s, one_step, window_until, warmup_s,
                    own_steps, end_s, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                    window_decode_steps, by_passes, passes, output_tokens, logs, pos, feed_stop, feed, out_arrival_s,
                    fcfs_queue, req_state, out_instance)
                next_feed_s = out_arrival_s[feed[pos]] if pos < feed_stop else np.inf
                ran += ran_now
                static_done[i] = done
                static_stop[i] = stop
                if dleft == 0:  # every member finishes, and returns its blocks, at the batch's last step
                    end_count = n_running
                    free_count = kv_blocks - free
                    _finish_static_batch(batch, i, n_running, t, req_state, held, out_finish_s, closed, users,
                                         think_s, arrive_t, arrive_r, pending)
                    dleft = -1
                    free = kv_blocks
                    n_running = 0
                    n_decoding = 0
                    kvs = 0.0
                    kvr = 0.0
                else:
                    end_count = 0
                    free_count = 0
                continue

            # Exclusive prefill: the step is prefill only when there is prefill to do (a sequence with prefill left,
            # or a waiting request that can be admitted), else decode only.
            prefill_step = False
            if exclusive:
                if pfl > 0:
                    prefill_step = True
                elif q_len[i] > 0 and n_running < max_seqs:
                    s = q_head[i]
                    if preempt:
                        tokens = context_tokens[s] + _tokens_after(output_tokens[s], passes[s], passes_done[s])
                    else:
                        tokens = context_tokens[s] + output_tokens[s]
                    prefill_step = (tokens + block_tokens - 1) // block_tokens <= free

            preempted = False
            if preempt and not prefill_step:
                # KV growth of this step's pass, oldest admission first.
                slot = base + (dc & mask)
                m = 0
                g = block_head[slot]
                while g >= 0:
                    following = b_next[g]
                    if full_wheel:  # every sequence in the slot is due: the slot empties whole, below
                        b_step[g] = -1
                        growing[m] = g
                        m += 1
                    elif b_step[g] == dc:
                        _unfile(block_head, b_next, b_prev, b_step, base, mask, g)
                        growing[m] = g
                        m += 1
                    g = following
                if full_wheel:
                    block_head[slot] = -1
                # What each needs; when the pool holds it all, no one is preempted and the order changes nothing.
                total = 0
                for a in range(m):
                    g = growing[a]
                    this_pass = passes_done[g] + (dc - decode_start[g]) + 1
                    tokens = context_tokens[g] + _tokens_after(output_tokens[g], passes[g], this_pass)
                    needs[a] = (tokens + block_tokens - 1) // block_tokens - held[g]
                    total += needs[a]
                if total > free:
                    for a in range(1, m):  # oldest admission first
                        g = growing[a]
                        need = needs[a]
                        j = a - 1
                        while j >= 0 and stamp[growing[j]] > stamp[g]:
                            growing[j + 1] = growing[j]
                            needs[j + 1] = needs[j]
                            j -= 1
                        growing[j + 1] = g
                        needs[j + 1] = need
                for a in range(m):
                    g = growing[a]
                    if req_state[g] != _DECODING:  # preempted in this step, by an older sequence's growth
                        continue
                    need = needs[a]
                    while free < need:
                        victim = rtail
                        rtail = run_prev[victim]
                        if rtail >= 0:
                            run_next[rtail] = -1
                        if req_state[victim] == _DECODING:
                            passes_done[victim] += dc - decode_start[victim]
                            if f_step[victim] >= 0:
                                _unfile(finish_head, f_next, f_prev, f_step, base, mask, victim)
                            if b_step[victim] >= 0:
                                _unfile(block_head, b_next, b_prev, b_step, base, mask, victim)
                            n_decoding -= 1
                            rate = _kv_rate(output_tokens[victim], passes[victim])
                            kvs -= context_tokens[victim] + 1 + passes_done[victim] * rate
                            kvr -= rate
                        else:  # the newest running sequence still prefilling is the prefill ring's tail
                            pfl -= 1
                        free += held[victim]
                        held[victim] = 0
                        req_state[victim] = _WAITING
                        if keyed:  # back in the queue under its own key and rank of release
                            q_left[victim] = -1
                            q_right[victim] = -1
                            q_head[i] = skew_merge(q_head[i], victim, q_left, q_right, key, tie)
                        else:  # back at the head
                            q_next[victim] = q_head[i]
                            q_head[i] = victim
                            if q_tail[i] < 0:
                                q_tail[i] = victim
                        q_len[i] += 1
                        n_running -= 1
                        preemptions += 1
                        preempted = True
                        if victim == g:
                            break
                    if req_state[g] == _DECODING:
                        free -= need
                        held[g] += need
                        grow = _next_block_step(context_tokens[g], output_tokens[g], passes[g], block_tokens, held[g],
                                                passes_done[g], decode_start[g])
                        if grow >= 0:
                            _file(block_head, b_next, b_prev, b_step, base, mask, g, grow)

            if static and n_running == 0:
                # A new static batch: from the queue head while the pool holds whole reservations (no budget cap: the
                # batch's prefill spreads over as many steps as it needs).
                while q_len[i] > 0 and n_running < max_seqs:
                    s = q_head[i]
                    need = (context_tokens[s] + output_tokens[s] + block_tokens - 1) // block_tokens
                    if need > free:
                        break
                    q_head[i] = q_next[s]
                    q_len[i] -= 1
                    if q_len[i] == 0:
                        q_tail[i] = -1
                    free -= need
                    held[s] = need
                    out_queue_s[s] = t - out_arrival_s[s]
                    req_state[s] = _PREFILLING
                    miss[s] = prompt_tokens[s] if not caching else _first_admission(
                        s, owner, caching, cache_state, head, tail, count, capacity_blocks, next_tier, n_private,
                        pool_key, n_tiers * k, block_keys, block_ptr, key_stride, hits, block_tokens, prompt_tokens,
                        out_cached)
                    prefill_left[s] = miss[s]
                    batch[i, n_running] = s
                    n_running += 1
                    pf[i, (pfh + pfl) % pf_cap] = s
                    pfl += 1
                dleft = -1

            if prefill_step:  # the decoding sequences wait
                decode_seqs = 0
                budget_left = token_budget
            else:
                decode_seqs = n_decoding
                budget_left = 0 if exclusive else max(0, token_budget - decode_seqs * verify_tokens)
            prefill = 0
            touched = 0
            while budget_left > 0 and touched < pfl:
                s = pf[i, (pfh + touched) % pf_cap]
                c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens)
                chunk[s] = c
                prefill += c
                budget_left -= c
                touched += 1
            if not preempted and not static:
                admitted = 0
                while budget_left > 0 and q_len[i] > 0 and n_running < max_seqs and admitted < max_new:
                    s = q_head[i]
                    if preempt:
                        tokens = context_tokens[s] + _tokens_after(output_tokens[s], passes[s], passes_done[s])
                    else:
                        tokens = context_tokens[s] + output_tokens[s]
                    need = (tokens + block_tokens - 1) // block_tokens
                    if need > free:
                        break
                    if keyed:
                        q_head[i] = skew_merge(q_left[s], q_right[s], q_left, q_right, key, tie)
                    else:
                        q_head[i] = q_next[s]
                        if q_len[i] == 1:
                            q_tail[i] = -1
                    q_len[i] -= 1
                    free -= need
                    held[s] = need
                    req_state[s] = _PREFILLING
                    if not admitted_once[s]:
                        admitted_once[s] = True
                        out_queue_s[s] = t - out_arrival_s[s]
                        miss[s] = prompt_tokens[s] if not caching else _first_admission(
                            s, owner, caching, cache_state, head, tail, count, capacity_blocks, next_tier, n_private,
                            pool_key, n_tiers * k, block_keys, block_ptr, key_stride, hits, block_tokens, prompt_tokens,
                            out_cached)
                    prefill_left[s] = miss[s]
                    if first_done[s]:  # recompute after preemption: prompt and the output produced so far
                        prefill_left[s] += _tokens_after(output_tokens[s], passes[s], passes_done[s])
                    stamp[s] = admissions
                    admissions += 1
                    admitted += 1
                    if preempt:
                        run_prev[s] = rtail
                        run_next[s] = -1
                        if rtail >= 0:
                            run_next[rtail] = s
                        rtail = s
                    n_running += 1
                    pf[i, (pfh + pfl) % pf_cap] = s
                    pfl += 1
                    c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens)
                    chunk[s] = c
                    prefill += c
                    budget_left -= c
                    touched += 1
            if decode_seqs == 0 and prefill == 0:
                if exclusive:  # every decoding sequence was preempted: the next step prefills them again
                    continue
                status = STATUS_STALLED
                break
            # The decode clock advances at each step that runs the decodes: every step but an exclusive prefill step.
            advance = 1 if decode_seqs > 0 or not exclusive else 0

            if prefill == 0 and decode_seqs < decode_only_s.shape[0]:
                step_s = decode_only_s[decode_seqs]
            else:
                step_s = step_time(step_time_table, decode_edges, prefill_edges, decode_seqs, prefill)
            if decode_seqs > 0:
                slope = slope_of[decode_seqs] if decode_seqs < slope_of.shape[0] else \
                    kv_slope_at(kv_slope, decode_edges, decode_seqs)
                if slope != 0.0:
                    step_s = max(step_s + slope * (kvs - decode_seqs * kv_ref_context), 1e-12)
                kvs += kvr  # every decoding sequence ran its pass
            t_end = t + step_s
            if own_steps < log_cap:
                log_start_s[i, own_steps] = t
                log_decode_seqs[i, own_steps] = decode_seqs
                log_prefill_tokens[i, own_steps] = prefill
                log_step_s[i, own_steps] = step_s
                log_waiting[i, own_steps] = q_len[i]
            if t < window_until:  # the step starts inside the arrival window
                if t_end > warmup_s:
                    in_system_integral += in_system * (t_end - max(t, warmup_s))
                if t >= warmup_s:
                    window_steps += 1
                    window_step_s_sum += step_s
                    if decode_seqs > 0:
                        window_decode_seqs_sum += decode_seqs
                        window_decode_steps += 1
                if window_later:
                    last_start[i] = t
                    last_end[i] = t_end
                    last_in_system[i] = in_system
            end_count = 0
            free_count = 0

            # Prefill progress; sequences whose prefill completes leave the ring, the others keep their order.
            if touched > 0:  # (most steps are decode-only)
                n_survivors = 0
                for j in range(touched):
                    s = pf[i, (pfh + j) % pf_cap]
                    prefill_left[s] -= chunk[s]
                    if prefill_left[s] > 0:
                        survivors[n_survivors] = s
                        n_survivors += 1
                        continue
                    if not first_done[s]:
                        first_done[s] = True
                        out_first_token_s[s] = t_end
                    if static:  # members decode together once the whole batch is prefilled
                        continue
                    passes_left = passes[s] - passes_done[s]
                    if passes_left == 0:
                        req_state[s] = _DONE
                        free += held[s]
                        end_count += 1
                        free_count += held[s]
                        held[s] = 0
                        n_running -= 1
                        if preempt:
                            rtail = unlink_running(run_prev, run_next, rtail, s)
                        out_finish_s[s] = t_end
                        if closed and s + users < n:  # this user's next request
                            _heap_push(arrive_t, arrive_r, pending, t_end + think_s[s + users], s + users)
                        continue
                    req_state[s] = _DECODING
                    n_decoding += 1
                    rate = _kv_rate(output_tokens[s], passes[s])
                    kvs += context_tokens[s] + 1 + passes_done[s] * rate
                    kvr += rate
                    decode_start[s] = dc + advance
                    _file(finish_head, f_next, f_prev, f_step, base, mask, s, decode_start[s] + passes_left - 1)
                    if preempt:
                        grow = _next_block_step(context_tokens[s], output_tokens[s], passes[s], block_tokens, held[s],
                                                passes_done[s], decode_start[s])
                        if grow >= 0:
                            _file(block_head, b_next, b_prev, b_step, base, mask, s, grow)
                pfh = (pfh + touched - n_survivors) % pf_cap
                for j in range(n_survivors):
                    pf[i, (pfh + j) % pf_cap] = survivors[j]
                pfl -= touched - n_survivors

            if static:  # a prefill step of a static batch (its decode steps take the short path above)
                if pfl == 0:  # the whole batch is prefilled: it decodes for its longest member's passes
                    dleft = 0
                    for j in range(n_running):
                        dleft = max(dleft, passes[batch[i, j]])
                    n_decoding = n_running
                    static_step_s[i] = decode_only_s[n_running]
                    static_slope[i] = slope_of[n_running]
                    static_done[i] = 0
                    static_stop[i] = 0
                    if track_kv:
                        kvs = 0.0
                        kvr = 0.0
                        for j in range(n_running):
                            s = batch[i, j]
                            kvs += context_tokens[s] + 1
                            kvr += _kv_rate(output_tokens[s], passes[s])
                            member_passes[j] = passes[s]
                        stable_order(member_passes, n_running, order, order_scratch)
                        for j in range(n_running):
                            by_passes[i, j] = batch[i, order[j]]
                        stop = 0  # members without passes pad the batch from the start
                        while stop < n_running and passes[by_passes[i, stop]] == 0:
                            stop += 1
                        static_stop[i] = stop
                    if dleft == 0:  # single-token outputs only: the batch ends with its prefill
                        end_count = n_running
                        free_count = kv_blocks - free
                        _finish_static_batch(batch, i, n_running, t_end, req_state, held, out_finish_s, closed, users,
                                             think_s, arrive_t, arrive_r, pending)
                        dleft = -1
                        free = kv_blocks
                        n_running = 0
                        n_decoding = 0
            else:
                # Sequences whose last pass ran in this step, in reverse order of filing.
                if advance:
                    slot = base + (dc & mask)
                    s = finish_head[slot]
                    while s >= 0:
                        following = f_next[s]
                        if full_wheel or f_step[s] == dc:
                            if full_wheel:  # every sequence in the slot finishes: the slot empties whole, below
                                f_step[s] = -1
                            else:
                                _unfile(finish_head, f_next, f_prev, f_step, base, mask, s)
                            req_state[s] = _DONE
                            free += held[s]
                            end_count += 1
                            free_count += held[s]
                            held[s] = 0
                            n_running -= 1
                            n_decoding -= 1
                            kvs -= context_tokens[s] + output_tokens[s]  # context + 1 + passes x rate
                            kvr -= _kv_rate(output_tokens[s], passes[s])
                            if preempt:  # no block growth is pending: the last one was at this step's start
                                rtail = unlink_running(run_prev, run_next, rtail, s)
                            out_finish_s[s] = t_end
                            if closed and s + users < n:  # this user's next request
                                _heap_push(arrive_t, arrive_r, pending, t_end + think_s[s + users], s + users)
                        s = following
                    if full_wheel:
                        finish_head[slot] = -1
                    dc += 1
                if n_decoding == 0:  # no rounding carried from one busy period to the next
                    kvs = 0.0
                    kvr = 0.0
            own_steps += 1
            ran += 1
            t = t_end
        if ran > 0:  # the end of this instance's last step
            steps += ran
            end_s = max(end_s, t)
        if not waited:  # every step of this instance started before the last arrival
            window_end = max(window_end, t)
        clock[i] = t
        free_blocks[i] = free
        running[i] = n_running
        decoding[i] = n_decoding
        kv_sum[i] = kvs
        kv_rate[i] = kvr
        dclock[i] = dc
        pf_head[i] = pfh
        pf_len[i] = pfl
        run_tail[i] = rtail
        decode_left[i] = dleft
        ending[i] = end_count
        freeing[i] = free_count
        if by_tree:
            _least_refresh(least_tree, load, expire_t, expire_i, expire_state, expire_marked, i, t_next, q_len,
                           running, ending, clock)
        out_instance_steps[i] = own_steps
        own_in_system[i] = in_system_integral
        own_step_s[i] = window_step_s_sum
        if not fed_alone and heap_pick:
            _heap_pop(busy_t, busy_i, busy_size)  # i was the top
            if running[i] + q_len[i] > 0:
                _heap_push(busy_t, busy_i, busy_size, clock[i], i)
            if closed and pending[_HEAP_SIZE] > 0 and (arrive_t[0] < t_next
                                                       or (arrive_t[0] == t_next and arrive_r[0] < r)):
                r = arrive_r[0]  # a follower of this step arrives before the arrival in hand
                t_next = arrive_t[0]

    in_system_integral = 0.0
    window_step_s_sum = 0.0
    for i in range(k):
        in_system_integral += own_in_system[i]
        window_step_s_sum += own_step_s[i]
    out_stats[STAT_STATUS] = status
    out_stats[STAT_WINDOW_END_S] = window_end
    out_stats[STAT_WAITING_AT_WINDOW_END] = waiting_at_end
    out_stats[STAT_PREEMPTIONS] = preemptions
    _store_window(out_stats, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                  window_decode_steps, steps, end_s)
    yield status

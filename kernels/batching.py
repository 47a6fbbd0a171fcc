"""Scheduler policies of one serving instance (continuous, static, ...): a step-level discrete-event simulator.

The engine runs in *steps* (one forward pass of the model over a batch). The scheduler, in the manner of
vLLM's, builds each step as follows.

Step construction (continuous batching)
---------------------------------------
1. Arrivals: every request whose arrival time is <= the step's start time joins the tail of the FCFS
   waiting queue, in order of (arrival time, index). When nothing is running and nothing waits, the
   clock jumps to the next arrival.
2. KV growth (``preempt == 1`` only): every decoding sequence, oldest admission first, that needs more
   KV blocks for the tokens of this step's pass takes them from the pool. If the pool is short, the most
   recently admitted running sequence is preempted (possibly the one asking) until the need fits.
   Preemption is by *recompute*: the victim loses its KV and its prefill progress and goes back to the
   head of the waiting queue (several victims of one step keep their admission order there); output
   already produced stays produced.
3. Decodes: every decoding sequence runs one pass and costs ``verify_tokens`` tokens of the step's
   ``token_budget`` (``k + 1`` with speculative decoding, 1 without). Decodes are never deferred, so a
   budget below ``max_seqs * verify_tokens`` only starves prefill.
4. Prefill chunks: the remaining budget goes, in admission order, to admitted sequences whose prefill is
   unfinished, each getting ``min(prefill left, budget left, chunk_tokens)`` (``chunk_tokens == 0``: no
   per-request cap); then waiting requests are admitted from the queue head, FCFS without skipping, while
   budget is left, fewer than ``max_seqs`` sequences run and the pool holds the request's blocks; each
   admitted request gets its first chunk in the same step. No admission happens in a step that preempted.
5. Step time: bilinear interpolation of ``step_time_table`` at (decoding sequences, prefill tokens),
   clamped to the table's edges, plus the attention cost of the batch's own KV lengths:
   ``kv_slope(d) x (S - d x kv_ref_context)``, where ``S`` is the summed KV length of the ``d`` decoding
   sequences, ``kv_ref_context`` the per-sequence context the table was computed at and ``kv_slope`` (s per
   KV token, interpolated over ``decode_edges``) what one more token of context costs. A decoding sequence
   that has run ``j`` of its ``P`` passes attends over ``context + 1 + j x (output - 1) / P`` tokens (the
   linear form of the tokens it has produced, so that ``S`` is updated in O(1) per step); a static batch's
   finished members stay at ``context + output``. ``kv_slope = 0`` gives the table alone.
6. At the end of the step, a sequence whose prefill completed emits its first token (not after a
   recompute) and decodes from the next step; a decoding sequence that ran its last pass finishes.

KV blocks: a request with ``c`` context tokens that has produced ``g`` output tokens holds
``ceil((c + g) / block_tokens)`` blocks; after ``j`` of its ``P`` passes it has produced
``g(j) = 1 + floor(j * (output - 1) / P)`` tokens (the first token comes from prefill; passes spread the
rest evenly). With ``preempt == 0`` admission reserves the whole request, ``ceil((c + output) /
block_tokens)`` blocks, and nothing is ever preempted; with ``preempt == 1`` admission takes
``ceil((c + g(j)) / block_tokens)`` and the sequence grows before each pass that crosses a block. A
recompute prefills ``prefill_tokens + g(j)`` tokens and runs no pass of its own. Cached prefix tokens
occupy blocks like any others (sharing between requests is not modelled: conservative on memory).

Static batching (``policy == 1``)
---------------------------------
When no batch is in progress and requests wait, a batch is formed from the queue head: up to
``max_seqs`` requests while the pool holds their whole reservations (``preempt`` is ignored). The batch
is prefilled (steps of ``token_budget`` prefill tokens, chunked as above, no decodes), each member's first
token emitted at the end of the step that completes its prefill; then it is decoded for as many steps as
its longest member has passes, every member counting as a decoding sequence throughout (finished ones as
padding). All members finish, and their blocks return, at the end of the batch's last step.

Policy hooks (``params_int``)
-----------------------------
Continuous policies differ from the rules above at three points; :mod:`mcsim.perf.policies` names them.

- ``order == ORDER_KEY``: the waiting queue is a binary heap on ``(queue_key[r], rank of arrival)``: the
  lowest key is the head (admission still never skips it), FCFS among equal keys; a preempted request goes
  back under its own key and rank instead of to the head.
- ``mixing == MIXING_EXCLUSIVE``: a step is prefill only (the whole ``token_budget``, no decodes) when a
  running sequence has prefill left or the queue head can be admitted, else decode only (no admission). The
  decoding sequences do not advance in a prefill step, so the timing wheels run on a *decode clock* that
  counts the steps that run the decodes (in mixed steps it is the step index). A decode step whose KV growth
  preempts every decoding sequence is not run; the next step prefills them again.
- ``max_new > 0``: step 4 admits at most ``max_new`` requests.

Arrivals
--------
Open loop (``closed_users == 0``): request ``r`` arrives at ``arrival_s[r]`` (sorted). Closed loop with
``U = closed_users`` users: requests ``0 .. U-1`` arrive at ``arrival_s[r]`` (any order; zeros for "all
at t = 0"), and request ``r >= U`` -- the next request of the user of request ``r - U`` -- arrives
``think_s[r]`` seconds after request ``r - U`` finishes. So at most ``U`` requests are in the system.

Measured window and statistics
------------------------------
The window runs from ``warmup_s`` to the start of the step at which the last request has arrived
(``window_end_s``). Over the steps inside it the kernel integrates the number of requests in the system
(waiting + running, as the scheduler sees them at each step's start) over time, and sums step times and
decode batch sizes. ``out_stats`` holds, at the ``STAT_*`` indices: steps, preemptions, window end (s),
in-system integral (request-seconds), steps in the window, their summed step time (s), summed decoding
sequences over the window's steps that decode, the number of such steps, waiting requests at the window
end, the time the last step ended (s), and a status (0 = ok, 1 = a step with nothing to run, which a
validated input never produces).

Cost
----
Both policies run in one step loop (:func:`_step_loop`), which branches on the policy's integer code where
they differ; the inline pieces it shares live in :mod:`mcsim.kernels.batching_helpers`. A static batch's
decode steps have a short path of their own (nothing to build; most static steps are these).
Per-sequence progress is implicit: every decoding sequence advances one pass per step, so a sequence
that starts decoding after step ``s`` with ``R`` passes left finishes at step ``s + R`` and is filed
under that step in a timing wheel (a ring of per-step doubly linked lists); likewise the next step at
which it needs a KV block. A step costs O(1 + finishing + block growths + prefill chunks), not O(running).
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel
from mcsim.kernels.batching_helpers import (  # noqa: F401  (constants re-exported: callers read them here)
    _DECODING, _DONE, _HEAP_SIZE, _PREFILLING, _QUEUE_HEAD, _QUEUE_LEN, _RELEASED, _WAITING, N_PARAMS, N_STATS,
    P_BLOCK_TOKENS, P_CHUNK_TOKENS, P_CLOSED_USERS, P_KV_BLOCKS, P_MAX_SEQS, P_POLICY, P_PREEMPT, P_TOKEN_BUDGET,
    P_VERIFY_TOKENS, POLICY_CONTINUOUS, POLICY_STATIC, P_ORDER, P_MIXING, P_MAX_NEW, ORDER_FCFS, ORDER_KEY,
    MIXING_MIXED, MIXING_EXCLUSIVE, _keyed_push, _queue_head, _queue_pop, STAT_END_S, STAT_IN_SYSTEM_INTEGRAL, STAT_PREEMPTIONS,
    STAT_STATUS, STAT_STEPS, STAT_WAITING_AT_WINDOW_END, STAT_WINDOW_DECODE_SEQS_SUM, STAT_WINDOW_DECODE_STEPS,
    STAT_WINDOW_END_S, STAT_WINDOW_STEP_S_SUM, STAT_WINDOW_STEPS, _heap_push, _kv_rate, _next_arrival,
    _next_block_step, _queue_pop_front, _queue_push_front, _record_step, _release, _schedule_follower,
    _store_window, _tokens_after, _wheel_remove, kv_slope_at, prefill_chunk, step_time, unlink_running,
)


@kernel
def simulate(arrival_s, prefill_tokens, context_tokens, output_tokens, passes, think_s, queue_key, params_int, warmup_s,
             step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, out_arrival_s, out_first_token_s, out_finish_s,
             out_queue_s, out_stats, dump_start_s, dump_decode_seqs, dump_prefill_tokens, dump_step_s,
             dump_waiting):
    """Simulate one serving instance under continuous or static batching (rules in the module docstring).

    Parameters
    ----------
    arrival_s : float64[n]
        Arrival times, s: all of them in an open loop (sorted), only the first ``closed_users`` in a
        closed loop.
    prefill_tokens : int64[n]
        Tokens to compute in prefill (uncached prompt tokens, >= 1).
    context_tokens : int64[n]
        Full prompt length, tokens (>= prefill_tokens); sets the KV footprint.
    output_tokens : int64[n]
        Tokens generated (>= 1), the first one by prefill.
    passes : int64[n]
        Decode passes after the first token (0 iff output_tokens == 1; output_tokens - 1 without
        speculative decoding, fewer with it).
    think_s : float64[n]
        Closed loop: request ``r >= closed_users`` arrives ``think_s[r]`` s after request
        ``r - closed_users`` finishes. Unused in an open loop.
    queue_key : int64[n]
        Order of a keyed waiting queue (``order == ORDER_KEY``): lower first, ties by arrival. Unused in FCFS.
    params_int : int64[N_PARAMS]
        At the ``P_*`` indices: token_budget (tokens per step), max_seqs, kv_blocks, block_tokens,
        chunk_tokens (0 = no cap), verify_tokens (tokens per decoding sequence per step), policy
        (``POLICY_CONTINUOUS`` or ``POLICY_STATIC``), preempt (0 or 1), closed_users (0 = open loop), order
        (``ORDER_FCFS`` or ``ORDER_KEY``), mixing (``MIXING_MIXED`` or ``MIXING_EXCLUSIVE``), max_new (sequences
        admitted per step at most, 0 = no cap; continuous policies only).
    warmup_s : float
        Start of the measured window, s.
    step_time_table : float64[n_decode_edges, n_prefill_edges]
        Step time, s, at each (decoding sequences, prefill tokens) edge pair.
    decode_edges, prefill_edges : float64[:]
        Strictly increasing grid of the table (sequences; tokens).
    kv_slope : float64[n_decode_edges]
        Seconds one more KV token of a decoding sequence adds to a step, at each decode edge (0: the table
        alone).
    kv_ref_context : float
        KV length per decoding sequence at which the table was computed, tokens.
    out_arrival_s, out_first_token_s, out_finish_s, out_queue_s : float64[n]
        Filled with each request's arrival, first-token and finish times (s) and its wait from arrival to
        first admission (s).
    out_stats : float64[N_STATS]
        Filled with the run's statistics at the ``STAT_*`` indices.
    dump_start_s, dump_decode_seqs, dump_prefill_tokens, dump_step_s, dump_waiting : arrays[max_steps]
        Per-step record of the first ``max_steps`` steps (float64 start time, int64 decoding sequences,
        int64 prefill tokens, float64 step time, int64 waiting requests after admission); pass
        zero-length arrays to record nothing.

    Examples
    --------
    >>> import numpy as np
    >>> one = np.ones(1, np.int64); out = [np.zeros(1) for _ in range(4)]; stats = np.zeros(N_STATS)
    >>> params = np.array([8192, 8, 100, 16, 0, 1, 0, 0, 0, 0, 0, 0], np.int64)
    >>> table = np.array([[0.01, 0.01], [0.01, 0.01]]); edges = np.array([0.0, 1.0])
    >>> none_f, none_i = np.zeros(0), np.zeros(0, np.int64)
    >>> simulate(np.zeros(1), 10 * one, 10 * one, 3 * one, 2 * one, np.zeros(1), 0 * one, params, 0.0, table, edges,
    ...          edges, np.zeros(2), 0.0, *out, stats, none_f, none_i, none_i, none_f, none_i)
    >>> round(float(out[2][0]), 6)  # finish: one prefill step and two decode steps
    0.03
    """
    n = arrival_s.shape[0]
    closed_users = params_int[P_CLOSED_USERS]
    closed = closed_users > 0
    out_stats[:] = 0.0
    out_stats[STAT_WINDOW_END_S] = np.nan
    out_first_token_s[:] = np.nan
    out_finish_s[:] = np.nan
    out_queue_s[:] = np.nan
    state = np.zeros(5, np.int64)
    heap_t = np.empty(max(closed_users, 1))
    heap_r = np.empty(max(closed_users, 1), np.int64)
    if closed:
        out_arrival_s[:] = np.nan
        for r in range(min(closed_users, n)):
            out_arrival_s[r] = arrival_s[r]
            _heap_push(heap_t, heap_r, state, arrival_s[r], r)
    else:
        out_arrival_s[:] = arrival_s
    _step_loop(out_arrival_s, prefill_tokens, context_tokens, output_tokens, passes, think_s, queue_key, params_int,
               warmup_s,
               step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, out_arrival_s,
               out_first_token_s, out_finish_s, out_queue_s, out_stats, dump_start_s, dump_decode_seqs,
               dump_prefill_tokens, dump_step_s, dump_waiting, state, heap_t, heap_r)


@kernel(inline="always")
def _finish_batch(batch, size, req_state, held, out_finish_s, t_end, closed, out_arrival_s, think_s, closed_users,
                  heap_t, heap_r, state, next_arrival):
    """Static batching: every member finishes, and returns its blocks, at the end of the batch's last step.

    Returns the time of the next arrival not yet released.
    """
    for i in range(size):
        r = batch[i]
        req_state[r] = _DONE
        held[r] = 0
        out_finish_s[r] = t_end
        if closed:
            next_arrival = _schedule_follower(r, t_end, out_arrival_s, think_s, closed_users, heap_t, heap_r, state)
    return next_arrival


@kernel
def _static_decode_steps(t, step, decode_left, decode_seqs, n_running, in_system, next_arrival, step_s0, slope, kv_sum,
                         kv_rate, kv_ref_context, track_kv, by_passes, passes, output_tokens, n, warmup_s,
                         in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                         window_decode_steps, dump_start_s, dump_decode_seqs, dump_prefill_tokens, dump_step_s,
                         dump_waiting, arrival_s, closed, heap_t, heap_r, state, queue, req_state, out_stats, keyed,
                         queue_key, tie):
    """Static batching: the ``decode_left`` decode steps of the batch, from ``t`` (the loop's hook for them).

    Arrivals during the batch join the queue. Returns the end of the last step, the step count, the next arrival
    and the window's accumulators, updated.
    """
    dump_cap = dump_start_s.shape[0]
    decode_steps_done = 0
    next_to_stop = 0  # members by their passes: a member's KV grows until its last pass, then it pads the batch
    while track_kv and next_to_stop < n_running and passes[by_passes[next_to_stop]] == 0:
        next_to_stop += 1
    t_end = t
    while True:
        step_s = step_s0
        if track_kv:
            if slope != 0.0:
                step_s = max(step_s + slope * (kv_sum - decode_seqs * kv_ref_context), 1e-12)
            kv_sum += kv_rate
        t_end = t + step_s
        if step < dump_cap:
            _record_step(step, t, decode_seqs, 0, step_s, state[_QUEUE_LEN], dump_start_s, dump_decode_seqs,
                         dump_prefill_tokens, dump_step_s, dump_waiting)
        if state[_RELEASED] < n:  # the step starts inside the arrival window
            if t_end > warmup_s:
                in_system_integral += in_system * (t_end - max(t, warmup_s))
            if t >= warmup_s:
                window_steps += 1
                window_step_s_sum += step_s
                window_decode_seqs_sum += decode_seqs
                window_decode_steps += 1
        decode_left -= 1
        if track_kv:
            decode_steps_done += 1
            while next_to_stop < n_running and passes[by_passes[next_to_stop]] == decode_steps_done:
                kv_rate -= _kv_rate(output_tokens[by_passes[next_to_stop]], passes[by_passes[next_to_stop]])
                next_to_stop += 1
        step += 1
        if decode_left == 0:
            break
        t = t_end
        if next_arrival <= t:
            next_arrival = _release(t, arrival_s, closed, heap_t, heap_r, state, queue, req_state, out_stats, keyed,
                                    queue_key, tie)
            in_system = state[_QUEUE_LEN] + n_running
    return (t_end, step, next_arrival, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
            window_decode_steps)


@kernel
def _step_loop(arrival_s, prefill_tokens, context_tokens, output_tokens, passes, think_s, queue_key, params_int,
               warmup_s,
               step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, out_arrival_s,
               out_first_token_s, out_finish_s, out_queue_s, out_stats, dump_start_s, dump_decode_seqs,
               dump_prefill_tokens, dump_step_s, dump_waiting, state, heap_t, heap_r):
    """The one step loop of every policy (arguments as :func:`simulate`, plus the arrival state it prepared).

    Where policies differ the loop branches on their integer codes, which are loop-invariant. Helpers that
    take arrays are kept off the per-step path or written out inline: every call passing an array costs
    atomic reference-count updates, which dominated the step cost before.
    """
    n = arrival_s.shape[0]
    token_budget = params_int[P_TOKEN_BUDGET]
    max_seqs = params_int[P_MAX_SEQS]
    block_tokens = params_int[P_BLOCK_TOKENS]
    chunk_tokens = params_int[P_CHUNK_TOKENS]
    verify_tokens = params_int[P_VERIFY_TOKENS]
    static = params_int[P_POLICY] == POLICY_STATIC
    preempt = params_int[P_PREEMPT] != 0 and not static  # a static batch reserves whole requests
    keyed = params_int[P_ORDER] == ORDER_KEY and not static  # static batches form first come, first served
    exclusive = params_int[P_MIXING] == MIXING_EXCLUSIVE and not static
    max_new = params_int[P_MAX_NEW] if params_int[P_MAX_NEW] > 0 and not static else n + 1
    tie = np.empty(n if keyed else 1, np.int64)  # keyed queue: rank of arrival, for FCFS among equal keys
    closed_users = params_int[P_CLOSED_USERS]
    closed = closed_users > 0

    queue = np.empty(n, np.int64)
    req_state = np.zeros(n, np.int8)
    prefill_left = np.zeros(n, np.int64)
    chunk = np.zeros(n, np.int64)
    # Arrays that a policy never reads have one element: allocating and touching n-long arrays costs more than a
    # static run's whole decode phase.
    n_cont = 1 if static else n  # read by continuous policies only
    n_pre = n if preempt else 1  # read with preemption only
    passes_done = np.zeros(n_cont, np.int64)  # passes run before the current decode stretch began
    decode_start = np.zeros(n_cont, np.int64)  # step of the current decode stretch's first pass
    held = np.zeros(n, np.int64)
    first_done = np.zeros(n, np.bool_)
    admitted_once = np.zeros(n_cont, np.bool_)
    stamp = np.zeros(n_cont, np.int64)
    # Running sequences in admission order (doubly linked), needed only to pick preemption victims.
    run_prev = np.full(n_pre, -1, np.int64)
    run_next = np.full(n_pre, -1, np.int64)
    run_tail = -1
    # Sequences admitted with prefill left, in admission order (ring buffer).
    pf_cap = max(1, min(max_seqs, n))
    pf = np.empty(pf_cap, np.int64)
    survivors = np.empty(pf_cap, np.int64)
    pf_head = 0
    pf_len = 0
    # Timing wheels: per step, the sequences finishing at its end and those needing a block at its start.
    max_passes = 0
    for r in range(n):
        max_passes = max(max_passes, passes[r])
    wheel = 1
    while wheel < max_passes + 2:
        wheel <<= 1
    mask = wheel - 1
    finish_head = np.full(wheel, -1, np.int64)
    f_next = np.full(n_cont, -1, np.int64)
    f_prev = np.full(n_cont, -1, np.int64)
    f_step = np.full(n_cont, -1, np.int64)
    block_head = np.full(wheel if preempt else 1, -1, np.int64)
    b_next = np.full(n_pre, -1, np.int64)
    b_prev = np.full(n_pre, -1, np.int64)
    b_step = np.full(n_pre, -1, np.int64)
    growing = np.empty(pf_cap, np.int64)
    # Static batching: the batch in admission order, and its members in order of their passes (a member's KV
    # grows until its last pass, then it pads the batch).
    batch = np.empty(pf_cap if static else 1, np.int64)
    by_passes = np.empty(batch.shape[0], np.int64)
    member_passes = np.empty(batch.shape[0], np.int64)
    decode_left = -1  # decode steps left in the static batch; -1 while it prefills
    static_step_s = 0.0  # the static batch's decode step time before its KV term, and its KV slope
    static_slope = 0.0
    track_kv = False  # the static batch's KV is followed only when it costs something
    for e in range(kv_slope.shape[0]):
        track_kv = track_kv or kv_slope[e] != 0.0

    free_blocks = params_int[P_KV_BLOCKS]
    n_running = 0
    n_decoding = 0
    kv_sum = 0.0  # summed KV length of the decoding sequences at this step's pass
    kv_rate = 0.0  # KV tokens that one pass of every decoding sequence adds
    admissions = 0
    preemptions = 0
    step = 0
    dclock = 0  # decode steps run (every step but an exclusive prefill step): the timing wheels' clock
    # Decode-only steps are most steps: their times are looked up, not interpolated.
    decode_only_s = np.empty(max_seqs + 1 if max_seqs < n else n + 1)
    slope_of = np.empty(decode_only_s.shape[0])  # seconds per KV token at d decoding sequences
    for d in range(decode_only_s.shape[0]):
        decode_only_s[d] = step_time(step_time_table, decode_edges, prefill_edges, d, 0)
        slope_of[d] = kv_slope_at(kv_slope, decode_edges, d)
    dump_cap = dump_start_s.shape[0]
    in_system_integral = 0.0
    window_steps = 0
    window_step_s_sum = 0.0
    window_decode_seqs_sum = 0
    window_decode_steps = 0
    t = -np.inf
    next_arrival = _next_arrival(arrival_s, closed, heap_t, state)
    while True:
        if next_arrival <= t:
            next_arrival = _release(t, arrival_s, closed, heap_t, heap_r, state, queue, req_state, out_stats, keyed,
                                    queue_key, tie)
        if n_running == 0 and state[_QUEUE_LEN] == 0:
            if next_arrival == np.inf:
                break
            t = next_arrival
            continue
        in_system = state[_QUEUE_LEN] + n_running

        if static and decode_left > 0:
            # The static batch's decode steps run in a function of their own: nothing to build, the step time
            # fixed but for the KV term. Most static steps are these, and in the general loop (whose many live
            # variables spill) they cost about twice as much.
            (t_end, step, next_arrival, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
             window_decode_steps) = _static_decode_steps(
                t, step, decode_left, n_decoding, n_running, in_system, next_arrival, static_step_s, static_slope,
                kv_sum, kv_rate, kv_ref_context, track_kv, by_passes, passes, output_tokens, n, warmup_s,
                in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum, window_decode_steps,
                dump_start_s, dump_decode_seqs, dump_prefill_tokens, dump_step_s, dump_waiting, arrival_s, closed,
                heap_t, heap_r, state, queue, req_state, out_stats, keyed, queue_key, tie)
            decode_left = -1
            next_arrival = _finish_batch(batch, n_running, req_state, held, out_finish_s, t_end, closed,
                                         out_arrival_s, think_s, closed_users, heap_t, heap_r, state, next_arrival)
            free_blocks = params_int[P_KV_BLOCKS]
            n_running = 0
            n_decoding = 0
            kv_sum = 0.0
            kv_rate = 0.0
            t = t_end
            continue

        # Exclusive prefill: the step is prefill only when there is prefill to do (a sequence with prefill left,
        # or a waiting request that can be admitted), else decode only.
        prefill_step = False
        if exclusive:
            if pf_len > 0:
                prefill_step = True
            elif state[_QUEUE_LEN] > 0 and n_running < max_seqs:
                r = _queue_head(queue, keyed, state)
                if preempt:
                    tokens = context_tokens[r] + _tokens_after(output_tokens[r], passes[r], passes_done[r])
                else:
                    tokens = context_tokens[r] + output_tokens[r]
                prefill_step = (tokens + block_tokens - 1) // block_tokens <= free_blocks

        preempted = False
        if preempt and not prefill_step:
            slot = dclock & mask
            m = 0
            r = block_head[slot]
            while r >= 0:
                growing[m] = r
                m += 1
                b_step[r] = -1
                r = b_next[r]
            block_head[slot] = -1
            for i in range(1, m):  # oldest admission first
                r = growing[i]
                j = i - 1
                while j >= 0 and stamp[growing[j]] > stamp[r]:
                    growing[j + 1] = growing[j]
                    j -= 1
                growing[j + 1] = r
            for i in range(m):
                r = growing[i]
                if req_state[r] != _DECODING:
                    continue
                this_pass = passes_done[r] + (dclock - decode_start[r]) + 1
                tokens = context_tokens[r] + _tokens_after(output_tokens[r], passes[r], this_pass)
                need = (tokens + block_tokens - 1) // block_tokens - held[r]
                while free_blocks < need:
                    victim = run_tail
                    run_tail = run_prev[victim]
                    if run_tail >= 0:
                        run_next[run_tail] = -1
                    if req_state[victim] == _DECODING:
                        passes_done[victim] += dclock - decode_start[victim]
                        _wheel_remove(finish_head, f_next, f_prev, f_step, victim, mask)
                        _wheel_remove(block_head, b_next, b_prev, b_step, victim, mask)
                        n_decoding -= 1
                        rate = _kv_rate(output_tokens[victim], passes[victim])
                        kv_sum -= context_tokens[victim] + 1 + passes_done[victim] * rate
                        kv_rate -= rate
                    else:  # the newest running sequence still prefilling is the prefill ring's tail
                        pf_len -= 1
                    free_blocks += held[victim]
                    held[victim] = 0
                    req_state[victim] = _WAITING
                    if keyed:  # back in the queue under its own key and rank of arrival
                        _keyed_push(queue, queue_key, tie, state, victim)
                    else:  # back at the head
                        _queue_push_front(queue, state, victim)
                    n_running -= 1
                    preemptions += 1
                    preempted = True
                    if victim == r:
                        break
                if req_state[r] == _DECODING:
                    free_blocks -= need
                    held[r] += need
                    grow = _next_block_step(context_tokens[r], output_tokens[r], passes[r], block_tokens, held[r],
                                            passes_done[r], decode_start[r])
                    if grow >= 0:
                        b_step[r] = grow  # file under step grow (inline: helper calls cost reference counts)
                        b_prev[r] = -1
                        b_next[r] = block_head[b_step[r] & mask]
                        if b_next[r] >= 0:
                            b_prev[b_next[r]] = r
                        block_head[b_step[r] & mask] = r

        if static and n_running == 0:
            # A new static batch: from the queue head while the pool holds whole reservations (no budget cap:
            # the batch's prefill spreads over as many steps as it needs).
            while state[_QUEUE_LEN] > 0 and n_running < max_seqs:
                r = queue[state[_QUEUE_HEAD]]  # (the FCFS queue's own operations: they keep this loop small)
                need = (context_tokens[r] + output_tokens[r] + block_tokens - 1) // block_tokens
                if need > free_blocks:
                    break
                _queue_pop_front(queue, state)
                free_blocks -= need
                held[r] = need
                out_queue_s[r] = t - arrival_s[r]
                req_state[r] = _PREFILLING
                prefill_left[r] = prefill_tokens[r]
                batch[n_running] = r
                n_running += 1
                pf[(pf_head + pf_len) % pf_cap] = r
                pf_len += 1
            decode_left = -1

        if prefill_step:  # the decoding sequences wait
            decode_seqs = 0
            budget_left = token_budget
        else:
            decode_seqs = n_decoding
            budget_left = 0 if exclusive else max(0, token_budget - decode_seqs * verify_tokens)
        prefill = 0
        touched = 0
        while budget_left > 0 and touched < pf_len:
            r = pf[(pf_head + touched) % pf_cap]
            c = prefill_chunk(prefill_left[r], budget_left, chunk_tokens)
            chunk[r] = c
            prefill += c
            budget_left -= c
            touched += 1
        if not preempted and not static:
            admitted = 0
            while budget_left > 0 and state[_QUEUE_LEN] > 0 and n_running < max_seqs and admitted < max_new:
                r = _queue_head(queue, keyed, state)
                if preempt:
                    tokens = context_tokens[r] + _tokens_after(output_tokens[r], passes[r], passes_done[r])
                else:
                    tokens = context_tokens[r] + output_tokens[r]
                need = (tokens + block_tokens - 1) // block_tokens
                if need > free_blocks:
                    break
                _queue_pop(queue, keyed, queue_key, tie, state)
                free_blocks -= need
                held[r] = need
                req_state[r] = _PREFILLING
                prefill_left[r] = prefill_tokens[r]
                if first_done[r]:  # recompute after preemption: prompt and the output produced so far
                    prefill_left[r] += _tokens_after(output_tokens[r], passes[r], passes_done[r])
                if not admitted_once[r]:
                    admitted_once[r] = True
                    out_queue_s[r] = t - arrival_s[r]
                stamp[r] = admissions
                admissions += 1
                admitted += 1
                if preempt:
                    run_prev[r] = run_tail
                    run_next[r] = -1
                    if run_tail >= 0:
                        run_next[run_tail] = r
                    run_tail = r
                n_running += 1
                pf[(pf_head + pf_len) % pf_cap] = r
                pf_len += 1
                c = prefill_chunk(prefill_left[r], budget_left, chunk_tokens)
                chunk[r] = c
                prefill += c
                budget_left -= c
                touched += 1
        if decode_seqs == 0 and prefill == 0:
            if exclusive:  # every decoding sequence was preempted: the next step prefills them again
                continue
            out_stats[STAT_STATUS] = 1
            break
        # The decode clock (which the timing wheels run on) advances at each step that runs the decodes: every
        # step but an exclusive prefill step.
        advance = 1 if decode_seqs > 0 or not exclusive else 0

        if prefill == 0 and decode_seqs < decode_only_s.shape[0]:
            step_s = decode_only_s[decode_seqs]
        else:
            step_s = step_time(step_time_table, decode_edges, prefill_edges, decode_seqs, prefill)
        if decode_seqs > 0:
            slope = slope_of[decode_seqs] if decode_seqs < slope_of.shape[0] else \
                kv_slope_at(kv_slope, decode_edges, decode_seqs)
            if slope != 0.0:
                step_s = max(step_s + slope * (kv_sum - decode_seqs * kv_ref_context), 1e-12)
            kv_sum += kv_rate  # every decoding sequence ran its pass
        t_end = t + step_s
        if step < dump_cap:
            _record_step(step, t, decode_seqs, prefill, step_s, state[_QUEUE_LEN], dump_start_s, dump_decode_seqs,
                         dump_prefill_tokens, dump_step_s, dump_waiting)
        if state[_RELEASED] < n:  # the step starts inside the arrival window
            if t_end > warmup_s:
                in_system_integral += in_system * (t_end - max(t, warmup_s))
            if t >= warmup_s:
                window_steps += 1
                window_step_s_sum += step_s
                if decode_seqs > 0:
                    window_decode_seqs_sum += decode_seqs
                    window_decode_steps += 1

        # Prefill progress; sequences whose prefill completes leave the ring, the others keep their order.
        if touched > 0:  # (most steps are decode-only)
            n_survivors = 0
            for i in range(touched):
                r = pf[(pf_head + i) % pf_cap]
                prefill_left[r] -= chunk[r]
                if prefill_left[r] > 0:
                    survivors[n_survivors] = r
                    n_survivors += 1
                    continue
                if not first_done[r]:
                    first_done[r] = True
                    out_first_token_s[r] = t_end
                if static:  # members decode together once the whole batch is prefilled
                    continue
                passes_left = passes[r] - passes_done[r]
                if passes_left == 0:
                    req_state[r] = _DONE
                    free_blocks += held[r]
                    held[r] = 0
                    n_running -= 1
                    if preempt:
                        run_tail = unlink_running(run_prev, run_next, run_tail, r)
                    out_finish_s[r] = t_end
                    if closed:
                        next_arrival = _schedule_follower(r, t_end, out_arrival_s, think_s, closed_users, heap_t, heap_r,
                                                          state)
                    continue
                req_state[r] = _DECODING
                n_decoding += 1
                rate = _kv_rate(output_tokens[r], passes[r])
                kv_sum += context_tokens[r] + 1 + passes_done[r] * rate
                kv_rate += rate
                decode_start[r] = dclock + advance
                f_step[r] = decode_start[r] + passes_left - 1  # file under its last pass (inline: helper calls cost
                # reference counts)
                f_prev[r] = -1
                f_next[r] = finish_head[f_step[r] & mask]
                if f_next[r] >= 0:
                    f_prev[f_next[r]] = r
                finish_head[f_step[r] & mask] = r
                if preempt:
                    grow = _next_block_step(context_tokens[r], output_tokens[r], passes[r], block_tokens, held[r],
                                            passes_done[r], decode_start[r])
                    if grow >= 0:
                        b_step[r] = grow  # file under step grow (inline: helper calls cost reference counts)
                        b_prev[r] = -1
                        b_next[r] = block_head[b_step[r] & mask]
                        if b_next[r] >= 0:
                            b_prev[b_next[r]] = r
                        block_head[b_step[r] & mask] = r
            pf_head = (pf_head + touched - n_survivors) % pf_cap
            for i in range(n_survivors):
                pf[(pf_head + i) % pf_cap] = survivors[i]
            pf_len -= touched - n_survivors

        if static:  # a prefill step of a static batch (its decode steps take the short path above)
            if pf_len == 0:  # the whole batch is prefilled: it decodes for its longest member's passes
                decode_left = 0
                for i in range(n_running):
                    decode_left = max(decode_left, passes[batch[i]])
                n_decoding = n_running
                static_step_s = decode_only_s[n_running]
                static_slope = slope_of[n_running]
                if track_kv:
                    kv_sum = 0.0
                    kv_rate = 0.0
                    for i in range(n_running):
                        r = batch[i]
                        kv_sum += context_tokens[r] + 1
                        kv_rate += _kv_rate(output_tokens[r], passes[r])
                        member_passes[i] = passes[r]
                    order = np.argsort(member_passes[:n_running], kind="mergesort")
                    for i in range(n_running):
                        by_passes[i] = batch[order[i]]
                if decode_left == 0:  # single-token outputs only: the batch ends with its prefill
                    next_arrival = _finish_batch(batch, n_running, req_state, held, out_finish_s, t_end, closed,
                                                 out_arrival_s, think_s, closed_users, heap_t, heap_r, state,
                                                 next_arrival)
                    free_blocks = params_int[P_KV_BLOCKS]
                    n_running = 0
                    n_decoding = 0
            step += 1
            t = t_end
            continue

        # Sequences whose last pass ran in this step.
        slot = dclock & mask
        r = finish_head[slot] if advance else -1
        while r >= 0:
            following = f_next[r]
            f_step[r] = -1
            req_state[r] = _DONE
            free_blocks += held[r]
            held[r] = 0
            n_running -= 1
            n_decoding -= 1
            kv_sum -= context_tokens[r] + output_tokens[r]  # context + 1 + passes x (output - 1) / passes
            kv_rate -= _kv_rate(output_tokens[r], passes[r])
            if preempt:  # no block growth is pending: the last one was at the start of this step
                run_tail = unlink_running(run_prev, run_next, run_tail, r)
            out_finish_s[r] = t_end
            if closed:
                next_arrival = _schedule_follower(r, t_end, out_arrival_s, think_s, closed_users, heap_t, heap_r,
                                                  state)
            r = following
        if advance:
            finish_head[slot] = -1
            dclock += 1
        if n_decoding == 0:  # no rounding carried from one busy period to the next
            kv_sum = 0.0
            kv_rate = 0.0
        step += 1
        t = t_end
    out_stats[STAT_PREEMPTIONS] = preemptions
    _store_window(out_stats, in_system_integral, window_steps, window_step_s_sum, window_decode_seqs_sum,
                  window_decode_steps, step, t)


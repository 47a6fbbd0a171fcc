"""Several replicas of one pool on one clock behind a global router: a step-level simulator of the fleet.

Each of ``K`` instances runs the continuous-batching scheduler of :mod:`mcsim.kernels.batching` in its
simplest form -- FCFS waiting queue, mixed prefill/decode steps, whole-request KV reservation at admission
and therefore no preemption, open-loop arrivals -- with the same step-time table. What is new is that the
instances share one clock and every arrival is placed by a router that looks at their *current* state.

Event order
-----------
Arrivals are processed in order of (arrival time, index). Before request ``r`` arriving at ``t`` is routed,
every instance runs each of its steps that *starts* before ``t`` (a step that starts at ``t`` or later sees
the arrival, as arrivals at or before a step's start join its queue in the one-instance simulator). Then
the router picks an instance from the state the instances have at ``t``:

- ``ROUTER_ROUND_ROBIN``: instance ``r mod K``;
- ``ROUTER_RANDOM``: instance ``floor(u[r] * K)`` for a uniform ``u[r]`` in [0, 1) drawn by the caller;
- ``ROUTER_LEAST_OUTSTANDING``: fewest requests in flight (waiting + running);
- ``ROUTER_LEAST_KV``: most free KV blocks.

Ties go to the lowest instance index. The request joins the tail of that instance's waiting queue; an idle
instance's clock jumps to the arrival (or stays at the end of its last step if that is later). After the
last arrival every instance drains.

Step of one instance (continuous, FCFS, mixed, no preemption)
-------------------------------------------------------------
1. Every decoding sequence runs one pass and costs ``verify_tokens`` of the ``token_budget``.
2. The remaining budget goes, in admission order, to running sequences whose prefill is unfinished, each
   ``min(prefill left, budget left, chunk_tokens)`` (``chunk_tokens == 0``: no cap); then requests are
   admitted from the queue head, without skipping, while budget is left, fewer than ``max_seqs`` run and the
   pool holds ``ceil((context + output) / block_tokens)`` blocks for the request; each gets its first chunk.
3. Step time: bilinear in ``step_time_table`` at (decoding sequences, prefill tokens), clamped, plus
   ``kv_slope(d) x (S - d x kv_ref_context)`` with ``S`` the summed KV length of the decoding sequences
   (``context + 1 + j x (output - 1) / P`` after ``j`` of ``P`` passes), summed afresh in admission order.
4. At the end of the step a completed prefill emits the first token (the request finishes there if it has
   no passes, else decodes from the next step); a sequence that ran its last pass finishes.

Cost: O(running) per step (the running set of one instance is at most ``max_seqs``), O(K) per arrival.
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel
from mcsim.kernels.batching_helpers import (
    P_BLOCK_TOKENS, P_CHUNK_TOKENS, P_KV_BLOCKS, P_MAX_SEQS, P_TOKEN_BUDGET, P_VERIFY_TOKENS, _kv_rate, kv_slope_at,
    prefill_chunk, step_time,
)

# Router codes (mcsim.perf.fleet_batching names them).
ROUTER_ROUND_ROBIN = 0
ROUTER_RANDOM = 1
ROUTER_LEAST_OUTSTANDING = 2
ROUTER_LEAST_KV = 3

# Return codes.
STATUS_OK = 0
STATUS_STALLED = 1  # a step with nothing to run (a validated input never produces one)


@kernel
def simulate_fleet(arrival_s, prefill_tokens, context_tokens, output_tokens, passes, router_uniform, params_int,
                   router, step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, out_instance,
                   out_first_token_s, out_finish_s, out_queue_s, out_instance_steps):
    """Simulate ``K`` instances behind a global router (rules in the module docstring).

    Parameters
    ----------
    arrival_s : float64[n]
        Arrival times, s, sorted.
    prefill_tokens, context_tokens, output_tokens, passes : int64[n]
        As in :func:`mcsim.kernels.batching.simulate`.
    router_uniform : float64[n]
        Uniforms in [0, 1), one per request, read by ``ROUTER_RANDOM`` only.
    params_int : int64[N_PARAMS]
        Read at ``P_TOKEN_BUDGET``, ``P_MAX_SEQS``, ``P_KV_BLOCKS`` (per instance), ``P_BLOCK_TOKENS``,
        ``P_CHUNK_TOKENS`` and ``P_VERIFY_TOKENS``; the other fields are not used.
    router : int
        A ``ROUTER_*`` code.
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context
        The step-time model, as in :func:`mcsim.kernels.batching.simulate`.
    out_instance : int64[n]
        Written: the instance each request was routed to.
    out_first_token_s, out_finish_s, out_queue_s : float64[n]
        Written: first-token time, finish time (s) and wait from arrival to admission (s).
    out_instance_steps : int64[K]
        Written: steps each instance ran; its length sets ``K``.

    Returns
    -------
    int
        ``STATUS_OK``, or ``STATUS_STALLED`` when a step had nothing to run.

    Examples
    --------
    >>> status = simulate_fleet(arrival, prefill, context, output, passes, u, params, ROUTER_RANDOM, table,
    ...                         decode_edges, prefill_edges, kv_slope, 0.0, instance, first, finish, queue,
    ...                         np.zeros(8, np.int64))  # doctest: +SKIP
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
    running = np.empty((k, max_seqs), dtype=np.int64)  # in admission order
    n_running = np.zeros(k, dtype=np.int64)
    prefill_left = np.zeros(n, dtype=np.int64)
    passes_done = np.zeros(n, dtype=np.int64)
    decoding = np.zeros(n, dtype=np.bool_)
    held = np.zeros(n, dtype=np.int64)
    chunk = np.zeros(n, dtype=np.int64)
    out_instance_steps[:] = 0

    for r in range(n + 1):
        t_next = arrival_s[r] if r < n else np.inf
        for i in range(k):
            while (n_running[i] > 0 or queue_len[i] > 0) and clock[i] < t_next:
                t = clock[i]
                decode_seqs = 0
                kv = 0.0
                for j in range(n_running[i]):
                    s = running[i, j]
                    chunk[s] = 0
                    if decoding[s]:
                        decode_seqs += 1
                        kv += context_tokens[s] + 1 + passes_done[s] * _kv_rate(output_tokens[s], passes[s])
                budget_left = max(0, token_budget - decode_seqs * verify_tokens)
                prefill = 0
                for j in range(n_running[i]):
                    if budget_left <= 0:
                        break
                    s = running[i, j]
                    if not decoding[s]:
                        c = prefill_chunk(prefill_left[s], budget_left, chunk_tokens)
                        chunk[s] = c
                        prefill += c
                        budget_left -= c
                while budget_left > 0 and queue_len[i] > 0 and n_running[i] < max_seqs:
                    s = queue_head[i]
                    need = (context_tokens[s] + output_tokens[s] + block_tokens - 1) // block_tokens
                    if need > free_blocks[i]:
                        break
                    queue_head[i] = queue_next[s]
                    queue_len[i] -= 1
                    if queue_len[i] == 0:
                        queue_tail[i] = -1
                    free_blocks[i] -= need
                    held[s] = need
                    prefill_left[s] = prefill_tokens[s]
                    out_queue_s[s] = t - arrival_s[s]
                    running[i, n_running[i]] = s
                    n_running[i] += 1
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
                out_instance_steps[i] += 1
                kept = 0
                for j in range(n_running[i]):
                    s = running[i, j]
                    done = False
                    if decoding[s]:
                        passes_done[s] += 1
                        done = passes_done[s] == passes[s]
                    elif chunk[s] > 0:
                        prefill_left[s] -= chunk[s]
                        if prefill_left[s] == 0:
                            out_first_token_s[s] = t_end
                            if passes[s] == 0:
                                done = True
                            else:
                                decoding[s] = True  # decodes from the next step
                    if done:
                        free_blocks[i] += held[s]
                        held[s] = 0
                        out_finish_s[s] = t_end
                    else:
                        running[i, kept] = s
                        kept += 1
                n_running[i] = kept
                clock[i] = t_end
        if r == n:
            break

        if router == ROUTER_ROUND_ROBIN:
            chosen = r % k
        elif router == ROUTER_RANDOM:
            chosen = min(int(router_uniform[r] * k), k - 1)
        elif router == ROUTER_LEAST_OUTSTANDING:
            chosen = 0
            for i in range(1, k):
                if queue_len[i] + n_running[i] < queue_len[chosen] + n_running[chosen]:
                    chosen = i
        else:
            chosen = 0
            for i in range(1, k):
                if free_blocks[i] > free_blocks[chosen]:
                    chosen = i
        out_instance[r] = chosen
        if n_running[chosen] == 0 and queue_len[chosen] == 0:
            clock[chosen] = max(clock[chosen], arrival_s[r])
        if queue_tail[chosen] >= 0:
            queue_next[queue_tail[chosen]] = r
        else:
            queue_head[chosen] = r
        queue_tail[chosen] = r
        queue_len[chosen] += 1
    return STATUS_OK

"""Reference for the batching simulators: replicas behind a global router as one plain event loop.

The one reference of :mod:`mcsim.kernels.step_loop` and, with one replica, of
:mod:`mcsim.kernels.step_loop` (:func:`mcsim.reference.batching.simulate_reference` is this loop with one
instance). The kernels' module docstrings state the rules; each instance's step is
:meth:`mcsim.reference.step_loop.Instance.step` (every policy of :mod:`mcsim.scenario.policies`: continuous
batching with mixed or exclusive steps, FCFS or keyed queues, a cap on admissions per step, whole-request KV
reservation or preemption by recompute, and static batching).

Written for obviousness and in a different shape from the kernels: one global loop repeatedly takes the
earliest event of the whole fleet -- the next step start of a busy instance (ties to the lower instance
index), or the next arrival (ties to the lower request index) -- and a step wins only when it starts strictly
before the arrival, so a request arriving at a step's start joins that step's queue. A closed loop's
follower enters the arrival heap when its user's previous request finishes.

Examples
--------
>>> table = {"step_time_table": [[0.25]], "decode_edges": [1.0], "prefill_edges": [0.0]}
>>> run = simulate_fleet_reference([0.0, 0.0], [10, 10], [10, 10], [2, 2], [1, 1], [0.0, 0.0], n_instances=2,
...                                router="round-robin", token_budget=64, max_seqs=4, kv_blocks=10,
...                                block_tokens=16, chunk_tokens=0, verify_tokens=1, **table)
>>> run["instance"], run["first_token_s"], run["finish_s"]
([0, 1], [0.25, 0.25], [0.5, 0.5])
"""

from __future__ import annotations

import dataclasses
import heapq
import math

from mcsim.scenario.choices import ROUTERS  # the names only; the rules are written out here
from mcsim.scenario.policies import POLICIES, Policy
from mcsim.reference.kv_tiers import SharedTiers, TieredCache
from mcsim.reference.step_loop import Instance, Request, Rules


def route(r, requests, fleet, router, *, router_uniform, fixed_instance, balance, balance_requests, caching):
    """The instance request ``r`` goes to, from the fleet's state at its arrival (ties to the lowest index)."""
    t = requests[r].arrival
    k = len(fleet)
    if router == "prefix-affinity":
        return fixed_instance[r]
    if router == "round-robin":
        return r % k
    if router == "random":
        return min(int(router_uniform[r] * k), k - 1)
    if router == "least-kv":
        free = [node.free_at(t) for node in fleet]
        return free.index(max(free))
    if router in ("least-outstanding", "pooled", "cache-aware"):
        loads = [node.load_at(t) for node in fleet]
        least = loads.index(min(loads))
        if router != "cache-aware" or not caching:
            return least
        if max(loads) - min(loads) > balance_requests and max(loads) > (1 + balance) * min(loads):
            return least  # imbalanced: the least loaded instance
        matched = [node.cache.prefix(requests[r].blocks) for node in fleet]
        return min(range(k), key=lambda i: (-matched[i], loads[i], i))
    raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")


def simulate_fleet_reference(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, router_uniform, *,
                             n_instances, router, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                             verify_tokens, step_time_table, decode_edges, prefill_edges, kv_slope=None,
                             kv_ref_context=0.0, block_lists=None, fixed_instance=None, capacity_blocks=(0, 0, 0),
                             pooled_tiers=0, balance=0.25, balance_requests=64, warmup_s=0.0, preempt=False, max_new_per_step=0,
                             policy="fcfs", priority=None, queue_key=None, keyed_tie="index", closed_users=0,
                             think_s=None, warmup_request=-1):
    """Simulate ``n_instances`` replicas behind a router, one fleet-wide event at a time.

    Parameters
    ----------
    arrival_s, prompt_tokens, context_tokens, output_tokens, passes, router_uniform : sequences, one per request
        As in :func:`mcsim.kernels.step_loop.simulate`: arrivals (a closed loop's first ``U``
        only), prompt tokens (the prefill is what the instance's prefix cache does not hold: all of them
        without a cache), KV context, output tokens, decode passes, and the uniforms of ``router="random"``.
    n_instances, router : int, str
        Replicas, and the router by name (one of :data:`~mcsim.perf.fleet_batching.ROUTERS`).
    token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens, verify_tokens : int
        Each instance's scheduler settings (``kv_blocks`` per instance).
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context
        The step-time model, as in :func:`mcsim.kernels.step_loop.simulate` (``kv_slope`` None: the table alone).
    block_lists, fixed_instance, capacity_blocks, balance, balance_requests : optional
        Prompt blocks per request; the instances ``prefix-affinity`` sends requests to; the prefix cache's
        capacity per tier in blocks (HBM 0: no cache; one pooled cache of ``n_instances`` times it under
        ``pooled``); cache-aware routing's relative and absolute imbalance thresholds.
    pooled_tiers : int
        How many of the last tiers are one pool every instance shares behind its own (their capacity the whole
        pool's); under ``pooled``, or with every tier pooled, the fleet has one cache (the own tiers
        ``n_instances`` times over, then the pool's).
    warmup_s, warmup_request : float, int
        Start of the measured window; ``warmup_request >= 0`` starts it at that request's arrival instead.
    preempt : bool
        KV grows with each pass and the newest running sequence is preempted (recomputed) when an instance's
        pool runs out (continuous policies only).
    max_new_per_step : int
        Admissions per step at most (0: the policy's own cap; continuous policies only).
    policy : str or Policy
        A policy of :data:`mcsim.scenario.policies.POLICIES` by name, or a :class:`~mcsim.scenario.policies.Policy`.
    priority, queue_key : sequences of int, optional
        A keyed queue's order, lowest key first: ``queue_key`` when given; else, by the policy's order, minus
        ``priority``, or the prompt tokens the instance's cache does not hold when the request joins its queue
        (at least 1).
    keyed_tie : {"index", "arrival"}
        A keyed queue's order among equal keys: the request index (the fleet kernel's rule) or the rank of
        arrival (the one-instance kernel's). The two differ only in a closed loop, where a later index can
        arrive first.
    closed_users, think_s : int, sequence of float
        A closed loop of ``U`` users: request ``r >= U`` arrives ``think_s[r]`` after request ``r - U`` finishes.

    Returns
    -------
    dict
        ``arrival_s`` (the arrivals that happened), ``instance``, ``first_token_s``, ``finish_s``, ``queue_s``
        (one per request), ``cached`` (per request, reused tokens per cache tier), ``instance_steps`` (one per
        instance), ``log`` (one ``(start_s, decode_seqs, prefill_tokens, step_s, waiting, instance)`` per
        step, in the order they ran) and ``stats``: the window's sums by the names of the kernels' ``STAT_*``
        in lower case, with ``window_end_s`` the last arrival (the fleet kernel's window end) and
        ``window_close_s`` the latest of the last arrival and the end of the steps that started before it
        (the one-instance kernel's window end).
    """
    n = len(arrival_s)
    if keyed_tie not in ("index", "arrival"):
        raise ValueError(f"keyed_tie must be 'index' or 'arrival', got {keyed_tie!r}")
    policy = POLICIES[policy] if isinstance(policy, str) else policy
    static = policy.admission == "static"
    rules = Rules(token_budget=int(token_budget), max_seqs=int(max_seqs), kv_blocks=int(kv_blocks),
                  block_tokens=int(block_tokens), chunk_tokens=int(chunk_tokens), verify_tokens=int(verify_tokens),
                  admission=policy.admission, order=policy.order, mixing=policy.mixing,
                  max_new=0 if static else int(max_new_per_step or policy.max_new_per_step),
                  preempt=bool(preempt) and not static,
                  table=[[float(x) for x in row] for row in step_time_table],
                  decode_edges=[float(e) for e in decode_edges], prefill_edges=[float(e) for e in prefill_edges],
                  kv_slope=None if kv_slope is None else [float(s) for s in kv_slope],
                  kv_ref_context=float(kv_ref_context))
    block_lists = [[] for _ in range(n)] if block_lists is None else [list(b) for b in block_lists]
    requests = [Request(r, float(arrival_s[r]), int(prompt_tokens[r]), block_lists[r], int(context_tokens[r]),
                        int(output_tokens[r]), int(passes[r])) for r in range(n)]
    caching = capacity_blocks[0] > 0
    own = len(capacity_blocks) - int(pooled_tiers)
    if router == "pooled" or own == 0:  # one cache of every instance's own tiers and the pool, shared
        shared = TieredCache([c * n_instances for c in capacity_blocks[:own]] + list(capacity_blocks[own:])) \
            if caching else None
        fleet = [Instance(rules, cache=shared) for _ in range(n_instances)]
    else:
        pool = SharedTiers(capacity_blocks[own:]) if own < len(capacity_blocks) else None
        fleet = [Instance(rules, cache=TieredCache(capacity_blocks[:own], pool) if caching else None)
                 for _ in range(n_instances)]

    instance = [-1] * n
    cached = [tuple(0 for _ in capacity_blocks)] * n
    first_token = [math.nan] * n
    finish = [math.nan] * n
    queue = [math.nan] * n
    log = []
    stats = dict(steps=0, preemptions=0, window_end_s=math.nan, window_close_s=math.nan, in_system_integral=0.0,
                 window_steps=0, window_step_s_sum=0.0, window_decode_seqs_sum=0, window_decode_steps=0,
                 waiting_at_window_end=0, end_s=-math.inf)
    window_start = math.inf if warmup_request >= 0 else warmup_s

    def key_of(q, node):
        """A new arrival's key in a keyed queue."""
        if queue_key is not None:
            return int(queue_key[q.index])
        if policy.order == "priority":
            return -int(priority[q.index])
        held = node.cache.prefix(q.blocks) * rules.block_tokens if node.cache is not None else 0
        return max(q.prompt - held, 1)

    def record(i, step, inside_window):
        """The step's effects on the requests, the closed loop and the window's sums."""
        stats["preemptions"] += step.preemptions
        if not step.ran:
            return
        t, t_end = step.start_s, step.end_s
        for q, reused in step.admitted:
            queue[q.index] = t - q.arrival
            if reused:
                cached[q.index] = reused
        for q in step.first_tokens:
            first_token[q.index] = t_end
        for q in step.finished:
            finish[q.index] = t_end
            follower = q.index + closed_users
            if closed_users and follower < n:  # the same user's next request
                requests[follower].arrival = t_end + float(think_s[follower])
                heapq.heappush(pending, (requests[follower].arrival, follower))
        log.append((t, step.decode_seqs, step.prefill_tokens, step.step_s, step.waiting, i))
        stats["steps"] += 1
        stats["end_s"] = max(stats["end_s"], t_end)
        if inside_window:  # the step starts before the last arrival
            start = max(t, window_start)
            if t_end > start:
                stats["in_system_integral"] += step.in_flight * (t_end - start)
            if t >= window_start:
                stats["window_steps"] += 1
                stats["window_step_s_sum"] += step.step_s
                if step.decode_seqs > 0:
                    stats["window_decode_seqs_sum"] += step.decode_seqs
                    stats["window_decode_steps"] += 1

    pending = [(float(arrival_s[r]), r) for r in range(min(closed_users, n) if closed_users else n)]
    heapq.heapify(pending)
    released = 0
    while True:
        busy = [i for i, node in enumerate(fleet) if node.busy()]
        next_arrival = pending[0][0] if pending else math.inf
        if busy:
            i = min(busy, key=lambda j: (fleet[j].clock, j))
            if fleet[i].clock < next_arrival:
                record(i, fleet[i].step(), released < n)
                continue
        if not pending:
            break
        _, r = heapq.heappop(pending)
        q = requests[r]
        if r == warmup_request:
            window_start = q.arrival
        chosen = route(r, requests, fleet, router, router_uniform=router_uniform, fixed_instance=fixed_instance,
                       balance=balance, balance_requests=balance_requests, caching=caching)
        node = fleet[chosen]
        instance[r] = chosen
        if not node.busy():
            node.clock = max(node.clock, q.arrival)
        q.tie = released if keyed_tie == "arrival" else r
        if rules.keyed:
            q.key = key_of(q, node)
        node.enqueue(q)
        released += 1
        if released == n:
            stats["waiting_at_window_end"] = sum(len(node.waiting) for node in fleet)
            stats["window_end_s"] = q.arrival
            stats["window_close_s"] = max(node.clock for node in fleet)
    return dict(arrival_s=[q.arrival for q in requests], instance=instance, first_token_s=first_token,
                finish_s=finish, queue_s=queue, cached=cached, instance_steps=[node.steps for node in fleet],
                log=log, stats=stats)


def policy_of(admission: str, order: str, mixing: str, max_new_per_step: int = 0) -> Policy:
    """A policy from its fields, for combinations the table does not name (the one-instance reference's
    arguments)."""
    return dataclasses.replace(POLICIES["fcfs"], name="reference", admission=admission, order=order, mixing=mixing,
                               max_new_per_step=int(max_new_per_step))

"""Latency under load from the step loop: one serving instance, or a fleet of ``K`` replicas of one pool on one
clock behind a global router.

The roofline (or any performance model) supplies step times as a table over (decoding sequences, prefill tokens in
the step). :func:`simulate_batching` replays a workload through the step loop (:mod:`mcsim.kernels.step_loop`,
whose docstring states every rule) with one instance, under any scheduler policy, and summarises per-request
latencies, throughput and queueing (:mod:`mcsim.perf.batching` states how a run is flagged saturated and how its
queue's steady state is judged). It is :func:`simulate_fleet_batching` with one instance, without the figures
only a fleet has: one wrapper validates the inputs and sets up the step loop for both.

:func:`simulate_fleet_batching` replays a workload through the same step loop with ``K`` instances: each arrival
is routed, from the instances' state at its arrival time, by one of :data:`ROUTERS` (entries of
:data:`ROUTER_TABLE`, which the loop reads as hooks), and every instance runs a scheduler policy of
:mod:`mcsim.scenario.policies` (continuous or static batching, mixed or exclusive prefill and decode, FCFS or keyed
queues, whole-request KV reservation or KV growth with preemption by recompute) with the same step-time table and,
when given one, its own tiered prefix cache (or a pooled one), looked up and filled as it admits requests. The
latency quantiles are over the requests of all instances; ``instance_load_imbalance`` is the largest number of
measured requests one instance served over the mean.

This is the ``deployment.fleet_simulation = "replicas"`` mode; the default, ``"representative"``, simulates
one instance that receives ``1/K`` of the arrivals (:func:`simulate_batching`) with hits from the cache stage's
replay in arrival order (:mod:`mcsim.stages.kvcache`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.kernels import batching_helpers as slots
from mcsim.kernels import step_loop as kernel
from mcsim.kernels.kv_tiers import MAX_TIERS, _workspace
from mcsim.scenario import policies
from mcsim.perf.batching import (_as_int, _per_request, _summary, base_params, check_arrivals, check_requests,
                                 check_step_model, queue_steady_state)
from mcsim.perf.fleet_memory import MAX_CACHE_ROWS, MAX_RUNNING_BYTES, refuse_over, replica_bytes  # noqa: F401
from mcsim.scenario.choices import (  # noqa: F401  (the names, read here by the pool simulator and its tests)
    DECODE_ROUTERS, FLEET_SIMULATIONS, REPLICA_KEYS, REPLICA_NEEDS, REPLICA_SCHEDULERS, REPRESENTATIVE_ROUTERS,
    ROUTERS, ROUTING_POLICIES, replica_mismatch,
)
from mcsim.stages.kvcache import first_block_instances
from mcsim.stages.kvcache_plan import dense_block_ids


@dataclass(frozen=True)
class Router:
    """One router: how the step loop (:mod:`mcsim.kernels.step_loop`) places an arrival, and where it applies.

    Attributes
    ----------
    name : str
        Its name in ``deployment.routing``.
    pick : {"given", "least"}
        ``given``: the placement of each request is known before the run (computed here from the request alone);
        ``least``: the instance of least load at the arrival.
    measure : {"outstanding", "free-kv"}
        The load a ``least`` router compares: requests in flight, or free KV blocks (most first).
    prefix : bool
        The longest cached prefix wins unless the fleet is imbalanced (SGLang's cache-aware rule).
    pooled : bool
        One prefix cache shared by every instance.
    """

    name: str
    pick: str
    measure: str = "outstanding"
    prefix: bool = False
    pooled: bool = False

    def codes(self) -> dict:
        """The step loop's integer code per field."""
        return {"pick": slots.PICK_GIVEN if self.pick == "given" else slots.PICK_LEAST,
                "measure": slots.MEASURE_FREE_KV if self.measure == "free-kv" else slots.MEASURE_OUTSTANDING,
                "prefix": int(self.prefix)}


#: The replicas' routers (:data:`mcsim.scenario.choices.ROUTERS`), as table entries the step loop reads.
ROUTER_TABLE = {router.name: router for router in (
    Router("round-robin", "given"),
    Router("random", "given"),
    Router("least-outstanding", "least"),
    Router("least-kv", "least", "free-kv"),
    Router("prefix-affinity", "given"),
    Router("cache-aware", "least", prefix=True),
    Router("pooled", "least", pooled=True),
)}
#: The summary's per-instance figures, which the one-instance simulator leaves out.
FLEET_SUMMARY_KEYS = ("requests_per_instance", "instance_steps", "instance_load_imbalance")


def router_entry(router: str) -> Router:
    """The table entry of a router named in :data:`ROUTERS`."""
    if router not in ROUTER_TABLE:
        raise ValueError(f"deployment.routing must be one of {', '.join(ROUTERS)} with replicas; got {router!r}")
    return ROUTER_TABLE[router]


def given_instances(router: str, block_ptr, block_ids, uniform, n_instances: int) -> np.ndarray:
    """The instance of each request under a router whose placement needs nothing of the instances' state
    (round-robin: ``r mod K``; random: ``floor(u * K)``; prefix affinity); zeros for the others."""
    n = len(uniform)
    if router == "round-robin":
        return np.arange(n, dtype=np.int64) % n_instances
    if router == "random":
        return np.minimum((np.asarray(uniform) * n_instances).astype(np.int64), n_instances - 1)
    if router == "prefix-affinity":
        return affinity_instances(block_ptr, block_ids, uniform, n_instances)
    return np.zeros(n, np.int64)


def affinity_instances(block_ptr, block_ids, uniform, n_instances: int) -> np.ndarray:
    """``prefix-affinity``: the instance of each request by a hash of its first block (the rule of
    :func:`mcsim.stages.kvcache.route`); a request without a whole block goes to ``floor(u * K)``."""
    spread = np.minimum((np.asarray(uniform) * n_instances).astype(np.int64), n_instances - 1)
    has_block, by_prefix = first_block_instances(block_ptr, block_ids, n_instances)
    return np.where(has_block, by_prefix, spread)


def simulate_batching(
    arrival_s,
    prefill_tokens,
    context_tokens,
    output_tokens,
    passes=None,
    *,
    step_time_table,
    decode_edges,
    prefill_edges,
    kv_slope=None,
    kv_ref_context: float = 0.0,
    token_budget: int = 8192,
    max_seqs: int = 256,
    kv_blocks: int | None = None,
    block_tokens: int = 16,
    chunk_tokens: int = 0,
    verify_tokens: int = 1,
    policy: str = "continuous",
    priority=None,
    max_new_per_step: int = 0,
    preempt: bool = True,
    closed_users: int = 0,
    think_s=None,
    warmup_s: float = 0.0,
    max_steps: int = 0,
    steady_tolerance: float = 0.1,
    steady_period_s: float = 0.0,
) -> dict:
    """Simulate one serving instance and summarise latency, throughput and queueing.

    The replicas' simulator with one instance (:func:`simulate_fleet_batching` with ``n_instances=1``), less what
    only a fleet has (each request's instance and cached tokens, the per-instance figures, the log's instances).

    Parameters
    ----------
    arrival_s : array_like of float, shape (n,)
        Arrival times, s; sorted in an open loop. In a closed loop only the first ``closed_users`` are used.
    prefill_tokens : array_like of int, shape (n,)
        Prompt tokens to compute (uncached part), >= 1.
    context_tokens : array_like of int, shape (n,)
        Full prompt length, tokens (>= prefill_tokens); sets the KV footprint.
    output_tokens : array_like of int, shape (n,)
        Tokens generated, >= 1.
    passes : array_like of int, shape (n,), optional
        Decode passes after the first token (from the speculative stage); default ``output_tokens - 1``.
    step_time_table : array_like of float, shape (len(decode_edges), len(prefill_edges))
        Step time, s, at each (decoding sequences, prefill tokens) pair; interpolated bilinearly, clamped.
    decode_edges, prefill_edges : array_like of float
        Strictly increasing grids of the table (sequences; tokens).
    kv_slope : array_like of float, shape (len(decode_edges),), optional
        Seconds one more KV token of a decoding sequence adds to a step, at each decode edge: the step then
        pays for the batch's own KV lengths instead of the table's ``kv_ref_context`` per sequence (default 0:
        the table alone).
    kv_ref_context : float
        KV length per decoding sequence at which the table was computed, tokens.
    token_budget : int
        Tokens one step may process (decodes at ``verify_tokens`` each, then prefill chunks).
    max_seqs : int
        Concurrent sequences (a static batch's size limit).
    kv_blocks : int, optional
        KV pool, in blocks of ``block_tokens``; default: room for every request at once.
    block_tokens : int
        Tokens per KV block.
    chunk_tokens : int
        Cap on one request's prefill chunk per step, tokens; 0 = only the budget caps it.
    verify_tokens : int
        Tokens a decoding sequence costs per step (``k + 1`` with ``k`` draft tokens, else 1).
    policy : str
        A scheduler policy of :data:`mcsim.scenario.policies.POLICIES` (``"fcfs"``, ``"priority"``,
        ``"shortest-prompt-first"``, ``"exclusive-prefill"``, ``"chunked-prefill"``, ``"static"``);
        ``"continuous"`` is ``"fcfs"``.
    priority : array_like of int, shape (n,), optional
        Priority of each request's workload class, higher served first (the ``"priority"`` policy; default 0).
    max_new_per_step : int
        Sequences admitted per step at most under a continuous policy (0 = the policy's own cap, or none).
    preempt : bool
        Continuous policy: grow KV as sequences generate and preempt (recompute) the newest sequence when
        the pool runs out, as vLLM does; False reserves each request's final size at admission.
    closed_users : int
        0: open loop. Otherwise request ``r >= closed_users`` arrives ``think_s[r]`` s after request
        ``r - closed_users`` finishes.
    think_s : array_like of float, shape (n,), optional
        Think times of the closed loop, s (default 0).
    warmup_s : float
        Requests arriving earlier are simulated but excluded from the statistics, s.
    max_steps : int
        Record the first ``max_steps`` steps in ``step_log`` (0: no log).
    steady_tolerance : float
        Largest queue-wait drift (share of the mean time in system) that counts as steady.
    steady_period_s : float
        The period of the arrivals' rate profile in this simulation's time, s (0: a constant rate): the drift
        then compares whole periods (:func:`mcsim.stages.steady_state.time_windows`).

    Returns
    -------
    dict
        ``per_request``: dict of arrays ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s``,
        ``ttft_s``, ``tpot_s`` (nan for single-token outputs), ``e2e_s``, ``measured`` (bool).
        ``summary``: ``quantiles``; ``ttft_s``, ``tpot_s``, ``e2e_s`` (one value per quantile, over
        measured requests); ``queue_s_mean``, ``queue_s_p99``; ``measured_requests``; ``window_s``
        (start, end); ``throughput_tok_s`` (output tokens of requests finishing in the window per second
        of window); ``arrival_rate_per_s``; ``mean_in_system`` (time average of waiting + running);
        ``mean_time_in_system_s``; ``little_law_ratio`` (mean_in_system / (arrival rate x mean time in
        system); ~1); ``completion_ratio`` (arrivals / completions over the window's second half);
        ``waiting_at_window_end``; ``saturated``; ``queue_steady_state`` (a
        :class:`~mcsim.stages.steady_state.SteadyState`: queue-wait drift, verdict, requests needed);
        ``mean_decode_batch``; ``mean_step_s``; ``busy_fraction`` (summed
        step time over the window / the window: the share of time the instance computes); ``steps``;
        ``preemptions``.
        ``step_log``: dict of per-step arrays ``start_s``, ``decode_seqs``, ``prefill_tokens``, ``step_s``,
        ``waiting`` (None when ``max_steps == 0``).

    Examples
    --------
    >>> table = [[0.02, 0.03], [0.04, 0.05]]
    >>> result = simulate_batching([0.0, 10.0], [100, 100], [100, 100], [3, 3], step_time_table=table,
    ...                            decode_edges=[1, 256], prefill_edges=[0, 8192])
    >>> [round(float(x), 4) for x in result["per_request"]["e2e_s"]]  # prefill step, then 2 decode steps
    [0.0601, 0.0601]
    """
    result = simulate_fleet_batching(
        arrival_s, prefill_tokens, context_tokens, output_tokens, passes, n_instances=1, router="round-robin",
        step_time_table=step_time_table, decode_edges=decode_edges, prefill_edges=prefill_edges, kv_slope=kv_slope,
        kv_ref_context=kv_ref_context, token_budget=token_budget, max_seqs=max_seqs, kv_blocks=kv_blocks,
        block_tokens=block_tokens, chunk_tokens=chunk_tokens, verify_tokens=verify_tokens, preempt=preempt,
        max_new_per_step=max_new_per_step, policy=policy, priority=priority, closed_users=closed_users,
        think_s=think_s, warmup_s=warmup_s, steady_tolerance=steady_tolerance, steady_period_s=steady_period_s,
        max_steps=max_steps)
    log = result["step_log"]
    return {"per_request": _without(result["per_request"], ("instance", "cached_tokens")),
            "summary": _without(result["summary"], FLEET_SUMMARY_KEYS),
            "step_log": None if log is None else _without(log, ("instance",))}


def _without(figures: dict, keys) -> dict:
    return {key: value for key, value in figures.items() if key not in keys}


def simulate_fleet_batching(
    arrival_s,
    prompt_tokens,
    context_tokens,
    output_tokens,
    passes=None,
    *,
    n_instances: int,
    router: str,
    router_uniform=None,
    block_ptr=None,
    block_ids=None,
    capacity_blocks=(0, 0, 0),
    pooled_tiers: int = 0,
    balance: float = 0.25,
    balance_requests: int = 64,
    step_time_table,
    decode_edges,
    prefill_edges,
    kv_slope=None,
    kv_ref_context: float = 0.0,
    token_budget: int = 8192,
    max_seqs: int = 256,
    kv_blocks: int | None = None,
    block_tokens: int = 16,
    chunk_tokens: int = 0,
    verify_tokens: int = 1,
    preempt: bool = False,
    max_new_per_step: int = 0,
    policy: str = "fcfs",
    priority=None,
    closed_users: int = 0,
    think_s=None,
    warmup_s: float = 0.0,
    measured_from: int | None = None,
    measured=None,
    steady_tolerance: float = 0.1,
    steady_period_s: float = 0.0,
    max_steps: int = 0,
    instances_key: str = "deployment.instances",
) -> dict:
    """Simulate ``n_instances`` replicas behind a router and summarise the fleet's latency.

    Parameters
    ----------
    arrival_s, context_tokens, output_tokens, passes
        The fleet's whole workload, as in :func:`simulate_batching` (open loop, sorted).
    prompt_tokens : array_like of int
        Prompt tokens per request: the prefill is what the instance's prefix cache does not hold (without a
        cache, all of it; pass the tokens left to compute then).
    n_instances : int
        Replicas, >= 1.
    router : str
        One of :data:`ROUTERS`.
    router_uniform : array_like of float, shape (n,), optional
        Uniforms in [0, 1), one per request (from the sample's seeded stream): where ``"random"`` sends each
        request, and ``"prefix-affinity"`` a request without a whole block; required by those two.
    block_ptr, block_ids : array_like of int, optional
        CSR prompt blocks of each request (as :class:`mcsim.stages.workload.Requests` holds them); required with
        a cache (without them, no request has a whole block).
    capacity_blocks : sequence of int
        One instance's prefix-cache capacity per tier (1 to 8 tiers, first tier first), blocks; a first tier of 0
        (default) = no cache. Under ``"pooled"`` the instances share one cache of ``n_instances`` times this.
    pooled_tiers : int
        How many of the last tiers are one pool that every instance shares, behind its own tiers (a KV store
        such as Mooncake's): their ``capacity_blocks`` are the whole pool's, not one instance's (default 0: every
        tier is each instance's own). Under ``"pooled"``, or when every tier is pooled, the fleet has one cache:
        the instances' own tiers ``n_instances`` times over, and the pool's.
    balance, balance_requests : float, int
        ``"cache-aware"``'s imbalance thresholds (``deployment.routing_balance``,
        ``deployment.routing_balance_requests``).
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, token_budget, max_seqs, kv_blocks,
    block_tokens, chunk_tokens, verify_tokens, warmup_s, steady_tolerance, steady_period_s
        Per instance, as in :func:`simulate_batching` (``kv_blocks`` is one instance's pool;
        default: room for every request at once; ``block_tokens`` is also the cache's block).
    preempt : bool
        Allocate KV as sequences grow and preempt (recompute) the newest running sequence when an instance's
        pool runs out (``performance.preempt``); False: admission reserves the whole request.
    max_new_per_step : int
        Requests one instance admits per step at most (``deployment.max_new_per_step``; 0: no cap).
    policy : str
        A policy of :mod:`mcsim.scenario.policies` (:data:`REPLICA_SCHEDULERS`: all of them), which each instance
        runs. ``shortest-prompt-first`` orders by the prompt tokens the instance's
        cache does not hold when the request joins its queue.
    priority : array_like of int, optional
        Per request, its class priority (higher first), read by ``priority``.
    closed_users, think_s
        A closed loop of ``closed_users`` users, as in :func:`simulate_batching`: requests
        ``0 .. U-1`` arrive at ``arrival_s``, request ``r >= U`` ``think_s[r]`` after request ``r - U`` finishes;
        ``per_request["arrival_s"]`` then holds the arrivals that happened.
    measured_from : int, optional
        Measure requests ``measured_from:`` (by index, the cache's warm-up before them); the window then starts
        at that request's arrival and ``warmup_s`` is not read.
    measured : array_like of bool, optional
        Or measure these requests (a pool fed by another, whose measured requests arrive out of order); the
        window then starts at the earliest one's arrival.
    max_steps : int
        Keep the fleet's first steps in ``step_log`` (0: none): every instance's steps in order of (start,
        instance), up to the time by which some instance had run ``max_steps`` steps, at most ``max_steps``.
    instances_key : str
        The scenario key that gave ``n_instances``, named by the refusal of a fleet whose memory
        (:func:`mcsim.perf.fleet_memory.replica_bytes`) exceeds its limits or the memory available
        (:class:`~mcsim.errors.RunLimitError`), raised before anything that grows with the instances is allocated.

    Returns
    -------
    dict
        ``per_request``: arrays ``instance``, ``cached_tokens`` (n, tiers: reused from each tier),
        ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s``, ``ttft_s``, ``tpot_s``, ``e2e_s``,
        ``measured``. ``summary``: the fleet-wide figures of :func:`simulate_batching`'s
        summary (``throughput_tok_s`` of the whole fleet; ``mean_decode_batch`` per instance step;
        ``busy_fraction`` the mean over instances; ``queue_steady_state``), plus ``requests_per_instance``
        (measured requests each instance served), ``instance_load_imbalance`` (their max over their mean) and
        ``instance_steps``. ``step_log``: None, or arrays ``start_s``, ``instance``, ``decode_seqs``,
        ``prefill_tokens``, ``step_s``, ``waiting`` (requests queued at the instance).

    Examples
    --------
    >>> table = [[0.02, 0.03], [0.04, 0.05]]
    >>> result = simulate_fleet_batching([0.0, 0.0], [100, 100], [100, 100], [3, 3], n_instances=2,
    ...                                  router="round-robin", step_time_table=table, decode_edges=[1, 256],
    ...                                  prefill_edges=[0, 8192])
    >>> result["per_request"]["instance"].tolist(), float(result["summary"]["instance_load_imbalance"])
    ([0, 1], 1.0)
    """
    arrival = np.ascontiguousarray(arrival_s, dtype=np.float64)
    n = arrival.shape[0]
    if arrival.ndim != 1 or n == 0:
        raise ValueError("arrival_s must be a non-empty 1-D array")
    prompt = _as_int(prompt_tokens, "prompt_tokens", n)
    context = _as_int(context_tokens, "context_tokens", n)
    output = _as_int(output_tokens, "output_tokens", n)
    passes = output - 1 if passes is None else _as_int(passes, "passes", n)
    table = np.ascontiguousarray(step_time_table, dtype=np.float64)
    d_edges = np.ascontiguousarray(decode_edges, dtype=np.float64)
    p_edges = np.ascontiguousarray(prefill_edges, dtype=np.float64)
    slope = np.zeros(d_edges.shape) if kv_slope is None else np.ascontiguousarray(kv_slope, dtype=np.float64)
    entry = router_entry(router)
    warmup_request = -1
    if measured_from is not None:
        if not 0 <= int(measured_from) < n:
            raise ValueError(f"measured_from must be in [0, {n}), got {measured_from!r}")
        if closed_users:  # its arrival is known only as the loop runs
            warmup_request = int(measured_from)
        else:
            warmup_s = float(arrival[int(measured_from)])
        measured = np.arange(n) >= int(measured_from)
    if measured is not None:
        measured = np.asarray(measured, dtype=bool)
        if measured.shape != (n,) or not measured.any():
            raise ValueError("measured must be n booleans, at least one true")
        if warmup_request < 0:
            if closed_users:
                raise ValueError("a closed loop's measured requests are given by measured_from")
            warmup_s = float(arrival[measured].min())
    if int(n_instances) != n_instances or n_instances < 1:
        raise ValueError(f"n_instances must be an integer >= 1, got {n_instances!r}")
    k = int(n_instances)
    if router in ("random", "prefix-affinity") and router_uniform is None:
        raise ValueError(f"router_uniform is required by the {router} router")
    uniform = np.zeros(n) if router_uniform is None else np.ascontiguousarray(router_uniform, dtype=np.float64)
    capacity = np.ascontiguousarray(capacity_blocks, dtype=np.int64)
    caching = capacity.ndim == 1 and 1 <= capacity.size <= MAX_TIERS and capacity[0] > 0
    if caching and (block_ptr is None or block_ids is None):
        raise ValueError("block_ptr and block_ids are required by a prefix cache")
    # Without blocks no request has a whole block: prefix-affinity then spreads them by router_uniform.
    ptr = np.zeros(n + 1, np.int64) if block_ptr is None else np.ascontiguousarray(block_ptr, dtype=np.int64)
    ids = np.zeros(0, np.int64) if block_ids is None else np.ascontiguousarray(block_ids, dtype=np.int64)
    keys, stride = dense_block_ids(ids) if caching else (ids, 1)

    users = int(closed_users)
    think = np.zeros(n) if think_s is None else np.ascontiguousarray(think_s, dtype=np.float64)
    check_arrivals(arrival, think, users)
    check_requests(prompt, context, output, passes)
    if uniform.shape != (n,) or np.any(uniform < 0) or np.any(uniform >= 1):
        raise ValueError("router_uniform must be n values in [0, 1)")
    if capacity.ndim != 1 or not 1 <= capacity.size <= MAX_TIERS or np.any(capacity < 0):
        raise ValueError(f"capacity_blocks must be 1 to {MAX_TIERS} values >= 0, one per tier")
    if ptr.shape != (n + 1,) or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] > len(keys):
        raise ValueError("block_ptr must be n + 1 non-decreasing pointers from 0 into block_ids")
    if balance < 0 or balance_requests < 0:
        raise ValueError("balance and balance_requests must be >= 0")
    if priority is not None:
        priority = _as_int(priority, "priority", n)
    params, scheduler = loop_params(context, output, entry, step_model=(d_edges, p_edges, table, slope, kv_ref_context),
                                    token_budget=token_budget, max_seqs=max_seqs, kv_blocks=kv_blocks,
                                    block_tokens=block_tokens, chunk_tokens=chunk_tokens,
                                    verify_tokens=verify_tokens, preempt=preempt, max_new_per_step=max_new_per_step,
                                    policy=policy, closed_users=users)
    key_uncached = scheduler.order == "shortest-prompt"
    queue_key = scheduler.queue_key(prompt, priority)
    # By the ids as given, as the cache stage hashes them, so both modes place a request alike.
    given = given_instances(router, ptr, ids, uniform, k)
    if int(pooled_tiers) != pooled_tiers or not 0 <= pooled_tiers <= capacity.size:
        raise ValueError(f"pooled_tiers must be an integer in [0, {capacity.size}], got {pooled_tiers!r}")
    # Every tier pooled: one cache that every instance uses, whatever the router.
    pooled = entry.pooled or int(pooled_tiers) == capacity.size
    shared = int(pooled_tiers) if caching and not pooled else 0
    params[slots.P_POOLED_TIERS] = shared
    if pooled:  # one cache: every instance's own tiers together, and the pool's as they are
        own = capacity.size - int(pooled_tiers)
        capacity = np.concatenate([capacity[:own] * k, capacity[own:]])
    rows = (stride if pooled else (k + (1 if shared else 0)) * stride) if caching else 0
    cap = max(int(max_steps), 0)
    # Everything below that grows with the instances, counted before any of it is allocated.
    refuse_over([replica_bytes(n, k, stride=stride, capacity_blocks=capacity, pooled=entry.pooled,
                               pooled_tiers=int(pooled_tiers), max_seqs=int(max_seqs),
                               max_passes=int(passes.max()), static=scheduler.admission == "static",
                               preempt=bool(preempt), max_steps=cap, key=instances_key)], router, "replicas")
    # The tier stage's per-thread workspace: reused, so its pages are not faulted in again for every run.
    cache_state = _workspace(rows) if rows else np.empty((0, 4), np.int32)
    instance = np.empty(n, np.int64)
    first_token, finish, queue = (np.empty(n) for _ in range(3))
    cached = np.zeros((n, capacity.size), np.int64)
    instance_steps = np.zeros(k, np.int64)
    stats = np.zeros(slots.N_STATS)
    log = {"start_s": np.empty((k, cap)), "decode_seqs": np.empty((k, cap), np.int64),
           "prefill_tokens": np.empty((k, cap), np.int64), "step_s": np.empty((k, cap)),
           "waiting": np.empty((k, cap), np.int64)}
    arrival_out = np.empty(n)
    status = kernel.simulate(arrival, prompt, context, output, passes, think, given, queue_key, key_uncached, ptr,
                             keys, stride, capacity, pooled, params, float(balance), int(balance_requests),
                             float(warmup_s), warmup_request, table, d_edges, p_edges, slope, float(kv_ref_context),
                             cache_state, arrival_out, instance, first_token, finish, queue, cached, instance_steps,
                             stats, log["start_s"], log["decode_seqs"], log["prefill_tokens"], log["step_s"],
                             log["waiting"])
    if status != kernel.STATUS_OK:
        raise RuntimeError("the batching simulation stalled (a step with nothing to run)")
    if warmup_request >= 0:
        warmup_s = float(arrival_out[warmup_request])
    per_request = {"instance": instance, "cached_tokens": cached,
                   **_per_request(arrival_out, first_token, finish, queue, output, warmup_s)}
    if measured is not None:
        per_request["measured"] = measured
    measured = per_request["measured"]
    served = np.bincount(instance[measured], minlength=k)
    summary = _summary(per_request, output, warmup_s, stats)
    window = summary["window_s"][1] - summary["window_s"][0]
    summary["busy_fraction"] = min(stats[slots.STAT_WINDOW_STEP_S_SUM] / (k * window), 1.0) \
        if window > 0 else float("nan")
    summary["queue_steady_state"] = queue_steady_state(per_request, summary, float(steady_tolerance),
                                                       float(steady_period_s))
    summary.update(requests_per_instance=served, instance_steps=instance_steps,
                   instance_load_imbalance=float(served.max() / served.mean()) if served.sum() > 0 else float("nan"))
    return {"per_request": per_request, "summary": summary, "step_log": _fleet_log(log, instance_steps, cap)}


def loop_params(context, output, entry: Router, *, step_model, token_budget: int, max_seqs: int,
                kv_blocks: int | None, block_tokens: int, chunk_tokens: int, verify_tokens: int, preempt: bool,
                max_new_per_step: int, policy: str, closed_users: int = 0):
    """The step loop's ``params_int`` for a router, a policy and the instances' settings, checked (the step model
    ``(decode_edges, prefill_edges, table, kv_slope, kv_ref_context)`` too), and the policy's entry.
    ``kv_blocks=None`` gives a pool that holds every request of ``context`` and ``output`` at once."""
    check_step_model(*step_model)
    scheduler = policies.get(policy)
    if max_new_per_step < 0:
        raise ValueError("max_new_per_step must be >= 0")
    if min(token_budget, max_seqs, block_tokens, verify_tokens) < 1 or chunk_tokens < 0:
        raise ValueError("token_budget, max_seqs, block_tokens, verify_tokens must be >= 1; chunk_tokens >= 0")
    params, kv_blocks = base_params(context, output, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                                    verify_tokens)
    params[slots.P_PREEMPT] = int(bool(preempt))
    codes = scheduler.codes(max_new_per_step)
    params[slots.P_POLICY] = codes["admission"]
    params[slots.P_ORDER] = codes["order"]
    params[slots.P_MIXING] = codes["mixing"]
    params[slots.P_MAX_NEW] = codes["max_new_per_step"]
    params[slots.P_CLOSED_USERS] = int(closed_users)
    route = entry.codes()
    params[slots.P_ROUTE_PICK] = route["pick"]
    params[slots.P_ROUTE_MEASURE] = route["measure"]
    params[slots.P_ROUTE_PREFIX] = route["prefix"]
    return params, scheduler


def _fleet_log(log: dict, instance_steps, cap: int):
    """The instances' logged steps as one log in order of (start, instance): complete up to the earliest time an
    instance's log filled, at most ``cap`` steps."""
    if cap == 0:
        return None
    kept = np.minimum(instance_steps, cap)
    mine = np.arange(cap)[None, :] < kept[:, None]
    full = kept == cap  # instances whose log filled before they stopped
    until = min((log["start_s"][i, cap - 1] for i in np.flatnonzero(full) if instance_steps[i] > cap), default=np.inf)
    mine &= log["start_s"] <= until
    instance = np.broadcast_to(np.arange(len(kept))[:, None], mine.shape)[mine]
    start = log["start_s"][mine]
    order = np.lexsort((instance, start))[:cap]
    out = {"start_s": start[order], "instance": instance[order]}
    out.update({key: log[key][mine][order] for key in ("decode_seqs", "prefill_tokens", "step_s", "waiting")})
    return out

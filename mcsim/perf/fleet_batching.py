"""Latency of a fleet: ``K`` replicas of one pool on one clock behind a global router.

:func:`simulate_fleet_batching` replays a workload through :mod:`mcsim.kernels.fleet_batching` (whose
docstring states every rule): each arrival is routed, from the instances' state at its arrival time, by one of
:data:`ROUTERS`, and every instance runs continuous batching (FCFS, mixed prefill/decode, whole-request KV
reservation, so no preemption) with the same step-time table. The latency quantiles are over the requests of
all instances; ``instance_load_imbalance`` is the largest number of measured requests one instance served
over the mean.

This is the ``deployment.fleet_simulation = "replicas"`` mode; the default, ``"representative"``, simulates
one instance that receives ``1/K`` of the arrivals (:func:`mcsim.perf.batching.simulate_batching`).
"""

from __future__ import annotations

import numpy as np

from mcsim.perf.batching import (QUANTILES, _as_int, _per_request, _quantiles, base_params, check_requests,
                                 check_step_model)

ROUTERS = ("round-robin", "random", "least-outstanding", "least-kv")
FLEET_SIMULATIONS = ("representative", "replicas")
#: What ``deployment.fleet_simulation = "replicas"`` simulates, as the allowed values of the keys that decide it:
#: colocated continuous FCFS (chunked prefill included) in an open loop, no admission cap. Read by the scenario
#: check (plain values) and the pool simulator (values drawn from distributions).
REPLICA_NEEDS = {"deployment.disaggregated": (False,), "deployment.batching": ("continuous",),
                 "deployment.scheduler": ("fcfs", "chunked-prefill"), "deployment.max_new_per_step": (0,),
                 "performance.closed_loop_users": (0,)}


def replica_mismatch(values) -> str | None:
    """The first requirement of :data:`REPLICA_NEEDS` that ``values`` (path -> value) break, as a message, or
    None; paths missing from ``values`` are not checked."""
    for path, allowed in REPLICA_NEEDS.items():
        if path in values and values[path] not in allowed:
            return f"'replicas' needs {path} = {' or '.join(map(repr, allowed))}, got {values[path]!r}"
    return None


def router_code(router: str) -> int:
    """The kernel's code of a router policy named in :data:`ROUTERS`."""
    from mcsim.kernels import fleet_batching as kernel

    codes = {"round-robin": kernel.ROUTER_ROUND_ROBIN, "random": kernel.ROUTER_RANDOM,
             "least-outstanding": kernel.ROUTER_LEAST_OUTSTANDING, "least-kv": kernel.ROUTER_LEAST_KV}
    if router not in codes:
        raise ValueError(f"deployment.router must be one of {', '.join(ROUTERS)}; got {router!r}")
    return codes[router]


def simulate_fleet_batching(
    arrival_s,
    prefill_tokens,
    context_tokens,
    output_tokens,
    passes=None,
    *,
    n_instances: int,
    router: str,
    router_uniform=None,
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
    warmup_s: float = 0.0,
) -> dict:
    """Simulate ``n_instances`` replicas behind a router and summarise the fleet's latency.

    Parameters
    ----------
    arrival_s, prefill_tokens, context_tokens, output_tokens, passes
        The fleet's whole workload, as in :func:`mcsim.perf.batching.simulate_batching` (open loop, sorted).
    n_instances : int
        Replicas, >= 1.
    router : str
        One of :data:`ROUTERS`.
    router_uniform : array_like of float, shape (n,), optional
        Uniforms in [0, 1) that the ``"random"`` router reads, one per request (from the sample's seeded
        stream); required by ``"random"``, ignored by the others.
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, token_budget, max_seqs, kv_blocks,
    block_tokens, chunk_tokens, verify_tokens, warmup_s
        Per instance, as in :func:`mcsim.perf.batching.simulate_batching` (``kv_blocks`` is one instance's pool;
        default: room for every request at once).

    Returns
    -------
    dict
        ``per_request``: arrays ``instance``, ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s``,
        ``ttft_s``, ``tpot_s``, ``e2e_s``, ``measured``. ``summary``: ``quantiles``; ``ttft_s``, ``tpot_s``,
        ``e2e_s`` (one value per quantile over measured requests of all instances); ``requests_per_instance``
        (measured requests each instance served); ``instance_load_imbalance`` (their max over their mean);
        ``instance_steps``.

    Examples
    --------
    >>> table = [[0.02, 0.03], [0.04, 0.05]]
    >>> result = simulate_fleet_batching([0.0, 0.0], [100, 100], [100, 100], [3, 3], n_instances=2,
    ...                                  router="round-robin", step_time_table=table, decode_edges=[1, 256],
    ...                                  prefill_edges=[0, 8192])
    >>> result["per_request"]["instance"].tolist(), float(result["summary"]["instance_load_imbalance"])
    ([0, 1], 1.0)
    """
    from mcsim.kernels import fleet_batching as kernel

    arrival = np.ascontiguousarray(arrival_s, dtype=np.float64)
    n = arrival.shape[0]
    if arrival.ndim != 1 or n == 0:
        raise ValueError("arrival_s must be a non-empty 1-D array")
    prefill = _as_int(prefill_tokens, "prefill_tokens", n)
    context = _as_int(context_tokens, "context_tokens", n)
    output = _as_int(output_tokens, "output_tokens", n)
    passes = output - 1 if passes is None else _as_int(passes, "passes", n)
    table = np.ascontiguousarray(step_time_table, dtype=np.float64)
    d_edges = np.ascontiguousarray(decode_edges, dtype=np.float64)
    p_edges = np.ascontiguousarray(prefill_edges, dtype=np.float64)
    slope = np.zeros(d_edges.shape) if kv_slope is None else np.ascontiguousarray(kv_slope, dtype=np.float64)
    code = router_code(router)
    if code == kernel.ROUTER_RANDOM and router_uniform is None:
        raise ValueError("router_uniform is required by the random router")
    uniform = np.zeros(n) if router_uniform is None else np.ascontiguousarray(router_uniform, dtype=np.float64)

    if int(n_instances) != n_instances or n_instances < 1:
        raise ValueError(f"n_instances must be an integer >= 1, got {n_instances!r}")
    if not np.all(np.isfinite(arrival)) or np.any(np.diff(arrival) < 0):
        raise ValueError("arrival_s must be finite and sorted")
    check_requests(prefill, context, output, passes)
    if uniform.shape != (n,) or np.any(uniform < 0) or np.any(uniform >= 1):
        raise ValueError("router_uniform must be n values in [0, 1)")
    check_step_model(d_edges, p_edges, table, slope, kv_ref_context)
    if min(token_budget, max_seqs, block_tokens, verify_tokens) < 1 or chunk_tokens < 0:
        raise ValueError("token_budget, max_seqs, block_tokens, verify_tokens must be >= 1; chunk_tokens >= 0")
    params, kv_blocks = base_params(context, output, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                                    verify_tokens)
    instance = np.empty(n, np.int64)
    first_token, finish, queue = (np.empty(n) for _ in range(3))
    instance_steps = np.zeros(int(n_instances), np.int64)
    status = kernel.simulate_fleet(arrival, prefill, context, output, passes, uniform, params, code, table, d_edges,
                                   p_edges, slope, float(kv_ref_context), instance, first_token, finish, queue,
                                   instance_steps)
    if status != kernel.STATUS_OK:
        raise RuntimeError("the fleet simulation stalled (a step with nothing to run)")
    per_request = {"instance": instance, **_per_request(arrival, first_token, finish, queue, output, warmup_s)}
    measured = per_request["measured"]
    served = np.bincount(instance[measured], minlength=int(n_instances))
    imbalance = float(served.max() / served.mean()) if served.sum() > 0 else float("nan")
    summary = {
        "quantiles": np.array(QUANTILES),
        "ttft_s": _quantiles(per_request["ttft_s"][measured]),
        "tpot_s": _quantiles(per_request["tpot_s"][measured]),
        "e2e_s": _quantiles(per_request["e2e_s"][measured]),
        "requests_per_instance": served,
        "instance_load_imbalance": imbalance,
        "instance_steps": instance_steps,
    }
    return {"per_request": per_request, "summary": summary}

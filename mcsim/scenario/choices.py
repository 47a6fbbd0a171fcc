"""The names a scenario may choose from, where the code that runs them (the performance stage, above the scenario)
and the schema that checks them both read them.

The schema offers these values; the simulators implement them: :mod:`mcsim.scenario.policies` has a table entry per
scheduler, :mod:`mcsim.perf.fleet_batching` a router entry per replicas' router, :mod:`mcsim.perf.collectives` a
model per algorithm. Adding a value is an entry here and its implementation there.

Examples
--------
>>> "cache-aware" in ROUTING_POLICIES
True
>>> replica_mismatch({"deployment.fleet_simulation": "replicas", "deployment.routing": "sticky"})
"'replicas' needs deployment.routing = 'round-robin' or 'random' or 'least-outstanding' or 'least-kv' or 'prefix-affinity' or 'cache-aware' or 'pooled', got 'sticky'"
"""

from __future__ import annotations

#: ``deployment.scheduler``: the continuous-batching policies of :data:`mcsim.scenario.policies.POLICIES`
#: (``deployment.batching = "static"`` is a policy of its own).
SCHEDULERS = ("fcfs", "priority", "shortest-prompt-first", "exclusive-prefill", "chunked-prefill")
#: The scheduler policies the replicas run: every one (the one step loop runs them all on any number of instances).
REPLICA_SCHEDULERS = (*SCHEDULERS, "static")

#: Every ``deployment.routing`` value.
ROUTING_POLICIES = ("random", "round-robin", "prefix-affinity", "cache-aware", "pooled", "least-outstanding",
                    "least-kv")
#: ``deployment.routing`` values the replicas simulate (``pooled``: one cache shared by every instance, requests
#: placed by least-outstanding).
ROUTERS = ("round-robin", "random", "least-outstanding", "least-kv", "prefix-affinity", "cache-aware", "pooled")
#: Where a decode pool (fed by a prefill pool, no prefix cache of its own) places requests: these keep their
#: meaning there; the cache-minded ones (prefix-affinity, cache-aware, pooled) become least-outstanding, which
#: is what cache-aware does without a cache.
DECODE_ROUTERS = ("round-robin", "random", "least-outstanding", "least-kv")
#: ``deployment.routing`` values the representative mode's cache replay takes (no clock, so no current load).
REPRESENTATIVE_ROUTERS = ("random", "round-robin", "prefix-affinity", "cache-aware", "pooled")
#: ``deployment.fleet_simulation``.
FLEET_SIMULATIONS = ("representative", "replicas")

#: ``performance.allreduce`` (``performance.prefill_allreduce`` adds ``"same"``).
ALLREDUCE_ALGORITHMS = ("auto", "ring", "one-shot", "two-shot", "tree", "hierarchical")
#: ``performance.allreduce_impl``: who runs the TP all-reduce (:mod:`mcsim.perf.collectives`).
ALLREDUCE_IMPLS = ("auto", "nccl", "custom")
def instance_gpus(p: dict, prefill: bool = False) -> int:
    """GPUs of one decode instance (``deployment.gpus_per_instance``, 0 = ``tp x pp``) or, with ``prefill``, of one
    prefill instance (``prefill_gpus_per_instance``, 0 = ``prefill_tp``)."""
    if prefill:
        return int(p["deployment.prefill_gpus_per_instance"] or p["deployment.prefill_tp"])
    return int(p["deployment.gpus_per_instance"] or p["deployment.tp"] * p["deployment.pp"])


#: ``performance.cudagraph_mode`` (vLLM's ``CUDAGraphMode``; "stack" = the stack's own): how a step's kernels are
#: launched, for decode-only steps and for steps with prefill tokens (:mod:`mcsim.perf.stacks`).
CUDAGRAPH_MODES = ("stack", "none", "piecewise", "full", "full_decode_only", "full_and_piecewise")

#: ``performance.stack``: the serving engine (:mod:`mcsim.perf.stacks`).
STACKS = ("vllm", "sglang", "trtllm", "generic")
#: ``performance.alltoall`` (``performance.prefill_alltoall`` adds ``"same"``): the analytic algorithms
#: (:func:`mcsim.perf.collectives.alltoall_time`) and DeepEP's two modes, priced from measured kernels
#: (:mod:`mcsim.perf.deepep`).
ALLTOALL_ALGORITHMS = ("direct", "hierarchical", "deepep_low_latency", "deepep_normal")

#: What ``deployment.fleet_simulation = "replicas"`` simulates, as the allowed values of the keys that decide it:
#: a router of :data:`ROUTERS` (and, checked apart, no closed loop on a disaggregated pool); every scheduler policy
#: runs.
#: Read by the scenario check (plain values) and the performance stage (values drawn from distributions).
REPLICA_NEEDS = {"deployment.routing": ROUTERS}
#: Every key :func:`replica_mismatch` reads.
REPLICA_KEYS = (*REPLICA_NEEDS, "deployment.fleet_simulation", "deployment.disaggregated",
                "performance.closed_loop_users")


def replica_mismatch(values) -> str | None:
    """The first requirement of :data:`REPLICA_NEEDS` that ``values`` (path -> value) break, as a message, or
    None; paths missing from ``values`` are not checked. In the representative mode (``values`` without
    ``deployment.fleet_simulation = "replicas"``), a router of the current load is the one requirement."""
    if values.get("deployment.fleet_simulation", "representative") != "replicas":
        routing = values.get("deployment.routing", "prefix-affinity")
        if routing not in REPRESENTATIVE_ROUTERS:
            return (f"deployment.routing = {routing!r} routes on the instances' current load, which only "
                    "deployment.fleet_simulation = 'replicas' simulates")
        return None
    for path, allowed in REPLICA_NEEDS.items():
        if path in values and values[path] not in allowed:
            return f"'replicas' needs {path} = {' or '.join(map(repr, allowed))}, got {values[path]!r}"
    if values.get("deployment.disaggregated") is True and values.get("performance.closed_loop_users", 0) > 0:
        return ("'replicas' runs a closed loop on a colocated pool only (a disaggregated user's next request "
                "would follow the decode pool); set performance.closed_loop_users = 0 or disaggregated = false")
    return None

"""The memory a sample's fleet takes per instance, estimated and checked before anything is allocated.

Three parts of a sample grow with the instances (bytes per instance; B = the sample's distinct prompt blocks):

* the cache stage's replay (:mod:`mcsim.stages.kvcache_plan`): under cache-aware routing over several caches, or
  with pooled tiers, 16 B per distinct block (20 B with the workspace's room to grow) and 16 B per tier and for the
  router; under the other routings 16 B per tier (the replay's keys grow with the requests);
* a streamed sample's bounded caches (:meth:`mcsim.stages.kvcache.CacheStream.most_bytes`): at most a segment of
  runs (52 B, and 8-16 B of hash table) per block its tiers hold;
* the replicas (``deployment.fleet_simulation = "replicas"``, :func:`replica_bytes`): the prefix cache's 16 B per
  distinct block (one cache for them all under ``routing = 'pooled'``) and lists, the step loop's state
  (:func:`mcsim.kernels.step_loop.instance_bytes`: 8 B per slot of the prefilling ring, of a static batch twice
  and of the timing wheels, 26 scalars and the lists), and the per-instance outputs.

:func:`check_sample` (before a sample's cache stage runs, the replicas at the configured fleet) and
:func:`mcsim.perf.fleet_batching.simulate_fleet_batching` (before its step loop, exactly) refuse a part above the
memory available (:func:`available_bytes`) or above a limit of its own, in one line naming the instance key, the
routing and the estimate (:class:`~mcsim.errors.RunLimitError`). Tests hold every count equal to the bytes of the
arrays a small fleet allocates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import psutil

from mcsim.errors import RunLimitError
from mcsim.kernels import step_loop
from mcsim.kernels.kv_tiers import RunCaches, workspace_bytes
from mcsim.perf.factor import kv_bytes
from mcsim.scenario.choices import instance_gpus
from mcsim.stages import kvcache
from mcsim.stages.kvcache_plan import block_id_span, replay_bytes, replay_plan

try:  # an address-space limit (ulimit -v) caps what numpy may allocate; Windows has no such module
    import resource
except ImportError:  # pragma: no cover
    resource = None

#: The most rows a cache workspace may have: the kernels index rows with int32.
MAX_KERNEL_ROWS = 2**31
#: The replicas' prefix caches hold one row of 16 bytes per (instance, distinct block): more rows than this
#: (2 GiB) is refused rather than swapped.
MAX_CACHE_ROWS = 1 << 27
#: The replicas' step loop state (running sets, static batches, timing wheels, scalars, lists) above this (2 GiB) is
#: refused rather than swapped.
MAX_RUNNING_BYTES = 1 << 31


def available_bytes() -> int | None:
    """Memory this process may still take: the system's available memory, and no more than an address-space limit
    (``ulimit -v``) leaves; None where neither can be read."""
    limits = []
    try:
        limits.append(int(psutil.virtual_memory().available))
    except Exception:  # no way to tell
        pass
    if resource is not None:
        try:
            soft, _ = resource.getrlimit(resource.RLIMIT_AS)
            if soft != resource.RLIM_INFINITY:
                limits.append(max(int(soft) - int(psutil.Process().memory_info().vms), 0))
        except Exception:  # no way to tell
            pass
    return min(limits) if limits else None


def size_text(n_bytes: float) -> str:
    """``2.5 GiB``, ``340 KiB``, ``96 B``."""
    for factor, unit in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if n_bytes >= factor:
            return f"{n_bytes / factor:.1f} {unit}"
    return f"{n_bytes:.0f} B"


@dataclass(frozen=True)
class FleetBytes:
    """The memory one part of a sample's simulation takes.

    Attributes
    ----------
    what : str
        The part, as the message names it ("the cache stage's replay").
    key : str
        The key that gives its instances (``deployment.instances``, or ``deployment.prefill_instances`` for a
        prefill pool).
    instances : int
    total : int
        Bytes.
    detail : str
        What one instance's bytes are made of.
    over : str
        A limit of its own that ``total`` exceeds ("" where none), whatever the memory available.
    remedy : str
        What to change besides fewer instances or requests.
    """

    what: str
    key: str
    instances: int
    total: int
    detail: str
    over: str = ""
    remedy: str = ""

    def message(self, routing: str, mode: str, available: int | None) -> str:
        """The one-line refusal: its keys, the estimate, and the limit or the memory available."""
        limit = self.over or f"the {size_text(available)} of memory available"
        remedy = f", or {self.remedy}" if self.remedy else ""
        return (f"{self.key} = {self.instances:,} with deployment.routing = '{routing}' (fleet_simulation = "
                f"'{mode}'): {self.what} would need about {size_text(self.total)} ("
                f"{size_text(self.total / max(self.instances, 1))} per instance: {self.detail}), more than {limit}; "
                f"use fewer instances or requests{remedy}")


def refuse_over(parts, routing: str, mode: str, available: int | None = None) -> None:
    """Raise :class:`~mcsim.errors.RunLimitError` for the first part over a limit of its own or over the memory
    available (:func:`available_bytes` unless given)."""
    parts = list(parts)
    for part in parts:
        if part.over:
            raise RunLimitError(part.message(routing, mode, None))
    available = available_bytes() if available is None else available
    if available is None:
        return
    for part in parts:
        if part.total > available:
            raise RunLimitError(part.message(routing, mode, available))


def replica_bytes(n_requests: int, n_instances: int, *, stride: int, capacity_blocks, pooled: bool,
                  pooled_tiers: int, max_seqs: int, max_passes: int, static: bool, preempt: bool, max_steps: int = 0,
                  key: str = "deployment.instances") -> FleetBytes:
    """What :func:`mcsim.perf.fleet_batching.simulate_fleet_batching` allocates for its instances: the prefix
    caches' workspace (``stride`` rows per instance, the key space of the sample's distinct blocks; one cache of
    ``stride`` rows for them all when ``pooled``; the pool's rows with ``pooled_tiers``), the step loop's state
    (:func:`mcsim.kernels.step_loop.instance_bytes`) and the per-instance outputs (steps, and ``max_steps`` of log).
    Over :data:`MAX_CACHE_ROWS` rows or :data:`MAX_RUNNING_BYTES` of state it is refused whatever the memory."""
    k, n = int(n_instances), int(n_requests)
    capacity = np.asarray(capacity_blocks, dtype=np.int64)
    caching = capacity.size > 0 and capacity[0] > 0
    pooled = bool(pooled) or int(pooled_tiers) == capacity.size
    shared = int(pooled_tiers) if caching and not pooled else 0
    rows = (stride if pooled else (k + (1 if shared else 0)) * int(stride)) if caching else 0
    pf_cap = max(1, min(int(max_seqs), n))
    wheel = step_loop.wheel_length(k, int(max_passes), pf_cap)
    n_lists = capacity.size * (k + 1 if shared else k)
    loop = step_loop.instance_bytes(k, pf_cap, static, wheel, preempt and not static, n_lists)
    cache = workspace_bytes(rows) if rows else 0
    outputs = 8 * k + 40 * k * max(int(max_steps), 0)
    over = ""
    if rows > MAX_CACHE_ROWS:
        over = f"the {size_text(MAX_CACHE_ROWS * 16)} the replicas' prefix caches may take ({rows:,} rows)"
    elif loop > MAX_RUNNING_BYTES:
        over = f"the {size_text(MAX_RUNNING_BYTES)} the replicas' running sets and queues may take"
    cached = (f"one prefix cache of {int(stride):,} distinct blocks for them all, " if pooled and caching else
              f"a prefix cache of {int(stride):,} distinct blocks x 16 B, " if caching else "")
    detail = (f"{cached}running sets and wheels of {pf_cap:,} and {wheel:,} slots x 8 B"
              f"{' (static batches: 3 rows)' if static else ''}, scalars and lists")
    return FleetBytes("the replicas' step loop", key, k, loop + cache + outputs, detail, over,
                      "fleet_simulation = 'representative'")


def cache_stage_bytes(p: dict, cache_in: "kvcache.Inputs", requests, exact: bool = True) -> FleetBytes:
    """What the cache stage's replay of ``requests`` allocates (:func:`mcsim.stages.kvcache_plan.replay_bytes`)."""
    plan = replay_plan(requests, cache_in.routing, cache_in.caches, np.array(cache_in.capacity_blocks),
                       cache_in.private_tiers)
    total = replay_bytes(plan, requests, exact)
    if plan.kind == "routed":
        stride = block_id_span(requests, exact)
        detail = (f"a row of 16 B for each of the sample's {stride:,} distinct blocks, a quarter more for the "
                  "workspace to grow, lists and the router's counters")
        rows = plan.caches * stride + (stride if plan.pooled else 0)
    else:
        detail = "its lists; the replay's keys grow with the requests"
        rows = 0
    over = f"the {MAX_KERNEL_ROWS:,} rows the kernel can index ({rows:,})" if rows >= MAX_KERNEL_ROWS else ""
    return FleetBytes("the cache stage's replay", _cache_key(p), cache_in.caches, total, detail, over,
                      "a routing other than cache-aware" if cache_in.routing == "cache-aware" else "")


def streamed_cache_bytes(p: dict, cache_in: "kvcache.Inputs", longest_blocks: int) -> FleetBytes:
    """What a streamed sample's bounded caches take (:meth:`mcsim.stages.kvcache.CacheStream.most_bytes`)."""
    capacity, caches = kvcache.CacheStream.layout(cache_in)
    total = kvcache.CacheStream.most_bytes(cache_in, longest_blocks)
    rows = RunCaches.rows_for(capacity, caches, longest_blocks) if capacity[0] else 0
    detail = (f"at most a segment (52 B, and 8-16 B of hash table) for each of the {int(np.sum(capacity)):,} "
              "blocks its tiers hold")
    over = f"the {MAX_KERNEL_ROWS:,} segments the kernel can index ({rows:,})" if rows >= MAX_KERNEL_ROWS else ""
    return FleetBytes("the streamed cache stage's caches", _cache_key(p), caches, total, detail, over,
                      "smaller cache tiers")


def _cache_key(p: dict) -> str:
    """The key of the pool whose instances hold the prefix caches: the prefill pool's when disaggregated (its 0
    means as many as ``deployment.instances``)."""
    return "deployment.prefill_instances" if p["deployment.disaggregated"] else "deployment.instances"


def replica_pools(p: dict, cache_in: "kvcache.Inputs", requests, exact: bool = True) -> list[FleetBytes]:
    """The replicas' step loops at the configured fleet (what ``fleet = 'fixed'`` runs; the least the other modes
    run), before the step model gives their admission caps: the caps' bounds (``max_batch_per_gpu`` x the decode
    instance's GPUs; the prefill pool's token budget x its GPUs) and the longest output as the most passes."""
    n = requests.n
    capacity = cache_in.capacity_blocks
    stride = block_id_span(requests, exact) if capacity[0] > 0 else 1
    routing = p["deployment.routing"]
    static = p["deployment.batching"] == "static"
    max_passes = int(np.max(requests.output_tokens)) if n else 0
    decode_seqs = max(int(round(p["deployment.max_batch_per_gpu"] * instance_gpus(p))), 1)
    common = dict(max_passes=max_passes, preempt=bool(p["performance.preempt"]))
    if not p["deployment.disaggregated"]:
        return [replica_bytes(n, cache_in.caches, stride=stride, capacity_blocks=capacity,
                              pooled=routing == "pooled", pooled_tiers=cache_in.pooled_tiers, max_seqs=decode_seqs,
                              static=static, **common)]
    prefill_seqs = int(p["performance.token_budget"]) * instance_gpus(p, prefill=True)
    prefill = replica_bytes(n, cache_in.caches, stride=stride, capacity_blocks=capacity, pooled=routing == "pooled",
                            pooled_tiers=cache_in.pooled_tiers, max_seqs=prefill_seqs, static=False,
                            max_passes=0, preempt=False, key=_cache_key(p))
    decode = replica_bytes(n, int(p["deployment.instances"]), stride=1, capacity_blocks=(0, 0, 0), pooled=False,
                           pooled_tiers=0, max_seqs=decode_seqs, static=static, **common)
    return [prefill, decode]


def check_sample(p: dict, cache_in: "kvcache.Inputs", requests) -> None:
    """Refuse, before its cache stage runs, a sample whose cache stage or replicas would take more than their limits
    or the memory available (:func:`refuse_over`). The distinct blocks are counted (a sort of every block id) only
    where their upper bound, the blocks, would refuse."""
    def parts(exact: bool) -> list[FleetBytes]:
        found = [cache_stage_bytes(p, cache_in, requests, exact)]
        if p["deployment.fleet_simulation"] == "replicas":
            found += replica_pools(p, cache_in, requests, exact)
        return found

    routing, mode = p["deployment.routing"], p["deployment.fleet_simulation"]
    available = available_bytes()
    try:
        refuse_over(parts(False), routing, mode, available)
    except RunLimitError:
        refuse_over(parts(True), routing, mode, available)


def check_streamed(p: dict) -> None:
    """Refuse, before they are allocated, a streamed sample's bounded caches (for its longest possible request)
    when they would take more than the kernel's rows or the memory available."""
    block_tokens = int(p["cache.block_tokens"])
    cache_in = kvcache.Inputs.from_params(p, block_tokens, kv_bytes(p))
    longest = int(p["workload.max_context"] or p["model.max_context"]) // block_tokens + 1
    refuse_over([streamed_cache_bytes(p, cache_in, longest)], p["deployment.routing"],
                p["deployment.fleet_simulation"])

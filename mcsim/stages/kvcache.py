"""Stage 2 orchestration: the scenario's tiers, route requests to instances, size the tiers, run the KV-tier kernel.

The cache is an ordered list of exclusive tiers (:class:`Tier`): the scenario's ``[[cache.tiers]]``, or today's
keys (``cache.hbm_gb_per_instance``, ``dram_gb_per_node``, ``nvme_gb_per_node``), the short form that makes the
three tiers hbm, dram and nvme. Tiers of scope ``pooled`` are one capacity that every instance shares, behind
each instance's own tiers (the rules are :mod:`mcsim.kernels.kv_tiers`'s "Pooled tiers"). The kernel
(:func:`mcsim.kernels.kv_tiers.lookup_tiers`) keeps its state in flat arrays indexed by a dense key, so block
identities are remapped here: each (instance, block) pair gets its own key, since each instance has its own cache.
``routing = 'pooled'`` is one cache with the capacity of all instances together.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.kernels.kv_tiers import RunCaches, lookup_tiers, lookup_tiers_runs
from mcsim.scenario.choices import instance_gpus
from mcsim.scenario.schema import TIER_SCOPES
from mcsim.stages import steady_state as steady
from mcsim.stages.kvcache_plan import DENSE_SLACK, dense_block_ids, replay_plan

ROUTING = ("random", "round-robin", "prefix-affinity", "cache-aware", "pooled")
#: Routers of the instances' current load, which only the replicas' simulation has (:mod:`mcsim.perf.fleet_batching`).
LOAD_ROUTERS = ("least-outstanding", "least-kv")


#: Where a tier's capacity is counted: per instance, per node (an instance has it x the nodes it spans), or once for
#: the whole fleet.
SCOPES = TIER_SCOPES
#: Read bandwidth of one CXL memory expander, bytes/s: x16 at PCIe 5.0's 32 GT/s, one direction (the ``cxl`` kind's
#: default per unit of its scope; mcsim.scenario.schema.TIER_KINDS gives the sources).
CXL_BYTES_S = 64e9


@dataclass(frozen=True)
class Tier:
    """One tier of the prefix cache, as the scenario gives it.

    Attributes
    ----------
    name : str
    gb : float
        Capacity per unit of ``scope``, GB (1e9 bytes).
    scope : str
        One of :data:`SCOPES`.
    gb_s : float
        Read bandwidth per unit of ``scope``, GB/s; 0 = the default of the tier's kind (:func:`restore_rates`).
    latency_us : float
        Time to the first byte of a restore from this tier, once per request that restores from it, µs.
    """

    name: str
    gb: float
    scope: str
    gb_s: float = 0.0
    latency_us: float = 0.0


def tiers_of(p: dict) -> tuple[Tier, ...]:
    """The tiers of a sample's parameters, first (the GPUs' memory, where blocks are used) to last: the scenario's
    ``[[cache.tiers]]``, or the short form's hbm (per instance), dram and nvme (per node), with their kinds'
    bandwidths and no latency."""
    names = p.get("cache.tiers") or ()
    if names:
        return tuple(Tier(name, p[f"cache.tiers.{name}.gb"], p[f"cache.tiers.{name}.scope"],
                          p[f"cache.tiers.{name}.gb_s"], p[f"cache.tiers.{name}.latency_us"]) for name in names)
    return (Tier("hbm", p["cache.hbm_gb_per_instance"], "instance"),
            Tier("dram", p["cache.dram_gb_per_node"], "node"),
            Tier("nvme", p["cache.nvme_gb_per_node"], "node"))


def tier_prices(p: dict) -> np.ndarray:
    """USD per GB-month of each tier's capacity, in the order of :func:`tiers_of` (the economics read them; the
    cache and the step model never do): ``cache.tiers.<name>.usd_per_gb_month``, or the short form's
    ``cache.dram_usd_per_gb_month`` and ``nvme_usd_per_gb_month`` (its HBM is paid with the GPUs)."""
    names = p.get("cache.tiers") or ()
    if names:
        return np.array([p[f"cache.tiers.{name}.usd_per_gb_month"] for name in names], dtype=float)
    return np.array([0.0, p["cache.dram_usd_per_gb_month"], p["cache.nvme_usd_per_gb_month"]])


def private_tiers(tiers) -> int:
    """How many leading tiers are each instance's own (the rest are pooled)."""
    return sum(1 for t in tiers if t.scope != "pooled")


def first_tier_gb_per_instance(p: dict) -> float:
    """GB of HBM one cache-holding instance sets aside for the first tier (its blocks are used from the GPUs'
    memory): ``gb`` per instance, x the nodes it spans per node, or its share of a pooled first tier."""
    first = tiers_of(p)[0]
    if first.scope == "node":
        return first.gb * prefix_cache_nodes(p)
    if first.scope == "pooled":
        return first.gb / max(cache_instances(p), 1)
    return first.gb


def cache_instances(p: dict) -> int:
    """Instances the prefix caches are split over: the prefill pool's when disaggregated."""
    if p["deployment.disaggregated"]:
        return int(p["deployment.prefill_instances"] or p["deployment.instances"])
    return int(p["deployment.instances"])


def tier_names(p: dict) -> tuple[str, ...]:
    """Names of the tiers, in order (the ``tier`` coordinate of the results)."""
    return tuple(t.name for t in tiers_of(p))


def prefix_cache_nodes(p: dict) -> int:
    """Nodes one cache-holding instance spans (the prefill pool's instance when disaggregated)."""
    gpus = instance_gpus(p, prefill=bool(p["deployment.disaggregated"]))
    return max(-(-gpus // p["hardware.gpus_per_node"]), 1)


def fleet_tier_gb(p: dict, cache_holding_instances: int) -> np.ndarray:
    """GB of each tier the deployed fleet holds: one cache's (:func:`tier_bytes`) for each instance that holds
    caches, or a pooled tier's once."""
    nodes = prefix_cache_nodes(p)
    return np.array([tier_bytes(t, nodes) / 1e9 * (1 if t.scope == "pooled" else cache_holding_instances)
                     for t in tiers_of(p)])


def tier_bytes(tier: Tier, nodes: int) -> float:
    """Capacity of one cache in a tier, bytes: ``gb`` per instance, x ``nodes`` per node, or the pool's ``gb``
    (one capacity for every instance)."""
    return tier.gb * 1e9 * nodes if tier.scope == "node" else tier.gb * 1e9


@dataclass(frozen=True)
class RestoreRate:
    """How fast one instance restores KV from a tier.

    Attributes
    ----------
    gpu_bytes_s : float
        Bytes per GPU-second of the instance: what restores cost in prefill GPU time.
    instance_bytes_s : float
        Bytes per second of one instance: what a request's restore time takes.
    latency_s : float
        Added once to the restore time of a request that restores anything from the tier.
    """

    gpu_bytes_s: float
    instance_bytes_s: float
    latency_s: float


def restore_rates(tiers, *, gpus: int, gpus_per_node: int, host_link_gb_s: float, nvme_gb_s_per_node: float,
                  hbm_tb_s: float = 0.0, scale_out_gb_s: float = 0.0) -> tuple[RestoreRate, ...]:
    """Restore bandwidth and latency of each tier for an instance of ``gpus`` GPUs (the one that holds the cache).

    A tier's ``gb_s`` is per unit of its scope: per instance, per node (an instance spanning ``gpus /
    gpus_per_node`` nodes, at least one, has that many nodes' bandwidth, each node's shared by its GPUs), or, for a
    pooled tier, what one instance reads the pool at. Without ``gb_s``, by kind (the tier's name,
    :data:`mcsim.scenario.schema.TIER_KINDS`): ``hbm`` at ``hardware.hbm_tb_s``, ``dram`` over each GPU's host link
    (``hardware.host_link_gb_s``), ``remote`` and ``pool`` over each GPU's NIC (``hardware.scale_out_gb_s``), all
    per GPU of the instance; ``cxl`` at :data:`CXL_BYTES_S` and ``nvme`` at ``cache.nvme_gb_s_per_node``, per unit of
    the scope. The first tier is where blocks are used: its hits restore nothing (its rate is infinite).
    """
    nodes = max(gpus / gpus_per_node, 1.0)

    def per_gpu(x):  # a link of every GPU of the instance
        return x, x * gpus

    def per_unit(x, scope):  # a device per unit of the tier's scope
        if scope == "node":
            gpu = x / gpus_per_node
            return gpu, gpu * gpus_per_node * nodes
        return x / gpus, x

    out = []
    for t, tier in enumerate(tiers):
        if t == 0:
            out.append(RestoreRate(float("inf"), float("inf"), 0.0))
            continue
        if tier.gb_s > 0:
            gpu, instance = per_unit(tier.gb_s * 1e9, tier.scope)
        elif tier.name == "dram":
            gpu, instance = per_gpu(host_link_gb_s * 1e9)
        elif tier.name == "hbm":
            gpu, instance = per_gpu(hbm_tb_s * 1e12)
        elif tier.name in ("remote", "pool"):
            gpu, instance = per_gpu(scale_out_gb_s * 1e9)
        elif tier.name == "cxl":
            gpu, instance = per_unit(CXL_BYTES_S, tier.scope)
        elif tier.name == "nvme":
            gpu, instance = per_unit(nvme_gb_s_per_node * 1e9, tier.scope)
        else:
            raise ValueError(f"cache tier {tier.name!r} has no read bandwidth (gb_s) and is no known kind")
        out.append(RestoreRate(gpu, instance, tier.latency_us * 1e-6))
    return tuple(out)


@dataclass(frozen=True)
class Inputs:
    """The parameters the KV-tier stage reads (also its memo key within a sample).

    Attributes
    ----------
    capacity_blocks : tuple of int
        Blocks per tier of one cache, first tier first (a pooled tier's: the whole pool's); all zeros when the
        cache lever is off.
    routing : str
    caches : int
        Caches the traffic is split over (instances holding prefill).
    routing_balance : float
    private_tiers : int
        Leading tiers that are each instance's own; the rest are pooled (-1: every tier is private).
    """

    capacity_blocks: tuple
    routing: str
    caches: int
    routing_balance: float
    private_tiers: int = -1

    @property
    def pooled_tiers(self) -> int:
        """How many of the last tiers are pooled."""
        return 0 if self.private_tiers < 0 else len(self.capacity_blocks) - self.private_tiers

    @classmethod
    def from_params(cls, p: dict, block_tokens: int, kv_bytes_per_token: float) -> "Inputs":
        routing = p["deployment.routing"]
        if routing in LOAD_ROUTERS:
            # Replicas only: their run routes on the current load and keeps its own caches; this replay (the
            # estimate the fleet is sized on) spreads the requests evenly instead.
            routing = "round-robin"
        caches = cache_instances(p)
        tiers = tiers_of(p)
        private = private_tiers(tiers)
        private = -1 if private == len(tiers) else private
        if not p["cache.enabled"]:
            return cls((0,) * len(tiers), routing, int(caches), float(p["deployment.routing_balance"]), private)
        # The prefix cache serves prefill: it lives on the prefill pool when disaggregated.
        nodes = prefix_cache_nodes(p)
        capacity = capacity_blocks([tier_bytes(t, nodes) for t in tiers], kv_bytes_per_token, block_tokens)
        return cls(tuple(int(c) for c in capacity), routing, int(caches),
                   float(p["deployment.routing_balance"]), private)


@dataclass(frozen=True)
class CacheResult:
    """Per-request reuse.

    Attributes
    ----------
    cached_tokens : int64[n, tiers]
        Prompt tokens reused from each tier.
    instance : int32[n]
        Instance that served each request.
    capacity_blocks : int64[tiers]
        Capacity per instance and tier, blocks.
    """

    cached_tokens: np.ndarray
    instance: np.ndarray
    capacity_blocks: np.ndarray


def _mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser: a well-spread hash of integer ids, for affinity routing."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def first_block_instances(block_ptr, block_ids, n_instances: int) -> tuple[np.ndarray, np.ndarray]:
    """Prefix affinity's rule: whether each request has a whole block, and the instance a hash of its first block
    picks (meaningless where it has none)."""
    block_ptr = np.asarray(block_ptr, dtype=np.int64)
    has_block = np.diff(block_ptr) > 0
    if len(block_ids) == 0:
        return has_block, np.zeros(len(has_block), np.int64)
    first = np.asarray(block_ids)[np.minimum(block_ptr[:-1], len(block_ids) - 1)]
    return has_block, (_mix64(first) % np.uint64(n_instances)).astype(np.int64)


def route(policy: str, block_ptr: np.ndarray, block_ids: np.ndarray, n_instances: int, rng) -> np.ndarray:
    """Instance of each request.

    ``prefix-affinity`` sends requests whose first block is the same (same system prompt, same session) to the
    same instance, by a hash of that block; requests with no whole block are spread at random.
    ``cache-aware`` returns -1 for every request: the tier kernel picks the instance holding the longest cached
    prefix, guarded against overload.
    """
    n = len(block_ptr) - 1
    if policy == "pooled" or n_instances == 1:
        return np.zeros(n, dtype=np.int32)
    if policy == "cache-aware":
        return np.full(n, -1, dtype=np.int32)  # decided inside the tier kernel, request by request
    if policy == "round-robin":
        return (np.arange(n) % n_instances).astype(np.int32)
    random_choice = rng.integers(0, n_instances, n).astype(np.int32)
    if policy == "random":
        return random_choice
    if policy == "prefix-affinity":
        has_block, by_prefix = first_block_instances(block_ptr, block_ids, n_instances)
        return np.where(has_block, by_prefix, random_choice).astype(np.int32)
    raise ValueError(f"unknown routing policy {policy!r}; expected one of {', '.join(ROUTING)}")


#: Blocks one tier holds at most: 2**40 is already more than any sample replays (10^8 requests of a hundred blocks
#: are 10^10 blocks), so a larger capacity caches as much, and the tiers' sums stay far within int64.
MAX_CAPACITY_BLOCKS = 1 << 40


def capacity_blocks(tier_bytes, kv_bytes_per_token: float, block_tokens: int) -> np.ndarray:
    """Blocks per tier = bytes / (KV bytes per token x block tokens), for each tier's bytes, at most
    :data:`MAX_CAPACITY_BLOCKS` (also where a block takes no bytes).

    Examples
    --------
    >>> capacity_blocks([1e9, 0.0, 1e300], 1e5, 16).tolist()
    [625, 0, 1099511627776]
    """
    per_block = kv_bytes_per_token * block_tokens
    with np.errstate(divide="ignore", invalid="ignore"):
        blocks = np.floor(np.array(tier_bytes, dtype=float) / per_block)
    return np.where(np.isnan(blocks), 0, np.minimum(blocks, MAX_CAPACITY_BLOCKS)).astype(np.int64)


def _dense_keys(block_ids: np.ndarray, instance: np.ndarray, counts: np.ndarray, caches: int):
    """One dense key per (instance, block) pair, as the kernel wants.

    Block ids that are already small non-negative integers (the generator's, Mooncake's) are used directly,
    offset by instance; otherwise (or when that key space would be much larger than the data) they are
    renumbered with ``np.unique``.
    """
    lo, span = int(block_ids.min()), int(block_ids.max()) + 1
    if lo >= 0 and caches * span <= 2 * len(block_ids) + DENSE_SLACK:
        if caches == 1:
            return block_ids, span
        return np.repeat(instance.astype(np.int64), counts) * span + block_ids, caches * span
    owner = np.repeat(instance.astype(np.int64), counts) if caches > 1 else np.zeros(len(block_ids), np.int64)
    span = int(block_ids.max() - block_ids.min()) + 1
    uniq, keys = np.unique(owner * span + (block_ids - block_ids.min()), return_inverse=True)
    return keys.astype(np.int64), len(uniq)


def cache_hits(requests, policy: str, n_instances: int, capacity_per_instance: np.ndarray, rng,
               balance: float = 0.25, private_tiers: int = -1) -> CacheResult:
    """Run the tiers for one sample's requests (in arrival order).

    Parameters
    ----------
    requests : mcsim.stages.workload.Requests
    policy : str
        One of :data:`ROUTING`.
    n_instances : int
    capacity_per_instance : int64[tiers]
        Blocks per tier of one instance's cache (its own tiers multiplied by ``n_instances`` when ``policy`` is
        ``'pooled'``), a pooled tier's the whole pool's.
    rng : numpy.random.Generator
        The sample's routing stream.
    balance : float
        Load guard of cache-aware routing (see :func:`mcsim.kernels.kv_tiers.lookup_tiers`).
    private_tiers : int
        Leading tiers that are each instance's own, the rest pooled (-1: all own). With none of its own, the
        pooled tiers are one cache that every request uses, whatever the routing.
    """
    n = requests.n
    # Only prefix affinity reads the ids to route (the generator's are then written out).
    instance = route(policy, requests.block_ptr, requests.block_ids if policy == "prefix-affinity" else
                     np.zeros(0, np.int64), n_instances, rng)
    plan = replay_plan(requests, policy, n_instances, capacity_per_instance, private_tiers)
    capacity, caches, private = np.array(plan.capacity, dtype=np.int64), plan.caches, plan.private
    hits = np.zeros((n, len(capacity)), dtype=np.int64)
    counts = np.diff(requests.block_ptr)
    if plan.kind == "routed":
        # Block ids in the key_stride layout: instance i's key of block b is i * stride + b (and the pool's is
        # caches * stride + b).
        ids, stride = dense_block_ids(requests.block_ids)
        if not (policy == "cache-aware" and caches > 1):
            instance = (np.where(instance < 0, np.arange(n) % caches, instance) if caches > 1
                        else np.zeros(n)).astype(np.int32)
        lookup_tiers(requests.block_ptr, ids, instance, caches, caches * stride, capacity, hits, key_stride=stride,
                     balance=balance, n_private=private)
    elif plan.kind != "none":
        instance = np.where(instance < 0, np.arange(n) % max(caches, 1), instance).astype(np.int32)
        serving = instance if caches > 1 else np.zeros(n, np.int32)
        if plan.kind == "runs":
            lookup_tiers_runs(requests.block_ptr, requests.block_runs, serving, caches, plan.span, capacity, hits)
        else:
            keys, n_keys = _dense_keys(requests.block_ids, instance, counts, caches)
            lookup_tiers(requests.block_ptr, keys, serving, caches, n_keys, capacity, hits)
    instance = np.where(instance < 0, np.arange(n) % max(caches, 1), instance).astype(np.int32)
    return CacheResult(cached_tokens=_reused_tokens(hits, requests), instance=instance, capacity_blocks=capacity)


def _reused_tokens(hits: np.ndarray, requests) -> np.ndarray:
    """Reused tokens per request and tier from the blocks hit, in place (one array per request and tier, not
    two)."""
    cached = hits
    cached *= requests.block_tokens
    # A fully cached prompt still computes its last token (the first output needs one forward position).
    excess = np.maximum(cached.sum(axis=1) - (requests.prompt_tokens - 1), 0)
    for tier in range(cached.shape[1]):
        take = np.minimum(excess, cached[:, tier])
        cached[:, tier] -= take
        excess -= take
    return cached


class CacheStream:
    """The cache stage over a sample's requests chunk by chunk (:class:`mcsim.stages.workload.RequestStream`):
    :func:`cache_hits` of the chunks joined, with the caches (segments of runs, :class:`~mcsim.kernels.kv_tiers.
    RunCaches`), the routing stream and the round-robin position carried from chunk to chunk.

    Built by :meth:`of`, which returns None where the replay needs every request at once: pooled tiers behind the
    instances' own. Cache-aware routing over several caches routes request by request in the replay, with the
    instances' loads carried over too. The requests must have block runs (the generator's, not a trace's).
    """

    def __init__(self, inputs: "Inputs", rng, longest_blocks: int, block_tokens: int):
        self.inputs, self.rng, self.block_tokens = inputs, rng, int(block_tokens)
        self.tiers = len(inputs.capacity_blocks)
        self.policy = inputs.routing
        self.n_instances = inputs.caches
        capacity, self.caches = self.layout(inputs)
        self.offset = 0  # requests routed so far (round-robin's position)
        self.runs = None if capacity[0] == 0 else RunCaches(capacity, self.caches, 1 << 40, longest_blocks)

    @staticmethod
    def layout(inputs: "Inputs"):
        """Capacity per tier of each replayed cache, and how many: pooled routing is one cache of them all."""
        capacity = np.asarray(inputs.capacity_blocks, dtype=np.int64)
        if inputs.routing == "pooled":
            return capacity * inputs.caches, 1
        return capacity.copy(), inputs.caches

    @classmethod
    def most_bytes(cls, inputs: "Inputs", longest_blocks: int) -> int:
        """The most memory the stream's caches take (:meth:`~mcsim.kernels.kv_tiers.RunCaches.most_bytes`)."""
        capacity, caches = cls.layout(inputs)
        return 0 if capacity[0] == 0 else RunCaches.most_bytes(capacity, caches, longest_blocks)

    @staticmethod
    def streams(inputs: "Inputs") -> bool:
        """Whether the cache stage of ``inputs`` can run chunk by chunk."""
        return not (inputs.capacity_blocks[0] > 0 and inputs.pooled_tiers > 0)

    @classmethod
    def of(cls, inputs: "Inputs", rng, longest_blocks: int, block_tokens: int) -> "CacheStream | None":
        """The stream of ``inputs``, or None where the cache stage needs the whole sample."""
        return cls(inputs, rng, longest_blocks, block_tokens) if cls.streams(inputs) else None

    def cached_tokens(self, requests) -> np.ndarray:
        """Reused prompt tokens per request and tier of the next chunk (``requests``, with block runs)."""
        n = requests.n
        hits = np.zeros((n, self.tiers), dtype=np.int64)
        if self.runs is None or n == 0:
            return hits
        if requests.block_runs is None:
            raise ValueError("a streamed cache stage reads the generator's block runs")
        if self.policy == "round-robin" and self.n_instances > 1:
            instance = ((self.offset + np.arange(n)) % self.n_instances).astype(np.int32)
        else:
            instance = route(self.policy, requests.block_ptr, requests.block_ids if self.policy == "prefix-affinity"
                             else np.zeros(0, np.int64), self.n_instances, self.rng)
        self.offset += n
        serving = instance if self.caches > 1 else np.zeros(n, np.int32)
        self.runs.replay(requests.block_ptr, requests.block_runs, serving, hits, self.inputs.routing_balance)
        return _reused_tokens(hits, requests)


def warmup_requests(n: int, warmup_fraction: float) -> int:
    """Leading requests of a run of ``n`` that only warm the caches (at least one request is measured)."""
    return min(int(warmup_fraction * n), n - 1)


def steady_state(cached_tokens: np.ndarray, prompt_tokens: np.ndarray, warmup_fraction: float, tolerance: float,
                 arrival_s: np.ndarray | None = None, period_s: float = 0.0):
    """Has the cache reached steady state? Token hit rate of the last quarter of measured requests vs the third, or,
    under a rate profile, of the last whole periods vs as many periods before them.

    Parameters
    ----------
    cached_tokens : int64[n, tiers] or int64[n]
        Cached prompt tokens of *every* request of the sample, warm-up included (per tier or summed).
    prompt_tokens : int64[n]
    warmup_fraction : float
        ``mc.warmup_fraction``: the leading share of requests left out of the statistics.
    tolerance : float
        ``mc.steady_state_tolerance``: largest absolute hit-rate drift that counts as steady.
    arrival_s : float64[n], optional
        Arrival times, s: read under a rate profile.
    period_s : float
        The rate profile's period, s (0: a constant rate); see :class:`mcsim.stages.steady_state.ProfileBins`.

    Returns
    -------
    mcsim.stages.steady_state.SteadyState
        ``drift`` is the later window's hit rate minus the earlier one's; ``requests_needed`` the requests per
        sample at which the drift would fall to the tolerance (see :mod:`mcsim.stages.steady_state`).
    """
    cached = np.asarray(cached_tokens)
    cached = cached.sum(axis=1) if cached.ndim == 2 else cached
    n = len(prompt_tokens)
    check = SteadyStream(n, warmup_fraction, tolerance, period_s)
    if period_s > 0:
        check.add(cached, prompt_tokens, arrival_s)
        return check.result()
    windows = check.windows
    if windows is None:
        return steady.not_checked(n)
    return steady.check(cached.astype(np.float64), np.asarray(prompt_tokens, dtype=np.float64), windows, tolerance)


def steady_windows(n: int, warmup_fraction: float):
    """The four request windows :func:`steady_state` compares in a run of ``n``, or None when too few are
    measured."""
    half = n // 2
    warm, warm_half = warmup_requests(n, warmup_fraction), warmup_requests(max(half, 1), warmup_fraction)
    if n - warm < steady.MIN_MEASURED:
        return None
    windows = [*steady.quarter_bounds(n, warm)]
    # A run half as long: the same requests (the cache's state after request i depends on requests 0..i only).
    windows += [*steady.quarter_bounds(half, warm_half)] if half - warm_half >= steady.MIN_MEASURED else [(0, 0)] * 2
    return windows


class SteadyStream:
    """:func:`steady_state` over a sample's requests chunk by chunk: the windows' token sums, added as the chunks
    pass (integers, so the verdict is the one of the whole arrays). Under a rate profile (``period_s`` > 0) the
    sums are kept per time bin (:class:`mcsim.stages.steady_state.ProfileBins`), since the windows are known only
    once the last arrival is."""

    def __init__(self, n: int, warmup_fraction: float, tolerance: float, period_s: float = 0.0):
        self.n, self.tolerance = int(n), float(tolerance)
        self.windows = steady_windows(self.n, warmup_fraction)
        self.bins = None
        if period_s > 0 and self.windows is not None:
            self.bins = steady.ProfileBins(self.n, warmup_requests(self.n, warmup_fraction),
                                           warmup_requests(max(self.n // 2, 1), warmup_fraction), period_s)
        self.cached = np.zeros(4, np.int64)
        self.prompt = np.zeros(4, np.int64)
        self.at = 0

    def add(self, cached_tokens: np.ndarray, prompt_tokens: np.ndarray, arrival_s: np.ndarray | None = None) -> None:
        """The next chunk's reused tokens (per tier, or summed) and prompt tokens (and arrival times, s, under a
        rate profile)."""
        lo, hi = self.at, self.at + len(prompt_tokens)
        self.at = hi
        if self.windows is None:
            return
        cached = cached_tokens.sum(axis=1) if cached_tokens.ndim == 2 else cached_tokens
        if self.bins is not None:
            self.bins.add(arrival_s, cached, prompt_tokens)
            return
        for w, (start, stop) in enumerate(self.windows):
            a, b = max(start, lo) - lo, min(stop, hi) - lo
            if a < b:
                self.cached[w] += int(cached[a:b].sum())
                self.prompt[w] += int(prompt_tokens[a:b].sum())

    def result(self):
        if self.windows is None:
            return steady.not_checked(self.n)
        if self.bins is not None:
            return steady.verdict(self.bins.ratios(), self.n, self.tolerance)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = np.where(self.prompt > 0, self.cached / np.maximum(self.prompt, 1), np.nan)
        return steady.verdict(ratios, self.n, self.tolerance)

"""How the cache stage replays a sample's requests, decided before anything is allocated: which kernel, how many
caches of which capacity, and the most memory the replay takes.

:func:`mcsim.stages.kvcache.cache_hits` runs the plan :func:`replay_plan` makes; :func:`replay_bytes` counts what
that run allocates from the kernels' own counts (:func:`mcsim.kernels.kv_tiers.lookup_tiers_bytes`,
:func:`~mcsim.kernels.kv_tiers.lookup_tiers_runs_bytes`), so that a fleet too large for the machine is refused before
its caches exist (:mod:`mcsim.perf.fleet_memory`). Tests hold the count equal to the arrays a small run allocates.

Where the memory goes, per cache (one per instance, or one for ``routing = 'pooled'``):

* cache-aware routing over several caches, or pooled tiers behind the instances' own (``"routed"``): a workspace row
  of 16 bytes per (instance, distinct block of the sample) (the routed kernel keys every instance's blocks by one
  stride), a quarter more for the workspace's growth, 16 bytes per tier's list and 16 per instance for the router;
* other routings (``"runs"``, ``"keys"``): 16 bytes per tier's list; the key space grows with the requests, not the
  instances (the replay renumbers keys when instances x blocks would be sparse).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mcsim.kernels.kv_tiers import lookup_tiers_bytes, lookup_tiers_runs_bytes, run_id_range

#: Block ids are used as keys as they are while the largest is below twice the blocks plus this many; beyond, they
#: are renumbered (``np.unique``), so that a few large ids do not make a sparse key space.
DENSE_SLACK = 1 << 20


def dense_block_ids(block_ids) -> tuple[np.ndarray, int]:
    """Block ids as keys in ``0 .. U - 1`` (one cache's key space), and ``U``: as given when they are already small
    non-negative integers (the generator's, Mooncake's), else renumbered by ``np.unique``.

    Examples
    --------
    >>> dense_block_ids(np.array([4, 0, 4]))[1], dense_block_ids(np.array([10**12, 7]))[0].tolist()
    (5, [1, 0])
    """
    block_ids = np.asarray(block_ids, dtype=np.int64)
    if block_ids.size == 0:
        return block_ids, 1
    lo, hi = int(block_ids.min()), int(block_ids.max())
    if lo >= 0 and hi < 2 * block_ids.size + DENSE_SLACK:
        return block_ids, hi + 1
    unique, dense = np.unique(block_ids, return_inverse=True)
    return dense.astype(np.int64).reshape(-1), len(unique)


def run_span(requests) -> int:
    """One more than the largest block id of requests whose ids are runs (``Requests.block_runs``); 0 without runs
    (or with a negative id)."""
    runs = getattr(requests, "block_runs", None)  # (a trace's requests, or any with block_ids only, have none)
    if runs is None or requests.n == 0:
        return 0
    lowest, end = run_id_range(requests.block_ptr, runs)
    return end if lowest >= 0 else 0


def block_id_span(requests, exact: bool = True) -> int:
    """``U`` of :func:`dense_block_ids` over the requests' block ids, without writing out ids held as runs: the
    largest id + 1 while they are small non-negative integers; else the distinct ids, or, with ``exact`` False, the
    blocks (an upper bound found without sorting them)."""
    size = int(requests.block_ptr[-1] - requests.block_ptr[0])
    if size == 0:
        return 1
    if getattr(requests, "block_runs", None) is not None:
        lo, end = run_id_range(requests.block_ptr, requests.block_runs)
        hi = end - 1
    else:
        ids = requests.block_ids
        lo, hi = int(ids.min()), int(ids.max())
    if lo >= 0 and hi < 2 * size + DENSE_SLACK:
        return hi + 1
    return len(np.unique(requests.block_ids)) if exact else size


@dataclass(frozen=True)
class ReplayPlan:
    """How :func:`mcsim.stages.kvcache.cache_hits` replays a sample.

    Attributes
    ----------
    kind : str
        ``"none"`` (no cache or no whole block: nothing runs), ``"routed"`` (:func:`~mcsim.kernels.kv_tiers.
        lookup_tiers` over block ids with one stride per instance: cache-aware routing over several caches, or
        pooled tiers), ``"runs"`` (:func:`~mcsim.kernels.kv_tiers.lookup_tiers_runs` over the generator's runs) or
        ``"keys"`` (:func:`~mcsim.kernels.kv_tiers.lookup_tiers` over one dense key per (instance, block)).
    capacity : tuple of int
        Blocks per tier of each replayed cache (pooled routing: the instances' own tiers together).
    caches : int
        Caches replayed (1 under pooled routing or with pooled tiers only).
    private : int
        Leading tiers that are each cache's own; the rest are pooled.
    blocks : int
        Whole prompt blocks of the sample.
    span : int
        The runs' key space per cache (:func:`run_span`), for ``"runs"``.
    """

    kind: str
    capacity: tuple
    caches: int
    private: int
    blocks: int
    span: int = 0

    @property
    def pooled(self) -> bool:
        """Whether pooled tiers stand behind each cache's own."""
        return self.private < len(self.capacity)


def replay_plan(requests, policy: str, n_instances: int, capacity_per_instance, private_tiers: int = -1) -> ReplayPlan:
    """The plan of :func:`mcsim.stages.kvcache.cache_hits` (same arguments)."""
    capacity = np.asarray(capacity_per_instance, dtype=np.int64).copy()
    private = len(capacity) if private_tiers < 0 else int(private_tiers)
    caches = int(n_instances)
    if private == 0:  # only pooled tiers: one cache, as the kernel's own tiers of one instance
        caches, private = 1, len(capacity)
    elif policy == "pooled":
        capacity[:private] = capacity[:private] * n_instances
        caches = 1
    blocks = int(requests.block_ptr[-1] - requests.block_ptr[0])
    plan = dict(capacity=tuple(int(c) for c in capacity), caches=caches, private=private, blocks=blocks)
    if not (blocks and capacity[0] > 0):
        return ReplayPlan("none", **plan)
    if (policy == "cache-aware" and caches > 1) or private < len(capacity):
        return ReplayPlan("routed", **plan)
    span = run_span(requests)
    if span and caches * span <= 2 * blocks + DENSE_SLACK:  # the generator's runs, in a key space as dense
        return ReplayPlan("runs", span=span, **plan)
    return ReplayPlan("keys", **plan)


def replay_bytes(plan: ReplayPlan, requests, exact: bool = True) -> int:
    """The most memory the replay of ``plan`` allocates for its caches and router (not the per-request hit counts).

    ``exact`` False bounds the distinct blocks by the blocks where counting them would sort every id.
    """
    tiers = len(plan.capacity)
    if plan.kind == "none":
        return 0
    if plan.kind == "routed":
        stride = block_id_span(requests, exact)
        return lookup_tiers_bytes(plan.caches, plan.caches * stride, tiers, stride if plan.pooled else 0)
    if plan.kind == "runs":
        longest = int(np.diff(requests.block_ptr).max())
        return lookup_tiers_runs_bytes(np.array(plan.capacity), plan.caches, plan.span, longest, requests.n)[1]
    # "keys": the ids as they are, offset per instance, when that key space is dense; else at most a key per block
    span = run_span(requests) or block_id_span(requests, exact=False)
    keys = plan.caches * span if plan.caches * span <= 2 * plan.blocks + DENSE_SLACK else plan.blocks
    return lookup_tiers_bytes(plan.caches, keys, tiers)

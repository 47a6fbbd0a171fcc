"""Reference for :mod:`mcsim.kernels.kv_tiers`: tiered LRU prefix caches with one ``OrderedDict`` per tier.

Same semantics as the kernel, written for obviousness: each instance has one ordered dict per tier, first tier
first, whose insertion order is the LRU order (first item = least recently used). Block ids are used as given,
per instance, so no key remapping is needed here.
"""

from __future__ import annotations

from collections import OrderedDict


class TieredCache:
    """One instance's tiered LRU prefix cache: one ordered dict per tier, first item least recently used.

    Examples
    --------
    >>> cache = TieredCache((8, 0, 0))
    >>> cache.admit([0, 1]), cache.prefix([0, 2]), cache.admit([0, 2])
    ((0, 0, 0), 1, (1, 0, 0))
    """

    def __init__(self, capacity_blocks):
        self.capacity = tuple(int(c) for c in capacity_blocks)
        self.present = [t for t, c in enumerate(self.capacity) if c > 0]
        self.tiers = [OrderedDict() for _ in self.capacity]

    def prefix(self, blocks) -> int:
        """Leading blocks of ``blocks`` that some tier holds."""
        length = 0
        for block in blocks:
            if not any(block in t for t in self.tiers):
                break
            length += 1
        return length

    def admit(self, blocks) -> tuple[int, ...]:
        """Reused blocks per tier of a request, then every block to the MRU end of the first tier (last block
        first), overflow cascading down the tiers. Nothing is cached when the first tier's capacity is 0."""
        if self.capacity[0] == 0:
            return (0,) * len(self.capacity)
        tiers = self.tiers
        # Exact prefix: stop at the first block no tier holds.
        hits = [0] * len(tiers)
        for block in blocks:
            found = [t for t in range(len(tiers)) if block in tiers[t]]
            if not found:
                break
            hits[found[0]] += 1
        for block in reversed(blocks):
            for tier in tiers:
                tier.pop(block, None)
            tiers[0][block] = None
            for position, t in enumerate(self.present):
                while len(tiers[t]) > self.capacity[t]:
                    victim, _ = tiers[t].popitem(last=False)
                    if position + 1 < len(self.present):
                        tiers[self.present[position + 1]][victim] = None
        return tuple(hits)


def lookup_tiers_reference(
    block_lists: list[list[int]],
    instance: list[int],
    capacity_blocks: tuple[int, ...],
    n_instances: int | None = None,
    balance: float = 0.25,
    chosen: list | None = None,
) -> list[tuple[int, ...]]:
    """Replay requests in order through per-instance tiered LRU caches.

    Parameters
    ----------
    block_lists : list of list of int
        Prompt block ids of each request, in prompt order.
    instance : list of int
        Cache instance serving each request; block ids of different instances never meet.
    capacity_blocks : tuple of int
        Capacity per instance of each tier, first tier first, in blocks; 0 = tier absent; a first tier of 0 = no
        caching.
    n_instances, balance : optional
        Cache-aware routing for requests whose instance is -1: among instances ``0..n_instances-1`` the one
        with the longest cached prefix, unless its load (blocks routed so far) exceeds ``(1 + balance)`` x the
        least loaded one's, then the least loaded; ties go to the lower load, then the lower index.
    chosen : list, optional
        Receives the instance that served each request.

    Returns
    -------
    list of tuple of int
        Per request, the number of reused blocks found in each tier.

    Examples
    --------
    >>> lookup_tiers_reference([[0, 1], [0, 2]], [0, 0], (8, 0, 0))
    [(0, 0, 0), (1, 0, 0)]
    """
    if capacity_blocks[0] == 0:
        return [(0,) * len(capacity_blocks) for _ in block_lists]
    caches: dict[int, TieredCache] = {}
    results = []
    load: dict[int, int] = {}
    for blocks, inst in zip(block_lists, instance, strict=True):
        if inst == -1:
            candidates = range(n_instances)
            least = min(candidates, key=lambda i: (load.get(i, 0), i))

            def cached_prefix(i):
                return caches[i].prefix(blocks) if i in caches else 0

            inst = min(candidates, key=lambda i: (-cached_prefix(i), load.get(i, 0), i))
            if load.get(inst, 0) > (1 + balance) * load.get(least, 0):
                inst = least
        if chosen is not None:
            chosen.append(inst)
        load[inst] = load.get(inst, 0) + len(blocks)
        cache = caches.setdefault(inst, TieredCache(capacity_blocks))
        results.append(cache.admit(blocks))
    return results

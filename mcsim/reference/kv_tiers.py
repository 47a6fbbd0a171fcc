"""Reference for :mod:`mcsim.kernels.kv_tiers`: tiered LRU prefix caches with one ``OrderedDict`` per tier.

Same semantics as the kernel, written for obviousness: each instance has one ordered dict per tier, first tier
first, whose insertion order is the LRU order (first item = least recently used); pooled tiers are one more
chain of ordered dicts that every instance shares. Block ids are used as given, per instance, so no key
remapping is needed here.
"""

from __future__ import annotations

from collections import OrderedDict


class SharedTiers:
    """Pooled tiers: one chain of ordered dicts that every instance reads and fills, keyed by block id.

    Examples
    --------
    >>> pool = SharedTiers((2,))
    >>> pool.write(5); pool.write(6); pool.write(7); pool.find(5), pool.find(7)
    (None, 0)
    """

    def __init__(self, capacity_blocks):
        self.capacity = tuple(int(c) for c in capacity_blocks)
        self.present = [t for t, c in enumerate(self.capacity) if c > 0]
        self.tiers = [OrderedDict() for _ in self.capacity]

    def find(self, block) -> int | None:
        """The pooled tier holding ``block``, or None."""
        return next((t for t, tier in enumerate(self.tiers) if block in tier), None)

    def read(self, block):
        """A reused block read from the pool: its copy becomes the most recent of its tier."""
        self.tiers[self.find(block)].move_to_end(block)

    def write(self, block):
        """A block an instance evicts: the most recent of the first present pooled tier (moved there if the pool
        holds it), overflow cascading down the pooled tiers, the last one dropping."""
        if not self.present:
            return
        held = self.find(block)
        if held is not None:
            del self.tiers[held][block]
        self.tiers[self.present[0]][block] = None
        for position, t in enumerate(self.present):
            while len(self.tiers[t]) > self.capacity[t]:
                victim, _ = self.tiers[t].popitem(last=False)
                if position + 1 < len(self.present):
                    self.tiers[self.present[position + 1]][victim] = None


class TieredCache:
    """One instance's tiered LRU prefix cache: one ordered dict per tier, first item least recently used; with
    ``shared``, the pooled tiers behind its own (their hits are counted after its own tiers').

    Examples
    --------
    >>> cache = TieredCache((8, 0, 0))
    >>> cache.admit([0, 1]), cache.prefix([0, 2]), cache.admit([0, 2])
    ((0, 0, 0), 1, (1, 0, 0))
    """

    def __init__(self, capacity_blocks, shared: SharedTiers | None = None):
        self.capacity = tuple(int(c) for c in capacity_blocks)
        self.present = [t for t, c in enumerate(self.capacity) if c > 0]
        self.tiers = [OrderedDict() for _ in self.capacity]
        self.shared = shared

    def _private(self, block) -> bool:
        return any(block in t for t in self.tiers)

    def _pooled(self, block) -> int | None:
        return None if self.shared is None else self.shared.find(block)

    def prefix(self, blocks) -> int:
        """Leading blocks of ``blocks`` that some tier holds (the pool's included)."""
        length = 0
        for block in blocks:
            if not self._private(block) and self._pooled(block) is None:
                break
            length += 1
        return length

    def admit(self, blocks) -> tuple[int, ...]:
        """Reused blocks per tier of a request, then every block out of its tier and into the MRU end of the first
        tier (last block first), then each tier's overflow down to the next (and out of the last own tier into the
        pool). Nothing is cached when the first tier's capacity is 0."""
        own = len(self.capacity)
        hits = [0] * (own + (len(self.shared.capacity) if self.shared is not None else 0))
        if self.capacity[0] == 0:
            return tuple(hits)
        tiers = self.tiers
        # Exact prefix: stop at the first block no tier holds; the instance's own tiers are searched first.
        reused = 0
        for block in blocks:
            found = [t for t in range(own) if block in tiers[t]]
            if found:
                hits[found[0]] += 1
            elif self._pooled(block) is not None:
                hits[own + self._pooled(block)] += 1
            else:
                break
            reused += 1
        # What was read from the pool stays there, refreshed (last block first).
        for block in reversed(blocks[:reused]):
            if not self._private(block):
                self.shared.read(block)
        # The request holds its blocks: all leave their tiers, then all enter the first (last block first).
        for block in blocks:
            for tier in tiers:
                tier.pop(block, None)
        for block in reversed(blocks):
            tiers[0][block] = None
        # Then each tier in turn demotes its overflow to the next.
        for position, t in enumerate(self.present):
            while len(tiers[t]) > self.capacity[t]:
                victim, _ = tiers[t].popitem(last=False)
                if position + 1 < len(self.present):
                    tiers[self.present[position + 1]][victim] = None
                elif self.shared is not None:
                    self.shared.write(victim)
        return tuple(hits)


def lookup_tiers_reference(
    block_lists: list[list[int]],
    instance: list[int],
    capacity_blocks: tuple[int, ...],
    n_instances: int | None = None,
    balance: float = 0.25,
    chosen: list | None = None,
    n_private: int | None = None,
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
    n_private : int, optional
        Tiers ``0..n_private-1`` are each instance's own, the rest pooled: one chain shared by every instance
        (default: all tiers are each instance's own).

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
    n_private = len(capacity_blocks) if n_private is None else n_private
    shared = SharedTiers(capacity_blocks[n_private:]) if n_private < len(capacity_blocks) else None
    caches: dict[int, TieredCache] = {}
    results = []
    load: dict[int, int] = {}
    for blocks, inst in zip(block_lists, instance, strict=True):
        if inst == -1:
            candidates = range(n_instances)
            least = min(candidates, key=lambda i: (load.get(i, 0), i))

            def cached_prefix(i):
                return (caches[i] if i in caches else TieredCache(capacity_blocks[:n_private], shared)).prefix(blocks)

            inst = min(candidates, key=lambda i: (-cached_prefix(i), load.get(i, 0), i))
            if load.get(inst, 0) > (1 + balance) * load.get(least, 0):
                inst = least
        if chosen is not None:
            chosen.append(inst)
        load[inst] = load.get(inst, 0) + len(blocks)
        cache = caches.setdefault(inst, TieredCache(capacity_blocks[:n_private], shared))
        results.append(cache.admit(blocks))
    return results

"""Reference for :mod:`mcsim.kernels.kv_tiers`: tiered LRU prefix caches with one ``OrderedDict`` per tier.

Same semantics as the kernel, written for obviousness: each instance has three ordered dicts (HBM, DRAM,
NVMe) whose insertion order is the LRU order (first item = least recently used). Block ids are used as
given, per instance, so no key remapping is needed here.
"""

from __future__ import annotations

from collections import OrderedDict


def lookup_tiers_reference(
    block_lists: list[list[int]],
    instance: list[int],
    capacity_blocks: tuple[int, int, int],
    n_instances: int | None = None,
    balance: float = 0.25,
    chosen: list | None = None,
) -> list[tuple[int, int, int]]:
    """Replay requests in order through per-instance HBM → DRAM → NVMe LRU caches.

    Parameters
    ----------
    block_lists : list of list of int
        Prompt block ids of each request, in prompt order.
    instance : list of int
        Cache instance serving each request; block ids of different instances never meet.
    capacity_blocks : (int, int, int)
        Capacity per instance of HBM, DRAM and NVMe, in blocks; 0 = tier absent; HBM 0 = no caching.
    n_instances, balance : optional
        Cache-aware routing for requests whose instance is -1: among instances ``0..n_instances-1`` the one
        with the longest cached prefix, unless its load (blocks routed so far) exceeds ``(1 + balance)`` x the
        least loaded one's, then the least loaded; ties go to the lower load, then the lower index.
    chosen : list, optional
        Receives the instance that served each request.

    Returns
    -------
    list of (int, int, int)
        Per request, the number of reused blocks found in HBM, DRAM and NVMe.

    Examples
    --------
    >>> lookup_tiers_reference([[0, 1], [0, 2]], [0, 0], (8, 0, 0))
    [(0, 0, 0), (1, 0, 0)]
    """
    if capacity_blocks[0] == 0:
        return [(0, 0, 0) for _ in block_lists]
    present = [t for t in range(3) if capacity_blocks[t] > 0]
    caches: dict[int, list[OrderedDict]] = {}
    results = []
    load: dict[int, int] = {}
    for blocks, inst in zip(block_lists, instance, strict=True):
        if inst == -1:
            candidates = range(n_instances)
            least = min(candidates, key=lambda i: (load.get(i, 0), i))

            def cached_prefix(i):
                tiers_i = caches.get(i, [{}, {}, {}])
                length = 0
                for block in blocks:
                    if not any(block in t for t in tiers_i):
                        break
                    length += 1
                return length

            inst = min(candidates, key=lambda i: (-cached_prefix(i), load.get(i, 0), i))
            if load.get(inst, 0) > (1 + balance) * load.get(least, 0):
                inst = least
        if chosen is not None:
            chosen.append(inst)
        load[inst] = load.get(inst, 0) + len(blocks)
        tiers = caches.setdefault(inst, [OrderedDict(), OrderedDict(), OrderedDict()])

        # Exact prefix: stop at the first block no tier holds.
        hits = [0, 0, 0]
        for block in blocks:
            found = [t for t in range(3) if block in tiers[t]]
            if not found:
                break
            hits[found[0]] += 1
        results.append(tuple(hits))

        # Every block moves to the MRU end of HBM, last block first; overflow cascades down the tiers.
        for block in reversed(blocks):
            for tier in tiers:
                tier.pop(block, None)
            tiers[0][block] = None
            for position, t in enumerate(present):
                while len(tiers[t]) > capacity_blocks[t]:
                    victim, _ = tiers[t].popitem(last=False)
                    if position + 1 < len(present):
                        tiers[present[position + 1]][victim] = None
    return results

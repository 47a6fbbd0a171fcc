"""KV-cache tiers: an exclusive hierarchy of 1 to 8 tiers with one LRU list per tier per instance.

The tiers are data: ``capacity_blocks`` lists them in order, first (the GPUs' memory, where blocks are used) to
last (e.g. HBM → DRAM → CXL → NVMe), and nothing here names them. The loop replays requests in index order (the
caller sorts them by arrival) against per-instance prefix caches and counts, for every request, how many of its
prompt blocks were reused from each tier.

State lives in flat arrays indexed by a dense block key instead of hash maps: every key has one row
``(prev, next, tier, owner)`` of an intrusive doubly linked list, and every (instance, tier) pair has a head
(most recently used), a tail (least recently used) and a count. Every block operation — look-up, unlink,
push to the MRU end, demotion of the LRU block — is O(1) and touches one 16-byte row.

Semantics (the same as :func:`mcsim.reference.kv_tiers.lookup_tiers_reference`, which tests check):

1. *Exact-prefix reuse.* A request reuses the longest run of leading blocks that are each present in some
   tier of its instance; each such block is counted as a hit in the tier where it was found. A block present
   after the first missing block is not reused (vLLM, SGLang and Mooncake can only reuse a whole prefix).
2. *Everything ends in the first tier.* Then every block of the request leaves the tier it is in (the request
   holds them all: none of them can be evicted by its own admission), and all go (restored, promoted or
   inserted) to the MRU end of the first tier — including present blocks beyond the first miss, because the
   request now holds them there. Blocks are inserted in *reverse* prompt order, so the first (most shareable)
   block ends most recently used and tail blocks are evicted first, as vLLM's evictor does.
3. *LRU demotion.* Then each tier in turn, first to last, while it holds more blocks than its capacity, demotes
   its LRU block to the MRU end of the next tier with nonzero capacity; overflow of the last such tier drops the
   block. A tier with capacity 0 is absent and skipped. A first tier of capacity 0 means no caching at all:
   every hit count stays 0.

A block lives in at most one tier of its instance (exclusive hierarchy).

Pooled tiers
------------
With ``n_private < T`` the tiers ``n_private..T-1`` are *pooled*: one capacity that every instance shares (a KV
store such as Mooncake's, or LMCache's remote back end), keyed by the block id alone, behind each instance's own
(private) tiers ``0..n_private-1``. The private chain works as above; the pool adds:

4. *Look-up.* A block that none of the instance's private tiers holds is looked up in the pool; found there, it
   counts as a hit of the pooled tier that holds it. The private tiers are searched first: a block in both
   counts in the private tier.
5. *Reads keep the pool's copy.* A reused block found in the pool is restored into the instance's first tier
   (rule 2) and its pool copy stays, moved to the MRU end of its pooled tier (reads refresh it; the reused
   blocks are touched last block first, before rule 2 moves anything). So a pooled tier may hold blocks that an
   instance also holds privately: the hierarchy is exclusive within the instance and within the pool.
6. *Eviction demotes into the pool.* When the instance's last present private tier overflows, its LRU block
   leaves the instance and is written to the MRU end of the first present pooled tier (a block the pool holds
   already is moved there); the pooled tiers demote down their own chain, and the last one drops. A pooled
   tier of capacity 0 is absent, as a private one is.

Pooled tiers need block ids in the ``key_stride`` layout (instance ``i``'s key of block ``b`` is
``i * key_stride + b``); the pool's key of ``b`` is ``n_keys + b``, so the workspace has ``n_keys + key_stride``
rows. Cache-aware routing counts the blocks the pool holds as held by every instance.
"""

from __future__ import annotations

import threading

import numpy as np

from mcsim.accelerate import kernel

#: The most tiers a hierarchy may have.
MAX_TIERS = 8

# One int32 row per key: links of the LRU list it is in, its tier (or _ABSENT), its instance.
_ROW = 4
_PREV, _NEXT, _TIER, _OWNER = 0, 1, 2, 3
_NIL = -1
_ABSENT = -1


_local = threading.local()


def _workspace(n_keys: int) -> np.ndarray:
    buffer = getattr(_local, "state", None)
    if buffer is None or buffer.shape[0] < n_keys:
        buffer = np.empty((_workspace_rows(n_keys), _ROW), np.int32)
        _local.state = buffer
    return buffer[:n_keys]


def _workspace_rows(n_keys: int) -> int:
    """Rows of a new workspace for ``n_keys`` keys: a quarter more, and 1024, so that slightly larger calls after it
    reuse it."""
    return int(n_keys * 1.25) + 1024


def workspace_bytes(n_keys: int) -> int:
    """Bytes of the per-thread workspace of ``n_keys`` rows where a call allocates it (a thread keeps the largest
    one it has needed, and a call that fits in it allocates nothing)."""
    return _workspace_rows(n_keys) * _ROW * 4


def lookup_tiers_bytes(n_instances: int, n_keys: int, n_tiers: int, pool_rows: int = 0) -> int:
    """The most memory :func:`lookup_tiers` allocates: its workspace of ``n_keys`` rows (plus ``pool_rows``, its
    ``key_stride`` with pooled tiers), a head, tail (int32) and count (int64) per list (``n_tiers`` per instance,
    and the pool's), and two int64 counters per instance (blocks admitted, cached prefix length).

    Examples
    --------
    >>> lookup_tiers_bytes(2, 1000, 3)  # (1250 + 1024) rows x 16 B, 6 lists x 16 B, 2 x 2 counters x 8 B
    36512
    """
    lists = int(n_tiers) * (int(n_instances) + (1 if pool_rows else 0))
    return workspace_bytes(int(n_keys) + int(pool_rows)) + 16 * lists + 16 * max(int(n_instances), 1)


def lookup_tiers(block_ptr, block_keys, instance, n_instances, n_keys, capacity_blocks, out_hits, key_stride=0,
                 balance=0.25, n_private=None):
    """Replay requests through per-instance tiered LRU prefix caches and count reused blocks per tier.

    Parameters
    ----------
    block_ptr : int64 array, shape (n + 1,)
        CSR pointers: request ``r``'s prompt blocks are ``block_keys[block_ptr[r]:block_ptr[r + 1]]`` in
        prompt order. Non-decreasing, ``block_ptr[n] <= len(block_keys)``.
    block_keys : int64 array, shape (nnz,)
        Dense block keys in ``[0, n_keys)``. A key must belong to exactly one instance: the caller maps each
        (instance, chain-hashed block id) pair to its own key (for a pooled cache, use one instance). Within
        one request keys are expected to be distinct, as chain-hashed ids are.
    instance : int32 array, shape (n,)
        Cache instance serving each request, in ``[0, n_instances)``; -1 routes the request cache-aware (see
        Notes) and the chosen instance is written back into ``instance``.
    n_instances : int
        Number of cache instances; each has its own capacity in every tier.
    n_keys : int
        Number of distinct block keys (at most 2**31 - 1).
    capacity_blocks : int64 array, shape (T,), 1 <= T <= MAX_TIERS
        Capacity of one instance's tiers, first tier first, in blocks; 0 means the tier is absent. A first
        tier of capacity 0 means no prefix caching at all (all hits stay 0).
    out_hits : int64 array, shape (n, T)
        Zero-initialised by the caller. On return ``out_hits[r, t]`` is the number of request ``r``'s reused
        blocks found in tier ``t`` (in the order of ``capacity_blocks``). Hits are added to what is there.
    key_stride : int, optional
        0 (default): ``block_keys`` are already per-instance keys. > 0: they are block ids in
        ``[0, key_stride)`` and instance ``i`` uses key ``i * key_stride + id`` (needed for cache-aware routing,
        where the instance is only known inside the loop); ``n_keys`` must then be ``n_instances * key_stride``.
    balance : float, optional
        Cache-aware routing's load guard: the instance with the longest cached prefix is chosen unless its
        load (blocks routed to it so far) exceeds ``(1 + balance)`` x the least-loaded instance's, in which case
        the least-loaded instance is chosen (the rule of SGLang's cache-aware router). Ties go to the lower
        load, then the lower index.
    n_private : int, optional
        Tiers ``0..n_private-1`` are private to each instance, the rest pooled (see "Pooled tiers" in the module
        docstring); default: every tier private. At least 1; pooled tiers need ``key_stride > 0``.

    Raises
    ------
    ValueError
        On inconsistent shapes, a pointer, instance or key out of range, a negative capacity, or a key seen
        in two instances while still cached in one (``out_hits`` is then partly written).

    Notes
    -----
    Requests are processed in index order. Memory: 16 bytes per key, and 16 per list and per instance
    (:func:`lookup_tiers_bytes`). Time: O(nnz + n_keys), each block costs O(1) list operations plus at most one
    demotion per tier. This wrapper only checks dtypes and allocates every array; the loop runs in a compiled
    kernel that releases the GIL. A key shared by two instances is detected only when it is looked up while cached
    in the other one, which is exactly when it would make the result differ from per-instance caches.

    Examples
    --------
    >>> ptr = np.array([0, 2, 4], np.int64); keys = np.array([0, 1, 0, 2], np.int64)
    >>> hits = np.zeros((2, 3), np.int64)
    >>> lookup_tiers(ptr, keys, np.zeros(2, np.int32), 1, 3, np.array([8, 0, 0]), hits)
    >>> hits[1].tolist()  # block 0 is reused from the first tier, block 2 is new
    [1, 0, 0]
    """
    block_ptr = np.ascontiguousarray(block_ptr, dtype=np.int64)
    block_keys = np.ascontiguousarray(block_keys, dtype=np.int64)
    instance = np.ascontiguousarray(instance, dtype=np.int32)
    capacity_blocks = np.ascontiguousarray(capacity_blocks, dtype=np.int64)
    if block_ptr.ndim != 1 or block_keys.ndim != 1 or instance.ndim != 1 or capacity_blocks.ndim != 1:
        raise ValueError("block_ptr, block_keys, instance and capacity_blocks must be 1-D")
    if not (
        isinstance(out_hits, np.ndarray)
        and out_hits.dtype == np.int64
        and out_hits.ndim == 2
        and out_hits.flags.c_contiguous
        and out_hits.flags.writeable
    ):
        raise ValueError("out_hits must be a writeable C-contiguous int64 array of shape (len(instance), tiers)")
    n_tiers = capacity_blocks.shape[0]
    if not 1 <= n_tiers <= MAX_TIERS:
        raise ValueError(f"capacity_blocks must have 1 to {MAX_TIERS} tiers, got {n_tiers}")
    n_instances = int(n_instances)
    n_keys = int(n_keys)
    if not 0 <= n_keys < 2**31 or n_instances < 0:
        raise ValueError("n_instances must be >= 0 and n_keys in [0, 2**31)")
    # Workspace allocated by NumPy, not inside the kernel: NumPy asks Linux for huge pages on large arrays,
    # which makes first-touch page faults (and TLB misses on random rows) several times cheaper. It is kept per
    # thread and reused by the next call: page faults of threads in one process serialise in the kernel, so
    # fresh allocations every sample would stop threads from scaling.
    key_stride = int(key_stride)
    if key_stride < 0 or (key_stride > 0 and n_keys != n_instances * key_stride):
        raise ValueError("key_stride must be 0, or > 0 with n_keys == n_instances * key_stride")
    if key_stride == 0 and instance.size and instance.min() < 0:
        raise ValueError("cache-aware routing (instance -1) needs key_stride > 0")
    n_private = n_tiers if n_private is None else int(n_private)
    if not 1 <= n_private <= n_tiers:
        raise ValueError(f"n_private must be in [1, {n_tiers}], got {n_private}")
    pool_rows = key_stride if n_private < n_tiers else 0
    if n_private < n_tiers and key_stride == 0:
        raise ValueError("pooled tiers (n_private < len(capacity_blocks)) need key_stride > 0")
    if n_keys + pool_rows >= 2**31:
        raise ValueError("n_keys plus the pool's key_stride rows must be < 2**31")
    state = _workspace(n_keys + pool_rows)
    lists = n_tiers * (n_instances + (1 if pool_rows else 0))  # the pooled tiers' lists after every instance's
    head = np.empty(lists, np.int32)
    tail = np.empty(lists, np.int32)
    count = np.empty(lists, np.int64)
    counters = np.zeros((2, max(n_instances, 1)), np.int64)  # blocks admitted, cached prefix lengths
    _replay(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail, count,
            key_stride, float(balance), n_private, counters[0], counters[1])


def run_id_range(block_ptr, block_runs) -> tuple[int, int]:
    """The smallest block id of requests whose ids are runs (see :func:`lookup_tiers_runs`), and one more than the
    largest; ``(0, 0)`` without a block.

    Examples
    --------
    >>> run_id_range(np.array([0, 3, 6]), np.array([[2, 0, 10], [2, 0, 20]]))  # ids 0, 1, 12 and 0, 1, 22
    (0, 23)
    """
    counts = np.diff(np.asarray(block_ptr, dtype=np.int64))
    runs = np.asarray(block_runs, dtype=np.int64).reshape(-1, 3)
    shared = np.minimum(runs[:, 0], counts)
    has_shared, has_own = shared > 0, counts > shared
    if not (has_shared.any() or has_own.any()):
        return 0, 0
    starts = np.concatenate([runs[has_shared, 1], (runs[:, 2] + shared)[has_own]])
    ends = np.concatenate([(runs[:, 1] + shared)[has_shared], (runs[:, 2] + counts)[has_own]])
    return int(starts.min()), int(ends.max())


def lookup_tiers_runs(block_ptr, block_runs, instance, n_instances, span, capacity_blocks, out_hits, bounded=None):
    """:func:`lookup_tiers` for requests whose prompt blocks are two runs of consecutive ids, without a CSR array of
    their ids (the generator's requests: the blocks of a shared system prompt, then those of the request's own
    conversation).

    Block ``k`` of request ``r`` (``k < block_ptr[r + 1] - block_ptr[r]``) is ``shared_base + k`` while
    ``k < shared_blocks``, else ``own_base + k``, with ``(shared_blocks, shared_base, own_base) = block_runs[r]``;
    ids lie in ``[0, span)`` and instance ``i`` keeps block ``b`` under key ``i * span + b``. Every tier is each
    instance's own; the instance of each request is given (no cache-aware routing). Same results as
    :func:`lookup_tiers` on the ids written out, with ``n_keys = n_instances * span``.

    Memory and time: ``bounded`` (default: unless a row per key of the key space takes less memory at the worst), the
    caches of :class:`RunCaches`, which hold segments of runs, found through a hash table of runs: their memory
    depends on the capacities, not on the number of requests or blocks, and their work is per segment (a session's
    prefix moves as one or two list nodes). Else a row of 16 bytes per key of the key space and a list operation per
    block (:func:`admit_blocks`, the kernel of the written-out ids).

    Examples
    --------
    >>> ptr = np.array([0, 3, 6], np.int64)
    >>> runs = np.array([[2, 0, 10], [2, 0, 20]], np.int64)  # two requests sharing a 2-block system prompt
    >>> hits = np.zeros((2, 3), np.int64)
    >>> lookup_tiers_runs(ptr, runs, np.zeros(2, np.int32), 1, 30, np.array([8, 0, 0]), hits)
    >>> hits[1].tolist()  # blocks 0 and 1 are reused, block 22 is new
    [2, 0, 0]
    """
    block_ptr = np.ascontiguousarray(block_ptr, dtype=np.int64)
    block_runs = np.ascontiguousarray(block_runs, dtype=np.int64)
    instance = np.ascontiguousarray(instance, dtype=np.int32)
    capacity_blocks = np.ascontiguousarray(capacity_blocks, dtype=np.int64)
    n = instance.shape[0]
    n_instances, span = int(n_instances), int(span)
    if block_runs.shape != (n, 3) or block_ptr.shape != (n + 1,):
        raise ValueError("block_runs must have shape (n, 3) and block_ptr n + 1 entries, n = len(instance)")
    if out_hits.dtype != np.int64 or out_hits.shape != (n, capacity_blocks.shape[0]) or not out_hits.flags.c_contiguous:
        raise ValueError("out_hits must be a C-contiguous int64 array of shape (len(instance), tiers)")
    if not 1 <= capacity_blocks.shape[0] <= MAX_TIERS or np.any(capacity_blocks < 0):
        raise ValueError(f"capacity_blocks must be 1 to {MAX_TIERS} values >= 0")
    if not 0 <= n_instances * span < 2**31:
        raise ValueError("n_instances x span must be in [0, 2**31)")
    if n and (instance.min() < 0 or instance.max() >= n_instances):
        raise ValueError("instance out of range [0, n_instances)")
    counts = np.diff(block_ptr)
    lowest, end = run_id_range(block_ptr, block_runs)
    if n and (np.any(counts < 0) or np.any(block_runs[:, 0] < 0) or lowest < 0 or end > span):
        raise ValueError("block_runs give ids outside [0, span) (or block_ptr decreases)")
    if capacity_blocks[0] == 0:
        return
    longest = int(counts.max()) if n else 0
    lists = capacity_blocks.shape[0] * n_instances
    if bounded is None:
        bounded = lookup_tiers_runs_bytes(capacity_blocks, n_instances, span, longest, n)[0]
    if not bounded:
        _replay_runs(block_ptr, block_runs, instance, capacity_blocks, out_hits, _workspace(n_instances * span),
                     np.empty(lists, np.int32), np.empty(lists, np.int32), np.empty(lists, np.int64), span, longest)
        return
    caches = RunCaches(capacity_blocks, n_instances, span, longest, requests=n)
    caches.replay(block_ptr, block_runs, instance, out_hits)


def lookup_tiers_runs_bytes(capacity_blocks, n_instances: int, span: int, longest: int,
                            requests: int | None = None) -> tuple[bool, int]:
    """Whether :func:`lookup_tiers_runs` takes :class:`RunCaches` by default, and the most memory it then allocates:
    their most for ``requests`` requests (:meth:`RunCaches.most_bytes`), or a workspace row per key of the key space
    and a head, tail and count per list. The caches of segments are faster: they are taken unless the key space
    takes less memory.

    Examples
    --------
    >>> lookup_tiers_runs_bytes(np.array([8, 0, 0]), 2, 1000, 4)  # segments for 2 x 8 blocks, against 2,000 keys
    (True, 5520)
    >>> lookup_tiers_runs_bytes(np.array([8000, 0, 0]), 2, 100, 4)  # 200 keys
    (False, 20480)
    """
    n_instances, span = int(n_instances), int(span)
    bounded_bytes = RunCaches.most_bytes(capacity_blocks, n_instances, longest, requests)
    dense_bytes = workspace_bytes(n_instances * span) + 16 * len(capacity_blocks) * n_instances
    if bounded_bytes <= dense_bytes:
        return True, bounded_bytes
    return False, dense_bytes


class RunCaches:
    """Per-instance tiered LRU caches of requests whose blocks are runs of consecutive ids (the generator's), kept
    from one call to the next: a stream of requests replayed chunk by chunk reuses exactly what it would reuse in
    one call, and exactly what :func:`lookup_tiers` reuses on the ids written out (rules 1-3 of the module
    docstring).

    A run is every block id ``base + k`` of one base (a system prompt's, or a session's conversation); runs of
    different bases must not share ids (the generator's do not). The caches hold *segments*, not blocks: a segment
    is a range ``[lo, hi)`` of one run's offsets that sits in one tier, its blocks next to each other in that
    tier's LRU order (the lowest offset the most recently used: a request inserts its blocks last block first, and
    demotion keeps that order). A request's look-up walks its two runs' segments in offset order; its admission
    takes the range it holds out of the segments (cutting at most one at each end), puts one segment at the MRU
    end of the first tier (merged with the one there when they join), and each tier demotes its overflow from the
    LRU end a segment, or the part of one, at a time (merged with the next tier's MRU segment when they join). So
    the work is per segment, not per block: a session's prefix of hundreds of blocks moves as one or two list
    nodes.

    A run's segments are found through an open-addressing hash table keyed by ``(instance, base)``; the table
    grows (doubling, re-hashed between two requests) to stay at most half full. Segments are taken in order and
    given back to a free stack, so only those ever in use take memory; their worst case, one block each
    (:meth:`most_bytes`), is what a plan reserves.

    Parameters
    ----------
    capacity_blocks : int64[T]
        One instance's capacity per tier, blocks (first tier > 0).
    n_instances, span : int
        Instances, and the block ids' range ``[0, span)``; instance ``i`` keys a run of base ``b`` as
        ``i * span + b``.
    longest : int
        The most blocks one request may have.
    requests : int, optional
        The most requests it will replay, if known: a request adds at most ``4 + T`` segments (a new one for each of
        its two runs, one cut at the end of each, one piece demoted out of each tier but the last), which bounds
        them when that is fewer than the capacities allow.

    Examples
    --------
    >>> caches = RunCaches(np.array([8, 0, 0]), 1, 1 << 40, 4)
    >>> hits = np.zeros((1, 3), np.int64)
    >>> caches.replay(np.array([0, 3]), np.array([[2, 0, 10]]), np.zeros(1, np.int32), hits)
    >>> caches.replay(np.array([0, 3]), np.array([[2, 0, 20]]), np.zeros(1, np.int32), hits)
    >>> hits[0].tolist()  # the second request (its own call) reuses the shared blocks 0 and 1
    [2, 0, 0]
    >>> caches.live()  # runs and segments: the shared run (one segment), the two conversations' (one each)
    (3, 3)
    """

    #: The hash table's first size, in slots (or its largest, if smaller).
    FIRST_SLOTS = 1 << 12

    def __init__(self, capacity_blocks, n_instances: int, span: int, longest: int, requests: int | None = None):
        self.capacity_blocks = np.ascontiguousarray(capacity_blocks, dtype=np.int64)
        self.n_instances, self.span, self.longest = int(n_instances), int(span), int(longest)
        if not 0 <= self.n_instances * self.span < 2**62:
            raise ValueError("n_instances x span must be in [0, 2**62)")
        lists = self.capacity_blocks.shape[0] * self.n_instances
        rows = self.rows_for(self.capacity_blocks, self.n_instances, self.longest, requests)
        self.requests = None if requests is None else int(requests)
        self.replayed = 0
        if rows >= 2**31:
            raise ValueError("the caches' capacities need 2**31 segments or more")
        self._arrays = _take_run_arrays(rows, lists)
        self.seg, self.run_key, self.run_first, self.seg_free, self.run_free, self.head, self.tail, self.count = \
            self._arrays
        self.table = np.full(min(self.FIRST_SLOTS, _slots(rows)), -1, np.int32)
        # free segments, segments used, free runs, runs used, live runs, reset first (1)
        self.top = np.array([0, 0, 0, 0, 0, 1], np.int64)
        # blocks admitted per instance, and scratch for each one's cached prefix (cache-aware routing)
        self.load = np.zeros(max(self.n_instances, 1), np.int64)
        self.lengths = np.zeros(max(self.n_instances, 1), np.int64)

    def __del__(self):
        try:
            _give_back_run_arrays(getattr(self, "_arrays", None))
        except Exception:  # at interpreter shutdown the module may be gone: nothing to keep then
            pass

    @staticmethod
    def rows_for(capacity_blocks, n_instances: int, longest: int, requests: int | None = None) -> int:
        """Segments the caches may need at most: one per block every instance's tiers hold, one request's blocks
        more (before its tiers demote), and 64; or, with ``requests`` and when fewer, ``4 + T`` per request and 64."""
        rows = int(n_instances) * int(np.sum(capacity_blocks)) + int(longest) + 64
        if requests is not None:
            rows = min(rows, (4 + len(capacity_blocks)) * int(requests) + 64)
        return rows

    @staticmethod
    def most_bytes(capacity_blocks, n_instances: int, longest: int, requests: int | None = None) -> int:
        """Bytes of the caches' arrays at their worst (a segment for every block, every run of one segment): 32 B a
        segment, 12 B a run, a free-stack entry (4 B) of each, a hash table at most half full (4 B a slot), a head,
        tail and count per list, and the two counters per instance of cache-aware routing. The runs and segments
        in use are far fewer (a run's cached prefix is usually one or two segments): :meth:`live`."""
        rows = RunCaches.rows_for(capacity_blocks, n_instances, longest, requests)
        lists = len(capacity_blocks) * int(n_instances)
        per_segment = 4 * _SEG + 8 + 4 + 4 + 4  # its row, its run's key and first segment, two free-stack entries
        return rows * per_segment + 4 * _slots(rows) + lists * (4 + 4 + 8) + 16 * max(int(n_instances), 1)

    def live(self) -> tuple[int, int]:
        """Runs and segments in the caches now."""
        if self.top[5]:
            return 0, 0
        return int(self.top[4]), int(self.top[1] - self.top[0])

    def replay(self, block_ptr, block_runs, instance, out_hits, balance: float = 0.25) -> None:
        """Replay requests (block ``k`` of request ``r`` is ``shared_base + k`` while ``k < shared_blocks``, else
        ``own_base + k``, with ``(shared_blocks, shared_base, own_base) = block_runs[r]``; each at most ``longest``
        blocks) after those of the earlier calls, adding their hits per tier to ``out_hits``. A request of
        ``instance`` -1 is routed cache-aware (``balance`` as :func:`lookup_tiers`'s) and its instance written."""
        block_ptr = np.ascontiguousarray(block_ptr, dtype=np.int64)
        n = block_ptr.shape[0] - 1
        if n > 0 and int(np.diff(block_ptr).max()) > self.longest:
            raise ValueError(f"a request has more than longest = {self.longest} blocks")
        instance = np.ascontiguousarray(instance, dtype=np.int32)
        if instance.size and (int(instance.min()) < -1 or int(instance.max()) >= self.n_instances):
            raise ValueError("instance out of range [-1, n_instances)")
        block_runs = np.ascontiguousarray(block_runs, dtype=np.int64)
        if block_runs.shape != (n, 3) or instance.shape != (n,) or out_hits.shape != (n, len(self.capacity_blocks)):
            raise ValueError("block_runs (n, 3), instance (n,) and out_hits (n, tiers) must match block_ptr's n + 1")
        if self.requests is not None and self.replayed + n > self.requests:
            raise ValueError(f"more than the {self.requests} requests these caches were sized for")
        self.replayed += n
        if self.capacity_blocks[0] == 0:
            return
        done = 0
        next_tier = next_tiers(self.capacity_blocks)
        while done < n:
            done = _replay_segments(block_ptr, block_runs, instance, done, self.capacity_blocks, next_tier, out_hits,
                                    self.seg, self.run_key, self.run_first, self.seg_free, self.run_free, self.head,
                                    self.tail, self.count, self.table, self.top, self.span, self.load,
                                    self.lengths, float(balance))
            if done < n:  # the table is half full: twice the slots, every live run placed again
                table = np.full(2 * self.table.shape[0], -1, np.int32)
                _rehash(table, self.run_key, int(self.top[3]))
                self.table = table


def _take_run_arrays(rows: int, lists: int) -> tuple:
    """The arrays of a :class:`RunCaches` of ``rows`` segments and ``lists`` lists: those an earlier one of the
    same shapes gave back in this thread (their pages already touched: a sample after the first does not pay the
    operating system's first touch again), else new ones. Their contents do not matter: a reset writes what is
    read before it is written."""
    kept = getattr(_local, "run_arrays", None)
    if kept is not None and kept[0] == (rows, lists):
        _local.run_arrays = None
        return kept[1]
    return (np.empty((rows, _SEG), np.int32), np.empty(rows, np.int64), np.empty(rows, np.int32),
            np.empty(rows, np.int32), np.empty(rows, np.int32), np.empty(lists, np.int32), np.empty(lists, np.int32),
            np.empty(lists, np.int64))


def _give_back_run_arrays(arrays) -> None:
    """Keep the arrays of a :class:`RunCaches` no longer used, for the next one of the same shapes in this thread
    (one set at most: a new shape replaces it)."""
    if arrays is not None:
        _local.run_arrays = ((arrays[0].shape[0], arrays[5].shape[0]), arrays)


def _slots(rows: int) -> int:
    """Hash table slots for ``rows`` rows: a power of two, at most half full."""
    return 1 << max(int(2 * rows - 1).bit_length(), 4)


# A segment's row: its offsets [lo, hi) in its run, its neighbours in its tier's LRU list (toward the MRU end, toward
# the LRU end), in its run's offset order (lower, higher), its tier, its run.
_SEG = 8
_LO, _HI, _UP, _DOWN, _BELOW, _ABOVE, _STIER, _RUN = 0, 1, 2, 3, 4, 5, 6, 7


@kernel(inline="always")
def _home(key, shift):
    """Home slot of a run's key in a table of ``2 ** (64 - shift)`` slots (Fibonacci hashing: the product's top
    bits)."""
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift))


@kernel(inline="always")
def _table_shift(slots):
    """64 less log2 of a power-of-two number of slots: the shift of :func:`_home`."""
    shift = 64
    while (1 << (64 - shift)) < slots:
        shift -= 1
    return shift


@kernel
def _rehash(table, run_key, used):
    """Place every live run (``run_key >= 0`` among the first ``used``) in an empty ``table``."""
    mask = table.shape[0] - 1
    shift = _table_shift(table.shape[0])
    for r in range(used):
        key = run_key[r]
        if key >= 0:
            slot = _home(key, shift)
            while table[slot] >= 0:
                slot = (slot + 1) & mask
            table[slot] = r


@kernel(inline="always")
def _reach(seg, run_first, run, lo, hi, out_hits, row, counting):
    """How far from ``lo`` toward ``hi`` a run's segments hold every offset (``lo`` without the run), adding the
    blocks found to their tiers' ``out_hits[row]`` when ``counting``."""
    if run < 0:
        return lo
    p = lo
    s = run_first[run]
    while s != _NIL and p < hi:
        if seg[s, _HI] <= p:
            s = seg[s, _ABOVE]
            continue
        if seg[s, _LO] > p:
            break
        e = min(np.int64(seg[s, _HI]), hi)
        if counting:
            out_hits[row, seg[s, _STIER]] += e - p
        p = e
        s = seg[s, _ABOVE]
    return p


@kernel(inline="always")
def _find(table, run_key, key, shift, mask):
    """The table's slot of ``key``, or the empty slot where it would go."""
    slot = _home(key, shift)
    while table[slot] >= 0 and run_key[table[slot]] != key:
        slot = (slot + 1) & mask
    return slot


@kernel(inline="always")
def _unlink(seg, head, tail, s, lst):
    """Take segment ``s`` out of list ``lst``."""
    up = seg[s, _UP]
    down = seg[s, _DOWN]
    if up != _NIL:
        seg[up, _DOWN] = down
    else:
        head[lst] = down
    if down != _NIL:
        seg[down, _UP] = up
    else:
        tail[lst] = up


@kernel(inline="always")
def _push(seg, head, tail, s, lst):
    """Put segment ``s`` at the MRU end of list ``lst``."""
    old = head[lst]
    seg[s, _UP] = _NIL
    seg[s, _DOWN] = old
    if old != _NIL:
        seg[old, _UP] = s
    else:
        tail[lst] = s
    head[lst] = s


@kernel(inline="always")
def _drop_from_run(seg, run_first, s):
    """Take segment ``s`` out of its run's offset order."""
    below = seg[s, _BELOW]
    above = seg[s, _ABOVE]
    if below != _NIL:
        seg[below, _ABOVE] = above
    else:
        run_first[seg[s, _RUN]] = above
    if above != _NIL:
        seg[above, _BELOW] = below


@kernel(inline="always")
def _add_to_run(seg, run_first, s, below, run):
    """Put segment ``s`` of ``run`` just above segment ``below`` in the run's offset order (first when _NIL)."""
    if below == _NIL:
        above = run_first[run]
        run_first[run] = s
    else:
        above = seg[below, _ABOVE]
        seg[below, _ABOVE] = s
    seg[s, _BELOW] = below
    seg[s, _ABOVE] = above
    if above != _NIL:
        seg[above, _BELOW] = s


@kernel(inline="always")
def _take_seg(seg_free, top):
    """A free segment: the last one given back, else the first never used."""
    if top[0] > 0:
        top[0] -= 1
        return seg_free[top[0]]
    s = top[1]
    top[1] += 1
    return s


@kernel(inline="always")
def _remove_seg(seg, head, tail, run_first, seg_free, top, s, lst):
    """Take segment ``s`` out of list ``lst`` and of its run, and give it back to the free stack."""
    _unlink(seg, head, tail, s, lst)
    _drop_from_run(seg, run_first, s)
    seg_free[top[0]] = s
    top[0] += 1


@kernel(inline="always")
def _forget_run(table, run_key, run_free, top, run, shift, mask):
    """A run whose last segment has gone: out of the table (backward-shift deletion keeps every probe chain
    unbroken), its record given back."""
    hole = _find(table, run_key, run_key[run], shift, mask)
    probe = hole
    while True:
        probe = (probe + 1) & mask
        if table[probe] < 0:
            break
        home = _home(run_key[table[probe]], shift)
        # the entry at probe may move to the hole unless its home is cyclically in (hole, probe]
        if (hole < probe and hole < home <= probe) or (hole > probe and (home > hole or home <= probe)):
            continue
        table[hole] = table[probe]
        hole = probe
    table[hole] = -1
    run_key[run] = -1
    run_free[top[2]] = run
    top[2] += 1
    top[4] -= 1


@kernel(inline="always")
def _admit_run(seg, run_key, run_first, seg_free, run_free, head, tail, count, table, top, shift, mask, key, lo, hi,
               base):
    """Offsets ``[lo, hi)`` of the run ``key`` leave the segments holding them (rule 2) and go to the MRU end of the
    first tier of the instance whose lists start at ``base``, as one segment (merged with the MRU segment when that
    one continues it)."""
    slot = _find(table, run_key, key, shift, mask)
    run = table[slot]
    if run < 0:  # a run not cached: a record given back, else one never used
        if top[2] > 0:
            top[2] -= 1
            run = run_free[top[2]]
        else:
            run = top[3]
            top[3] += 1
        table[slot] = run
        run_key[run] = key
        run_first[run] = _NIL
        top[4] += 1
    below = _NIL  # the run's last segment under lo, once [lo, hi) is out
    s = run_first[run]
    while s != _NIL:
        above = seg[s, _ABOVE]
        a = seg[s, _LO]
        b = seg[s, _HI]
        if b <= lo:
            below = s
            s = above
            continue
        if a >= hi:
            break
        lst = base + seg[s, _STIER]
        if a < lo:
            if b > hi:  # [lo, hi) inside: the part above it stays in place, as a segment of its own
                t = _take_seg(seg_free, top)
                seg[t, _LO] = hi
                seg[t, _HI] = b
                seg[t, _STIER] = seg[s, _STIER]
                seg[t, _RUN] = run
                down = seg[s, _DOWN]
                seg[t, _UP] = s
                seg[t, _DOWN] = down
                seg[s, _DOWN] = t
                if down != _NIL:
                    seg[down, _UP] = t
                else:
                    tail[lst] = t
                _add_to_run(seg, run_first, t, s, run)
                seg[s, _HI] = lo
                count[lst] -= hi - lo
                below = s
                break
            seg[s, _HI] = lo
            count[lst] -= b - lo
            below = s
        elif b > hi:
            seg[s, _LO] = hi
            count[lst] -= hi - a
            break
        else:
            _remove_seg(seg, head, tail, run_first, seg_free, top, s, lst)
            count[lst] -= b - a
        s = above
    h = head[base]
    if h != _NIL and seg[h, _RUN] == run and seg[h, _LO] == hi:
        seg[h, _LO] = lo
    else:
        t = _take_seg(seg_free, top)
        seg[t, _LO] = lo
        seg[t, _HI] = hi
        seg[t, _STIER] = 0
        seg[t, _RUN] = run
        _push(seg, head, tail, t, base)
        _add_to_run(seg, run_first, t, below, run)
    count[base] += hi - lo


@kernel(refcounts=False)
def _replay_segments(block_ptr, block_runs, instance, start, capacity_blocks, next_tier, out_hits, seg, run_key,
                     run_first, seg_free, run_free, head, tail, count, table, top, span, load, lengths, balance):
    """Loop of :meth:`RunCaches.replay` from request ``start``: returns the request it stopped before, the number of
    requests when done, or earlier when the table must grow (more than half full with two more runs).
    ``next_tier`` is :func:`next_tiers` of ``capacity_blocks``."""
    n_tiers = capacity_blocks.shape[0]
    n_instances = load.shape[0]
    mask = table.shape[0] - 1
    shift = _table_shift(table.shape[0])
    if top[5]:
        head[:] = _NIL
        tail[:] = _NIL
        count[:] = 0
        top[:] = 0
    n = instance.shape[0]
    for r in range(start, n):
        if 2 * (top[4] + 2) > table.shape[0]:
            return r
        if top[0] + seg.shape[0] - top[1] < 4 + n_tiers:  # a request adds at most 3 + T segments
            raise ValueError("the caches' segments are all in use (more than they were sized for)")
        m = block_ptr[r + 1] - block_ptr[r]
        shared = min(block_runs[r, 0], m)
        shared_base = block_runs[r, 1]
        own_base = block_runs[r, 2]
        inst = instance[r]
        if inst < 0:  # cache-aware: each instance's cached prefix
            for i in range(n_instances):
                length = 0
                if shared > 0:
                    slot = _find(table, run_key, i * span + shared_base, shift, mask)
                    length = _reach(seg, run_first, table[slot], 0, shared, out_hits, r, False)
                if length == shared and m > shared:
                    slot = _find(table, run_key, i * span + own_base, shift, mask)
                    length = _reach(seg, run_first, table[slot], shared, m, out_hits, r, False)
                lengths[i] = length
            inst = route_cache_aware(lengths, load, balance)
            instance[r] = inst
        load[inst] += m
        if m == 0:
            continue
        base = n_tiers * inst
        # 1. Exact-prefix reuse over the two runs.
        reached = 0
        if shared > 0:
            slot = _find(table, run_key, inst * span + shared_base, shift, mask)
            reached = _reach(seg, run_first, table[slot], 0, shared, out_hits, r, True)
        if reached == shared and m > shared:
            slot = _find(table, run_key, inst * span + own_base, shift, mask)
            _reach(seg, run_first, table[slot], shared, m, out_hits, r, True)
        # 2. The request's blocks to the first tier's MRU end, last block first: its own run's, then the shared.
        if m > shared:
            _admit_run(seg, run_key, run_first, seg_free, run_free, head, tail, count, table, top, shift, mask,
                       inst * span + own_base, shared, m, base)
        if shared > 0:
            _admit_run(seg, run_key, run_first, seg_free, run_free, head, tail, count, table, top, shift, mask,
                       inst * span + shared_base, 0, shared, base)
        # 3. Each tier in turn demotes its overflow from its LRU end, a segment or the part of one at a time.
        src = 0
        while src >= 0:
            lst = base + src
            dst = next_tier[src]
            over = count[lst] - capacity_blocks[src]
            while over > 0:
                s = tail[lst]
                a = seg[s, _LO]
                b = seg[s, _HI]
                k = min(over, np.int64(b - a))
                run = seg[s, _RUN]
                whole = k == b - a
                if dst < 0:  # out of the last tier: dropped
                    if whole:
                        _remove_seg(seg, head, tail, run_first, seg_free, top, s, lst)
                        if run_first[run] == _NIL:  # the run's last segment: the run leaves the table
                            _forget_run(table, run_key, run_free, top, run, shift, mask)
                    else:
                        seg[s, _HI] = b - k
                else:
                    to = base + dst
                    h = head[to]
                    if h != _NIL and seg[h, _RUN] == run and seg[h, _LO] == b:  # continues the MRU segment there
                        seg[h, _LO] = b - k
                        if whole:
                            _remove_seg(seg, head, tail, run_first, seg_free, top, s, lst)
                        else:
                            seg[s, _HI] = b - k
                    elif whole:
                        _unlink(seg, head, tail, s, lst)
                        _push(seg, head, tail, s, to)
                        seg[s, _STIER] = dst
                    else:
                        seg[s, _HI] = b - k
                        t = _take_seg(seg_free, top)
                        seg[t, _LO] = b - k
                        seg[t, _HI] = b
                        seg[t, _STIER] = dst
                        seg[t, _RUN] = run
                        _push(seg, head, tail, t, to)
                        _add_to_run(seg, run_first, t, s, run)
                    count[to] += k
                count[lst] -= k
                over -= k
            src = dst
    return n


@kernel
def _replay_runs(block_ptr, block_runs, instance, capacity_blocks, out_hits, state, head, tail, count, span,
                 longest):
    """Loop of :func:`lookup_tiers_runs` (validated inputs): each request's ids written into a small buffer, then
    admitted as :func:`admit_blocks` admits a CSR row."""
    next_tier = next_tiers(capacity_blocks)
    reset_caches(state, head, tail, count)
    ids = np.empty(max(longest, 1), np.int64)
    for r in range(instance.shape[0]):
        m = block_ptr[r + 1] - block_ptr[r]
        shared = block_runs[r, 0]
        for k in range(m):
            ids[k] = (block_runs[r, 1] if k < shared else block_runs[r, 2]) + k
        inst = instance[r]
        admit_blocks(state, head, tail, count, capacity_blocks, next_tier, ids, 0, m, inst * span, inst, out_hits, r)


@kernel(inline="always")
def next_tiers(capacity_blocks):
    """Where each tier's LRU block goes: the next tier with nonzero capacity, or -1 (dropped)."""
    n_tiers = capacity_blocks.shape[0]
    next_tier = np.full(n_tiers, -1, np.int64)
    for t in range(n_tiers):
        for u in range(t + 1, n_tiers):
            if capacity_blocks[u] > 0:
                next_tier[t] = u
                break
    return next_tier


@kernel(inline="always")
def route_cache_aware(lengths, load, balance):
    """Cache-aware routing's pick: the instance with the longest cached prefix (``lengths``, blocks per instance),
    the fewer blocks admitted so far (``load``) breaking ties and then the lower index, unless its load exceeds
    ``1 + balance`` times the least loaded instance's (then that one)."""
    least = 0
    for i in range(1, load.shape[0]):
        if load[i] < load[least]:
            least = i
    best = 0
    for i in range(1, load.shape[0]):
        if lengths[i] > lengths[best] or (lengths[i] == lengths[best] and load[i] < load[best]):
            best = i
    if load[best] > (1.0 + balance) * load[least]:
        best = least
    return best


@kernel(inline="always")
def cached_prefix(state, block_keys, start, stop, offset):
    """Length of the leading run of ``block_keys[start:stop]`` (plus ``offset``) present in some tier."""
    length = 0
    for j in range(start, stop):
        if state[block_keys[j] + offset, _TIER] == _ABSENT:
            break
        length += 1
    return length


@kernel(inline="always")
def cached_prefix_pooled(state, block_keys, start, stop, offset, pool_key):
    """:func:`cached_prefix` counting the blocks the pool holds (block ``b``'s pool key is ``pool_key + b``)."""
    length = 0
    for j in range(start, stop):
        if state[block_keys[j] + offset, _TIER] == _ABSENT and state[block_keys[j] + pool_key, _TIER] == _ABSENT:
            break
        length += 1
    return length


@kernel(inline="always")
def _hold_blocks(state, head, tail, count, block_keys, start, stop, offset, inst, base):
    """Rule 2 for one request of cache ``inst`` (its lists from ``base``): every block of ``block_keys[start:stop]``
    (plus ``offset``) leaves the tier it is in, then all go to the MRU end of the first tier, last block first (the
    first block ends most recently used). Called once per request: its reference counts cost nothing per block."""
    for j in range(start, stop):
        key = block_keys[j] + offset
        tier = state[key, _TIER]
        if tier != _ABSENT:
            if state[key, _OWNER] != inst:
                raise ValueError("a block key is cached in two instances; remap keys per instance")
            lst = base + tier
            prev = state[key, _PREV]
            nxt = state[key, _NEXT]
            if prev != _NIL:
                state[prev, _NEXT] = nxt
            else:
                head[lst] = nxt
            if nxt != _NIL:
                state[nxt, _PREV] = prev
            else:
                tail[lst] = prev
            count[lst] -= 1
    for j in range(stop - 1, start - 1, -1):
        key = block_keys[j] + offset
        state[key, _OWNER] = inst
        old = head[base]
        state[key, _PREV] = _NIL
        state[key, _NEXT] = old
        if old != _NIL:
            state[old, _PREV] = key
        else:
            tail[base] = key
        head[base] = key
        state[key, _TIER] = 0
    count[base] += stop - start


@kernel(inline="always")
def admit_blocks(state, head, tail, count, capacity_blocks, next_tier, block_keys, start, stop, offset, inst,
                 out_hits, row):
    """Rules 1-3 of the module docstring for one request of cache ``inst``: add its reused blocks per tier to
    ``out_hits[row]``, then move every block to the MRU end of the first tier, demoting LRU blocks down the tiers.

    Inline, and the list operations written out in place: helper calls that pass arrays would add reference
    counting per call. A no-op when the first tier has no capacity.
    """
    if capacity_blocks[0] == 0:
        return
    base = capacity_blocks.shape[0] * inst

    # 1. Exact-prefix reuse: the leading run of present blocks, counted in the tier where found.
    j = start
    while j < stop:
        tier = state[block_keys[j] + offset, _TIER]
        if tier == _ABSENT:
            break
        out_hits[row, tier] += 1
        j += 1

    # 2. Every block leaves the tier it is in, then all go to the MRU end of the first tier, last block first so
    #    the first block ends MRU.
    _hold_blocks(state, head, tail, count, block_keys, start, stop, offset, inst, base)

    # 3. Each tier in turn, first to last, demotes its LRU blocks while it holds more than its capacity. Demoted one
    #    at a time, each to the MRU end of the next tier, its ``over`` LRU blocks would end there in the order they
    #    had: so they move as one chain, cut off the tail and spliced at the head, their rows' links untouched but
    #    at its two ends (the overflow of the last tier is dropped).
    src = 0
    while src >= 0:
        dst = next_tier[src]
        _demote_chain(state, head, tail, count, base + src, count[base + src] - capacity_blocks[src], base, dst)
        src = dst


@kernel(inline="always")
def _demote_chain(state, head, tail, count, lst, over, base, dst):
    """Rule 3 for list ``lst``: its ``over`` LRU blocks (none when ``over <= 0``) go to the MRU end of tier ``dst``'s
    list (``base + dst``) in the order they had, as one chain cut off the tail and spliced at the head, their rows'
    links untouched but at its two ends; with ``dst`` -1 they are dropped."""
    if over <= 0:
        return
    now = dst if dst >= 0 else _ABSENT
    last = tail[lst]
    first = last
    state[first, _TIER] = now
    for _ in range(over - 1):
        first = state[first, _PREV]
        state[first, _TIER] = now
    prev = state[first, _PREV]
    tail[lst] = prev
    if prev != _NIL:
        state[prev, _NEXT] = _NIL
    else:
        head[lst] = _NIL
    count[lst] -= over
    if dst >= 0:
        to = base + dst
        old = head[to]
        state[first, _PREV] = _NIL
        state[last, _NEXT] = old
        if old != _NIL:
            state[old, _PREV] = last
        else:
            tail[to] = last
        head[to] = first
        count[to] += over


@kernel(inline="always")
def admit_blocks_pooled(state, head, tail, count, capacity_blocks, next_tier, n_private, pool_key, pool_list,
                        block_keys, start, stop, offset, inst, out_hits, row):
    """:func:`admit_blocks` with pooled tiers behind the private ones (rules 1-6 of the module docstring).

    ``block_keys`` are block ids: block ``b``'s private key is ``b + offset``, its pool key ``b + pool_key``; the
    pooled tier ``t``'s list is ``pool_list + t``, private tier ``t``'s ``T * inst + t``.
    """
    if capacity_blocks[0] == 0:
        return
    base = capacity_blocks.shape[0] * inst

    # 1, 4. Exact-prefix reuse: the instance's own tiers first, then the pool.
    j = start
    while j < stop:
        tier = state[block_keys[j] + offset, _TIER]
        if tier == _ABSENT:
            tier = state[block_keys[j] + pool_key, _TIER]
            if tier == _ABSENT:
                break
        out_hits[row, tier] += 1
        j += 1
    reused_end = j

    # 5. The pool copies of the reused blocks read from the pool: to the MRU end of their tier, last block first.
    for j in range(reused_end - 1, start - 1, -1):
        if state[block_keys[j] + offset, _TIER] != _ABSENT:
            continue
        key = block_keys[j] + pool_key
        lst = pool_list + state[key, _TIER]
        if head[lst] == key:
            continue
        prev = state[key, _PREV]
        nxt = state[key, _NEXT]
        state[prev, _NEXT] = nxt  # not the head, so it has a previous block
        if nxt != _NIL:
            state[nxt, _PREV] = prev
        else:
            tail[lst] = prev
        old = head[lst]
        state[key, _PREV] = _NIL
        state[key, _NEXT] = old
        state[old, _PREV] = key
        head[lst] = key

    # 2. Every block leaves the instance's tier it is in, then all go to the MRU end of its first tier, last block
    #    first.
    _hold_blocks(state, head, tail, count, block_keys, start, stop, offset, inst, base)

    # 3, 6. Each private tier in turn demotes its overflow; the last one's leaves the instance, each block written
    #       to the pool and the pool's tiers demoting theirs at once.
    src = 0
    while 0 <= src < n_private:
        lst = base + src
        dst = next_tier[src]
        if dst < n_private:  # to the instance's next tier, or dropped: as admit_blocks, one chain
            _demote_chain(state, head, tail, count, lst, count[lst] - capacity_blocks[src], base, dst)
            src = dst
            continue
        while count[lst] > capacity_blocks[src]:
            victim = tail[lst]
            prev = state[victim, _PREV]
            tail[lst] = prev
            if prev != _NIL:
                state[prev, _NEXT] = _NIL
            else:
                head[lst] = _NIL
            count[lst] -= 1
            # Leaves the instance: written to the pool under the block's id.
            state[victim, _TIER] = _ABSENT
            victim = victim - offset + pool_key
            held = state[victim, _TIER]
            if held != _ABSENT:  # the pool holds it already: that copy moves
                hl = pool_list + held
                prev = state[victim, _PREV]
                nxt = state[victim, _NEXT]
                if prev != _NIL:
                    state[prev, _NEXT] = nxt
                else:
                    head[hl] = nxt
                if nxt != _NIL:
                    state[nxt, _PREV] = prev
                else:
                    tail[hl] = prev
                count[hl] -= 1
            into = dst
            while True:
                to = pool_list + into
                old = head[to]
                state[victim, _PREV] = _NIL
                state[victim, _NEXT] = old
                if old != _NIL:
                    state[old, _PREV] = victim
                else:
                    tail[to] = victim
                head[to] = victim
                state[victim, _TIER] = into
                count[to] += 1
                if count[to] <= capacity_blocks[into]:
                    break
                victim = tail[to]  # one write overflows each pooled tier by one block at most
                prev = state[victim, _PREV]
                tail[to] = prev
                if prev != _NIL:
                    state[prev, _NEXT] = _NIL
                else:
                    head[to] = _NIL
                count[to] -= 1
                into = next_tier[into]
                if into < 0:
                    state[victim, _TIER] = _ABSENT  # overflow of the pool's last tier: dropped
                    break
        src = dst


@kernel(inline="always")
def reset_caches(state, head, tail, count):
    """Empty every cache: no key in any tier, every list empty."""
    for k in range(state.shape[0]):
        state[k, _TIER] = _ABSENT
    head[:] = _NIL
    tail[:] = _NIL
    count[:] = 0


@kernel
def _replay(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail, count,
            key_stride, balance, n_private, load, lengths):
    """Loop of :func:`lookup_tiers`: validate indices, reset the workspace, replay the requests.

    ``state`` (n_keys, 4) int32 holds one row per key (prev, next, tier, owner), then, with pooled tiers,
    ``key_stride`` rows of the pool's keys; ``head``, ``tail`` (int32) and ``count`` (int64) hold one entry per
    list, list ``tiers * instance + tier``, then the pooled tiers' ``tiers * n_instances + tier``; ``load`` and
    ``lengths`` (int64, one per instance, zeros) are cache-aware routing's. All are overwritten.
    """
    n_tiers = capacity_blocks.shape[0]
    pooled = n_private < n_tiers
    n_keys = state.shape[0] - (key_stride if pooled else 0)
    n = instance.shape[0]
    nnz = block_keys.shape[0]
    if block_ptr.shape[0] != n + 1:
        raise ValueError("block_ptr must have len(instance) + 1 entries")
    if out_hits.shape[0] != n or out_hits.shape[1] != n_tiers:
        raise ValueError("out_hits must have shape (len(instance), len(capacity_blocks))")
    for t in range(n_tiers):
        if capacity_blocks[t] < 0:
            raise ValueError("capacity_blocks must be >= 0")
    # Validate everything the loop indexes with, once: Numba does not bounds-check.
    if block_ptr[0] < 0 or block_ptr[n] > nnz:
        raise ValueError("block_ptr out of range of block_keys")
    for r in range(n):
        if block_ptr[r + 1] < block_ptr[r]:
            raise ValueError("block_ptr must be non-decreasing")
        if instance[r] < -1 or instance[r] >= n_instances or (instance[r] == -1 and key_stride == 0):
            raise ValueError("instance out of range [0, n_instances) (or -1 with key_stride > 0)")
    key_limit = n_keys if key_stride == 0 else key_stride
    for j in range(block_ptr[0], block_ptr[n]):
        if block_keys[j] < 0 or block_keys[j] >= key_limit:
            raise ValueError("block key out of range [0, n_keys) (or [0, key_stride))")

    if capacity_blocks[0] == 0:
        return

    next_tier = next_tiers(capacity_blocks)
    reset_caches(state, head, tail, count)
    if pooled:
        _replay_pooled(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail,
                       count, next_tier, key_stride, balance, n_private, n_keys, load, lengths)
    else:
        _replay_private(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail,
                        count, next_tier, key_stride, balance, load, lengths)


@kernel(refcounts=False)
def _replay_private(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail,
                    count, next_tier, key_stride, balance, load, lengths):
    """The requests through every instance's own tiers (the validated inputs of :func:`_replay`)."""
    n = instance.shape[0]
    for r in range(n):
        start = block_ptr[r]
        stop = block_ptr[r + 1]
        inst = instance[r]
        if inst < 0:  # cache-aware routing
            for i in range(n_instances):
                lengths[i] = cached_prefix(state, block_keys, start, stop, i * key_stride)
            inst = route_cache_aware(lengths, load, balance)
            instance[r] = inst
        load[inst] += stop - start
        admit_blocks(state, head, tail, count, capacity_blocks, next_tier, block_keys, start, stop,
                     inst * key_stride, inst, out_hits, r)


@kernel(refcounts=False)
def _replay_pooled(block_ptr, block_keys, instance, n_instances, capacity_blocks, out_hits, state, head, tail,
                   count, next_tier, key_stride, balance, n_private, n_keys, load, lengths):
    """:func:`_replay_private` with pooled tiers behind the first ``n_private`` (the pool's keys from ``n_keys``,
    its lists after every instance's)."""
    n = instance.shape[0]
    pool_list = capacity_blocks.shape[0] * n_instances
    for r in range(n):
        start = block_ptr[r]
        stop = block_ptr[r + 1]
        inst = instance[r]
        if inst < 0:  # cache-aware: the pool's blocks count as every instance's
            for i in range(n_instances):
                lengths[i] = cached_prefix_pooled(state, block_keys, start, stop, i * key_stride, n_keys)
            inst = route_cache_aware(lengths, load, balance)
            instance[r] = inst
        load[inst] += stop - start
        admit_blocks_pooled(state, head, tail, count, capacity_blocks, next_tier, n_private, n_keys, pool_list,
                            block_keys, start, stop, inst * key_stride, inst, out_hits, r)

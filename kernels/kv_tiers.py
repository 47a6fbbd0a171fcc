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

    Memory: a row of 16 bytes per key of the key space, or, ``bounded`` (default: when that takes less than half the
    memory; a hash probe per block makes it slower), rows for what the caches can hold only: twice every instance's
    capacity in all tiers plus one request, 28 bytes each, found through an open-addressing hash table of 4 bytes a
    slot (at most half full; :meth:`RunCaches.most_bytes`). A row whose block was dropped from the last tier is reclaimed when free rows run
    short, by a sweep over the rows (amortised O(1) per block). Then memory depends on the capacities, not on the
    number of requests or blocks.

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
        bounded = lookup_tiers_runs_bytes(capacity_blocks, n_instances, span, longest)[0]
    if not bounded:
        _replay_runs(block_ptr, block_runs, instance, capacity_blocks, out_hits, _workspace(n_instances * span),
                     np.empty(lists, np.int32), np.empty(lists, np.int32), np.empty(lists, np.int64), span, longest)
        return
    caches = RunCaches(capacity_blocks, n_instances, span, longest)
    caches.replay(block_ptr, block_runs, instance, out_hits)


def lookup_tiers_runs_bytes(capacity_blocks, n_instances: int, span: int, longest: int) -> tuple[bool, int]:
    """Whether :func:`lookup_tiers_runs` takes bounded rows by default, and the most memory it then allocates: the
    bounded caches' (:meth:`RunCaches.most_bytes`), or a workspace row per key of the key space and a head, tail and
    count per list. The bounded rows cost a hash probe per block: they are taken when they save half the memory.

    Examples
    --------
    >>> lookup_tiers_runs_bytes(np.array([8, 0, 0]), 2, 1000, 4)  # 2,000 keys: a dense workspace is smaller
    (False, 56480)
    """
    n_instances, span = int(n_instances), int(span)
    bounded_bytes = RunCaches.most_bytes(capacity_blocks, n_instances, longest)
    if 2 * bounded_bytes < n_instances * span * 16:
        return True, bounded_bytes
    return False, workspace_bytes(n_instances * span) + 16 * len(capacity_blocks) * n_instances


class RunCaches:
    """The bounded caches of :func:`lookup_tiers_runs` as state kept from one call to the next: a stream of
    requests replayed chunk by chunk reuses exactly what it would reuse in one call.

    The rows (28 bytes each with their key and free-stack slot: :meth:`rows_for`) are allocated at once but used
    in order, so that only those that ever held a block take memory; the hash table (4 bytes a slot, at most half
    full at its most rows) is written whole at the first call. :meth:`most_bytes` is all of it.
    Arrays of the same shapes that an earlier one gave back in this thread are taken instead of new ones (see
    :func:`_take_run_arrays`): a worker's later samples keep the memory of its first.

    Parameters
    ----------
    capacity_blocks : int64[T]
        One instance's capacity per tier, blocks (first tier > 0).
    n_instances, span : int
        Instances, and the block ids' range ``[0, span)`` (any size: keys are hashed).
    longest : int
        The most blocks one request may have.

    Examples
    --------
    >>> caches = RunCaches(np.array([8, 0, 0]), 1, 1 << 40, 4)
    >>> hits = np.zeros((1, 3), np.int64)
    >>> caches.replay(np.array([0, 3]), np.array([[2, 0, 10]]), np.zeros(1, np.int32), hits)
    >>> caches.replay(np.array([0, 3]), np.array([[2, 0, 20]]), np.zeros(1, np.int32), hits)
    >>> hits[0].tolist()  # the second request (its own call) reuses the shared blocks 0 and 1
    [2, 0, 0]
    >>> int(caches.rows_used[0])  # blocks 0, 1, 10 and 20
    4
    """

    def __init__(self, capacity_blocks, n_instances: int, span: int, longest: int):
        self.capacity_blocks = np.ascontiguousarray(capacity_blocks, dtype=np.int64)
        self.n_instances, self.span, self.longest = int(n_instances), int(span), int(longest)
        if not 0 <= self.n_instances * self.span < 2**62:
            raise ValueError("n_instances x span must be in [0, 2**62)")
        lists = self.capacity_blocks.shape[0] * self.n_instances
        rows = self.rows_for(self.capacity_blocks, self.n_instances, self.longest)
        if rows >= 2**31:
            raise ValueError("the caches' capacities need 2**31 rows or more")
        self._arrays = _take_run_arrays(rows, lists)
        self.state, self.head, self.tail, self.count, self.row_key, self.table, self.free = self._arrays
        self.n_free = np.full(1, -1, np.int64)  # -1: not yet reset
        # blocks admitted per instance, and scratch for each one's cached prefix (cache-aware routing)
        self.load = np.zeros(max(self.n_instances, 1), np.int64)
        self.lengths = np.zeros(max(self.n_instances, 1), np.int64)
        self.rows_used = np.zeros(1, np.int64)  # rows ever given a key: those beyond are untouched

    def __del__(self):
        try:
            _give_back_run_arrays(getattr(self, "_arrays", None))
        except Exception:  # at interpreter shutdown the module may be gone: nothing to keep then
            pass

    @staticmethod
    def rows_for(capacity_blocks, n_instances: int, longest: int) -> int:
        """Rows of the caches: twice every instance's capacity in all tiers, plus one request's blocks and 1024."""
        return 2 * int(n_instances) * int(np.sum(capacity_blocks)) + int(longest) + 1024

    @staticmethod
    def most_bytes(capacity_blocks, n_instances: int, longest: int) -> int:
        """Bytes of the caches' arrays (what they take once every row is used): rows, hash table, lists, and the
        two counters per instance of cache-aware routing."""
        rows = RunCaches.rows_for(capacity_blocks, n_instances, longest)
        lists = len(capacity_blocks) * int(n_instances)
        return rows * (4 * _ROW + 8 + 4) + 4 * _slots(rows) + lists * (4 + 4 + 8) + 16 * max(int(n_instances), 1)

    def replay(self, block_ptr, block_runs, instance, out_hits, balance: float = 0.25) -> None:
        """Replay requests (arguments as :func:`lookup_tiers_runs`, each at most ``longest`` blocks) after those of
        the earlier calls, writing their hits. A request of ``instance`` -1 is routed cache-aware (``balance`` as
        :func:`lookup_tiers`'s) and its instance written."""
        block_ptr = np.ascontiguousarray(block_ptr, dtype=np.int64)
        if block_ptr.shape[0] > 1 and int(np.diff(block_ptr).max()) > self.longest:
            raise ValueError(f"a request has more than longest = {self.longest} blocks")
        instance = np.ascontiguousarray(instance, dtype=np.int32)
        if instance.size and (int(instance.min()) < -1 or int(instance.max()) >= self.n_instances):
            raise ValueError("instance out of range [-1, n_instances)")
        _replay_runs_bounded(block_ptr, np.ascontiguousarray(block_runs, dtype=np.int64), instance,
                             self.capacity_blocks, out_hits, self.state, self.head, self.tail, self.count, self.span,
                             self.longest, self.row_key, self.table, self.free, self.n_free, self.rows_used, self.load,
                             self.lengths, float(balance))


def _take_run_arrays(rows: int, lists: int) -> tuple:
    """The arrays of a :class:`RunCaches` of ``rows`` rows and ``lists`` lists: those an earlier one of the same
    shapes gave back in this thread (their pages already touched: a sample after the first does not pay the
    operating system's first touch again), else new ones. Their contents do not matter: a reset writes what is
    read before it is written."""
    kept = getattr(_local, "run_arrays", None)
    if kept is not None and kept[0] == (rows, lists):
        _local.run_arrays = None
        return kept[1]
    return (np.empty((rows, _ROW), np.int32), np.empty(lists, np.int32), np.empty(lists, np.int32),
            np.empty(lists, np.int64), np.empty(rows, np.int64), np.empty(_slots(rows), np.int32),
            np.empty(rows, np.int32))


def _give_back_run_arrays(arrays) -> None:
    """Keep the arrays of a :class:`RunCaches` no longer used, for the next one of the same shapes in this thread
    (one set at most: a new shape replaces it)."""
    if arrays is not None:
        _local.run_arrays = ((arrays[0].shape[0], arrays[1].shape[0]), arrays)


def _slots(rows: int) -> int:
    """Hash table slots for ``rows`` rows: a power of two, at most half full."""
    return 1 << max(int(2 * rows - 1).bit_length(), 4)


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
def _slot_of(key, shift):
    """Home slot of a key in a hash table of ``2 ** (64 - shift)`` slots (at least 8): eight consecutive keys share
    a group of eight slots (a run's blocks then probe one cache line), groups are Fibonacci-hashed (the
    product's top bits)."""
    group = np.int64((np.uint64(key >> 3) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(shift + 3))
    return (group << 3) | (key & 7)


@kernel
def _replay_runs_bounded(block_ptr, block_runs, instance, capacity_blocks, out_hits, state, head, tail, count, span,
                         longest, row_key, table, free, n_free_io, used_io, load, lengths, balance):
    """:func:`_replay_runs` with a row per key only while its block is cached: ``table`` (linear probing, -1 =
    empty) maps a key to its row, ``row_key`` a row to its key (-1: free); rows ``used_io[0]`` on have never been
    used (nor written), ``free[:n_free_io[0]]`` is a stack of rows given back. When a request has more blocks than
    rows are left, every row whose block was dropped goes back to the stack and leaves the table (backward-shift
    deletion keeps every probe chain unbroken). The state carries over from call to call; ``n_free_io[0] < 0``
    resets it first.

    A request of ``instance`` -1 is routed cache-aware, as :func:`lookup_tiers` routes it: to the instance holding
    the longest prefix of its blocks in some tier (fewer blocks admitted so far, ``load``, breaks ties), unless
    that instance's load exceeds ``1 + balance`` times the least loaded one's; ``instance`` is then written and
    ``load`` (blocks admitted per instance, carried from call to call) counts every request; ``lengths`` (one per
    instance) is the scratch of each instance's cached prefix."""
    next_tier = next_tiers(capacity_blocks)
    n_instances = load.shape[0]
    mask = table.shape[0] - 1
    shift = 64
    while (1 << (64 - shift)) < table.shape[0]:
        shift -= 1
    n_rows = state.shape[0]
    if n_free_io[0] < 0:
        head[:] = _NIL
        tail[:] = _NIL
        count[:] = 0
        table[:] = -1
        n_free_io[0] = 0
        used_io[0] = 0
    n_free = n_free_io[0]
    used = used_io[0]
    rows = np.empty(max(longest, 1), np.int64)
    for r in range(instance.shape[0]):
        m = block_ptr[r + 1] - block_ptr[r]
        inst = instance[r]
        if n_free + (n_rows - used) < m:  # reclaim the rows of dropped blocks
            for i in range(used):
                if row_key[i] >= 0 and state[i, _TIER] == _ABSENT:
                    slot = _slot_of(row_key[i], shift)
                    while table[slot] != i:
                        slot = (slot + 1) & mask
                    hole = slot
                    probe = slot
                    while True:
                        probe = (probe + 1) & mask
                        if table[probe] < 0:
                            break
                        home = _slot_of(row_key[table[probe]], shift)
                        # the entry at probe may move to the hole unless its home lies cyclically in (hole, probe]
                        if (hole < probe and hole < home <= probe) or (hole > probe and (home > hole or home <= probe)):
                            continue
                        table[hole] = table[probe]
                        hole = probe
                    table[hole] = -1
                    row_key[i] = -1
                    free[n_free] = i
                    n_free += 1
        shared = block_runs[r, 0]
        if inst < 0:  # cache-aware: each instance's cached prefix, through the table
            for i in range(n_instances):
                length = 0
                for k in range(m):
                    key = i * span + (block_runs[r, 1] if k < shared else block_runs[r, 2]) + k
                    slot = _slot_of(key, shift)
                    while table[slot] >= 0 and row_key[table[slot]] != key:
                        slot = (slot + 1) & mask
                    if table[slot] < 0 or state[table[slot], _TIER] == _ABSENT:
                        break
                    length += 1
                lengths[i] = length
            inst = route_cache_aware(lengths, load, balance)
            instance[r] = inst
        load[inst] += m
        for k in range(m):
            key = inst * span + (block_runs[r, 1] if k < shared else block_runs[r, 2]) + k
            slot = _slot_of(key, shift)
            while table[slot] >= 0 and row_key[table[slot]] != key:
                slot = (slot + 1) & mask
            if table[slot] < 0:  # a new key: a row given back, or one never used; absent from every tier
                if n_free > 0:
                    n_free -= 1
                    row = free[n_free]
                else:
                    row = used
                    used += 1
                table[slot] = row
                row_key[row] = key
                state[row, _TIER] = _ABSENT
            rows[k] = table[slot]
        admit_blocks(state, head, tail, count, capacity_blocks, next_tier, rows, 0, m, 0, inst, out_hits, r)
    n_free_io[0] = n_free
    used_io[0] = used


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

    # 3. Each tier in turn, first to last, demotes its LRU blocks while it holds more than its capacity.
    src = 0
    while src >= 0:
        lst = base + src
        dst = next_tier[src]
        while count[lst] > capacity_blocks[src]:
            victim = tail[lst]
            prev = state[victim, _PREV]
            tail[lst] = prev
            if prev != _NIL:
                state[prev, _NEXT] = _NIL
            else:
                head[lst] = _NIL
            count[lst] -= 1
            if dst < 0:
                state[victim, _TIER] = _ABSENT  # overflow of the last tier: dropped
                continue
            to = base + dst
            old = head[to]
            state[victim, _PREV] = _NIL
            state[victim, _NEXT] = old
            if old != _NIL:
                state[old, _PREV] = victim
            else:
                tail[to] = victim
            head[to] = victim
            state[victim, _TIER] = dst
            count[to] += 1
        src = dst


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

    # 3, 6. Each private tier in turn demotes its overflow; the last one's leaves the instance, each block written
    #       to the pool and the pool's tiers demoting theirs at once.
    src = 0
    while 0 <= src < n_private:
        lst = base + src
        dst = next_tier[src]
        while count[lst] > capacity_blocks[src]:
            victim = tail[lst]
            prev = state[victim, _PREV]
            tail[lst] = prev
            if prev != _NIL:
                state[prev, _NEXT] = _NIL
            else:
                head[lst] = _NIL
            count[lst] -= 1
            if dst < 0:
                state[victim, _TIER] = _ABSENT  # overflow of the last tier: dropped
                continue
            if dst < n_private:
                to = base + dst
                old = head[to]
                state[victim, _PREV] = _NIL
                state[victim, _NEXT] = old
                if old != _NIL:
                    state[old, _PREV] = victim
                else:
                    tail[to] = victim
                head[to] = victim
                state[victim, _TIER] = dst
                count[to] += 1
                continue
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


@kernel
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


@kernel
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

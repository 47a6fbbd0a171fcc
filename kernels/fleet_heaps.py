"""Inline heaps of the fleet simulator (:mod:`mcsim.kernels.fleet_batching`).

Per instance, heaps of sequences under an integer key pair (the step a sequence finishes at, or next needs a KV
block at, or a waiting queue's key, and a tie-break), the keys kept beside the ids so that comparisons read
contiguous memory and a sequence's slot kept in ``pos`` so that a preempted sequence leaves them wherever it is:
``heap_push``, ``heap_remove`` (and ``heap_up`` / ``heap_down``). The heaps on (time, index) -- busy instances,
a closed loop's arrivals -- are the one-instance simulator's (``_heap_push`` / ``_heap_pop`` of
:mod:`mcsim.kernels.batching_helpers`).

They are ``inline="always"``, as the step loop's other helpers (:mod:`mcsim.kernels.batching_helpers`), but
for ``_grown``, which doubles a waiting queue's heap when one instance's fills (rarely: not worth inlining).
"""

from __future__ import annotations

import numpy as np

from mcsim.accelerate import kernel


@kernel(inline="always")
def heap_up(hk1, hk2, hs, pos, i, j):
    """Sift slot ``j`` of instance ``i``'s heap of sequences ``hs`` (ordered by ``(hk1, hk2)``, kept beside them
    so that comparisons read contiguous memory; ``pos[s]`` is sequence ``s``'s slot) up."""
    k1 = hk1[i, j]
    k2 = hk2[i, j]
    s = hs[i, j]
    while j > 0:
        parent = (j - 1) // 2
        if not (k1 < hk1[i, parent] or (k1 == hk1[i, parent] and k2 < hk2[i, parent])):
            break
        hk1[i, j] = hk1[i, parent]
        hk2[i, j] = hk2[i, parent]
        hs[i, j] = hs[i, parent]
        pos[hs[i, j]] = j
        j = parent
    hk1[i, j] = k1
    hk2[i, j] = k2
    hs[i, j] = s
    pos[s] = j


@kernel(inline="always")
def heap_down(hk1, hk2, hs, pos, size, i, j):
    """Sift slot ``j`` of instance ``i``'s heap of ``size`` sequences down."""
    k1 = hk1[i, j]
    k2 = hk2[i, j]
    s = hs[i, j]
    while True:
        child = 2 * j + 1
        if child >= size:
            break
        if child + 1 < size and (hk1[i, child + 1] < hk1[i, child]
                                 or (hk1[i, child + 1] == hk1[i, child] and hk2[i, child + 1] < hk2[i, child])):
            child += 1
        if not (hk1[i, child] < k1 or (hk1[i, child] == k1 and hk2[i, child] < k2)):
            break
        hk1[i, j] = hk1[i, child]
        hk2[i, j] = hk2[i, child]
        hs[i, j] = hs[i, child]
        pos[hs[i, j]] = j
        j = child
    hk1[i, j] = k1
    hk2[i, j] = k2
    hs[i, j] = s
    pos[s] = j


@kernel(inline="always")
def heap_push(hk1, hk2, hs, pos, sizes, i, k1, k2, s):
    """Add sequence ``s`` under key ``(k1, k2)`` to instance ``i``'s heap."""
    j = sizes[i]
    sizes[i] += 1
    hk1[i, j] = k1
    hk2[i, j] = k2
    hs[i, j] = s
    heap_up(hk1, hk2, hs, pos, i, j)


@kernel(inline="always")
def heap_remove(hk1, hk2, hs, pos, sizes, i, s):
    """Take sequence ``s`` out of instance ``i``'s heap, wherever it is."""
    j = pos[s]
    pos[s] = -1
    sizes[i] -= 1
    last = sizes[i]
    if j != last:
        moved = hs[i, last]
        hk1[i, j] = hk1[i, last]
        hk2[i, j] = hk2[i, last]
        hs[i, j] = moved
        pos[moved] = j
        heap_up(hk1, hk2, hs, pos, i, j)
        heap_down(hk1, hk2, hs, pos, sizes[i], i, pos[moved])


@kernel
def _grown(hk1, hk2, hs):
    """The per-instance heap arrays with twice the room, their slots copied, and the new room (the waiting
    queues' heaps have no bound known in advance)."""
    k, cap = hs.shape
    grown = (np.empty((k, 2 * cap), np.int64), np.empty((k, 2 * cap), np.int64), np.empty((k, 2 * cap), np.int64))
    for i in range(k):
        for j in range(cap):
            grown[0][i, j] = hk1[i, j]
            grown[1][i, j] = hk2[i, j]
            grown[2][i, j] = hs[i, j]
    return grown[0], grown[1], grown[2], 2 * cap

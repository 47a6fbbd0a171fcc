"""Workload kernels: per-block loops of the request generator."""

from __future__ import annotations

from mcsim.accelerate import kernel


@kernel
def fill_block_ids(block_ptr, shared_blocks, shared_base, own_base, out):
    """Write the block identities of every request's prompt.

    Block ``k`` of request ``r`` is ``shared_base[r] + k`` while ``k < shared_blocks[r]`` (a block that lies wholly
    inside a shared system prompt), else ``own_base[r] + k`` (a block of the request's own conversation).

    Parameters
    ----------
    block_ptr : int64[n + 1]
        CSR pointers into ``out``.
    shared_blocks, shared_base, own_base : int64[n]
    out : int64[block_ptr[n]]
        Filled in place.
    """
    n = block_ptr.shape[0] - 1
    for r in range(n):
        start = block_ptr[r]
        stop = block_ptr[r + 1]
        shared = shared_blocks[r]
        for j in range(start, stop):
            k = j - start
            if k < shared:
                out[j] = shared_base[r] + k
            else:
                out[j] = own_base[r] + k


@kernel
def turn_times(session_start, turns, think_s, out):
    """Each turn's time: its session's start plus the think times of its turns so far (the first turn's is not
    read), summed turn by turn within each session, so that a session's times do not depend on the sessions
    before it.

    Parameters
    ----------
    session_start : float64[m]
    turns : int64[m]
        Turns of each session (>= 1); session ``s``'s rows follow those of sessions ``0 .. s-1``.
    think_s : float64[sum(turns)]
    out : float64[sum(turns)]
        Filled in place.

    Examples
    --------
    >>> import numpy as np
    >>> out = np.empty(3)
    >>> turn_times(np.array([1.0, 5.0]), np.array([2, 1]), np.array([9.0, 0.5, 9.0]), out)
    >>> out.tolist()
    [1.0, 1.5, 5.0]
    """
    row = 0
    for s in range(session_start.shape[0]):
        t = session_start[s]
        for j in range(turns[s]):
            if j > 0:
                t += think_s[row]
            out[row] = t
            row += 1

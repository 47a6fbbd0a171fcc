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

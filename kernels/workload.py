"""Workload kernels: the request generator's loops (its sessions' turns as rows, the pool of turns in time order,
the block ids of a prompt)."""

from __future__ import annotations

import numpy as np

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


#: Columns of the generator's integer rows (``rows_int[row, column]``: a row's columns side by side), written by :func:`session_rows` and kept
#: by :func:`merge_rows`.
COL_CLASS, COL_PROMPT, COL_OUTPUT, COL_SESSION, COL_NBLOCKS, COL_SYS_FULL, COL_SYS_BASE, COL_OWN_BASE = range(8)
N_INT_COLUMNS = 8


@kernel
def session_rows(session_class, turns, sys_len, sys_base, class_first, user_draws, output_draws, acceptance_draws,
                 start, think_s, max_context, block_tokens, drop_before_zero, first_session, next_base,
                 out_t, out_acceptance, out_int):
    """The turns of a block of sessions, as rows: lengths clipped to the context, the conversation carried, times,
    block identities; the turns that are kept, in generation order (session by session, turn by turn).

    Session ``s`` has ``turns[s]`` turns. Turn ``j`` carries the system prompt (``sys_len[s]`` tokens), every
    earlier exchange of its session (user message + answer) and a new user message. Each turn takes the next value
    of its class's draws (``class_first[c]`` is where class ``c``'s values start in each of the three draw arrays,
    used in turn order), rounded to whole tokens (at least 1); an answer is at most half the context. A first turn
    is clipped to fit the context (its answer first, to what its system prompt leaves); a later turn that does not
    fit ends its session (its draws are still used). A turn comes at its session's start plus the think times of
    its turns so far (``think_s`` per row; the first turn's is not read). With ``drop_before_zero`` a turn before
    time 0 is not kept (a session started before the window), but it still counts for the block identities.

    Block identities: a session's own blocks start at ``next_base`` plus the blocks of the last turn kept for the
    context of every session before it (its longest prompt: block ``k`` of its conversation is ``own_base + k``);
    a system prompt's whole blocks are shared (``sys_base[s] + k``).

    Parameters
    ----------
    session_class, turns, sys_len, sys_base : int64[m]
    class_first : int64[classes]
    user_draws, output_draws, acceptance_draws : float64[sum(turns)]
        Per-class draws, class by class (each class's values in the order of its turns).
    start : float64[m]
    think_s : float64[sum(turns)]
    max_context, block_tokens : int
    drop_before_zero : bool
    first_session : int
        Number of the block's first session (written to ``COL_SESSION``).
    next_base : int
        First own block id of the block's first session.
    out_t, out_acceptance : float64[sum(turns)]
    out_int : int64[sum(turns), N_INT_COLUMNS]
        Filled in place, the first ``kept`` rows.

    Returns
    -------
    kept : int
        Rows written.
    next_base : int
        First own block id of the next block's first session.
    """
    cursor = class_first.copy()
    answer_cap = max(max_context // 2, 1)
    row = 0
    kept = 0
    base = next_base
    for s in range(session_class.shape[0]):
        c = session_class[s]
        sys_tokens = sys_len[s]
        t = start[s]
        before = 0  # tokens of the session's earlier exchanges
        fits = True  # still in the leading run of turns that fit the context
        last_blocks = 0
        for j in range(turns[s]):
            at = cursor[c]
            cursor[c] = at + 1
            user = np.rint(user_draws[at])
            user = np.int64(user) if user >= 1.0 else np.int64(1)
            output = np.rint(output_draws[at])
            output = np.int64(output) if output >= 1.0 else np.int64(1)
            acceptance = min(max(acceptance_draws[at], 0.0), 1.0)
            output = min(output, answer_cap)
            if j == 0:
                output = min(output, max(max_context - sys_tokens - 1, 1))
                user = min(user, max(max_context - output - sys_tokens, 1))
            else:
                t += think_s[row]
            prompt = sys_tokens + before + user
            before += user + output
            row += 1
            if not fits or (j > 0 and prompt + output > max_context):
                fits = False
                continue
            blocks = prompt // block_tokens
            last_blocks = blocks
            if drop_before_zero and t < 0.0:
                continue
            out_t[kept] = t
            out_acceptance[kept] = acceptance
            out_int[kept, COL_CLASS] = c
            out_int[kept, COL_PROMPT] = prompt
            out_int[kept, COL_OUTPUT] = output
            out_int[kept, COL_SESSION] = first_session + s
            out_int[kept, COL_NBLOCKS] = blocks
            out_int[kept, COL_SYS_FULL] = sys_tokens // block_tokens
            out_int[kept, COL_SYS_BASE] = sys_base[s]
            out_int[kept, COL_OWN_BASE] = base
            kept += 1
        base += last_blocks
    return kept, base


@kernel
def merge_rows(old_t, old_acceptance, old_int, old_from, new_t, new_acceptance, new_int, order,
               out_t, out_acceptance, out_int):
    """Merge rows ``old_from:`` of a pool kept in time order with new rows taken in ``order``: by time, an old row
    before a new one at the same time, new rows among themselves in ``order``.

    Parameters
    ----------
    old_t, old_acceptance : float64[a]
    old_int : int64[a, N_INT_COLUMNS]
    old_from : int
        The pool's rows before it are gone (handed out).
    new_t, new_acceptance : float64[b]
    new_int : int64[b, N_INT_COLUMNS]
    order : int64[b]
        New rows in time order (ties in generation order).
    out_t, out_acceptance : float64[a - old_from + b]
    out_int : int64[a - old_from + b, N_INT_COLUMNS]
        Filled in place.
    """
    i = old_from
    n_old = old_t.shape[0]
    j = 0
    n_new = order.shape[0]
    columns = out_int.shape[1]
    for o in range(out_t.shape[0]):
        if j >= n_new or (i < n_old and old_t[i] <= new_t[order[j]]):
            out_t[o] = old_t[i]
            out_acceptance[o] = old_acceptance[i]
            for k in range(columns):
                out_int[o, k] = old_int[i, k]
            i += 1
        else:
            r = order[j]
            out_t[o] = new_t[r]
            out_acceptance[o] = new_acceptance[r]
            for k in range(columns):
                out_int[o, k] = new_int[r, k]
            j += 1

"""Reference for :mod:`mcsim.kernels.workload`: a block of sessions' turns and the time-ordered pool, in plain Python.

Each session is written out as its conversation, turn by turn (system prompt, every earlier exchange, a new user
message), read straight from the generator's definition (:mod:`mcsim.stages.workload`); the pool is one stable
sort of its rows.
"""

from __future__ import annotations

import itertools
import math


def session_rows(session_class, turns, sys_len, sys_base, class_first, user_draws, output_draws, acceptance_draws,
                 start, think_s, max_context, block_tokens, drop_before_zero, first_session, next_base):
    """The rows :func:`mcsim.kernels.workload.session_rows` writes, as a list of dicts, and the next base.

    Parameters are those of the kernel, as lists or arrays; the result lists the kept turns in generation order,
    each ``{"t", "acceptance", "class", "prompt", "output", "session", "nblocks", "sys_full", "sys_base",
    "own_base"}``.
    """
    used = {c: 0 for c in range(len(class_first))}  # draws used so far, per class
    row = 0
    base = next_base
    out = []
    for s, (c, n_turns) in enumerate(zip(session_class, turns)):
        c, system = int(c), int(sys_len[s])
        conversation = []  # (user, answer) exchanges so far
        session_turns = []
        clock = float(start[s])
        for j in range(int(n_turns)):
            at = int(class_first[c]) + used[c]
            used[c] += 1
            user = max(round_half_even(float(user_draws[at])), 1)
            answer = max(round_half_even(float(output_draws[at])), 1)
            answer = min(answer, max(max_context // 2, 1))
            if j == 0:
                answer = min(answer, max(max_context - system - 1, 1))
                user = min(user, max(max_context - answer - system, 1))
            else:
                clock = clock + float(think_s[row])
            prompt = system + sum(u + a for u, a in conversation) + user
            conversation.append((user, answer))
            session_turns.append({"j": j, "t": clock, "user": user, "prompt": prompt, "output": answer,
                                  "acceptance": min(max(float(acceptance_draws[at]), 0.0), 1.0)})
            row += 1
        # The first turn always stays; the first later turn that overflows the context ends the session.
        fitting = [session_turns[0]] + list(itertools.takewhile(
            lambda turn: turn["prompt"] + turn["output"] <= max_context, session_turns[1:]))
        for turn in fitting:
            if drop_before_zero and turn["t"] < 0.0:
                continue
            out.append({"t": turn["t"], "acceptance": turn["acceptance"], "class": c, "prompt": turn["prompt"],
                        "output": turn["output"], "session": first_session + s,
                        "nblocks": turn["prompt"] // block_tokens, "sys_full": system // block_tokens,
                        "sys_base": int(sys_base[s]), "own_base": base})
        base += fitting[-1]["prompt"] // block_tokens
    return out, base


def round_half_even(x: float) -> int:
    """``x`` to the nearest integer, halves to the even one (as :func:`numpy.rint`)."""
    return int(round(x)) if math.isfinite(x) else 0


def merge_rows(old_rows: list, new_rows: list) -> list:
    """The pool after new rows join it: every row by time, an old row before a new one at the same time, new rows
    at the same time in generation order (one stable sort of old rows then new ones)."""
    return sorted(old_rows + new_rows, key=lambda row: row["t"])

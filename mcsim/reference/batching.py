"""Reference for :mod:`mcsim.kernels.batching`: the step-level serving simulator as a plain event loop.

Same rules as the kernel (its module docstring states them in full), written for obviousness: each
request is a small object, the running set is a Python list in admission order, the waiting queue a
``deque``, future arrivals a ``heapq`` of ``(time, index)``; every step looks at every running sequence
(the kernel instead keeps per-step buckets of the sequences that finish or need a KV block).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass

WAITING, PREFILLING, DECODING, DONE = "waiting", "prefilling", "decoding", "done"


@dataclass
class _Request:
    index: int
    arrival: float
    prefill: int
    context: int
    output: int
    passes: int
    state: str = "pending"
    prefill_left: int = 0
    passes_done: int = 0
    first_token_done: bool = False
    held_blocks: int = 0
    admitted_once: bool = False

    def tokens_after(self, passes_done: int) -> int:
        """Output tokens produced once ``passes_done`` decode passes ran (the first token included)."""
        if self.passes == 0:
            return 1
        return 1 + passes_done * (self.output - 1) // self.passes

    def kv_rate(self) -> float:
        """KV tokens one pass adds, on average: the linear form of :meth:`tokens_after`."""
        return (self.output - 1) / self.passes if self.passes > 0 else 0.0


def bracket(edges, x):
    """Lower index, upper index and weight of ``x`` between ``edges`` (clamped at both ends)."""
    last = len(edges) - 1
    if last == 0 or x <= edges[0]:
        return 0, min(1, last), 0.0
    if x >= edges[last]:
        return last - 1, last, 1.0
    i = bisect.bisect_right(edges, x) - 1
    return i, i + 1, (x - edges[i]) / (edges[i + 1] - edges[i])


def _step_time(table, decode_edges, prefill_edges, decode_seqs, prefill_tokens):
    """Bilinear interpolation of the step-time table, clamped at the edges (same arithmetic as the kernel)."""
    i0, i1, fx = bracket(decode_edges, float(decode_seqs))
    j0, j1, fy = bracket(prefill_edges, float(prefill_tokens))
    low = table[i0][j0] * (1.0 - fy) + table[i0][j1] * fy
    high = table[i1][j0] * (1.0 - fy) + table[i1][j1] * fy
    return low * (1.0 - fx) + high * fx


def simulate_reference(
    arrival_s,
    prefill_tokens,
    context_tokens,
    output_tokens,
    passes,
    think_s,
    *,
    token_budget,
    max_seqs,
    kv_blocks,
    block_tokens,
    chunk_tokens,
    verify_tokens,
    policy,
    preempt,
    order="fcfs",
    queue_key=None,
    mixing="mixed",
    max_new_per_step=0,
    closed_users,
    warmup_s,
    step_time_table,
    decode_edges,
    prefill_edges,
    kv_slope=None,
    kv_ref_context=0.0,
):
    """Simulate one serving instance step by step.

    Parameters are those of :func:`mcsim.kernels.batching.simulate` as Python sequences and scalars
    (``policy`` is ``"continuous"`` or ``"static"``; ``preempt`` a bool), plus the fields of a
    :class:`mcsim.perf.policies.Policy` by name: ``order`` (``"fcfs"``, or ``"priority"`` /
    ``"shortest-prompt"``: the waiting request with the lowest ``(queue_key, rank of arrival)`` is the head),
    ``mixing`` (``"mixed"`` or ``"exclusive"``) and ``max_new_per_step`` (0 = no cap). The attended KV of every decoding
    sequence is summed afresh at every step (the kernel keeps the sum up to date instead).

    Returns
    -------
    dict
        ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s`` (lists of float, one per request),
        ``steps``, ``preemptions``, ``window_end_s``, ``in_system_integral``, ``window_steps``,
        ``window_step_s_sum``, ``window_decode_seqs_sum``, ``window_decode_steps``,
        ``waiting_at_window_end``, ``end_s`` and ``log``: one ``(start_s, decode_seqs, prefill_tokens,
        step_s, waiting)`` tuple per step.
    """
    n = len(arrival_s)
    table = [list(map(float, row)) for row in step_time_table]
    decode_edges = [float(e) for e in decode_edges]
    prefill_edges = [float(e) for e in prefill_edges]
    kv_slope = [0.0] * len(decode_edges) if kv_slope is None else [float(s) for s in kv_slope]
    requests = [
        _Request(r, float(arrival_s[r]), int(prefill_tokens[r]), int(context_tokens[r]), int(output_tokens[r]),
                 int(passes[r]))
        for r in range(n)
    ]
    first_token = [math.nan] * n
    finish = [math.nan] * n
    queue = [math.nan] * n
    arrivals: list[tuple[float, int]] = []
    initial = n if closed_users == 0 else min(closed_users, n)
    for r in range(initial):
        heapq.heappush(arrivals, (requests[r].arrival, r))
    waiting: deque[_Request] = deque()
    keyed = order != "fcfs" and policy != "static"  # a static batch forms in arrival order, as in the kernel
    key = [0] * n if queue_key is None else [int(k) for k in queue_key]
    rank = [0] * n  # rank of arrival: FCFS among equal keys
    if policy == "static":
        max_new_per_step = 0

    def head():
        """The waiting request that is served next."""
        if keyed:
            return min(waiting, key=lambda q: (key[q.index], rank[q.index]))
        return waiting[0]
    running: list[_Request] = []
    free_blocks = kv_blocks
    stats = {"steps": 0, "preemptions": 0, "window_end_s": math.nan, "in_system_integral": 0.0, "window_steps": 0,
             "window_step_s_sum": 0.0, "window_decode_seqs_sum": 0.0, "window_decode_steps": 0,
             "waiting_at_window_end": 0, "end_s": math.nan}
    log = []
    released = 0

    def blocks(tokens):
        return (tokens + block_tokens - 1) // block_tokens

    def blocks_at_admission(req):
        if preempt and policy == "continuous":
            return blocks(req.context + req.tokens_after(req.passes_done))
        return blocks(req.context + req.output)

    def finish_request(req, time):
        nonlocal free_blocks
        req.state = DONE
        finish[req.index] = time
        free_blocks += req.held_blocks
        req.held_blocks = 0
        follower = req.index + closed_users
        if closed_users > 0 and follower < n:
            requests[follower].arrival = time + float(think_s[follower])
            heapq.heappush(arrivals, (requests[follower].arrival, follower))

    def admit(req, time):
        nonlocal free_blocks
        waiting.remove(req)
        req.held_blocks = blocks_at_admission(req)
        free_blocks -= req.held_blocks
        req.state = PREFILLING
        req.prefill_left = req.prefill + (req.tokens_after(req.passes_done) if req.first_token_done else 0)
        if not req.admitted_once:
            req.admitted_once = True
            queue[req.index] = time - req.arrival

    def chunk(req, budget_left):
        size = min(req.prefill_left, budget_left)
        return min(size, chunk_tokens) if chunk_tokens > 0 else size

    def prefill_done(req, time):
        """Prefill finished at ``time``: first token (unless a recompute), then decoding or done."""
        if not req.first_token_done:
            req.first_token_done = True
            first_token[req.index] = time
        if req.passes_done == req.passes:
            finish_request(req, time)
            return True
        req.state = DECODING
        return False

    t = -math.inf
    batch: list[_Request] = []  # static policy: the batch in progress
    decode_left = 0
    while True:
        while arrivals and arrivals[0][0] <= t:
            _, r = heapq.heappop(arrivals)
            requests[r].state = WAITING
            rank[r] = released
            waiting.append(requests[r])
            released += 1
            if released == n:
                stats["window_end_s"] = t
                stats["waiting_at_window_end"] = len(waiting)
        busy = len(batch) > 0 if policy == "static" else len(running) > 0
        if not busy and not waiting:
            if not arrivals:
                break
            t = arrivals[0][0]
            continue
        in_system = len(waiting) + (len(batch) if policy == "static" else len(running))
        chunks = []
        if policy == "static":
            if not batch:
                while waiting and len(batch) < max_seqs and blocks_at_admission(head()) <= free_blocks:
                    q = head()
                    batch.append(q)
                    admit(q, t)
            prefilling = [q for q in batch if q.state == PREFILLING]
            decoders = batch if not prefilling else []
            decode_seqs = len(decoders)
            budget_left = token_budget
            for q in prefilling:
                if budget_left <= 0:
                    break
                c = chunk(q, budget_left)
                chunks.append((q, c))
                budget_left -= c
        else:
            # Exclusive mixing: prefill only when some running sequence has prefill left or the head can be
            # admitted; otherwise decode only.
            prefill_step = mixing == "exclusive" and (
                any(q.state == PREFILLING for q in running)
                or (bool(waiting) and len(running) < max_seqs and blocks_at_admission(head()) <= free_blocks))
            preempted = False
            if preempt and not prefill_step:
                for s in [q for q in running if q.state == DECODING]:
                    if s.state != DECODING:
                        continue
                    need = blocks(s.context + s.tokens_after(s.passes_done + 1)) - s.held_blocks
                    if need <= 0:
                        continue
                    while free_blocks < need:
                        victim = running.pop()
                        preempted = True
                        stats["preemptions"] += 1
                        free_blocks += victim.held_blocks
                        victim.held_blocks = 0
                        victim.state = WAITING
                        waiting.appendleft(victim)
                        if victim is s:
                            break
                    if s.state == DECODING:
                        free_blocks -= need
                        s.held_blocks += need
            decoders = [] if prefill_step else [q for q in running if q.state == DECODING]
            decode_seqs = len(decoders)
            if prefill_step:
                budget_left = token_budget
            elif mixing == "exclusive":
                budget_left = 0
            else:
                budget_left = max(0, token_budget - decode_seqs * verify_tokens)
            for q in running:
                if budget_left <= 0:
                    break
                if q.state == PREFILLING:
                    c = chunk(q, budget_left)
                    chunks.append((q, c))
                    budget_left -= c
            if not preempted:
                admitted = 0
                while budget_left > 0 and waiting and len(running) < max_seqs and (
                        max_new_per_step == 0 or admitted < max_new_per_step):
                    q = head()
                    if blocks_at_admission(q) > free_blocks:
                        break
                    admit(q, t)
                    admitted += 1
                    running.append(q)
                    c = chunk(q, budget_left)
                    chunks.append((q, c))
                    budget_left -= c
        step_prefill = sum(c for _, c in chunks)
        if decode_seqs == 0 and step_prefill == 0:
            if policy != "static" and mixing == "exclusive":
                continue  # every decoding sequence was preempted: the next step prefills them again
            raise RuntimeError("a step with nothing to run")
        step_s = _step_time(table, decode_edges, prefill_edges, decode_seqs, step_prefill)
        if decode_seqs > 0 and any(kv_slope):
            if policy == "static":
                done = max(q.passes for q in batch) - decode_left  # decode steps the batch has run
                kv = sum(q.context + 1 + min(done, q.passes) * q.kv_rate() for q in decoders)
            else:
                kv = sum(q.context + 1 + q.passes_done * q.kv_rate() for q in decoders)
            i0, i1, fx = bracket(decode_edges, float(decode_seqs))
            slope = kv_slope[i0] * (1.0 - fx) + kv_slope[i1] * fx
            step_s = max(step_s + slope * (kv - decode_seqs * kv_ref_context), 1e-12)
        t_end = t + step_s
        log.append((t, decode_seqs, step_prefill, step_s, len(waiting)))
        stats["steps"] += 1
        if released < n:
            start = max(t, warmup_s)
            if t_end > start:
                stats["in_system_integral"] += in_system * (t_end - start)
            if t >= warmup_s:
                stats["window_steps"] += 1
                stats["window_step_s_sum"] += step_s
                if decode_seqs > 0:
                    stats["window_decode_seqs_sum"] += decode_seqs
                    stats["window_decode_steps"] += 1
        for q, c in chunks:
            q.prefill_left -= c
            if q.prefill_left == 0:
                if policy == "static":
                    q.state = DECODING
                    if not q.first_token_done:
                        q.first_token_done = True
                        first_token[q.index] = t_end
                elif prefill_done(q, t_end):
                    running.remove(q)
        if policy == "static":
            if decoders:
                decode_left -= 1
            elif all(q.state == DECODING for q in batch):
                decode_left = max(q.passes for q in batch)
            if decode_left == 0 and all(q.state == DECODING for q in batch):
                for q in batch:
                    finish_request(q, t_end)
                batch = []
        else:
            for q in decoders:
                q.passes_done += 1
                if q.passes_done == q.passes:
                    finish_request(q, t_end)
                    running.remove(q)
        t = t_end
    stats["end_s"] = t
    return dict(arrival_s=[q.arrival for q in requests], first_token_s=first_token, finish_s=finish,
                queue_s=queue, log=log, **stats)

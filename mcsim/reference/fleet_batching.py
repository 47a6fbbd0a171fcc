"""Reference for :mod:`mcsim.kernels.fleet_batching`: replicas behind a global router as a plain event loop.

Same rules as the kernel (its module docstring states them), written for obviousness and in a different
shape: one global loop repeatedly takes the earliest event of the whole fleet -- the next step start of a busy
instance, or the next arrival -- and a step wins only when it starts strictly before the arrival. Each
instance is a small object with a ``deque`` for its waiting queue (a list sorted by key and arrival under a keyed
order) and a list, in admission order, for its
running set.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections import deque
from dataclasses import dataclass, field

from mcsim.perf.fleet_batching import ROUTERS  # the names only; the rules are written out here
from mcsim.perf.policies import POLICIES
from mcsim.reference.batching import bracket, _step_time
from mcsim.reference.kv_tiers import TieredCache


@dataclass
class _Request:
    index: int
    arrival: float
    prompt: int
    blocks: list
    context: int
    output: int
    passes: int
    prefill_left: int = 0
    passes_done: int = 0
    decoding: bool = False
    held_blocks: int = 0
    admitted_once: bool = False
    first_token_done: bool = False
    miss: int = 0
    key: int = 0

    def tokens_after(self, passes_done: int) -> int:
        """Output tokens produced once ``passes_done`` decode passes ran (the first token included)."""
        if self.passes == 0:
            return 1
        return 1 + passes_done * (self.output - 1) // self.passes


@dataclass
class _Instance:
    free_blocks: int
    clock: float = -math.inf
    waiting: deque = field(default_factory=deque)  # FCFS; keyed orders keep it sorted by (key, index)
    running: list = field(default_factory=list)
    steps: int = 0
    cache: TieredCache | None = None
    finished_last: list = field(default_factory=list)  # (request, blocks) that finished in the last step

    def load_at(self, t: float) -> int:
        """Requests in flight at ``t``: those of a step still running at ``t`` have not finished yet."""
        late = len(self.finished_last) if self.clock > t else 0
        return len(self.waiting) + len(self.running) + late

    def free_at(self, t: float) -> int:
        """Free KV blocks at ``t``: a step still running at ``t`` still holds its finishing requests' blocks."""
        late = sum(blocks for _, blocks in self.finished_last) if self.clock > t else 0
        return self.free_blocks - late

    def busy(self) -> bool:
        return bool(self.waiting) or bool(self.running)


def simulate_fleet_reference(arrival_s, prompt_tokens, context_tokens, output_tokens, passes, router_uniform, *,
                             n_instances, router, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                             verify_tokens, step_time_table, decode_edges, prefill_edges, kv_slope=None,
                             kv_ref_context=0.0, block_lists=None, fixed_instance=None, capacity_blocks=(0, 0, 0),
                             balance=0.25, balance_requests=64, warmup_s=0.0, preempt=False, max_new_per_step=0,
                             policy="fcfs", priority=None, closed_users=0, think_s=None, warmup_request=-1):
    """Simulate ``n_instances`` replicas behind a router, one fleet-wide event at a time.

    Parameters are those of :func:`mcsim.kernels.fleet_batching.simulate_fleet` as Python sequences and
    scalars, with ``router`` by name (one of :data:`ROUTERS`), the per-instance settings by keyword, the prompt
    blocks as one list per request (``block_lists``) and the prefix-affinity instances as ``fixed_instance``.
    ``preempt``: KV grows with each pass and the newest running sequence is preempted (recomputed) when an
    instance's pool runs out, the rules of :func:`mcsim.reference.batching.simulate_reference`. ``policy``: a
    policy of :data:`~mcsim.perf.fleet_batching.REPLICA_SCHEDULERS` by name; ``priority``: per request, for
    ``"priority"``. ``closed_users`` (``U``), ``think_s``: a closed loop, request ``r >= U`` arriving
    ``think_s[r]`` after request ``r - U`` finishes; ``warmup_request``: the window starts when that request
    arrives (``warmup_s`` is then not read).

    Returns
    -------
    dict
        ``instance`` (list of int), ``first_token_s``, ``finish_s``, ``queue_s`` (lists of float, one per
        request), ``cached`` (per request, reused tokens from HBM, DRAM, NVMe), ``instance_steps`` (list of
        int, one per instance), ``arrival_s`` (the arrivals that happened) and ``stats`` (the window's sums, by
        the names of the kernel's ``STAT_*``, in lower case without the prefix).
    """
    n = len(arrival_s)
    table = [list(map(float, row)) for row in step_time_table]
    decode_edges = [float(e) for e in decode_edges]
    prefill_edges = [float(e) for e in prefill_edges]
    kv_slope = [0.0] * len(decode_edges) if kv_slope is None else [float(s) for s in kv_slope]
    block_lists = [[] for _ in range(n)] if block_lists is None else [list(b) for b in block_lists]
    requests = [_Request(r, float(arrival_s[r]), int(prompt_tokens[r]), block_lists[r], int(context_tokens[r]),
                         int(output_tokens[r]), int(passes[r])) for r in range(n)]
    caching = capacity_blocks[0] > 0
    if router == "pooled":  # one cache of every instance's capacity, shared
        shared = TieredCache([c * n_instances for c in capacity_blocks]) if caching else None
        fleet = [_Instance(kv_blocks, cache=shared) for _ in range(n_instances)]
    else:
        fleet = [_Instance(kv_blocks, cache=TieredCache(capacity_blocks) if caching else None)
                 for _ in range(n_instances)]
    instance = [-1] * n
    cached = [(0, 0, 0)] * n
    stats = dict(steps=0, window_end_s=float(arrival_s[-1]), in_system_integral=0.0, window_steps=0,
                 window_step_s_sum=0.0, window_decode_seqs_sum=0, window_decode_steps=0,
                 waiting_at_window_end=0, end_s=0.0, preemptions=0)
    first_token = [math.nan] * n
    finish = [math.nan] * n
    queue = [math.nan] * n

    def chunk(req, budget_left):
        size = min(req.prefill_left, budget_left)
        return min(size, chunk_tokens) if chunk_tokens > 0 else size

    def blocks(tokens):
        return -(-tokens // block_tokens)

    pending = [(float(arrival_s[r]), r) for r in range(min(closed_users, n) if closed_users else n)]
    heapq.heapify(pending)
    window = {"start": math.inf if warmup_request >= 0 else warmup_s}

    def step(node, inside_window):
        warmup_s = window["start"]
        t = node.clock
        in_flight = len(node.waiting) + len(node.running)
        preempted = False
        if preempt:  # KV growth, oldest admission first; the newest running sequence goes until it fits
            for s in [q for q in node.running if q.decoding]:
                if not s.decoding:
                    continue
                need = blocks(s.context + s.tokens_after(s.passes_done + 1)) - s.held_blocks
                if need <= 0:
                    continue
                while node.free_blocks < need:
                    victim = node.running.pop()
                    preempted = True
                    stats["preemptions"] += 1
                    node.free_blocks += victim.held_blocks
                    victim.held_blocks = 0
                    victim.decoding = False
                    enqueue(node, victim, again=True)
                    if victim is s:
                        break
                if s.decoding:
                    node.free_blocks -= need
                    s.held_blocks += need
        decoders = [q for q in node.running if q.decoding]
        budget_left = max(0, token_budget - len(decoders) * verify_tokens)
        chunks = []
        for q in node.running:
            if budget_left <= 0:
                break
            if not q.decoding:
                c = chunk(q, budget_left)
                chunks.append((q, c))
                budget_left -= c
        admitted = 0
        while (not preempted and budget_left > 0 and node.waiting and len(node.running) < max_seqs
               and (max_new_per_step == 0 or admitted < max_new_per_step)):
            q = node.waiting[0]
            need = blocks(q.context + (q.tokens_after(q.passes_done) if preempt else q.output))
            if need > node.free_blocks:
                break
            node.waiting.popleft()
            node.free_blocks -= need
            q.held_blocks = need
            admitted += 1
            node.running.append(q)
            if q.admitted_once:  # a recompute: the prompt left to compute and the output produced so far
                q.prefill_left = q.miss + (q.tokens_after(q.passes_done) if q.first_token_done else 0)
                c = chunk(q, budget_left)
                chunks.append((q, c))
                budget_left -= c
                continue
            q.admitted_once = True
            reused = [0, 0, 0]
            if node.cache is not None:
                reused = [h * block_tokens for h in node.cache.admit(q.blocks)]
                excess = sum(reused) - (q.prompt - 1)  # at least one prompt token is computed
                for tier in range(3):
                    take = min(max(excess, 0), reused[tier])
                    reused[tier] -= take
                    excess -= take
            cached[q.index] = tuple(reused)
            q.miss = max(q.prompt - sum(reused), 1)
            q.prefill_left = q.miss
            queue[q.index] = t - q.arrival
            c = chunk(q, budget_left)
            chunks.append((q, c))
            budget_left -= c
        prefill = sum(c for _, c in chunks)
        if not decoders and prefill == 0:
            raise RuntimeError("a step with nothing to run")
        step_s = _step_time(table, decode_edges, prefill_edges, len(decoders), prefill)
        if decoders:
            i0, i1, fx = bracket(decode_edges, float(len(decoders)))
            slope = kv_slope[i0] * (1.0 - fx) + kv_slope[i1] * fx
            if slope != 0.0:
                kv = 0.0
                for q in decoders:
                    kv += q.context + 1 + q.passes_done * ((q.output - 1) / q.passes)
                step_s = max(step_s + slope * (kv - len(decoders) * kv_ref_context), 1e-12)
        t_end = t + step_s
        node.steps += 1
        stats["steps"] += 1
        stats["end_s"] = max(stats["end_s"], t_end)
        if inside_window:
            if t_end > warmup_s:
                stats["in_system_integral"] += in_flight * (t_end - max(t, warmup_s))
            if t >= warmup_s:
                stats["window_steps"] += 1
                stats["window_step_s_sum"] += step_s
                if decoders:
                    stats["window_decode_seqs_sum"] += len(decoders)
                    stats["window_decode_steps"] += 1
        finished = []
        for q in decoders:
            q.passes_done += 1
            if q.passes_done == q.passes:
                finished.append(q)
        for q, c in chunks:
            q.prefill_left -= c
            if q.prefill_left == 0:
                if not q.first_token_done:  # (not after a recompute)
                    q.first_token_done = True
                    first_token[q.index] = t_end
                if q.passes_done == q.passes:
                    finished.append(q)
                else:
                    q.decoding = True
        node.finished_last = [(q, q.held_blocks) for q in finished]
        for q in finished:
            node.free_blocks += q.held_blocks
            q.held_blocks = 0
            finish[q.index] = t_end
            node.running.remove(q)
            follower = q.index + closed_users
            if closed_users and follower < n:  # the same user's next request
                requests[follower].arrival = t_end + float(think_s[follower])
                heapq.heappush(pending, (requests[follower].arrival, follower))
        node.clock = t_end

    order = POLICIES[policy].order

    def enqueue(node, q, again=False):
        """FCFS: a new request at the tail, a preempted one at the head. Keyed: both by (key, index), the key
        fixed when the request first arrives (for shortest-prompt, the prompt tokens its instance's cache does
        not hold then)."""
        if order == "fcfs":
            if again:
                node.waiting.appendleft(q)
            else:
                node.waiting.append(q)
            return
        if not again:
            if order == "priority":
                q.key = -int(priority[q.index])
            else:
                held = node.cache.prefix(q.blocks) * block_tokens if node.cache is not None else 0
                q.key = max(q.prompt - held, 1)
        position = bisect.bisect([(p.key, p.index) for p in node.waiting], (q.key, q.index))
        node.waiting.insert(position, q)

    def route(r):
        t = requests[r].arrival
        if router == "prefix-affinity":
            return fixed_instance[r]
        if router == "cache-aware":
            loads = [node.load_at(t) for node in fleet]
            least = loads.index(min(loads))
            if max(loads) - min(loads) > balance_requests and max(loads) > (1 + balance) * min(loads):
                return least  # imbalanced: the least loaded instance
            if not caching:
                return least
            matched = [node.cache.prefix(requests[r].blocks) for node in fleet]
            return min(range(n_instances), key=lambda i: (-matched[i], loads[i], i))
        if router == "round-robin":
            return r % n_instances
        if router == "random":
            return min(int(router_uniform[r] * n_instances), n_instances - 1)
        if router in ("least-outstanding", "pooled"):
            loads = [node.load_at(t) for node in fleet]
            return loads.index(min(loads))
        if router == "least-kv":
            free = [node.free_at(t) for node in fleet]
            return free.index(max(free))
        raise ValueError(f"router must be one of {ROUTERS}, got {router!r}")

    released = 0
    while True:
        busy = [node for node in fleet if node.busy()]
        arrival_t = pending[0][0] if pending else math.inf
        earliest = min(busy, key=lambda node: node.clock) if busy else None
        if earliest is not None and earliest.clock < arrival_t:
            step(earliest, released < n)
            continue
        if not pending:
            break
        _, index = heapq.heappop(pending)
        q = requests[index]
        if index == warmup_request:
            window["start"] = q.arrival
        chosen = route(index)
        node = fleet[chosen]
        instance[q.index] = chosen
        if not node.busy():
            node.clock = max(node.clock, q.arrival)
        enqueue(node, q)
        released += 1
        if released == n:
            stats["waiting_at_window_end"] = sum(len(node.waiting) for node in fleet)
            stats["window_end_s"] = q.arrival
    return dict(arrival_s=[q.arrival for q in requests], instance=instance, first_token_s=first_token,
                finish_s=finish, queue_s=queue, cached=cached,
                instance_steps=[node.steps for node in fleet], stats=stats)

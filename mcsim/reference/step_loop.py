"""One serving instance of the reference event loop: its requests, its queue and the rules of one step.

The rules are those of :mod:`mcsim.kernels.step_loop` (its module docstring states them in full): continuous
batching with mixed or exclusive prefill/decode steps, FCFS or keyed waiting queues, a cap on admissions per
step, whole-request KV reservation or KV growth with preemption by recompute, and static batching. They are
written here for obviousness, not speed: every step looks at every running sequence and sums the batch's KV
afresh.

:func:`mcsim.reference.fleet_batching.simulate_fleet_reference` runs any number of these instances on one
clock behind a router; :func:`mcsim.reference.batching.simulate_reference` is that loop with one instance.

Examples
--------
>>> rules = Rules(token_budget=64, max_seqs=4, kv_blocks=10, block_tokens=16, chunk_tokens=0, verify_tokens=1,
...               admission="continuous", order="fcfs", mixing="mixed", max_new=0, preempt=False,
...               table=[[0.25]], decode_edges=[1.0], prefill_edges=[0.0])
>>> node = Instance(rules)
>>> node.clock = 0.0
>>> node.enqueue(Request(0, 0.0, prompt=10, blocks=[], context=10, output=3, passes=2))
>>> [(s.decode_seqs, s.prefill_tokens) for s in (node.step(), node.step(), node.step())]
[(0, 10), (1, 0), (1, 0)]
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field


def bracket(edges, x):
    """Lower index, upper index and weight of ``x`` between ``edges`` (clamped at both ends).

    Examples
    --------
    >>> bracket([0.0, 10.0, 20.0], 15.0)
    (1, 2, 0.5)
    """
    last = len(edges) - 1
    if last == 0 or x <= edges[0]:
        return 0, min(1, last), 0.0
    if x >= edges[last]:
        return last - 1, last, 1.0
    i = bisect.bisect_right(edges, x) - 1
    return i, i + 1, (x - edges[i]) / (edges[i + 1] - edges[i])


def step_time(table, decode_edges, prefill_edges, decode_seqs, prefill_tokens):
    """Bilinear interpolation of the step-time table, clamped at the edges (the kernel's arithmetic)."""
    i0, i1, fx = bracket(decode_edges, float(decode_seqs))
    j0, j1, fy = bracket(prefill_edges, float(prefill_tokens))
    low = table[i0][j0] * (1.0 - fy) + table[i0][j1] * fy
    high = table[i1][j0] * (1.0 - fy) + table[i1][j1] * fy
    return low * (1.0 - fx) + high * fx


@dataclass
class Request:
    """One request and its progress.

    ``prompt`` tokens of which ``miss`` are computed at its first admission (the rest its instance's prefix
    cache holds), ``context`` tokens of KV before its output, ``output`` tokens produced over ``passes`` decode
    passes after the first token. ``key``, then ``tie`` (its rank of arrival, or its index), order a keyed
    waiting queue.
    """

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
    tie: int = 0

    def tokens_after(self, passes_done: int) -> int:
        """Output tokens produced once ``passes_done`` decode passes ran (the first token included)."""
        if self.passes == 0:
            return 1
        return 1 + passes_done * (self.output - 1) // self.passes

    def kv_tokens(self) -> float:
        """KV tokens a decoding pass attends over: ``context + 1 + j x (output - 1) / P`` after ``j`` passes."""
        rate = (self.output - 1) / self.passes if self.passes > 0 else 0.0
        return self.context + 1 + self.passes_done * rate


@dataclass(frozen=True)
class Rules:
    """What every instance of a run shares: its scheduler settings, policy fields and step-time model.

    ``admission`` (``"continuous"`` or ``"static"``), ``order`` (``"fcfs"``, ``"priority"``,
    ``"shortest-prompt"``) and ``mixing`` (``"mixed"``, ``"exclusive"``) are the fields of a
    :class:`mcsim.scenario.policies.Policy`; ``max_new`` caps admissions per step (0: no cap; continuous only);
    ``preempt`` grows KV pass by pass and preempts by recompute (continuous only). ``table``,
    ``decode_edges``, ``prefill_edges``, ``kv_slope`` and ``kv_ref_context``: the step-time model.
    """

    token_budget: int
    max_seqs: int
    kv_blocks: int
    block_tokens: int
    chunk_tokens: int
    verify_tokens: int
    admission: str
    order: str
    mixing: str
    max_new: int
    preempt: bool
    table: list
    decode_edges: list
    prefill_edges: list
    kv_slope: list | None = None
    kv_ref_context: float = 0.0

    @property
    def static(self) -> bool:
        return self.admission == "static"

    @property
    def keyed(self) -> bool:
        """A keyed waiting queue (a static batch forms first come, first served whatever the order)."""
        return self.order != "fcfs" and not self.static

    @property
    def exclusive(self) -> bool:
        return self.mixing == "exclusive" and not self.static

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_tokens)

    def reservation(self, req: Request) -> int:
        """KV blocks admission takes: the context and the output so far under preemption, else the whole request."""
        if self.preempt and not self.static:
            return self.blocks(req.context + req.tokens_after(req.passes_done))
        return self.blocks(req.context + req.output)

    def chunk(self, req: Request, budget_left: int) -> int:
        size = min(req.prefill_left, budget_left)
        return min(size, self.chunk_tokens) if self.chunk_tokens > 0 else size

    def seconds(self, decoders, prefill_tokens: int) -> float:
        """Step time: the table at (decoding sequences, prefill tokens), plus the batch's own KV lengths' cost."""
        d = len(decoders)
        step_s = step_time(self.table, self.decode_edges, self.prefill_edges, d, prefill_tokens)
        if d and self.kv_slope is not None:
            i0, i1, fx = bracket(self.decode_edges, float(d))
            slope = self.kv_slope[i0] * (1.0 - fx) + self.kv_slope[i1] * fx
            if slope != 0.0:
                kv = 0.0
                for q in decoders:
                    kv += q.kv_tokens()
                step_s = max(step_s + slope * (kv - d * self.kv_ref_context), 1e-12)
        return step_s


@dataclass
class Step:
    """What one step of one instance did; ``ran`` is False for a decode step whose KV growth preempted every
    decoding sequence (exclusive mixing), which takes no time."""

    start_s: float
    in_flight: int  # waiting + running when the step starts
    ran: bool = True
    end_s: float = 0.0
    decode_seqs: int = 0
    prefill_tokens: int = 0
    step_s: float = 0.0
    waiting: int = 0  # after the step's preemptions and admissions
    preemptions: int = 0
    admitted: list = field(default_factory=list)  # first admissions: (request, reused tokens per tier)
    first_tokens: list = field(default_factory=list)
    finished: list = field(default_factory=list)


class Instance:
    """One serving instance: a waiting queue, a running set in admission order, a KV pool and a clock.

    The waiting queue is a ``deque``: FCFS appends arrivals at the tail and puts a preempted request back at
    the head; a keyed order keeps it sorted by ``(key, tie)``. Its head is always ``waiting[0]``.
    Under static batching ``running`` is the batch in progress. ``cache`` is a
    :class:`mcsim.reference.kv_tiers.TieredCache` (shared between instances when pooled) or None.
    """

    def __init__(self, rules: Rules, cache=None):
        self.rules = rules
        self.free_blocks = rules.kv_blocks
        self.clock = float("-inf")  # start of the next step (the end of the last one)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.steps = 0
        self.cache = cache
        self.finished_last: list[tuple[Request, int]] = []  # (request, blocks) that finished in the last step

    def busy(self) -> bool:
        return bool(self.waiting) or bool(self.running)

    def load_at(self, t: float) -> int:
        """Requests in flight at ``t``: those of a step still running at ``t`` have not finished yet."""
        late = len(self.finished_last) if self.clock > t else 0
        return len(self.waiting) + len(self.running) + late

    def free_at(self, t: float) -> int:
        """Free KV blocks at ``t``: a step still running at ``t`` still holds its finishing requests' blocks."""
        late = sum(blocks for _, blocks in self.finished_last) if self.clock > t else 0
        return self.free_blocks - late

    def enqueue(self, q: Request, again: bool = False) -> None:
        """Into the waiting queue: FCFS at the tail (``again``, a preempted request: at the head); keyed, under
        ``(q.key, q.tie)``."""
        if self.rules.keyed:
            position = bisect.bisect([(p.key, p.tie) for p in self.waiting], (q.key, q.tie))
            self.waiting.insert(position, q)
        elif again:
            self.waiting.appendleft(q)
        else:
            self.waiting.append(q)

    def head_fits(self) -> bool:
        """Whether the queue head can be admitted now (a slot and its KV blocks)."""
        return (bool(self.waiting) and len(self.running) < self.rules.max_seqs
                and self.rules.reservation(self.waiting[0]) <= self.free_blocks)

    def admit_head(self, record: Step) -> Request:
        """Admit the queue head: take its KV blocks and set its prefill. A first admission is looked up in and
        inserted into the prefix cache (at least one prompt token is computed, taken from the highest tier's
        share first); a recompute prefills what its first admission computed plus the output produced so far."""
        q = self.waiting.popleft()
        q.held_blocks = self.rules.reservation(q)
        self.free_blocks -= q.held_blocks
        q.decoding = False
        self.running.append(q)
        if q.admitted_once:
            q.prefill_left = q.miss + (q.tokens_after(q.passes_done) if q.first_token_done else 0)
            return q
        q.admitted_once = True
        reused = []
        if self.cache is not None:
            reused = [h * self.rules.block_tokens for h in self.cache.admit(q.blocks)]
            excess = sum(reused) - (q.prompt - 1)
            for tier in range(len(reused)):
                take = min(max(excess, 0), reused[tier])
                reused[tier] -= take
                excess -= take
        q.miss = max(q.prompt - sum(reused), 1)
        q.prefill_left = q.miss
        record.admitted.append((q, tuple(reused)))
        return q

    def step(self) -> Step:
        """Run the step that starts at ``self.clock``; the clock moves to its end."""
        record = Step(start_s=self.clock, in_flight=len(self.waiting) + len(self.running))
        if self.rules.static:
            decoders, chunks = self._build_static(record)
        else:
            decoders, chunks = self._build_continuous(record)
        prefill = sum(c for _, c in chunks)
        if not decoders and prefill == 0:
            if self.rules.exclusive:
                record.ran = False  # every decoding sequence was preempted: the next step prefills them again
                return record
            raise RuntimeError("a step with nothing to run")
        record.decode_seqs, record.prefill_tokens = len(decoders), prefill
        record.waiting = len(self.waiting)
        record.step_s = self.rules.seconds(decoders, prefill)
        record.end_s = self.clock + record.step_s
        if self.rules.static:
            self._end_static(record, decoders, chunks)
        else:
            self._end_continuous(record, decoders, chunks)
        self.finished_last = [(q, q.held_blocks) for q in record.finished]
        for q in record.finished:
            self.free_blocks += q.held_blocks
            q.held_blocks = 0
            self.running.remove(q)
        self.steps += 1
        self.clock = record.end_s
        return record

    def _prefill_chunks(self, budget_left: int):
        """The budget, in admission order, to running sequences with prefill left; and what is left of it."""
        chunks = []
        for q in self.running:
            if budget_left <= 0:
                break
            if not q.decoding:
                c = self.rules.chunk(q, budget_left)
                chunks.append((q, c))
                budget_left -= c
        return chunks, budget_left

    def _build_continuous(self, record: Step):
        """Continuous batching: KV growth and preemption, decodes, prefill chunks, then admissions."""
        rules = self.rules
        # Exclusive mixing: a prefill-only step when some running sequence has prefill left or the head can be
        # admitted; otherwise a decode-only step.
        prefill_step = rules.exclusive and (any(not q.decoding for q in self.running) or self.head_fits())
        if rules.preempt and not prefill_step:
            self._grow_kv(record)
        decoders = [] if prefill_step else [q for q in self.running if q.decoding]
        if prefill_step:
            budget_left = rules.token_budget
        elif rules.exclusive:
            budget_left = 0
        else:
            budget_left = max(0, rules.token_budget - len(decoders) * rules.verify_tokens)
        chunks, budget_left = self._prefill_chunks(budget_left)
        admitted = 0
        while (record.preemptions == 0 and budget_left > 0 and (rules.max_new == 0 or admitted < rules.max_new)
               and self.head_fits()):
            q = self.admit_head(record)
            admitted += 1
            c = rules.chunk(q, budget_left)
            chunks.append((q, c))
            budget_left -= c
        return decoders, chunks

    def _grow_kv(self, record: Step) -> None:
        """Every decoding sequence, oldest admission first, takes the blocks its next pass needs; while the
        pool is short the newest running sequence is preempted (possibly the one asking) and goes back to
        the queue, its KV and prefill progress lost, its output kept."""
        for s in [q for q in self.running if q.decoding]:
            if not s.decoding:
                continue  # preempted for an older sequence in this step
            need = self.rules.blocks(s.context + s.tokens_after(s.passes_done + 1)) - s.held_blocks
            if need <= 0:
                continue
            while self.free_blocks < need:
                victim = self.running.pop()
                record.preemptions += 1
                self.free_blocks += victim.held_blocks
                victim.held_blocks = 0
                victim.decoding = False
                self.enqueue(victim, again=True)
                if victim is s:
                    break
            if s.decoding:
                self.free_blocks -= need
                s.held_blocks += need

    def _end_continuous(self, record: Step, decoders, chunks) -> None:
        """Decoders run their pass (the last one finishes); a completed prefill emits the first token (not
        after a recompute) and the request decodes from the next step, or finishes if it has no passes."""
        for q in decoders:
            q.passes_done += 1
            if q.passes_done == q.passes:
                record.finished.append(q)
        for q, c in chunks:
            q.prefill_left -= c
            if q.prefill_left == 0:
                if not q.first_token_done:
                    q.first_token_done = True
                    record.first_tokens.append(q)
                if q.passes_done == q.passes:
                    record.finished.append(q)
                else:
                    q.decoding = True

    def _build_static(self, record: Step):
        """Static batching: with no batch in progress, a batch forms from the queue head (up to ``max_seqs``
        while the pool holds whole reservations); it is prefilled first (``token_budget`` tokens a step, no
        decodes), then every member decodes each step, finished ones as padding."""
        if not self.running:
            while self.head_fits():
                self.admit_head(record)
        prefilling = [q for q in self.running if not q.decoding]
        decoders = [] if prefilling else list(self.running)
        chunks, _ = self._prefill_chunks(self.rules.token_budget)
        return decoders, chunks

    def _end_static(self, record: Step, decoders, chunks) -> None:
        """Members with passes left run one; the first token ends a member's prefill; the whole batch finishes
        (and frees its blocks) at the end of the step after which its longest member has run its passes."""
        for q in decoders:
            if q.passes_done < q.passes:
                q.passes_done += 1
        for q, c in chunks:
            q.prefill_left -= c
            if q.prefill_left == 0:
                q.decoding = True
                q.first_token_done = True
                record.first_tokens.append(q)
        if all(q.decoding and q.passes_done == q.passes for q in self.running):
            record.finished.extend(self.running)

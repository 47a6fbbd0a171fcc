"""The replicas behind their router, fed their requests a part at a time, in memory that does not grow with them.

:class:`FleetStream` drives the step loop's generator (:func:`mcsim.kernels.step_loop.simulate_stream`): it puts
each part's requests in free slots of the loop, runs every step the loop can run before the next request, and,
when no slot is free or before a part reaches a slot never used, hands back every request that has finished (with
its index in the run and the caller's own columns, in no particular order), freeing their slots. A request holds
its slot only while it is in flight: a long one does not hold up the slots of those that arrived after it. Its
per-request figures and its run's statistics are those of :func:`mcsim.perf.fleet_batching.simulate_fleet_batching`
on the same requests, bit for bit, whatever the part sizes and slots (``tests/test_fleet_stream.py`` holds them
equal).

What it leaves to the whole run: a closed loop (a follower is found by its index) and prefix caches inside the
loop (their rows are keyed by the sample's blocks); a streamed sample takes its cache hits from the cache stage and
gives the tokens left to compute as each request's prompt (what shortest-prompt-first orders by).

Memory: a slot holds one request (up to 179 B of the loop's state, 129 B of inputs, outputs and bookkeeping, and
the caller's columns); the slots hold the requests in flight (queued or running on some instance), finished ones
until they are handed back, and the part being put in. Slots are reused before new ones are taken, and a slot's
pages are written only when a request first comes into it, so what a run touches follows its requests in flight,
not the slots it reserves. A run whose requests in flight fill them (a fleet far behind its arrivals: a hand-back
frees fewer than :data:`FEWEST_FREED` of them) is refused with :class:`~mcsim.errors.RunLimitError`, naming
``key``.
"""

from __future__ import annotations

import numpy as np

from mcsim.errors import RunLimitError
from mcsim.kernels import batching_helpers as indices
from mcsim.kernels import step_loop as kernel
from mcsim.perf.batching import _as_int, check_requests
from mcsim.perf.fleet_batching import given_instances, loop_params, router_entry

#: Outputs of each finished request, as :meth:`FleetStream.add` and :meth:`FleetStream.finish` hand them back
#: (with ``index``, the request's place in the run, and the part's ``payload`` columns).
OUTPUTS = ("arrival_s", "first_token_s", "finish_s", "queue_s", "instance")
#: A hand-back that frees fewer slots than this share of them, the loop having run as far as it can, is refused:
#: the fleet is that close to holding every slot (slot by slot, the stream would crawl).
FEWEST_FREED = 1 / 64


class FleetStream:
    """``n_requests`` requests through ``n_instances`` replicas, given a part at a time (open loop, sorted).

    Parameters
    ----------
    n_requests : int
        Requests in all (the run drains after the last one).
    slots : int
        Requests the loop holds at once: in flight plus the part being put in (at least 2).
    n_instances, router, step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context, token_budget,
    max_seqs, kv_blocks, block_tokens, chunk_tokens, verify_tokens, preempt, max_new_per_step, policy, balance,
    balance_requests, max_steps
        As in :func:`~mcsim.perf.fleet_batching.simulate_fleet_batching` (``kv_blocks`` is required: the pool
        cannot be sized from requests not yet seen).
    warmup_s : float or None
        Start of the measured window, s; None: given later, by :meth:`start_window`, before the first request that
        arrives at or after it is put in (a pool fed by another knows its first measured arrival only then). Not
        under static batching.
    key : str
        The scenario key a refusal names (what sets the slots).

    Examples
    --------
    >>> table = [[0.02, 0.03], [0.04, 0.05]]
    >>> fleet = FleetStream(4, slots=2, n_instances=2, router="round-robin", step_time_table=table,
    ...                     decode_edges=[1, 256], prefill_edges=[0, 8192], kv_blocks=64)
    >>> done = [fleet.add([0.0], [100], [100], [3]), fleet.add([0.5, 1.0, 1.5], [100] * 3, [100] * 3, [3] * 3)]
    >>> done.append(fleet.finish())
    >>> [round(float(x), 4) for part in done for x in part["finish_s"]]
    [0.0601, 0.5601, 1.0601, 1.5601]

    Requests are handed back as their slots are needed, in any order: each with its ``index`` in the run.
    """

    def __init__(self, n_requests: int, *, slots: int, n_instances: int, router: str, step_time_table,
                 decode_edges, prefill_edges, kv_slope=None, kv_ref_context: float = 0.0, token_budget: int = 8192,
                 max_seqs: int = 256, kv_blocks: int, block_tokens: int = 16, chunk_tokens: int = 0,
                 verify_tokens: int = 1, preempt: bool = False, max_new_per_step: int = 0, policy: str = "fcfs",
                 balance: float = 0.25, balance_requests: int = 64, warmup_s: float | None = 0.0, max_steps: int = 0,
                 key: str = "mc.chunk_requests"):
        n, w, k = int(n_requests), int(slots), int(n_instances)
        if n < 1 or w < 2 or k < 1:
            raise ValueError(f"need n_requests >= 1, slots >= 2 and n_instances >= 1; got {n}, {w}, {k}")
        self.entry = router_entry(router)
        if self.entry.prefix or self.entry.pooled:
            raise ValueError(f"the {router} router reads the loop's prefix caches, which a stream does not keep")
        table = np.ascontiguousarray(step_time_table, dtype=np.float64)
        d_edges = np.ascontiguousarray(decode_edges, dtype=np.float64)
        p_edges = np.ascontiguousarray(prefill_edges, dtype=np.float64)
        slope = np.zeros(d_edges.shape) if kv_slope is None else np.ascontiguousarray(kv_slope, dtype=np.float64)
        if kv_blocks is None or int(kv_blocks) < 1:
            raise ValueError("kv_blocks must be given, >= 1")
        one = np.ones(1, np.int64)
        self.params, scheduler = loop_params(
            one, one, self.entry, step_model=(d_edges, p_edges, table, slope, float(kv_ref_context)),
            token_budget=token_budget, max_seqs=max_seqs, kv_blocks=int(kv_blocks), block_tokens=block_tokens,
            chunk_tokens=chunk_tokens, verify_tokens=verify_tokens, preempt=preempt,
            max_new_per_step=max_new_per_step, policy=policy)
        self.scheduler = scheduler
        self.n, self.w, self.k, self.key = n, w, k, key
        self.kv_blocks = int(kv_blocks)
        self.router = router
        self.model = (table, d_edges, p_edges, slope, float(kv_ref_context))
        self.balance = (float(balance), int(balance_requests))
        self.control = np.zeros(kernel.N_CONTROL, np.int64)
        self.control[kernel.C_REQUESTS] = n
        self.warmup_s = np.inf if warmup_s is None else float(warmup_s)
        if warmup_s is None:
            if scheduler.admission == "static":
                raise ValueError("static batching's window is set before its run: give warmup_s")
            self.control[kernel.C_WINDOW] = kernel.WINDOW_LATER
        self.max_steps = max(int(max_steps), 0)
        # The slots: inputs, then outputs (the loop's own per-request state lives in the generator).
        self.inputs = {"arrival_s": np.zeros(w), "prompt": np.ones(w, np.int64), "context": np.ones(w, np.int64),
                       "output": np.ones(w, np.int64), "passes": np.zeros(w, np.int64),
                       "given": np.zeros(w, np.int64), "queue_key": np.zeros(w, np.int64)}
        self.outputs = {"arrival_s": np.empty(w), "instance": np.empty(w, np.int64), "first_token_s": np.empty(w),
                        "finish_s": np.empty(w), "queue_s": np.empty(w)}
        self.instance_steps = np.zeros(k, np.int64)
        self.stats = np.zeros(indices.N_STATS)
        cap = self.max_steps
        self.log = {"start_s": np.empty((k, cap)), "decode_seqs": np.empty((k, cap), np.int64),
                    "prefill_tokens": np.empty((k, cap), np.int64), "step_s": np.empty((k, cap)),
                    "waiting": np.empty((k, cap), np.int64)}
        self.filled = 0  # requests put in slots
        self.slot_of = np.zeros(w, np.int64)  # the slot of request g at g % w, until the loop has read it
        self.free = np.arange(w - 1, -1, -1, dtype=np.int64)  # free slots (a stack: the last ones first out)
        self.n_free = w
        self.touched = 0  # slots ever used: 0 .. touched - 1 (the others, at the stack's bottom, were never written)
        self.ran = False  # whether the loop ran since the last hand-back
        self.occupied = np.zeros(w, bool)  # slots that hold a request not handed back
        self.index = np.zeros(w, np.int64)  # the request each slot holds
        self.payload: dict = {}  # the caller's columns, per slot
        self.last_arrival = -np.inf
        self.status = None
        self._loop = None
        self._loop_arrays = None

    def start_window(self, t: float) -> None:
        """Start the measured window at ``t`` (s), before any request arriving at or after it is put in."""
        if self.control[kernel.C_WINDOW] != kernel.WINDOW_LATER:
            raise ValueError("the window's start was given already")
        if not (np.isfinite(t) and t >= self.last_arrival):
            raise ValueError(f"the window must start at a finite time not before the last arrival put in, got {t!r}")
        self.warmup_s = float(t)
        self.control[kernel.C_WINDOW_S] = np.array([t], np.float64).view(np.int64)[0]
        self.control[kernel.C_WINDOW] = kernel.WINDOW_NOW

    def add(self, arrival_s, prompt_tokens, context_tokens, output_tokens, passes=None, *, router_uniform=None,
            block_ptr=None, block_ids=None, priority=None, payload=None) -> dict:
        """Put the next requests in (their arrivals not before the last one's) and run the loop as far as it can go
        without the requests after them. Returns the requests that finished and whose slots were needed, in any
        order (arrays :data:`OUTPUTS`, ``index`` and the payload's columns; possibly empty). ``router_uniform`` (the
        random and prefix-affinity routers), ``block_ptr`` and ``block_ids`` (prefix affinity) and ``priority`` (the
        priority policy) are the part's own; ``payload`` (name -> one value per request) is kept with each request
        and handed back with it."""
        arrival = np.ascontiguousarray(arrival_s, dtype=np.float64)
        m = arrival.shape[0]
        if arrival.ndim != 1 or m == 0 or self.filled + m > self.n:
            raise ValueError(f"a part must hold 1 to {self.n - self.filled} requests, got {m}")
        if not np.all(np.isfinite(arrival)) or np.any(np.diff(arrival) < 0) or arrival[0] < self.last_arrival:
            raise ValueError("arrival_s must be finite and sorted, part after part")
        prompt = _as_int(prompt_tokens, "prompt_tokens", m)
        context = _as_int(context_tokens, "context_tokens", m)
        output = _as_int(output_tokens, "output_tokens", m)
        passes = output - 1 if passes is None else _as_int(passes, "passes", m)
        check_requests(prompt, context, output, passes)
        if np.any((context + output + self.params[indices.P_BLOCK_TOKENS] - 1) // self.params[indices.P_BLOCK_TOKENS]
                  > self.kv_blocks):
            raise ValueError(f"a request needs more KV blocks than kv_blocks={self.kv_blocks}")
        uniform = np.zeros(m) if router_uniform is None else np.asarray(router_uniform, dtype=np.float64)
        if self.router in ("random", "prefix-affinity") and router_uniform is None:
            raise ValueError(f"router_uniform is required by the {self.router} router")
        if uniform.shape != (m,) or np.any(uniform < 0) or np.any(uniform >= 1):
            raise ValueError("router_uniform must be one value in [0, 1) per request")
        ptr = np.zeros(m + 1, np.int64) if block_ptr is None else np.asarray(block_ptr, dtype=np.int64)
        ids = np.zeros(0, np.int64) if block_ids is None else np.asarray(block_ids, dtype=np.int64)
        given = given_instances(self.router, ptr, ids, uniform, self.k)
        if self.router == "round-robin":  # by the request's index in the whole run
            given = (given + self.filled) % self.k
        key = self.scheduler.queue_key(prompt, None if priority is None else _as_int(priority, "priority", m))
        self.last_arrival = float(arrival[-1])
        fields = {"arrival_s": arrival, "prompt": prompt, "context": context, "output": output, "passes": passes,
                  "given": given, "queue_key": key}
        payload = {} if payload is None else {k: np.asarray(v) for k, v in payload.items()}
        for name, values in payload.items():
            if values.shape[:1] != (m,):
                raise ValueError(f"payload {name!r} must hold one value per request")
            if name not in self.payload:
                self.payload[name] = np.zeros((self.w, *values.shape[1:]), values.dtype)
        done = []
        start = 0
        while start < m:
            # Hand back when no slot is free, and before the part reaches slots never used (memory then follows the
            # requests in flight, not the slots).
            full = self.n_free == 0
            if full or (self.ran and self.n_free - (self.w - self.touched) < m - start):
                done.append(self.harvest())
                if full and self.n_free < max(1, int(self.w * FEWEST_FREED)) and self.filled < self.n:
                    raise RunLimitError(
                        f"{self.key}: more than {self.w - self.n_free:,} requests in flight at once (the fleet falls "
                        f"behind its arrivals); the replicas' stream holds {self.w:,}")
            stop = min(m, start + self.n_free)
            count = stop - start
            slots = self.free[self.n_free - count:self.n_free][::-1].copy()
            self.n_free -= count
            self.touched = max(self.touched, int(slots.max()) + 1)
            for name, values in fields.items():
                self.inputs[name][slots] = values[start:stop]
            for name, values in payload.items():
                self.payload[name][slots] = values[start:stop]
            self.slot_of[(self.filled + np.arange(count)) % self.w] = slots
            self.occupied[slots] = True
            self.index[slots] = self.filled + np.arange(count)
            self.filled += count
            start = stop
            self._run()
        return _joined(done, self.payload)

    def finish(self) -> dict:
        """Run the loop to its end (every request put in) and hand back every request not yet handed back."""
        if self.filled != self.n:
            raise ValueError(f"{self.n - self.filled} of the {self.n} requests were not put in")
        self._run()
        if self.status != kernel.STATUS_OK:
            raise RuntimeError("the batching simulation stalled (a step with nothing to run)")
        return self.harvest()

    def harvest(self) -> dict:
        """Hand back every request that has finished and was not handed back (copies), freeing its slot."""
        used = self.touched
        slots = np.flatnonzero(self.occupied[:used] & ~np.isnan(self.outputs["finish_s"][:used]))
        self.ran = False
        self.occupied[slots] = False
        self.free[self.n_free:self.n_free + len(slots)] = slots[::-1]
        self.n_free += len(slots)
        out = {name: self.outputs[name][slots] for name in OUTPUTS}
        out["index"] = self.index[slots]
        out.update({name: values[slots] for name, values in self.payload.items()})
        return out

    def oldest_arrival(self) -> float:
        """The earliest arrival of a request not handed back (inf: none)."""
        held = self.inputs["arrival_s"][self.occupied]
        return float(held.min()) if held.size else np.inf

    def _run(self) -> None:
        """Let the loop run until it needs the next request, or to its end once every request is in."""
        if self.status is not None:  # (the last part ran it to its end)
            return
        self.control[kernel.C_FILLED] = self.filled
        if self._loop is None:
            table, d_edges, p_edges, slope, ref = self.model
            i, o = self.inputs, self.outputs
            # No cache and no closed loop: the cache and think-time arguments are placeholders the loop never reads.
            no_cache = np.zeros(1, np.int64)
            args = (i["arrival_s"], i["prompt"], i["context"], i["output"], i["passes"], np.zeros(1), i["given"],
                    i["queue_key"], False, np.zeros(2, np.int64), np.zeros(0, np.int64), 1, no_cache, False,
                    self.params, self.balance[0], self.balance[1], self.warmup_s, -1, table, d_edges, p_edges, slope,
                    ref, np.empty((0, 4), np.int32), o["arrival_s"], o["instance"], o["first_token_s"],
                    o["finish_s"], o["queue_s"], np.zeros((self.w, 1), np.int64), self.instance_steps, self.stats,
                    self.log["start_s"], self.log["decode_seqs"], self.log["prefill_tokens"], self.log["step_s"],
                    self.log["waiting"], self.slot_of, self.control)
            workspace = kernel.stream_workspace(i["arrival_s"], i["passes"], no_cache, False, self.params, table,
                                                d_edges, p_edges, slope, self.instance_steps, self.slot_of,
                                                self.control)
            self._loop_arrays = (args, workspace)  # every array the loop works in, held while it runs
            self._loop = kernel.simulate_stream(*args, workspace)
        code = next(self._loop)
        self.ran = True
        if code != kernel.NEED_REQUESTS:
            self.status = code
        elif self.filled == self.n:
            raise RuntimeError("the step loop asked for requests after the last one")



def _joined(parts: list, payload: dict) -> dict:
    if parts:
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}
    out = {name: np.empty(0, np.int64 if name == "instance" else float) for name in OUTPUTS}
    out["index"] = np.empty(0, np.int64)
    out.update({name: values[:0] for name, values in payload.items()})
    return out

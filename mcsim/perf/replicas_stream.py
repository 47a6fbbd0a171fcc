"""The replicas of a streamed sample: every request of the sample, warm-up included, through the pools' replicas
a chunk at a time (:class:`~mcsim.perf.fleet_stream.FleetStream`), in memory set by the requests in flight.

What differs from the whole sample's replicas (:meth:`mcsim.perf.latency.PoolSimulator.colocated` and
``disaggregated``), and why:

* Prefix-cache hits are the cache stage's (replayed in arrival order by :class:`mcsim.stages.kvcache.CacheStream`),
  not looked up as each instance first admits a request: the loop's own caches key their rows by the sample's
  blocks. A stream therefore runs only where the cache stage's hits do not depend on which replica serves a request:
  one cache pooled by every instance (``deployment.routing = "pooled"``), or no cache; the replicas are then placed
  by least outstanding requests (what ``pooled`` and ``cache-aware`` do without a cache inside the loop), or by the
  scenario's router where it reads no cache. The pooled cache's first tier holds the configured instances' share
  (the cache stage's), where the whole sample's replicas pool the run's instances'.
* The saturation test's counts over the window's second half and the queue-wait drift's quarters are read from
  time histograms of :data:`BINS` bins over the sample's span (width about 1.3 s for a day): the requests of the
  one bin a boundary falls in are counted on the side of that bin's start. Every other figure (requests, output
  tokens in the window, means, requests in system, steps, busy time) is exact, and the latency quantiles come from
  the sample's sketches (:class:`~mcsim.perf.latency_quantiles.Latencies`). Times in system and queue waits are
  summed in whole nanoseconds, so that no figure depends on the chunks the requests came in.

Disaggregated, the prefill pool's finished requests (their hand-off times known) wait in a buffer sorted by their
arrival at the decode pool, and go in once no request still to come can arrive there before them (every request
arrives at the decode pool after it arrived at the service). The decode pool's window starts at the first measured
request's arrival there, given to its stream when that request goes in. The decode (or colocated) pool runs on a
thread of its own while the next chunk is read and the prefill pool runs (the step loop releases the GIL); its runs
keep their order, so the results are those of one thread.
"""

from __future__ import annotations

import math
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from mcsim.kernels import batching_helpers as indices
from mcsim.perf.batching import SATURATION_BACKLOG, SATURATION_RATIO
from mcsim.perf.fleet_batching import DECODE_ROUTERS, _fleet_log
from mcsim.perf.fleet_stream import OUTPUTS, FleetStream
from mcsim.perf.latency import decode_steps, edges, every_passes, step_table
from mcsim.stages import steady_state as steady
from mcsim.stages.workload import profile_period_s

#: Bins of the time histograms (see the module docstring).
BINS = 1 << 16
#: Routers of a streamed run without a cache inside the loop: these read no cache; the others place by load.
PLAIN_ROUTERS = ("round-robin", "random", "least-outstanding", "least-kv")


def streams(routing: str, caching: bool) -> bool:
    """Whether the replicas of a sample with this router (and a cache or not) can run streamed."""
    return routing == "pooled" or (not caching and routing in (*PLAIN_ROUTERS, "cache-aware"))


def stream_router(routing: str) -> str:
    """The router a stream places requests by (see the module docstring)."""
    return routing if routing in PLAIN_ROUTERS else "least-outstanding"


class PoolWindow:
    """One pool's measured window from its finished requests, as they come: the figures of
    :func:`mcsim.perf.batching._summary` and :func:`~mcsim.perf.batching.queue_steady_state` that stage 5 reads.

    ``span_s`` bounds the times of the histograms (later ones fall in the last bin); ``start_s`` is the window's
    start, or None until :meth:`start` gives it (requests that finish before ``not_before_s``, which no start can
    precede, are then counted at once, the others held until it comes).
    """

    def __init__(self, k: int, span_s: float, start_s: float | None, not_before_s: float = 0.0):
        self.served = np.zeros(k, np.int64)  # measured requests per instance
        self.width = max(float(span_s), 1e-9) / BINS
        self.start_s = start_s
        self.not_before_s = float(not_before_s)
        self.arrivals = np.zeros(BINS, np.int64)
        self.queue_sums = np.zeros(BINS)
        self.finishes = np.zeros(BINS, np.int64)
        self.measured = 0
        self.e2e_ns = 0  # in whole nanoseconds: sums that do not depend on how the requests come
        self.output_in_window = 0
        self.requests = 0
        self.first_arrival = math.inf
        self.held: list = []  # (finish, output) of requests that may finish in a window not started yet

    def _bin(self, t) -> np.ndarray:
        return np.clip((np.asarray(t) / self.width).astype(np.int64), 0, BINS - 1)

    def add(self, arrival, finish, queue, output, measured, instance, window_end: float = math.inf) -> None:
        """Requests that finished (all of them at or before the window's end unless ``window_end`` says where
        it is)."""
        if len(arrival) == 0:
            return
        self.requests += len(arrival)
        self.first_arrival = min(self.first_arrival, float(np.min(arrival)))
        arrived = self._bin(arrival)
        self.arrivals += np.bincount(arrived, minlength=BINS)
        # (whole nanoseconds as floats: exact sums below 2^53 ns, about 104 days of waiting in one bin)
        self.queue_sums += np.bincount(arrived, weights=np.rint(queue * 1e9), minlength=BINS)
        self.finishes += np.bincount(self._bin(finish), minlength=BINS)
        self.measured += int(np.count_nonzero(measured))
        self.served += np.bincount(instance[measured], minlength=len(self.served))
        self.e2e_ns += int(np.sum(np.rint((finish - arrival)[measured] * 1e9).astype(np.int64)))
        before_end = finish <= window_end
        if self.start_s is None:
            late = finish >= self.not_before_s
            self.held.append((finish[late & before_end], output[late & before_end]))
        else:
            self.output_in_window += int(np.sum(output[(finish >= self.start_s) & before_end]))

    def start(self, t: float) -> None:
        self.start_s = float(t)
        for finish, output in self.held:
            self.output_in_window += int(np.sum(output[finish >= t]))
        self.held = []

    def summary(self, stats, tolerance: float, period_s: float = 0.0) -> dict:
        """The pool's figures from its stream's statistics."""
        k = len(self.served)
        start = math.nan if self.start_s is None else self.start_s
        end = float(stats[indices.STAT_WINDOW_END_S])
        window = end - start
        nan = math.nan
        if window > 0:
            mean_in_system = stats[indices.STAT_IN_SYSTEM_INTEGRAL] / window
            arrival_rate = self.measured / window
            throughput = self.output_in_window / window
            middle = self._bin(start + 0.5 * window)
            last = self._bin(end)
            late_arrivals = int(self.arrivals[middle:last + 1].sum())
            late_completions = int(self.finishes[middle:last + 1].sum())
            completion_ratio = late_arrivals / late_completions if late_completions else math.inf
        else:
            mean_in_system = arrival_rate = throughput = completion_ratio = nan
        mean_time = self.e2e_ns / 1e9 / self.measured if self.measured else nan
        waiting = int(stats[indices.STAT_WAITING_AT_WINDOW_END])
        saturated = bool(completion_ratio > SATURATION_RATIO and waiting > SATURATION_BACKLOG * max(self.measured, 1))
        decode_steps = stats[indices.STAT_WINDOW_DECODE_STEPS]
        out = {
            "measured_requests": self.measured, "window_s": (start, end), "throughput_tok_s": throughput,
            "mean_in_system": mean_in_system, "mean_time_in_system_s": mean_time,
            "little_law_ratio": mean_in_system / (arrival_rate * mean_time) if arrival_rate * mean_time > 0 else nan,
            "completion_ratio": completion_ratio, "saturated": saturated,
            "mean_decode_batch": stats[indices.STAT_WINDOW_DECODE_SEQS_SUM] / decode_steps if decode_steps else nan,
            "busy_fraction": min(stats[indices.STAT_WINDOW_STEP_S_SUM] / (k * window), 1.0) if window > 0 else nan,
            "instance_load_imbalance": float(self.served.max() / self.served.mean()) if self.measured else nan,
        }
        out["queue_steady_state"] = self._steady(out, tolerance, period_s)
        return out

    def _steady(self, summary: dict, tolerance: float, period_s: float):
        """The queue-wait drift of :func:`mcsim.perf.batching.queue_steady_state`, from the histograms (each pair's
        later window takes the bin its end falls in)."""
        start, end = summary["window_s"]
        scale = summary["mean_time_in_system_s"]
        if not (end > start and scale > 0) or summary["measured_requests"] < steady.MIN_MEASURED:
            return steady.not_checked(self.requests)
        ratios = []
        windows = steady.time_windows(self.first_arrival, start, end, period_s)
        for w, (lo, hi) in enumerate(windows):
            if math.isnan(lo):
                ratios.append(math.nan)  # too short to compare like with like
                continue
            a, b = self._bin([lo, hi])
            b += w % 2  # the later window of a pair takes its end's bin
            count = self.arrivals[a:b].sum()
            ratios.append(self.queue_sums[a:b].sum() / 1e9 / scale / count if count else math.nan)
        result = steady.verdict(np.array(ratios), self.requests, tolerance)
        if summary["saturated"]:
            return steady.SteadyState(result.drift, result.half_drift, False, math.inf)
        return result


def run(settings, replay, n_requests: int, span_s: float, start_s: float, n_decode: int, n_prefill: int,
        restore, transfer, rng, add_latencies, passes_rate: float, class_priority, slots: tuple, block_tokens: int,
        max_steps: int = 0) -> dict:
    """Every request of a streamed sample through its pools' replicas.

    Parameters
    ----------
    settings : mcsim.perf.latency.PoolSettings
    replay : callable
        ``replay()`` yields chunks of every request in arrival order: dicts of ``arrival_s`` (from the sample's
        first arrival), ``prompt``, ``output``, ``passes`` (-1 for a warm-up request), ``class_id``, ``cached``
        (n, tiers) and ``measured``.
    n_requests, span_s, start_s : int, float, float
        The requests in all, their arrivals' span and the first measured request's arrival (the window's start).
    n_decode, n_prefill : int
        Instances of the decode (or colocated) pool and of the prefill pool (0: colocated).
    restore : callable
        ``restore(cached)``: seconds of each request's restores.
    transfer : callable
        ``transfer(prompt)``: seconds of each request's KV hand-off to the decode pool.
    rng : numpy.random.Generator
        The router's uniforms, one per request in order.
    add_latencies : callable
        ``add_latencies(ttft, tpot, e2e, queue, class_id, prompt, output)`` of measured requests, as they finish.
    passes_rate : float
        Passes per output token of the measured requests (the warm-up requests' rate).
    class_priority : int64[classes]
        Each workload class's priority (the priority policy's queue order).
    slots : (int, int)
        The slots (:class:`~mcsim.perf.fleet_stream.FleetStream`) of the decode (or colocated) pool and of the
        prefill pool.
    block_tokens : int
        Tokens of a KV block.

    Returns
    -------
    dict
        What :meth:`mcsim.perf.latency.PoolSimulator._result` gives, less the per-request arrays.
    """
    s, p = settings, settings.p
    routing = p["deployment.routing"]
    tolerance = p["mc.queue_steady_state_tolerance"]
    period_s = profile_period_s(p)
    hi = span_s * 1.02 + 600.0  # the histograms' span: arrivals, and finishes a little after the last of them
    common = {"kv_ref_context": s.model.decode_context, "max_new_per_step": s.max_new,
              "balance": p["deployment.routing_balance"], "balance_requests": p["deployment.routing_balance_requests"]}
    p_edges = np.array([0.0, 1.0]) if n_prefill else edges(s.budget, 10)
    decode = FleetStream(
        n_requests, n_instances=n_decode,
        router=(routing if routing in DECODE_ROUTERS else "least-outstanding") if n_prefill else stream_router(routing),
        step_time_table=step_table(s.model, s.d_edges, p_edges), decode_edges=s.d_edges,
        prefill_edges=p_edges, kv_slope=s.kv_slope, token_budget=s.budget, max_seqs=s.max_seqs,
        kv_blocks=s.kv_blocks, block_tokens=block_tokens, chunk_tokens=s.chunk, verify_tokens=s.verify,
        preempt=bool(p["performance.preempt"]), policy=s.policy.name, warmup_s=None if n_prefill else start_s,
        max_steps=max_steps, key="deployment.instances", slots=slots[0], **common)
    decode_window = PoolWindow(n_decode, hi, None if n_prefill else start_s, not_before_s=start_s)
    prefill = prefill_window = None
    if n_prefill:
        budget, chunk, d_edges, p_edges, table = s.prefill_table()
        prefill = FleetStream(
            n_requests, n_instances=n_prefill, router=stream_router(routing), step_time_table=table,
            decode_edges=d_edges, prefill_edges=p_edges, token_budget=budget, max_seqs=max(min(n_requests, budget), 1),
            kv_blocks=1 << 40, block_tokens=block_tokens, chunk_tokens=chunk,
            policy=s.prefill_policy(), warmup_s=start_s, key="deployment.prefill_instances", slots=slots[1],
            **common)
        prefill_window = PoolWindow(n_prefill, hi, start_s)
        buffer: list = []  # decode arrivals waiting to go in: dicts of columns

    def finish_decode(done: dict, end: float = math.inf) -> None:
        m = len(done["finish_s"])
        if m == 0:
            return
        info = done  # (the request's own columns came back with it)
        decode_window.add(done["arrival_s"], done["finish_s"], done["queue_s"], info["output"], info["measured"],
                          done["instance"], end)
        kept = info["measured"]
        if not kept.any():
            return
        ttft = info["handoff"][kept] if n_prefill else \
            done["first_token_s"][kept] - done["arrival_s"][kept] + info["restore"][kept]
        e2e = done["finish_s"][kept] - done["arrival_s"][kept] + (info["handoff"][kept] if n_prefill
                                                                  else info["restore"][kept])
        out = info["output"][kept]
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
        queue = done["queue_s"][kept] + (info["prefill_queue"][kept] if n_prefill else 0.0)
        add_latencies(ttft, tpot, e2e, queue, info["class_id"][kept], info["prompt"][kept], out)

    def to_decode(columns: dict) -> None:
        """Requests arriving at the decode pool, in order: the window starts at its first measured one."""
        if decode_window.start_s is None and columns["measured"].any():
            first = int(np.argmax(columns["measured"]))
            if first:
                to_decode({k: v[:first] for k, v in columns.items()})
                columns = {k: v[first:] for k, v in columns.items()}
            t = float(columns["decode_arrival"][0])
            flush()  # (the stream's window is set between its runs)
            decode.start_window(t)
            decode_window.start(t)
        decode_add(columns, columns["decode_arrival"], np.ones(len(columns["output"]), np.int64))

    # The decode (or colocated) pool's runs go to a thread of their own (the step loop releases the GIL), one at a
    # time and in order, while this one reads the next chunk and runs the prefill pool; each run's finished requests
    # are read, in order, before the next run starts.
    worker = ThreadPoolExecutor(1, thread_name_prefix="mcsim-decode")
    in_flight: list = []

    def flush() -> None:
        while in_flight:
            finish_decode(in_flight.pop(0).result())

    def decode_add(columns: dict, arrival, prefill_tokens) -> None:
        flush()
        in_flight.append(worker.submit(decode.add, arrival, prefill_tokens, columns["context"], columns["output"],
                                       columns["passes"], router_uniform=columns["uniform"],
                                       priority=columns["priority"], payload=columns))

    def release(bound: float) -> None:
        """Put in the decode pool every buffered request that arrives there before ``bound``, in order."""
        if not buffer:
            return
        joined = {k: np.concatenate([b[k] for b in buffer]) for k in buffer[0]}
        order = np.lexsort((joined["index"], joined["decode_arrival"]))  # by (time, index)
        joined = {k: v[order] for k, v in joined.items()}
        cut = int(np.searchsorted(joined["decode_arrival"], bound, side="left"))
        buffer.clear()
        if cut < len(order):
            buffer.append({k: v[cut:] for k, v in joined.items()})
        if cut:
            to_decode({k: v[:cut] for k, v in joined.items()})

    def finish_prefill(done: dict, end: float = math.inf) -> None:
        m = len(done["finish_s"])
        if m == 0:
            return
        prefill_window.add(done["arrival_s"], done["first_token_s"], done["queue_s"], np.ones(m, np.int64),
                           done["measured"], done["instance"], end)
        handoff = done["first_token_s"] - done["arrival_s"] + done["restore"] + done["transfer"]
        info = {name: values for name, values in done.items() if name not in OUTPUTS}
        info.update(handoff=handoff, prefill_queue=done["queue_s"], decode_arrival=done["arrival_s"] + handoff)
        buffer.append(info)

    try:
        _feed(replay, n_prefill, restore, transfer, rng, passes_rate, class_priority, prefill, finish_prefill,
              decode_add, release)
        if n_prefill:
            finish_prefill(prefill.finish(), float(prefill.stats[indices.STAT_WINDOW_END_S]))
            release(math.inf)
        flush()
    finally:
        worker.shutdown(wait=True, cancel_futures=True)
    finish_decode(decode.finish(), float(decode.stats[indices.STAT_WINDOW_END_S]))

    summary = decode_window.summary(decode.stats, tolerance, period_s)
    saturated = summary["saturated"]
    steady_state = summary["queue_steady_state"]
    imbalance = summary["instance_load_imbalance"]
    out = {"little_law_ratio": float(summary["little_law_ratio"]),
           "mean_decode_batch": float(summary["mean_decode_batch"]), "busy_fraction": float(summary["busy_fraction"]),
           "throughput_tok_s": float(summary["throughput_tok_s"]) / n_decode,
           "step_log": _fleet_log(decode.log, decode.instance_steps, max_steps)}
    if n_prefill:
        pre = prefill_window.summary(prefill.stats, tolerance, period_s)
        saturated = saturated or pre["saturated"]
        steady_state = min((pre["queue_steady_state"], steady_state), key=lambda x: (x.steady, -x.requests_needed))
        out["prefill_busy_fraction"] = float(pre["busy_fraction"])
        imbalance = max(imbalance, pre["instance_load_imbalance"])
    out.update(saturated=int(bool(saturated)), steady_state=steady_state, instance_load_imbalance=imbalance)
    return out


def _feed(replay, n_prefill, restore, transfer, rng, passes_rate, class_priority, prefill, finish_prefill,
          decode_add, release) -> None:
    """Every chunk of ``replay()`` into the prefill pool (then, in order of arrival there, the decode pool) or into
    the colocated pool: :func:`run`'s loop."""
    for chunk in replay():
        m = len(chunk["arrival_s"])
        cached = chunk["cached"]
        prompt = chunk["prompt"].astype(np.int64)
        columns = {"output": chunk["output"].astype(np.int64), "class_id": chunk["class_id"],
                   "measured": chunk["measured"], "prompt": prompt, "context": prompt,
                   "passes": decode_steps(chunk["output"], every_passes(chunk["output"], chunk["passes"],
                                                                        passes_rate)),
                   "restore": restore(cached), "uniform": rng.uniform(size=m),
                   "priority": np.asarray(class_priority)[chunk["class_id"]]}
        miss = np.maximum(prompt - cached.sum(axis=1), 1)
        if not n_prefill:
            decode_add(columns, chunk["arrival_s"], miss)
            continue
        columns["transfer"] = transfer(prompt)
        finish_prefill(prefill.add(chunk["arrival_s"], miss, prompt, np.ones(m, np.int64), np.zeros(m, np.int64),
                                   router_uniform=columns["uniform"], priority=columns["priority"], payload=columns))
        finish_prefill(prefill.harvest())  # every hand-off known so far, to keep the decode pool fed
        # Every request still to come arrives at the service, so at the decode pool, no earlier than the oldest one
        # not yet handed off, or than the last arrival so far.
        release(min(prefill.oldest_arrival(), float(chunk["arrival_s"][-1])))

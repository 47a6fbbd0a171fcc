"""Latency under load: the sample's requests through the continuous-batching simulator, pool by pool.

One instance of each pool is simulated with its share of the traffic: arrival times are stretched by the pool's
whole number of instances (each instance sees 1/N of the arrival rate, as random routing gives it), and
latencies come out in real seconds. Step times are a table of the sample's :class:`~mcsim.perf.factor.StepModel` over
(decode sequences, prefill tokens) at the sample's mean decode context, plus a per-KV-token slope, so that each
simulated step attends over its batch's own KV lengths: a mixed step costs what the model says that mixed step
costs, and the simulator and the throughput/cost path price the same steps.

Colocated: one simulation, prefill chunks and decode passes share the steps. Disaggregated: the prefill pool is
simulated first (prefill-only steps; a request's first token ends its prefill), its KV crosses the network, then
the decode pool is simulated with those arrival times.

With ``deployment.fleet_simulation = "replicas"`` a pool's N instances are simulated together behind
``deployment.routing`` (:mod:`mcsim.perf.fleet_batching`) over the sample's whole request stream, the cache's
warm-up requests included and not tiled: each instance's prefix cache (or the pooled one) is looked up and filled
as it admits requests, so the cache hits, restores and prefill work of those latencies are the run's own.
Disaggregated, the prefill pool's replicas hold the caches and hand each request, after its restores and KV
transfer, to the decode pool's replicas (placed by :data:`~mcsim.perf.fleet_batching.DECODE_ROUTERS`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from mcsim.scenario import policies
from mcsim.perf.fleet_batching import DECODE_ROUTERS, simulate_batching, simulate_fleet_batching
from mcsim.stages.workload import profile_period_s

#: The simulated requests are at least this many times one instance's largest concurrency ...
MIN_TURNOVER = 30
#: ... but no more than this many (the simulator runs at about a million requests a second) ...
MAX_REQUESTS = 600_000
#: ... nor more KV blocks in all than this (the simulator's work grows with the blocks its sequences fill), so a
#: small ``cache.block_tokens`` shortens the replay instead of running for minutes.
MAX_BLOCKS = 40_000_000


def edges(top: float, n: int) -> np.ndarray:
    """0, then ``n`` geometrically spaced whole numbers up to ``top``: the grid of a step-time table."""
    top = max(float(top), 1.0)
    return np.unique(np.concatenate([[0.0], np.rint(np.geomspace(1.0, top, n)), [top]]))


def step_table(model, d_edges, p_edges, *, pool: str = "decode") -> np.ndarray:
    """Step times of one instance of ``pool`` on a grid of (decode sequences, prefill tokens), s, at the
    sample's mean decode context.

    Every entry is :meth:`StepModel.seconds` of that very step (mixed steps included); the empty step, which the
    simulator never runs, gets the smallest step so that the table stays positive.
    """
    table = np.array([[model.seconds(d, q, pool=pool) for q in p_edges] for d in d_edges], dtype=float)
    table[0, 0] = table[table > 0].min() if (table > 0).any() else 1e-6
    return table


def kv_slopes(model, d_edges, *, pool: str = "decode") -> np.ndarray:
    """Per decode edge, the seconds one more KV token of a decoding sequence adds to a step: with it the
    simulator prices each step's attention over the batch's own KV lengths, not the mean context."""
    return np.array([model.kv_slope(d, pool=pool) for d in d_edges], dtype=float)


@dataclass
class Workload:
    """The measured requests of a sample, prepared once for every simulation of its pools."""

    arrival: np.ndarray
    miss: np.ndarray
    context: np.ndarray
    output: np.ndarray
    decode_passes: np.ndarray
    restore_s: np.ndarray
    transfer_s: np.ndarray
    think: np.ndarray | None
    users: int
    block: int
    class_id: np.ndarray
    priority: np.ndarray
    router_uniform: np.ndarray | None = None  #: the router's uniforms (replicas mode only)
    #: Replicas mode: the whole stream's prompt blocks (CSR), the first measured request, one instance's cache
    #: capacity per tier (blocks) and the restore seconds per reused token of each tier.
    block_ptr: np.ndarray | None = None
    block_ids: np.ndarray | None = None
    measured_from: int = 0
    capacity_blocks: tuple = (0, 0, 0)
    restore_s_per_token: tuple = (0.0, 0.0, 0.0)
    restore_latency_s: tuple = ()  # per tier: what a request restoring from it waits once (none: 0)
    pooled_tiers: int = 0  # how many of the last tiers are one pool behind every instance's own


def prepare(p: dict, requests, miss, restore_s, transfer_s, passes, max_seqs_per_instance: float,
            rng: np.random.Generator) -> Workload:
    """Tile the measured requests into a long enough run and draw the closed loop's think times.

    A queue reaches its steady state only after many times its concurrency has passed through: when the sample's
    requests are too few for one instance's largest concurrency, the trace is replayed back to back (same
    requests, later arrivals) and the first third of the time is left out as warm-up. The replay is capped at
    :data:`MAX_REQUESTS` requests and :data:`MAX_BLOCKS` KV blocks, whichever comes first.
    """
    limit = p["performance.batching_requests"]
    n = requests.n if limit <= 0 else min(limit, requests.n)
    blocks = float(np.sum(np.ceil((requests.prompt_tokens[:n] + requests.output_tokens[:n])
                              / max(int(requests.block_tokens), 1))))
    reps = int(min(max(1, math.ceil(MIN_TURNOVER * max(max_seqs_per_instance, 1.0) / n)),
                   max(1, MAX_REQUESTS // n), max(1, int(MAX_BLOCKS // max(blocks, 1.0)))))
    arrival0 = (requests.arrival_s[:n] - requests.arrival_s[0]).astype(float)
    period = float(arrival0[-1]) * n / max(n - 1, 1) if n > 1 else 1.0
    arrival = np.concatenate([arrival0 + c * period for c in range(reps)])

    def tile(values):
        return np.tile(np.asarray(values)[:n], reps)

    out = tile(requests.output_tokens).astype(np.int64)
    passes = tile(passes)
    decode_passes = decode_steps(out, passes)
    users = int(p["performance.closed_loop_users"])
    think = rng.exponential(max(p["workload.think_time_s"], 0.0), len(arrival)) if users else None
    class_id = tile(requests.class_id).astype(np.int64)
    class_priority = np.array([p.get(f"workload.classes.{c}.priority", 0) for c in requests.class_names], np.int64)
    return Workload(arrival, np.maximum(tile(miss), 1).astype(np.int64), tile(requests.prompt_tokens).astype(np.int64),
                    out, decode_passes, tile(restore_s), tile(transfer_s), think, users, requests.block_tokens,
                    class_id, class_priority[class_id])


def prepare_stream(p: dict, stream, measured_from: int, passes, capacity_blocks, restore_s_per_token,
                   transfer_s_per_token: float, transfer_latency_s: float, rng: np.random.Generator,
                   restore_latency_s=(), pooled_tiers: int = 0) -> Workload:
    """The replicas' workload: every request of the sample in arrival order, the cache's warm-up ones included.

    ``passes`` are the measured requests' (``stream.tail(measured_from)``); a warm-up request, which is served
    but not measured, makes the passes of its output tokens at the measured requests' mean rate. A request's KV
    transfer to the decode pool takes ``transfer_latency_s`` plus ``transfer_s_per_token`` per prompt token (0
    and 0 when colocated). A request that restores from a tier also waits that tier's ``restore_latency_s`` once.
    The router's uniforms are drawn from ``rng`` for every request, then, in a closed
    loop (``performance.closed_loop_users``), the think times.
    """
    out = stream.output_tokens.astype(np.int64)
    rate = float(np.sum(passes)) / max(float(np.sum(out[measured_from:])), 1.0)
    decode_passes = decode_steps(out, every_passes(out, np.concatenate([np.full(measured_from, -1), passes]), rate))
    class_id = stream.class_id.astype(np.int64)
    class_priority = np.array([p.get(f"workload.classes.{c}.priority", 0) for c in stream.class_names], np.int64)
    n = stream.n
    prompt = stream.prompt_tokens.astype(np.int64)
    arrival = (stream.arrival_s - stream.arrival_s[0]).astype(float)
    transfer = prompt * float(transfer_s_per_token) + float(transfer_latency_s)
    uniform = rng.uniform(size=n)
    users = int(p["performance.closed_loop_users"])
    think = rng.exponential(max(p["workload.think_time_s"], 0.0), n) if users else None  # drawn after, if used
    return Workload(arrival, prompt, prompt, out, decode_passes, np.zeros(n), transfer, think, users,
                    stream.block_tokens, class_id, class_priority[class_id], uniform,
                    block_ptr=stream.block_ptr, block_ids=stream.block_ids, measured_from=int(measured_from),
                    capacity_blocks=tuple(int(c) for c in capacity_blocks),
                    restore_s_per_token=tuple(float(s) for s in restore_s_per_token),
                    restore_latency_s=tuple(float(s) for s in restore_latency_s), pooled_tiers=int(pooled_tiers))


def decode_steps(output, passes) -> np.ndarray:
    """Decode steps after the first token (the prefill produces it): each request's passes, less the first one's
    share; at least one for an output of more than one token, none for one token."""
    steps = np.maximum(np.rint((output - 1) * passes / np.maximum(output, 1)), 0).astype(np.int64)
    return np.where(output > 1, np.maximum(steps, 1), 0)


def every_passes(output, passes, rate: float) -> np.ndarray:
    """Every request's passes: a warm-up request's (``passes < 0``: not drawn) at the measured requests' mean
    ``rate`` per output token; at least one for a request with output."""
    every = np.where(np.asarray(passes) < 0, np.rint(output * rate), passes).astype(float)
    return np.where(output > 0, np.maximum(every, 1), 0)


def restore_seconds(cached_tokens, s_per_token, latency_s=()) -> np.ndarray:
    """Per request, the time its restores take: its reused tokens per tier at each tier's ``s_per_token``, plus
    each tier's ``latency_s`` once when it restored from that tier."""
    restore = cached_tokens @ np.asarray(s_per_token, dtype=float)
    if any(latency_s):
        restore = restore + (cached_tokens > 0) @ np.asarray(latency_s, dtype=float)
    return restore


def _restore_s(w: Workload, cached_tokens) -> np.ndarray:
    return restore_seconds(cached_tokens, w.restore_s_per_token, w.restore_latency_s)


def _run(p, w: Workload, arrive, prefill_tokens, outputs, decode, table, d_edges, p_edges, seqs, blocks, budget,
         chunk, n_instances: int, policy: str, max_steps: int, kv_slope=None, kv_ref_context: float = 0.0,
         max_new_per_step: int = 0, verify_tokens: int = 1):
    scaled = arrive * n_instances
    order = np.argsort(scaled, kind="stable")
    run = dict(
        step_time_table=table, decode_edges=d_edges, prefill_edges=p_edges, kv_slope=kv_slope,
        kv_ref_context=kv_ref_context, token_budget=budget, verify_tokens=verify_tokens,
        max_seqs=seqs, kv_blocks=blocks, block_tokens=w.block, chunk_tokens=chunk, policy=policy,
        priority=w.priority[order], max_new_per_step=max_new_per_step,
        preempt=bool(p["performance.preempt"]),
        closed_users=w.users,
        think_s=None if w.think is None else w.think[order] * n_instances,
        steady_tolerance=p["mc.queue_steady_state_tolerance"],
        steady_period_s=profile_period_s(p) * n_instances)  # one instance's share of the arrivals: times scaled
    requests = (scaled[order], prefill_tokens[order], w.context[order], outputs[order], decode[order])
    warmup = float(np.quantile(scaled, 1 / 3))
    if w.users:
        # A closed loop's arrivals follow its finishes, not the trace's clock (they may all be over before a third
        # of its span): the warm-up is the first third of the arrivals that happen.
        warmup = float(np.quantile(simulate_batching(*requests, **run)["per_request"]["arrival_s"], 1 / 3))
    res = simulate_batching(*requests, **run, warmup_s=warmup, max_steps=max_steps)
    back = np.empty_like(order)
    back[order] = np.arange(len(order))
    per = {k: (v[back] if isinstance(v, np.ndarray) and v.shape == order.shape else v)
           for k, v in res["per_request"].items()}
    return per, {**res["summary"], "step_log": res["step_log"]}


class PoolSettings:
    """What every simulation of a sample's pools shares: its instances' limits, token budget and chunk, verify
    tokens, policy and step-table grid, from the sample's parameters ``p`` and step ``model``; ``kv_blocks`` is one
    decode (or colocated) instance's pool, at least ``longest_blocks + 1``."""

    def __init__(self, p: dict, model, max_seqs: int, kv_blocks: int, longest_blocks: int):
        self.p, self.model = p, model
        self.max_seqs = max(int(max_seqs), 1)
        self.kv_blocks = max(int(kv_blocks), int(longest_blocks) + 1)
        self.policy = policies.policy_for(p["deployment.batching"], p["deployment.scheduler"])
        self.max_new = int(p["deployment.max_new_per_step"])
        decode_layout = model.decode_gpus // max(p["deployment.tp"] * p["deployment.pp"], 1)
        self.budget = int(p["performance.token_budget"]) * max(decode_layout, 1)
        self.chunk = int(p["performance.chunk_tokens"]) * max(decode_layout, 1)
        # a verifying sequence runs k + 1 tokens a pass: that many of a step's token budget
        self.verify = int(model.verify_tokens)
        self.d_edges = edges(self.max_seqs, 16)
        self.kv_slope = kv_slopes(model, self.d_edges)
        # What the replicas need is checked by mcsim.perf.fleet.performance, before this is built.
        self.replicas = p.get("deployment.fleet_simulation", "representative") == "replicas"

    def prefill_table(self):
        """The prefill pool's token budget, chunk, step-table edges and table."""
        budget = int(self.model.prefill_budget)
        p_edges = edges(budget, 10)
        d_edges = np.array([0.0, 1.0])
        groups = max(round(self.model.prefill_budget / self.p["performance.token_budget"]), 1)
        chunk = int(self.p["performance.chunk_tokens"]) * groups
        return budget, chunk, d_edges, p_edges, step_table(self.model, d_edges, p_edges, pool="prefill")

    def prefill_policy(self) -> str:
        """The prefill pool's policy: the scenario's continuous one (its queue order decides TTFT there); fcfs
        under static batching, whose batches are a decode-pool matter."""
        return self.policy.name if self.policy.admission == "continuous" else "fcfs"


class PoolSimulator(PoolSettings):
    """Simulates a sample's pools for any whole number of instances (what the fleet modes call).

    Parameters
    ----------
    p : dict
        Resolved parameters of the sample.
    model : mcsim.perf.factor.StepModel
    workload : Workload
    max_seqs : int
        Admission cap of one decode (or colocated) instance, sequences.
    kv_blocks : int
        KV pool of one decode (or colocated) instance, blocks.
    """

    def __init__(self, p: dict, model, workload: Workload, max_seqs: int, kv_blocks: int):
        self.w = workload
        longest = int(np.max(np.ceil((workload.context + workload.output) / workload.block)))
        PoolSettings.__init__(self, p, model, max_seqs, kv_blocks, longest)
        self._runs: dict = {}  # simulations already run, by pool and instances

    def colocated(self, n_instances: int, max_steps: int = 0) -> dict:
        """Latencies when prefill chunks and decode passes share the steps of ``n_instances`` instances."""
        key = ("colocated", n_instances, max_steps)
        if key not in self._runs:
            self._runs[key] = self._colocated(n_instances, max_steps)
        return self._runs[key]

    def _colocated(self, n_instances: int, max_steps: int) -> dict:
        w = self.w
        p_edges = edges(self.budget, 10)
        table = step_table(self.model, self.d_edges, p_edges)
        if self.replicas:
            return self._replicas(n_instances, table, p_edges, max_steps)
        per, summary = _run(self.p, w, w.arrival, w.miss, w.output, w.decode_passes, table, self.d_edges, p_edges,
                            self.max_seqs, self.kv_blocks, self.budget, self.chunk, n_instances, self.policy.name,
                            max_steps, self.kv_slope, self.model.decode_context, self.max_new, self.verify)
        ttft = per["ttft_s"] + w.restore_s
        e2e = per["e2e_s"] + w.restore_s
        return self._result(ttft, e2e, per["queue_s"], per["measured"], summary, summary["saturated"])

    def _replicas(self, n_instances: int, table, p_edges, max_steps: int = 0) -> dict:
        """All ``n_instances`` instances behind the router, each with its own prefix cache: latencies, batch,
        busy time, saturation and steady state of that one run, and every request's reused tokens per tier."""
        w, p = self.w, self.p
        fleet = simulate_fleet_batching(
            w.arrival, w.context, w.context, w.output, w.decode_passes, n_instances=n_instances,
            router=p["deployment.routing"], router_uniform=w.router_uniform, block_ptr=w.block_ptr,
            block_ids=w.block_ids, capacity_blocks=w.capacity_blocks, pooled_tiers=w.pooled_tiers,
            balance=p["deployment.routing_balance"],
            balance_requests=p["deployment.routing_balance_requests"], step_time_table=table,
            decode_edges=self.d_edges, prefill_edges=p_edges, kv_slope=self.kv_slope,
            kv_ref_context=self.model.decode_context, token_budget=self.budget, max_seqs=self.max_seqs,
            kv_blocks=self.kv_blocks, block_tokens=w.block, chunk_tokens=self.chunk, verify_tokens=self.verify,
            preempt=bool(p["performance.preempt"]), max_new_per_step=self.max_new, policy=self.policy.name,
            priority=w.priority, closed_users=w.users, think_s=w.think, measured_from=w.measured_from,
            steady_tolerance=p["mc.queue_steady_state_tolerance"],
            steady_period_s=profile_period_s(p), max_steps=max_steps)
        fp, summary = fleet["per_request"], dict(fleet["summary"], step_log=fleet["step_log"])
        restore = _restore_s(w, fp["cached_tokens"])
        out = self._result(fp["ttft_s"] + restore, fp["e2e_s"] + restore, fp["queue_s"], fp["measured"], summary,
                           summary["saturated"])
        out["throughput_tok_s"] = float(summary["throughput_tok_s"]) / n_instances  # per instance, as elsewhere
        out["instance_load_imbalance"] = summary["instance_load_imbalance"]
        out["cached_tokens"] = fp["cached_tokens"]
        return out

    def prefill(self, n_instances: int) -> dict:
        """The prefill pool alone (disaggregated): per-request hand-off time to the decode pool."""
        key = ("prefill", n_instances)
        if key not in self._runs and self.replicas:
            self._runs[key] = self._prefill_replicas(n_instances)
        if key not in self._runs:
            w = self.w
            budget, chunk, d_edges, p_edges, table = self.prefill_table()
            m = len(w.arrival)
            pre, summary = _run(self.p, w, w.arrival, w.miss, np.ones(m, np.int64), np.zeros(m, np.int64), table,
                                d_edges, p_edges, 1 << 20, 1 << 40, budget, chunk, n_instances, self.prefill_policy(),
                                0, max_new_per_step=self.max_new)
            self._runs[key] = {
                "handoff": pre["ttft_s"] + w.restore_s + w.transfer_s, "queue": pre["queue_s"],
                "measured": pre["measured"], "saturated": bool(summary["saturated"]),
                "busy_fraction": summary["busy_fraction"], "steady_state": summary["queue_steady_state"]}
        return self._runs[key]

    def _prefill_replicas(self, n_instances: int) -> dict:
        """The prefill pool's replicas behind the router, holding the prefix caches: prefill-only steps, a
        request handed off when its prefill, restores and KV transfer are done."""
        w, p = self.w, self.p
        budget, chunk, d_edges, p_edges, table = self.prefill_table()
        m = len(w.arrival)
        fleet = simulate_fleet_batching(
            w.arrival, w.context, w.context, np.ones(m, np.int64), np.zeros(m, np.int64), n_instances=n_instances,
            router=p["deployment.routing"], router_uniform=w.router_uniform, block_ptr=w.block_ptr,
            block_ids=w.block_ids, capacity_blocks=w.capacity_blocks, pooled_tiers=w.pooled_tiers,
            balance=p["deployment.routing_balance"],
            balance_requests=p["deployment.routing_balance_requests"], step_time_table=table, decode_edges=d_edges,
            prefill_edges=p_edges, token_budget=budget, max_seqs=max(min(m, budget), 1), block_tokens=w.block,
            chunk_tokens=chunk, max_new_per_step=self.max_new, policy=self.prefill_policy(), priority=w.priority,
            measured_from=w.measured_from, steady_tolerance=p["mc.queue_steady_state_tolerance"],
            steady_period_s=profile_period_s(p), instances_key="deployment.prefill_instances")
        fp, summary = fleet["per_request"], fleet["summary"]
        restore = _restore_s(w, fp["cached_tokens"])
        return {"handoff": fp["ttft_s"] + restore + w.transfer_s, "queue": fp["queue_s"], "measured": fp["measured"],
                "saturated": bool(summary["saturated"]), "busy_fraction": summary["busy_fraction"],
                "steady_state": summary["queue_steady_state"], "cached_tokens": fp["cached_tokens"],
                "instance_load_imbalance": summary["instance_load_imbalance"]}

    def _decode_replicas(self, n_instances: int, prefill: dict, max_steps: int = 0) -> dict:
        """The decode pool's replicas fed, in real time, by the prefill replicas' hand-offs."""
        w, p = self.w, self.p
        p_edges = np.array([0.0, 1.0])
        table = step_table(self.model, self.d_edges, p_edges)
        m = len(w.arrival)
        handoff = prefill["handoff"]
        arrive = w.arrival + handoff
        order = np.argsort(arrive, kind="stable")
        routing = p["deployment.routing"]
        fleet = simulate_fleet_batching(
            arrive[order], np.ones(m, np.int64), w.context[order], w.output[order], w.decode_passes[order],
            n_instances=n_instances, router=routing if routing in DECODE_ROUTERS else "least-outstanding",
            router_uniform=w.router_uniform[order], step_time_table=table, decode_edges=self.d_edges,
            prefill_edges=p_edges, kv_slope=self.kv_slope, kv_ref_context=self.model.decode_context,
            token_budget=self.budget, max_seqs=self.max_seqs, kv_blocks=self.kv_blocks, block_tokens=w.block,
            chunk_tokens=self.chunk, verify_tokens=self.verify, preempt=bool(p["performance.preempt"]),
            max_new_per_step=self.max_new, policy=self.policy.name, priority=w.priority[order],
            measured=prefill["measured"][order],
            steady_tolerance=p["mc.queue_steady_state_tolerance"],
            steady_period_s=profile_period_s(p), max_steps=max_steps)
        back = np.empty_like(order)
        back[order] = np.arange(m)
        fp, summary = fleet["per_request"], dict(fleet["summary"], step_log=fleet["step_log"])
        measured = prefill["measured"]
        out = self._result(handoff, handoff + fp["e2e_s"][back], prefill["queue"] + fp["queue_s"][back], measured,
                           summary, prefill["saturated"] or summary["saturated"])
        out["throughput_tok_s"] = float(summary["throughput_tok_s"]) / n_instances  # per instance, as elsewhere
        out["prefill_busy_fraction"] = prefill["busy_fraction"]
        out["steady_state"] = min((prefill["steady_state"], out["steady_state"]),
                                  key=lambda s: (s.steady, -s.requests_needed))
        # The pool whose instances are further apart.
        out["instance_load_imbalance"] = max(prefill["instance_load_imbalance"], summary["instance_load_imbalance"])
        out["cached_tokens"] = prefill["cached_tokens"]
        return out

    def decode(self, n_instances: int, prefill: dict, max_steps: int = 0) -> dict:
        """The decode pool of ``n_instances`` instances fed by the prefill pool's hand-offs."""
        if self.replicas:
            return self._decode_replicas(n_instances, prefill, max_steps)
        w = self.w
        p_edges = np.array([0.0, 1.0])
        table = step_table(self.model, self.d_edges, p_edges)
        m = len(w.arrival)
        handoff = prefill["handoff"]
        dec, summary = _run(self.p, w, w.arrival + handoff / max(n_instances, 1), np.ones(m, np.int64), w.output,
                            w.decode_passes, table, self.d_edges, p_edges, self.max_seqs, self.kv_blocks,
                            self.budget, self.chunk, n_instances, self.policy.name, max_steps, self.kv_slope,
                            self.model.decode_context, self.max_new, self.verify)
        measured = prefill["measured"] & dec["measured"]
        out = self._result(handoff, handoff + dec["e2e_s"], prefill["queue"] + dec["queue_s"], measured, summary,
                           prefill["saturated"] or summary["saturated"])
        out["prefill_busy_fraction"] = prefill["busy_fraction"]
        # The verdict of the pool further from steady state.
        out["steady_state"] = min((prefill["steady_state"], out["steady_state"]),
                                  key=lambda s: (s.steady, -s.requests_needed))
        return out

    def disaggregated(self, n_decode: int, n_prefill: int, max_steps: int = 0) -> dict:
        """Both pools: ``n_prefill`` prefill instances hand their requests to ``n_decode`` decode instances."""
        key = ("disaggregated", n_decode, n_prefill, max_steps)
        if key not in self._runs:
            self._runs[key] = self.decode(n_decode, self.prefill(n_prefill), max_steps)
        return self._runs[key]

    def _result(self, ttft, e2e, queue, measured, summary, saturated) -> dict:
        out = self.w.output
        tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
        return {"ttft": ttft[measured], "tpot": tpot[measured], "e2e": e2e[measured], "queue": queue[measured],
                "class_id": self.w.class_id[measured], "prompt": self.w.context[measured],
                "output": out[measured], "saturated": int(bool(saturated)),
                "little_law_ratio": float(summary["little_law_ratio"]),
                "mean_decode_batch": float(summary["mean_decode_batch"]),
                "busy_fraction": float(summary["busy_fraction"]),
                "throughput_tok_s": float(summary["throughput_tok_s"]), "step_log": summary["step_log"],
                "steady_state": summary["queue_steady_state"]}

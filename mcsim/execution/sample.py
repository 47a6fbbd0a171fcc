"""One Monte Carlo sample, stage by stage: scenario draws -> requests -> kernels -> performance -> economics.

:func:`run_sample` is the unit of work that :mod:`mcsim.execution.api` fans out over Dask. Every random stream is
derived from (seed, sample index, stage), so a sample's result does not depend on which task or worker runs it,
and variants of one sample (``baseline`` / ``factory``) see identical requests, acceptance draws, expert
tendencies and arrivals (common random numbers).
"""

from __future__ import annotations

import math
import tempfile
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import numpy as np

from mcsim.execution import progress
from mcsim.perf import factor as perf
from mcsim.perf import fleet
from mcsim.perf import fleet_memory
from mcsim.perf import replicas_stream
from mcsim.perf.hardware import performance_defaults
from mcsim.perf.roofline_model import RooflineStepModel, factor_bases
from mcsim.results.variables import WORKLOAD_CLASS
from mcsim.scenario.choices import instance_gpus
from mcsim.scenario.policies import policy_for
from mcsim.scenario.schema import CHUNK_REQUESTS, STREAM_ABOVE, WINDOW_REQUESTS
from mcsim.scenario import (
    STREAM_BATCHING,
    STREAM_EXPERTS,
    STREAM_ROUTING,
    STREAM_SPECULATIVE,
    STREAM_WORKLOAD,
    Scenario,
    ScenarioError,
    check_variant_key,
    resolve,
    rng_for,
)
from mcsim.stages import economics, kvcache, workload
from mcsim.stages import requests_trace as traces
from mcsim.stages.experts import Inputs as ExpertInputs
from mcsim.stages.experts import expert_efficiency
from mcsim.stages.speculative import Inputs as SpeculativeInputs
from mcsim.stages.speculative import speculative_passes


@lru_cache(maxsize=8)
def _read_trace(path: str, fmt: str):
    return traces.read_trace(path, None if fmt == "auto" else fmt)


def sample_requests(scn: Scenario, p: dict, sample: int, seed: int, n_requests: int) -> workload.Requests:
    """The requests of one sample: replayed from the scenario's trace or generated."""
    rng = rng_for(seed, sample, STREAM_WORKLOAD)
    if p["workload.trace"]:
        path = workload.resolve_trace_path(p["workload.trace"], scn.base_dir)
        if not path.exists():
            raise ScenarioError(scn.source, "workload.trace", f"no such trace file: {path}")
        trace = _read_trace(str(path), p["workload.trace_format"])
        return workload.from_trace(trace, p, scn.classes, n_requests, rng)
    max_context = p["workload.max_context"] or p["model.max_context"]
    return workload.generate(p, scn.classes, n_requests, rng, int(max_context))


def cache_stage(inputs: kvcache.Inputs, requests, rng) -> np.ndarray:
    """Cached prompt tokens per request and tier (zeros when the cache lever is off)."""
    if inputs.capacity_blocks[0] == 0:
        return np.zeros((requests.n, len(inputs.capacity_blocks)), dtype=np.int64)
    result = kvcache.cache_hits(requests, inputs.routing, inputs.caches, np.array(inputs.capacity_blocks), rng,
                                balance=inputs.routing_balance, private_tiers=inputs.private_tiers)
    return result.cached_tokens


def speculative_stage(inputs: SpeculativeInputs, requests, rng):
    """Verification passes per request, or None when speculative decoding is off."""
    if inputs.draft_tokens == 0:
        return None

    passes, _ = speculative_passes(requests.output_tokens, requests.acceptance, inputs.draft_tokens,
                                   inputs.acceptance_decay, rng)
    return passes


def expert_stage(inputs: ExpertInputs | None, rng) -> dict:
    """Expert efficiency and distinct experts per step (1 and 0 for dense models)."""
    if inputs is None:
        return {"expert_efficiency": 1.0, "distinct_experts_per_step": 0.0}

    result = expert_efficiency(inputs.experts, inputs.top_k, np.array(inputs.class_shares),
                               np.array(inputs.class_skews), inputs.tokens_per_step, inputs.ep_ranks,
                               inputs.redundant_experts, inputs.window_steps, inputs.eval_steps, rng,
                               num_groups=inputs.groups, num_nodes=inputs.nodes)
    # Throughput follows the time-weighted ratio: each step lasts as long as its busiest GPU.
    return {"expert_efficiency": float(result["expert_efficiency_ratio_of_sums"]),
            "distinct_experts_per_step": float(result["distinct_experts_per_step"]),
            "distinct_experts_tokens": float(inputs.tokens_per_step)}


#: Bytes of one slot of a streamed replicas run, counted from the arrays that hold one value per slot: the step
#: loop's own per-request state under the policy that keeps the most (preemption and a keyed queue: 179 B), the
#: stream's inputs, outputs and bookkeeping (129 B) and the columns the replicas carry with each request (13 x 8 B).
SLOT_BYTES = 412


def chunk_requests(p: dict) -> int:
    """Requests per chunk of a streamed sample (``mc.chunk_requests``, 0 = :data:`CHUNK_REQUESTS`)."""
    return int(p.get("mc.chunk_requests", 0) or CHUNK_REQUESTS)


def stream_above(p: dict) -> int:
    """The request count above which a sample streams: ``mc.chunk_requests``, 0 = :data:`STREAM_ABOVE`."""
    return int(p.get("mc.chunk_requests", 0) or STREAM_ABOVE)


def window_requests(p: dict) -> int:
    """The most measured requests a streamed sample's batching simulator replays (``performance.batching_requests``,
    0 = :data:`WINDOW_REQUESTS`)."""
    limit = int(p["performance.batching_requests"])
    return WINDOW_REQUESTS if limit <= 0 else limit


def streamed(scn: Scenario, p: dict, n_requests: int) -> bool:
    """Whether a variant's sample runs streamed: more requests than :func:`stream_above`, through stages that stream.

    A streamed sample never holds an array per request of the whole sample: the generator, the cache replay and the
    speculative draws go chunk by chunk, and latency quantiles come from sketches. Without the batching simulator
    the chunks run twice: once for the totals that size the fleet, once for each request's service times. With the
    representative simulator (fleet modes fixed and slo, ``performance.simulate_batching``) they run once, and the
    simulator replays the first measured requests, :func:`window_requests` of them at most, whatever the chunks.
    The replicas (``deployment.fleet_simulation = "replicas"``) run every request, chunk by chunk, once the fleet
    is known (:mod:`mcsim.perf.replicas_stream`, which says what differs from a whole sample's):
    in the utilization and fixed fleet modes, in an open loop, with one pooled cache or none. The stages that need
    every request at once keep the whole sample in memory instead: a replayed trace, the replicas otherwise, static
    batching's slot model and pooled tiers behind the instances' own.
    """
    if n_requests <= stream_above(p) or p["workload.trace"]:
        return False
    f = fleet.Inputs.from_params(p)
    if policy_for(f.batching, f.scheduler).analytic == "static-slots":
        return False
    cache_in = kvcache.Inputs.from_params(p, int(p["cache.block_tokens"]), perf.kv_bytes(p))
    if f.fleet_simulation == "replicas" and not (
            f.fleet in ("utilization", "fixed") and int(p["performance.closed_loop_users"]) == 0
            and replicas_stream.streams(p["deployment.routing"], cache_in.capacity_blocks[0] > 0)):
        return False
    return kvcache.CacheStream.streams(cache_in)


def streamed_bytes(scn: Scenario, p: dict, n_requests: int, bytes_per_request: int) -> int | None:
    """Peak memory of one streamed sample (None when it does not stream): a chunk's requests and the simulator's
    window (:func:`window_requests`) at ``bytes_per_request`` each, and the most its caches' state can take
    (:meth:`mcsim.stages.kvcache.CacheStream.most_bytes`)."""
    if not streamed(scn, p, n_requests):
        return None
    cache_in = kvcache.Inputs.from_params(p, int(p["cache.block_tokens"]), perf.kv_bytes(p))
    longest = int(p["workload.max_context"] or p["model.max_context"]) // int(p["cache.block_tokens"]) + 1
    # The replicas' slots: three chunks' worth in each of two pools (more in the decode pool where its running
    # sequences outnumber a chunk: they grow with the fleet, which is sized later, not with the requests).
    slots = 2 * 3 * chunk_requests(p) * SLOT_BYTES if fleet.Inputs.from_params(p).fleet_simulation == "replicas" else 0
    held = chunk_requests(p) + min(window_requests(p), n_requests)
    return held * bytes_per_request + kvcache.CacheStream.most_bytes(cache_in, longest) + slots


class StreamedSample:
    """Stages 1-4 of one variant of a streamed sample (:func:`streamed`), chunk by chunk.

    The first pass (at construction) runs the generator, the cache replay and the speculative draws over every
    request, into sums (:attr:`totals`: what the step model and stage 5 are sized on), the steady-state windows and
    the simulator's window; it also writes what the service times and the replicas read of each request (arrival,
    prompt and output tokens, passes, class, reused tokens per tier: ``8 + 4 x (4 + tiers)`` bytes) to an unnamed
    temporary file, in the system's temporary folder (about 3.6 GB for 10^8 requests over three tiers), so that
    :meth:`passes` and :meth:`replay` read them back chunk by chunk instead of running the stages again. Where that
    file cannot be written (no space), they run the stages again from their seeds: the same requests, hits and
    draws.
    """

    def __init__(self, scn: Scenario, p: dict, sample: int, seed: int, n_requests: int, chunk: int):
        self.scn, self.p, self.sample, self.seed, self.n, self.chunk = scn, p, sample, seed, n_requests, chunk
        self.warm = kvcache.warmup_requests(n_requests, p["mc.warmup_fraction"])
        self.cache_in = kvcache.Inputs.from_params(p, int(p["cache.block_tokens"]), perf.kv_bytes(p))
        self.spec_in = SpeculativeInputs.from_params(p)
        self.cache_steady = None
        # Progress: a sample whose latencies read every request again (the replicas, or service times without the
        # simulator: stage 5's second pass) shows half of each request's work in each pass, else all in the first.
        replicas = p["deployment.fleet_simulation"] == "replicas"
        self.two_passes = replicas or not fleet.runs_simulator(p["performance.simulate_batching"],
                                                               p["deployment.fleet"], replicas)
        sums, first, last = None, math.nan, math.nan
        steady = kvcache.SteadyStream(n_requests, p["mc.warmup_fraction"], p["mc.steady_state_tolerance"],
                                      workload.profile_period_s(p))
        limit = window_requests(p)
        window, held = [], 0
        self._spill, self._spill_rows = _open_spill(), []
        self.longest_tokens = 0  # the largest prompt and output of a request
        self.first_arrival_s = self.start_s = None  # the first request's arrival, the first measured one's
        for every, skip, every_cached, passes in self._every_chunk(steady):
            self._write_spill(every, skip, every_cached, passes)
            self.longest_tokens = max(self.longest_tokens, int(np.max(every.prompt_tokens + every.output_tokens)))
            if self.first_arrival_s is None:
                self.first_arrival_s = float(every.arrival_s[0])
            measured, cached = (every.tail(skip), every_cached[skip:]) if skip else (every, every_cached)
            if self.start_s is None and measured.n:
                self.start_s = float(measured.arrival_s[0])
            self.last_arrival_s = float(every.arrival_s[-1])
            part = fleet.RequestSums.of(measured.prompt_tokens, cached,
                                        measured.output_tokens if passes is None else passes, measured.output_tokens)
            sums = part if sums is None else sums + part
            if measured.n:
                first = float(measured.arrival_s[0]) if math.isnan(first) else first
                last = float(measured.arrival_s[-1])
            if held < limit and measured.n:
                take = min(limit - held, measured.n)
                # Part of a chunk is copied: views would keep the whole chunk until the first pass ends.
                part = take < every.n
                cut = (lambda a: a[:take].copy()) if part else (lambda a: a[:take])
                window.append((measured.head(take, copy=part), cut(cached), None if passes is None else cut(passes)))
                held += take
        self.window = (workload.concat_requests([w[0] for w in window]), np.concatenate([w[1] for w in window]),
                       None if window[0][2] is None else np.concatenate([w[2] for w in window]))
        self.cache_steady = steady.result()
        self.sums = sums
        span = last - first if sums.n > 1 else 0.0
        self.duration_s = span * sums.n / (sums.n - 1) if sums.n > 1 and span > 0 else max(span, 1.0)
        self.class_names = tuple(scn.classes)
        self.totals = workload.RequestTotals(sums.n, workload.Summed(sums.prompt, sums.n),
                                             workload.Summed(sums.output, sums.n), int(p["cache.block_tokens"]),
                                             self.class_names)
        self.passes_total = None if self.spec_in.draft_tokens == 0 else workload.Summed(sums.passes, sums.n)

    def _chunks(self):
        """The measured requests chunk by chunk, from the stages again: ``(requests, cached_tokens, passes)``."""
        for every, skip, every_cached, passes in self._every_chunk():
            progress.report(every.n // 2 if self.two_passes else 0)  # the second pass, the stages run again
            yield (every.tail(skip), every_cached[skip:], passes) if skip else (every, every_cached, passes)

    def _every_chunk(self, steady=None):
        """Every request chunk by chunk: ``(requests, warm-up requests among them, cached_tokens, passes of the
        measured ones)``."""
        p, scn = self.p, self.scn
        max_context = int(p["workload.max_context"] or p["model.max_context"])
        stream = workload.RequestStream(p, scn.classes, self.n, rng_for(self.seed, self.sample, STREAM_WORKLOAD),
                                        max_context)
        cache = kvcache.CacheStream.of(self.cache_in, rng_for(self.seed, self.sample, STREAM_ROUTING),
                                       max_context // int(p["cache.block_tokens"]) + 1, int(p["cache.block_tokens"]))
        spec_rng = rng_for(self.seed, self.sample, STREAM_SPECULATIVE)
        at = 0
        # The cache replay (a kernel that releases the GIL) of each chunk runs on a thread of its own, in chunk order,
        # while this one generates the next chunk, draws the passes and hands the chunk on: the same work, each
        # stage's calls in the same order, on two cores.
        with ThreadPoolExecutor(1, thread_name_prefix="mcsim-cache") as replay:
            every = stream.next_chunk(self.chunk)
            cached = replay.submit(cache.cached_tokens, every)
            while every is not None:
                following = stream.next_chunk(self.chunk) if stream.remaining else None
                skip = min(max(self.warm - at, 0), every.n)
                at += every.n
                measured = every.tail(skip) if skip else every
                passes = speculative_stage(self.spec_in, measured, spec_rng)
                every_cached = cached.result()
                if following is not None:
                    cached = replay.submit(cache.cached_tokens, following)
                if steady is not None:  # the first pass (see two_passes)
                    steady.add(every_cached, every.prompt_tokens, every.arrival_s)
                    progress.report(every.n - every.n // 2 if self.two_passes else every.n)
                yield every, skip, every_cached, passes
                every = following

    def _record(self) -> np.dtype:
        return np.dtype([("arrival_s", "<f8"), ("columns", "<i4", (4 + len(self.cache_in.capacity_blocks),))])

    def _write_spill(self, every, skip, cached, passes) -> None:
        if self._spill is None:
            return
        records = np.empty(every.n, self._record())
        records["arrival_s"] = every.arrival_s
        records["columns"] = _columns(every, skip, cached, passes)
        try:
            records.tofile(self._spill)
        except OSError:  # no space: the passes run the stages again
            self.close()
            return
        self._spill_rows.append((every.n, skip))

    def close(self) -> None:
        """Remove the first pass's file (:meth:`passes` then runs the stages again)."""
        if self._spill is not None:
            self._spill.close()
            self._spill = None

    def passes(self):
        """The measured requests chunk by chunk, from the first: ``(requests, cached_tokens, passes)``; ``requests``
        has their ``prompt_tokens``, ``output_tokens`` and ``class_id`` (a :class:`SpilledChunk`, read back from
        the first pass's file) or is the :class:`~mcsim.stages.workload.Requests` themselves."""
        if self._spill is None:
            yield from self._chunks()
            return
        for _, block, skip in self._spilled():
            progress.report(len(block) // 2 if self.two_passes else 0)  # the second pass
            columns = block[skip:].astype(np.int64)
            passes = None if self.spec_in.draft_tokens == 0 else np.ascontiguousarray(columns[:, 2])
            yield (SpilledChunk(np.ascontiguousarray(columns[:, 0]), np.ascontiguousarray(columns[:, 1]),
                                np.ascontiguousarray(block[skip:, 3])),
                   np.ascontiguousarray(columns[:, 4:]), passes)

    def _spilled(self):
        """The first pass's file, chunk by chunk: ``(arrivals, int32 columns, warm-up requests among them)``."""
        self._spill.seek(0)
        for rows, skip in self._spill_rows:
            records = np.fromfile(self._spill, self._record(), count=rows)
            yield records["arrival_s"], records["columns"], skip

    def replay(self):
        """Every request chunk by chunk, warm-up included, as :func:`mcsim.perf.replicas_stream.run` reads them:
        arrivals from the first request's, prompt and output tokens, passes (-1 for a warm-up request, whose passes
        are not drawn), class, reused tokens per tier and whether it is measured."""
        source = self._spilled() if self._spill is not None else (
            (every.arrival_s, _columns(every, skip, cached, passes), skip)
            for every, skip, cached, passes in self._every_chunk())
        for arrival, block, skip in source:
            progress.report(len(arrival) // 2 if self.two_passes else 0)  # the second pass
            measured = np.ones(len(arrival), bool)
            measured[:skip] = False
            columns = block.astype(np.int64)
            yield {"arrival_s": arrival - self.first_arrival_s, "prompt": columns[:, 0], "output": columns[:, 1],
                   "passes": columns[:, 2], "class_id": columns[:, 3], "cached": np.ascontiguousarray(columns[:, 4:]),
                   "measured": measured}


def _columns(every, skip, cached, passes) -> np.ndarray:
    """A chunk's columns as the first pass's file holds them."""
    drawn = every.output_tokens[skip:] if passes is None else passes
    return np.column_stack([every.prompt_tokens, every.output_tokens, np.concatenate([np.full(skip, -1), drawn]),
                            every.class_id, *cached.T])


class SpilledChunk:
    """What the service times read of a chunk of requests (read back by :meth:`StreamedSample.passes`)."""

    def __init__(self, prompt_tokens, output_tokens, class_id):
        self.prompt_tokens, self.output_tokens, self.class_id = prompt_tokens, output_tokens, class_id
        self.n = len(prompt_tokens)


def _open_spill():
    """An unnamed temporary file for a streamed sample's first pass, or None where none can be made."""
    try:
        return tempfile.TemporaryFile(prefix="mcsim-sample-")
    except OSError:
        return None


MONEY_OUTPUTS = ("cost_usd_per_day", "revenue_usd_per_day", "gross_margin", "cost_profit_margin",
                 "cost_usd_per_mtok", "energy_j_per_token", "payback_months", "delivered_output_tok_s_per_gpu")


def money(p: dict, fleet_result: fleet.Performance) -> dict:
    """Daily economics of the fleet that ran (scaled from the trace's duration to a day); NaN for a sample that
    could not run. Revenue counts the tokens the fleet served (less than the demand only when a fixed fleet is
    loaded past its capacity)."""
    f = fleet_result
    if not f.feasible:
        return {name: math.nan for name in MONEY_OUTPUTS} | tier_money(p, f)
    per_day = 86400.0 / f.duration_s * f.served_fraction
    pricing = p["economics.pricing"]
    # An economics price is one price for whatever GPU runs, charged as written (a hardware sweep must pin it
    # explicitly, see mcsim.scenario.grid.pricing_note); otherwise each GPU pays its own hardware price x factor.
    factor = p["economics.gpu_price_factor"]
    price = p["economics.price_usd"] or p["hardware.price_usd"] * factor
    rental = p["economics.rental_usd_per_gpu_hour"] or p["hardware.rental_usd_per_hour"] * factor
    e = economics.daily(
        f.gpus, f.busy_fraction,
        hit_tokens_per_day=f.hit_tokens * per_day, miss_tokens_per_day=f.miss_tokens * per_day,
        output_tokens_per_day=f.output_tokens * per_day,
        prices=(p["economics.price_input_cache_hit_usd_per_mtok"], p["economics.price_input_cache_miss_usd_per_mtok"],
                p["economics.price_output_usd_per_mtok"]),
        billed_fraction=p["economics.billed_fraction"], pricing=pricing, price_usd=price,
        lifetime_years=p["economics.lifetime_years"], rental_usd_per_gpu_hour=rental, tdp_w=p["hardware.tdp_w"],
        idle_w=p["hardware.idle_w"], pue=p["economics.pue"],
        electricity_usd_per_kwh=p["economics.electricity_usd_per_kwh"],
    )
    return {
        "cost_usd_per_day": e.cost_usd_per_day,
        "revenue_usd_per_day": e.revenue_usd_per_day,
        "gross_margin": e.gross_margin,
        "cost_profit_margin": e.cost_profit_margin,
        "cost_usd_per_mtok": e.cost_usd_per_mtok,
        "energy_j_per_token": e.energy_j_per_token,
        "payback_months": e.payback_months,
        # what the money is charged against: the output tokens served per second of the trace, per deployed GPU
        "delivered_output_tok_s_per_gpu": f.output_tokens * f.served_fraction / f.duration_s / f.gpus
        if f.duration_s > 0 and f.gpus > 0 else math.nan,
    } | tier_money(p, f, e.cost_usd_per_day, per_day)


def tier_money(p: dict, f: fleet.Performance, cost_usd_per_day: float = math.nan,
               per_day: float = math.nan) -> dict:
    """What each KV tier costs a day and what it saves (:func:`mcsim.stages.economics.kv_tier_money`; NaN arrays
    when the sample could not run): ``kv_tier_gb`` (:func:`mcsim.stages.kvcache.fleet_tier_gb` of the instances
    that hold caches), ``kv_tier_cost_usd_per_day`` and ``kv_tier_recompute_saved_usd_per_day``."""
    n_tiers = len(kvcache.tiers_of(p))
    if not f.feasible:
        nan = np.full(n_tiers, math.nan)
        return {"kv_tier_gb": nan, "kv_tier_cost_usd_per_day": nan, "kv_tier_recompute_saved_usd_per_day": nan}
    m = f.metrics
    holders = m["prefill_instances"] if p["deployment.disaggregated"] else m["decode_instances"]
    gb = kvcache.fleet_tier_gb(p, int(holders)) if p["cache.enabled"] else np.zeros(n_tiers)
    hits_per_day = np.asarray(m["cache_hit_rate_by_tier"], dtype=float) * (f.hit_tokens + f.miss_tokens) * per_day
    cost, saved = economics.kv_tier_money(gb, kvcache.tier_prices(p), hits_per_day,
                                          m["prefill_capacity_tok_s_per_gpu"], cost_usd_per_day, f.gpus)
    return {"kv_tier_gb": gb, "kv_tier_cost_usd_per_day": cost, "kv_tier_recompute_saved_usd_per_day": saved}


def variant_specs(scn: Scenario, variants) -> dict[str, dict]:
    """Variant name -> overrides. Names may be ``factory``, ``baseline`` or already a dict of specs."""
    if isinstance(variants, dict):
        for name, overrides in variants.items():
            for path in overrides:
                check_variant_key(path, scn.source, f"variant {name}")
        return variants
    return {v: ({} if v == "factory" else scn.baseline if v == "baseline" else _unknown(v)) for v in variants}


def _unknown(name):
    raise ValueError(f"unknown variant {name!r}; expected 'baseline' or 'factory', or a dict name -> overrides")


def variant_stages(scn: Scenario, variant: str, overrides: dict, sample: int, seed: int, n_requests: int,
                   draws: dict, shared: dict | None = None):
    """Stages 1-4 of one variant of a sample, and the fidelity's step model built on them.

    ``shared`` carries the sample's requests and memoised stage results from one variant to the next (pass the
    same dict for every variant of a sample). Returns ``(params, measured requests, cached tokens, passes,
    experts, step model)``; ``shared["cache_steady_state"]`` then holds the cache's steady-state check of this
    variant (:func:`mcsim.stages.kvcache.steady_state`), ``shared["cache_inputs"]`` its cache stage's
    :class:`~mcsim.stages.kvcache.Inputs` and ``shared["stage5_key"]`` what its step model was built from (its
    declared inputs, :func:`mcsim.perf.factor.step_inputs`, and those of stages 1-4), with which stage 5 is
    memoised.
    """
    shared = {} if shared is None else shared
    memo = shared.setdefault("memo", {})

    def once(key, compute):
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    p = variant_params(scn, variant, overrides, draws)
    inputs = workload.Inputs.from_params(p)
    if "requests" not in shared:  # the workload is common to all variants
        shared["requests"] = sample_requests(scn, p, sample, seed, n_requests)
        shared["workload_inputs"] = inputs
    elif inputs != shared["workload_inputs"]:
        key = shared["workload_inputs"].first_difference(inputs)
        raise ScenarioError(scn.source, key, f"variant {variant} changes the workload; the variants of a "
                            "sample share their requests, so sweep it with --grid instead")
    requests = shared["requests"]
    # The caches see every request; statistics leave out the warm-up requests that filled them.
    warm = kvcache.warmup_requests(requests.n, p["mc.warmup_fraction"])
    measured = requests.tail(warm)
    cache_in = kvcache.Inputs.from_params(p, requests.block_tokens, perf.kv_bytes(p))
    shared["cache_inputs"] = cache_in
    # Before the cache stage allocates anything per instance: a fleet that cannot fit is refused in one line.
    fleet_memory.check_sample(p, cache_in, requests)
    every = once(cache_in, lambda: cache_stage(cache_in, requests, rng_for(seed, sample, STREAM_ROUTING)))
    cached = every[warm:]
    shared["cache_steady_state"] = once(
        ("steady", cache_in, p["mc.warmup_fraction"], p["mc.steady_state_tolerance"]),
        lambda: kvcache.steady_state(every, requests.prompt_tokens, p["mc.warmup_fraction"],
                                     p["mc.steady_state_tolerance"], requests.arrival_s, workload.profile_period_s(p)))
    spec_in = SpeculativeInputs.from_params(p)
    passes = once(spec_in, lambda: speculative_stage(spec_in, measured, rng_for(seed, sample, STREAM_SPECULATIVE)))
    expert_in = None
    if p["model.experts"] > 0:
        # The step's tokens follow the batch that fits in memory (the one memory projection).
        expert_in = ExpertInputs.from_params(p, scn.classes, _memory_batch(p, measured))
    experts = once(("experts", expert_in), lambda: expert_stage(expert_in, rng_for(seed, sample, STREAM_EXPERTS)))
    # The step model reads its declared inputs only, and is built once per sample for each value of them and of
    # the stages it prices (the same key memoises stage 5: see sample_variants).
    step_in = perf.step_inputs(p)
    key = (step_in, warm, cache_in, spec_in, expert_in)
    shared["stage5_key"] = key
    model = once(("model", key), lambda: _step_model(step_in, measured, passes, experts))
    return p, measured, cached, passes, experts, model


def variant_params(scn: Scenario, variant: str, overrides: dict, draws: dict) -> dict:
    """The resolved parameters of one variant of a sample."""
    p = resolve(scn.with_values(overrides, origin=f"variant {variant}") if overrides else scn, draws)
    if p["performance.fidelity"] == "roofline":
        p = performance_defaults(p)  # the hardware's fitted GEMM figures where the scenario leaves them at 0
    return p


def recorded(experts: dict) -> dict:
    """The expert stage's outputs a result records: all but the tokens a step it routed (an input of the step
    model's, already in the scenario's values)."""
    return {k: v for k, v in experts.items() if k != "distinct_experts_tokens"}


def _step_model(step_in, requests, passes, experts):
    if step_in["performance.fidelity"] == "roofline":
        return RooflineStepModel(step_in, requests, passes, experts)
    return perf.FactorStepModel(step_in, requests, passes, experts["expert_efficiency"], factor_bases(step_in))


def streamed_variant(scn: Scenario, variant: str, p: dict, sample: int, seed: int, n_requests: int, draws: dict,
                     shared: dict):
    """One variant of a streamed sample (:func:`streamed`), as :func:`sample_variants` yields it."""
    inputs = workload.Inputs.from_params(p)
    if "workload_inputs" not in shared:
        shared["workload_inputs"] = inputs
    elif inputs != shared["workload_inputs"]:
        key = shared["workload_inputs"].first_difference(inputs)
        raise ScenarioError(scn.source, key, f"variant {variant} changes the workload; the variants of a "
                            "sample share their requests, so sweep it with --grid instead")
    fleet_memory.check_streamed(p)
    stages = StreamedSample(scn, p, sample, seed, n_requests, chunk_requests(p))
    expert_in = None
    if p["model.experts"] > 0:
        expert_in = ExpertInputs.from_params(p, scn.classes, _memory_batch(p, stages.totals))
    experts = expert_stage(expert_in, rng_for(seed, sample, STREAM_EXPERTS))
    model = _step_model(perf.step_inputs(p), stages.totals, stages.passes_total, experts)
    measured = fleet.MeasuredStream(stages.sums, stages.duration_s, stages.class_names, stages.passes,
                                    stages.window, replay=stages.replay, requests=n_requests,
                                    span_s=stages.last_arrival_s - stages.first_arrival_s,
                                    start_s=stages.start_s - stages.first_arrival_s,
                                    longest_tokens=stages.longest_tokens, chunk=stages.chunk)
    result = fleet.performance(fleet.Inputs.from_params(p), measured, None, None, model,
                               rng_for(seed, sample, STREAM_BATCHING))
    m = dict(result.metrics)
    m.update(recorded(experts))
    m.update(money(p, result))
    m.update(steady_outputs(stages.cache_steady, result.batching_steady_state, n_requests))
    return variant, m, result, {WORKLOAD_CLASS: stages.class_names, "tier": kvcache.tier_names(p)}


def sample_variants(scn: Scenario, variants, sample: int, seed: int, n_requests: int, draws: dict,
                    step_log: int = 0):
    """Every variant of one sample, in order: ``(variant, metrics, fleet, coords)``, with ``metrics`` the
    variant's outputs by registered name (:mod:`mcsim.results.variables`), ``fleet`` the
    :class:`~mcsim.perf.fleet.Performance` its fleet stage handed on (its step log, with ``step_log`` > 0) and
    ``coords`` the labels of its own dims (``workload_class``: the requests' classes; ``tier``: the cache's
    tiers). See :func:`run_sample`."""
    shared: dict = {}
    for variant, overrides in variant_specs(scn, variants).items():
        p = variant_params(scn, variant, overrides, draws)
        if streamed(scn, p, n_requests):
            yield streamed_variant(scn, variant, p, sample, seed, n_requests, draws, shared)
            continue
        p, measured, cached, passes, experts, model = variant_stages(scn, variant, overrides, sample, seed,
                                                                      n_requests, draws, shared)
        fleet_in = fleet.Inputs.from_params(p)
        # Stage 5 by its inputs and those of the stages before it: variants that differ only in later levers
        # (prices, say) share it.
        key = ("performance", fleet_in, shared["stage5_key"], step_log)
        if key not in shared["memo"]:
            shared["memo"][key] = fleet.performance(
                fleet_in, measured, cached, passes, model, rng_for(seed, sample, STREAM_BATCHING),
                step_log=step_log, all_requests=shared["requests"],
                capacity_blocks=shared["cache_inputs"].capacity_blocks,
                pooled_tiers=shared["cache_inputs"].pooled_tiers)
        result = shared["memo"][key]
        m = dict(result.metrics)
        m.update(recorded(experts))
        m.update(money(p, result))
        # The replicas' own caches, when they ran, else the cache stage's replay.
        cache_steady = result.cache_steady_state
        cache_steady = shared["cache_steady_state"] if cache_steady is None else cache_steady
        m.update(steady_outputs(cache_steady, result.batching_steady_state, shared["requests"].n))
        yield variant, m, result, {WORKLOAD_CLASS: tuple(measured.class_names), "tier": kvcache.tier_names(p)}


def run_sample(scn: Scenario, variants, sample: int, seed: int, n_requests: int, draws: dict) -> dict:
    """Every variant of one sample.

    Stage results are memoised within the sample by everything they depend on, so variants that differ only in
    levers of later stages (e.g. the ablations of ``compare --ablate``) reuse the kernels' work; each stage's random
    stream is restarted from its seed for every variant, so a memoised result is exactly what a fresh run gives.

    Parameters
    ----------
    scn : Scenario
    variants : sequence of str, or dict
        ``"factory"`` and/or ``"baseline"``, or ``{name: {dotted.path: value}}`` overrides per variant.
    sample : int
        Sample index (selects the random streams).
    seed : int
    n_requests : int
    draws : dict
        Uncertain input path -> value for this sample.

    Returns
    -------
    dict
        variant -> metric name -> value, and ``"__coords__"``: the labels of the sample's own dims
        (``workload_class``, ``tier``), the first variant's.
    """
    results: dict = {}
    for variant, metrics, _, coords in sample_variants(scn, variants, sample, seed, n_requests, draws):
        results[variant] = metrics
        results.setdefault("__coords__", coords)
    return results


def steady_outputs(cache, batching, n_requests: int) -> dict:
    """The steady-state outputs of one variant from the cache's check and the batching simulator's (or None).

    A sample is steady when every check that ran is; it then needs its own ``n_requests``. Otherwise it needs the
    larger estimate of the checks that failed (infinite when the simulated queue is saturated: no run length
    settles it). The simulator replays the measured requests back to back up to a length of its own, and that
    length grows with ``mc.requests`` once it exceeds the replay's floor, so its estimate is read as requests per
    sample too.
    """
    checks = [c for c in (cache, batching) if c is not None]
    steady = all(c.steady for c in checks)
    needed = float(n_requests) if steady else max(c.requests_needed for c in checks if not c.steady)
    return {"steady_state": int(steady), "cache_hit_rate_drift": cache.drift,
            "queue_wait_drift": math.nan if batching is None else batching.drift,
            "requests_for_steady_state": needed}


def _memory_batch(p: dict, requests) -> float:
    """Sequences per decode GPU whose KV fits, by the one memory projection (0 when none fits)."""
    return perf.batch_limit_by_memory(perf.pool_memory(p, requests), instance_gpus(p))

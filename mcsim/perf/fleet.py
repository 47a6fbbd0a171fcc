"""Stage 5, the fleet: one step-time model turned into the operating batch, whole instances per pool, the
latencies and the figures cost is charged from.

Fleet modes (``deployment.fleet``)
----------------------------------
``utilization``
    Enough whole instances per pool for the load at ``economics.target_utilization`` (at least
    ``deployment.instances`` / ``prefill_instances``), each decode GPU at the operating batch: the largest that
    fits KV memory, meets the TPOT target and the batch cap, or less when the traffic cannot fill the fleet
    (Little's law: concurrency = arrival rate x decode time per request, solved together with the step time).
``fixed``
    ``deployment.instances`` decode (or colocated) instances and ``prefill_instances`` prefill instances serve
    the load; latency, queueing, saturation and SLO attainment follow from it (the batching simulator always
    runs), and cost is that fleet's cost.
``slo``
    The smallest whole number of instances per pool whose simulated ``slo_quantile`` TTFT and TPOT meet
    ``ttft_target_s`` and ``tpot_target_s`` (bisection on instances with the batching simulator; the prefill
    pool is sized for TTFT, then the decode pool for TPOT). A sample that no fleet up to
    ``deployment.max_instances`` can serve is infeasible.

The stage reads its parameters as :class:`Inputs` (``Inputs.from_params``) and hands on a :class:`Performance`:
the metrics of the fleet (registered variables of :mod:`mcsim.results.variables`, by name) and, as typed fields,
what economics and the run read of it (served share, token totals, GPUs and busy time, the step log, the
steady-state checks).

In every mode the fleet that is simulated is the fleet that is charged: when the batching simulator runs, the
operating batch is its mean decode batch, and throughput, busy time, energy and cost come from the same
instances and steps as TTFT and TPOT. A sample that cannot run (weights or one sequence's KV do not fit in a
pool, the TPOT target cannot be met at a batch of one, no fleet meets the SLOs) gets NaN for every performance
and money figure, keeps its reason, and is never priced.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from mcsim.errors import RunLimitError
from mcsim.perf.factor import batch_limit_by_memory, infeasible_reason, kv_bytes, static_slot_utilization
from mcsim.perf.batching import QUANTILES
from mcsim.perf.latency import PoolSettings, PoolSimulator, prepare, prepare_stream, restore_seconds
from mcsim.perf import replicas_stream
from mcsim.perf.latency_quantiles import Latencies, finite_quantile
from mcsim.scenario.policies import policy_for
from mcsim.perf.params import Params
from mcsim.perf.search import integer_boundary, largest
from mcsim.scenario.choices import REPLICA_KEYS, replica_mismatch
from mcsim.stages.kvcache import restore_rates, steady_state, tiers_of, warmup_requests
from mcsim.stages.workload import profile_period_s

#: Figures that describe a deployment that ran; NaN when it could not.
PERFORMANCE_OUTPUTS = (
    "decode_tok_s_per_gpu", "prefill_tok_s_per_gpu", "decode_capacity_tok_s_per_gpu",
    "prefill_capacity_tok_s_per_gpu", "batch_efficiency", "operating_batch_per_gpu",
    "mean_concurrency_per_gpu", "spec_tokens_per_pass", "ttft_s", "tpot_s", "e2e_s", "queue_wait_s",
    "ttft_at_slo_quantile_s", "tpot_at_slo_quantile_s", "slo_attainment", "little_law_ratio", "gpus",
    "decode_gpus", "prefill_gpus", "instances", "decode_instances", "prefill_instances", "gpu_hours",
    "busy_fraction", "instance_load_imbalance")

#: The parameters the batching simulator reads (:mod:`mcsim.perf.latency` takes them as a mapping), besides each
#: workload class's ``workload.classes.<name>.priority``.
SIMULATOR_KEYS = (
    "deployment.batching", "deployment.scheduler", "deployment.max_new_per_step", "deployment.tp", "deployment.pp",
    "deployment.fleet_simulation", "deployment.routing", "deployment.routing_balance",
    "deployment.routing_balance_requests", "performance.batching_requests", "performance.chunk_tokens",
    "performance.token_budget", "performance.preempt", "performance.closed_loop_users", "workload.think_time_s",
    "mc.queue_steady_state_tolerance", "workload.rate_profile", "workload.rate_profile_period_s")


@dataclass(frozen=True)
class Inputs:
    """The parameters stage 5 reads (also its memo key within a sample).

    Attributes
    ----------
    fleet : str
        ``deployment.fleet``: utilization, fixed or slo.
    instances, prefill_instances, max_instances : int
        ``deployment.*``: the fleet, or its smallest size, per pool; the most instances ``slo`` tries.
    target_utilization : float
        ``economics.target_utilization``: the busy share a ``utilization`` fleet is sized for.
    disaggregated : bool
    fleet_simulation : str
        ``deployment.fleet_simulation``: representative or replicas.
    batching, scheduler : str
        The policy of :mod:`mcsim.scenario.policies` (its analytic decode-slot model).
    simulate_batching : bool
    max_batch_per_gpu, tpot_target_s, ttft_target_s, slo_quantile : float
        ``deployment.*``: the batch cap and the latency targets.
    kv_bytes_per_token : float
        KV bytes per token of the model in its precision (:func:`mcsim.perf.factor.kv_bytes`).
    tiers : tuple of mcsim.stages.kvcache.Tier
        The cache's tiers, first to last (restores from each after the first cost its bandwidth and latency).
    nvme_gb_s_per_node : float
        ``cache.nvme_gb_s_per_node``: the nvme kind's default bandwidth.
    kv_transfer_latency_s : float
        ``efficiency.kv_transfer_latency_s``: the prefill-to-decode hand-off's latency when disaggregated.
    request_overhead_s, tokenize_s_per_token, detokenize_s_per_token : float
        ``host.*``: the host's costs per request.
    stream_interval_tokens : int
    warmup_fraction, steady_state_tolerance : float
        ``mc.*``: the replicas' warm-up and their caches' steady-state check.
    replica_values : tuple of (str, value)
        The values of :data:`mcsim.scenario.choices.REPLICA_KEYS`, checked again once drawn.
    simulator : Params
        The parameters the batching simulator reads (:data:`SIMULATOR_KEYS` and the classes' priorities).
    """

    fleet: str
    instances: int
    prefill_instances: int
    max_instances: int
    target_utilization: float
    disaggregated: bool
    fleet_simulation: str
    batching: str
    scheduler: str
    simulate_batching: bool
    max_batch_per_gpu: float
    tpot_target_s: float
    ttft_target_s: float
    slo_quantile: float
    kv_bytes_per_token: float
    tiers: tuple
    nvme_gb_s_per_node: float
    kv_transfer_latency_s: float
    request_overhead_s: float
    tokenize_s_per_token: float
    detokenize_s_per_token: float
    stream_interval_tokens: int
    warmup_fraction: float
    steady_state_tolerance: float
    replica_values: tuple
    simulator: Params

    @classmethod
    def from_params(cls, p: dict) -> "Inputs":
        priorities = sorted(k for k in p if k.startswith("workload.classes.") and k.endswith(".priority"))
        return cls(
            fleet=p["deployment.fleet"], instances=p["deployment.instances"],
            prefill_instances=p["deployment.prefill_instances"], max_instances=p["deployment.max_instances"],
            target_utilization=p["economics.target_utilization"], disaggregated=bool(p["deployment.disaggregated"]),
            fleet_simulation=p.get("deployment.fleet_simulation", "representative"),
            batching=p["deployment.batching"], scheduler=p["deployment.scheduler"],
            simulate_batching=bool(p["performance.simulate_batching"]),
            max_batch_per_gpu=p["deployment.max_batch_per_gpu"], tpot_target_s=p["deployment.tpot_target_s"],
            ttft_target_s=p["deployment.ttft_target_s"], slo_quantile=p["deployment.slo_quantile"],
            kv_bytes_per_token=kv_bytes(p), tiers=tuple(tiers_of(p)),
            nvme_gb_s_per_node=p["cache.nvme_gb_s_per_node"],
            kv_transfer_latency_s=p["efficiency.kv_transfer_latency_s"],
            request_overhead_s=p["host.request_overhead_s"], tokenize_s_per_token=p["host.tokenize_s_per_token"],
            detokenize_s_per_token=p["host.detokenize_s_per_token"],
            stream_interval_tokens=p["host.stream_interval_tokens"], warmup_fraction=p["mc.warmup_fraction"],
            steady_state_tolerance=p["mc.steady_state_tolerance"],
            replica_values=tuple((path, p[path]) for path in REPLICA_KEYS if path in p),
            simulator=Params([(k, p[k]) for k in SIMULATOR_KEYS if k in p] + [(k, p[k]) for k in priorities]))


@dataclass(frozen=True)
class Performance:
    """What stage 5 hands on.

    Attributes
    ----------
    metrics : Mapping
        Registered variable name (:mod:`mcsim.results.variables`) -> value, and ``infeasible_reason``; read-only.
    feasible : bool
        Whether the sample could run (else every performance figure is NaN and it is never priced).
    duration_s : float
        The measured requests' window, s.
    gpus, busy_fraction : float
        The fleet charged and the share of its GPU time it is busy (NaN when infeasible).
    served_fraction : float
        Share of the demand served: below 1 only when a fleet is loaded past what it can serve.
    hit_tokens, miss_tokens, output_tokens : float
        Prompt tokens reused from the cache and computed, and output tokens, over the measured requests.
    step_log : dict or None
        The batching simulator's first steps, when asked for and it ran.
    batching_steady_state, cache_steady_state : mcsim.stages.steady_state check or None
        The simulator's queue check, and the replicas' own caches' check (None: the cache stage's stands).
    """

    metrics: Mapping
    feasible: bool
    duration_s: float
    gpus: float
    busy_fraction: float
    served_fraction: float
    hit_tokens: float
    miss_tokens: float
    output_tokens: float
    step_log: dict | None = None
    batching_steady_state: object = None
    cache_steady_state: object = None


def runs_simulator(simulate_batching: bool, fleet_mode: str, replicas: bool) -> bool:
    """Whether stage 5 runs the batching simulator: asked for, or what a fixed or SLO-sized fleet's latencies and
    the replicas need. A streamed sample that does not (and one of replicas, run request by request) reads every
    request again in a second pass."""
    return bool(simulate_batching) or fleet_mode in ("fixed", "slo") or replicas


def smallest_fleet(meets, known_short: int, cap: int):
    """Smallest whole ``n`` in ``[known_short + 1, cap]`` with ``meets(n)``, for ``meets`` false below a
    threshold and true from it on (doubling, then bisection); None when even ``cap`` does not meet it."""
    good = max(known_short + 1, 1)
    if good > cap:  # fewer than known_short + 1 cannot keep up, and more are not allowed
        return None
    short = known_short
    while not meets(good):
        short = good
        if good >= cap:
            return None
        good = min(2 * good, cap)
    return integer_boundary(meets, short, good, at_lo=False)[1]


def _whole(x: float) -> int:
    return max(int(math.ceil(x - 1e-9)), 1)


def infeasible(reason: str, b_mem: float, tpp: float, classes: tuple = ("chat",)) -> dict:
    """The performance figures of a sample that cannot run: NaN, with its reason."""
    out = {name: math.nan for name in PERFORMANCE_OUTPUTS}
    out.update({name: np.full(len(QUANTILES), np.nan) for name in ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s")})
    out.update({name: np.full((len(classes), len(QUANTILES)), np.nan) for name in ("ttft_s_by_class",
                                                                                    "tpot_s_by_class")})
    out.update(slo_attainment_by_class=np.full(len(classes), np.nan))
    out.update(max_batch_by_memory=b_mem, spec_raw_tokens_per_pass=tpp, feasible=0, infeasible_reason=reason,
               saturated=0)
    return out


@dataclass(frozen=True)
class RequestSums:
    """Integer totals over some requests: what stage 5 reads of them besides each request's latency inputs. Sums of
    chunks add up (``a + b``) to the sums of the chunks joined, exactly.

    Attributes
    ----------
    n : int
    prompt, output, passes : int
        Prompt tokens, output tokens and decode passes (output tokens without speculative decoding).
    cached : int64[tiers]
        Prompt tokens reused from each tier.
    """

    n: int
    prompt: int
    output: int
    passes: int
    cached: tuple

    @classmethod
    def of(cls, prompt, cached_tokens, passes, output) -> "RequestSums":
        return cls(len(prompt), int(np.sum(prompt)), int(np.sum(output)), int(np.sum(passes)),
                   tuple(int(c) for c in np.asarray(cached_tokens).sum(axis=0)))

    def __add__(self, other: "RequestSums") -> "RequestSums":
        return RequestSums(self.n + other.n, self.prompt + other.prompt, self.output + other.output,
                           self.passes + other.passes, tuple(a + b for a, b in zip(self.cached, other.cached)))

    @property
    def hit(self) -> int:
        return sum(self.cached)

    @property
    def miss(self) -> int:
        return self.prompt - self.hit


def cache_figures(sums: RequestSums, kv_bytes_per_token: float) -> dict:
    """The cache's figures over some requests: hit rates (all tiers and per tier), restored GB per request."""
    total_in = float(sums.prompt)
    cached = np.array(sums.cached, dtype=float)
    return {"cache_hit_rate": float(sums.hit) / total_in,
            "cache_hit_rate_by_tier": cached / total_in,
            "restore_gb_per_request_by_tier": np.concatenate([[0.0], cached[1:] * kv_bytes_per_token / sums.n / 1e9])}


@dataclass
class MeasuredStream:
    """A sample's measured requests as a stream (stage 5 of a streamed sample): their totals, and the chunks again.

    Attributes
    ----------
    sums : RequestSums
        Over every measured request.
    duration_s : float
        The measured window (:attr:`mcsim.stages.workload.Requests.duration_s` of them all).
    class_names : tuple of str
    chunks : callable
        ``chunks()`` yields ``(requests, cached_tokens, passes)`` of consecutive chunks of the measured requests,
        from the first (``passes`` None without speculative decoding).
    window : tuple
        ``(requests, cached_tokens, passes)`` of the first measured requests
        (:func:`mcsim.execution.sample.window_requests` of them at most, whatever the chunks): what the batching
        simulator replays.
    replay : callable, optional
        ``replay()`` yields every request, warm-up included, chunk by chunk, as
        :func:`mcsim.perf.replicas_stream.run` reads them (the replicas of a streamed sample); with it:
    requests, span_s, start_s, longest_tokens, chunk : int, float, float, int, int
        the requests in all, their arrivals' span, the first measured one's arrival (from the first request's),
        the largest prompt and output of a request, and the sample's chunk of requests.
    """

    sums: RequestSums
    duration_s: float
    class_names: tuple
    chunks: object
    window: tuple
    replay: object = None
    requests: int = 0
    span_s: float = 0.0
    start_s: float = 0.0
    longest_tokens: int = 0
    chunk: int = 0


def performance(inputs: Inputs, requests, cached_tokens: np.ndarray, passes: np.ndarray | None, model, rng,
                step_log: int = 0, all_requests=None, capacity_blocks: tuple = (),
                pooled_tiers: int = 0) -> Performance:
    """Throughput, latency and fleet of one sample from its :class:`~mcsim.perf.factor.StepModel`.

    Parameters
    ----------
    inputs : Inputs
        The sample's parameters that stage 5 reads.
    requests : mcsim.stages.workload.Requests or MeasuredStream
        The measured requests (after warm-up), or their stream (:func:`streams`): then ``cached_tokens`` and
        ``passes`` are None and the fleet runs without the batching simulator.
    cached_tokens : int64[n, tiers]
        Reused prompt tokens per tier (zeros when the cache is off).
    passes : int64[n] or None
        Verification passes per request (None when speculative decoding is off).
    model : mcsim.perf.factor.StepModel
    rng : numpy.random.Generator
        The sample's stream for the batching simulator (closed-loop think times).
    step_log : int
        With the batching simulator, keep its first ``step_log`` steps (:attr:`Performance.step_log`).
    all_requests : mcsim.stages.workload.Requests, optional
        Every request of the sample, warm-up included (``requests`` is its tail): what
        ``deployment.fleet_simulation = "replicas"`` replays, its caches filling on its own clock. The cache
        figures, prefill work and the cache's steady-state check (:attr:`Performance.cache_steady_state`) then
        come from that run's measured requests; ``cached_tokens`` (the cache stage's replay) only sizes the
        fleet's first guess.
    capacity_blocks : tuple of int
        Blocks per tier of one cache (:attr:`mcsim.stages.kvcache.Inputs.capacity_blocks`): the replicas' caches.
    pooled_tiers : int
        How many of the last tiers are pooled (:attr:`mcsim.stages.kvcache.Inputs.pooled_tiers`): in the
        replicas' run, one pool behind every instance's own tiers.

    Returns
    -------
    Performance
    """
    streamed = isinstance(requests, MeasuredStream)
    if streamed:
        sums = requests.sums
        out_tokens = prompt = passes_r = miss = None
    else:
        out_tokens = requests.output_tokens
        prompt = requests.prompt_tokens
        passes_r = out_tokens if passes is None else passes
        sums = RequestSums.of(prompt, cached_tokens, passes_r, out_tokens)
        miss = prompt - cached_tokens.sum(axis=1)
    n = sums.n
    duration = requests.duration_s
    block_tokens = requests.window[0].block_tokens if streamed else requests.block_tokens
    total_out = float(sums.output)
    total_in = float(sums.prompt)
    kvb = inputs.kv_bytes_per_token
    disagg = inputs.disaggregated
    g, gp = model.decode_gpus, model.prefill_gpus
    tpp = model.tokens_per_pass
    mode = inputs.fleet

    message = replica_mismatch(dict(inputs.replica_values))
    if message:  # a value drawn from a distribution (plain values are checked when the scenario loads)
        raise RunLimitError(f"deployment.fleet_simulation: a drawn value: {message}")
    replicas = inputs.fleet_simulation == "replicas"
    stage = {
        **cache_figures(sums, kvb),
        "kv_bytes_per_token": kvb, "requests": n, "mean_input_tokens": total_in / n,
        "mean_output_tokens": total_out / n, "trace_duration_s": duration,
        # what a sample is held to, and the figures that say why it cannot run (NaN until known)
        **model.memory_figures, "tpot_target_s": inputs.tpot_target_s, "ttft_target_s": inputs.ttft_target_s,
        "max_instances": inputs.max_instances, "tpot_at_batch_1_s": math.nan, "instances_needed": math.nan,
        "ttft_at_max_instances_s": math.nan, "tpot_at_max_instances_s": math.nan,
    }
    hit_tokens, miss_tokens = float(sums.hit), float(sums.miss)

    def cannot_run(why: str) -> Performance:
        return Performance(MappingProxyType({**infeasible(why, b_mem, tpp, requests.class_names), **stage}),
                           feasible=False, duration_s=duration, gpus=math.nan, busy_fraction=math.nan,
                           served_fraction=math.nan, hit_tokens=hit_tokens, miss_tokens=miss_tokens,
                           output_tokens=total_out)

    # -- can it run at all: memory of both pools, the TPOT target at a batch of one --------------------------
    b_mem = batch_limit_by_memory(model.decode_memory, model.decode_gpus)
    reason = infeasible_reason(model)
    if reason == "ok":
        stage["tpot_at_batch_1_s"] = model.pass_s(1.0) / tpp
        if stage["tpot_at_batch_1_s"] > inputs.tpot_target_s:
            reason = "TPOT target not met at batch 1"
    if reason != "ok":
        return cannot_run(reason)

    # -- the batch cap: KV memory, the TPOT target and the configured cap ------------------------------------
    hi = max(min(inputs.max_batch_per_gpu, b_mem), 1.0)
    target = inputs.tpot_target_s
    b_cap = max(min(hi, largest(lambda b: model.pass_s(b) / tpp <= target, 1.0, hi)), 1.0)
    policy = policy_for(inputs.batching, inputs.scheduler)
    # The policy's analytic decode-slot model (used with the simulator too: it sets the operating throughput).
    if policy.analytic == "static-slots" and streamed:
        raise ValueError("static batching's slot model reads every output length: it does not stream")
    slot_util = static_slot_utilization(out_tokens, round(b_cap)) if policy.analytic == "static-slots" else 1.0

    def throughput(b):  # useful decode tokens/s per GPU at batch b
        return slot_util * b * tpp / model.pass_s(b)

    # -- the work: prefill (compute + restores) and decode ---------------------------------------------------
    x_prefill = model.prefill_tok_s_per_gpu()
    hw = model.hardware
    # Restores from each tier after the first, at the rates of the instance that holds the cache.
    rates = restore_rates(inputs.tiers, gpus=gp, gpus_per_node=hw.gpus_per_node, host_link_gb_s=hw.host_link_gb_s,
                          nvme_gb_s_per_node=inputs.nvme_gb_s_per_node, hbm_tb_s=hw.hbm_tb_s,
                          scale_out_gb_s=hw.scale_out_gb_s)[1:]

    def prefill_work(s: RequestSums):  # GPU-seconds of prefill: compute and restores
        work = float(s.miss) / x_prefill
        for t, rate in enumerate(rates):
            work += s.cached[t + 1] * kvb / rate.gpu_bytes_s
        return work

    prefill_gpu_s = prefill_work(sums)
    demand = total_out / duration  # decode tokens/s
    prefill_load = prefill_gpu_s / duration  # GPUs' worth of prefill work
    # Instances that the load needs at the batch cap, at 100 % busy: fewer cannot keep up.
    if disagg:
        needed_d, needed_p = demand / (throughput(b_cap) * g), prefill_load / gp
    else:
        needed_d, needed_p = (demand / throughput(b_cap) + prefill_load) / g, 0.0
    prefill_min = (inputs.prefill_instances or inputs.instances) if disagg else 0

    # -- latency inputs -----------------------------------------------------------------------------------------
    def restore_and_transfer(prompt, cached_tokens):  # seconds per request: restores, and the KV's hand-off
        restore_s = np.zeros(len(prompt))
        for t, rate in enumerate(rates):  # each tier's bytes at its bandwidth, and its latency when it restores any
            restore_s = restore_s + cached_tokens[:, t + 1] * kvb / rate.instance_bytes_s
            if rate.latency_s > 0:
                restore_s = restore_s + rate.latency_s * (cached_tokens[:, t + 1] > 0)
        transfer_s = prompt * kvb / (hw.scale_out_gb_s * 1e9 * gp) \
            + inputs.kv_transfer_latency_s if disagg else np.zeros(len(prompt))
        return restore_s, transfer_s

    detokenize = inputs.detokenize_s_per_token
    stream = inputs.stream_interval_tokens - 1
    slo_q = inputs.slo_quantile
    ttft_target = inputs.ttft_target_s

    def with_host(ttft, tpot, e2e, prompt, output):
        # Host-side costs of each request: handling it and tokenizing its own prompt before the first token,
        # detokenizing every token it emits (inside its TPOT); the first streamed chunk waits for stream_interval
        # tokens. (ttft, tpot, e2e) with them; e2e = ttft + tpot x (output - 1) still holds without streaming.
        first = inputs.request_overhead_s + inputs.tokenize_s_per_token * prompt
        tpot = tpot + detokenize
        return (ttft + first + detokenize + stream * np.nan_to_num(tpot), tpot,
                e2e + first + detokenize * output)

    # The replicas of a streamed sample run once the fleet is known, request by request (replicas_stream).
    stream_replicas = streamed and replicas
    if stream_replicas and (mode == "slo" or requests.replay is None):
        raise ValueError("a streamed sample's replicas run in the utilization and fixed fleet modes only")
    simulate = runs_simulator(inputs.simulate_batching, mode, replicas) and not stream_replicas
    sim = None
    max_seqs = max(int(round(b_cap * g)), 1)
    mean_blocks = math.ceil(model.decode_context / block_tokens)
    if simulate:
        if replicas:
            all_requests = requests if all_requests is None else all_requests
            warm = 0 if all_requests is requests else warmup_requests(all_requests.n, inputs.warmup_fraction)
            per_token = (0.0, *(kvb / rate.instance_bytes_s for rate in rates))
            transfer = (kvb / (hw.scale_out_gb_s * 1e9 * gp), inputs.kv_transfer_latency_s) if disagg \
                else (0.0, 0.0)
            latency = (0.0, *(rate.latency_s for rate in rates))
            workload = prepare_stream(inputs.simulator, all_requests, warm, passes_r, capacity_blocks, per_token,
                                      *transfer, rng, restore_latency_s=latency, pooled_tiers=pooled_tiers)
        else:
            replayed, cached_r, passes_w = requests.window if streamed else (requests, cached_tokens, passes_r)
            passes_w = replayed.output_tokens if passes_w is None else passes_w
            restore_s, transfer_s = restore_and_transfer(replayed.prompt_tokens, cached_r)
            workload = prepare(inputs.simulator, replayed, replayed.prompt_tokens - cached_r.sum(axis=1), restore_s,
                               transfer_s, passes_w, max_seqs, rng)
        sim = PoolSimulator(inputs.simulator, model, workload, max_seqs, int(max(b_mem, 1.0) * g * mean_blocks))

    def meets(lat, check_ttft=True, check_tpot=True) -> bool:
        if lat["saturated"]:
            return False
        ttft, tpot, _ = with_host(lat["ttft"], lat["tpot"], lat["e2e"], lat["prompt"], lat["output"])
        ok = True
        if check_ttft and ttft_target > 0:
            ok &= finite_quantile(ttft, slo_q) <= ttft_target
        if check_tpot:
            ok &= not (finite_quantile(tpot, slo_q) > target)
        return bool(ok)

    u = inputs.target_utilization
    stage["instances_needed"] = max(_whole(needed_d / u), _whole(needed_p / u) if disagg else 0)
    if mode == "utilization":
        n_d = max(_whole(needed_d / u), inputs.instances)
        n_p = max(_whole(needed_p / u), prefill_min) if disagg else 0
        if max(n_d, n_p) > inputs.max_instances:  # the load needs more instances per pool than allowed
            return cannot_run("fleet over max_instances")
    elif mode == "fixed":
        n_d = inputs.instances
        n_p = prefill_min
    else:  # slo: bisection on whole instances, each candidate simulated
        cap = inputs.max_instances
        if disagg:
            short = 0 if replicas else _whole(needed_p) - 1
            n_p = smallest_fleet(lambda k: _prefill_meets(sim, k, with_host, ttft_target, slo_q), short, cap)
            n_d = None
            if n_p is not None:  # the decode pool is sized behind the prefill pool that meets the TTFT target
                short = _whole(needed_d) - 1
                n_d = smallest_fleet(lambda k: meets(sim.disaggregated(k, n_p), check_ttft=False), short, cap)
        else:
            n_p = 0
            # The replicas' own cache hits may need fewer instances than the cache stage's estimate says.
            short = 0 if replicas else _whole(needed_d) - 1
            n_d = smallest_fleet(lambda k: meets(sim.colocated(k)), short, cap)
        if n_p is None or n_d is None:
            stage.update(_slo_at_max_instances(sim, cap, n_p, short, with_host, slo_q, disagg))
            return cannot_run("SLO not met")

    latencies = Latencies(requests.class_names, slo_q, sketch=streamed and not simulate)

    def add_latencies(ttft, tpot, e2e, queue, class_id, prompt, output):
        ttft, tpot, e2e = with_host(ttft, tpot, e2e, prompt, output)
        within = np.ones(len(ttft), dtype=bool)
        if ttft_target > 0:
            within &= ttft <= ttft_target
        within &= ~(tpot > target)  # NaN (one-token outputs) never breaks it
        latencies.add(ttft, tpot, e2e, queue, within, class_id)

    # -- the fleet's latencies: simulated (the charged fleet) or service times ---------------------------------
    steps_kept = None
    cache_steady = None
    if stream_replicas:
        lat = _stream_replicas(inputs, requests, model, rates, kvb, hw, gp, disagg, n_d, n_p, max_seqs,
                               int(max(b_mem, 1.0) * g * mean_blocks), rng, add_latencies, step_log)
        b_sim = lat["mean_decode_batch"] / g
    if simulate:
        lat = sim.disaggregated(n_d, n_p, step_log) if disagg else sim.colocated(n_d, step_log)
        b_sim = lat["mean_decode_batch"] / g
        if replicas:  # the cache figures and prefill work of the run's own caches
            every = lat["cached_tokens"]
            measured_cached = every[workload.measured_from:]
            replica_sums = RequestSums.of(prompt, measured_cached, passes_r, out_tokens)
            stage.update(cache_figures(replica_sums, kvb))
            hit_tokens, miss_tokens = float(replica_sums.hit), float(replica_sums.miss)
            prefill_gpu_s = prefill_work(replica_sums)
            prefill_load = prefill_gpu_s / duration
            if all_requests is not requests:
                cache_steady = steady_state(every, all_requests.prompt_tokens, inputs.warmup_fraction,
                                            inputs.steady_state_tolerance, all_requests.arrival_s,
                                            profile_period_s(inputs.simulator))
    decode_gpus, prefill_gpus = float(n_d * g), float(n_p * gp)
    available = decode_gpus - (0.0 if disagg else prefill_load)
    b_little = largest(lambda b: throughput(b) * max(available, 1e-9) <= demand, 1e-6, b_cap)
    ran = simulate or stream_replicas  # a batching simulation ran: its figures stand
    b_op = b_sim if ran and math.isfinite(b_sim) and b_sim > 0 else b_little
    x_op = throughput(b_op)
    # Served share of the demand: below 1 only when a fleet is loaded past what it can serve (the simulated
    # instance then completes output tokens at its capacity, not at the offered rate).
    served = 1.0
    if ran and lat["saturated"] and demand > 0:
        served = min(1.0, lat["throughput_tok_s"] * n_d / demand)
    gpus = decode_gpus + prefill_gpus
    decode_gpu_s = served * total_out / x_op
    if ran:
        busy_decode = lat["busy_fraction"]
        busy_prefill = lat.get("prefill_busy_fraction", 0.0)
        busy = (busy_decode * decode_gpus + busy_prefill * prefill_gpus) / gpus
    else:
        busy = min((decode_gpu_s + prefill_gpu_s) / (gpus * duration), 1.0)

    pass_s = model.pass_s(b_op)

    def service_times(chunk, cached, passes_c):  # the analytic latencies (no queueing) of some requests
        out = chunk.output_tokens
        passes_c = out if passes_c is None else passes_c
        multi = out > 1  # TPOT is undefined for a one-token output
        restore_s, transfer_s = restore_and_transfer(chunk.prompt_tokens, cached)
        tpot = np.where(multi, pass_s * passes_c / out, np.nan)
        ttft = (chunk.prompt_tokens - cached.sum(axis=1)) / (x_prefill * gp) + restore_s + pass_s + transfer_s
        e2e = ttft + np.where(multi, tpot * (out - 1), 0.0)
        add_latencies(ttft, tpot, e2e, np.zeros(len(out)), chunk.class_id, chunk.prompt_tokens, out)

    if ran:
        if simulate:  # (a stream's were added as its requests finished)
            add_latencies(lat["ttft"], lat["tpot"], lat["e2e"], lat["queue"], lat["class_id"], lat["prompt"],
                          lat["output"])
        saturated, little = lat["saturated"], lat["little_law_ratio"]
        steps_kept = lat["step_log"]
    else:
        for chunk, cached, passes_c in (requests.chunks() if streamed else [(requests, cached_tokens, passes)]):
            service_times(chunk, cached, passes_c)
        saturated, little = 0, math.nan
    # Little's law: arrival rate x decode time per request, over the GPU time left for decode; none is left when a
    # colocated fleet's prefill alone exceeds it (a fixed fleet far past its capacity): no figure, NaN, not a
    # division by almost nothing
    concurrency = (n / duration) * (pass_s * sums.passes / n) / available if available > 0 else math.nan

    metrics = {
        **stage,
        "decode_tok_s_per_gpu": x_op,
        "prefill_tok_s_per_gpu": total_in / prefill_gpu_s if prefill_gpu_s > 0 else math.inf,
        # what one GPU sustains, beside what it does at the deployed load: decode at the largest batch that meets
        # the TPOT target (and fits memory and the cap), prefill at full prefill steps
        "decode_capacity_tok_s_per_gpu": throughput(b_cap),
        "prefill_capacity_tok_s_per_gpu": x_prefill,
        "batch_efficiency": x_op / model.saturated_tok_s_per_gpu(),
        "operating_batch_per_gpu": b_op,
        "mean_concurrency_per_gpu": concurrency,
        "max_batch_by_memory": b_mem,
        "spec_tokens_per_pass": tpp / model.pass_overhead(b_op),
        "spec_raw_tokens_per_pass": tpp,
        **latencies.figures(),
        "saturated": int(saturated),
        "little_law_ratio": little,
        "gpus": gpus,
        "decode_gpus": decode_gpus,
        "prefill_gpus": prefill_gpus,
        "instances": n_d + n_p,
        "decode_instances": n_d,
        "prefill_instances": n_p,
        "gpu_hours": busy * gpus * duration / 3600.0,
        "feasible": 1,
        "infeasible_reason": "ok",
        "busy_fraction": busy,
        "instance_load_imbalance": lat.get("instance_load_imbalance", math.nan) if ran else math.nan,
    }
    return Performance(MappingProxyType(metrics), feasible=True, duration_s=duration, gpus=gpus, busy_fraction=busy,
                       served_fraction=served, hit_tokens=hit_tokens, miss_tokens=miss_tokens,
                       output_tokens=total_out, step_log=steps_kept,
                       batching_steady_state=lat["steady_state"] if ran else None,
                       cache_steady_state=cache_steady)


def _stream_replicas(inputs: Inputs, stream: MeasuredStream, model, rates, kvb: float, hw, gp: int, disagg: bool,
                     n_d: int, n_p: int, max_seqs: int, kv_blocks: int, rng, add_latencies, step_log: int) -> dict:
    """The pools' replicas over every request of a streamed sample (:func:`mcsim.perf.replicas_stream.run`)."""
    block = int(stream.window[0].block_tokens)
    settings = PoolSettings(inputs.simulator, model, max_seqs, kv_blocks, -(-stream.longest_tokens // block))
    per_token = np.array([0.0, *(kvb / rate.instance_bytes_s for rate in rates)])
    latency = np.array([0.0, *(rate.latency_s for rate in rates)])

    def restore(cached):
        return restore_seconds(cached, per_token, latency)

    def transfer(prompt):
        if not disagg:
            return np.zeros(len(prompt))
        return prompt * (kvb / (hw.scale_out_gb_s * 1e9 * gp)) + inputs.kv_transfer_latency_s

    p = inputs.simulator
    priority = np.array([p.get(f"workload.classes.{c}.priority", 0) for c in stream.class_names], np.int64)
    # Slots: a chunk going in, and room for the requests in flight: twice what the decode (or colocated) pool's
    # instances run at once, or two chunks, the more; a prefill pool's (short prefills, few at once), two chunks.
    slots = (stream.chunk + 2 * max(n_d * settings.max_seqs, stream.chunk), 3 * stream.chunk)
    return replicas_stream.run(settings, stream.replay, stream.requests, stream.span_s, stream.start_s, n_d, n_p,
                               restore, transfer, rng, add_latencies, float(stream.sums.passes) / stream.sums.output,
                               priority, tuple(min(x, stream.requests) for x in slots), block, max_steps=step_log)


def _prefill_ttft(sim, k: int, with_host):
    """TTFT of the measured requests when ``k`` prefill instances serve them (it ends when the KV reaches decode),
    host costs included; None when that pool's queue saturates."""
    pre = sim.prefill(k)
    if pre["saturated"]:
        return None
    handoff = pre["handoff"][pre["measured"]]
    prompt = sim.w.context[pre["measured"]]
    ttft, _, _ = with_host(handoff, np.zeros_like(handoff), handoff, prompt, np.ones_like(prompt))
    return ttft


def _prefill_meets(sim, k: int, with_host, ttft_target: float, slo_q: float) -> bool:
    """The prefill pool of ``k`` instances meets the TTFT target (TTFT ends when the KV reaches decode)."""
    ttft = _prefill_ttft(sim, k, with_host)
    return ttft is not None and (ttft_target <= 0 or finite_quantile(ttft, slo_q) <= ttft_target)


def _slo_at_max_instances(sim, cap: int, n_p, short: int, with_host, slo_q: float, disagg: bool) -> dict:
    """``ttft_at_max_instances_s`` and ``tpot_at_max_instances_s`` of a sample no fleet = 'slo' fleet serves: the
    ``slo_quantile`` figures of ``cap`` instances of the pool that missed. Colocated: both; disaggregated: the
    prefill pool's TTFT when ``n_p`` is None, else the decode pool's TPOT behind ``n_p`` prefill instances (the
    other NaN). Inf when that fleet cannot keep up: its queue saturates, or the load alone needs more than ``cap``
    (``short`` + 1 instances at full busy), so it was never simulated."""
    ttft_missed = not disagg or n_p is None
    tpot_missed = not disagg or n_p is not None
    ttft = tpot = math.nan
    if short + 1 > cap:
        ttft, tpot = (math.inf if ttft_missed else math.nan), (math.inf if tpot_missed else math.nan)
    elif disagg and n_p is None:
        times = _prefill_ttft(sim, cap, with_host)
        ttft = math.inf if times is None else finite_quantile(times, slo_q)
    else:
        lat = sim.disaggregated(cap, n_p) if disagg else sim.colocated(cap)
        if lat["saturated"]:
            ttft, tpot = (math.inf if ttft_missed else math.nan), math.inf
        else:
            times, per_token, _ = with_host(lat["ttft"], lat["tpot"], lat["e2e"], lat["prompt"], lat["output"])
            ttft = finite_quantile(times, slo_q) if ttft_missed else math.nan
            tpot = finite_quantile(per_token, slo_q)
    return {"ttft_at_max_instances_s": ttft, "tpot_at_max_instances_s": tpot}

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
from mcsim.perf.latency import PoolSimulator, prepare, prepare_stream
from mcsim.scenario.policies import policy_for
from mcsim.perf.params import Params
from mcsim.perf.search import integer_boundary, largest
from mcsim.scenario.choices import REPLICA_KEYS, replica_mismatch
from mcsim.stages.kvcache import restore_rates, steady_state, tiers_of, warmup_requests

#: Figures that describe a deployment that ran; NaN when it could not.
PERFORMANCE_OUTPUTS = (
    "decode_tok_s_per_gpu", "prefill_tok_s_per_gpu", "batch_efficiency", "operating_batch_per_gpu",
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
    "mc.queue_steady_state_tolerance")


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


def _quantiles(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return np.quantile(values, QUANTILES) if values.size else np.full(len(QUANTILES), np.nan)


def _quantile(values, q: float) -> float:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if values.size else math.nan


def smallest_fleet(meets, known_short: int, cap: int):
    """Smallest whole ``n`` in ``[known_short + 1, cap]`` with ``meets(n)``, for ``meets`` false below a
    threshold and true from it on (doubling, then bisection); None when even ``cap`` does not meet it."""
    good = max(known_short + 1, 1)
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


def cache_figures(prompt, cached_tokens, kv_bytes_per_token: float) -> dict:
    """The cache's figures over some requests: hit rates (all tiers and per tier), restored GB per request."""
    cached = cached_tokens.sum(axis=1)
    total_in = float(np.sum(prompt))
    restore_bytes = cached_tokens[:, 1:] * kv_bytes_per_token  # every tier after the first
    return {"cache_hit_rate": float(cached.sum()) / total_in,
            "cache_hit_rate_by_tier": cached_tokens.sum(axis=0) / total_in,
            "restore_gb_per_request_by_tier": np.concatenate([[0.0], restore_bytes.sum(axis=0) / len(prompt) / 1e9])}


def token_totals(prompt, cached_tokens) -> tuple[float, float]:
    """(reused, computed) prompt tokens over some requests: the hit and miss totals economics prices."""
    cached = cached_tokens.sum(axis=1)
    return float(cached.sum()), float((prompt - cached).sum())


def performance(inputs: Inputs, requests, cached_tokens: np.ndarray, passes: np.ndarray | None, model, rng,
                step_log: int = 0, all_requests=None, capacity_blocks: tuple = (),
                pooled_tiers: int = 0) -> Performance:
    """Throughput, latency and fleet of one sample from its :class:`~mcsim.perf.factor.StepModel`.

    Parameters
    ----------
    inputs : Inputs
        The sample's parameters that stage 5 reads.
    requests : mcsim.stages.workload.Requests
        The measured requests (after warm-up).
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
    out_tokens = requests.output_tokens
    prompt = requests.prompt_tokens
    n = requests.n
    duration = requests.duration_s
    total_out = float(out_tokens.sum())
    total_in = float(prompt.sum())
    kvb = inputs.kv_bytes_per_token
    disagg = inputs.disaggregated
    g, gp = model.decode_gpus, model.prefill_gpus
    passes_r = out_tokens if passes is None else passes
    tpp = model.tokens_per_pass
    mode = inputs.fleet

    message = replica_mismatch(dict(inputs.replica_values))
    if message:  # a value drawn from a distribution (plain values are checked when the scenario loads)
        raise RunLimitError(f"deployment.fleet_simulation: a drawn value: {message}")
    replicas = inputs.fleet_simulation == "replicas"
    miss = prompt - cached_tokens.sum(axis=1)
    restore_bytes = cached_tokens[:, 1:] * kvb  # every tier after the first (its blocks are used in place)
    stage = {
        **cache_figures(prompt, cached_tokens, kvb),
        "kv_bytes_per_token": kvb, "requests": n, "mean_input_tokens": total_in / n,
        "mean_output_tokens": total_out / n, "trace_duration_s": duration,
    }
    hit_tokens, miss_tokens = token_totals(prompt, cached_tokens)

    def cannot_run(why: str) -> Performance:
        return Performance(MappingProxyType({**infeasible(why, b_mem, tpp, requests.class_names), **stage}),
                           feasible=False, duration_s=duration, gpus=math.nan, busy_fraction=math.nan,
                           served_fraction=math.nan, hit_tokens=hit_tokens, miss_tokens=miss_tokens,
                           output_tokens=total_out)

    # -- can it run at all: memory of both pools, the TPOT target at a batch of one --------------------------
    b_mem = batch_limit_by_memory(model.decode_memory, model.decode_gpus)
    reason = infeasible_reason(model)
    if reason == "ok" and model.pass_s(1.0) / tpp > inputs.tpot_target_s:
        reason = "TPOT target not met at batch 1"
    if reason != "ok":
        return cannot_run(reason)

    # -- the batch cap: KV memory, the TPOT target and the configured cap ------------------------------------
    hi = max(min(inputs.max_batch_per_gpu, b_mem), 1.0)
    target = inputs.tpot_target_s
    b_cap = max(min(hi, largest(lambda b: model.pass_s(b) / tpp <= target, 1.0, hi)), 1.0)
    policy = policy_for(inputs.batching, inputs.scheduler)
    # The policy's analytic decode-slot model (used with the simulator too: it sets the operating throughput).
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

    def prefill_work(miss_tokens, restored_bytes):  # GPU-seconds of prefill: compute and restores
        work = float(miss_tokens.sum()) / x_prefill
        for t, rate in enumerate(rates):
            work += float(restored_bytes[:, t].sum()) / rate.gpu_bytes_s
        return work

    prefill_gpu_s = prefill_work(miss, restore_bytes)
    demand = total_out / duration  # decode tokens/s
    prefill_load = prefill_gpu_s / duration  # GPUs' worth of prefill work
    # Instances that the load needs at the batch cap, at 100 % busy: fewer cannot keep up.
    if disagg:
        needed_d, needed_p = demand / (throughput(b_cap) * g), prefill_load / gp
    else:
        needed_d, needed_p = (demand / throughput(b_cap) + prefill_load) / g, 0.0
    prefill_min = (inputs.prefill_instances or inputs.instances) if disagg else 0

    # -- latency inputs -----------------------------------------------------------------------------------------
    restore_s = np.zeros(n)
    for t, rate in enumerate(rates):  # each tier's bytes at its bandwidth, and its latency when it restores any
        restore_s = restore_s + restore_bytes[:, t] / rate.instance_bytes_s
        if rate.latency_s > 0:
            restore_s = restore_s + rate.latency_s * (cached_tokens[:, t + 1] > 0)
    transfer_s = prompt * kvb / (hw.scale_out_gb_s * 1e9 * gp) \
        + inputs.kv_transfer_latency_s if disagg else np.zeros(n)
    host_first = inputs.request_overhead_s + inputs.tokenize_s_per_token * float(prompt.mean())
    host_last = inputs.detokenize_s_per_token * float(out_tokens.mean())
    stream = inputs.stream_interval_tokens - 1
    slo_q = inputs.slo_quantile
    ttft_target = inputs.ttft_target_s

    def with_host(ttft, tpot, e2e):
        # Host-side costs: request handling, tokenizing the prompt, detokenizing the output; the first streamed
        # chunk waits for stream_interval tokens.
        return ttft + host_first + stream * np.nan_to_num(tpot), e2e + host_first + host_last

    simulate = inputs.simulate_batching or mode in ("fixed", "slo") or replicas
    sim = None
    if simulate:
        max_seqs = max(int(round(b_cap * g)), 1)
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
            workload = prepare(inputs.simulator, requests, miss, restore_s, transfer_s, passes_r, max_seqs, rng)
        mean_blocks = math.ceil(model.decode_context / requests.block_tokens)
        sim = PoolSimulator(inputs.simulator, model, workload, max_seqs, int(max(b_mem, 1.0) * g * mean_blocks))

    def meets(lat, check_ttft=True, check_tpot=True) -> bool:
        if lat["saturated"]:
            return False
        ttft, _ = with_host(lat["ttft"], lat["tpot"], lat["e2e"])
        ok = True
        if check_ttft and ttft_target > 0:
            ok &= _quantile(ttft, slo_q) <= ttft_target
        if check_tpot:
            ok &= not (_quantile(lat["tpot"], slo_q) > target)
        return bool(ok)

    if mode == "utilization":
        u = inputs.target_utilization
        n_d = max(_whole(needed_d / u), inputs.instances)
        n_p = max(_whole(needed_p / u), prefill_min) if disagg else 0
    elif mode == "fixed":
        n_d = inputs.instances
        n_p = prefill_min
    else:  # slo: bisection on whole instances, each candidate simulated
        cap = inputs.max_instances
        if disagg:
            n_p = smallest_fleet(lambda k: _prefill_meets(sim, k, with_host, ttft_target, slo_q),
                                 0 if replicas else _whole(needed_p) - 1, cap)
            n_d = None if n_p is None else smallest_fleet(
                lambda k: meets(sim.disaggregated(k, n_p), check_ttft=False), _whole(needed_d) - 1, cap)
        else:
            n_p = 0
            # The replicas' own cache hits may need fewer instances than the cache stage's estimate says.
            n_d = smallest_fleet(lambda k: meets(sim.colocated(k)), 0 if replicas else _whole(needed_d) - 1, cap)
        if n_d is None or n_p is None:
            return cannot_run("SLO not met")

    # -- the fleet's latencies: simulated (the charged fleet) or service times ---------------------------------
    steps_kept = None
    cache_steady = None
    if simulate:
        lat = sim.disaggregated(n_d, n_p, step_log) if disagg else sim.colocated(n_d, step_log)
        b_sim = lat["mean_decode_batch"] / g
        if replicas:  # the cache figures and prefill work of the run's own caches
            every = lat["cached_tokens"]
            measured_cached = every[workload.measured_from:]
            stage.update(cache_figures(prompt, measured_cached, kvb))
            hit_tokens, miss_tokens = token_totals(prompt, measured_cached)
            miss = prompt - measured_cached.sum(axis=1)
            prefill_gpu_s = prefill_work(miss, measured_cached[:, 1:] * kvb)
            prefill_load = prefill_gpu_s / duration
            if all_requests is not requests:
                cache_steady = steady_state(every, all_requests.prompt_tokens, inputs.warmup_fraction,
                                            inputs.steady_state_tolerance)
    decode_gpus, prefill_gpus = float(n_d * g), float(n_p * gp)
    available = decode_gpus - (0.0 if disagg else prefill_load)
    b_little = largest(lambda b: throughput(b) * max(available, 1e-9) <= demand, 1e-6, b_cap)
    b_op = b_sim if simulate and math.isfinite(b_sim) and b_sim > 0 else b_little
    x_op = throughput(b_op)
    # Served share of the demand: below 1 only when a fleet is loaded past what it can serve (the simulated
    # instance then completes output tokens at its capacity, not at the offered rate).
    served = 1.0
    if simulate and lat["saturated"] and demand > 0:
        served = min(1.0, lat["throughput_tok_s"] * n_d / demand)
    gpus = decode_gpus + prefill_gpus
    decode_gpu_s = served * total_out / x_op
    if simulate:
        busy_decode = lat["busy_fraction"]
        busy_prefill = lat.get("prefill_busy_fraction", 0.0)
        busy = (busy_decode * decode_gpus + busy_prefill * prefill_gpus) / gpus
    else:
        busy = min((decode_gpu_s + prefill_gpu_s) / (gpus * duration), 1.0)

    pass_s = model.pass_s(b_op)
    multi = out_tokens > 1  # TPOT is undefined for a one-token output
    if simulate:
        ttft, tpot, e2e, queue = lat["ttft"], lat["tpot"], lat["e2e"], lat["queue"]
        class_id = lat["class_id"]
        saturated, little = lat["saturated"], lat["little_law_ratio"]
        steps_kept = lat["step_log"]
    else:
        tpot = np.where(multi, pass_s * passes_r / out_tokens, np.nan)
        ttft = miss / (x_prefill * gp) + restore_s + pass_s + transfer_s
        e2e = ttft + np.where(multi, tpot * (out_tokens - 1), 0.0)
        queue = np.zeros(n)
        class_id = requests.class_id
        saturated, little = 0, math.nan
    ttft, e2e = with_host(ttft, tpot, e2e)
    within = np.ones(len(ttft), dtype=bool)
    if ttft_target > 0:
        within &= ttft <= ttft_target
    within &= ~(tpot > target)  # NaN (one-token outputs) never breaks it
    concurrency = (n / duration) * float((pass_s * passes_r).mean()) / max(available, 1e-9)

    metrics = {
        **stage,
        "decode_tok_s_per_gpu": x_op,
        "prefill_tok_s_per_gpu": total_in / prefill_gpu_s if prefill_gpu_s > 0 else math.inf,
        "batch_efficiency": x_op / model.saturated_tok_s_per_gpu(),
        "operating_batch_per_gpu": b_op,
        "mean_concurrency_per_gpu": concurrency,
        "max_batch_by_memory": b_mem,
        "spec_tokens_per_pass": tpp / model.pass_overhead(b_op),
        "spec_raw_tokens_per_pass": tpp,
        "ttft_s": _quantiles(ttft),
        "tpot_s": _quantiles(tpot),
        "e2e_s": _quantiles(e2e),
        "queue_wait_s": _quantiles(queue),
        "ttft_at_slo_quantile_s": _quantile(ttft, slo_q),
        "tpot_at_slo_quantile_s": _quantile(tpot, slo_q),
        "slo_attainment": float(within.mean()) if len(within) else math.nan,
        **by_class(ttft, tpot, within, class_id, requests.class_names),
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
        "instance_load_imbalance": lat.get("instance_load_imbalance", math.nan) if simulate else math.nan,
    }
    return Performance(MappingProxyType(metrics), feasible=True, duration_s=duration, gpus=gpus, busy_fraction=busy,
                       served_fraction=served, hit_tokens=hit_tokens, miss_tokens=miss_tokens,
                       output_tokens=total_out, step_log=steps_kept,
                       batching_steady_state=lat["steady_state"] if simulate else None,
                       cache_steady_state=cache_steady)


def by_class(ttft, tpot, within, class_id, classes) -> dict:
    """Per-request TTFT and TPOT quantiles and SLO attainment of each workload class (NaN for an empty class)."""
    k = len(classes)
    ttft_q, tpot_q, attained = np.full((k, len(QUANTILES)), np.nan), np.full((k, len(QUANTILES)), np.nan), \
        np.full(k, np.nan)
    for c in range(k):
        mine = class_id == c
        if mine.any():
            ttft_q[c], tpot_q[c] = _quantiles(ttft[mine]), _quantiles(tpot[mine])
            attained[c] = float(within[mine].mean())
    return {"ttft_s_by_class": ttft_q, "tpot_s_by_class": tpot_q, "slo_attainment_by_class": attained}


def _prefill_meets(sim, k: int, with_host, ttft_target: float, slo_q: float) -> bool:
    """The prefill pool of ``k`` instances meets the TTFT target (TTFT ends when the KV reaches decode)."""
    pre = sim.prefill(k)
    if pre["saturated"]:
        return False
    if ttft_target <= 0:
        return True
    handoff = pre["handoff"][pre["measured"]]
    ttft, _ = with_host(handoff, np.zeros_like(handoff), handoff)
    return _quantile(ttft, slo_q) <= ttft_target

"""One Monte Carlo sample, stage by stage: scenario draws -> requests -> kernels -> performance -> economics.

:func:`run_sample` is the unit of work that :mod:`mcsim.execution.api` fans out over Dask. Every random stream is
derived from (seed, sample index, stage), so a sample's result does not depend on which task or worker runs it,
and variants of one sample (``baseline`` / ``factory``) see identical requests, acceptance draws, expert
tendencies and arrivals (common random numbers).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from mcsim.perf import factor as perf
from mcsim.scenario import (
    STREAM_EXPERTS,
    STREAM_ROUTING,
    STREAM_SPECULATIVE,
    STREAM_WORKLOAD,
    Scenario,
    ScenarioError,
    resolve,
    rng_for,
)
from mcsim.stages import economics, kvcache, workload


@lru_cache(maxsize=8)
def _read_trace(path: str, fmt: str):
    from mcsim.stages import requests_trace as traces

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


def _nodes(gpus: int, gpus_per_node: int) -> int:
    return max(math.ceil(gpus / gpus_per_node), 1)


def cache_capacity(p: dict, block_tokens: int) -> np.ndarray:
    """Blocks per tier of one instance's cache (all zeros when the cache lever is off)."""
    if not p["cache.enabled"]:
        return np.zeros(3, dtype=np.int64)
    # The prefix cache serves prefill: it lives on the prefill pool when disaggregated.
    gpus = p["deployment.prefill_gpus_per_instance"] if p["deployment.disaggregated"] else \
        p["deployment.gpus_per_instance"]
    nodes = _nodes(gpus, p["hardware.gpus_per_node"])
    return kvcache.capacity_blocks(p["cache.hbm_gb_per_instance"] * 1e9, p["cache.dram_gb_per_node"] * 1e9 * nodes,
                                   p["cache.nvme_gb_per_node"] * 1e9 * nodes, perf.kv_bytes(p), block_tokens)


def cache_stage(p: dict, requests, rng) -> np.ndarray:
    """Cached prompt tokens per request and tier (zeros when the cache lever is off)."""
    capacity = cache_capacity(p, requests.block_tokens)
    if capacity[0] == 0:
        return np.zeros((requests.n, 3), dtype=np.int64)
    result = kvcache.cache_hits(requests, p["deployment.routing"], p["deployment.instances"], capacity, rng,
                                balance=p["deployment.routing_balance"])
    return result.cached_tokens


def speculative_stage(p: dict, requests, rng):
    """Verification passes per request, or None when speculative decoding is off."""
    if not p["speculative.enabled"] or p["speculative.draft_tokens"] == 0:
        return None
    from mcsim.stages.speculative import speculative_passes

    passes, _ = speculative_passes(requests.output_tokens, requests.acceptance, p["speculative.draft_tokens"],
                                   p["speculative.acceptance_decay"], rng)
    return passes


def _memory_batch(p: dict, requests) -> float:
    """Sequences per decode GPU whose KV fits, by the sample's fidelity's own memory model."""
    if p["performance.fidelity"] == "roofline":
        from mcsim.perf.roofline_model import memory, options

        mem = memory(p, requests, options(p))
        return mem.max_sequences / p["deployment.gpus_per_instance"] if mem.fits else 0.0
    mean_context = float(requests.prompt_tokens.mean() + requests.output_tokens.mean() / 2)
    return perf.memory_batch_limit(p, perf.kv_bytes(p), mean_context, requests.block_tokens)[0]


def expert_inputs(p: dict, scn: Scenario, requests) -> tuple:
    """The arguments of the expert stage (also its memo key): everything its result depends on."""
    ep = p["moe.ep_ranks"] or p["deployment.gpus_per_instance"]
    tokens = p["moe.tokens_per_step"]
    if tokens <= 0:
        tokens = int(max(1, min(p["deployment.max_batch_per_gpu"], _memory_batch(p, requests)))) * ep
    shares = np.array([p[f"workload.classes.{c}.share"] for c in scn.classes], dtype=float)
    skews = tuple(float(p[f"workload.classes.{c}.expert_skew"]) for c in scn.classes)
    return (int(p["model.experts"]), int(p["model.active_experts"]), tuple(shares / shares.sum()), skews, int(tokens),
            int(ep), int(p["moe.redundant_experts"]), int(p["moe.window_steps"]), int(p["moe.eval_steps"]),
            int(p["moe.groups"]), int(p["moe.nodes"]))


def expert_stage(p: dict, scn: Scenario, requests, rng) -> dict:
    """Expert efficiency and distinct experts per step (1 and 0 for dense models)."""
    if p["model.experts"] <= 0:
        return {"expert_efficiency": 1.0, "distinct_experts_per_step": 0.0}
    from mcsim.stages.experts import expert_efficiency

    experts, top_k, shares, skews, tokens, ep, redundant, window, steps, groups, nodes = expert_inputs(p, scn, requests)
    result = expert_efficiency(experts, top_k, np.array(shares), np.array(skews), tokens, ep, redundant, window,
                               steps, rng, num_groups=groups, num_nodes=nodes)
    # Throughput follows the time-weighted ratio: each step lasts as long as its busiest GPU.
    return {"expert_efficiency": float(result["expert_efficiency_ratio_of_sums"]),
            "distinct_experts_per_step": float(result["distinct_experts_per_step"])}


def money(p: dict, m: dict) -> dict:
    """Daily economics from the performance metrics (scaled from the trace's duration to a day)."""
    per_day = 86400.0 / m["trace_duration_s"]
    pricing = p["economics.pricing"]
    price = p["economics.price_usd"] or p["hardware.price_usd"]
    rental = p["economics.rental_usd_per_gpu_hour"] or p["hardware.rental_usd_per_hour"]
    e = economics.daily(
        m["gpus"], m["busy_fraction"],
        hit_tokens_per_day=m["_hit_tokens"] * per_day, miss_tokens_per_day=m["_miss_tokens"] * per_day,
        output_tokens_per_day=m["_output_tokens"] * per_day,
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
    }


def variant_specs(scn: Scenario, variants) -> dict[str, dict]:
    """Variant name -> overrides. Names may be ``factory``, ``baseline`` or already a dict of specs."""
    if isinstance(variants, dict):
        return variants
    return {v: ({} if v == "factory" else scn.baseline if v == "baseline" else _unknown(v)) for v in variants}


def _unknown(name):
    raise ValueError(f"unknown variant {name!r}; expected 'baseline' or 'factory', or a dict name -> overrides")


def run_sample(scn: Scenario, variants, sample: int, seed: int, n_requests: int, draws: dict,
               step_log: int = 0) -> dict:
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
    step_log : int
        With the batching simulator on, keep its first ``step_log`` steps in each variant's ``"_step_log"``.

    Returns
    -------
    dict
        variant -> metric name -> value.
    """
    results = {}
    requests = None
    memo: dict = {}

    def once(key, compute):
        if key not in memo:
            memo[key] = compute()
        return memo[key]

    for variant, overrides in variant_specs(scn, variants).items():
        p = resolve(scn.with_values(overrides, origin=f"variant {variant}") if overrides else scn, draws)
        if scn.calibration is not None:
            from mcsim.optrace.calibration import apply

            p = apply(scn.calibration, p)
        if requests is None:  # the workload is common to all variants
            requests = sample_requests(scn, p, sample, seed, n_requests)
        # The caches see every request; statistics leave out the warm-up requests that filled them.
        warm = min(int(p["mc.warmup_fraction"] * requests.n), requests.n - 1)
        measured = requests.tail(warm)
        cache_key = ("cache", tuple(cache_capacity(p, requests.block_tokens)), p["deployment.routing"],
                     p["deployment.instances"], p["deployment.routing_balance"])
        cached = once(cache_key, lambda: cache_stage(p, requests, rng_for(seed, sample, STREAM_ROUTING))[warm:])
        spec_key = ("spec", bool(p["speculative.enabled"]), p["speculative.draft_tokens"],
                    p["speculative.acceptance_decay"])
        passes = once(spec_key, lambda: speculative_stage(p, measured, rng_for(seed, sample, STREAM_SPECULATIVE)))
        expert_key = ("experts",) + (expert_inputs(p, scn, measured) if p["model.experts"] > 0 else ())
        experts = once(expert_key, lambda: expert_stage(p, scn, measured, rng_for(seed, sample, STREAM_EXPERTS)))
        if p["performance.fidelity"] == "roofline":
            from mcsim.perf.roofline_model import roofline_decode_model

            decode_model = roofline_decode_model(p, measured, passes, experts)
        else:
            decode_model = perf.factor_decode_model(p, measured, passes, experts["expert_efficiency"])
        m = perf.performance(p, measured, cached, passes, decode_model, step_log=step_log)
        m.update(experts)
        m.update(money(p, m))
        results[variant] = m
    return results

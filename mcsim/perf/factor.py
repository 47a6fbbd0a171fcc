"""Stage 5: from the per-request stage outputs to throughput, latency and fleet size.

A fidelity prices decoding as a :class:`DecodeModel` (the time of a verification pass at a batch, the prefill
rate, the KV-memory limit); :func:`performance` turns either fidelity's model into the operating batch, the fleet
and the latencies. The roofline's model is built in :mod:`mcsim.perf.roofline_model`; the factor model is here.

Factor fidelity: decode throughput per GPU at a batch of ``b`` sequences per GPU follows the weight-streaming roofline shape

    X(b) = X_sat * b / (b + b_half)

where ``X_sat`` is the saturated (b -> infinity) throughput and ``b_half = weight-read time / per-sequence time``.
``X_sat`` is the BF16, unoptimised ``efficiency.base_decode_tok_s_per_gpu`` times one factor per lever that is on:
low precision, fused kernels, communication overlap, the realized speculative gain (from the drawn verification
passes), the expert factor (from the drawn rank loads) and, when prefill and decode share GPUs, the loss to their
interference. Each lever is an independent switch.

The operating batch is the largest that fits KV memory, meets the TPOT target and the batch cap. When the traffic
cannot fill the smallest fleet (``deployment.instances`` x ``gpus_per_instance``), the batch is what Little's law
gives instead: concurrency per GPU = arrival rate x decode time per request / GPUs, solved together with X(b).
Static batching runs each batch until its longest request ends: the useful-slot fraction follows from the trace's
output lengths, batch by batch.

Prefill serves only the tokens that are not cached; cached tokens cost their restore time from DRAM (host link)
or NVMe. These factors overlap in reality; the model multiplies them, which is its central simplification.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mcsim.results.variables import QUANTILES
from mcsim.scenario import catalog
from mcsim.stages.speculative import pass_cost

BF16_BYTES = 2.0


def static_slot_utilization(output_tokens: np.ndarray, batch: int) -> float:
    """Useful fraction of decode slots when consecutive groups of ``batch`` requests run until their longest ends.

    Sum of output tokens / sum over batches of (batch size x longest output in the batch).
    """
    batch = max(int(batch), 1)
    n = len(output_tokens)
    if n == 0:
        return 1.0
    full = (n // batch) * batch
    longest = output_tokens[:full].reshape(-1, batch).max(axis=1).sum() * batch if full else 0
    if full < n:
        longest += output_tokens[full:].max() * (n - full)
    return float(output_tokens.sum() / longest)


def expert_factor(expert_efficiency: float, ffn_time_fraction: float) -> float:
    """Decode speed factor when the MoE FFN part of a step waits for the slowest rank (Amdahl)."""
    return 1.0 / ((1.0 - ffn_time_fraction) + ffn_time_fraction / expert_efficiency)


def memory_batch_limit(p: dict, kv_bytes_per_token: float, mean_context: float, block_tokens: int) -> tuple[float, str]:
    """Sequences per decode GPU whose KV fits in HBM after weights, activations and (colocated) prefix cache."""
    gpus = p["deployment.gpus_per_instance"]
    weight_bytes_per_param = p["precision.weight_bytes"] if p["precision.enabled"] else BF16_BYTES
    weights = catalog.weight_bytes(_model(p), weight_bytes_per_param,
                                   include_mtp=bool(p["speculative.enabled"] and p.get("model.mtp_layers", 0)))
    free = p["hardware.hbm_gb"] * 1e9 * p["deployment.memory_fraction"] - weights / gpus \
        - p["deployment.activation_gb_per_gpu"] * 1e9
    if p["cache.enabled"] and not p["deployment.disaggregated"]:
        free -= p["cache.hbm_gb_per_instance"] * 1e9 / gpus
    if free <= 0:
        return 0.0, "weights do not fit in HBM"
    blocks = math.ceil(mean_context / block_tokens)
    per_sequence = kv_bytes_per_token * blocks * block_tokens
    limit = free / per_sequence
    if limit < 1:
        return limit, "KV for one sequence does not fit"
    return limit, "ok"


def hardware_scale(p: dict) -> tuple[float, float]:
    """Factors that carry the base throughputs from ``efficiency.base_hardware`` to the sample's hardware.

    Decode at the batch sizes served is bound by HBM bandwidth (weights and KV are streamed every step), prefill by
    dense matrix throughput: decode scales with ``hbm_tb_s``, prefill with ``bf16_tflops``.
    """
    base = catalog.hardware_preset(p["efficiency.base_hardware"])
    return p["hardware.hbm_tb_s"] / base["hbm_tb_s"], p["hardware.bf16_tflops"] / base["bf16_tflops"]


def _model(p: dict) -> dict:
    return {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("model.")}


def kv_bytes(p: dict) -> float:
    """KV bytes per token of the sample's model at its KV precision."""
    dtype = p["precision.kv_bytes"] if p["precision.enabled"] else BF16_BYTES
    return catalog.kv_bytes_per_token(_model(p), dtype)


@dataclass(frozen=True)
class DecodeModel:
    """How one fidelity prices decoding; :func:`performance` turns it into batch, fleet and latency.

    Attributes
    ----------
    t_pass : callable
        Seconds of one verification pass (decode step) at a batch of ``b`` sequences per decode GPU, counting
        every slot (static batching's finished-but-waiting sequences too).
    tokens_per_pass : float
        Output tokens per sequence per pass, as drawn (1 without speculation).
    b_mem : float
        Sequences per decode GPU whose KV fits; ``reason`` says why a recipe cannot run at all ("ok" if it can).
    x_prefill : float
        Uncached prompt tokens per second per prefill GPU.
    x_saturated : float
        Decode tokens/s per GPU as the batch grows without bound (the denominator of ``batch_efficiency``).
    pass_overhead : callable
        t_pass(b) / the time of a plain one-token decode step at the same batch: the cost of drafting and of
        verifying k+1 tokens (1 without speculation).
    """

    t_pass: Callable[[float], float]
    tokens_per_pass: float
    b_mem: float
    reason: str
    x_prefill: float
    x_saturated: float
    pass_overhead: Callable[[float], float]


def factor_decode_model(p: dict, requests, passes, expert_eff: float) -> DecodeModel:
    """Factor fidelity: ``X(b) = X_sat * b / (b + b_half)``, i.e. a pass costs ``(b + b_half) / X_nospec``."""
    decode_scale, prefill_scale = hardware_scale(p)
    x_nospec = p["efficiency.base_decode_tok_s_per_gpu"] * decode_scale
    if p["precision.enabled"]:
        x_nospec *= p["precision.decode_gain"]
    if p["efficiency.fused_kernels"]:
        x_nospec *= p["efficiency.fused_kernel_gain"]
    if p["efficiency.comm_overlap"]:
        x_nospec *= p["efficiency.comm_overlap_gain"]
    if p["model.experts"] > 0:
        x_nospec *= expert_factor(expert_eff, p["moe.ffn_time_fraction"])
    if not p["deployment.disaggregated"]:
        x_nospec *= 1.0 - p["efficiency.colocated_interference"]
    k = p["speculative.draft_tokens"] if passes is not None else 0
    tpp = tokens_per_pass(requests, passes)
    cost = pass_cost(k, p["speculative.draft_cost"], p["speculative.verify_cost"])
    b_half = p["efficiency.batch_half_saturation"]
    mean_context = float(requests.prompt_tokens.mean() + requests.output_tokens.mean() / 2.0)
    b_mem, reason = memory_batch_limit(p, kv_bytes(p), mean_context, requests.block_tokens)
    x_prefill = p["efficiency.base_prefill_tok_s_per_gpu"] * prefill_scale * (
        p["precision.prefill_gain"] if p["precision.enabled"] else 1.0)
    return DecodeModel(lambda b: (b + b_half) / x_nospec * cost, tpp, b_mem, reason, x_prefill,
                       x_nospec * tpp / cost, lambda b: cost)


def _quantiles(values) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return np.quantile(values, QUANTILES) if values.size else np.full(len(QUANTILES), np.nan)


def tokens_per_pass(requests, passes) -> float:
    """Raw output tokens per verification pass of the trace (1 without speculation)."""
    return 1.0 if passes is None else float(requests.output_tokens.sum()) / float(passes.sum())


def _largest(predicate, lo: float, hi: float) -> float:
    """Largest b in [lo, hi] with predicate(b) true, for a predicate true below a threshold (bisection)."""
    if predicate(hi):
        return hi
    if not predicate(lo):
        return lo
    for _ in range(60):
        mid = 0.5 * (lo + hi)
        if predicate(mid):
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-9 * max(hi, 1.0):
            break
    return lo


def performance(p: dict, requests, cached_tokens: np.ndarray, passes: np.ndarray | None, model: DecodeModel,
                step_log: int = 0) -> dict:
    """Throughput, latency and fleet of one sample, for either fidelity's :class:`DecodeModel`.

    Parameters
    ----------
    p : dict
        Resolved parameters of the sample.
    requests : mcsim.stages.workload.Requests
    cached_tokens : int64[n, 3]
        Reused prompt tokens per tier (zeros when the cache is off).
    passes : int64[n] or None
        Verification passes per request (None when speculative decoding is off).
    model : DecodeModel
    step_log : int
        With the batching simulator, keep its first ``step_log`` steps under ``"_step_log"``.

    Returns
    -------
    dict
        Metric name -> value (see :mod:`mcsim.results.variables`), plus ``busy_fraction`` and token totals for
        economics.
    """
    out_tokens = requests.output_tokens
    prompt = requests.prompt_tokens
    n = requests.n
    duration = requests.duration_s
    total_out = float(out_tokens.sum())
    total_in = float(prompt.sum())
    kvb = kv_bytes(p)
    disagg = bool(p["deployment.disaggregated"])
    g_decode = p["deployment.gpus_per_instance"]
    g_prefill = p["deployment.prefill_gpus_per_instance"] if disagg else g_decode
    instances = p["deployment.instances"]
    passes_r = out_tokens if passes is None else passes
    tpp = model.tokens_per_pass
    t_pass = model.t_pass

    # -- operating batch: KV memory, the TPOT target and the cap -------------------------------------------------
    reason = model.reason
    b_mem = model.b_mem
    hi = max(min(p["deployment.max_batch_per_gpu"], b_mem), 1.0)
    target = p["deployment.tpot_target_s"]
    b_tpot = _largest(lambda b: t_pass(b) / tpp <= target, 1.0, hi)
    if reason == "ok" and t_pass(1.0) / tpp > target:
        reason = "TPOT target not met at batch 1"
    feasible = reason == "ok"
    b_cap = max(min(hi, b_tpot), 1.0)
    static = p["deployment.batching"] == "static"
    slot_util = static_slot_utilization(out_tokens, round(b_cap)) if static else 1.0

    def throughput(b):  # useful decode tokens/s per GPU at batch b
        return slot_util * b * tpp / t_pass(b)

    # -- fleet: prefill work, then decode GPUs (Little's law when the smallest fleet is not full) -------------
    cached = cached_tokens.sum(axis=1)
    miss = prompt - cached
    x_prefill = model.x_prefill
    restore_bytes = cached_tokens[:, 1:] * kvb  # DRAM, NVMe
    host_bw = p["hardware.host_link_gb_s"] * 1e9
    nvme_bw_per_gpu = p["cache.nvme_gb_s_per_node"] * 1e9 / p["hardware.gpus_per_node"]
    prefill_gpu_s = float(miss.sum()) / x_prefill + float(restore_bytes[:, 0].sum()) / host_bw \
        + float(restore_bytes[:, 1].sum()) / nvme_bw_per_gpu
    u = p["economics.target_utilization"]
    demand = total_out / duration  # decode tokens/s
    min_decode = instances * g_decode
    prefill_share = 0.0 if disagg else prefill_gpu_s / duration  # GPUs' worth of prefill on the decode pool
    n_at_cap = demand / (throughput(b_cap) * u) + prefill_share / u
    if n_at_cap >= min_decode:
        decode_gpus, b_op = n_at_cap, b_cap
    else:
        decode_gpus = float(min_decode)
        available = max(min_decode - prefill_share, 1e-9)
        # The batch at which the deployed GPUs just serve the demand (throughput grows with the batch).
        b_op = _largest(lambda b: throughput(b) * available <= demand, 1e-6, b_cap)
    x_op = throughput(b_op)
    decode_gpu_s = total_out / x_op
    if disagg:
        prefill_gpus = max(prefill_gpu_s / duration / u, float(instances * g_prefill))
    else:
        prefill_gpus = 0.0
    gpus = decode_gpus + prefill_gpus
    useful_gpu_s = decode_gpu_s + prefill_gpu_s
    busy = min(useful_gpu_s / (gpus * duration), 1.0)
    # -- latency (factor mode: no queueing) ------------------------------------------------------------------
    pass_s = t_pass(b_op)
    multi = out_tokens > 1  # TPOT is undefined for a one-token output
    tpot = np.where(multi, pass_s * passes_r / out_tokens, np.nan)
    nodes_prefill = max(g_prefill / p["hardware.gpus_per_node"], 1.0)
    ttft = miss / (x_prefill * g_prefill) + restore_bytes[:, 0] / (host_bw * g_prefill) \
        + restore_bytes[:, 1] / (nvme_bw_per_gpu * p["hardware.gpus_per_node"] * nodes_prefill) + pass_s
    transfer_s = prompt * kvb / (p["hardware.scale_out_gb_s"] * 1e9 * g_prefill) \
        + p["efficiency.kv_transfer_latency_s"] if disagg else np.zeros(n)
    ttft = ttft + transfer_s
    decode_time = pass_s * passes_r
    concurrency = (n / duration) * float(decode_time.mean()) / (decode_gpus - prefill_share if not disagg
                                                                 else decode_gpus)

    e2e = ttft + np.where(multi, tpot * (out_tokens - 1), 0.0)
    steps_kept = None
    queue = np.zeros(n)
    saturated, little = 0, math.nan
    if p["performance.simulate_batching"]:
        from mcsim.perf.latency import pool_latencies

        restore_s = restore_bytes[:, 0] / (host_bw * g_prefill) \
            + restore_bytes[:, 1] / (nvme_bw_per_gpu * p["hardware.gpus_per_node"] * nodes_prefill)
        lat = pool_latencies(p, requests, miss, restore_s, transfer_s, passes_r, model, b_cap, b_op, b_mem,
                             decode_gpus, prefill_gpus, max_steps=step_log)
        ttft, tpot, e2e, queue = lat["ttft"], lat["tpot"], lat["e2e"], lat["queue"]
        saturated, little = lat["saturated"], lat["little_law_ratio"]
        steps_kept = lat["step_log"]
    # Host-side costs: request handling, tokenizing the prompt, detokenizing the output; the first streamed chunk
    # waits for stream_interval tokens.
    host_first = p["host.request_overhead_s"] + p["host.tokenize_s_per_token"] * float(prompt.mean())
    stream_wait = (p["host.stream_interval_tokens"] - 1) * np.nan_to_num(tpot)
    ttft = ttft + host_first + stream_wait
    e2e = e2e + host_first + p["host.detokenize_s_per_token"] * float(out_tokens.mean())
    within = np.ones(len(ttft), dtype=bool)
    if p["deployment.ttft_target_s"] > 0:
        within &= ttft <= p["deployment.ttft_target_s"]
    within &= ~(tpot > p["deployment.tpot_target_s"])  # NaN (one-token outputs) never breaks it

    by_tier = cached_tokens.sum(axis=0) / total_in
    return {
        "decode_tok_s_per_gpu": x_op,
        "prefill_tok_s_per_gpu": total_in / prefill_gpu_s if prefill_gpu_s > 0 else math.inf,
        "batch_efficiency": x_op / model.x_saturated,
        "operating_batch_per_gpu": b_op,
        "mean_concurrency_per_gpu": concurrency,
        "max_batch_by_memory": b_mem,
        "spec_tokens_per_pass": tpp / model.pass_overhead(b_op),
        "spec_raw_tokens_per_pass": tpp,
        "cache_hit_rate": float(cached.sum()) / total_in,
        "cache_hit_rate_by_tier": by_tier,
        "restore_gb_per_request_by_tier": np.concatenate([[0.0], restore_bytes.sum(axis=0) / n / 1e9]),
        "kv_bytes_per_token": kvb,
        "ttft_s": _quantiles(ttft),
        "tpot_s": _quantiles(tpot),
        "e2e_s": _quantiles(e2e),
        "queue_wait_s": _quantiles(queue),
        "slo_attainment": float(within.mean()) if len(within) else math.nan,
        "saturated": int(saturated),
        "little_law_ratio": little,
        "gpus": gpus,
        "decode_gpus": decode_gpus,
        "prefill_gpus": prefill_gpus,
        "gpu_hours": useful_gpu_s / 3600.0,
        "feasible": int(feasible),
        "infeasible_reason": reason,
        "busy_fraction": busy,
        "requests": n,
        "mean_input_tokens": total_in / n,
        "mean_output_tokens": total_out / n,
        "trace_duration_s": duration,
        "_hit_tokens": float(cached.sum()),
        "_miss_tokens": float(miss.sum()),
        "_output_tokens": total_out,
        "_step_log": steps_kept,
    }

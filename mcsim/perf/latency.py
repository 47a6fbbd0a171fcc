"""Latency under load: the sample's requests through the continuous-batching simulator, pool by pool.

Used when ``performance.simulate_batching`` is on, for either fidelity. One instance of each pool is simulated
with its share of the traffic: arrival times are stretched by the number of instances of the pool (each instance
sees 1/N of the arrival rate), and latencies come out in real seconds. Step times come from the sample's decode
model (:class:`mcsim.perf.factor.DecodeModel`): a step with ``d`` decode sequences and ``p`` prefill tokens costs one
verification pass at a batch of ``d`` plus ``p`` tokens at the pool's prefill rate, times
``1 + performance.mixed_step_penalty`` when it mixes both.

Colocated: one simulation, prefill chunks and decode passes share the steps. Disaggregated: the prefill pool is
simulated first (prefill-only steps; a request's first token ends its prefill), its KV crosses the network, then
the decode pool is simulated with those arrival times.
"""

from __future__ import annotations

import math

import numpy as np

from mcsim.perf.batching import simulate_batching

#: The simulated requests are at least this many times one instance's expected concurrency ...
MIN_TURNOVER = 30
#: ... but no more than this many (the simulator runs at about a million requests a second).
MAX_REQUESTS = 600_000


def _edges(top: float, n: int) -> np.ndarray:
    top = max(float(top), 1.0)
    return np.unique(np.concatenate([[0.0], np.rint(np.geomspace(1.0, top, n)), [top]]))


def _table(d_edges, p_edges, t_pass, gpus: int, x_prefill: float, mixed_penalty: float) -> np.ndarray:
    table = np.zeros((len(d_edges), len(p_edges)))
    for i, d in enumerate(d_edges):
        for j, tokens in enumerate(p_edges):
            t = (t_pass(d / gpus) if d > 0 else 0.0) + tokens / (x_prefill * gpus)
            table[i, j] = t * (1.0 + mixed_penalty) if d > 0 and tokens > 0 else t
    table[0, 0] = table[table > 0].min() if (table > 0).any() else 1e-6  # an empty step is never simulated
    return table


def pool_latencies(p: dict, requests, miss: np.ndarray, restore_s: np.ndarray, transfer_s: np.ndarray,
                   passes: np.ndarray, model, b_cap: float, b_op: float, b_mem: float, decode_gpus: float,
                   prefill_gpus: float, max_steps: int = 0) -> dict:
    """Per-request TTFT, TPOT (NaN for one-token outputs), E2E and queue wait (s) of the measured requests, plus
    saturation and Little checks.

    Parameters
    ----------
    p : dict
        Resolved parameters of the sample.
    requests : mcsim.stages.workload.Requests
        The measured requests (after warm-up).
    miss : int64[n]
        Prompt tokens to compute (not cached).
    restore_s, transfer_s : float64[n]
        KV restore time from DRAM/NVMe and prefill -> decode transfer time per request.
    passes : int64[n]
        Verification passes per request (output tokens when speculation is off).
    model : mcsim.perf.factor.DecodeModel
    b_cap, b_op, b_mem : float
        Largest allowed batch (the admission cap), expected operating batch and KV-memory limit per decode GPU.
    decode_gpus, prefill_gpus : float
        Pool sizes; prefill_gpus is 0 when colocated.
    max_steps : int
        Keep the first ``max_steps`` steps of the decode (or colocated) simulation as ``step_log``.
    """
    g = p["deployment.gpus_per_instance"]
    limit = p["performance.batching_requests"]
    n = requests.n if limit <= 0 else min(limit, requests.n)
    # A queue reaches its steady state only after many times its concurrency has passed through: when the
    # sample's requests are too few for one instance's expected concurrency, the trace is replayed back to back
    # (same requests, later arrivals) and the first third of the time is left out as warm-up.
    concurrency = max(b_op * g, 1.0)
    reps = int(min(max(1, math.ceil(MIN_TURNOVER * concurrency / n)), max(1, MAX_REQUESTS // n)))
    arrival0 = (requests.arrival_s[:n] - requests.arrival_s[0]).astype(float)
    period = float(arrival0[-1]) * n / max(n - 1, 1) if n > 1 else 1.0
    arrival = np.concatenate([arrival0 + c * period for c in range(reps)])

    def tile(values):
        return np.tile(np.asarray(values)[:n], reps)

    m = n * reps
    out = tile(requests.output_tokens).astype(np.int64)
    context = tile(requests.prompt_tokens).astype(np.int64)
    miss, restore_s, transfer_s, passes = tile(miss), tile(restore_s), tile(transfer_s), tile(passes)
    # Decode steps after the first token (the prefill produces it): the request's passes, less the first one's share.
    decode_passes = np.maximum(np.rint((out - 1) * passes / out), 0).astype(np.int64)
    decode_passes = np.where(out > 1, np.maximum(decode_passes, 1), 0)
    dp = max(g // (p["deployment.tp"] * p["deployment.pp"]), 1)
    budget = int(p["performance.token_budget"]) * dp
    chunk = int(p["performance.chunk_tokens"]) * dp
    block = requests.block_tokens
    max_seqs = max(int(round(b_cap * g)), 1)
    mean_blocks = math.ceil(float(context.mean() + out.mean() / 2) / block)
    kv_blocks = int(max(b_mem, 1.0) * g * mean_blocks)
    kv_blocks = max(kv_blocks, int(np.max(np.ceil((context + out) / block))) + 1)
    policy = "static" if p["deployment.batching"] == "static" else "continuous"
    penalty = p["performance.mixed_step_penalty"]
    users = int(p["performance.closed_loop_users"])
    think = np.random.default_rng(0).exponential(max(p["workload.think_time_s"], 0.0), m) if users else None
    disagg = p["deployment.disaggregated"]

    def run(arrive, prefill_tokens, outputs, decode, table, d_edges, p_edges, seqs, blocks, gpus_in_pool, unit,
            pool_policy=policy):
        n_inst = max(gpus_in_pool / unit, 1.0)
        scaled = arrive * n_inst
        order = np.argsort(scaled, kind="stable")
        res = simulate_batching(
            scaled[order], prefill_tokens[order], context[order], outputs[order], decode[order],
            step_time_table=table, decode_edges=d_edges, prefill_edges=p_edges, token_budget=budget,
            max_seqs=seqs, kv_blocks=blocks, block_tokens=block, chunk_tokens=chunk, policy=pool_policy,
            preempt=bool(p["performance.preempt"]), closed_users=users,
            think_s=None if think is None else think[order] * n_inst, warmup_s=float(np.quantile(scaled, 1 / 3)),
            max_steps=max_steps)
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        per = {k: (v[back] if isinstance(v, np.ndarray) and v.shape == order.shape else v)
               for k, v in res["per_request"].items()}
        return per, {**res["summary"], "step_log": res["step_log"]}

    d_edges = _edges(max_seqs, 16)
    if not disagg:
        p_edges = _edges(budget, 10)
        table = _table(d_edges, p_edges, model.t_pass, g, model.x_prefill, penalty)
        per, summary = run(arrival, np.maximum(miss[:m], 1), out, decode_passes, table, d_edges, p_edges, max_seqs,
                           kv_blocks, decode_gpus, g)
        ttft = per["ttft_s"] + restore_s[:m]
        e2e = per["e2e_s"] + restore_s[:m]
        queue = per["queue_s"]
        measured = per["measured"]
        saturated, little = summary["saturated"], summary["little_law_ratio"]
    else:
        gp = p["deployment.prefill_gpus_per_instance"]
        dp_prefill = max(gp // p["deployment.prefill_tp"], 1)
        p_edges = _edges(int(p["performance.token_budget"]) * dp_prefill, 10)
        table = _table(np.array([0.0, 1.0]), p_edges, model.t_pass, gp, model.x_prefill, 0.0)
        pre, pre_summary = run(arrival, np.maximum(miss[:m], 1), np.ones(m, np.int64), np.zeros(m, np.int64), table,
                               np.array([0.0, 1.0]), p_edges, 1 << 20, 1 << 40, prefill_gpus, gp, "continuous")
        handoff = pre["ttft_s"] + restore_s[:m] + transfer_s[:m]
        table = _table(d_edges, np.array([0.0, 1.0]), model.t_pass, g, model.x_prefill, 0.0)
        dec, summary = run(arrival + handoff / max(decode_gpus / g, 1.0), np.ones(m, np.int64), out, decode_passes,
                           table, d_edges, np.array([0.0, 1.0]), max_seqs, kv_blocks, decode_gpus, g)
        ttft = handoff
        e2e = handoff + dec["e2e_s"]
        queue = pre["queue_s"] + dec["queue_s"]
        measured = pre["measured"] & dec["measured"]
        saturated = pre_summary["saturated"] or summary["saturated"]
        little = summary["little_law_ratio"]
        per = dec
    tpot = np.where(out > 1, (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    return {"ttft": ttft[measured], "tpot": tpot[measured], "e2e": e2e[measured],
            "queue": queue[measured], "saturated": int(bool(saturated)), "little_law_ratio": float(little),
            "mean_decode_batch": float(summary["mean_decode_batch"]), "step_log": summary["step_log"]}

"""What the batching simulators share: their input checks, the step loop's common integer parameters, the
per-request latencies and the summary of a run (latency quantiles, throughput, queueing, saturation, steady state).

The simulators themselves, one instance (:func:`mcsim.perf.fleet_batching.simulate_batching`) and ``K`` replicas
behind a router (:func:`mcsim.perf.fleet_batching.simulate_fleet_batching`), are in :mod:`mcsim.perf.fleet_batching`;
both replay a workload through the step loop (:mod:`mcsim.kernels.step_loop`, whose docstring states every rule).

Saturation. A finite run always drains, so an overloaded instance shows up as a backlog that grows
while requests keep arriving. Over the second half of the measured window, the ratio of arrivals to
completions is ~1 for a stable instance and ~offered/capacity for an overloaded one. The run is
flagged ``saturated`` when that ratio exceeds ``SATURATION_RATIO`` *and* the requests still waiting
when the last one arrives exceed ``SATURATION_BACKLOG`` of the requests that arrived in the window (the
second condition keeps Poisson noise in a short stable run from tripping the flag).

Steady state. A queue that is still settling (or growing) shows as a mean queue wait that changes across the
measured window: the mean wait of the requests arriving in the window's last quarter (by time) minus the third
quarter's, as a share of the mean time in system, is ``queue_steady_state.drift`` (see
:mod:`mcsim.stages.steady_state`, which also estimates the requests a settled run would need).
"""

from __future__ import annotations

import math

import numpy as np

from mcsim.kernels import batching_helpers as slots
from mcsim.stages import steady_state as steady

QUANTILES = (0.5, 0.9, 0.99)
SATURATION_RATIO = 1.05
SATURATION_BACKLOG = 0.05


def check_requests(prefill, context, output, passes) -> None:
    """The per-request checks of every batching simulator (one instance or a fleet)."""
    if np.any(prefill < 1) or np.any(context < prefill):
        raise ValueError("need 1 <= prefill_tokens <= context_tokens")
    if np.any(output < 1):
        raise ValueError("output_tokens must be >= 1")
    if np.any(passes > output - 1) or np.any((passes < 1) & (output > 1)) or np.any(passes < 0):
        raise ValueError("passes must be in [1, output_tokens - 1] (0 for single-token outputs)")


def check_arrivals(arrival, think, closed_users: int) -> None:
    """The arrival checks of every batching simulator: finite (the first ``closed_users`` in a closed loop),
    sorted in an open loop, and think times finite and >= 0."""
    if closed_users < 0:
        raise ValueError("closed_users must be >= 0")
    if not np.all(np.isfinite(arrival[: closed_users or len(arrival)])):
        raise ValueError("arrival_s must be finite")
    if closed_users == 0 and np.any(np.diff(arrival) < 0):
        raise ValueError("arrival_s must be sorted in an open loop")
    if think.shape != arrival.shape or np.any(think < 0) or not np.all(np.isfinite(think)):
        raise ValueError("think_s must be n finite values >= 0")


def check_step_model(d_edges, p_edges, table, slope, kv_ref_context) -> None:
    """The checks of a step-time table, its edges and its KV slope."""
    for edges, name in ((d_edges, "decode_edges"), (p_edges, "prefill_edges")):
        if edges.ndim != 1 or edges.size == 0 or np.any(np.diff(edges) <= 0):
            raise ValueError(f"{name} must be a non-empty strictly increasing 1-D array")
    if table.shape != (d_edges.size, p_edges.size) or not np.all(table > 0) or not np.all(np.isfinite(table)):
        raise ValueError("step_time_table must be finite, > 0 and of shape (len(decode_edges), len(prefill_edges))")
    if slope.shape != d_edges.shape or not np.all(np.isfinite(slope)) or not np.isfinite(kv_ref_context) \
            or kv_ref_context < 0:
        raise ValueError("kv_slope must be finite and of shape (len(decode_edges),); kv_ref_context finite, >= 0")


def base_params(context, output, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                verify_tokens) -> tuple[np.ndarray, int]:
    """The kernel's integer parameters every batching simulator shares, and the KV pool in blocks (all the
    requests' blocks when ``kv_blocks`` is None); a request that cannot fit the pool is an error."""
    full_blocks = (context + output + block_tokens - 1) // block_tokens
    if kv_blocks is None:
        kv_blocks = int(full_blocks.sum())
    if int(full_blocks.max()) > kv_blocks:
        raise ValueError(f"a request needs {int(full_blocks.max())} KV blocks, more than kv_blocks={kv_blocks}")
    params = np.zeros(slots.N_PARAMS, np.int64)
    params[slots.P_TOKEN_BUDGET] = token_budget
    params[slots.P_MAX_SEQS] = max_seqs
    params[slots.P_KV_BLOCKS] = kv_blocks
    params[slots.P_BLOCK_TOKENS] = block_tokens
    params[slots.P_CHUNK_TOKENS] = chunk_tokens
    params[slots.P_VERIFY_TOKENS] = verify_tokens
    return params, kv_blocks


def _as_int(values, name, n):
    array = np.ascontiguousarray(values, dtype=np.int64)
    if array.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},), got {array.shape}")
    return array


def queue_steady_state(per: dict, summary: dict, tolerance: float, period_s: float = 0.0):
    """Queue-wait drift between the third and last quarter (by arrival time) of the measured window, or, under a
    rate profile of period ``period_s``, between the window's last whole periods and as many periods before them
    (:func:`mcsim.stages.steady_state.time_windows`; NaN where the window spans fewer than two periods).

    The drift is normalised by the window's mean time in system, so it is a share (a growing queue gives a drift
    of the order of the window's length over the time in system). The run's first half, taken as a run of its
    own (the same warm-up share of its span), gives the second scale of the estimate of the requests needed; a
    saturated run needs an infinite number.
    """
    order = np.argsort(per["arrival_s"], kind="stable")
    arrival, queue = per["arrival_s"][order], per["queue_s"][order]
    n = len(arrival)
    start, end = summary["window_s"]
    scale = summary["mean_time_in_system_s"]
    if not (end > start and scale > 0) or summary["measured_requests"] < steady.MIN_MEASURED:
        return steady.not_checked(n)
    windows = []
    for lo, hi in steady.time_windows(float(arrival[0]), start, end, period_s):
        if math.isnan(lo):
            windows.append((0, 0))  # too short to compare like with like: an empty window, a NaN ratio
        else:
            edges = np.searchsorted(arrival, [lo, hi], side="right")
            windows.append((int(edges[0]), int(edges[1])))
    result = steady.check(queue / scale, np.ones(n), windows, tolerance)
    if summary["saturated"]:
        return steady.SteadyState(result.drift, result.half_drift, False, math.inf)
    return result


def _per_request(arrival, first_token, finish, queue, output, warmup_s):
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(output > 1, (finish - first_token) / (output - 1), np.nan)
    return {"arrival_s": arrival, "first_token_s": first_token, "finish_s": finish, "queue_s": queue,
            "ttft_s": first_token - arrival, "tpot_s": tpot, "e2e_s": finish - arrival,
            "measured": arrival >= warmup_s}


def _quantiles(values):
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.full(len(QUANTILES), np.nan)
    return np.quantile(values, QUANTILES)


def _summary(per, output, warmup_s, stats):
    measured = per["measured"]
    arrival, finish, e2e = per["arrival_s"], per["finish_s"], per["e2e_s"]
    window_start = float(warmup_s)
    window_end = float(stats[slots.STAT_WINDOW_END_S])
    window = window_end - window_start
    nan = float("nan")
    if window > 0:
        mean_in_system = stats[slots.STAT_IN_SYSTEM_INTEGRAL] / window
        arrival_rate = float(measured.sum()) / window
        finished_in = (finish >= window_start) & (finish <= window_end)
        throughput = float(output[finished_in].sum()) / window
        middle = window_start + 0.5 * window
        late_arrivals = np.count_nonzero((arrival >= middle) & (arrival <= window_end))
        late_completions = np.count_nonzero((finish >= middle) & (finish <= window_end))
        completion_ratio = late_arrivals / late_completions if late_completions else float("inf")
    else:
        mean_in_system = arrival_rate = throughput = completion_ratio = nan
    mean_time = float(e2e[measured].mean()) if measured.any() else nan
    waiting_at_end = int(stats[slots.STAT_WAITING_AT_WINDOW_END])
    saturated = bool(completion_ratio > SATURATION_RATIO
                     and waiting_at_end > SATURATION_BACKLOG * max(int(measured.sum()), 1))
    window_steps = stats[slots.STAT_WINDOW_STEPS]
    decode_steps = stats[slots.STAT_WINDOW_DECODE_STEPS]
    return {
        "quantiles": np.array(QUANTILES),
        "ttft_s": _quantiles(per["ttft_s"][measured]),
        "tpot_s": _quantiles(per["tpot_s"][measured]),
        "e2e_s": _quantiles(e2e[measured]),
        "queue_s_mean": float(per["queue_s"][measured].mean()) if measured.any() else nan,
        "queue_s_p99": float(np.quantile(per["queue_s"][measured], 0.99)) if measured.any() else nan,
        "measured_requests": int(measured.sum()),
        "window_s": (window_start, window_end),
        "throughput_tok_s": throughput,
        "arrival_rate_per_s": arrival_rate,
        "mean_in_system": mean_in_system,
        "mean_time_in_system_s": mean_time,
        "little_law_ratio": mean_in_system / (arrival_rate * mean_time) if arrival_rate * mean_time > 0 else nan,
        "completion_ratio": completion_ratio,
        "waiting_at_window_end": waiting_at_end,
        "saturated": saturated,
        "mean_decode_batch": stats[slots.STAT_WINDOW_DECODE_SEQS_SUM] / decode_steps if decode_steps else nan,
        "mean_step_s": stats[slots.STAT_WINDOW_STEP_S_SUM] / window_steps if window_steps else nan,
        "busy_fraction": min(stats[slots.STAT_WINDOW_STEP_S_SUM] / window, 1.0) if window > 0 else nan,
        "steps": int(stats[slots.STAT_STEPS]),
        "preemptions": int(stats[slots.STAT_PREEMPTIONS]),
    }

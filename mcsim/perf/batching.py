"""Latency under load: TTFT, TPOT and E2E from a step-level simulation of one serving instance.

The roofline (or any performance model) supplies step times as a table over (decoding sequences,
prefill tokens in the step); :func:`simulate_batching` replays a workload through the step loop
(:mod:`mcsim.kernels.step_loop`, whose docstring states every rule) with one instance, under any scheduler policy,
and summarises per-request latencies, throughput and queueing.

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
from mcsim.kernels import step_loop as kernel
from mcsim.perf import policies
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


def simulate_batching(
    arrival_s,
    prefill_tokens,
    context_tokens,
    output_tokens,
    passes=None,
    *,
    step_time_table,
    decode_edges,
    prefill_edges,
    kv_slope=None,
    kv_ref_context: float = 0.0,
    token_budget: int = 8192,
    max_seqs: int = 256,
    kv_blocks: int | None = None,
    block_tokens: int = 16,
    chunk_tokens: int = 0,
    verify_tokens: int = 1,
    policy: str = "continuous",
    priority=None,
    max_new_per_step: int = 0,
    preempt: bool = True,
    closed_users: int = 0,
    think_s=None,
    warmup_s: float = 0.0,
    max_steps: int = 0,
    steady_tolerance: float = 0.1,
) -> dict:
    """Simulate one serving instance and summarise latency, throughput and queueing.

    Parameters
    ----------
    arrival_s : array_like of float, shape (n,)
        Arrival times, s; sorted in an open loop. In a closed loop only the first ``closed_users`` are used.
    prefill_tokens : array_like of int, shape (n,)
        Prompt tokens to compute (uncached part), >= 1.
    context_tokens : array_like of int, shape (n,)
        Full prompt length, tokens (>= prefill_tokens); sets the KV footprint.
    output_tokens : array_like of int, shape (n,)
        Tokens generated, >= 1.
    passes : array_like of int, shape (n,), optional
        Decode passes after the first token (from the speculative stage); default ``output_tokens - 1``.
    step_time_table : array_like of float, shape (len(decode_edges), len(prefill_edges))
        Step time, s, at each (decoding sequences, prefill tokens) pair; interpolated bilinearly, clamped.
    decode_edges, prefill_edges : array_like of float
        Strictly increasing grids of the table (sequences; tokens).
    kv_slope : array_like of float, shape (len(decode_edges),), optional
        Seconds one more KV token of a decoding sequence adds to a step, at each decode edge: the step then
        pays for the batch's own KV lengths instead of the table's ``kv_ref_context`` per sequence (default 0:
        the table alone).
    kv_ref_context : float
        KV length per decoding sequence at which the table was computed, tokens.
    token_budget : int
        Tokens one step may process (decodes at ``verify_tokens`` each, then prefill chunks).
    max_seqs : int
        Concurrent sequences (a static batch's size limit).
    kv_blocks : int, optional
        KV pool, in blocks of ``block_tokens``; default: room for every request at once.
    block_tokens : int
        Tokens per KV block.
    chunk_tokens : int
        Cap on one request's prefill chunk per step, tokens; 0 = only the budget caps it.
    verify_tokens : int
        Tokens a decoding sequence costs per step (``k + 1`` with ``k`` draft tokens, else 1).
    policy : str
        A scheduler policy of :data:`mcsim.perf.policies.POLICIES` (``"fcfs"``, ``"priority"``,
        ``"shortest-prompt-first"``, ``"exclusive-prefill"``, ``"chunked-prefill"``, ``"static"``);
        ``"continuous"`` is ``"fcfs"``.
    priority : array_like of int, shape (n,), optional
        Priority of each request's workload class, higher served first (the ``"priority"`` policy; default 0).
    max_new_per_step : int
        Sequences admitted per step at most under a continuous policy (0 = the policy's own cap, or none).
    preempt : bool
        Continuous policy: grow KV as sequences generate and preempt (recompute) the newest sequence when
        the pool runs out, as vLLM does; False reserves each request's final size at admission.
    closed_users : int
        0: open loop. Otherwise request ``r >= closed_users`` arrives ``think_s[r]`` s after request
        ``r - closed_users`` finishes.
    think_s : array_like of float, shape (n,), optional
        Think times of the closed loop, s (default 0).
    warmup_s : float
        Requests arriving earlier are simulated but excluded from the statistics, s.
    max_steps : int
        Record the first ``max_steps`` steps in ``step_log`` (0: no log).
    steady_tolerance : float
        Largest queue-wait drift (share of the mean time in system) that counts as steady.

    Returns
    -------
    dict
        ``per_request``: dict of arrays ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s``,
        ``ttft_s``, ``tpot_s`` (nan for single-token outputs), ``e2e_s``, ``measured`` (bool).
        ``summary``: ``quantiles``; ``ttft_s``, ``tpot_s``, ``e2e_s`` (one value per quantile, over
        measured requests); ``queue_s_mean``, ``queue_s_p99``; ``measured_requests``; ``window_s``
        (start, end); ``throughput_tok_s`` (output tokens of requests finishing in the window per second
        of window); ``arrival_rate_per_s``; ``mean_in_system`` (time average of waiting + running);
        ``mean_time_in_system_s``; ``little_law_ratio`` (mean_in_system / (arrival rate x mean time in
        system); ~1); ``completion_ratio`` (arrivals / completions over the window's second half);
        ``waiting_at_window_end``; ``saturated``; ``queue_steady_state`` (a
        :class:`~mcsim.stages.steady_state.SteadyState`: queue-wait drift, verdict, requests needed);
        ``mean_decode_batch``; ``mean_step_s``; ``busy_fraction`` (summed
        step time over the window / the window: the share of time the instance computes); ``steps``;
        ``preemptions``.
        ``step_log``: dict of per-step arrays ``start_s``, ``decode_seqs``, ``prefill_tokens``, ``step_s``,
        ``waiting`` (None when ``max_steps == 0``).

    Examples
    --------
    >>> table = [[0.02, 0.03], [0.04, 0.05]]
    >>> result = simulate_batching([0.0, 10.0], [100, 100], [100, 100], [3, 3], step_time_table=table,
    ...                            decode_edges=[1, 256], prefill_edges=[0, 8192])
    >>> [round(float(x), 4) for x in result["per_request"]["e2e_s"]]  # prefill step, then 2 decode steps
    [0.0601, 0.0601]
    """
    arrival = np.ascontiguousarray(arrival_s, dtype=np.float64)
    n = arrival.shape[0]
    if arrival.ndim != 1 or n == 0:
        raise ValueError("arrival_s must be a non-empty 1-D array")
    prefill = _as_int(prefill_tokens, "prefill_tokens", n)
    context = _as_int(context_tokens, "context_tokens", n)
    output = _as_int(output_tokens, "output_tokens", n)
    passes = output - 1 if passes is None else _as_int(passes, "passes", n)
    think = np.zeros(n) if think_s is None else np.ascontiguousarray(think_s, dtype=np.float64)
    table = np.ascontiguousarray(step_time_table, dtype=np.float64)
    d_edges = np.ascontiguousarray(decode_edges, dtype=np.float64)
    p_edges = np.ascontiguousarray(prefill_edges, dtype=np.float64)
    slope = np.zeros(d_edges.shape) if kv_slope is None else np.ascontiguousarray(kv_slope, dtype=np.float64)

    check_arrivals(arrival, think, closed_users)
    check_requests(prefill, context, output, passes)
    check_step_model(d_edges, p_edges, table, slope, kv_ref_context)
    scheduler = policies.get(policy)
    if priority is not None:
        priority = _as_int(priority, "priority", n)
    if max_new_per_step < 0:
        raise ValueError("max_new_per_step must be >= 0")
    if min(token_budget, max_seqs, block_tokens, verify_tokens) < 1 or min(chunk_tokens, closed_users) < 0:
        raise ValueError("token_budget, max_seqs, block_tokens, verify_tokens must be >= 1; chunk_tokens, "
                         "closed_users >= 0")
    params, kv_blocks = base_params(context, output, token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens,
                                    verify_tokens)
    codes = scheduler.codes(max_new_per_step)
    params[slots.P_POLICY] = codes["admission"]
    params[slots.P_ORDER] = codes["order"]
    params[slots.P_MIXING] = codes["mixing"]
    params[slots.P_MAX_NEW] = codes["max_new_per_step"]
    params[slots.P_PREEMPT] = int(bool(preempt))
    params[slots.P_CLOSED_USERS] = closed_users
    params[slots.P_ROUTE_PICK] = slots.PICK_GIVEN  # the one instance of the step loop
    queue_key = scheduler.queue_key(prefill, priority)

    arrival_out, first_token, finish, queue = (np.empty(n) for _ in range(4))
    stats = np.zeros(slots.N_STATS)
    log = {"start_s": np.empty((1, max_steps)), "decode_seqs": np.empty((1, max_steps), np.int64),
           "prefill_tokens": np.empty((1, max_steps), np.int64), "step_s": np.empty((1, max_steps)),
           "waiting": np.empty((1, max_steps), np.int64)}
    zeros = np.zeros(n, np.int64)
    status = kernel.simulate(arrival, prefill, context, output, passes, think, zeros, queue_key, False,
                             np.zeros(n + 1, np.int64), zeros[:0], 1, np.zeros(1, np.int64), False, params, 0.0, 0,
                             float(warmup_s), -1, table, d_edges, p_edges, slope, float(kv_ref_context),
                             np.empty((0, 4), np.int32), arrival_out, np.empty(n, np.int64), first_token, finish,
                             queue, np.empty((n, 1), np.int64), np.zeros(1, np.int64), stats, log["start_s"],
                             log["decode_seqs"], log["prefill_tokens"], log["step_s"], log["waiting"])
    if status != kernel.STATUS_OK:
        raise RuntimeError("the batching simulation stalled (a step with nothing to run)")
    steps = int(stats[slots.STAT_STEPS])
    step_log = None if max_steps == 0 else {key: value[0, : min(steps, max_steps)] for key, value in log.items()}
    per_request = _per_request(arrival_out, first_token, finish, queue, output, warmup_s)
    summary = _summary(per_request, output, warmup_s, stats, slots)
    summary["queue_steady_state"] = queue_steady_state(per_request, summary, float(steady_tolerance))
    return {"per_request": per_request, "summary": summary, "step_log": step_log}


def queue_steady_state(per: dict, summary: dict, tolerance: float):
    """Queue-wait drift between the third and last quarter (by arrival time) of the measured window.

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
    first = float(arrival[0])
    half_end = first + 0.5 * (end - first)
    half_start = first + (start - first) / (end - first) * (half_end - first)
    windows = []
    for lo, hi in ((start, end), (half_start, half_end)):
        edges = np.searchsorted(arrival, [lo + 0.5 * (hi - lo), lo + 0.75 * (hi - lo), hi], side="right")
        windows += [(int(edges[0]), int(edges[1])), (int(edges[1]), int(edges[2]))]
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


def _summary(per, output, warmup_s, stats, kernel):
    measured = per["measured"]
    arrival, finish, e2e = per["arrival_s"], per["finish_s"], per["e2e_s"]
    window_start = float(warmup_s)
    window_end = float(stats[kernel.STAT_WINDOW_END_S])
    window = window_end - window_start
    nan = float("nan")
    if window > 0:
        mean_in_system = stats[kernel.STAT_IN_SYSTEM_INTEGRAL] / window
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
    waiting_at_end = int(stats[kernel.STAT_WAITING_AT_WINDOW_END])
    saturated = bool(completion_ratio > SATURATION_RATIO
                     and waiting_at_end > SATURATION_BACKLOG * max(int(measured.sum()), 1))
    window_steps = stats[kernel.STAT_WINDOW_STEPS]
    decode_steps = stats[kernel.STAT_WINDOW_DECODE_STEPS]
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
        "mean_decode_batch": stats[kernel.STAT_WINDOW_DECODE_SEQS_SUM] / decode_steps if decode_steps else nan,
        "mean_step_s": stats[kernel.STAT_WINDOW_STEP_S_SUM] / window_steps if window_steps else nan,
        "busy_fraction": min(stats[kernel.STAT_WINDOW_STEP_S_SUM] / window, 1.0) if window > 0 else nan,
        "steps": int(stats[kernel.STAT_STEPS]),
        "preemptions": int(stats[kernel.STAT_PREEMPTIONS]),
    }

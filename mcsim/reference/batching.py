"""Reference for :mod:`mcsim.kernels.step_loop` with one instance: one serving instance, the fleet reference with one replica.

The one event loop of the batching simulators is :func:`mcsim.reference.fleet_batching.simulate_fleet_reference`
(its instances' step rules in :mod:`mcsim.reference.step_loop`). One instance is that loop with one replica, no
prefix cache and the prompt equal to the tokens to prefill; this module only maps the one-instance kernel's
arguments and results onto it.

Examples
--------
>>> table = {"step_time_table": [[0.25]], "decode_edges": [1.0], "prefill_edges": [0.0]}
>>> run = simulate_reference([0.0], [10], [10], [3], [2], [0.0], token_budget=64, max_seqs=4, kv_blocks=10,
...                          block_tokens=16, chunk_tokens=0, verify_tokens=1, policy="continuous", preempt=False,
...                          closed_users=0, warmup_s=0.0, **table)
>>> run["finish_s"], run["steps"]  # one prefill step and two decode steps
([0.75], 3)
"""

from __future__ import annotations

from mcsim.reference.fleet_batching import policy_of, simulate_fleet_reference


def simulate_reference(
    arrival_s,
    prefill_tokens,
    context_tokens,
    output_tokens,
    passes,
    think_s,
    *,
    token_budget,
    max_seqs,
    kv_blocks,
    block_tokens,
    chunk_tokens,
    verify_tokens,
    policy,
    preempt,
    order="fcfs",
    queue_key=None,
    mixing="mixed",
    max_new_per_step=0,
    closed_users,
    warmup_s,
    step_time_table,
    decode_edges,
    prefill_edges,
    kv_slope=None,
    kv_ref_context=0.0,
):
    """Simulate one serving instance step by step.

    Parameters
    ----------
    arrival_s, prefill_tokens, context_tokens, output_tokens, passes, think_s : sequences, one per request
        As in :func:`mcsim.kernels.step_loop.simulate`.
    token_budget, max_seqs, kv_blocks, block_tokens, chunk_tokens, verify_tokens : int
        The scheduler settings.
    policy : {"continuous", "static"}
        Admission (the :class:`mcsim.scenario.policies.Policy` field).
    preempt : bool
        KV growth and preemption by recompute (continuous only).
    order, queue_key, mixing, max_new_per_step : optional
        The other policy fields by name: ``order`` (``"fcfs"``, or ``"priority"`` / ``"shortest-prompt"``: the
        waiting request with the lowest ``(queue_key, rank of arrival)`` is the head), ``mixing``
        (``"mixed"`` or ``"exclusive"``), ``max_new_per_step`` (0 = no cap).
    closed_users, warmup_s : int, float
        A closed loop of that many users (0: open loop); the start of the measured window.
    step_time_table, decode_edges, prefill_edges, kv_slope, kv_ref_context
        The step-time model.

    Returns
    -------
    dict
        ``arrival_s``, ``first_token_s``, ``finish_s``, ``queue_s`` (lists of float, one per request),
        ``steps``, ``preemptions``, ``window_end_s`` (the start of the step at which the last request has
        arrived, or its arrival if the instance was idle), ``in_system_integral``, ``window_steps``,
        ``window_step_s_sum``, ``window_decode_seqs_sum``, ``window_decode_steps``, ``waiting_at_window_end``,
        ``end_s`` and ``log``: one ``(start_s, decode_seqs, prefill_tokens, step_s, waiting)`` tuple per step.
    """
    n = len(arrival_s)
    run = simulate_fleet_reference(
        arrival_s, prefill_tokens, context_tokens, output_tokens, passes, [0.0] * n, n_instances=1,
        router="round-robin", token_budget=token_budget, max_seqs=max_seqs, kv_blocks=kv_blocks,
        block_tokens=block_tokens, chunk_tokens=chunk_tokens, verify_tokens=verify_tokens,
        step_time_table=step_time_table, decode_edges=decode_edges, prefill_edges=prefill_edges, kv_slope=kv_slope,
        kv_ref_context=kv_ref_context, warmup_s=float(warmup_s), preempt=bool(preempt),
        max_new_per_step=max_new_per_step, policy=policy_of(policy, order, mixing),
        queue_key=[0] * n if queue_key is None else queue_key, keyed_tie="arrival", closed_users=closed_users,
        think_s=think_s)
    stats = run["stats"]
    return dict(
        arrival_s=run["arrival_s"], first_token_s=run["first_token_s"], finish_s=run["finish_s"],
        queue_s=run["queue_s"], log=[row[:5] for row in run["log"]], steps=stats["steps"],
        preemptions=stats["preemptions"], window_end_s=stats["window_close_s"],
        in_system_integral=stats["in_system_integral"], window_steps=stats["window_steps"],
        window_step_s_sum=stats["window_step_s_sum"], window_decode_seqs_sum=float(stats["window_decode_seqs_sum"]),
        window_decode_steps=stats["window_decode_steps"], waiting_at_window_end=stats["waiting_at_window_end"],
        end_s=stats["end_s"])

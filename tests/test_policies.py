"""Scheduler policies: every entry of the table against the event-loop reference, and what each policy promises."""

from __future__ import annotations

import numpy as np
import pytest

from mcsim.scenario import policies
from mcsim.perf.fleet_batching import simulate_batching
from mcsim.reference.batching import simulate_reference
from helpers import TABLE, random_settings, random_workload


def reference_for(policy: policies.Policy, arrival, prefill, context, output, passes, think, priority, settings,
                  warmup_s, max_new_per_step):
    """The reference run of ``policy``: the table entry's fields, by name."""
    args = {k: v for k, v in settings.items() if k != "policy"}
    return simulate_reference(arrival, prefill, context, output, passes, think, warmup_s=warmup_s, **TABLE, **args,
                              policy=policy.admission, order=policy.order,
                              queue_key=policy.queue_key(prefill, priority), mixing=policy.mixing,
                              max_new_per_step=max_new_per_step or policy.max_new_per_step)


@pytest.mark.parametrize("name", list(policies.POLICIES))
def test_every_policy_matches_the_reference_exactly(name):
    policy = policies.POLICIES[name]
    mixed_steps = reordered = 0
    for seed in range(30):
        rng = np.random.default_rng([seed, 11])
        n = int(rng.integers(1, 50))
        arrival, prefill, context, output, passes, think = random_workload(rng, n, rng.uniform(20.0, 400.0))
        preempt = policy.admission == "continuous" and bool(seed % 2)
        closed_users = 3 if seed % 5 == 4 else 0
        settings = random_settings(rng, output, context, policy=name, preempt=preempt, closed_users=closed_users)
        priority = rng.integers(0, 3, n)
        max_new = int(rng.integers(0, 3))
        warmup_s = float(arrival[n // 4])
        result = simulate_batching(arrival, prefill, context, output, passes, think_s=think, warmup_s=warmup_s,
                                   max_steps=100_000, priority=priority, max_new_per_step=max_new, **TABLE,
                                   **settings)
        reference = reference_for(policy, arrival, prefill, context, output, passes, think, priority, settings,
                                  warmup_s, max_new)
        per_request, summary = result["per_request"], result["summary"]
        for key in ("arrival_s", "first_token_s", "finish_s", "queue_s"):
            np.testing.assert_array_equal(per_request[key], np.array(reference[key]), err_msg=f"{key}, seed {seed}")
        log = result["step_log"]
        kernel_log = list(zip(log["start_s"].tolist(), log["decode_seqs"].tolist(), log["prefill_tokens"].tolist(),
                              log["step_s"].tolist(), log["waiting"].tolist(), strict=True))
        assert kernel_log == reference["log"], f"seed {seed}"
        assert summary["steps"] == reference["steps"]
        assert summary["preemptions"] == reference["preemptions"]
        mixed_steps += int(np.count_nonzero((log["prefill_tokens"] > 0) & (log["decode_seqs"] > 0)))
        admitted_order = np.argsort(per_request["arrival_s"] + per_request["queue_s"], kind="stable")
        reordered += int(np.any(np.diff(per_request["arrival_s"][admitted_order]) < 0))
    # What the table promises: exclusive steps never mix; keyed orders serve some requests out of arrival order.
    assert (mixed_steps == 0) == (policy.mixing == "exclusive" or policy.admission == "static")
    if policy.order != "fcfs":
        assert reordered > 0


def test_admission_cap_admits_at_most_that_many_per_step():
    # Ten requests at t = 0 with room for all: FCFS admits every one in the first step, a cap of 2 two per step.
    args = (np.zeros(10), [50] * 10, [50] * 10, [20] * 10)
    for cap, admitted_first in ((0, 10), (2, 2)):
        result = simulate_batching(*args, max_new_per_step=cap, max_steps=10, **TABLE)
        waiting = result["step_log"]["waiting"]
        assert waiting[0] == 10 - admitted_first
        if cap:
            assert waiting[:5].tolist() == [8, 6, 4, 2, 0]


def test_shortest_prompt_first_serves_the_shortest_waiting_prompt():
    # One sequence at a time: after the first request, the waiting ones are served by prompt length.
    prefill = np.array([100, 400, 300, 200, 50])
    result = simulate_batching(np.zeros(5) + np.arange(5) * 1e-9, prefill, prefill, [5] * 5, max_seqs=1,
                               policy="shortest-prompt-first", **TABLE)
    first = result["per_request"]["first_token_s"]
    assert np.argsort(first).tolist() == [0, 4, 3, 2, 1]


def loaded_two_class_case():
    """A loaded instance (about 90 % busy) serving two classes: a quarter of requests are class 1."""
    rng = np.random.default_rng(5)
    n = 4000
    arrival = np.cumsum(rng.exponential(1 / 7.0, n))
    prefill = rng.integers(500, 3000, n)
    output = rng.integers(20, 200, n)
    cls = (rng.random(n) < 0.25).astype(np.int64)
    settings = dict(token_budget=2048, max_seqs=16, kv_blocks=2000, block_tokens=16, chunk_tokens=512,
                    verify_tokens=1, preempt=True, closed_users=0)
    return arrival, prefill, output, cls, settings


def test_priority_gives_its_high_class_a_lower_p99_ttft_than_fcfs():
    arrival, prefill, output, cls, settings = loaded_two_class_case()
    warmup_s = float(arrival[len(arrival) // 5])
    p99 = {}
    for name in ("fcfs", "priority"):
        result = simulate_batching(arrival, prefill, prefill, output, warmup_s=warmup_s, policy=name, priority=cls,
                                   **TABLE, **settings)
        per = result["per_request"]
        assert result["summary"]["busy_fraction"] > 0.8 and not result["summary"]["saturated"]
        high = per["measured"] & (cls == 1)
        p99[name] = float(np.quantile(per["ttft_s"][high], 0.99))
        low = per["measured"] & (cls == 0)
        p99[name + " low"] = float(np.quantile(per["ttft_s"][low], 0.99))
        # the same schedule, request by request, in the reference
        policy = policies.get(name)
        ref = simulate_reference(arrival, prefill, prefill, output, output - 1, np.zeros(len(arrival)),
                                 warmup_s=warmup_s, **TABLE, **settings, policy="continuous", order=policy.order,
                                 queue_key=policy.queue_key(prefill, cls), mixing=policy.mixing)
        np.testing.assert_array_equal(per["first_token_s"], ref["first_token_s"])
        np.testing.assert_array_equal(per["finish_s"], ref["finish_s"])
    assert p99["priority"] < 0.5 * p99["fcfs"]
    assert p99["priority low"] > p99["fcfs low"]  # what the high class gains, the low class pays


def test_table_names_match_the_scenario_choices():
    from mcsim.scenario.schema import SECTIONS

    assert set(SECTIONS["deployment"]["scheduler"].choices) == set(policies.SCHEDULERS)
    assert policies.policy_for("static", "priority").name == "static"
    assert policies.get("continuous") is policies.POLICIES["fcfs"]
    with pytest.raises(ValueError, match="unknown scheduler policy"):
        policies.get("lifo")


def test_per_class_latency_on_the_workload_class_dim_of_a_sweep():
    # A sweep over the scheduler: every grid point carries the scenario's classes on workload_class, and under
    # priority the class given priority waits less at its p99 than the others (the per-class figures are each
    # class's own requests: a class-less run's ttft_s lies between them).
    import mcsim.execution.api as api

    root = __import__("pathlib").Path(__file__).resolve().parents[1]
    ds = api.sweep(root / "scenarios" / "factory.toml", ["deployment.scheduler=fcfs,priority"], samples=1,
                   requests=3000, workers=1, overrides=["performance.simulate_batching=true",
                                                        "workload.classes.code.priority=1",
                                                        "mc.warmup_fraction=0.25"])
    assert ds["ttft_s_by_class"].dims[-2:] == ("workload_class", "request_quantile")
    assert list(ds["workload_class"].values) == ["chat", "code", "reasoning"]
    assert ds["workload_class"].attrs["units"] == "1"
    p99 = ds["ttft_s_by_class"].sel(request_quantile=0.99).isel(sample=0)
    assert float(p99.sel(deployment_scheduler="priority", workload_class="code")) < \
        float(p99.sel(deployment_scheduler="fcfs", workload_class="code"))
    assert float(p99.sel(deployment_scheduler="priority", workload_class="code")) < \
        float(p99.sel(deployment_scheduler="priority", workload_class="chat"))
    attained = ds["slo_attainment_by_class"].isel(sample=0)
    assert attained.dims == ("deployment_scheduler", "workload_class")
    assert np.all((attained >= 0) & (attained <= 1))

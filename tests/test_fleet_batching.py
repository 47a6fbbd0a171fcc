"""Fleet of replicas behind a router: kernel vs the fleet event-loop reference, one replica vs the one-instance
reference, and least-outstanding routing against random routing."""

from __future__ import annotations

import numpy as np
import pytest

from helpers import DECODE_EDGES, TABLE, random_blocks, random_settings, random_workload

from mcsim.perf.fleet_batching import REPLICA_SCHEDULERS, ROUTERS, affinity_instances, simulate_fleet_batching
from mcsim.reference.batching import simulate_reference
from mcsim.reference.fleet_batching import simulate_fleet_reference


@pytest.mark.parametrize("router", ROUTERS)
def test_kernel_matches_fleet_reference_exactly(router):
    """Every request's instance, times and reused tokens per tier, every instance's steps, and the window's
    sums, with and without prefix caches (small tiers that evict, absent tiers; 0 to 3 of the last tiers
    pooled)."""
    for seed in range(40):
        rng = np.random.default_rng([seed, ROUTERS.index(router)])
        n = int(rng.integers(1, 60))
        n_instances = int(rng.integers(1, 6))
        arrival, _, _, output, passes = random_workload(rng, n, rng.uniform(5.0, 400.0), ties=True, think=False)[:5]
        block_tokens = int(rng.integers(1, 32))
        lists, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
        settings = random_settings(rng, output, prompt)
        settings["block_tokens"] = block_tokens
        settings["kv_blocks"] = int(((prompt + output + block_tokens - 1) // block_tokens).max()) \
            + int(rng.integers(0, 40))
        capacity = (0, 0, 0) if seed % 4 == 0 else tuple(int(c) for c in rng.integers([1, 0, 0], [12, 8, 8]))
        cache = {"capacity_blocks": capacity, "pooled_tiers": (seed // 4) % 4, "balance": float(rng.uniform(0, 1)),
                 "balance_requests": int(rng.integers(0, 4)), "preempt": seed % 3 == 1,
                 "max_new_per_step": int(rng.integers(0, 3)) if seed % 5 == 2 else 0,
                 "policy": REPLICA_SCHEDULERS[seed % len(REPLICA_SCHEDULERS)],
                 "priority": rng.integers(0, 3, n)}
        uniform = rng.uniform(size=n)
        affinity = affinity_instances(ptr, ids, uniform, n_instances)
        kv_slope = rng.uniform(0.0, 1e-5, DECODE_EDGES.size) if seed % 2 else None
        warmup_s = float(rng.uniform(0, arrival[-1]))
        loop = {}
        if seed % 6 == 5:  # a closed loop of a few users, thinking between requests; the window from a request
            users = int(rng.integers(1, 8))
            loop = {"closed_users": users, "think_s": rng.exponential(0.05, n)}
            window = {"measured_from": int(rng.integers(0, n))}
        else:
            window = {"warmup_s": warmup_s}
        result = simulate_fleet_batching(arrival, prompt, prompt, output, passes, n_instances=n_instances,
                                         router=router, router_uniform=uniform, block_ptr=ptr, block_ids=ids,
                                         kv_slope=kv_slope, kv_ref_context=50.0, **window, **loop, **cache,
                                         **TABLE, **settings)
        if "measured_from" in window:  # the reference starts its window at that request's arrival as well
            window = {"warmup_request": window["measured_from"]}
        reference = simulate_fleet_reference(arrival, prompt, prompt, output, passes, uniform,
                                             n_instances=n_instances, router=router, kv_slope=kv_slope,
                                             kv_ref_context=50.0, block_lists=lists, fixed_instance=affinity,
                                             **window, **loop, **cache, **TABLE, **settings)
        per_request, summary, stats = result["per_request"], result["summary"], reference["stats"]
        np.testing.assert_array_equal(per_request["instance"], reference["instance"], err_msg=f"seed {seed}")
        for key in ("arrival_s", "first_token_s", "finish_s", "queue_s"):
            if kv_slope is None:
                np.testing.assert_array_equal(per_request[key], reference[key], err_msg=f"{key}, seed {seed}")
            else:  # the kernel keeps the KV sum step by step, the reference sums it afresh: equal up to rounding
                np.testing.assert_allclose(per_request[key], reference[key], rtol=1e-9, atol=1e-12,
                                           err_msg=f"{key}, seed {seed}")
        np.testing.assert_array_equal(per_request["cached_tokens"], np.array(reference["cached"]).reshape(n, 3))
        np.testing.assert_array_equal(summary["instance_steps"], reference["instance_steps"])
        assert summary["steps"] == stats["steps"]
        assert summary["preemptions"] == stats["preemptions"]
        assert summary["waiting_at_window_end"] == stats["waiting_at_window_end"]
        start = float(result["per_request"]["arrival_s"][window["warmup_request"]]) if "warmup_request" in window \
            else warmup_s
        window = stats["window_close_s"] - start
        assert summary["window_s"][1] == pytest.approx(stats["window_close_s"], rel=1e-9)
        if window > 0:
            assert summary["mean_in_system"] == pytest.approx(stats["in_system_integral"] / window, rel=1e-12)
            assert summary["busy_fraction"] == pytest.approx(
                min(stats["window_step_s_sum"] / (n_instances * window), 1.0), rel=1e-12)
        if stats["window_decode_steps"]:
            assert summary["mean_decode_batch"] == pytest.approx(
                stats["window_decode_seqs_sum"] / stats["window_decode_steps"], rel=1e-12)


def test_a_pooled_cache_sees_the_fleet_admissions_in_time_order():
    """One cache shared by every replica: when each request is served before the next arrives, admissions come
    in arrival order whatever instance admits them, so the hits are the tier reference's replay of one cache of
    all the replicas' capacity."""
    from mcsim.reference.kv_tiers import lookup_tiers_reference

    for seed in range(10):
        rng = np.random.default_rng([seed, 11])
        n, k, block_tokens = int(rng.integers(5, 60)), int(rng.integers(2, 6)), int(rng.integers(1, 8))
        lists, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
        arrival = np.arange(n) * 100.0  # steps take well under a second: the fleet is idle at every arrival
        capacity = tuple(int(c) for c in rng.integers([1, 0, 0], [4, 3, 3]))
        result = simulate_fleet_batching(arrival, prompt, prompt, np.full(n, 3), n_instances=k, router="pooled",
                                         block_ptr=ptr, block_ids=ids, capacity_blocks=capacity,
                                         block_tokens=block_tokens, **TABLE)
        assert result["per_request"]["instance"].tolist() == [0] * n  # all idle: the lowest index
        blocks = np.array(lookup_tiers_reference(lists, [0] * n, tuple(c * k for c in capacity))) * block_tokens
        np.testing.assert_array_equal(result["per_request"]["cached_tokens"].sum(axis=1),
                                      np.minimum(blocks.sum(axis=1), prompt - 1), err_msg=f"seed {seed}")


def test_replica_caches_are_the_tier_replay_of_their_admissions():
    """FCFS admits each instance's requests in arrival order, so with prefix-affinity (a fixed instance per
    request) the replicas' reused blocks are the tier reference's replay of the requests in arrival order, on
    the same instances; every prompt keeps at least one token to compute."""
    from mcsim.reference.kv_tiers import lookup_tiers_reference

    for seed in range(20):
        rng = np.random.default_rng([seed, 7])
        n, k, block_tokens = int(rng.integers(5, 80)), int(rng.integers(1, 5)), int(rng.integers(1, 8))
        arrival = np.sort(rng.uniform(0, 2.0, n))
        lists, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
        output = rng.integers(1, 20, n)
        capacity = tuple(int(c) for c in rng.integers([1, 0, 0], [10, 6, 6]))
        uniform = rng.uniform(size=n)
        result = simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=k, router="prefix-affinity",
                                         router_uniform=uniform, block_ptr=ptr, block_ids=ids,
                                         capacity_blocks=capacity, block_tokens=block_tokens, **TABLE)
        instance = result["per_request"]["instance"]
        np.testing.assert_array_equal(instance, affinity_instances(ptr, ids, uniform, k))
        blocks = np.array(lookup_tiers_reference(lists, list(instance), capacity)) * block_tokens
        cached = result["per_request"]["cached_tokens"]
        reused = cached.sum(axis=1)
        np.testing.assert_array_equal(reused, np.minimum(blocks.sum(axis=1), prompt - 1), err_msg=f"seed {seed}")
        whole = blocks.sum(axis=1) <= prompt - 1
        np.testing.assert_array_equal(cached[whole], blocks[whole])


@pytest.mark.parametrize("preempt", [False, True])
@pytest.mark.parametrize("scheduler", REPLICA_SCHEDULERS)
def test_one_replica_is_the_one_instance_simulator(preempt, scheduler):
    """With K = 1 every router sends everything to the one instance: the one-instance reference's timeline,
    under every policy of the table (static batching and exclusive prefill included), with whole-request reservation or with KV growth and preemption by
    recompute, with or without a cap on the requests admitted per step."""
    from mcsim.scenario.policies import POLICIES

    policy = POLICIES[scheduler]
    preemptions = 0
    for seed in range(30):
        rng = np.random.default_rng([seed, 99])
        n = int(rng.integers(1, 60))
        arrival, prefill, context, output, passes = random_workload(rng, n, rng.uniform(5.0, 200.0), ties=True, think=False)[:5]
        settings = random_settings(rng, output, context)
        max_new = int(rng.integers(0, 3)) if seed % 3 == 0 else 0  # a cap on admissions per step
        priority = rng.integers(0, 3, n)
        reference = simulate_reference(arrival, prefill, context, output, passes, np.zeros(n), policy=policy.admission,
                                       order=policy.order, mixing=policy.mixing,
                                       queue_key=policy.queue_key(prefill, priority),
                                       preempt=preempt, closed_users=0, warmup_s=0.0, max_new_per_step=max_new,
                                       **TABLE, **settings)
        preemptions += reference["preemptions"]
        for router in ROUTERS:
            result = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=1,
                                             router=router, router_uniform=rng.uniform(size=n), preempt=preempt,
                                             max_new_per_step=max_new, policy=scheduler, priority=priority,
                                             **TABLE, **settings)
            per_request = result["per_request"]
            assert np.all(per_request["instance"] == 0)
            for key in ("first_token_s", "finish_s", "queue_s"):
                np.testing.assert_array_equal(per_request[key], np.array(reference[key]),
                                              err_msg=f"{key}, seed {seed}, {router}")
            assert result["summary"]["preemptions"] == reference["preemptions"]
    assert preemptions > 0 or not preempt or policy.admission == "static"  # a static batch reserves whole requests


def test_round_robin_spreads_requests_evenly():
    n, k = 64, 8
    arrival = np.arange(n) * 0.01
    tokens = np.full(n, 100)
    result = simulate_fleet_batching(arrival, tokens, tokens, np.full(n, 5), n_instances=k, router="round-robin",
                                     **TABLE)
    np.testing.assert_array_equal(result["per_request"]["instance"], np.arange(n) % k)
    np.testing.assert_array_equal(result["summary"]["requests_per_instance"], np.full(k, n // k))
    assert result["summary"]["instance_load_imbalance"] == 1.0


def _eight_replica_case(n):
    """Eight replicas near saturation: Poisson arrivals, long prompts, short outputs, small batches."""
    rng = np.random.default_rng(2024)
    arrival = np.cumsum(rng.exponential(1.0 / 200.0, n))
    context = rng.integers(200, 2000, n)
    output = rng.integers(2, 40, n)
    settings = {"token_budget": 1024, "max_seqs": 8, "block_tokens": 16, "chunk_tokens": 0, "verify_tokens": 1,
                "kv_blocks": 2000}
    return arrival, context, context, output, output - 1, rng.uniform(size=n), settings


def test_least_outstanding_beats_random_on_p99_ttft():
    arrival, prefill, context, output, passes, uniform, settings = _eight_replica_case(2000)
    p99 = {}
    for router in ("random", "least-outstanding"):
        result = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=8, router=router,
                                         router_uniform=uniform, warmup_s=float(arrival[200]), **TABLE, **settings)
        p99[router] = result["summary"]["ttft_s"][2]
    assert p99["least-outstanding"] < 0.5 * p99["random"], p99

    # The reference, on a smaller case, agrees.
    arrival, prefill, context, output, passes, uniform, settings = _eight_replica_case(400)
    p99_reference = {}
    for router in ("random", "least-outstanding"):
        reference = simulate_fleet_reference(arrival, prefill, context, output, passes, uniform, n_instances=8,
                                             router=router, **TABLE, **settings)
        ttft = np.array(reference["first_token_s"]) - arrival
        p99_reference[router] = float(np.quantile(ttft[40:], 0.99))
    assert p99_reference["least-outstanding"] < 0.5 * p99_reference["random"], p99_reference


def test_bad_router_names_the_key():
    with pytest.raises(ValueError, match="deployment.routing"):
        simulate_fleet_batching([0.0], [1], [1], [1], n_instances=2, router="fastest", **TABLE)
    with pytest.raises(ValueError, match="router_uniform"):
        simulate_fleet_batching([0.0], [1], [1], [1], n_instances=2, router="random", **TABLE)


def test_replicas_mode_end_to_end():
    """The scenario keys select the mode; the default leaves the new output NaN."""
    from pathlib import Path

    import mcsim

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "dense-node.toml"
    base = ["deployment.fleet=fixed", "deployment.instances=4"]
    default = mcsim.run(scenario, samples=1, requests=2000, workers=1, overrides=base)
    assert np.isnan(default.instance_load_imbalance.values).all()
    for router in ROUTERS:
        ds = mcsim.run(scenario, samples=1, requests=2000, workers=1,
                       overrides=[*base, "deployment.fleet_simulation=replicas", f"deployment.routing={router}"])
        imbalance = float(ds.instance_load_imbalance.values[0])
        assert 1.0 <= imbalance < 2.0, router
        assert np.all(np.isfinite(ds.ttft_s.values)), router
        assert ds.instance_load_imbalance.attrs["units"] == "1"


def test_disaggregated_replicas_hold_the_cache_on_the_prefill_pool():
    """One prefill replica admits in arrival order, so its pooled cache (the KV store of the factory scenario)
    holds exactly what the cache stage's replay holds; random routing over per-instance caches reuses far less
    and then needs more instances for the same SLOs."""
    from pathlib import Path

    import mcsim

    root = Path(__file__).resolve().parents[1] / "scenarios"
    fixed = ["deployment.fleet=fixed", "deployment.instances=2", "deployment.prefill_instances=1"]
    representative = mcsim.run(root / "factory.toml", samples=1, requests=6000, workers=1, overrides=fixed)
    replicas = mcsim.run(root / "factory.toml", samples=1, requests=6000, workers=1,
                         overrides=[*fixed, "deployment.fleet_simulation=replicas"])
    assert float(representative.cache_hit_rate.min()) > 0.3
    for name in ("cache_hit_rate", "cache_hit_rate_by_tier", "cache_hit_rate_drift"):
        np.testing.assert_array_equal(replicas[name].values, representative[name].values, err_msg=name)
    assert np.isfinite(replicas.ttft_s.values).all() and np.isfinite(replicas.tpot_s.values).all()
    # The scenario's own fleet mode (utilization) without simulate_batching: asking for replicas simulates them.
    sized = mcsim.run(root / "factory.toml", samples=1, requests=6000, workers=1,
                      overrides=["deployment.fleet_simulation=replicas", "performance.simulate_batching=false"])
    assert np.all(sized.instance_load_imbalance.values >= 1.0)

    slo = {routing: mcsim.run(root / "deepseek-disaggregated.toml", samples=1, requests=6000, workers=1,
                              overrides=["deployment.fleet_simulation=replicas", f"deployment.routing={routing}"])
           for routing in ("pooled", "random")}
    assert float(slo["random"].cache_hit_rate.max()) < 0.75 * float(slo["pooled"].cache_hit_rate.min())
    assert float(slo["random"].prefill_instances.min()) > float(slo["pooled"].prefill_instances.max())


DENSE_NODE_FIXED = ["deployment.fleet=fixed", "deployment.instances=4", "deployment.disaggregated=false"]


def _dense_node(overrides, requests=3000, samples=2):
    from pathlib import Path

    import mcsim

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "dense-node.toml"
    return mcsim.run(scenario, samples=samples, requests=requests, workers=1,
                     overrides=[*DENSE_NODE_FIXED, *overrides])


def test_replicas_with_prefix_affinity_reproduce_the_cache_stage():
    """Prefix-affinity fixes each request's instance and FCFS admits in arrival order, so the replicas' own caches
    hold what the cache stage's replay holds: the same hit rates, per tier, and the same drift."""
    representative = _dense_node(["deployment.routing=prefix-affinity"])
    replicas = _dense_node(["deployment.routing=prefix-affinity", "deployment.fleet_simulation=replicas"])
    assert float(representative.cache_hit_rate.min()) > 0.3  # the check below is about real reuse
    for name in ("cache_hit_rate", "cache_hit_rate_by_tier", "cache_hit_rate_drift"):
        np.testing.assert_array_equal(replicas[name].values, representative[name].values, err_msg=name)
    assert np.isnan(representative.instance_load_imbalance.values).all()
    assert np.all(replicas.instance_load_imbalance.values >= 1.0)
    assert (representative.attrs["fleet_simulation"], replicas.attrs["fleet_simulation"]) == ("representative",
                                                                                              "replicas")


def test_cache_aware_replicas_reuse_more_than_random_and_answer_sooner():
    """At the same load on the same fleet, routing to the longest cached prefix reuses more of each prompt than
    random routing, and the prefill saved shows in the tail of TTFT."""
    cache_aware = _dense_node(["deployment.routing=cache-aware", "deployment.fleet_simulation=replicas"])
    random = _dense_node(["deployment.routing=random", "deployment.fleet_simulation=replicas"])
    assert np.all(cache_aware.cache_hit_rate.values > random.cache_hit_rate.values + 0.05)
    p99 = {name: ds.ttft_s.sel(request_quantile=0.99).values for name, ds in (("aware", cache_aware),
                                                                               ("random", random))}
    assert np.all(p99["aware"] < p99["random"]), p99


def test_load_routers_need_the_replicas():
    from pathlib import Path

    import mcsim
    from mcsim.scenario.schema import ScenarioError

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "dense-node.toml"
    with pytest.raises(ScenarioError, match="deployment.routing.*current load"):
        mcsim.run(scenario, samples=1, requests=500, workers=1, overrides=["deployment.routing=least-outstanding"])
    with pytest.raises(ScenarioError, match="deployment.fleet_simulation.*closed loop on a colocated pool only"):
        mcsim.run(scenario, samples=1, requests=500, workers=1,
                  overrides=["deployment.fleet=fixed", "deployment.disaggregated=true",
                             "deployment.fleet_simulation=replicas", "performance.closed_loop_users=8"])


def test_the_fleet_step_log_accounts_for_every_prompt_token():
    """A log long enough for every step holds each instance's steps, in order of start, one after another on
    each instance; its prefill tokens are the prompts less what the caches supplied, and its decode slots are
    the requests' passes."""
    rng = np.random.default_rng(5)
    n, block_tokens = 300, 4
    lists, prompt, ptr, ids = random_blocks(rng, n, block_tokens)
    arrival = np.sort(rng.uniform(0, 3.0, n))
    output = rng.integers(1, 30, n)
    result = simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=3, router="cache-aware",
                                     block_ptr=ptr, block_ids=ids, capacity_blocks=(20, 10, 0),
                                     block_tokens=block_tokens, token_budget=256, max_seqs=8, max_steps=100_000,
                                     **TABLE)
    log, steps = result["step_log"], result["summary"]["instance_steps"]
    np.testing.assert_array_equal(np.bincount(log["instance"], minlength=3), steps)
    assert np.all(np.diff(log["start_s"]) >= 0)
    for i in range(3):
        mine = log["instance"] == i
        assert np.all(log["start_s"][mine][1:] >= (log["start_s"] + log["step_s"])[mine][:-1] - 1e-12)
    cached = result["per_request"]["cached_tokens"].sum(axis=1)
    assert cached.sum() > 0
    assert log["prefill_tokens"].sum() == np.maximum(prompt - cached, 1).sum()
    assert log["decode_seqs"].sum() == (output - 1).sum()  # one pass per output token after the first


def test_caches_too_large_are_refused_in_one_line_naming_the_key():
    """Refused before the cache stage or the step loop allocates anything per instance (so at once)."""
    import pickle

    from mcsim.errors import McsimError, RunLimitError

    with pytest.raises(RunLimitError, match=r"^deployment.instances = 3,000 with deployment.routing = 'cache-aware' "
                       r"\(fleet_simulation = 'replicas'\): the replicas' step loop would need about [\d.]+ GiB .*"
                       r"prefix cache of [\d,]+ distinct blocks .* more than the 2.0 GiB the replicas' prefix caches"):
        _dense_node(["deployment.instances=3000", "deployment.fleet_simulation=replicas",
                     "deployment.routing=cache-aware"], requests=2000, samples=1)
    n = 8192  # each of 40,000 instances keeps a ring of min(max_seqs, n) slots: 2.4 GiB
    with pytest.raises(RunLimitError, match=r"deployment.instances = 40,000 .* running sets and wheels of 8,192 "
                       r"and 2 slots .* more than the 2.0 GiB the replicas' running sets and queues may take"):
        simulate_fleet_batching(np.zeros(n), np.ones(n), np.ones(n), np.ones(n), n_instances=40000,
                                router="round-robin", max_seqs=8192, **TABLE)
    err = RunLimitError("deployment.fleet_simulation: too large")
    assert isinstance(err, McsimError) and str(pickle.loads(pickle.dumps(err))) == str(err)  # crosses processes


def _jsq_waits(arrival, service_s, servers):
    """Join the shortest queue with deterministic service, written from departure times alone: a request joins
    the server with the fewest requests not yet departed (lowest index on ties) and starts when it frees."""
    from collections import deque

    in_system = [deque() for _ in range(servers)]  # departure times, in order
    free_at = [0.0] * servers
    waits = []
    for t in arrival:
        for queue in in_system:
            while queue and queue[0] <= t:
                queue.popleft()
        chosen = min(range(servers), key=lambda i: (len(in_system[i]), i))
        start = max(t, free_at[chosen])
        waits.append(start - t)
        free_at[chosen] = start + service_s
        in_system[chosen].append(free_at[chosen])
    return np.array(waits)


def test_least_outstanding_is_join_the_shortest_queue():
    """One request per step of a fixed time makes each replica a deterministic server: least-outstanding routing
    is then join-the-shortest-queue, and the router must count a request as in flight until its step ends."""
    rng = np.random.default_rng(3)
    n, servers, service_s = 4000, 8, 0.01
    arrival = np.cumsum(rng.exponential(service_s / (0.8 * servers), n))
    prompt = np.full(n, 100)
    result = simulate_fleet_batching(arrival, prompt, prompt, np.ones(n, np.int64), np.zeros(n, np.int64),
                                     n_instances=servers, router="least-outstanding", max_seqs=1, token_budget=1024,
                                     step_time_table=np.full((2, 2), service_s), decode_edges=[0.0, 1.0],
                                     prefill_edges=[0.0, 1024.0])
    np.testing.assert_allclose(result["per_request"]["queue_s"], _jsq_waits(arrival, service_s, servers),
                               rtol=0, atol=1e-12)


def test_priority_replicas_serve_their_high_class_first():
    """The policy table rules each replica's queue: under priority a quarter of the requests in the high class
    gets a p99 TTFT well under FCFS's at the same load and routing, and the rest pay for it."""
    arrival, prefill, context, output, passes, uniform, settings = _eight_replica_case(4000)
    high = np.random.default_rng(1).uniform(size=len(arrival)) < 0.25
    p99 = {}
    for policy in ("fcfs", "priority"):
        result = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=8, router="random",
                                         router_uniform=uniform, warmup_s=float(arrival[400]), policy=policy,
                                         priority=high.astype(int), **TABLE, **settings)
        per = result["per_request"]
        p99[policy] = [float(np.quantile(per["ttft_s"][per["measured"] & mine], 0.99)) for mine in (high, ~high)]
    assert p99["priority"][0] < 0.5 * p99["fcfs"][0], p99
    assert p99["priority"][1] > p99["fcfs"][1], p99


@pytest.mark.parametrize("preempt", [False, True])
def test_one_replica_closed_loop_is_the_one_instance_closed_loop(preempt):
    """A closed loop of U users through one replica: the one-instance reference's arrivals and timeline."""
    for seed in range(20):
        rng = np.random.default_rng([seed, 17])
        n = int(rng.integers(2, 60))
        arrival, prefill, context, output, passes = random_workload(rng, n, rng.uniform(5.0, 200.0), ties=True, think=False)[:5]
        settings = random_settings(rng, output, context)
        users = int(rng.integers(1, 6))
        first = np.zeros(n)
        first[:users] = rng.uniform(0, 0.5, min(users, n))
        think = rng.exponential(0.1, n)
        reference = simulate_reference(first, prefill, context, output, passes, think, policy="continuous",
                                       preempt=preempt, closed_users=users, warmup_s=0.0, **TABLE, **settings)
        result = simulate_fleet_batching(first, prefill, context, output, passes, n_instances=1,
                                         router="least-outstanding", preempt=preempt, closed_users=users,
                                         think_s=think, **TABLE, **settings)
        for key in ("arrival_s", "first_token_s", "finish_s", "queue_s"):
            np.testing.assert_array_equal(result["per_request"][key], np.array(reference[key]),
                                          err_msg=f"{key}, seed {seed}")


def test_least_outstanding_over_many_instances_matches_the_reference():
    """The least-load router's tournament tree (O(log K) an arrival) against the reference's scan of every instance,
    over trees of 16 to 64 leaves, ties included, preemption in some: every request's instance and times."""
    for seed in range(6):
        rng = np.random.default_rng([seed, 99])
        n = int(rng.integers(60, 160))
        n_instances = int(rng.integers(9, 60))
        arrival, _, _, output, passes = random_workload(rng, n, rng.uniform(50.0, 2000.0), ties=True, think=False)[:5]
        _, prompt, ptr, ids = random_blocks(rng, n, 16)
        settings = random_settings(rng, output, prompt)
        settings["block_tokens"] = 16
        settings["kv_blocks"] = int(((prompt + output + 15) // 16).max()) + int(rng.integers(0, 40))
        uniform = rng.uniform(size=n)
        extra = {"preempt": seed % 2 == 1}
        result = simulate_fleet_batching(arrival, prompt, prompt, output, passes, n_instances=n_instances,
                                         router="least-outstanding", router_uniform=uniform, block_ptr=ptr,
                                         block_ids=ids, warmup_s=0.0, **extra, **TABLE, **settings)
        reference = simulate_fleet_reference(arrival, prompt, prompt, output, passes, uniform,
                                             n_instances=n_instances, router="least-outstanding", warmup_s=0.0,
                                             **extra, **TABLE, **settings)
        for key in ("instance", "first_token_s", "finish_s"):
            np.testing.assert_array_equal(result["per_request"][key], reference[key], err_msg=f"{key}, seed {seed}")

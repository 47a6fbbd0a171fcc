"""Fleet of replicas behind a router: kernel vs the fleet event-loop reference, one replica vs the one-instance
reference, and least-outstanding routing against random routing."""

from __future__ import annotations

import numpy as np
import pytest

from mcsim.perf.fleet_batching import ROUTERS, simulate_fleet_batching
from mcsim.reference.batching import simulate_reference
from mcsim.reference.fleet_batching import simulate_fleet_reference

DECODE_EDGES = np.array([1.0, 8.0, 64.0, 256.0])
PREFILL_EDGES = np.array([0.0, 512.0, 4096.0, 16384.0])
LINEAR_TABLE = 0.01 + 2e-4 * DECODE_EDGES[:, None] + 4e-6 * PREFILL_EDGES[None, :]
TABLE = {"step_time_table": LINEAR_TABLE, "decode_edges": DECODE_EDGES, "prefill_edges": PREFILL_EDGES}


def random_workload(rng, n, rate):
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    if rng.uniform() < 0.3:  # simultaneous arrivals exercise the ties
        arrival = np.round(arrival, 1)
    context = rng.integers(1, 300, n)
    prefill = np.clip(context - rng.integers(0, 100, n), 1, context)
    output = rng.integers(1, 60, n)
    tokens_per_pass = int(rng.integers(1, 4))
    passes = np.where(output > 1, -(-(output - 1) // tokens_per_pass), 0)
    return arrival, prefill, context, output, passes


def random_settings(rng, output, context):
    block_tokens = int(rng.integers(1, 32))
    largest = int(((context + output + block_tokens - 1) // block_tokens).max())
    return {
        "token_budget": int(rng.integers(1, 1000)),
        "max_seqs": int(rng.integers(1, 10)),
        "kv_blocks": largest + int(rng.integers(0, 2 * largest)),  # tight pools make least-kv differ
        "block_tokens": block_tokens,
        "chunk_tokens": int(rng.integers(0, 200)),
        "verify_tokens": int(rng.integers(1, 4)),
    }


@pytest.mark.parametrize("router", ROUTERS)
def test_kernel_matches_fleet_reference_exactly(router):
    for seed in range(40):
        rng = np.random.default_rng([seed, ROUTERS.index(router)])
        n = int(rng.integers(1, 60))
        n_instances = int(rng.integers(1, 6))
        arrival, prefill, context, output, passes = random_workload(rng, n, rng.uniform(5.0, 400.0))
        settings = random_settings(rng, output, context)
        uniform = rng.uniform(size=n)
        kv_slope = rng.uniform(0.0, 1e-5, DECODE_EDGES.size) if seed % 2 else None
        result = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=n_instances,
                                         router=router, router_uniform=uniform, kv_slope=kv_slope,
                                         kv_ref_context=50.0, **TABLE, **settings)
        reference = simulate_fleet_reference(arrival, prefill, context, output, passes, uniform,
                                             n_instances=n_instances, router=router, kv_slope=kv_slope,
                                             kv_ref_context=50.0, **TABLE, **settings)
        per_request = result["per_request"]
        np.testing.assert_array_equal(per_request["instance"], reference["instance"], err_msg=f"seed {seed}")
        for key in ("first_token_s", "finish_s", "queue_s"):
            np.testing.assert_array_equal(per_request[key], np.array(reference[key]), err_msg=f"{key}, seed {seed}")
        np.testing.assert_array_equal(result["summary"]["instance_steps"], reference["instance_steps"])


def test_one_replica_is_the_one_instance_simulator():
    """With K = 1 every router sends everything to the one instance: the one-instance reference's timeline."""
    for seed in range(30):
        rng = np.random.default_rng([seed, 99])
        n = int(rng.integers(1, 60))
        arrival, prefill, context, output, passes = random_workload(rng, n, rng.uniform(5.0, 200.0))
        settings = random_settings(rng, output, context)
        reference = simulate_reference(arrival, prefill, context, output, passes, np.zeros(n), policy="continuous",
                                       preempt=False, closed_users=0, warmup_s=0.0, **TABLE, **settings)
        for router in ROUTERS:
            result = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=1,
                                             router=router, router_uniform=rng.uniform(size=n), **TABLE, **settings)
            per_request = result["per_request"]
            assert np.all(per_request["instance"] == 0)
            for key in ("first_token_s", "finish_s", "queue_s"):
                np.testing.assert_array_equal(per_request[key], np.array(reference[key]),
                                              err_msg=f"{key}, seed {seed}, {router}")


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
    with pytest.raises(ValueError, match="deployment.router"):
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
                       overrides=[*base, "deployment.fleet_simulation=replicas", f"deployment.router={router}"])
        imbalance = float(ds.instance_load_imbalance.values[0])
        assert 1.0 <= imbalance < 2.0, router
        assert np.all(np.isfinite(ds.ttft_s.values)), router
        assert ds.instance_load_imbalance.attrs["units"] == "1"


def test_replicas_mode_rejects_disaggregation():
    from pathlib import Path

    import mcsim

    scenario = Path(__file__).resolve().parents[1] / "scenarios" / "dense-node.toml"
    with pytest.raises(Exception, match="deployment.fleet_simulation"):
        mcsim.run(scenario, samples=1, requests=500, workers=1,
                  overrides=["deployment.fleet=fixed", "deployment.disaggregated=true",
                             "deployment.fleet_simulation=replicas"])

"""The figures README.md quotes for ``deployment.fleet_simulation = "replicas"``, reproduced in one run.

    python benchmarks/replicas.py

- 8 replicas near saturation (the test case of ``tests/test_fleet_batching.py``): p99 TTFT by router, kernel and
  fleet event-loop reference, and under priority vs FCFS for a high class of a quarter of the requests;
- dense-node, 4 instances fixed, 3,000 requests x 2 samples: prompt-token hit rate and p99 TTFT, cache-aware vs
  random replicas;
- factory, 8 prefill + 4 decode units fixed, 20,000 requests x 2 samples: p99 TTFT, representative vs replicas;
- the kernel's speed with and without prefix caches (8 replicas), best of 3, requests simulated per second.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

import mcsim

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_fleet_batching import TABLE, _eight_replica_case  # noqa: E402  (the tests' own case)

from mcsim.perf.fleet_batching import simulate_fleet_batching  # noqa: E402
from mcsim.reference.fleet_batching import simulate_fleet_reference  # noqa: E402


def eight_replicas() -> None:
    arrival, prefill, context, output, passes, uniform, settings = _eight_replica_case(2000)
    for router in ("random", "least-outstanding", "round-robin", "least-kv"):
        summary = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=8, router=router,
                                          router_uniform=uniform, warmup_s=float(arrival[200]), **TABLE,
                                          **settings)["summary"]
        print(f"8 replicas, kernel, {router}: p99 TTFT {summary['ttft_s'][2]:.3f} s")
    small = _eight_replica_case(400)
    for router in ("random", "least-outstanding"):
        ref = simulate_fleet_reference(*small[:6], n_instances=8, router=router, **TABLE, **small[6])
        ttft = np.array(ref["first_token_s"]) - small[0]
        print(f"8 replicas, reference, {router}: p99 TTFT {np.quantile(ttft[40:], 0.99):.3f} s")
    arrival, prefill, context, output, passes, uniform, settings = _eight_replica_case(4000)
    high = np.random.default_rng(1).uniform(size=len(arrival)) < 0.25
    for policy in ("fcfs", "priority"):
        per = simulate_fleet_batching(arrival, prefill, context, output, passes, n_instances=8, router="random",
                                      router_uniform=uniform, warmup_s=float(arrival[400]), policy=policy,
                                      priority=high.astype(int), **TABLE, **settings)["per_request"]
        p99 = [np.quantile(per["ttft_s"][per["measured"] & mine], 0.99) for mine in (high, ~high)]
        print(f"8 replicas, random routing, {policy}: p99 TTFT high class {p99[0]:.3f} s, others {p99[1]:.3f} s")


def scenarios() -> None:
    fixed = ["deployment.fleet=fixed", "deployment.instances=4", "deployment.disaggregated=false",
             "deployment.fleet_simulation=replicas"]
    for routing in ("cache-aware", "random"):
        ds = mcsim.run(ROOT / "scenarios" / "dense-node.toml", samples=2, requests=3000, workers=1,
                       overrides=[*fixed, f"deployment.routing={routing}"])
        print(f"dense-node replicas, {routing}: hit rate {ds.cache_hit_rate.values.round(3)}, p99 TTFT "
              f"{ds.ttft_s.sel(request_quantile=0.99).values.round(3)} s")
    units = ["deployment.fleet=fixed", "deployment.instances=4", "deployment.prefill_instances=8"]
    for mode in ("representative", "replicas"):
        ds = mcsim.run(ROOT / "scenarios" / "factory.toml", samples=2, requests=20000, workers=1,
                       overrides=[*units, f"deployment.fleet_simulation={mode}"])
        print(f"factory, {mode}: p99 TTFT {ds.ttft_s.sel(request_quantile=0.99).values.round(2)} s")


def speed() -> None:
    from mcsim.bench import kernels

    rate = kernels.BATCH_LOAD * kernels.FLEET_REPLICAS * kernels.batching_capacity_per_s("continuous", False, 40_000,
                                                                                          5000)
    arrival, prompt, output, ptr, ids = kernels.fleet_workload(40_000, rate, seed=1)
    table = {"step_time_table": kernels.BATCH_STEP_TIME_TABLE, "decode_edges": kernels.BATCH_DECODE_EDGES,
             "prefill_edges": kernels.BATCH_PREFILL_EDGES}
    for label, router, capacity in (("cache-aware, tiered caches", "cache-aware", kernels.FLEET_CACHE_BLOCKS),
                                    ("round-robin, no cache", "round-robin", (0, 0, 0))):
        def run():
            return simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=kernels.FLEET_REPLICAS,
                                           router=router, block_ptr=ptr, block_ids=ids, capacity_blocks=capacity,
                                           kv_blocks=40_000, **table, **kernels._fleet_settings())
        run()
        best = min(_seconds(run) for _ in range(3))
        print(f"kernel, 8 replicas, {label}: {len(arrival) / best / 1e6:.2f} M requests/s")


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


if __name__ == "__main__":
    eight_replicas()
    scenarios()
    speed()

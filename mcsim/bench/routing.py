"""What routing costs as a fleet grows: the replicas' step loop per request at 8, 64 and 512 instances.

Each fleet runs at the same load per instance (80 % of one instance's capacity, the batching benchmarks' load) with
the same requests per instance, so a router whose cost does not grow with the fleet takes the same time per request
at every size. Least-outstanding keeps the instances' loads in a tournament tree (O(log K) an arrival; it read every
instance's load before, O(K)); round-robin, whose placement is known before the run, is the reference of a router
that costs nothing to place. The target: least-outstanding at 512 instances within 1.5x its cost per request at 8.
"""

from __future__ import annotations

from mcsim.bench import kernels
from mcsim.bench.timing import best_of
from mcsim.perf.fleet_batching import simulate_fleet_batching

#: Fleet sizes, and the target ratio of the largest's cost per request to the smallest's.
INSTANCES = (8, 64, 512)
TARGET_RATIO = 1.5


def routing_curve(requests_per_instance: int = 400, repeats: int = 2, instances=INSTANCES) -> dict:
    """Seconds per simulated request for least-outstanding and round-robin at each fleet size, and the ratio of
    the largest fleet's to the smallest's."""
    per_instance = kernels.BATCH_LOAD * kernels.batching_capacity_per_s("continuous", False, 40_000, 5_000)
    settings = {key: kernels.BATCH_SETTINGS[key] for key in ("token_budget", "max_seqs", "block_tokens",
                                                             "chunk_tokens", "verify_tokens")}
    table = {"step_time_table": kernels.BATCH_STEP_TIME_TABLE, "decode_edges": kernels.BATCH_DECODE_EDGES,
             "prefill_edges": kernels.BATCH_PREFILL_EDGES}
    rows = []
    for k in instances:
        n = k * requests_per_instance
        arrival, prompt, output, _, _ = kernels.fleet_workload(n, per_instance * k, seed=3)
        row = {"instances": k, "requests": n}
        for router in ("least-outstanding", "round-robin"):
            def run(router=router):
                return simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=k, router=router,
                                               kv_blocks=40_000, **table, **settings)
            run()  # compiles (or loads) the kernel, and touches the arrays
            row[router] = best_of(run, repeats) / n
        rows.append(row)
    first, last = rows[0], rows[-1]
    return {"rows": rows, "ratio": last["least-outstanding"] / first["least-outstanding"],
            "ratio_round_robin": last["round-robin"] / first["round-robin"], "target_ratio": TARGET_RATIO}

"""A fleet of replicas behind a least-outstanding router, its requests given all at once or a part at a time.

For each request count and fleet size, two fresh processes run the same requests through the step loop: one with
every request in memory (``simulate_fleet_batching``), one streamed (``FleetStream``, parts of 65,536 requests
generated as they are put in). Each prints its wall time (the loop's own, after a warm-up run that compiles or
loads the kernel) and its peak resident set size; the table gives requests per second, the streamed run's speed
as a ratio to the whole run's in the same invocation, and both peaks.

The workload: Poisson arrivals at 80 % of the fleet's capacity (measured as the bench's one-instance capacity
times the instances), prompts of about 800 tokens and outputs of about 500 (``mcsim.bench.kernels``'s batching
workload), 256 sequences an instance, no preemption.

    python benchmarks/replicas_stream.py [N ...] [--instances K ...]

Defaults: 10^5, 10^6 and 10^7 requests over 64 instances.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time

import numpy as np

PART = 1 << 16


def workload(n: int, rate: float, seed: int = 1):
    """The requests in parts of :data:`PART`, each from its own seeded stream: (arrival, prompt, output)."""
    from mcsim.bench.kernels import batching_workload

    start = 0.0
    for lo in range(0, n, PART):
        m = min(PART, n - lo)
        arrival, _, context, output = batching_workload(m, rate, seed=seed * 100_003 + lo // PART)
        yield arrival + start, context, output
        start += float(arrival[-1])


def one(mode: str, n: int, k: int) -> dict:
    """One run in this process: the loop's wall time (s) and peak RSS (bytes)."""
    from mcsim.bench import kernels as bk
    from mcsim.perf.fleet_batching import simulate_fleet_batching
    from mcsim.perf.fleet_stream import FleetStream

    rate = bk.BATCH_LOAD * k * bk.batching_capacity_per_s("continuous", False, 40_000, 20_000)
    settings = {"step_time_table": bk.BATCH_STEP_TIME_TABLE, "decode_edges": bk.BATCH_DECODE_EDGES,
                "prefill_edges": bk.BATCH_PREFILL_EDGES, "kv_blocks": 40_000, "token_budget": 8192, "max_seqs": 256,
                "block_tokens": 16}

    def run(count):
        if mode == "whole":
            arrival, prompt, output = (np.concatenate(x) for x in zip(*workload(count, rate)))
            result = simulate_fleet_batching(arrival, prompt, prompt, output, n_instances=k,
                                             router="least-outstanding", **settings)
            return len(result["per_request"]["finish_s"])
        fleet = FleetStream(count, slots=4 * PART + 2 * k * 256, n_instances=k, router="least-outstanding",
                            **settings)
        done = sum(len(fleet.add(a, p, p, o)["finish_s"]) for a, p, o in workload(count, rate))
        return done + len(fleet.finish()["finish_s"])

    run(2_000)  # compiles or loads the kernel
    start = time.perf_counter()
    finished = run(n)
    wall = time.perf_counter() - start
    assert finished == n
    return {"wall_s": wall, "peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024.0}


def main(sizes=(100_000, 1_000_000, 10_000_000), instances=(64,)) -> None:
    print(f"{'requests':>12} {'instances':>9} {'whole':>16} {'streamed':>16} {'ratio':>6} "
          f"{'peak, whole':>12} {'peak, streamed':>15}")
    for k in instances:
        for n in sizes:
            runs = {}
            for mode in ("whole", "streamed"):
                out = subprocess.run([sys.executable, __file__, "--one", mode, str(n), str(k)], check=True,
                                     capture_output=True, text=True).stdout
                runs[mode] = json.loads(out.strip().splitlines()[-1])
            w, s = runs["whole"], runs["streamed"]
            print(f"{n:>12,} {k:>9} {n / w['wall_s'] / 1e6:>10.2f} M/s {n / s['wall_s'] / 1e6:>10.2f} M/s "
                  f"{w['wall_s'] / s['wall_s']:>6.2f} {w['peak_bytes'] / 2**20:>8.0f} MiB "
                  f"{s['peak_bytes'] / 2**20:>11.0f} MiB", flush=True)


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["--one"]:
        print(json.dumps(one(args[1], int(args[2]), int(args[3]))))
    else:
        instances = (64,)
        if "--instances" in args:
            i = args.index("--instances")
            instances = tuple(int(a) for a in args[i + 1:])
            args = args[:i]
        main(**({"sizes": tuple(int(a) for a in args)} if args else {}), instances=instances)

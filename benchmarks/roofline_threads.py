"""Threads on a roofline grid: how much a second Dask thread gains when each sample prices its step tables in
Python (the roofline fidelity), which holds the GIL, against one thread, measured in the same run.

    python benchmarks/roofline_threads.py [--requests 1000] [--samples 8] [--points 4] [--repeats 2]

The grid is ``scenarios/dense-node.toml`` over an output price (prices change no work: every point costs the same);
tasks of two samples, the kernels compiled before the first timing.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv=None) -> dict:
    from mcsim.execution import executor
    from mcsim.scenario import grid, load_scenario

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    scn = load_scenario(ROOT / "scenarios" / "dense-node.toml")
    axis = grid.Axis("economics.price_output_usd_per_mtok", tuple(2.0 + 0.1 * i for i in range(args.points)))
    plan = executor.make_plan(scn, ("factory",), axes=grid.validate_axes(scn, [axis]), samples=args.samples,
                              requests=args.requests, chunk_size=2)
    executor.run_task(plan, 0, 0)  # compile or load the kernels
    best = {}
    for _ in range(args.repeats):
        for workers in (1, 2):
            start = time.perf_counter()
            executor.execute(plan, workers=workers)
            best[workers] = min(best.get(workers, float("inf")), time.perf_counter() - start)
    speedup = best[1] / best[2]
    print(f"dense-node (roofline), {args.points} points x {args.samples} samples x {args.requests:,} requests: "
          f"1 thread {best[1]:.2f} s, 2 threads {best[2]:.2f} s: {speedup:.2f}x ({speedup / 2:.0%} efficiency)")
    return {"one_thread_s": best[1], "two_threads_s": best[2], "speedup": speedup}


if __name__ == "__main__":
    main()

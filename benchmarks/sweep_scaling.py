"""Sweep scaling: Dask's per-task overhead and the parallel efficiency from 1 to 2 workers.

    python benchmarks/sweep_scaling.py [--requests 4000] [--samples 8]

* Per-task overhead: the same tasks run through :func:`mcsim.executor.execute` (client, scheduler, result
  transfer, part assembly) and called directly in a loop, on one worker; overhead = difference / tasks.
* Parallel efficiency: a sweep on 1 worker vs 2 workers, as threads (kernels release the GIL; the NumPy
  orchestration between kernels partly holds it) and as a local cluster of processes:
  efficiency = t(1) / (2 x t(2)). Process start-up is excluded by timing a warm second run on the same cluster.

Times depend on the machine and its load; the ratios are the claim.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from timing import best_of  # noqa: E402

SMALL = ["deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=16", "moe.nodes=4",
         "workload.rate_rps=150"]


def _plan(requests: int, samples: int, points: int):
    from mcsim import executor, grid
    from mcsim.scenario import load_scenario

    scn = load_scenario(HERE.parent / "scenarios" / "factory.toml", overrides=SMALL)
    axes = grid.validate_axes(scn, [grid.Axis("economics.price_output_usd_per_mtok",
                                              tuple(2.0 + 0.1 * i for i in range(points)))])
    return executor.make_plan(scn, ("factory",), axes=axes, samples=samples, requests=requests, chunk_size=1)


def task_overhead(requests: int, tasks: int, repeats: int):
    from mcsim import executor

    plan = _plan(requests, tasks, 1)
    executor.run_task(plan, 0, 0)  # compile

    def direct():
        for c in range(len(plan.chunks)):
            executor.run_task(plan, 0, c)

    def through_dask():
        executor.execute(plan, workers=1)

    t_direct = best_of(direct, repeats)
    t_dask = best_of(through_dask, repeats)
    return tasks, t_direct, t_dask


_SOLO = """
import sys, time
sys.path.insert(0, {here!r})
import sweep_scaling
from mcsim import executor
plan = sweep_scaling._plan({requests}, {samples}, {points})
executor.run_task(plan, 0, 0)
tasks = [(p, c) for p in range(len(plan.grid)) for c in range(len(plan.chunks))]
start = time.perf_counter()
for p, c in tasks[{part}::{parts}]:
    executor.run_task(plan, p, c)
print(time.perf_counter() - start)
"""


def machine_ceiling(requests: int, samples: int, points: int) -> tuple[float, float]:
    """The same tasks without Dask: all in one process, then half each in two independent processes at once.

    Two processes share nothing but the hardware, so their efficiency is what this machine allows (memory
    bandwidth, caches, other load); it is the reference for the Dask figures.
    """
    import subprocess

    def solo(part, parts):
        code = _SOLO.format(here=str(HERE), requests=requests, samples=samples, points=points, part=part,
                            parts=parts)
        return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)

    one = float(solo(0, 1).communicate()[0])
    pair = [solo(0, 2), solo(1, 2)]
    two = max(float(p.communicate()[0]) for p in pair)
    return one, two


def parallel_efficiency(requests: int, samples: int, points: int, repeats: int):
    from dask.distributed import LocalCluster

    from mcsim import executor

    plan = _plan(requests, samples, points)
    executor.run_task(plan, 0, 0)
    out = {}
    t1 = best_of(lambda: executor.execute(plan, workers=1), repeats)
    t2 = best_of(lambda: executor.execute(plan, workers=2), repeats)
    out["threads"] = (t1, t2)
    times = {}
    for n in (1, 2):
        with LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
            executor.execute(plan, scheduler=cluster.scheduler_address)  # start-up and imports on the workers
            times[n] = best_of(lambda: executor.execute(plan, scheduler=cluster.scheduler_address), repeats)
    out["processes"] = (times[1], times[2])
    return plan, out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    report(args.requests, args.samples, args.points, args.repeats)


def report(requests=4000, samples=8, points=4, repeats=2):
    tasks, t_direct, t_dask = task_overhead(200, 40, repeats)
    print(f"\nDask per-task overhead ({tasks} tasks of one 200-request sample, one worker):")
    print(f"  direct loop {t_direct:.3f} s, through Dask {t_dask:.3f} s: "
          f"{1e3 * (t_dask - t_direct) / tasks:.2f} ms per task ({t_dask / t_direct:.2f}x the direct loop)")
    plan, eff = parallel_efficiency(requests, samples, points, repeats)
    eff["2 independent processes, no Dask (machine ceiling)"] = machine_ceiling(requests, samples, points)
    n_tasks = len(plan.grid) * len(plan.chunks)
    print(f"\nparallel efficiency, {len(plan.grid)} grid points x {samples} samples x {requests} requests "
          f"({n_tasks} tasks):")
    for kind, (t1, t2) in eff.items():
        print(f"  {kind:<9} 1 worker {t1:.2f} s, 2 workers {t2:.2f} s: speed-up {t1 / t2:.2f}x, "
              f"efficiency {100 * t1 / (2 * t2):.0f} %")
    ceiling = eff["2 independent processes, no Dask (machine ceiling)"]
    ceiling_eff = ceiling[0] / (2 * ceiling[1])
    for kind in ("threads", "processes"):
        t1, t2 = eff[kind]
        print(f"  {kind}: {100 * (t1 / (2 * t2)) / ceiling_eff:.0f} % of the machine ceiling")
    return eff


if __name__ == "__main__":
    main()

"""How the cost of a run scales: with requests per sample, grid points and workers; Numba compile time.

* :func:`requests_curve` — one Monte Carlo sample with every stage on (workload, KV tiers, speculative draws,
  expert placement, the batching simulator, performance, economics) at growing request counts, each size in a
  fresh process so that its peak memory (peak resident size during the calls minus the size before them)
  belongs to that size.
  The first call at a size also pays the operating system's first touch of its arrays; a sweep's worker runs
  many samples, so the best of the later calls is the steady-state figure and the first call is kept apart.
* :func:`grid_curve` — a sweep through :func:`mcsim.execution.executor.execute` (one worker) at growing grid points,
  each in a fresh process: time per point and peak memory (which should follow the chunk, not the grid).
* :func:`workers_curve` — the same sweep on 1 .. N workers, as threads and as a local cluster of processes,
  against the same tasks split over N independent processes without Dask: the machine's own ceiling (memory
  bandwidth, caches, other load), measured in the same run. Parallel efficiency = t(1) / (N x t(N)).
  Clusters are started and warmed up before timing, so start-up is not counted.
* :func:`task_overhead` — Dask's cost per task: the same tasks through ``execute`` and in a plain loop.
* :func:`mcsim.bench.compile_time.compile_times` — a fresh process with ``MCSIM_NUMBA_CACHE=0``: import time,
  compile time per stage (first call of its kernels on tiny inputs) and what the engine's first sample still
  compiles; and the same process with the on-disk cache, to show what a user pays after the first run.

The scenario is the bundled ``factory`` (installed with the package as ``mcsim.scenarios``) with every stage on;
see :data:`BENCH_OVERRIDES`.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import time

import numpy as np
from dask.distributed import LocalCluster

from mcsim.bench.timing import best_of
from mcsim.execution import api, executor
from mcsim.execution.sample import run_sample
from mcsim.scenario import bundled, draw_uncertain, grid, load_scenario

try:  # macOS and the BSDs (Linux reads /proc); the module does not exist on Windows
    import resource
except ImportError:
    resource = None

#: The benchmark scenario: the bundled factory with every stage on (the batching simulator too).
#: (``mc.warmup_fraction`` pinned at the 0.25 the benchmark's figures were measured with, whatever factory.toml says,
#: so a sample of N requests does the same work as in earlier measurements.)
BENCH_OVERRIDES = ("performance.simulate_batching=true", "mc.samples=8", 'meta.name="bench-factory"',
                   "mc.warmup_fraction=0.25")

#: Lighter prompts in the cache: 512-token blocks (Mooncake's), for the largest request counts.
LIGHT = ("cache.block_tokens=512",)
#: A smaller deployment for the sweep measurements (fewer EP ranks: a cheaper expert stage per sample), without
#: the batching simulator, whose minimum simulated volume would otherwise set the cost of small samples.
SWEEP = ("deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=16", "moe.nodes=4",
         "workload.rate_rps=150", "performance.simulate_batching=false")
#: The axis a benchmark sweep varies; prices change no work, so every point costs the same.
SWEEP_AXIS = "economics.price_output_usd_per_mtok"
WARM_UP_REQUESTS = 2000


def bench_scenario(overrides=()):
    """The bundled ``factory`` scenario with :data:`BENCH_OVERRIDES` and ``--set``-style overrides."""
    return load_scenario(bundled("factory"), overrides=(*BENCH_OVERRIDES, *overrides))


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def peak_rss_bytes() -> int:
    """This process's peak resident set size, bytes.

    Linux: ``VmHWM`` of ``/proc/self/status``, which belongs to this program's own memory map (``ru_maxrss``
    can carry the parent's peak over ``fork`` and ``exec``); elsewhere ``ru_maxrss`` (bytes on macOS).
    """
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    if resource is None:
        return 0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def memory_mark() -> int:
    """Start a peak-memory measurement: the baseline to subtract from :func:`peak_rss_bytes` afterwards.

    Where Linux lets a process reset its peak (``/proc/self/clear_refs``), the peak restarts at the current
    resident size, so what ran before (compilation, warm-up) does not hide a smaller later peak; elsewhere
    the baseline is the peak so far.
    """
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear_refs:
            clear_refs.write("5")
        current = _proc_status_bytes("VmRSS")
        if current is not None:
            return current
    except OSError:
        pass
    return peak_rss_bytes()


def available_memory_bytes() -> int | None:
    """Memory the kernel says is available without swapping (``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def in_subprocess(function: str, env: dict | None = None, module: str = "scaling", fresh: bool = True, **kwargs):
    """Run ``mcsim.bench.<module>.<function>(**kwargs)`` in a fresh Python process; return its JSON result.

    ``fresh=False`` calls it in this process instead (the ``tiny`` suite of the tests, which checks structure, not
    speed or memory: its memory figures then include what this process already held)."""
    if not fresh:  # through JSON all the same: the types a fresh process's answer has (lists, not tuples)
        return json.loads(json.dumps(getattr(importlib.import_module(f"mcsim.bench.{module}"), function)(**kwargs)))
    code = (f"import json, sys\nfrom mcsim.bench import {module} as bench\n"
            f"print('\\n' + json.dumps(bench.{function}(**json.loads(sys.argv[1]))))\n")
    completed = subprocess.run([sys.executable, "-c", code, json.dumps(kwargs)], capture_output=True, text=True,
                               env={**os.environ, **(env or {})}, check=False)
    if completed.returncode != 0:
        raise RuntimeError(f"benchmark process {function}({kwargs}) failed:\n{completed.stderr[-2000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------------
# Requests per sample
# --------------------------------------------------------------------------------------------------------


def pin_to_one_core() -> bool:
    """Confine this thread, and every thread it starts from now on, to one of the CPUs it may run on (Linux's
    ``sched_setaffinity``); False where the platform cannot."""
    if not hasattr(os, "sched_setaffinity"):
        return False
    try:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    except OSError:
        return False
    return True


def measure_sample(requests: int, overrides=(), repeats: int = 2, one_core: bool = True) -> dict:
    """Time one sample of :func:`bench_scenario` in this process; call in a fresh one (:func:`in_subprocess`).

    ``one_core``: run it on one core (:func:`pin_to_one_core`). A streamed sample runs its cache replay on a thread
    of its own; unpinned, that thread overlaps the rest on a second core and the figure is not one core's.

    Returns
    -------
    dict
        ``requests``; ``first_call_s`` (includes first touch of the arrays); ``seconds`` (best of ``repeats``
        later calls); ``requests_per_s``; ``peak_memory_mib`` (peak RSS growth over the warmed-up process);
        ``cores``: 1 when pinned to one core, else None (as many as the process was given).
    """
    pinned = one_core and pin_to_one_core()
    scn = bench_scenario(overrides)
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1).items()}

    def one(n):
        return lambda: run_sample(scn, ("factory",), 0, int(scn["mc.seed"]), n, draws)

    one(WARM_UP_REQUESTS)()  # compile or load the kernels
    before = memory_mark()
    first = best_of(one(requests), 1)
    seconds = min(first, best_of(one(requests), repeats)) if repeats > 0 else first
    return {"requests": int(requests), "first_call_s": first, "seconds": seconds,
            "requests_per_s": requests / seconds,
            "peak_memory_mib": max(0, peak_rss_bytes() - before) / 2**20, "cores": 1 if pinned else None}


def measure_frontier(requests: int) -> dict:
    """One sample of the bundled ``frontier-day`` scenario at ``requests`` (its whole day: 10^8), as ``mcsim run
    --samples 1 --workers 1`` runs it, in this process; call in a fresh one (:func:`in_subprocess`).

    Returns
    -------
    dict
        ``requests``, ``seconds`` (wall: the local cluster's start and the kernels' loading included),
        ``requests_per_s``, ``peak_rss_mib`` (the process's peak resident size).
    """
    start = time.perf_counter()
    api.run(bundled("frontier-day"), samples=1, requests=int(requests), workers=1)
    seconds = time.perf_counter() - start
    return {"requests": int(requests), "seconds": seconds, "requests_per_s": requests / seconds,
            "peak_rss_mib": peak_rss_bytes() / 2**20}


def requests_curve(sizes, overrides=(), repeats: int = 2, largest_if_memory_allows: int | None = None,
                   fresh: bool = True) -> list[dict]:
    """:func:`measure_sample` at each size, each in a fresh process pinned to one core (``fresh``, see
    :func:`in_subprocess`).

    ``largest_if_memory_allows``: one more size, run only if its memory fits in half the memory available now:
    a streamed sample's estimate (:func:`mcsim.execution.executor.sample_bytes`), or else the memory of the
    largest measured size scaled to it (with a 30 % margin); otherwise recorded as skipped.
    """
    # one core in a process of its own; never in this one (fresh=False), whose later threads would inherit it
    out = [in_subprocess("measure_sample", fresh=fresh, requests=int(n), overrides=list(overrides), repeats=repeats,
                         one_core=fresh) for n in sizes]
    if largest_if_memory_allows:
        last = out[-1]
        need = 1.3 * last["peak_memory_mib"] * 2**20 * largest_if_memory_allows / last["requests"]
        plan = executor.make_plan(bench_scenario(overrides), ("factory",), samples=1,
                                  requests=int(largest_if_memory_allows))
        streamed = executor.sample_bytes(plan)
        if streamed < int(largest_if_memory_allows) * executor.BYTES_PER_REQUEST:
            need = streamed
        available = available_memory_bytes()
        if available is not None and need < 0.5 * available:
            out.append(in_subprocess("measure_sample", fresh=fresh, requests=int(largest_if_memory_allows),
                                     overrides=list(overrides), repeats=min(repeats, 1), one_core=fresh))
        else:
            out.append({"requests": int(largest_if_memory_allows), "skipped": (
                f"needs about {need / 2**30:.1f} GiB; "
                + (f"{available / 2**30:.1f} GiB available" if available else "available memory unknown"))})
    return out


# --------------------------------------------------------------------------------------------------------
# Sweeps: grid points, workers, per-task overhead
# --------------------------------------------------------------------------------------------------------


def sweep_plan(requests: int, samples: int, points: int, chunk_size: int = 1):
    """A plan over :data:`SWEEP_AXIS` with ``points`` values on the sweep-sized bench scenario."""
    scn = bench_scenario(SWEEP)
    axes = grid.validate_axes(scn, [grid.Axis(SWEEP_AXIS, tuple(2.0 + 0.1 * i for i in range(points)))])
    return executor.make_plan(scn, ("factory",), axes=axes, samples=samples, requests=requests,
                              chunk_size=chunk_size)


def measure_sweep(points: int, samples: int, requests: int, repeats: int = 1) -> dict:
    """Time a sweep of ``points`` grid points on one worker in this process; call in a fresh one.

    Returns
    -------
    dict
        ``points``, ``tasks``, ``seconds`` (best of ``repeats``, client start-up included, as a user sees it),
        ``peak_memory_mib`` (peak RSS growth over the warmed-up process).
    """
    plan = sweep_plan(requests, samples, points)
    # Compile or load the kernels on a small task, so that the peak of a full-size task counts below.
    executor.run_task(sweep_plan(WARM_UP_REQUESTS, 1, 1), 0, 0)
    before = memory_mark()
    seconds = best_of(lambda: executor.execute(plan, workers=1), repeats)
    return {"points": int(points), "tasks": len(plan.grid) * len(plan.chunks), "seconds": seconds,
            "peak_memory_mib": max(0, peak_rss_bytes() - before) / 2**20}


def grid_curve(point_counts, samples: int, requests: int, repeats: int = 1, fresh: bool = True) -> dict:
    """:func:`measure_sweep` at each grid size, each in a fresh process (``fresh``), and a straight-line fit.

    Returns
    -------
    dict
        ``points``: the measurements; ``seconds_per_point`` and ``fixed_seconds``: slope and intercept of the
        least-squares line through (points, seconds).
    """
    rows = [in_subprocess("measure_sweep", fresh=fresh, points=int(p), samples=samples, requests=requests,
                          repeats=repeats) for p in point_counts]
    x = np.array([r["points"] for r in rows], float)
    y = np.array([r["seconds"] for r in rows], float)
    slope, intercept = np.polyfit(x, y, 1) if len(rows) > 1 else (y[0] / x[0], 0.0)
    return {"samples": samples, "requests": requests, "rows": rows, "seconds_per_point": float(slope),
            "fixed_seconds": float(intercept)}


def solo_sweep(requests: int, samples: int, points: int, part: int, parts: int) -> float:
    """Seconds to run every ``parts``-th task of a sweep from ``part`` in a plain loop (no Dask)."""
    plan = sweep_plan(requests, samples, points)
    executor.run_task(plan, 0, 0)
    tasks = [(p, c) for p in range(len(plan.grid)) for c in range(len(plan.chunks))]
    start = time.perf_counter()
    for p, c in tasks[part::parts]:
        executor.run_task(plan, p, c)
    return time.perf_counter() - start


def independent_processes(n: int, requests: int, samples: int, points: int, fresh: bool = True) -> float:
    """Wall time of the sweep split over ``n`` independent processes started together (the slowest one);
    ``fresh=False``: the ``n`` parts one after another in this process, the slowest part's time."""
    if not fresh:
        return max(solo_sweep(requests, samples, points, i, n) for i in range(n))
    code = ("import sys\nfrom mcsim.bench import scaling\n"
            "print(scaling.solo_sweep(*map(int, sys.argv[1:])))\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(requests), str(samples), str(points), str(i), str(n)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    times = []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"benchmark process failed:\n{err[-2000:]}")
        times.append(float(out.strip().splitlines()[-1]))
    return max(times)


def worker_counts(cores: int | None = None) -> list[int]:
    """1, 2, 4, ... up to the machine's cores, and the cores themselves."""
    cores = int(cores or os.cpu_count() or 1)
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    if counts[-1] != cores:
        counts.append(cores)
    return counts


def workers_curve(requests: int, samples: int, points: int, repeats: int = 2, processes: bool = True,
                  counts=None, fresh: bool = True) -> dict:
    """Sweep time and parallel efficiency on 1 .. N workers (threads, processes) and the machine ceiling.

    Returns
    -------
    dict
        ``workers``: the worker counts; per kind (``threads``, ``processes``, ``independent``): ``seconds``
        and ``efficiency`` lists aligned with ``workers``; ``tasks``.
    """
    counts = list(counts or worker_counts())
    plan = sweep_plan(requests, samples, points)
    executor.run_task(plan, 0, 0)  # compile in the parent, so worker processes load from the cache
    kinds = {"threads": {"processes": False}}
    if processes:
        kinds["processes"] = {"processes": True}
    out = {"workers": counts, "tasks": len(plan.grid) * len(plan.chunks), "requests": requests, "samples": samples,
           "points": points}
    for kind, options in kinds.items():
        seconds = []
        for n in counts:
            shape = {"n_workers": n, "threads_per_worker": 1} if options["processes"] else {
                "n_workers": 1, "threads_per_worker": n}
            with LocalCluster(**shape, processes=options["processes"], dashboard_address=":0",
                              silence_logs=logging.ERROR) as cluster:
                executor.execute(plan, scheduler=cluster.scheduler_address)  # start-up and imports on the workers
                seconds.append(best_of(lambda: executor.execute(plan, scheduler=cluster.scheduler_address), repeats))
        out[kind] = _efficiency(counts, seconds)
    out["independent"] = _efficiency(counts, [independent_processes(n, requests, samples, points, fresh)
                                              for n in counts])
    return out


def _efficiency(counts, seconds) -> dict:
    return {"seconds": seconds, "efficiency": [seconds[0] / (n * s) for n, s in zip(counts, seconds)]}


def task_overhead(requests: int = 200, tasks: int = 40, repeats: int = 2) -> dict:
    """Dask's cost per task: ``tasks`` one-sample tasks through ``execute`` on a local cluster of one thread, and in
    a plain loop."""
    plan = sweep_plan(requests, tasks, 1)
    executor.run_task(plan, 0, 0)

    def direct():
        for c in range(len(plan.chunks)):
            executor.run_task(plan, 0, c)

    direct_s = best_of(direct, repeats)
    # on a cluster of one thread: execute() runs one worker's tasks in its own process, without Dask
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster:
        executor.execute(plan, scheduler=cluster.scheduler_address)  # the client's and the worker's start-up
        dask_s = best_of(lambda: executor.execute(plan, scheduler=cluster.scheduler_address), repeats)
    return {"tasks": tasks, "requests": requests, "direct_s": direct_s, "dask_s": dask_s,
            "overhead_ms_per_task": 1e3 * (dask_s - direct_s) / tasks}

"""The benchmark suite behind ``mcsim bench``: a table, ``bench.json`` and ``scaling.png``.

    mcsim bench [--quick] [--json] [-o DIR]

Every kernel is timed against its pure-Python reference (and a NumPy-vectorized one where it exists) in the
same run, and reported as throughput and ratios, next to the project's performance targets (benchmarks/README.md); then the cost of a
sample against its requests, of a sweep against its grid points and workers, Dask's cost per task, and Numba's
compile time. ``--quick`` uses small inputs and single repeats (about a minute on an idle 2-core machine); the full
suite takes a few minutes.

Python use::

    from mcsim.bench.run import run_suite
    result = run_suite(quick=True, out_dir="outputs/bench")
    result["kernels"][0]["ratio"]          # kernel throughput / reference throughput
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from mcsim.bench import compile_time
from mcsim.bench import kernels as kernel_cases
from mcsim.bench import routing, scaling, small_run
from mcsim.bench.report import (END_TO_END_S_PER_M, PARALLEL_EFFICIENCY, PNG_SIGNATURE, format_kernels, format_table,
                                scaling_png)
from mcsim.bench.timing import best_of, machine
from mcsim.fileio import atomic_write
from mcsim.text import si

__all__ = ["PARTS", "PNG_SIGNATURE", "SETTINGS", "bench_command", "format_table", "run_suite"]

DEFAULT_OUT_DIR = Path("outputs") / "bench"
PARTS = kernel_cases.STAGES + ("small", "routing", "requests", "grid", "workers", "overhead", "compile", "frontier")


@dataclass(frozen=True)
class SuiteSettings:
    """Sizes and repeats of one suite run (``full``, ``quick``, or ``tiny`` for the test suite)."""

    kernels: kernel_cases.KernelSizes
    repeats_fast: int
    repeats_reference: int
    request_sizes: tuple
    request_repeats: int
    request_largest: int | None = None
    light_sizes: tuple = ()
    light_largest: int | None = None
    grid_points: tuple = (1, 2)
    grid_samples: int = 2
    grid_requests: int = 10_000
    workers_requests: int = 20_000
    workers_samples: int = 4
    workers_points: int = 2
    workers_repeats: int = 1
    workers_processes: bool = False
    overhead_tasks: int = 16
    compile: bool = False
    end_to_end_requests: int = 1_000_000
    frontier_requests: int = 100_000_000  # the frontier day's sample, run only when asked for (parts)
    fresh_processes: bool = True  # each measurement in a process of its own (False: in this one, for ``tiny``)
    small_requests: int = small_run.REQUESTS  # the small run, process start to file
    small_command: bool = True  # also time ``mcsim run`` itself as a command of its own
    routing_requests: int = 400  # requests per instance of the routing curve
    routing_instances: tuple = routing.INSTANCES


SETTINGS = {
    "full": SuiteSettings(kernel_cases.FULL, 3, 2, (10_000, 100_000, 1_000_000), 2, request_largest=10_000_000,
                          light_sizes=(100_000, 1_000_000), light_largest=10_000_000,
                          grid_points=(1, 2, 4, 8), grid_samples=4, grid_requests=20_000,
                          workers_requests=50_000, workers_samples=8, workers_points=4, workers_repeats=2,
                          workers_processes=True, overhead_tasks=40, compile=True),
    "quick": SuiteSettings(kernel_cases.QUICK, 2, 1, (10_000, 100_000, 1_000_000), 1,
                           grid_points=(1, 4), grid_samples=2, grid_requests=10_000,
                           workers_requests=20_000, workers_samples=4, workers_points=2, workers_repeats=1,
                           overhead_tasks=16, frontier_requests=1_000_000, routing_requests=200),
    "tiny": SuiteSettings(kernel_cases.TINY, 1, 1, (3_000, 6_000), 0, grid_points=(1, 2), grid_samples=1,
                          grid_requests=2_000, workers_requests=2_000, workers_samples=2, workers_points=1,
                          overhead_tasks=4, frontier_requests=3_000, fresh_processes=False, small_requests=1_000,
                          small_command=False, routing_requests=20, routing_instances=(2, 8)),
}


def _progress(message: str) -> None:
    print(f"mcsim bench: {message}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------------------
# The suite
# --------------------------------------------------------------------------------------------------------


def kernel_rows(settings: SuiteSettings, stages=kernel_cases.STAGES, progress=_progress) -> list[dict]:
    """Time every case of ``stages``: throughput per second of the kernel and its references, and the ratios."""
    rows = []
    progress = progress or (lambda message: None)
    for stage in stages:
        progress(f"kernels: {stage}")
        for case in kernel_cases.cases(stage, settings.kernels):
            fast_s = best_of(case["fast"], settings.repeats_fast)
            reference_s = best_of(case["reference"], settings.repeats_reference)
            row = {
                "stage": case["stage"], "name": case["name"], "unit": case["unit"],
                "items_fast": case["items_fast"], "fast_s": fast_s, "fast": case["items_fast"] / fast_s,
                "items_reference": case["items_reference"], "reference_s": reference_s,
                "reference": case["items_reference"] / reference_s,
                "items_numpy": None, "numpy_s": None, "numpy": None, "ratio_numpy": None,
            }
            row["ratio"] = row["fast"] / row["reference"]
            if case["numpy"] is not None:
                numpy_s = best_of(case["numpy"], settings.repeats_reference)
                row.update(items_numpy=case["items_numpy"], numpy_s=numpy_s,
                           numpy=case["items_numpy"] / numpy_s)
                row["ratio_numpy"] = row["fast"] / row["numpy"]
            row["target"] = _kernel_target(row, case["target"])
            rows.append(row)
    return rows


def _kernel_target(row: dict, target: dict | None) -> dict | None:
    if target is None:
        return None
    checks, figures = [], []
    if target["per_s"] is not None:
        checks.append(row["fast"] >= target["per_s"])
        figures.append(f"{si(row['fast'])}/s vs {si(target['per_s'])}/s")
    if target["ratio"] is not None:
        checks.append(row["ratio"] >= target["ratio"])
        figures.append(f"{row['ratio']:.0f}x vs {target['ratio']:.0f}x")
    return {"text": target["text"], "met": all(checks), "figure": "; ".join(figures)}


def run_suite(quick: bool, out_dir=None, *, size: str | None = None, parts=None, progress=_progress) -> dict:
    """Run the benchmark suite, write ``bench.json`` and ``scaling.png`` into ``out_dir``, return the results.

    Parameters
    ----------
    quick : bool
        Small inputs and single repeats (about a minute on an idle 2-core machine) instead of the full
        suite.
    out_dir : path, optional
        Folder for the outputs (created); default ``outputs/bench``.
    size : {"full", "quick", "tiny"}, optional
        Overrides ``quick``; ``"tiny"`` is for the test suite (a structure check, not a measurement).
    parts : iterable of str, optional
        A subset of :data:`PARTS` (kernel stages, ``requests``, ``grid``, ``workers``, ``overhead``,
        ``compile``, ``frontier``); default: all that the size runs (``frontier``, one sample of the frontier day
        at ``SuiteSettings.frontier_requests``, only when named here).
    progress : callable, optional
        Receives one line per step (default: printed to stderr); ``None`` silences it.

    Returns
    -------
    dict
        ``suite``, ``machine``, ``kernels`` (one row per case: throughputs ``fast``, ``reference``, ``numpy`` in
        units/s, ``ratio = fast / reference``, ``ratio_numpy = fast / numpy``, seconds and items of each, and
        the performance target with ``met``), ``scaling`` (``requests``, ``requests_light``, ``grid``, ``workers``,
        ``overhead``, ``compile``; absent parts are None), ``targets`` (one line per performance target: ``met`` is
        True, False or None when not measured), ``seconds`` (the whole run) and ``paths`` (``json``, ``png``).
    """
    size = size or ("quick" if quick else "full")
    settings = SETTINGS[size]
    progress = progress or (lambda message: None)
    chosen = set(PARTS if parts is None else parts)
    unknown = chosen - set(PARTS)
    if unknown:
        raise ValueError(f"unknown benchmark parts {sorted(unknown)}; expected some of {', '.join(PARTS)}")
    start = time.perf_counter()
    result = {"suite": size, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(),
              "kernels": kernel_rows(settings, [s for s in kernel_cases.STAGES if s in chosen], progress)}
    sc: dict = dict.fromkeys(("small", "routing", "requests", "requests_light", "grid", "workers", "overhead",
                              "compile", "frontier"))
    if "small" in chosen:
        progress(f"a small run, process start to file ({settings.small_requests:,} requests of "
                 f"{small_run.SCENARIO})")
        def phases():
            return scaling.in_subprocess("phases", module="small_run", fresh=settings.fresh_processes,
                                         requests=settings.small_requests, fresh_process=settings.fresh_processes)

        if settings.fresh_processes:
            phases()  # once the kernels are cached: a first process may still compile a path
        sc["small"] = {
            "phases": phases(),
            "command": small_run.whole_command(settings.small_requests) if settings.small_command else None}
    if "routing" in chosen:
        progress(f"least-outstanding routing at {', '.join(map(str, settings.routing_instances))} instances")
        sc["routing"] = scaling.in_subprocess("routing_curve", module="routing", fresh=settings.fresh_processes,
                                              requests_per_instance=settings.routing_requests,
                                              instances=list(settings.routing_instances))
    if "requests" in chosen:
        more = f" (and {settings.request_largest:,} if memory allows)" if settings.request_largest else ""
        progress(f"one sample at {', '.join(f'{n:,}' for n in settings.request_sizes)} requests{more}")
        sc["requests"] = scaling.requests_curve(settings.request_sizes, repeats=settings.request_repeats,
                                                largest_if_memory_allows=settings.request_largest,
                                                fresh=settings.fresh_processes)
        if settings.light_sizes:
            progress(f"one sample with 512-token blocks at {', '.join(f'{n:,}' for n in settings.light_sizes)} "
                     f"requests (and {settings.light_largest:,} if memory allows)")
            sc["requests_light"] = scaling.requests_curve(settings.light_sizes, scaling.LIGHT,
                                                          repeats=min(settings.request_repeats, 1),
                                                          largest_if_memory_allows=settings.light_largest,
                                                          fresh=settings.fresh_processes)
    if "grid" in chosen:
        progress(f"sweeps of {', '.join(map(str, settings.grid_points))} grid points")
        sc["grid"] = scaling.grid_curve(settings.grid_points, settings.grid_samples, settings.grid_requests,
                                        fresh=settings.fresh_processes)
    if "workers" in chosen:
        progress(f"sweep on 1 .. {os.cpu_count()} workers")
        sc["workers"] = scaling.workers_curve(settings.workers_requests, settings.workers_samples,
                                              settings.workers_points, settings.workers_repeats,
                                              processes=settings.workers_processes, fresh=settings.fresh_processes)
    if "overhead" in chosen:
        progress("Dask per-task overhead")
        sc["overhead"] = scaling.task_overhead(200, settings.overhead_tasks, max(1, settings.workers_repeats))
    if "compile" in chosen and (settings.compile or parts is not None):
        progress("Numba compile time (fresh processes, cache off and on)")
        sc["compile"] = compile_time.compile_times()
    if "frontier" in chosen and parts is not None:  # minutes: only when asked for
        progress(f"the frontier day: one sample of {settings.frontier_requests:,} requests"
                 + (" in a fresh process" if settings.fresh_processes else ""))
        sc["frontier"] = scaling.in_subprocess("measure_frontier", fresh=settings.fresh_processes,
                                               requests=settings.frontier_requests)
    result["scaling"] = sc
    result["targets"] = design_targets(result, settings)
    result["seconds"] = time.perf_counter() - start

    out_dir = Path(DEFAULT_OUT_DIR if out_dir is None else out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "png": out_dir / "scaling.png"}
    result["against_previous"] = against_previous(_previous(paths["json"], size), result)
    atomic_write(paths["json"], (json.dumps(result, indent=2) + "\n").encode())
    atomic_write(paths["png"], scaling_png(result))
    result["paths"] = {k: str(v) for k, v in paths.items()}
    return result


def _previous(path: Path, size: str) -> dict | None:
    """The run before this one in the same folder, of the same size (None without one, or when it cannot be
    read)."""
    try:
        previous = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return previous if isinstance(previous, dict) and previous.get("suite") == size else None


def _figures(result: dict) -> dict:
    """``{name: (value, higher_is_better)}`` of a run's figures that a later run is compared with."""
    out = {}
    for row in result.get("kernels") or []:
        out[f"{row['name']} ({row['unit']}/s)"] = (row["fast"], True)
    sc = result.get("scaling") or {}
    small = sc.get("small") or {}
    if small.get("command"):
        out["a small run, CPU s"] = (small["command"]["cpu_s"], False)
    if sc.get("routing"):
        out["least-outstanding, largest / smallest fleet"] = (sc["routing"]["ratio"], False)
        out["least-outstanding at the largest fleet, s a request"] = (sc["routing"]["rows"][-1]["least-outstanding"],
                                                                       False)
    for row in sc.get("requests") or []:
        if "seconds" in row:
            out[f"one sample of {row['requests']:,} requests, s"] = (row["seconds"], False)
    if sc.get("frontier"):
        out["the frontier day's sample, s"] = (sc["frontier"]["seconds"], False)
    return out


def against_previous(previous: dict | None, result: dict) -> dict | None:
    """Each figure of ``result`` that ``previous`` (the run before, same folder and size) also has, as a speed-up
    over it (> 1: faster now, or a smaller ratio), with both values; None without a run before."""
    if previous is None:
        return None
    before, now = _figures(previous), _figures(result)
    rows = []
    for name, (value, higher) in now.items():
        if name not in before or not before[name][0] or not value:
            continue
        speedup = value / before[name][0] if higher else before[name][0] / value
        rows.append({"figure": name, "before": before[name][0], "now": value, "speedup": speedup})
    return {"created": previous.get("created", ""), "rows": rows}


def design_targets(result: dict, settings: SuiteSettings) -> list[dict]:
    """The project's performance targets (benchmarks/README.md), each with the figure measured here and ``met`` (None: not measured)."""
    rows = result["kernels"]
    out = []

    def add(target, met, figure):
        out.append({"target": target, "met": met, "figure": figure})

    for stage, label, per_s, unit in (("kv_tiers", "KV tiers", 50e6, "block look-ups"),
                                      ("speculative", "speculative draws", 200e6, "draft tokens"),
                                      ("experts", "expert routing", 100e6, "token-expert assignments"),
                                      ("batching", "batching simulator", 1e6, "simulated requests")):
        mine = [r for r in rows if r["stage"] == stage and r["target"] is not None]
        if not mine:
            add(f"{label}: >= {si(per_s)} {unit}/s/core", None, "not measured")
            continue
        slowest = min(mine, key=lambda r: r["fast"])
        add(f"{label}: >= {si(per_s)} {unit}/s/core", all(r["fast"] >= per_s for r in mine),
            f"{si(slowest['fast'])}/s slowest case ({slowest['name']}), "
            f"{si(max(r['fast'] for r in mine))}/s fastest")
        if stage == "kv_tiers":
            add("KV tiers: >= 50x the OrderedDict reference", all(r["ratio"] >= 50 for r in mine),
                f"{min(r['ratio'] for r in mine):.0f}x")

    sc = result["scaling"]
    small = sc.get("small")
    label = (f"a small run ({small_run.REQUESTS:,} requests of {small_run.SCENARIO}), process start to file: <= "
             f"{small_run.TARGET_CPU_S:g} s of CPU once the kernels are cached")
    if small and small.get("command") and small["command"]["requests"] == small_run.REQUESTS:
        c, ph = small["command"], small["phases"]
        add(label, c["cpu_s"] <= small_run.TARGET_CPU_S,
            f"{c['cpu_s']:.2f} s of CPU ({c['wall_s']:.2f} s wall), {ph['ratio_to_simulate']:.0f}x the simulation "
            f"alone ({ph['simulate_s']:.3f} s)")
    else:
        add(label, None, "not measured")
    curve = sc.get("routing")
    label = (f"least-outstanding routing: per request at {routing.INSTANCES[-1]} instances <= "
             f"{routing.TARGET_RATIO:g}x at {routing.INSTANCES[0]} (the same load per instance)")
    if curve and tuple(r["instances"] for r in curve["rows"]) == routing.INSTANCES:
        rows = curve["rows"]
        add(label, curve["ratio"] <= routing.TARGET_RATIO,
            f"{curve['ratio']:.2f}x ({rows[0]['least-outstanding'] * 1e6:.2f} -> "
            f"{rows[-1]['least-outstanding'] * 1e6:.2f} us a request; round-robin {curve['ratio_round_robin']:.2f}x)")
    else:
        add(label, None, "not measured")
    n = settings.end_to_end_requests
    at_n = [r for r in (sc["requests"] or []) if r["requests"] == n and "seconds" in r]
    if at_n:
        r = at_n[0]
        one_core = r.get("cores") == 1
        add(f"end to end: one sample of {n:,} requests in <= {END_TO_END_S_PER_M * n / 1e6:g} s on one core, every "
            "stage on", (r["seconds"] <= END_TO_END_S_PER_M * n / 1e6) if one_core else None,
            f"{r['seconds']:.2f} s best call, {r['first_call_s']:.2f} s first call (first touch of its arrays)"
            + ("" if one_core else "; on every core the process had (this platform cannot pin it to one)"))
    else:
        add(f"end to end: one sample of {n:,} requests in <= {END_TO_END_S_PER_M * n / 1e6:g} s on one core, every "
            "stage on", None, "not measured")

    day = sc.get("frontier")
    if day and day["requests"] >= 100_000_000:
        add("the frontier day: one sample of 10^8 requests in <= 15 minutes", day["seconds"] <= 900,
            f"{day['seconds'] / 60:.1f} min, {si(day['requests_per_s'])} requests/s, peak RSS "
            f"{day['peak_rss_mib'] / 1024:.2f} GiB")

    workers = sc["workers"]
    if workers and 2 in workers["workers"]:
        i = workers["workers"].index(2)
        ceiling = workers["independent"]["efficiency"][i]
        for kind in ("threads", "processes"):
            if kind in workers:
                eff = workers[kind]["efficiency"][i]
                add(f"sweep on Dask {kind}: >= {100 * PARALLEL_EFFICIENCY:g} % parallel efficiency from 1 to 2 "
                    "workers", eff >= PARALLEL_EFFICIENCY,
                    f"{100 * eff:.1f} % ({100 * eff / ceiling:.0f} % of the {100 * ceiling:.1f} % that two "
                    "independent processes reach in the same run)")
    else:
        add(f"sweep: >= {100 * PARALLEL_EFFICIENCY:g} % parallel efficiency from 1 to 2 workers", None,
            "not measured" if not workers else "not measured: this machine has one core")

    grid = sc["grid"]
    if grid and len(grid["rows"]) > 1:
        first, last = grid["rows"][0], grid["rows"][-1]
        growth = last["peak_memory_mib"] - first["peak_memory_mib"]
        # Bounded: the peak grows by less than a quarter of one point's (or 16 MiB) when the grid grows.
        bound = max(0.25 * first["peak_memory_mib"], 16.0)
        add("peak memory bounded by the chunk, not the grid", growth <= bound,
            f"peak memory growth {first['peak_memory_mib']:.0f} MiB at {first['points']} grid point"
            f"{'s' if first['points'] > 1 else ''}, {last['peak_memory_mib']:.0f} MiB at {last['points']}")
    else:
        add("peak memory bounded by the chunk, not the grid", None, "not measured")
    return out


# --------------------------------------------------------------------------------------------------------
# Command
# --------------------------------------------------------------------------------------------------------


def bench_command(quick, as_json, out_dir):
    """``mcsim bench``: run the suite, print the table (or the JSON), write ``bench.json`` and ``scaling.png``.

    Parameters
    ----------
    quick : bool
    as_json : bool
        Print the results as JSON instead of the table.
    out_dir : path or None
        Default ``outputs/bench``.

    Returns
    -------
    dict
        ``{"json": path, "png": path}`` of the files written.
    """
    result = run_suite(bool(quick), out_dir)
    print(json.dumps(result, indent=2) if as_json else format_table(result), flush=True)
    return {key: Path(path) for key, path in result["paths"].items()}


def print_stage(stage: str, quick: bool = False) -> list[dict]:
    """Time one stage's kernel cases and print their table (``python benchmarks/bench_<stage>.py``)."""
    rows = kernel_rows(SETTINGS["quick" if quick else "full"], [stage], progress=None)
    print("\n".join(format_kernels(rows)), flush=True)
    return rows


#: Part names of the earlier ``benchmarks/run.py --only``.
ALIASES = {"e2e": ("requests",), "sweep": ("grid", "workers", "overhead")}


def main(argv=None) -> int:
    """``python -m mcsim.bench.run [--quick] [--json] [-o DIR] [--only PARTS]`` (the same as ``mcsim bench``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="small inputs, single repeats (about a minute on 2 idle cores)")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print the results as JSON")
    parser.add_argument("-o", "--output", dest="out_dir", default=None, help="folder (default outputs/bench)")
    parser.add_argument("--only", default="", help=f"comma-separated parts: {', '.join(PARTS)}")
    args = parser.parse_args(argv)
    only = [q for p in args.only.split(",") if p for q in ALIASES.get(p, (p,))] or None
    if only is None:
        bench_command(args.quick, args.as_json, args.out_dir)
        return 0
    result = run_suite(args.quick, args.out_dir, parts=only)
    print(json.dumps(result, indent=2) if args.as_json else format_table(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

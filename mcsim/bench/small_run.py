"""A small run, process start to file: what a user who scripts a hundred small studies pays for each.

Two measurements, each in a fresh process, once the kernels are in Numba's on-disk cache:

- :func:`whole_command` runs ``mcsim run SCENARIO --samples 1 --requests N -o FILE`` as a command of its own and
  reads the CPU time it used (``RUSAGE_CHILDREN``): interpreter, imports, kernel loading, simulation, assembly and
  the NetCDF file, as a user's shell would run it;
- :func:`phases` runs the same work as the command does, phase by phase, in one process, timing each by the
  process's CPU clock: the interpreter's start, the imports, reading the scenario, Numba's runtime (its first call
  of any compiled kernel builds its compilation context, whatever the kernel: it imports Numba's implementations of
  NumPy, which import ``scipy.linalg`` to look for BLAS), loading the kernels (the first sample less the second),
  the simulation (the second sample, the same work again with every kernel loaded), the Dataset's assembly and
  the file's writing.

This module imports nothing of mcsim at its top, so that :func:`phases`, run in a fresh process, times the imports
every command pays.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from importlib import resources

#: The bundled scenario and the size of the small run (the target: <= 1 s of CPU, process start to file).
SCENARIO = "dense-node"
REQUESTS = 10_000
TARGET_CPU_S = 1.0


def _scenario_path() -> str:
    return str(resources.files("mcsim.scenarios") / f"{SCENARIO}.toml")


def phases(requests: int = REQUESTS, fresh_process: bool = True) -> dict:
    """CPU seconds of each phase of a small run in this (fresh) process; see the module's docstring.
    ``fresh_process=False`` (the test suite's tiny bench, in the test's own process) leaves xarray as it is."""
    start = time.process_time()  # the interpreter's start and this module's import, before any of mcsim's
    out = {"requests": requests, "interpreter_s": start}
    clock = [start]

    def lap(name):
        now = time.process_time()
        out[f"{name}_s"] = now - clock[0]
        clock[0] = now

    # timed: what the command imports before its first kernel runs (its command-line library and the run's)
    import click  # noqa: F401
    from mcsim.execution import api, executor  # noqa: F401
    from mcsim.results import dataset as results
    from mcsim.scenario import load_scenario
    from mcsim.stages import steady_state  # the run imports it too; here for one small cached kernel

    if fresh_process:  # as the command's own process does (mcsim.cli.console)
        results.numpy_arrays_only()
    lap("imports")
    scn = load_scenario(_scenario_path())
    plan = executor.make_plan(scn, ("factory",), samples=1, requests=requests)
    lap("scenario")
    steady_state.check([], [], [(0, 0)] * 4, 1.0)  # one small cached kernel: Numba's runtime starts here
    lap("numba_runtime")
    first_start = time.process_time()
    rows = executor.run_task(plan, 0, 0)
    first = time.process_time() - first_start
    again_start = time.process_time()
    rows = executor.run_task(plan, 0, 0)
    out["simulate_s"] = time.process_time() - again_start
    out["kernel_load_s"] = max(0.0, first - out["simulate_s"])
    clock[0] = time.process_time()
    table = results.rows_to_table(rows, plan.saved_variants)
    ds = executor._assemble(plan, {(0, 0): table}, executor.run_attrs(plan, "bench", plan.fingerprint(), 0, 0))
    lap("assemble")
    with tempfile.TemporaryDirectory() as folder:
        results.write_netcdf(ds, os.path.join(folder, "small.nc"))
    lap("write")
    out["total_s"] = time.process_time()
    out["ratio_to_simulate"] = out["total_s"] / max(out["simulate_s"], 1e-9)
    return out


def whole_command(requests: int = REQUESTS, repeats: int = 3) -> dict:
    """CPU seconds of ``mcsim run`` of the small run as a command of its own, the best of ``repeats`` (the first
    of which also fills the on-disk caches if they are empty: it is never the only one)."""
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        out_file = os.path.join(folder, "small.nc")
        command = [sys.executable, "-m", "mcsim", "run", _scenario_path(), "--samples", "1", "--requests",
                   str(requests), "-o", out_file, "--force", "--no-progress"]
        for _ in range(max(repeats, 2)):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            wall = time.perf_counter()
            done = subprocess.run(command, capture_output=True, text=True, check=False)
            wall = time.perf_counter() - wall
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            if done.returncode != 0:
                raise RuntimeError(f"{' '.join(command)} failed:\n{done.stderr[-2000:]}")
            runs.append({"cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
                         "wall_s": wall})
    best = min(runs[1:], key=lambda r: r["cpu_s"])
    return {"requests": requests, "cpu_s": best["cpu_s"], "wall_s": best["wall_s"],
            "runs_cpu_s": [r["cpu_s"] for r in runs], "target_cpu_s": TARGET_CPU_S}

"""Numba compile time: import, each stage's first kernel calls and the engine's first sample, in a fresh process.

This module imports nothing of mcsim at its top, so that :func:`measure_compile`, run in a fresh process, times
the imports every command pays.
"""

from __future__ import annotations

import time


def measure_compile() -> dict:
    """Import time, per-stage first-call time of the kernels and the engine's first sample, in this process.

    Call it in a fresh process (:func:`compile_times`): with ``MCSIM_NUMBA_CACHE=0`` the first calls compile,
    with the cache on they load compiled code from disk.
    """
    start = time.perf_counter()
    # timed: what every command pays before any kernel runs (this module imports nothing of mcsim above)
    import mcsim.execution.sample
    from mcsim.bench import kernels

    out = {"import_s": time.perf_counter() - start, "stages_s": {}}
    for stage in kernels.STAGES:
        start = time.perf_counter()
        kernels.cases(stage, kernels.TINY)  # first calls on tiny inputs: compile time, nearly all of it
        out["stages_s"][stage] = time.perf_counter() - start
    # after the timed imports: the benchmark's own (Dask's cluster among them) are no command's
    from mcsim.bench import scaling

    scn = scaling.bench_scenario()
    draws = {k: float(v[0]) for k, v in mcsim.scenario.draw_uncertain(scn, [0], 1).items()}

    def sample():
        mcsim.execution.sample.run_sample(scn, ("factory",), 0, 1, scaling.WARM_UP_REQUESTS, draws)

    first = scaling.best_of(sample, 1)
    again = scaling.best_of(sample, 1)
    # What the engine still compiles after the benchmarked kernels (workload, routing variants, signatures).
    out["engine_s"] = max(0.0, first - again)
    out["total_s"] = out["import_s"] + sum(out["stages_s"].values()) + out["engine_s"]
    return out


def compile_times(cached: bool = True) -> dict:
    """:func:`measure_compile` in a fresh process with the on-disk cache off (``compiled``) and, if ``cached``,
    on (``cached``: loading what an earlier run compiled)."""
    # in the parent only: imported at the top, scaling's imports would be timed in the child
    from mcsim.bench.scaling import in_subprocess

    out = {"compiled": in_subprocess("measure_compile", env={"MCSIM_NUMBA_CACHE": "0"}, module="compile_time")}
    if cached:
        out["cached"] = in_subprocess("measure_compile", env={"MCSIM_NUMBA_CACHE": "1"}, module="compile_time")
    return out

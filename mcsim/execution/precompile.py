"""Compile every kernel a run will need, once per machine and version, before the run: not silently inside it.

Numba compiles a kernel at its first call and keeps the machine code in its on-disk cache
(:mod:`mcsim.accelerate`); from then on a process loads it in milliseconds. From cold, the first run of a path
(the one-instance simulator, the streamed sample, the replicas of a fleet, the roofline, the KV tiers, the expert
and speculative stages) would otherwise stop without a word while it compiles (``mcsim bench``'s "Numba,
fresh process" row times it). :func:`compile_all` runs each path once
on a few hundred requests, with a progress bar, and leaves a stamp beside the cache; the ``mcsim`` command runs it
with a one-line notice when the stamp is missing, and ``mcsim bench --compile`` runs it on demand (a container
image or a cluster's workers can be built warm).

The stamp is named by Numba's version, Python's and the host CPU's, inside the cache folder that
:mod:`mcsim.accelerate` names by a digest of every kernel source: a new version, a changed kernel or another machine
finds no stamp and compiles again.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import llvmlite.binding
import numba
import tqdm

from mcsim import accelerate
from mcsim.execution import executor
from mcsim.scenario import bundled, load_scenario

#: The paths compiled, in order: (what, bundled scenario, --set overrides, requests). Small enough that running
#: them costs a fraction of a second once compiled; together they call every kernel a bundled scenario calls.
PATHS = (
    ("the one-instance simulator, dense", "dense-node", (), 400),
    ("the roofline", "dense-node", ('performance.fidelity="roofline"',), 400),
    ("a streamed sample", "dense-node", ("mc.chunk_requests=300",), 900),
    ("experts, speculative decoding, KV tiers, prefill/decode", "factory",
     ("deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=32", "moe.nodes=4"), 400),
    ("a fleet's replicas, streamed", "frontier-day", ("mc.chunk_requests=300",), 900),
    ("static batching and a closed loop", "dense-node",
     ('deployment.batching="static"', "performance.closed_loop_users=4"), 300),
)


def cache_on() -> bool:
    """Whether compiled kernels are kept on disk (``MCSIM_NUMBA_CACHE``)."""
    return bool(accelerate.CACHE)


def stamp_path() -> Path | None:
    """The stamp that says this machine has compiled this version's kernels (None where nothing is cached);
    :mod:`mcsim.accelerate` has set Numba's cache folder to the kernels' digest folder."""
    if not cache_on() or not numba.config.CACHE_DIR:
        return None
    name = (f"mcsim-compiled-numba{numba.__version__}-py{sys.version_info.major}{sys.version_info.minor}-"
            f"{llvmlite.binding.get_host_cpu_name()}-{platform.machine()}")
    return Path(numba.config.CACHE_DIR) / name


def is_compiled() -> bool:
    """Whether :func:`compile_all` has run for this version on this machine (always True with the cache off:
    nothing would be kept)."""
    stamp = stamp_path()
    return stamp is None or stamp.is_file()


def compile_all(progress=None, bar: bool = False) -> dict:
    """Run every path of :data:`PATHS` once (compiling or loading its kernels) and write the stamp.

    Parameters
    ----------
    progress : callable, optional
        ``progress(done, total, what)`` before each path and once at the end.
    bar : bool
        Draw a progress bar on stderr.

    Returns
    -------
    dict
        ``seconds`` per path (``{what: s}``) and ``total_s``.
    """
    seconds = {}
    shown = tqdm.tqdm(total=len(PATHS), unit="path", desc="compiling", leave=False, file=sys.stderr) if bar else None
    for i, (what, scenario, overrides, requests) in enumerate(PATHS):
        if progress is not None:
            progress(i, len(PATHS), what)
        if shown is not None:
            shown.set_postfix_str(what, refresh=True)
        start = time.perf_counter()
        scn = load_scenario(bundled(scenario), overrides=overrides)
        variants = ("baseline", "factory") if scenario == "factory" else ("factory",)
        executor.run_task(executor.make_plan(scn, variants, samples=1, requests=requests), 0, 0)
        seconds[what] = time.perf_counter() - start
        if shown is not None:
            shown.update(1)
    if shown is not None:
        shown.close()
    if progress is not None:
        progress(len(PATHS), len(PATHS), "done")
    stamp = stamp_path()
    if stamp is not None:
        try:
            stamp.parent.mkdir(parents=True, exist_ok=True)
            stamp.write_text(f"compiled in {sum(seconds.values()):.1f} s\n")
        except OSError:  # a cache folder this user cannot write: the next run compiles (loads) up front again
            pass
    return {"seconds": seconds, "total_s": sum(seconds.values())}

"""Where a run's process memory goes before any sample: resident size after each step of a fresh process.

    python benchmarks/process_floor.py

Steps: Python started; mcsim's command line, executor and sample modules imported; dask.distributed imported (a
run's local cluster needs it); Numba's first kernel called (a trivial one: LLVM and Numba's runtime set up, whatever
the kernel); a 2,000-request `mcsim run` of the factory on one worker (the project's kernels loaded from the cache,
the local cluster). Then whether the run imported scipy.stats (only a truncated normal needs it), and what importing
it would add, in memory and time.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def resident_mib() -> float:
    """This process's resident set size now (Linux ``/proc/self/status``), MiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main() -> list[tuple[str, float]]:
    steps = [("Python", resident_mib())]
    import mcsim.cli  # noqa: F401
    from mcsim.execution import executor, sample  # noqa: F401

    steps.append(("mcsim's modules", resident_mib()))
    import distributed  # noqa: F401

    steps.append(("dask.distributed", resident_mib()))
    import numba
    import numpy as np

    numba.njit(lambda x: x.sum())(np.ones(3))
    steps.append(("Numba's first kernel", resident_mib()))
    from mcsim.cli import main as cli

    with tempfile.TemporaryDirectory() as folder, contextlib.redirect_stdout(io.StringIO()):
        try:
            cli(["run", str(ROOT / "scenarios" / "factory.toml"), "--samples", "1", "--requests", "2000",
                 "--workers", "1", "--no-progress", "-o", str(Path(folder) / "out.nc")], standalone_mode=False)
        finally:
            steps.append(("a 2,000-request run", resident_mib()))
    print(f"{'after':<24} {'resident':>10} {'added':>8}")
    last = 0.0
    for name, mib in steps:
        print(f"{name:<24} {mib:>6.0f} MiB {mib - last:>+6.0f}")
        last = mib
    print(f"scipy.stats imported by the run: {'scipy.stats' in sys.modules}")
    before, start = resident_mib(), time.perf_counter()
    import scipy.stats  # noqa: F401

    print(f"importing it now: {time.perf_counter() - start:.2f} s, {resident_mib() - before:+.0f} MiB")
    return steps


if __name__ == "__main__":
    main()

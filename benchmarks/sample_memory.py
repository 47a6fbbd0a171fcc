"""Peak memory and wall time of one sample of a scenario at growing request counts, each in a process of its own.

Runs ``mcsim run SCENARIO --samples 1 --requests N --workers 1`` for each N and prints the child's peak resident set
size (``getrusage(RUSAGE_CHILDREN)``, what ``/usr/bin/time -v`` reports as its maximum resident set size) and wall
time, and the memory per request between consecutive sizes.

    python benchmarks/sample_memory.py [scenario] [N ...] [--set KEY=VALUE ...]

``--set`` overrides go to every run (``--set cache.enabled=false``: every stage but the KV tiers).
"""

from __future__ import annotations

import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def peak_and_wall(scenario: str, requests: int, overrides=()) -> tuple[float, float]:
    """Peak RSS (bytes) and wall time (s) of one sample of ``requests`` in a fresh process."""
    with tempfile.TemporaryDirectory() as folder:
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "mcsim", "run", scenario, "--samples", "1", "--requests", str(requests),
                        "--workers", "1", "--no-progress", "-o", str(Path(folder) / "out.nc"),
                        *[x for o in overrides for x in ("--set", o)]], check=True,
                       capture_output=True)
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak <= before:  # the largest child so far is an earlier one: run sizes in increasing order
        raise RuntimeError("run the sizes in increasing order (getrusage keeps the largest child's peak)")
    return peak * 1024.0, wall


def main(scenario: str = str(ROOT / "scenarios" / "factory.toml"), sizes=(100_000, 1_000_000, 4_000_000),
         overrides=()) -> None:
    print(f"{'requests':>12} {'peak RSS':>10} {'wall':>8} {'bytes per request (from the size before)':>42}")
    last = None
    for n in sorted(sizes):
        peak, wall = peak_and_wall(scenario, n, overrides)
        per = "" if last is None else f"{(peak - last[1]) / (n - last[0]):.0f}"
        print(f"{n:>12,} {peak / 2**30:>8.2f} GiB {wall:>6.1f} s {per:>42}")
        last = (n, peak)


if __name__ == "__main__":
    args, overrides = sys.argv[1:], []
    while "--set" in args:
        i = args.index("--set")
        overrides.append(args[i + 1])
        del args[i:i + 2]
    main(*(args[:1] or [str(ROOT / "scenarios" / "factory.toml")]),
         **({"sizes": tuple(int(a) for a in args[1:])} if len(args) > 1 else {}), overrides=overrides)

"""Sweep scaling: Dask's per-task overhead and the parallel efficiency from 1 to N workers.

    python benchmarks/sweep_scaling.py [--requests 50000] [--samples 8] [--points 4] [--repeats 2]

Threads and a local cluster of processes, next to the same tasks split over independent processes without
Dask (the machine's own ceiling, measured in the same run). The measurements live in
:mod:`mcsim.bench.scaling`; ``mcsim bench`` runs them with the rest of the suite.
"""

from __future__ import annotations

import argparse


def main(argv=None):
    from mcsim.bench import scaling
    from mcsim.bench.report import format_scaling

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--points", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    report = {"overhead": scaling.task_overhead(200, 40, args.repeats),
              "workers": scaling.workers_curve(args.requests, args.samples, args.points, args.repeats)}
    print("\n".join(format_scaling(report)))
    return report


if __name__ == "__main__":
    main()

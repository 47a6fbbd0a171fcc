"""Experts per rank: routing, EPLB placement and rank loads, kernels vs their references.

The cases live in :mod:`mcsim.bench.kernels` (workload, sizes, references); ``mcsim bench`` runs them with the
rest of the suite. Run ``python benchmarks/bench_experts.py [--quick]`` for this stage alone.
"""

from __future__ import annotations

import sys

from mcsim.bench.kernels import FULL, experts_cases


def cases():
    """Benchmark cases for the suite runner (kernels compiled here, not in the timed calls)."""
    return experts_cases(FULL)


if __name__ == "__main__":
    from mcsim.bench.run import print_stage

    print_stage("experts", quick="--quick" in sys.argv[1:])

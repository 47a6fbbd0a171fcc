"""KV-tier kernel: block look-ups per second, kernel vs the ``OrderedDict`` reference.

The cases live in :mod:`mcsim.bench.kernels` (workload, sizes, references); ``mcsim bench`` runs them with the
rest of the suite. Run ``python benchmarks/bench_kv_tiers.py [--quick]`` for this stage alone.
"""

from __future__ import annotations

import sys

from mcsim.bench.kernels import FULL, kv_tiers_cases


def cases():
    """Benchmark cases for the suite runner (kernels compiled here, not in the timed calls)."""
    return kv_tiers_cases(FULL)


if __name__ == "__main__":
    from mcsim.bench.run import print_stage

    print_stage("kv_tiers", quick="--quick" in sys.argv[1:])

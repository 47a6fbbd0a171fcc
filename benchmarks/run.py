"""The benchmark suite, the same as ``mcsim bench``: every kernel against its references, and scaling.

    python benchmarks/run.py [--quick] [--json] [-o DIR] [--only kv_tiers,speculative,e2e,sweep]

The suite lives in :mod:`mcsim.bench` so that an installed ``mcsim bench`` runs it too; see README.md here.
"""

from mcsim.bench.run import main

if __name__ == "__main__":
    raise SystemExit(main())

"""How the prefix-cache hit rate depends on the requests per sample, and whether the steady-state check says so.

    python benchmarks/cache_steady_state.py [--samples 3]

Two cases, each at several request counts (same seed, so the samples are comparable):

- ``factory`` with a 100 GB HBM + 64 GB DRAM cache and no NVMe, at mc.requests 4 k, 16 k, 40 k (25 % warm-up);
- ``factory`` as bundled (16 TB NVMe tier), at 20 k requests with 25 % warm-up and as written (80 k, 75 % warm-up).

Prints the range of the hit rate over samples, how many samples the check flags, and the median cost per token:
the figures README.md quotes for the generator's lead-in and for factory.toml's warm-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import mcsim

FACTORY = Path(__file__).resolve().parents[1] / "scenarios" / "factory.toml"
SMALL_CACHE = ["cache.hbm_gb_per_instance=100", "cache.dram_gb_per_node=64", "cache.nvme_gb_per_node=0",
               "mc.warmup_fraction=0.25"]


def row(label: str, samples: int, requests: int, overrides) -> None:
    ds = mcsim.run(FACTORY, samples=samples, requests=requests, overrides=overrides)
    hit = ds.cache_hit_rate.values
    flagged = int((ds.steady_state.values == 0).sum())
    print(f"{label:<34} hit rate {hit.min():.2f}-{hit.max():.2f}  not steady {flagged}/{samples}  "
          f"median {np.nanmedian(ds.cost_usd_per_mtok.values):.3f} USD/Mtok", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=3)
    args = parser.parse_args()
    for n in (4_000, 16_000, 40_000):
        row(f"100 GB HBM + 64 GB DRAM, {n // 1000} k", args.samples, n, SMALL_CACHE)
    row("factory, 20 k, 25 % warm-up", args.samples, 20_000, ["mc.warmup_fraction=0.25"])
    row("factory as written (80 k, 75 %)", args.samples, 80_000, [])


if __name__ == "__main__":
    main()

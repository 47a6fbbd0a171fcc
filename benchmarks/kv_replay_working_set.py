"""The streamed KV-tier replay's cost per block against the size of its caches: the factory's requests (its first
sample's draws, 600 k requests in chunks of 128 Ki) through :class:`mcsim.kernels.kv_tiers.RunCaches` of one
pooled cache, with the factory's three tiers and with smaller layouts of the same requests.

    python benchmarks/kv_replay_working_set.py [requests]

Each layout replays the same chunks from empty caches; the first chunk (the first touch of the caches' arrays) is
left out of the figure. The ratio is against the smallest layout (the HBM tier alone) in the same run. At the end
of each replay it prints the runs and segments the caches hold and the memory of the segments ever used and of the
hash table.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def factory_chunks(requests: int) -> tuple[list, tuple, int]:
    """The factory's first ``requests`` requests (its first sample's draws) in chunks of 128 Ki, as
    :meth:`RunCaches.replay` takes them, its three tiers' capacities and its longest prompt in blocks."""
    from mcsim.execution.sample import variant_params
    from mcsim.perf import factor as perf
    from mcsim.scenario import draw_uncertain, load_scenario
    from mcsim.stages import kvcache, workload

    scn = load_scenario(ROOT / "scenarios" / "factory.toml")
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1, n_samples=1).items()}
    p = variant_params(scn, "factory", {}, draws)
    hbm, dram, ssd = kvcache.CacheStream.layout(
        kvcache.Inputs.from_params(p, int(p["cache.block_tokens"]), perf.kv_bytes(p)))[0]
    longest = int(p["workload.max_context"] or p["model.max_context"]) // int(p["cache.block_tokens"]) + 1
    stream = workload.RequestStream(p, scn.classes, requests, np.random.default_rng(1), longest * 64)
    chunks = []
    while stream.remaining:
        c = stream.next_chunk(1 << 17)
        chunks.append((c.block_ptr.copy(), c.block_runs.copy(), np.zeros(c.n, np.int32)))
    return chunks, (hbm, dram, ssd), longest


def main(requests: int = 600_000) -> dict:
    from mcsim.kernels import kv_tiers

    chunks, (hbm, dram, ssd), longest = factory_chunks(requests)
    layouts = {"HBM tier alone": (hbm, 0, 0), "HBM + DRAM": (hbm, dram, 0), "one tier of all three's blocks":
               (hbm + dram + ssd, 0, 0), "the factory's HBM + DRAM + SSD": (hbm, dram, ssd)}
    blocks = sum(int(c[0][-1]) for c in chunks[1:])
    out = {}
    for name, capacity in layouts.items():
        caches = kv_tiers.RunCaches(np.array(capacity), 1, 1 << 40, longest)
        seconds = 0.0
        for i, (ptr, runs, instance) in enumerate(chunks):
            hits = np.zeros((len(instance), 3), np.int64)
            start = time.perf_counter()
            caches.replay(ptr, runs, instance, hits)
            seconds += (time.perf_counter() - start) if i else 0.0
        runs, segments = caches.live()
        in_use = (int(caches.top[1]) * (4 * kv_tiers._SEG + 8 + 4 + 4 + 4) + caches.table.nbytes)
        del caches
        out[name] = {"capacity_blocks": [int(c) for c in capacity], "ns_per_block": 1e9 * seconds / blocks,
                     "runs": runs, "segments": segments, "bytes_in_use": in_use}
    first = next(iter(out.values()))["ns_per_block"]
    print(f"{'layout':<32} {'blocks held':>12} {'ns per block':>13} {'ratio':>6} {'runs':>9} {'segments':>9} "
          f"{'MB in use':>9}")
    for name, r in out.items():
        print(f"{name:<32} {sum(r['capacity_blocks']):>12,} {r['ns_per_block']:>13.1f} "
              f"{r['ns_per_block'] / first:>5.2f}x {r['runs']:>9,} {r['segments']:>9,} {r['bytes_in_use'] / 1e6:>9.1f}")
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:2]))

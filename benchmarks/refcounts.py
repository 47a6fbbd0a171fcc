"""What Numba's reference counts cost the KV tiers' segments-of-runs replay: the loop as it is compiled
(``kernel(refcounts=False)``, no runtime) against the same source compiled with the runtime, in the same run.

    python benchmarks/refcounts.py [requests]

Three figures, each for both compilations:

* ``NRT_incref`` and ``NRT_decref`` calls in the loop's optimised LLVM IR (each an atomic count behind an indirect
  call when it runs);
* one repeated request (two runs, one instance, a first tier that never overflows), ns a request: the loop's own
  cost, its working set in the first-level cache;
* the factory's first ``requests`` requests (default 1,000,000, chunks of 128 Ki as
  ``benchmarks/kv_replay_working_set.py`` makes them) through its three tiers, seconds, with the hits per tier,
  which must be equal.
"""

from __future__ import annotations

import re
import sys
import time

import numba
import numpy as np

from kv_replay_working_set import factory_chunks
from mcsim.kernels import kv_tiers


def _compiled(with_runtime: bool):
    """The replay loop's source compiled with or without Numba's runtime (not cached: its IR is read)."""
    return numba.njit(nogil=True, _nrt=with_runtime)(kv_tiers._replay_segments.py_func)


def _replay(loop, chunks, capacity, longest) -> tuple[float, np.ndarray]:
    """Seconds and hits per tier of ``chunks`` through new caches, with ``loop`` as their replay loop."""
    kept = kv_tiers._replay_segments
    kv_tiers._replay_segments = loop  # RunCaches.replay calls the module's loop by name
    try:
        caches = kv_tiers.RunCaches(np.array(capacity), 1, 1 << 40, longest)
        total = np.zeros(len(capacity), np.int64)
        start = time.perf_counter()
        for ptr, runs, instance in chunks:
            hits = np.zeros((len(instance), len(capacity)), np.int64)
            caches.replay(ptr, runs, instance.copy(), hits)
            total += hits.sum(axis=0)
        return time.perf_counter() - start, total
    finally:
        kv_tiers._replay_segments = kept


def repeated_request(n: int) -> tuple[list, tuple, int]:
    """``n`` times the same request of 80 blocks (16 of a shared run, 64 of its own) as one chunk, a first tier of
    10^7 blocks and the longest prompt in blocks."""
    chunk = (np.arange(n + 1) * 80, np.tile(np.array([[16, 0, 1000]], np.int64), (n, 1)), np.zeros(n, np.int32))
    return [chunk], (10**7,), 2049


def main(requests: int = 1_000_000) -> dict:
    n = 200_000
    chunks, capacity, longest = factory_chunks(requests)
    out = {}
    for label, with_runtime in (("with the runtime", True), ("without (as compiled)", False)):
        loop = _compiled(with_runtime)
        _replay(loop, *repeated_request(1_000))  # compiles
        ir = loop.inspect_llvm(loop.signatures[0])
        calls = len(re.findall(r"call void @NRT_(?:incref|decref)", ir))
        one = min(_replay(loop, *repeated_request(n))[0] for _ in range(3)) / n
        seconds, hits = min((_replay(loop, chunks, capacity, longest) for _ in range(2)), key=lambda r: r[0])
        out[label] = {"refcount_calls_in_ir": calls, "ns_per_repeated_request": 1e9 * one, "factory_s": seconds,
                      "factory_hits": hits.tolist()}
    a, b = out["with the runtime"], out["without (as compiled)"]
    if a["factory_hits"] != b["factory_hits"]:
        raise SystemExit("the two compilations disagree on the hits")
    factory = f"factory, {requests:,} requests"
    print(f"{'':<24} {'incref/decref calls in IR':>26} {'repeated request':>17} {factory:>26}")
    for label, r in out.items():
        print(f"{label:<24} {r['refcount_calls_in_ir']:>26} {r['ns_per_repeated_request']:>14.0f} ns "
              f"{r['factory_s']:>24.3f} s")
    print(f"{'ratio':<24} {'':>26} {a['ns_per_repeated_request'] / b['ns_per_repeated_request']:>15.1f}x "
          f"{a['factory_s'] / b['factory_s']:>25.2f}x   (hits per tier {b['factory_hits']}, equal)")
    return out


if __name__ == "__main__":
    main(*(int(x) for x in sys.argv[1:2]))

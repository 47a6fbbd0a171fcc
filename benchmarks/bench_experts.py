"""Speed of the experts-per-rank kernels against their pure-Python references.

Target (DESIGN.md): >= 100 M token-expert assignments/s/core for routing (alias sampling, no search per
draw). Layout of the cases: a DeepSeek-V3-like layer, 256 routed experts, top-8, 288 slots (32 redundant)
on 32 EP GPUs in 4 nodes with 8 expert groups.

Run ``python benchmarks/bench_experts.py`` for a table (best of 3, one thread).
"""

from __future__ import annotations

import random

import numpy as np

from mcsim.experts import class_popularity
from mcsim.kernels.experts import build_alias, eplb_placement, rank_loads, route_steps
from mcsim.reference import experts as ref
from timing import best_of  # noqa: E402  (benchmarks/ is on sys.path when run)

N_EXPERTS, TOP_K, N_SLOTS, N_GPUS, N_GROUPS, N_NODES = 256, 8, 288, 32, 8, 4


def _tables(skews, seed):
    laws = class_popularity(N_EXPERTS, skews, np.random.default_rng(seed))
    prob = np.empty(laws.shape)
    alias = np.empty(laws.shape, np.int64)
    for c in range(laws.shape[0]):
        build_alias(laws[c], prob[c], alias[c])
    return laws, prob, alias


def _routing_case(name, skews, shares):
    laws, prob, alias = _tables(skews, 0)
    shares = np.asarray(shares, np.float64)
    cdf = np.cumsum(shares)
    cdf[-1] = 1.0
    tokens, steps = 4096, 256
    counts = np.empty((steps, N_EXPERTS), np.int64)
    rng = np.random.default_rng(1)
    route_steps(tokens, cdf, prob, alias, TOP_K, rng, counts[:2])  # compile
    ref_tokens = 250
    ref_rng = random.Random(1)
    laws_list = laws.tolist()
    return {
        "name": name,
        "unit": "token-expert assignments",
        "items_fast": tokens * steps * TOP_K,
        "items_reference": ref_tokens * TOP_K,
        "fast": lambda: route_steps(tokens, cdf, prob, alias, TOP_K, rng, counts),
        "reference": lambda: ref.route_steps_reference(ref_tokens, shares.tolist(), laws_list, TOP_K, 1, ref_rng),
    }


def cases():
    """Benchmark cases: routing (uniform and a skewed four-class mix), EPLB placement, rank loads."""
    out = [
        _routing_case("route_steps, uniform, 1 class", [0.0], [1.0]),
        _routing_case("route_steps, Zipf 0.4-1.0, 4 classes", [0.4, 0.6, 0.8, 1.0], [0.4, 0.3, 0.2, 0.1]),
    ]

    load = np.random.default_rng(2).integers(1_000, 100_000, N_EXPERTS).astype(np.float64)
    eplb_placement(load, N_SLOTS, N_GROUPS, N_NODES, N_GPUS)  # compile
    load_list = load.tolist()
    out.append({
        "name": "eplb_placement, 256 experts -> 288 slots / 32 GPUs",
        "unit": "placements",
        "items_fast": 1,
        "items_reference": 1,
        "fast": lambda: eplb_placement(load, N_SLOTS, N_GROUPS, N_NODES, N_GPUS),
        "reference": lambda: ref.eplb_placement_reference(load_list, N_SLOTS, N_GROUPS, N_NODES, N_GPUS),
    })

    phy2log, logcnt = eplb_placement(load, N_SLOTS, N_GROUPS, N_NODES, N_GPUS)
    steps = 4096
    counts = np.random.default_rng(3).integers(0, 256, (steps, N_EXPERTS))
    out_max, out_mean = np.empty(steps), np.empty(steps)
    rank_loads(counts[:2], phy2log, logcnt, N_GPUS, out_max[:2], out_mean[:2])  # compile
    ref_steps = 20
    counts_list, phy2log_list, logcnt_list = counts[:ref_steps].tolist(), phy2log.tolist(), logcnt.tolist()
    out.append({
        "name": "rank_loads, 288 slots / 32 GPUs",
        "unit": "steps",
        "items_fast": steps,
        "items_reference": ref_steps,
        "fast": lambda: rank_loads(counts, phy2log, logcnt, N_GPUS, out_max, out_mean),
        "reference": lambda: ref.rank_loads_reference(counts_list, phy2log_list, logcnt_list, N_GPUS),
    })
    return out



def main():
    for case in cases():
        fast = case["items_fast"] / best_of(case["fast"])
        slow = case["items_reference"] / best_of(case["reference"])
        print(f"{case['name']:<52} fast {fast:14,.0f} {case['unit']}/s   reference {slow:12,.0f}/s   "
              f"ratio {fast / slow:10,.0f}x")


if __name__ == "__main__":
    main()

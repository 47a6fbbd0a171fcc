"""The benchmark suite: every kernel against its pure-Python reference, measured in the same run, plus end to end.

    python benchmarks/run.py [--repeats 3] [--only kv_tiers,experts] [--e2e-requests 1000000]

Each ``benchmarks/bench_<stage>.py`` exposes ``cases()``: dicts with a compiled ``fast`` callable, a
``reference`` callable and the units of work each processes. Both are timed here (best of ``repeats``) on one
thread, and the report gives throughput per second and the ratio fast/reference. Absolute times depend on the
machine and its load; the ratios are the claim.

The end-to-end case times one Monte Carlo sample of the factory scenario with every stage on (workload
generation, KV tiers, speculative draws, expert placement, performance, economics) and compares it with the same
sample at 1/10 of the requests, to show how it scales. The first call at full size pays the operating system's
first-touch cost of its large arrays; a sweep's worker runs many samples, so the best of two or more calls is
reported.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from pathlib import Path
from timing import best_of  # noqa: E402  (benchmarks/ is on sys.path when run)

HERE = Path(__file__).resolve().parent
os.environ.setdefault("NUMBA_NUM_THREADS", "1")


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module



def kernel_rows(repeats: int, only=None):
    rows = []
    for path in sorted(HERE.glob("bench_*.py")):
        stage = path.stem.removeprefix("bench_")
        if only and stage not in only:
            continue
        for case in _load(path).cases():
            fast_s = best_of(case["fast"], repeats)
            ref_s = best_of(case["reference"], max(1, repeats - 1))
            fast_rate = case["items_fast"] / fast_s
            ref_rate = case["items_reference"] / ref_s
            rows.append((case["name"], case["unit"], fast_rate, ref_rate, fast_rate / ref_rate))
    return rows


def end_to_end(n_requests: int, repeats: int):
    from mcsim.engine import simulate_sample
    from mcsim.scenario import draw_uncertain, load_scenario

    scn = load_scenario(HERE.parent / "scenarios" / "factory.toml")
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1).items()}

    def one(n):
        return lambda: simulate_sample(scn, ("factory",), 0, 1, n, draws)

    one(2000)()  # compile / load kernels
    small = max(n_requests // 10, 1000)
    t_small = best_of(one(small), repeats)
    t_full = best_of(one(n_requests), repeats)
    return small, t_small, t_full


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="",
                        help="comma-separated parts (kv_tiers, speculative, experts, e2e, sweep)")
    parser.add_argument("--e2e-requests", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    only = set(filter(None, args.only.split(",")))
    print(f"python {sys.version.split()[0]}, one thread, best of {args.repeats}")
    kernels = only - {"e2e", "sweep"}
    rows = kernel_rows(args.repeats, kernels or None) if (kernels or not only) else []
    if rows:
        w = max(len(r[0]) for r in rows)
        print(f"\n{'kernel':<{w}}  {'unit':<24} {'fast /s':>12} {'reference /s':>13} {'ratio':>8}")
        for name, unit, fast, ref, ratio in rows:
            print(f"{name:<{w}}  {unit:<24} {fast:>12.4g} {ref:>13.4g} {ratio:>7.0f}x")
    if not only or "e2e" in only:
        small, t_small, t_full = end_to_end(args.e2e_requests, max(2, args.repeats - 1))
        n = args.e2e_requests
        print("\nend to end, factory scenario, one sample, every stage on:")
        print(f"  {small:>9,} requests: {t_small:7.2f} s ({small / t_small:,.0f} requests/s)")
        print(f"  {n:>9,} requests: {t_full:7.2f} s ({n / t_full:,.0f} requests/s); "
              f"time ratio {t_full / t_small:.1f}x for {n / small:.0f}x the requests")
    if not only or "sweep" in only:
        import sweep_scaling

        sweep_scaling.report(requests=50_000, samples=8, points=4, repeats=2)


if __name__ == "__main__":
    main()

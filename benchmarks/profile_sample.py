"""Where one sample's CPU time goes: cProfile of one sample of a scenario (the factory unless ``--scenario`` says
otherwise), after a warm-up sample in the same process: its stages' cumulative seconds.

    python benchmarks/profile_sample.py [requests] [--scenario FILE] [--set KEY=VALUE ...]

The warm-up sample (300,000 requests, a whole sample) compiles or loads the kernels; the profiled one is
streamed when it has more requests than ``mc.chunk_requests``. A streamed sample runs its cache replay and its
replicas' decode pool on threads of their own; here they run on the profiled thread (cProfile sees one thread), so
the CPU seconds are those of one core, each stage's where it belongs.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Functions whose cumulative time is each stage's (file suffix, function name) -> label.
STAGES = {
    ("kernels/kv_tiers.py", "_replay_segments"): "KV-tier replay, segments of runs",
    ("kernels/kv_tiers.py", "_replay_runs"): "KV-tier replay, dense rows",
    ("kernels/kv_tiers.py", "_replay"): "KV-tier replay, written-out ids",
    ("mcsim/stages/workload.py", "next_chunk"): "workload generation (streamed)",
    ("mcsim/stages/workload.py", "generate"): "workload generation (whole)",
    ("mcsim/stages/speculative.py", "speculative_passes"): "speculative draws",
    ("mcsim/execution/sample.py", "expert_stage"): "expert routing",
    ("mcsim/perf/fleet.py", "performance"): "stage 5 (fleet, latencies; the second pass of a streamed sample)",
    ("mcsim/perf/replicas_stream.py", "run"): "  of which the replicas, request by request (streamed)",
}


class _Inline:
    """A stand-in for ``ThreadPoolExecutor(1)`` that runs each call at once, on the calling thread."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def submit(self, function, *args, **kwargs):
        from concurrent.futures import Future

        future = Future()
        future.set_result(function(*args, **kwargs))
        return future

    def shutdown(self, *args, **kwargs):
        pass


def main(requests: int = 1_000_000, overrides=(), scenario: str = str(ROOT / "scenarios" / "factory.toml")) -> dict:
    from mcsim.execution import sample
    from mcsim.perf import replicas_stream
    from mcsim.scenario import draw_uncertain, load_scenario

    sample.ThreadPoolExecutor = replicas_stream.ThreadPoolExecutor = _Inline

    scn = load_scenario(scenario, overrides=list(overrides))
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 1, n_samples=1).items()}
    sample.run_sample(scn, ("factory",), 0, 1, 300_000, draws)
    profile = cProfile.Profile()
    start = time.process_time()
    profile.enable()
    sample.run_sample(scn, ("factory",), 0, 1, int(requests), draws)
    profile.disable()
    total = time.process_time() - start
    stats = pstats.Stats(profile).stats
    out = {"requests": int(requests), "cpu_s": total}
    print(f"one sample of {Path(scenario).name}, {requests:,} requests: {total:.2f} s of CPU")
    for (path, _, name), (_, _, _, cumulative, _) in stats.items():
        for (suffix, function), label in STAGES.items():
            if name == function and path.replace("\\", "/").endswith(suffix):
                out[label] = out.get(label, 0.0) + cumulative
    for label in STAGES.values():
        if label in out:
            print(f"  {label:<66} {out[label]:6.2f} s")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("requests", nargs="?", type=int, default=1_000_000)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--scenario", default=str(ROOT / "scenarios" / "factory.toml"))
    args = parser.parse_args()
    main(args.requests, args.overrides, args.scenario)

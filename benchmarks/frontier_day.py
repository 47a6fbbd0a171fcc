"""The frontier day (``scenarios/frontier-day.toml``): wall time, peak memory and requests per second of its
samples, on local threads and on a loopback ``dask.distributed`` cluster of 1 and 2 workers.

    python benchmarks/frontier_day.py                       # one sample of the whole day (10^8 requests)
    python benchmarks/frontier_day.py --requests 10000000 --samples 2 --cluster
    python benchmarks/frontier_day.py --volume 4           # the day's tokens of 4 samples, against DeepSeek's

Each run is ``mcsim run scenarios/frontier-day.toml --samples S --requests N`` in a child process; its peak
resident set size is the child's (``getrusage(RUSAGE_CHILDREN)``: the largest of the children so far, so a run on
local threads comes first). With ``--cluster`` the same samples then run on a scheduler and 1, then 2, workers
(one thread each) started on 127.0.0.1 (their memory is theirs, not counted), and every numeric variable of each
result is compared with the local run's: they must be identical. With ``--volume S`` it prints instead the tokens
of a day of each of the first S samples (the generator alone, over their first 3 M requests: the mean prompt and
output per request is steady from the start), against the 608 B input and 168 B output tokens DeepSeek published.
"""

from __future__ import annotations

import argparse
import resource
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "frontier-day.toml"


def run(out: Path, samples: int, requests: int, extra=()) -> float:
    """Wall time of one ``mcsim run`` of the frontier day into ``out``."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "mcsim", "run", str(SCENARIO), "--samples", str(samples), "--requests",
                    str(requests), "--no-progress", "-o", str(out), *extra], check=True, capture_output=True)
    return time.perf_counter() - start


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def loopback_cluster(workers: int):
    """A scheduler and ``workers`` one-thread workers on 127.0.0.1; yields the scheduler's address."""
    port = _free_port()
    address = f"tcp://127.0.0.1:{port}"
    dask = [sys.executable, "-m", "distributed.cli"]
    procs = [subprocess.Popen([*dask[:2], "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port",
                               str(port), "--no-dashboard"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        time.sleep(2.0)
        procs.append(subprocess.Popen([*dask[:2], "distributed.cli.dask_worker", address, "--nworkers",
                                       str(workers), "--nthreads", "1", "--no-dashboard", "--memory-limit", "0"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        from dask.distributed import Client

        with Client(address, timeout=60) as client:
            client.wait_for_workers(workers, timeout=120)
        yield address
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def identical(a: Path, b: Path) -> bool:
    """Every numeric variable and coordinate of two results equal (NaN where NaN)."""
    import numpy as np
    import xarray as xr

    with xr.open_dataset(a) as x, xr.open_dataset(b) as y:
        names = [n for n in x.variables if np.issubdtype(x[n].dtype, np.number)]
        return sorted(names) == sorted(n for n in y.variables if np.issubdtype(y[n].dtype, np.number)) and all(
            np.array_equal(x[n].values, y[n].values, equal_nan=True) for n in names)


def daily_volume(samples: int, requests: int = 3_000_000) -> list[tuple[float, float]]:
    """Input and output tokens of a day (``mc.requests`` times the mean per request of the first ``requests``) of
    each of the first ``samples`` samples, as their runs draw them."""
    import numpy as np

    from mcsim.scenario import STREAM_WORKLOAD, draw_uncertain, load_scenario, resolve, rng_for
    from mcsim.stages import workload

    scn = load_scenario(SCENARIO)
    seed, n = int(scn["mc.seed"]), int(scn["mc.requests"])
    draws = draw_uncertain(scn, list(range(samples)), seed, n_samples=samples)
    out = []
    for s in range(samples):
        p = resolve(scn, {k: float(v[s]) for k, v in draws.items()})
        stream = workload.RequestStream(p, scn.classes, n, rng_for(seed, s, STREAM_WORKLOAD),
                                        int(p["workload.max_context"] or p["model.max_context"]))
        prompt = output = 0
        taken = min(requests, n)
        while stream.emitted < taken:
            chunk = stream.next_chunk(min(1 << 18, taken - stream.emitted))
            prompt, output = prompt + int(chunk.prompt_tokens.sum()), output + int(chunk.output_tokens.sum())
        out.append((n * prompt / taken, n * output / taken))
    return out


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=100_000_000)
    parser.add_argument("--samples", type=int, default=1)
    parser.add_argument("--cluster", action="store_true", help="also on a loopback cluster of 1 and 2 workers")
    parser.add_argument("--volume", type=int, default=0, help="the day's tokens of this many samples instead")
    args = parser.parse_args(argv)
    if args.volume:
        days = daily_volume(args.volume)
        for s, (prompt, output) in enumerate(days):
            print(f"sample {s}: {prompt / 1e9:.0f} B input, {output / 1e9:.1f} B output tokens a day")
        prompt, output = (sum(d[i] for d in days) / len(days) for i in (0, 1))
        print(f"mean of {len(days)}: {prompt / 1e9:.0f} B input ({prompt / 608e9:.3f} x 608 B), {output / 1e9:.1f} B "
              f"output ({output / 168e9:.3f} x 168 B)")
        return {"days": days}
    total = args.samples * args.requests
    report = {}
    with tempfile.TemporaryDirectory() as folder:
        local = Path(folder) / "local.nc"
        wall = run(local, args.samples, args.requests, ("--workers", "1"))
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024.0
        report["local, 1 thread"] = {"wall_s": wall, "peak_rss_gib": peak / 2**30, "requests_per_s": total / wall}
        print(f"{'run':<22} {'wall':>9} {'requests/s':>11}  notes")
        print(f"{'local, 1 thread':<22} {wall:>7.1f} s {total / wall:>11,.0f}  peak RSS {peak / 2**30:.2f} GiB")
        if args.cluster:
            one = None
            for workers in (1, 2):
                out = Path(folder) / f"cluster{workers}.nc"
                with loopback_cluster(workers) as address:
                    wall = run(out, args.samples, args.requests, ("--scheduler", address))
                same = identical(local, out)
                one = wall if workers == 1 else one
                speedup = "" if workers == 1 else f", {one / wall:.2f}x the 1-worker cluster"
                report[f"cluster, {workers} workers"] = {"wall_s": wall, "requests_per_s": total / wall,
                                                         "identical_to_local": same}
                print(f"{f'cluster, {workers} workers':<22} {wall:>7.1f} s {total / wall:>11,.0f}  "
                      f"{'identical to local' if same else 'DIFFERS from local'}{speedup}")
    return report


if __name__ == "__main__":
    main()

"""Compile every Numba kernel the test suite calls into the on-disk cache, with the argument types the engine
passes: one sample each of a few small runs (the stages' kernels, the one-instance batching simulator, the
replicas' step loop).

tests/conftest.py runs this in a process of its own while the first tests (those that call no kernel) run, so that
on a cold cache (a fresh clone) the compile time is spent on the other core; the test process then loads the
kernels from the cache (under ``pytest -n``, the controller runs it and the workers wait for the file it creates at
its end). ``python tests/kernel_warmup.py`` runs it by hand.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import mcsim

SMALL_FACTORY = ["deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=32", "moe.nodes=4",
                 "workload.rate_rps=150"]
REPLICAS = ['deployment.fleet_simulation="replicas"']

RUNS = (
    # the small kernels first (workload, KV tiers, speculative passes, experts): the first tests need them soonest
    ("scenarios/factory.toml", SMALL_FACTORY),
    ("scenarios/dense-node.toml", []),  # the one-instance batching simulator
    ("scenarios/dense-node.toml", REPLICAS),
    ("scenarios/factory.toml", SMALL_FACTORY + ["performance.simulate_batching=true"]),
    ("scenarios/factory.toml", SMALL_FACTORY + ["performance.simulate_batching=true"] + REPLICAS),
)


#: The run that compiles the step loop (the longest compile, about 50 s cold): a process of its own starts it
#: while this one compiles the stages' kernels (Numba compiles under the GIL, so threads would not overlap).
STEP_LOOP_RUN = 1


def _run(index: int) -> int:
    path, overrides = RUNS[index]
    try:
        mcsim.run(path, samples=1, requests=200, overrides=overrides, workers=1)
    except Exception as err:  # the tests report what is wrong; the warm-up only saves them compile time
        print(f"kernel warm-up: {path} {' '.join(overrides)}: {type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


def main(done: str | None = None) -> int:
    """Run the warm-up; ``done``, a path, is created when it ends (the test workers of ``pytest -n`` wait for it)."""
    failed = 0
    try:
        step_loop = subprocess.Popen([sys.executable, __file__, "--run", str(STEP_LOOP_RUN)],
                                     stdin=subprocess.DEVNULL)
        for index in range(len(RUNS)):
            if index == STEP_LOOP_RUN:
                failed += step_loop.wait() != 0
            else:
                failed += _run(index)
    finally:
        if done:
            Path(done).touch()
    return 1 if failed else 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--run"]:
        sys.exit(_run(int(sys.argv[2])))
    sys.exit(main(*sys.argv[1:2]))

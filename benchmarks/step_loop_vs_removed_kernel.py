"""The step loop with one instance against the one-instance kernel it replaced, on the bench's batching workloads.

The removed kernel (``kernels/batching.py`` and its helpers at commit 34ddc4a) is read from the repository's
history into a temporary package, so this needs a git checkout. For each case of ``mcsim bench``'s batching
stage it checks that both give the same results bit for bit and prints the CPU time ratio (step loop / removed
kernel), best of each and the median of paired runs, interleaved so that both see the same machine load.

    python benchmarks/step_loop_vs_removed_kernel.py [requests] [repeats]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from mcsim.bench import kernels as bench

REMOVED_AT = "34ddc4a"


def _removed_kernel(folder: Path):
    """Import the removed kernel from the repository's history as the package ``removed_kernels``."""
    root = Path(__file__).resolve().parents[1]
    package = folder / "removed_kernels"
    package.mkdir()
    (package / "__init__.py").write_text("")
    for name in ("batching", "batching_helpers"):
        source = subprocess.run(["git", "show", f"{REMOVED_AT}:kernels/{name}.py"], cwd=root, check=True,
                                capture_output=True, text=True).stdout
        (package / f"{name}.py").write_text(source.replace("mcsim.kernels.batching_helpers",
                                                           "removed_kernels.batching_helpers"))
    sys.path.insert(0, str(folder))
    from removed_kernels import batching

    return batching


def _run_removed(kernel, workload, policy, preempt, kv_blocks):
    arrival, prefill, context, output = workload
    n = arrival.shape[0]
    params = np.zeros(kernel.N_PARAMS, np.int64)
    settings = bench.BATCH_SETTINGS
    params[kernel.P_TOKEN_BUDGET], params[kernel.P_MAX_SEQS] = settings["token_budget"], settings["max_seqs"]
    params[kernel.P_KV_BLOCKS], params[kernel.P_BLOCK_TOKENS] = kv_blocks, settings["block_tokens"]
    params[kernel.P_CHUNK_TOKENS], params[kernel.P_VERIFY_TOKENS] = settings["chunk_tokens"], settings["verify_tokens"]
    params[kernel.P_POLICY] = kernel.POLICY_STATIC if policy == "static" else kernel.POLICY_CONTINUOUS
    params[kernel.P_PREEMPT] = int(preempt)
    out = [np.empty(n) for _ in range(4)]
    stats = np.zeros(kernel.N_STATS)
    none_f, none_i = np.zeros(0), np.zeros(0, np.int64)
    kernel.simulate(arrival, prefill, context, output, output - 1, np.zeros(n), np.zeros(n, np.int64), params, 0.0,
                    bench.BATCH_STEP_TIME_TABLE, bench.BATCH_DECODE_EDGES, bench.BATCH_PREFILL_EDGES,
                    np.zeros(len(bench.BATCH_DECODE_EDGES)), 0.0, *out, stats, none_f, none_i, none_i, none_f, none_i)
    return out, stats


def main(n_requests: int = 200_000, repeats: int = 7) -> None:
    with tempfile.TemporaryDirectory() as folder:
        removed = _removed_kernel(Path(folder))
        for name, (policy, preempt, kv_blocks) in bench.BATCH_VARIANTS.items():
            rate = bench.BATCH_LOAD * bench.batching_capacity_per_s(policy, preempt, kv_blocks, 20_000)
            workload = bench.batching_workload(n_requests, rate, seed=1)
            old, old_stats = _run_removed(removed, workload, policy, preempt, kv_blocks)
            new, new_stats = bench.run_batching_kernel(workload, policy, preempt, kv_blocks)
            same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(old, new)) and \
                np.array_equal(old_stats, new_stats, equal_nan=True)
            t_old, t_new = [], []
            for _ in range(repeats):
                start = time.process_time()
                _run_removed(removed, workload, policy, preempt, kv_blocks)
                t_old.append(time.process_time() - start)
                start = time.process_time()
                bench.run_batching_kernel(workload, policy, preempt, kv_blocks)
                t_new.append(time.process_time() - start)
            paired = np.median(np.array(t_new) / np.array(t_old))
            print(f"{name:46s} identical={same}  removed {n_requests / min(t_old) / 1e6:.2f} M/s, step loop "
                  f"{n_requests / min(t_new) / 1e6:.2f} M/s  step loop / removed: best {min(t_new) / min(t_old):.3f}, "
                  f"paired median {paired:.3f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))

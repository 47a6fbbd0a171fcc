"""What several test files share, written once.

- paths of the bundled scenarios and a small, fast version of the factory scenario;
- :func:`invoke`, the command line run in this process;
- for the batching kernels (one instance and replicas): step-time tables whose values are known in closed form
  and the random workloads, prompt blocks and settings of the kernel-against-reference checks;
- for the KV-tier kernel: the CSR arrays its caller builds, random prompts with shared prefixes, and the
  hypothesis strategy of prefix-tree workloads;
- :func:`make_result`, a result Dataset shaped as mcsim writes them, for the report's tests.

The builders draw from the generator they are given in a fixed order, so a test that moves to them keeps its
cases (same seed, same workload).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
FACTORY = SCENARIOS / "factory.toml"
DENSE_NODE = SCENARIOS / "dense-node.toml"
DENSE_MODEL = SCENARIOS / "dense-model.toml"

#: A small, fast version of the factory scenario (fewer EP ranks, so that the expert stage is quick).
SMALL_FACTORY = ["deployment.gpus_per_instance=32", "deployment.prefill_gpus_per_instance=32", "moe.nodes=4",
                 "workload.rate_rps=150"]


def python_prints(*lines: str) -> str:
    """What a fresh Python process running ``lines`` prints (stripped); it fails the test if the process does."""
    out = subprocess.run([sys.executable, "-c", "\n".join(lines)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def invoke(*args, **runner_options):
    """``mcsim ARGS`` in this process (arguments may be paths); the click Result."""
    from mcsim.cli import main

    return CliRunner(**runner_options).invoke(main, [str(a) for a in args])


# -- batching kernels --------------------------------------------------------------------------------------------

# A step-time table linear in both coordinates, so bilinear interpolation reproduces the plane exactly and hand
# sums can use the formula directly (inside the edges).
DECODE_EDGES = np.array([1.0, 8.0, 64.0, 256.0])
PREFILL_EDGES = np.array([0.0, 512.0, 4096.0, 16384.0])
BASE_S, PER_SEQ_S, PER_TOKEN_S = 0.01, 2e-4, 4e-6
LINEAR_TABLE = BASE_S + PER_SEQ_S * DECODE_EDGES[:, None] + PER_TOKEN_S * PREFILL_EDGES[None, :]
TABLE = {"step_time_table": LINEAR_TABLE, "decode_edges": DECODE_EDGES, "prefill_edges": PREFILL_EDGES}
# A constant step time (a power of two in seconds, so every sum of steps is exact).
TAU = 0.25
CONSTANT = {"step_time_table": np.full((1, 1), TAU), "decode_edges": [1.0], "prefill_edges": [0.0]}


def linear_step_s(decode_seqs, prefill_tokens):
    """The linear table's plane, with decode sequences clamped to the first edge (0 -> 1)."""
    return BASE_S + PER_SEQ_S * max(decode_seqs, DECODE_EDGES[0]) + PER_TOKEN_S * prefill_tokens


def random_workload(rng, n, rate, *, ties=False, think=True):
    """``n`` requests at Poisson ``rate``: (arrival, prefill, context, output, passes, think).

    Prompts of 1-299 tokens of which up to 99 are cached (prefill <= context), outputs of 1-59 tokens, one
    speculative gain (1-3 tokens per pass) for all. ``ties``: in 30 % of the calls arrivals are rounded to 0.1 s,
    so that several requests arrive at once. ``think``: exponential think times (mean 0.5 s) for closed loops,
    else ``None``.
    """
    arrival = np.cumsum(rng.exponential(1.0 / rate, n))
    if ties and rng.uniform() < 0.3:
        arrival = np.round(arrival, 1)
    context = rng.integers(1, 300, n)
    prefill = np.clip(context - rng.integers(0, 100, n), 1, context)
    output = rng.integers(1, 60, n)
    tokens_per_pass = int(rng.integers(1, 4))
    passes = np.where(output > 1, -(-(output - 1) // tokens_per_pass), 0)
    think_s = rng.exponential(0.5, n) if think else None
    return arrival, prefill, context, output, passes, think_s


def random_settings(rng, output, context, **fixed):
    """Random batch limits and KV pool for requests of these lengths, then ``fixed`` (policy, preempt, ...).

    The pool ranges from "the largest request just fits" to roomy, so tight pools force preemptions (and make
    least-KV routing differ from least-outstanding).
    """
    block_tokens = int(rng.integers(1, 32))
    largest = int(((context + output + block_tokens - 1) // block_tokens).max())
    settings = {
        "token_budget": int(rng.integers(1, 1000)),
        "max_seqs": int(rng.integers(1, 10)),
        "kv_blocks": largest + int(rng.integers(0, 2 * largest)),
        "block_tokens": block_tokens,
        "chunk_tokens": int(rng.integers(0, 200)),
        "verify_tokens": int(rng.integers(1, 4)),
    }
    settings.update(fixed)
    return settings


def random_blocks(rng, n, block_tokens):
    """Prompt blocks with sharing: a few system prompts, turns that extend an earlier request's prompt, own
    blocks; and prompt tokens that hold those blocks (sometimes exactly, so that a prompt can be fully cached).

    Returns (block lists, prompt tokens, CSR pointer, block ids)."""
    prefixes = [list(range(1000 * q, 1000 * q + int(rng.integers(0, 6)))) for q in range(int(rng.integers(1, 4)))]
    lists, fresh = [], 10**6
    for r in range(n):
        if r and rng.uniform() < 0.3:
            base = list(lists[int(rng.integers(r))])  # a later turn of an earlier conversation
        else:
            base = list(prefixes[int(rng.integers(len(prefixes)))])
        own = int(rng.integers(0, 4))
        lists.append(base + list(range(fresh, fresh + own)))
        fresh += own
    prompt = np.array([max(len(b) * block_tokens + int(rng.integers(0, block_tokens)), 1) for b in lists])
    ptr = np.concatenate([[0], np.cumsum([len(b) for b in lists])]).astype(np.int64)
    ids = np.array([x for b in lists for x in b], dtype=np.int64)
    return lists, prompt, ptr, ids


# -- KV-tier kernel ----------------------------------------------------------------------------------------------

def block_arrays(prompts, instances):
    """CSR arrays with one dense key per (instance, block id), as the kernel's caller builds them:
    (block_ptr, block_keys, instance, number of keys)."""
    key_of: dict[tuple[int, int], int] = {}
    keys = [key_of.setdefault((inst, block), len(key_of)) for p, inst in zip(prompts, instances) for block in p]
    block_ptr = np.concatenate(([0], np.cumsum([len(p) for p in prompts]))).astype(np.int64)
    return block_ptr, np.array(keys, np.int64), np.array(instances, np.int32), len(key_of)


def random_prompts(rng, n, n_instances, shared=40, blocks=6):
    """Zipf-popular shared prefixes (chains of ids) followed by fresh tail blocks, routed at random:
    (prompts as lists of block ids, instance of each)."""
    popular = rng.zipf(1.3, n) % shared
    prompts = []
    next_id = 10_000
    for r in range(n):
        depth = int(rng.integers(0, blocks + 1))
        tail = int(rng.integers(0, blocks + 1))
        prompts.append([int(popular[r]) * 100 + k for k in range(depth)] + list(range(next_id, next_id + tail)))
        next_id += tail
    return prompts, [int(i) for i in rng.integers(0, n_instances, n)]


@st.composite
def prefix_workloads(draw, max_requests=40, max_instances=3):
    """Requests that share prefixes of earlier requests (a random prefix tree) and then add blocks:
    (prompts, instances, number of instances, chain_hashed).

    Most added blocks are fresh ids, as chain hashing gives. With chain-hashed ids alone the cached set is
    always prefix-closed, so some added blocks repeat earlier ids out of place: that exercises the
    exact-prefix rule (a cached block after a miss is not reused but is still moved to the first tier).
    """
    n_instances = draw(st.integers(1, max_instances))
    chain_hashed = draw(st.booleans())
    prompts: list[list[int]] = []
    instances = []
    next_id = 0
    for _ in range(draw(st.integers(1, max_requests))):
        parent = draw(st.integers(-1, len(prompts) - 1))
        prompt = prompts[parent][: draw(st.integers(0, len(prompts[parent])))] if parent >= 0 else []
        added = list(range(next_id, next_id + draw(st.integers(0, 6))))
        next_id += len(added)
        if not chain_hashed and len(added) < next_id:
            earlier = st.integers(0, next_id - len(added) - 1).filter(lambda block: block not in prompt)
            added += draw(st.lists(earlier, max_size=2, unique=True))
        prompts.append(prompt + draw(st.permutations(added)))
        instances.append(draw(st.integers(0, n_instances - 1)))
    return prompts, instances, n_instances, chain_hashed


# -- result Datasets ---------------------------------------------------------------------------------------------

REPORT_INPUTS = ("efficiency.fused_kernel_gain", "speculative.draft_cost", "workload.rate_rps")


def make_result(grid=None, variants=None, n=80, seed=0, shapley_levers=None, with_inputs=True, name="toy-factory"):
    """A result Dataset with the structure of mcsim's: grid axes, variant, sample, then the variable's own dims.

    ``gross_margin`` and ``cost_usd_per_mtok`` follow ``efficiency.fused_kernel_gain`` strongly and
    ``speculative.draft_cost`` weakly; ``payback_months`` has infinite samples and ``cost_usd_per_day`` NaN ones.
    """
    import xarray as xr

    from mcsim.results.dataset import MODEL_STATEMENT, grid_axis_attrs, input_variable
    from mcsim.results.names import dataset_name
    from mcsim.results.variables import QUANTILES, REGISTRY, TIERS, attrs_for

    paths = list(grid or {})
    grid = {dataset_name(p): v for p, v in (grid or {}).items()}  # dims are named as mcsim names them
    rng = np.random.default_rng(seed)
    dims = list(grid) + (["variant"] if variants else [])
    shape = [len(v) for v in grid.values()] + ([len(variants)] if variants else [])
    coords = {**grid, "sample": np.arange(n), "tier": list(TIERS), "request_quantile": list(QUANTILES),
              "workload_class": ["chat", "code"]}
    if variants:
        coords["variant"] = list(variants)
    draws = {"efficiency.fused_kernel_gain": rng.uniform(1.0, 1.5, n), "speculative.draft_cost": rng.uniform(0, 0.1, n),
             "workload.rate_rps": rng.lognormal(6.0, 0.3, n)}
    point_effect = rng.uniform(0.5, 1.5, shape + [1])  # each grid point / variant shifts the level
    data_vars = {}
    for var_name, var in REGISTRY.items():
        full = shape + [n] + [len(coords[d]) for d in var.dims]
        values = rng.lognormal(0.0, 0.3, full) * point_effect.reshape(shape + [1] + [1] * len(var.dims))
        data_vars[var_name] = (dims + ["sample"] + list(var.dims), values.astype(var.dtype), attrs_for(var_name))
    gain = draws["efficiency.fused_kernel_gain"]
    margin = 0.2 + 1.2 * (gain - 1.25) - 0.5 * draws["speculative.draft_cost"] + 0.02 * rng.normal(size=shape + [n])
    data_vars["gross_margin"] = (dims + ["sample"], margin * point_effect, attrs_for("gross_margin"))
    data_vars["cost_usd_per_mtok"] = (dims + ["sample"], (2.0 / gain + 0.05 * rng.normal(size=shape + [n]))
                                      * point_effect, attrs_for("cost_usd_per_mtok"))
    payback = data_vars["payback_months"][1]
    payback[..., :3] = np.inf
    data_vars["cost_usd_per_day"][1][..., 5] = np.nan
    data_vars["feasible"] = (dims + ["sample"], (rng.uniform(size=shape + [n]) < 0.9).astype(np.int8),
                             attrs_for("feasible"))
    if with_inputs:
        for path, values in draws.items():
            input_name, variable = input_variable(path, values)
            data_vars[input_name] = variable
    if shapley_levers:
        grid_shape = [len(v) for v in grid.values()]
        for metric in ("cost_usd_per_mtok", "gross_margin"):
            phi = rng.normal(size=grid_shape + [len(shapley_levers), n]) + np.arange(len(shapley_levers))[:, None]
            data_vars[f"shapley_{metric}"] = (list(grid) + ["lever", "sample"], phi,
                                              {"long_name": f"Shapley contribution to {metric}",
                                               "units": REGISTRY[metric].units})
        coords["lever"] = list(shapley_levers)
    attrs = {"scenario_name": name, "seed": 42, "samples": n, "requests_per_sample": 100, "sampling": "random",
             "mcsim_version": "test", "modelled_vs_measured": MODEL_STATEMENT, "measured_variables": ""}
    ds = xr.Dataset(data_vars, coords=coords, attrs=attrs)
    for path in paths:
        ds[dataset_name(path)].attrs.update(grid_axis_attrs(path))
    return ds


#: One instance that serves one request at a time, every request alike (100 prompt tokens, 50 output tokens, no
#: cache, no speculation, no host costs, single-turn sessions): Poisson arrivals make it an M/D/1 queue, and every
#: rate replays the same requests with their arrival gaps scaled (exact common random numbers).
MD1 = """
[meta]
name = "md1"
[mc]
samples = 3
requests = 4000
seed = 5
[model]
preset = "llama-3.1-8b"
[hardware]
preset = "h100"
[deployment]
fleet = "utilization"
instances = 1
disaggregated = false
gpus_per_instance = 1
max_batch_per_gpu = 1
tpot_target_s = 10.0
ttft_target_s = 1.0
slo_quantile = 0.9
[workload]
rate_rps = 1.0
arrivals = "poisson"
[workload.classes.chat]
share = 1.0
prompt_tokens = 100
output_tokens = 50
turns = 1.0
system_prompt_share = 0.0
[cache]
enabled = false
[speculative]
enabled = false
[host]
request_overhead_s = 0.0
tokenize_s_per_token = 0.0
detokenize_s_per_token = 0.0
[performance]
fidelity = "factor"
"""

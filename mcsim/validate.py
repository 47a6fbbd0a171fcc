"""``mcsim validate``: the model's stages against closed forms and published figures, in one table.

Each :class:`Check` runs one stage of mcsim (the kernels and orchestration users run, not copies of them) and
compares its figure with a reference that does not come from mcsim: a closed form written out here, a public
configuration file, a paper's table, a README's worked example. Random checks use fixed seeds and tolerances
derived from their standard errors, so a passing table is reproducible and a failing one means a real
difference. What each check does and does not establish is in ``docs/VALIDATION.md``.

:func:`run_validation` returns the checks (and writes ``validation.md`` / ``validation.json`` when given a
folder); :func:`validate_command` is the CLI's body: it prints the table, writes both files and returns the
process exit code (0 when every check passes).
"""

from __future__ import annotations

import functools
import json
import math
import os
import pathlib
import sys
import time
from dataclasses import asdict, dataclass

import numpy as np

from mcsim import __version__
from mcsim.calibration import aiconfigurator, fit, measurements
from mcsim.calibration.fit import scenario_scale
from mcsim.calibration.vidur import LINEAR_MODELS, bundled_collectives, bundled_linear, read_collectives
from mcsim.fileio import atomic_write
from mcsim.kernels.experts import build_alias, eplb_placement, route_steps
from mcsim.perf.collectives import allreduce_time, alltoall_time, send_time
from mcsim.perf import deepep, gemm_surface
from mcsim.perf.fleet_batching import simulate_batching, simulate_fleet_batching
from mcsim.perf.hardware import as_hardware, gemm_figures
from mcsim.perf.roofline import step_cost
from mcsim.perf.roofline_model import options
from mcsim.scenario import bundled, catalog, draw_uncertain, load_scenario, resolve
from mcsim.stages import economics, kvcache, workload
from mcsim.stages import requests_trace as traces
from mcsim.stages.speculative import speculative_passes

DEFAULT_OUT_DIR = pathlib.Path("outputs") / "validation"
#: Standard errors allowed by the random checks; with fixed seeds a correct sampler fails one with
#: probability ~1e-4 per comparison (Bonferroni-widened where one check compares many values).
Z = 4.0

# --- published references (written here, independently of the catalog) ----------------------------------

#: KV-relevant fields of each catalog model's published config.json: layers, and either (KV heads,
#: hidden size, attention heads) for GQA or (kv_lora_rank, qk_rope_head_dim) for MLA.
PUBLISHED_KV_CONFIG = {
    "deepseek-v3": ("mla", 61, {"kv_lora_rank": 512, "qk_rope_head_dim": 64},
                    "huggingface.co/deepseek-ai/DeepSeek-V3 config.json"),
    "llama-3-70b": ("gqa", 80, {"num_key_value_heads": 8, "hidden_size": 8192, "num_attention_heads": 64},
                    "huggingface.co/meta-llama/Meta-Llama-3-70B config.json"),
    "llama-3.1-70b": ("gqa", 80, {"num_key_value_heads": 8, "hidden_size": 8192, "num_attention_heads": 64},
                      "huggingface.co/meta-llama/Llama-3.1-70B config.json"),
    "llama-3.1-8b": ("gqa", 32, {"num_key_value_heads": 8, "hidden_size": 4096, "num_attention_heads": 32},
                     "huggingface.co/meta-llama/Llama-3.1-8B config.json"),
    "mixtral-8x7b": ("gqa", 32, {"num_key_value_heads": 8, "hidden_size": 4096, "num_attention_heads": 32},
                     "huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json"),
}
EPLB_SOURCE = "deepseek-ai/EPLB README, example (2 layers, 12 experts, 16 replicas, 4 groups, 2 nodes, 8 GPUs)"
EPLB_LOADS = ([90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
              [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27])
EPLB_PHY2LOG = ([5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
                [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1])
LEVIATHAN = "Leviathan et al., ICML 2023: E = (1 - a^(k+1)) / (1 - a)"
MOONCAKE = "Qin et al., FAST'25 (Mooncake), Table 2: synthetic trace"
AZURE = "Azure LLM inference trace 2023 (Patel et al., ISCA 2024), means of the published files"
DEEPSEEK_DAY = "DeepSeek Open Infra Index, day 6 (2025-03-01): one day of V3/R1 inference"
NCCL = "measured NCCL all-reduce times, Vidur profiling data (microsoft/vidur, MIT), mcsim/data/measurements/vidur"
#: Largest mean absolute percentage error allowed for the all-reduce against the measured NCCL times.
ALLREDUCE_MAPE_TARGET = 0.15
GEMMS = "measured per-layer GEMM times, Vidur profiling data (microsoft/vidur, MIT), mcsim/data/measurements/vidur"
#: Largest mean absolute percentage error allowed for the per-layer linear ops against the measured GEMM times.
LINEAR_MAPE_TARGET = 0.08


@dataclass(frozen=True)
class Check:
    """One comparison of an mcsim figure with a reference.

    Attributes
    ----------
    name : str
        What is compared.
    mcsim : float or list
        mcsim's figure (a list for exact placements).
    reference : float or list
        The reference figure.
    tolerance : float
        Largest allowed ``|mcsim - reference|``, in ``unit`` (0: must be equal).
    source : str
        Where the reference comes from (citation).
    passed : bool
    unit : str
    basis : str
        Why the tolerance is what it is.
    target : bool
        A fidelity *target* rather than a check: reported as met or missed, and a missed target does not fail
        ``mcsim validate`` (what is established is the measured figure itself).
    """

    name: str
    mcsim: float | list
    reference: float | list
    tolerance: float
    source: str
    passed: bool
    unit: str = ""
    basis: str = ""
    target: bool = False

    @property
    def result(self) -> str:
        if self.target:
            return "met" if self.passed else "missed"
        return "pass" if self.passed else "FAIL"


def _check(name, mcsim, reference, tolerance, source, unit="", basis="", target=False) -> Check:
    if isinstance(reference, (list, tuple)):
        mcsim, reference = [int(v) for v in mcsim], [int(v) for v in reference]
        passed = mcsim == reference
    else:
        mcsim, reference = float(mcsim), float(reference)
        passed = bool(abs(mcsim - reference) <= tolerance)
    return Check(name, mcsim, reference, float(tolerance), source, passed, unit, basis, target)


# --- the checks, one function per stage --------------------------------------------------------------------


def speculative_checks(quick: bool) -> list[Check]:
    """Simulated tokens per verification pass vs Leviathan's closed form, i.i.d. acceptance."""
    requests, tokens = (20, 10_000) if quick else (20, 50_000)
    checks = []
    for case, (alpha, k) in enumerate([(0.6, 1), (0.8, 2), (0.8, 4), (0.9, 3)]):
        passes, _ = speculative_passes(np.full(requests, tokens), alpha, k, 1.0, np.random.default_rng([7, case]))
        sampled = requests * tokens / passes.sum()
        closed_form = (1 - alpha ** (k + 1)) / (1 - alpha)
        # Tokens per pass 1 + J, J = leading accepted drafts (truncated geometric): its exact variance.
        gain = np.arange(k + 1) + 1.0
        pmf = np.append(alpha ** np.arange(k) * (1 - alpha), alpha**k)
        sd = math.sqrt(float(pmf @ gain**2 - (pmf @ gain) ** 2))
        # Ratio estimator over ~sum(passes) passes, plus the bias of each request's capped last pass (< k tokens).
        tolerance = Z * sd / math.sqrt(passes.sum()) + requests * k / passes.sum()
        checks.append(_check(f"Speculative tokens per pass, alpha={alpha}, k={k}", sampled, closed_form, tolerance,
                             LEVIATHAN, "tokens/pass", f"{Z:g} SE + end-of-request cap bound"))
    return checks


def expert_checks(quick: bool) -> list[Check]:
    """Uniform routing gives Binomial(T, k/E) per-expert loads; EPLB reproduces its README example."""
    n_experts, top_k, tokens, steps = 64, 8, 512, (400 if quick else 2000)
    prob, alias = np.empty((1, n_experts)), np.empty((1, n_experts), np.int64)
    build_alias(np.ones(n_experts), prob[0], alias[0])
    counts = np.empty((steps, n_experts), np.int64)
    route_steps(tokens, np.array([1.0]), prob, alias, top_k, np.random.default_rng(3), counts)
    p = top_k / n_experts
    mean, var = tokens * p, tokens * p * (1 - p)
    per_expert = counts.mean(axis=0)
    worst = per_expert[np.argmax(np.abs(per_expert - mean))]
    # Bonferroni over 64 experts: 4.5 SE keeps the family's false-alarm rate near 4e-4.
    z_family = 4.5
    binomial = f"Binomial(T={tokens}, k/E={top_k}/{n_experts}) (each token includes an expert w.p. k/E)"
    checks = [
        _check("Expert load, uniform routing: per-expert mean (worst of 64)", worst, mean,
               z_family * math.sqrt(var / steps), binomial, "token-assignments/step",
               f"{z_family:g} SE, Bonferroni over experts"),
        # Known mean, so the pooled second moment about it is unbiased; SE ~ var * sqrt(2 / N) for N ~normal
        # terms, widened for the weak negative correlation of experts within one step.
        _check("Expert load, uniform routing: per-expert variance", np.mean((counts - mean) ** 2), var,
               1.25 * Z * var * math.sqrt(2.0 / counts.size), binomial, "(token-assignments/step)^2",
               f"{1.25 * Z:g} SE of a variance"),
    ]
    for layer in (0, 1):
        phy2log, _ = eplb_placement(np.array(EPLB_LOADS[layer], np.float64), 16, 4, 2, 8)
        checks.append(_check(f"EPLB placement, README example layer {layer}: phy2log", phy2log.tolist(),
                             list(EPLB_PHY2LOG[layer]), 0, EPLB_SOURCE, "expert ids", "exact"))
    return checks


def kv_bytes_checks() -> list[Check]:
    """KV bytes per token (BF16) of every catalog model vs the formula on its published configuration."""
    checks = []
    for name in catalog.models():
        mcsim_bytes = catalog.kv_bytes_per_token(catalog.model_preset(name), 2)
        if name not in PUBLISHED_KV_CONFIG:
            checks.append(_check(f"KV bytes/token BF16, {name}", mcsim_bytes, math.nan, 0,
                                 "no published configuration recorded in mcsim.validate", "bytes"))
            continue
        attention, layers, config, source = PUBLISHED_KV_CONFIG[name]
        if attention == "mla":
            reference = (config["kv_lora_rank"] + config["qk_rope_head_dim"]) * layers * 2
            formula = "(kv_lora_rank + qk_rope_head_dim) x layers x 2 B"
        else:
            head_dim = config["hidden_size"] // config["num_attention_heads"]
            reference = 2 * layers * config["num_key_value_heads"] * head_dim * 2
            formula = "2 (K, V) x layers x KV heads x head dim x 2 B"
        checks.append(_check(f"KV bytes/token BF16, {name}", mcsim_bytes, reference, 0, f"{source}; {formula}",
                             "bytes", "exact"))
    return checks


def trace_checks() -> list[Check]:
    """Replayed bundled traces: Mooncake's cache ratio and mean lengths, Azure 2023 mean lengths."""
    scn = load_scenario("validation", text="")
    params = resolve(scn, {})
    replay = {}
    for name in ("mooncake", "azure-code", "azure-conv"):
        trace = traces.read_trace(traces.bundled_trace_path(name))
        replay[name] = workload.from_trace(trace, params, scn.classes, len(trace), np.random.default_rng(0))
    mooncake = replay["mooncake"]
    # One pooled cache with room for every block: what the trace's prefixes allow, no eviction.
    unlimited = np.array([mooncake.block_ids.size + 1, 0, 0], np.int64)
    cached = kvcache.cache_hits(mooncake, "pooled", 1, unlimited, np.random.default_rng(0)).cached_tokens
    rounding = "reference given to the nearest token"
    checks = [
        _check("Mooncake trace: cache ratio, unlimited cache", cached.sum() / mooncake.prompt_tokens.sum(), 0.66,
               0.02, MOONCAKE, "fraction of input tokens",
               "rounded to a whole percent; counting convention (tokens vs blocks, partial last block) not stated: "
               "1.1 pp apart on this file"),
        _check("Mooncake trace: mean input", mooncake.prompt_tokens.mean(), 15_325, 0.5, MOONCAKE, "tokens", rounding),
        _check("Mooncake trace: mean output", mooncake.output_tokens.mean(), 149, 0.5, MOONCAKE, "tokens", rounding),
    ]
    for name, label, (mean_in, mean_out) in (("azure-code", "code", (2048, 28)),
                                             ("azure-conv", "conversation", (1155, 211))):
        requests = replay[name]
        checks += [
            _check(f"Azure 2023 {label}: mean input", requests.prompt_tokens.mean(), mean_in, 0.5, AZURE, "tokens",
                   rounding),
            _check(f"Azure 2023 {label}: mean output", requests.output_tokens.mean(), mean_out, 0.5, AZURE, "tokens",
                   rounding),
        ]
    return checks


def batching_checks(quick: bool) -> list[Check]:
    """Little's law on a stable run of the batching simulator; one request at a time, E2E = sum of steps."""
    # A step time linear in both coordinates, so bilinear interpolation is exact and hand sums are easy.
    base_s, per_seq_s, per_token_s = 0.01, 2e-4, 4e-6
    decode_edges, prefill_edges = np.array([1.0, 64.0, 256.0]), np.array([0.0, 4096.0, 16384.0])
    table = {"step_time_table": base_s + per_seq_s * decode_edges[:, None] + per_token_s * prefill_edges[None, :],
             "decode_edges": decode_edges, "prefill_edges": prefill_edges}
    rng = np.random.default_rng(1)
    n = 3000 if quick else 10_000
    context, output = rng.integers(100, 2000, n), rng.integers(20, 200, n)
    # Capacity from a backlogged run (everything waiting at 0), then a Poisson load at 70 % of it.
    backlog = simulate_batching(np.zeros(1000), context[:1000], context[:1000], output[:1000], max_seqs=64, **table)
    capacity = 1000 / np.nanmax(backlog["per_request"]["finish_s"])
    arrival = np.cumsum(rng.exponential(1.0 / (0.7 * capacity), n))
    summary = simulate_batching(arrival, context, context, output, max_seqs=64, warmup_s=float(arrival[n // 10]),
                                **table)["summary"]
    checks = [_check("Batching simulator: Little's law L / (lambda W), stable run", summary["little_law_ratio"], 1.0,
                     0.02, "Little's law, L = lambda W (Little, Operations Research 1961)", "ratio",
                     "edge effects of a finite window, O(requests in system / requests measured)")]

    # Requests 100 s apart run alone: prompt 1000 with budget 512 is two chunks (512, 488), then `passes`
    # one-sequence decode steps.
    outputs, passes = np.array([1, 2, 40, 40]), np.array([0, 1, 39, 13])
    alone = simulate_batching(np.arange(4) * 100.0, [1000] * 4, [1200] * 4, outputs, passes, token_budget=512,
                              **table)["per_request"]["e2e_s"]
    prefill_s = 2 * (base_s + per_seq_s) + per_token_s * 1000
    hand = prefill_s + passes * (base_s + per_seq_s)
    checks.append(_check("Batching simulator: one request at a time, E2E = sum of its step times", alone.sum(),
                         hand.sum(), 1e-12 * hand.sum(), "identity (step times of the table, added by hand)", "s",
                         "floating-point rounding"))
    return checks


def fleet_checks(quick: bool) -> list[Check]:
    """Replicas behind random routing are independent M/D/1 queues: Poisson arrivals split at random stay Poisson
    at 1/K the rate, and one request per step of a fixed time is a deterministic server. Their mean wait is
    Pollaczek-Khinchine's; routing to the least loaded replica must wait less."""
    replicas, service_s, rho = 8, 0.01, 0.7
    n = 40_000 if quick else 200_000
    rng = np.random.default_rng(11)
    arrival = np.cumsum(rng.exponential(service_s / (rho * replicas), n))
    uniform = rng.uniform(size=n)
    prompt = np.full(n, 100)
    one_step = {"step_time_table": np.full((2, 2), service_s), "decode_edges": np.array([0.0, 1.0]),
                "prefill_edges": np.array([0.0, 1024.0]), "max_seqs": 1, "token_budget": 1024}
    waits = {}
    for router in ("random", "least-outstanding"):
        per = simulate_fleet_batching(arrival, prompt, prompt, np.ones(n, np.int64), np.zeros(n, np.int64),
                                      n_instances=replicas, router=router, router_uniform=uniform,
                                      warmup_s=float(arrival[n // 10]), **one_step)["per_request"]
        waits[router] = (per["queue_s"][per["measured"]], per["instance"][per["measured"]])
    wait, instance = waits["random"]
    # The waits of one queue are correlated: the standard error from 20 batch means per replica.
    batch_means = [b.mean() for i in range(replicas) for b in np.array_split(wait[instance == i], 20)]
    se = float(np.std(batch_means, ddof=1) / math.sqrt(len(batch_means)))
    pollaczek = rho * service_s / (2 * (1 - rho))
    source = "M/D/1 mean wait, Pollaczek-Khinchine: rho D / (2 (1 - rho)); Poisson splitting (random routing)"
    shorter = float(waits["least-outstanding"][0].mean())
    return [
        _check(f"Fleet, {replicas} replicas, random routing at rho={rho}: mean queue wait", wait.mean(), pollaczek,
               Z * se, source, "s", f"{Z:g} SE from batch means"),
        # One-sided: least-outstanding's wait lies anywhere in [0, the M/D/1 figure); the check puts the bound
        # at the interval's middle and allows half of it either side.
        _check(f"Fleet, {replicas} replicas, least-outstanding routing: mean wait below random's M/D/1 wait",
               shorter, pollaczek / 2, pollaczek / 2, "join-the-shortest-queue never waits longer than random "
               "splitting (Winston, J. Appl. Prob. 1977)", "s", "one-sided: in [0, M/D/1 wait]"),
    ]


def allreduce_errors(cluster: str, preset: str):
    """Per-row relative error of mcsim's all-reduce (default algorithm ``auto``, the catalog's fitted figures)
    against one DGX cluster's measured median NCCL times inside a node: ``(relative error, workers, bytes)``."""
    measured = read_collectives(bundled_collectives(cluster, "all_reduce"))
    inside = (measured.devices_per_node == measured.workers) & (measured.workers <= 8)
    hw = catalog.hardware_preset(preset)
    model = np.array([allreduce_time(float(s), int(p), hw)[0]
                      for s, p in zip(measured.nbytes[inside], measured.workers[inside])])
    truth = measured.median_s[inside]
    return np.abs(model - truth) / truth, measured.workers[inside], measured.nbytes[inside]


def allreduce_node_errors(cluster: str, preset: str) -> np.ndarray:
    """Per-row relative error of mcsim's all-reduce (``auto``, catalog figures) against the cluster's measured
    all-reduces over whole nodes (16 GPUs on two nodes of 8)."""
    measured = read_collectives(bundled_collectives(cluster, "all_reduce"))
    hw = catalog.hardware_preset(preset)
    rows = (measured.devices_per_node == hw["gpus_per_node"]) & (measured.workers > hw["gpus_per_node"])
    model = np.array([allreduce_time(float(s), int(p), hw)[0]
                      for s, p in zip(measured.nbytes[rows], measured.workers[rows])])
    truth = measured.median_s[rows]
    return np.abs(model - truth) / truth


def send_errors(cluster: str, preset: str):
    """Per-row relative error of mcsim's point-to-point send against one cluster's measured NCCL send/recv
    medians, inside a node and between two nodes: ``(relative error, across nodes)``."""
    measured = read_collectives(bundled_collectives(cluster, "send_recv"))
    hw = catalog.hardware_preset(preset)
    across = measured.devices_per_node == 1
    model = np.array([send_time(float(s), hw, across_nodes=bool(a)) for s, a in zip(measured.nbytes, across)])
    return np.abs(model - measured.median_s) / measured.median_s, across


def collective_checks() -> list[Check]:
    """mcsim.perf.collectives' all-reduce (2-8 GPUs) and send against measured NCCL times on DGX H100 and A100."""
    checks = []
    for cluster, preset, name in (("h100_dgx", "h100", "H100"), ("a100_dgx", "a100", "A100")):
        errors, _, _ = allreduce_errors(cluster, preset)
        checks.append(_check(f"NCCL all-reduce, DGX {name}, 2-8 GPUs, 2 KiB-64 MiB: MAPE", float(errors.mean()), 0.0,
                             ALLREDUCE_MAPE_TARGET, NCCL, "fraction",
                             "target: mean absolute percentage error <= 15 % over every size and group"))
        if cluster == "a100_dgx":
            errors = allreduce_node_errors(cluster, preset)
            checks.append(_check(f"NCCL all-reduce, two DGX {name} nodes (16 GPUs), 2 KiB-64 MiB: MAPE",
                                 float(errors.mean()), 0.0, ALLREDUCE_MAPE_TARGET, NCCL, "fraction",
                                 "target: mean absolute percentage error <= 15 % over every size", target=True))
        errors, _ = send_errors(cluster, preset)
        checks.append(_check(f"NCCL send/recv, DGX {name}, inside a node and between two, 2 KiB-64 MiB: MAPE",
                             float(errors.mean()), 0.0, ALLREDUCE_MAPE_TARGET, NCCL.replace("all-reduce", "send/recv"),
                             "fraction", "target: mean absolute percentage error <= 15 % over every size"))
    return checks


@functools.lru_cache(maxsize=None)
def _linear_observations(gpu: str, model_name: str):
    """:func:`mcsim.calibration.measurements.linear_observations` of a bundled file, read once for every check that
    uses it (each prices every row on the roofline; the checks only read the observations)."""
    return measurements.linear_observations(bundled_linear(gpu, model_name), catalog.hardware_preset(gpu))


def linear_errors(gpu: str, model_name: str):
    """Per-GEMM relative error of mcsim's per-layer GEMMs (QKV, output, gate/up and down projections, as the roofline
    shapes them, with the hardware's default GEMM figures and surface, BF16) against their measured times:
    ``(relative error, rows, tp)``."""
    hw = catalog.hardware_preset(gpu)
    gemm, _ = _linear_observations(gpu, model_name)
    modelled = fit.predict(gemm, _fitted_units(gemm_figures(as_hardware(hw))),
                           gemm_surface.for_hardware(as_hardware(hw).gemm_surface))
    return np.abs(modelled - gemm.measured_s) / gemm.measured_s, gemm.data["rows"], gemm.data["tp"]


def _fitted_units(figures: dict) -> dict:
    """Scenario values (``gemm_figures``) in the units :func:`mcsim.calibration.fit.predict` takes."""
    return {key: value / scenario_scale(key) for key, value in figures.items()}


def linear_checks() -> list[Check]:
    """mcsim.perf.roofline's per-layer linear ops against measured GEMM times on H100 and A100 (TP 1-8)."""
    checks = []
    for gpu, models in LINEAR_MODELS.items():
        errors = np.concatenate([linear_errors(gpu, m)[0] for m in models])
        fitted_here = catalog.hardware_preset(gpu)["gemm_surface"] == gpu  # the catalog's GEMMs are Vidur's fit
        how = ("catalog defaults (in sample: the surface holds these rows)" if fitted_here else
               "the catalog's figures, fitted to vLLM 0.24.0's GEMMs: a second source")
        checks.append(_check(f"Per-layer GEMMs (QKV, O, gate/up, down), {gpu.upper()}, {_models(gpu)}, TP 1-8, "
                             f"1-4096 rows, {how}: MAPE", float(errors.mean()), 0.0,
                             LINEAR_MAPE_TARGET if fitted_here else SECOND_SOURCE_MAPE_TARGET, GEMMS, "fraction",
                             "target: mean absolute percentage error <= 8 % over every TP and size"
                             if fitted_here else "target: two measured sources agree within 8 %",
                             target=not fitted_here))
    return checks


HELD_OUT_MAPE_TARGET = 0.05
BAND_MAPE_TARGET = 0.08
COVERAGE_TARGET = 0.85


def held_out_errors(gpu: str, replicates: int = 200):
    """Calibrate each op class on half the measured shapes (every other one), predict the other half: op class ->
    (held-out MAPE, share of held-out shapes whose measured time lies in the 90 % bootstrap band)."""
    hw = catalog.hardware_preset(gpu)
    linear = [_linear_observations(gpu, m) for m in LINEAR_MODELS[gpu]]
    classes = {"gemm": measurements.concat([g for g, _ in linear]),
               "elementwise": measurements.concat([e for _, e in linear]),
               "allreduce": measurements.allreduce_observations(bundled_collectives(f"{gpu}_dgx", "all_reduce")),
               "send": measurements.send_observations(bundled_collectives(f"{gpu}_dgx", "send_recv"))}
    out = {}
    for cls, obs in classes.items():
        shapes = np.unique(obs.shape)
        train = np.isin(obs.shape, shapes[::2])
        fitted = fit.fit_class(obs.subset(np.flatnonzero(train)), replicates=replicates, cross_validation=False)
        test = obs.subset(np.flatnonzero(~train))
        predicted = fit.predict(test, fitted.estimate, fitted.surface)
        low, high = fitted.band(test)
        bands = fit.band_errors(predicted, test.measured_s, test.data["rows"]) if cls == "gemm" else {}
        out[cls] = (float(np.mean(np.abs(predicted - test.measured_s) / test.measured_s)),
                    float(np.mean((test.measured_s >= low) & (test.measured_s <= high))), bands)
    return out


def _models(gpu: str) -> str:
    """The bundled models measured on ``gpu``, as a label."""
    return ", ".join(m.replace("-hf", "").replace("-Instruct", "").replace("Meta-", "") for m in LINEAR_MODELS[gpu])


def gemm_model_held_out(gpu: str) -> dict:
    """Each bundled model's GEMMs predicted by a fit and surface of the other models measured on ``gpu``: model ->
    (MAPE with the surface, MAPE of the fit's roofline alone). Shapes a model shares with another are measured;
    the others take the blend of the surface, or the roofline far from every measured shape."""
    hw = catalog.hardware_preset(gpu)
    per = {m: _linear_observations(gpu, m)[0] for m in LINEAR_MODELS[gpu]}
    out = {}
    for held, test in per.items():
        train = measurements.concat([obs for m, obs in per.items() if m != held])
        values = dict(zip(train.active, fit.fit_point(train)))
        out[held] = (fit._mape(fit.predict(test, values, fit.surface_of(train, values)), test.measured_s),
                     fit._mape(fit.predict(test, values), test.measured_s))
    return out


def gemm_cross_validation(gpu: str) -> tuple[float, dict]:
    """The GEMM fit's cross-validated error on the bundled measurements of ``gpu``, all and by row band: each
    measured (tokens, TP) row predicted by a fit and surface built without it (40 interleaved groups)."""
    hw = catalog.hardware_preset(gpu)
    obs = measurements.concat([_linear_observations(gpu, m)[0]
                               for m in LINEAR_MODELS[gpu]])
    predicted, _ = fit.held_out(obs, fit.fit_point(obs))
    return fit._mape(predicted, obs.measured_s), fit.band_errors(predicted, obs.measured_s, obs.data["rows"])


def elementwise_errors(gpu: str) -> np.ndarray:
    """Per-row relative error of the roofline's element-wise kernels (catalog defaults) against the measured ones."""
    hw = catalog.hardware_preset(gpu)
    figures = gemm_figures(as_hardware(hw))
    obs = measurements.concat([_linear_observations(gpu, m)[1]
                               for m in LINEAR_MODELS[gpu]])
    modelled = fit.predict(obs, _fitted_units(figures))
    return np.abs(modelled - obs.measured_s) / obs.measured_s


def calibration_checks(quick: bool = False) -> list[Check]:
    """Element-wise kernels with the default floors, then each op class calibrated on half of the measured shapes
    and checked on the other half (error and band coverage, as fidelity targets)."""
    checks = []
    for gpu in ("h100", "a100"):
        errors = elementwise_errors(gpu)
        checks.append(_check(f"Per-layer element-wise kernels (RMSNorms, RoPE, SwiGLU, adds), {gpu.upper()}, "
                             f"{_models(gpu)}, TP 1-8, 1-4096 tokens: MAPE", float(errors.mean()), 0.0, 0.15,
                             GEMMS.replace("GEMM", "kernel"), "fraction",
                             "mean absolute percentage error <= 15 % with the catalog's fitted kernel floor"))
        mape, bands = gemm_cross_validation(gpu)
        where = f"gemm of {gpu.upper()}, each measured (tokens, TP) row predicted by a fit without it"
        checks.append(_check(f"{where}: MAPE", mape, 0.0, HELD_OUT_MAPE_TARGET, GEMMS, "fraction",
                             "target: <= 5 % on the rows left out (surface rebuilt without them)", target=True))
        for label, value in bands.items():
            checks.append(_check(f"{where}: MAPE, {label}", value, 0.0, BAND_MAPE_TARGET, GEMMS, "fraction",
                                 "target: <= 8 % in every row band (decode batches, prefill chunks)", target=True))
        for model, (mape, alone) in gemm_model_held_out(gpu).items():
            checks.append(_check(f"gemm of {gpu.upper()}, {model} predicted from the other models' fit and surface: "
                                 f"MAPE (the roofline alone: {100 * alone:.1f} %)", mape, 0.0, BAND_MAPE_TARGET, GEMMS,
                                 "fraction", "target: <= 8 % for a model the fit has not seen", target=True))
        for cls, (mape, coverage, bands) in held_out_errors(gpu, 40 if quick else 200).items():
            # every other shape by (tokens, TP): for the GEMMs, TP 1 and 4 predict TP 2 and 8, shapes not measured
            split = "half the shapes (GEMMs: fitted on TP 1 and 4, predicting TP 2 and 8)" if cls == "gemm" \
                else "half the shapes"
            checks.append(_check(f"{cls} calibrated on {split} of {gpu.upper()}: held-out MAPE",
                                 mape, 0.0, HELD_OUT_MAPE_TARGET, GEMMS if cls in ("gemm", "elementwise") else NCCL,
                                 "fraction", "target: <= 5 % on the shapes left out of the fit", target=True))
            for label, value in bands.items():
                checks.append(_check(f"{cls} calibrated on {split} of {gpu.upper()}: held-out MAPE, {label}",
                                     value, 0.0, BAND_MAPE_TARGET, GEMMS, "fraction",
                                     "target: <= 8 % in every row band (decode batches, prefill chunks)",
                                     target=True))
            checks.append(_check(f"{cls} calibrated on {split} of {gpu.upper()}: held-out shapes in the 90 % "
                                 "band", coverage, 1.0, 1.0 - COVERAGE_TARGET,
                                 GEMMS if cls in ("gemm", "elementwise") else NCCL, "fraction",
                                 "target: >= 85 % of the shapes left out inside the bootstrap band (parameters and "
                                 "model error)", target=True))
    return checks


AIC = ("measured under vLLM 0.24.0, AIConfigurator's kernel database (ai-dynamo/aiconfigurator, Apache-2.0), "
       "mcsim/data/measurements/aiconfigurator")
AIC_DTYPES = {"bfloat16": "BF16", "fp8": "FP8 per-tensor", "nvfp4": "NVFP4"}
#: Largest disagreement between the catalog's GEMM figures and a second measured source it was not fitted to.
SECOND_SOURCE_MAPE_TARGET = 0.08


def layer_error(gpu: str, dtype: str, batch: int) -> float:
    """Modelled / measured - 1 of one Llama-3.1-70B TP8 decode layer on ``gpu`` (the bundled dense-node scenario at
    the roofline, its GEMMs in ``dtype``): the step model's GEMMs, attention and TP all-reduce against the sum of
    those kernels measured (:func:`mcsim.calibration.aiconfigurator.layer_kernels`)."""
    fp8 = dtype == "fp8"
    scn = load_scenario(bundled("dense-node"), overrides=[
        'performance.fidelity="roofline"', f'hardware.preset="{gpu}"', f"precision.enabled={str(fp8).lower()}",
        'precision.compute="fp8"', "precision.weight_bytes=1", "precision.kv_bytes=2", "precision.activation_bytes=2"])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})  # sample 0's draws
    model = dict(catalog.model_preset("llama-3.1-70b"), layers=1, dense_layers=1)
    cost = step_cost(model, p, decode_seqs=batch, decode_context=2048, **options(p))
    modelled = sum(cost.breakdown[op]["t"] for op in ("attention_proj", "dense_ffn", "attention_core",
                                                       "tp_allreduce"))
    return modelled / aiconfigurator.layer_kernels(gpu, batch, 2047, dtype) - 1.0


def aiconfigurator_checks(quick: bool = False) -> list[Check]:
    """Every bundled AIConfigurator table: each GEMM and attention shape of each GPU and dtype predicted by a fit
    without it (FP8 KV caches by their own or the BF16 figures); Vidur's H100 GEMM fit against these BF16 GEMMs, a
    second source; whole Llama-70B decode layers against the sum of their measured kernels; the routed experts'
    fused MoE kernels of each GPU and dtype, each shape predicted by a fit without it (and by the step model at the
    catalog's figures, and as grouped GEMMs at the GEMM figures); the custom all-reduce under CUDA graphs."""
    checks = []
    for gpu, dtypes in aiconfigurator.BUNDLED_DTYPES.items():
        for dtype in dtypes:
            mape, bands, rows, shapes = aiconfigurator.bundled_held_out(gpu, dtype, 8 if quick else 40)
            worst = max(bands, key=bands.get)
            checks.append(_check(f"GEMMs of {gpu.upper()}, {AIC_DTYPES[dtype]}, {rows:,} of {shapes} shapes, each "
                                 f"shape predicted by a fit and surface without it: MAPE (worst row band {worst}: "
                                 f"{100 * bands[worst]:.1f} %)", mape, 0.0, HELD_OUT_MAPE_TARGET,
                                 AIC.replace("measured", "GEMMs measured"), "fraction",
                                 "target: <= 5 % on the shapes left out, per GPU and dtype", target=True))
    for gpu in aiconfigurator.BUNDLED_DTYPES:
        result = aiconfigurator.bundled_attention_held_out(gpu, 4 if quick else 10)  # 7 figures a fit
        for phase in ("decode", "prefill"):
            mape, before, calls = result[phase]
            checks.append(_check(f"Attention ({phase}) of {gpu.upper()}, GQA, BF16 KV, {calls:,} calls, each shape "
                                 f"predicted by a fit without it: MAPE (the GEMM figures that priced attention "
                                 f"before: {100 * before:.0f} %)", mape, 0.0, HELD_OUT_MAPE_TARGET,
                                 AIC.replace("measured", "attention calls measured"), "fraction",
                                 "target: <= 5 % on the shapes left out, per GPU", target=True))
        mape, _, calls = result["fp8 kv decode"]
        own = catalog.hardware_preset(gpu)["attention_fp8_kv_bandwidth_fraction"] > 0
        how = "its FP8-KV decode figures (in sample)" if own else "the BF16-KV fit at one byte an element"
        checks.append(_check(f"Attention (decode) of {gpu.upper()}, FP8 KV, {calls:,} calls, priced by {how}: MAPE",
                             mape, 0.0, BAND_MAPE_TARGET,
                             AIC.replace("measured", "attention calls measured"), "fraction",
                             "target: <= 8 %" + ("; in sample" if own else " for a KV dtype the fit has not seen"),
                             target=True))
    for gpu in aiconfigurator.BUNDLED_DTYPES:
        result = aiconfigurator.bundled_mla_held_out(gpu, 4 if quick else 10, stride=3 if quick else 1)
        fp8_mape, fp8_ratio, fp8_modules = result["fp8 kv"]
        for phase in ("decode", "prefill"):
            mape, before, ratio, modules = result[phase]
            fp8 = (f"; {fp8_modules:,} modules over an FP8 cache, decode and prefill, by the catalog's FP8-cache "
                   f"figures (their decode refitted, in sample): {100 * fp8_mape:.0f} %, median {fp8_ratio:.2f}") \
                if phase == "decode" else ""
            checks.append(_check(f"MLA attention modules ({phase}) of {gpu.upper()}, DeepSeek-V3, BF16 cache, BF16 and "
                                 f"FP8 projections, {modules:,} modules, each (heads, projections) shape predicted "
                                 f"by a fit without it: MAPE (the roofline, which priced MLA before: "
                                 f"{100 * before:.0f} %, median modelled / measured {ratio:.2f}{fp8})", mape, 0.0,
                                 HELD_OUT_MAPE_TARGET, AIC.replace("measured", "MLA modules measured"), "fraction",
                                 "target: <= 5 % on the shapes left out, per GPU", target=True))
    errors = aiconfigurator.calibration_gemm_errors("h100", "h100")
    checks.append(_check("Vidur's H100 GEMM fit and surface (mcsim/data/calibrations/h100.toml) against H100's BF16 "
                         "GEMMs under vLLM 0.24.0, a second source: MAPE (median modelled / measured "
                         f"{1 + float(np.median(errors)):.2f})", float(np.mean(np.abs(errors))), 0.0,
                         SECOND_SOURCE_MAPE_TARGET, AIC.replace("measured", "GEMMs measured"), "fraction",
                         "target: two measured sources agree within 8 %", target=True))
    for gpu in aiconfigurator.BUNDLED_DTYPES:
        for dtype in ("bfloat16", "fp8"):
            errors = [layer_error(gpu, dtype, batch) for batch in (64, 128, 256)]
            checks.append(_check(f"A Llama-3.1-70B TP8 decode layer on {gpu.upper()}, {AIC_DTYPES[dtype]} GEMMs, 64, "
                                 "128 and 256 sequences of 2 k tokens, against the sum of its kernels measured "
                                 "(GEMMs, attention, two all-reduces): MAPE", float(np.mean(np.abs(errors))), 0.0,
                                 HELD_OUT_MAPE_TARGET, AIC.replace("measured", "kernels measured"), "fraction",
                                 "target: <= 5 %; in sample (the catalog's figures are fits of these tables)",
                                 target=True))
    for gpu in aiconfigurator.BUNDLED_DTYPES:
        for compute, label in (("bf16", "BF16"), ("fp8", "block-scaled FP8"), ("fp4", "NVFP4")):
            if compute == "fp4" and gpu != "b200":
                continue  # NVFP4 experts measured on B200 only
            mape, bands, layers, shapes = aiconfigurator.bundled_experts_held_out(gpu, compute, 4 if quick else 10)
            worst = max(bands, key=bands.get)
            stride = 4 if quick else 1  # quick: every fourth layer priced by the step model
            step = aiconfigurator.step_model_experts_errors(gpu, compute, stride=stride)
            before = aiconfigurator.step_model_experts_errors(gpu, compute, measured=False, stride=stride)
            checks.append(_check(f"Routed experts of {gpu.upper()}, {label}, vLLM's fused MoE kernel, {layers:,} "
                                 f"layers of {shapes} shapes (balanced routing, experts sharded by TP), each shape "
                                 f"predicted by a fit without it: MAPE (worst band {worst.replace('rows', 'tokens')}: "
                                 f"{100 * bands[worst]:.1f} %; the step model at the catalog's figures, in sample: "
                                 f"{100 * float(np.mean(np.abs(step))):.1f} %; priced as grouped GEMMs at the GEMM "
                                 f"tables' figures, as before: {100 * float(np.mean(np.abs(before))):.1f} %, median "
                                 f"modelled / measured {1 + float(np.median(before)):.2f})", mape, 0.0,
                                 HELD_OUT_MAPE_TARGET, AIC.replace("measured", "MoE layers measured"), "fraction",
                                 "target: <= 5 % on the shapes left out, per GPU and dtype", target=True))
    for gpu, name in (("h100", "h100_sglang_0.5.6.post2"), ("b200", "b200_sglang_0.5.12")):
        table = deepep.read_export(deepep.bundled_path(name))
        errors = deepep.errors(table, deepep.for_hardware(name))
        hw = catalog.hardware_preset(gpu)
        for mode, label in (("deepep_low_latency", "low-latency"), ("deepep_normal", "normal")):
            rows = table["op_name"] == deepep.MODES[mode]
            both = np.concatenate([errors[(mode, phase)] for phase in deepep.PHASES])
            before = []  # the analytic hierarchical model (network_fraction 0.7) on the same dispatches and combines
            for i in np.flatnonzero(rows):
                group = int(table["node_num"][i]) * deepep.TABLE_GPUS_PER_NODE
                t, _ = alltoall_time(table["num_token"][i], table["num_topk"][i], table["hidden_size"][i] * 2.0,
                                     group, hw, algorithm="hierarchical", experts=int(table["num_experts"][i]),
                                     network_fraction=0.7)
                before.append(2 * t / ((table["dispatch_us"][i] + table["combine_us"][i]) * 1e-6) - 1.0)
            nodes = sorted({int(n) for n in table["node_num"][rows]})
            checks.append(_check(f"DeepEP {label} dispatch and combine, {gpu.upper()}, SGLang, "
                                 f"{', '.join(map(str, nodes))} node(s) of 8 GPUs, {int(rows.sum())} token counts "
                                 f"and shapes (the figures fitted to them, as a run fits them): MAPE (the hierarchical "
                                 f"model before: {100 * float(np.mean(np.abs(before))):.0f} %, median modelled / "
                                 f"measured "
                                 f"{1 + float(np.median(before)):.2f})", float(np.mean(np.abs(both))), 0.0,
                                 ALLREDUCE_MAPE_TARGET,
                                 AIC.replace("measured under vLLM 0.24.0", "all-to-alls measured under SGLang "
                                             + name.split("_sglang_")[1]), "fraction",
                                 "target: <= 15 %; in sample", target=True))
    errors = aiconfigurator.nccl_allreduce_errors("b200")
    checks.append(_check(f"NCCL all-reduce, B200, NCCL 2.29.2, 2-8 GPUs, 2 KiB-64 MiB ({errors.size} messages; the "
                         "catalog's figures fitted to them): MAPE", float(np.mean(np.abs(errors))), 0.0,
                         ALLREDUCE_MAPE_TARGET,
                         AIC.replace("measured under vLLM 0.24.0", "all-reduces measured under NCCL 2.29.2"),
                         "fraction", "target: <= 15 %; in sample", target=True))
    for gpu in ("h100", "h200"):
        errors = aiconfigurator.nccl_allreduce_errors(gpu)
        obs = aiconfigurator.nccl_allreduce_observations(
            aiconfigurator.read_table(aiconfigurator.bundled_nccl(gpu), aiconfigurator.NCCL_COLUMNS))
        large = obs.data["bytes"] >= 8 * 2 ** 20
        checks.append(_check(f"NCCL all-reduce, {gpu.upper()}, NCCL 2.29.2, 2-8 GPUs, 2 KiB-64 MiB, priced by the "
                             f"catalog's fit to Vidur's DGX H100 profiles, a second source ({errors.size} messages): "
                             f"MAPE (median modelled / measured {1 + float(np.median(errors)):.2f}; from 8 MiB, "
                             f"where the step model runs NCCL: {100 * float(np.mean(np.abs(errors[large]))):.1f} %)",
                             float(np.mean(np.abs(errors))), 0.0, SECOND_SOURCE_MAPE_TARGET,
                             AIC.replace("measured under vLLM 0.24.0", "all-reduces measured under NCCL 2.29.2"),
                             "fraction", "target: two measured sources agree within 8 %", target=True))
    for gpu in ("h100", "h200", "b200"):
        errors = aiconfigurator.custom_allreduce_errors(gpu)
        checks.append(_check(f"Custom all-reduce under CUDA graphs, {gpu.upper()}, 2-8 GPUs, 256 B-8 MiB "
                             f"({len(errors)} messages; the catalog's figures fitted to them): MAPE",
                             float(np.mean(np.abs(errors))), 0.0, ALLREDUCE_MAPE_TARGET,
                             AIC.replace("measured", "all-reduces measured"), "fraction",
                             "mean absolute percentage error <= 15 % with vLLM's one-shot/two-shot rule"))
    return checks


def economics_checks() -> list[Check]:
    """DeepSeek's published day through mcsim.stages.economics: cost, revenue, cost-profit margin."""
    # 226.75 H800 nodes (8 GPUs) on average at $2/GPU-hour; 608 B input tokens of which 342 B cache hits,
    # 168 B output tokens, at R1 prices $0.14 / $0.55 / $2.19 per million.
    day = economics.daily(226.75 * 8, 1.0, hit_tokens_per_day=342e9, miss_tokens_per_day=608e9 - 342e9,
                          output_tokens_per_day=168e9, prices=(0.14, 0.55, 2.19), pricing="rental",
                          rental_usd_per_gpu_hour=2.0)
    revenue_tolerance = 1e-3 * 562_027  # the token counts are published rounded to billions
    # The margin is published as a whole percent; the revenue's tolerance moves it by that / cost as well.
    margin_tolerance = 0.005 + revenue_tolerance / 87_072
    return [
        _check("DeepSeek day: cost", day.cost_usd_per_day, 87_072, 0.5, DEEPSEEK_DAY, "USD/day", "to the dollar"),
        _check("DeepSeek day: revenue at R1 prices", day.revenue_usd_per_day, 562_027, revenue_tolerance,
               DEEPSEEK_DAY, "USD/day", "0.1 %: the token counts are published rounded to billions"),
        _check("DeepSeek day: cost-profit margin", day.cost_profit_margin, 5.45, margin_tolerance, DEEPSEEK_DAY,
               "fraction", "published as a whole percent (545 %), plus the revenue tolerance / cost"),
    ]


def run_validation(out_dir: str | os.PathLike | None = None, quick: bool = False) -> list[Check]:
    """Run every check.

    Parameters
    ----------
    out_dir : path-like, optional
        Also write ``validation.md`` and ``validation.json`` there (created if needed).
    quick : bool
        Smaller samples (tolerances follow their standard errors), for tests.

    Returns
    -------
    list of Check

    Examples
    --------
    >>> checks = run_validation(quick=True)  # doctest: +SKIP
    >>> all(check.passed for check in checks)  # doctest: +SKIP
    True
    """
    started = time.perf_counter()
    checks = (speculative_checks(quick) + expert_checks(quick) + kv_bytes_checks() + trace_checks()
              + batching_checks(quick) + fleet_checks(quick) + collective_checks() + linear_checks()
              + calibration_checks(quick) + aiconfigurator_checks(quick)
              + economics_checks())
    if out_dir is not None:
        write_reports(checks, out_dir, quick=quick, seconds=time.perf_counter() - started)
    return checks


# --- reports ---------------------------------------------------------------------------------------------------


def format_value(value) -> str:
    """A figure for the table: lists in brackets, thousands with separators, small values to 6 digits."""
    if isinstance(value, list):
        return "[" + ", ".join(map(str, value)) + "]"
    if not math.isfinite(value):
        return "n/a"
    if value == round(value) and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:,.2f}" if abs(value) >= 1000 else f"{value:.6g}"


def _tolerance(check: Check) -> str:
    if check.tolerance == 0:
        return "exact"
    return f"± {format_value(check.tolerance)}"


def markdown(checks: list[Check], quick: bool = False, seconds: float | None = None) -> str:
    """The validation table as Markdown (every column of :class:`Check`)."""
    checked = [c for c in checks if not c.target]
    passed = sum(check.passed for check in checked)
    met = sum(c.passed for c in checks if c.target)
    took = f" in {seconds:.1f} s" if seconds is not None else ""
    lines = [
        "# mcsim validation",
        "",
        (f"mcsim {__version__}, {time.strftime('%Y-%m-%d %H:%M:%S')}{', quick sizes' if quick else ''}{took}: "
         f"**{passed} of {len(checked)} checks pass**; {met} of {len(checks) - len(checked)} fidelity targets met. "
         "What each check establishes, and what it does not: "
         "docs/VALIDATION.md."),
        "",
        "| check | mcsim | reference | tolerance | unit | result | source | tolerance basis |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in checks:
        cells = [c.name, format_value(c.mcsim), format_value(c.reference), _tolerance(c), c.unit,
                 c.result if c.passed or c.target else "**FAIL**", c.source, c.basis]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines) + "\n"


def to_json(checks: list[Check], quick: bool = False, seconds: float | None = None) -> str:
    """The checks as JSON: provenance and one object per check with every field of :class:`Check`."""
    def clean(value):  # JSON has no NaN
        return None if isinstance(value, float) and not math.isfinite(value) else value

    payload = {
        "mcsim_version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "quick": quick,
        "seconds": seconds,
        "passed": all(check.passed for check in checks if not check.target),
        "checks": [{key: clean(value) for key, value in asdict(check).items()} for check in checks],
    }
    return json.dumps(payload, indent=2) + "\n"


def write_reports(checks: list[Check], out_dir, quick: bool = False, seconds: float | None = None) -> list:
    """Write ``validation.md`` and ``validation.json`` into ``out_dir``; return their paths."""
    out = pathlib.Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "validation.md", out / "validation.json"]
    atomic_write(paths[0], markdown(checks, quick, seconds), mode=0o600)  # owner-only, as these were always written
    atomic_write(paths[1], to_json(checks, quick, seconds), mode=0o600)
    return paths


def text_table(checks: list[Check]) -> str:
    """A plain aligned table for the terminal (sources are in the Markdown report)."""
    rows = [("check", "mcsim", "reference", "tolerance", "result")]
    for c in checks:
        mcsim, reference = format_value(c.mcsim), format_value(c.reference)
        if isinstance(c.mcsim, list):  # placements are long: show them once, in the files
            mcsim, reference = ("= reference", "(see files)") if c.passed else ("differs", "(see files)")
        rows.append((c.name, mcsim, reference, _tolerance(c), c.result))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


def validate_command(out_dir=None, as_json: bool = False, quick: bool = False) -> int:
    """Body of ``mcsim validate``: run the checks, print them, write the reports, return the exit code.

    Parameters
    ----------
    out_dir : path-like, optional
        Where ``validation.md`` and ``validation.json`` go (default ``outputs/validation/``).
    as_json : bool
        Print the JSON report instead of the table.
    quick : bool
        Smaller samples.

    Returns
    -------
    int
        0 if every check passes, 1 otherwise.
    """
    started = time.perf_counter()
    checks = run_validation(quick=quick)
    seconds = time.perf_counter() - started
    paths = write_reports(checks, DEFAULT_OUT_DIR if out_dir is None else out_dir, quick, seconds)
    failed = [check.name for check in checks if not check.passed and not check.target]
    targets = [check for check in checks if check.target]
    if as_json:
        sys.stdout.write(to_json(checks, quick, seconds))
    else:
        print(text_table(checks))
        checked = len(checks) - len(targets)
        verdict = (f"{checked - len(failed)} of {checked} checks pass"
                   + (f"; failed: {', '.join(failed)}" if failed else "")
                   + f"; {sum(t.passed for t in targets)} of {len(targets)} fidelity targets met")
        print(f"\n{verdict} ({seconds:.1f} s). Sources and tolerances: {paths[0]}; {paths[1]}")
    return 1 if failed else 0

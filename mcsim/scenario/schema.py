"""The scenario schema: every section, key, type, default, range and meaning, written once.

The validator (:mod:`mcsim.scenario.loading`), the README's key reference and the ablation levers all read this table,
so a key cannot be accepted in one place and unknown in another.

Kinds
-----
``float`` / ``int``
    A model input. May be a distribution table: then it is *uncertain*, drawn once per Monte Carlo sample and
    stored in the result. ``int`` values drawn from a distribution are rounded.
``perreq``
    Per-request variability: a number or a distribution sampled once per request. Its parameters may be
    uncertain (nested distribution tables).
``bool`` / ``str`` / ``choice``
    Switches and names; never uncertain (sweep them instead).
``weights``
    A list of non-negative relative weights, at least one positive, or an empty list (the key is off). Never
    uncertain, and not a grid axis: a scenario has one list.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from mcsim.errors import McsimError
from mcsim.scenario import catalog
from mcsim.scenario.bounds import (CATALOG_LOWER, CATALOG_UPPER, ELEMENT_BYTES, MAX_BURSTINESS, MAX_GPU_MEMORY_GB,
                                   SCENARIO_LOWER, SCENARIO_UPPER)
from mcsim.scenario.choices import (ALLREDUCE_ALGORITHMS, ALLREDUCE_IMPLS, ALLTOALL_ALGORITHMS, CUDAGRAPH_MODES,
                                    FLEET_SIMULATIONS, ROUTING_POLICIES, SCHEDULERS, STACKS)


@dataclass(frozen=True)
class Field:
    kind: str
    default: Any
    doc: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple = ()
    lo_open: bool = False  # lo is exclusive
    plain: bool = False  # a plain value only: the key shapes the run itself and cannot be uncertain
    fidelity: str = ""  # the one performance.fidelity that reads the key ("": both read it)

    @property
    def takes_distribution(self) -> bool:
        """Whether the key may be written as a distribution table (uncertainty or per-request variability)."""
        return self.kind in ("float", "int", "perreq") and not self.plain

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "weights":
            return "a list of numbers >= 0, at least one of them > 0 (or an empty list)"
        rng = ""
        if self.lo is not None or self.hi is not None:
            lo = "-inf" if self.lo is None else f"{self.lo:g}"
            hi = "inf" if self.hi is None else f"{self.hi:g}"
            rng = f" in {'(' if self.lo_open else '['}{lo}, {hi}]"
        noun = {"float": "a number", "int": "an integer", "bool": "true or false", "str": "a string",
                "perreq": "a number or a per-request distribution"}[self.kind]
        return noun + rng


#: Keys earlier versions read, and what to do instead (a scenario that sets one gets this, not "unknown key").
REMOVED_KEYS = {
    "performance.cuda_graphs": "replaced by performance.cudagraph_mode (false: \"none\"; true: \"full\"; the default, "
                               "\"stack\", is the serving stack's own)",
    "performance.overlap_fraction": "split by phase: set performance.decode_comm_overlap and "
                                    "performance.prefill_comm_overlap (the same value keeps the old meaning)",
    "deployment.router": "renamed: set deployment.routing (mcsim schema --describe lists its choices)",
    "performance.mixed_step_penalty": "removed: a step that mixes decode sequences and prefill tokens is priced as one "
                                      "step over all its tokens (the weights are read once; the roofline prices every "
                                      "op of the mix); drop the key",
}


def F(default, doc, lo=None, hi=None, lo_open=False, fidelity=""):
    return Field("float", default, doc, lo, hi, lo_open=lo_open, fidelity=fidelity)


def I(default, doc, lo=None, hi=None, fidelity=""):  # noqa: E743 - a short constructor name keeps the table readable
    return Field("int", default, doc, lo, hi, fidelity=fidelity)


def B(default, doc, fidelity=""):
    return Field("bool", default, doc, fidelity=fidelity)


def S(default, doc, fidelity=""):
    return Field("str", default, doc, fidelity=fidelity)


def C(default, doc, *choices, fidelity=""):
    return Field("choice", default, doc, choices=choices, fidelity=fidelity)


def R(default, doc, lo=None, hi=None):
    return Field("perreq", default, doc, lo, hi)


def W(doc):
    return Field("weights", (), doc, 0)  # empty by default: the key is off


#: Defaults of the roofline's GEMM efficiency on an accelerator with no measured GEMMs: uncertain, around the
#: figures such an accelerator used to get as points (0.6 of peak FLOP/s, 0.8 of HBM bandwidth).
UNMEASURED_FLOPS_FRACTION = {"dist": "triangular", "low": 0.45, "mode": 0.6, "high": 0.78}
UNMEASURED_BANDWIDTH_FRACTION = {"dist": "triangular", "low": 0.65, "mode": 0.8, "high": 0.95}
#: Each of them, the scenario key it stands in for, and the catalog's fitted figure that makes it unneeded.
UNMEASURED_STAND_INS = {
    "performance.unmeasured_flops_fraction": ("performance.flops_fraction", "hardware.gemm_flops_fraction"),
    "performance.unmeasured_bandwidth_fraction": ("performance.bandwidth_fraction", "hardware.gemm_bandwidth_fraction"),
}
#: Swept keys after which a grid point may read inputs the scenario itself does not (every one is drawn then).
READS_CHANGING_KEYS = ("performance.fidelity", "hardware.preset",
                       *(key for pair in UNMEASURED_STAND_INS.values() for key in pair))


def reads_stand_in(path: str, values: dict) -> bool:
    """Whether a scenario (its flat ``values``) reads the unmeasured-GPU stand-in ``path``: the scenario leaves the
    key it stands in for at 0 and the hardware has no fitted figure for it."""
    own, fitted = UNMEASURED_STAND_INS[path]
    return values.get(own, 0) == 0 and not values.get(fitted, 0)


#: The values of performance.fidelity; a Field whose ``fidelity`` names one of them is read by that one only.
FIDELITIES = ("factor", "roofline")

#: When ``mc.chunk_requests`` is 0: a sample of more requests than this streams (fewer run whole, their latency
#: quantiles exact), in chunks of :data:`CHUNK_REQUESTS` (:mod:`mcsim.execution.sample` reads both).
STREAM_ABOVE = 1 << 18
#: Requests per chunk of a streamed sample when ``mc.chunk_requests`` is 0. The chunk sets a streamed sample's memory
#: and nothing it computes; chunks of a sixteenth of :data:`STREAM_ABOVE` run as fast as chunks of all of it, in less
#: memory (benchmarks/README.md, Sample memory); smaller ones start to cost time.
CHUNK_REQUESTS = 1 << 14
#: The most measured requests the batching simulator replays in a streamed sample when
#: ``performance.batching_requests`` is 0 (a whole sample replays all of them): the first ones, whatever the chunks.
WINDOW_REQUESTS = 1 << 18

SECTIONS: dict[str, dict[str, Field]] = {  # a key read by one fidelity only names it (fidelity=...)
    "meta": {
        "name": S("scenario", "Short name; default output file is outputs/<name>.nc."),
        "description": S("", "What the scenario asks."),
    },
    "mc": {
        "samples": replace(I(32, "Monte Carlo samples (draws of the uncertain inputs).", 1, 1_000_000), plain=True),
        "requests": replace(I(20_000, "Requests simulated per sample.", 1, 100_000_000), plain=True),
        "chunk_requests": replace(I(0, "Requests per chunk of a streamed sample: a sample of more requests runs "
                                       "its stages chunk by chunk, in memory that does not grow with mc.requests, "
                                       "where its stages allow (see mcsim.execution.sample.streamed). 0: samples of "
                                       f"more than {STREAM_ABOVE} requests stream, in chunks of {CHUNK_REQUESTS}. "
                                       "No figure of a streamed sample depends on its chunks.",
                                    0, 100_000_000), plain=True),
        "seed": replace(I(0, "Root seed; every random stream is derived from it and the sample index.", 0,
                          2**63 - 1), plain=True),
        "sampling": C("random", "How uncertain inputs are drawn.", "random", "lhs"),
        "warmup_fraction": replace(F(0.2, "Leading fraction of each sample's requests that only warms the caches and "
                                          "is left out of every statistic.", 0, 0.9), plain=True),
        "steady_state_tolerance": replace(F(0.02, "Largest absolute difference between the cache hit rate of the "
                                                  "last and the third quarter of a sample's measured requests for "
                                                  "the sample to count as steady (output steady_state).", 1e-4, 0.5),
                                          plain=True),
        "queue_steady_state_tolerance": replace(F(0.1, "Largest change of the batching simulator's mean queue wait "
                                                       "from the third to the last quarter of its measured window, as "
                                                       "a share of the mean time in system, for the sample to count as "
                                                       "steady.", 1e-3, 10), plain=True),
    },
    "model": {
        "preset": S("deepseek-v3", "Model catalog entry (mcsim/data/models.toml); any field may be overridden."),
    },
    "hardware": {
        "preset": S("h800", "Hardware catalog entry (mcsim/data/hardware.toml); any field may be overridden."),
    },
    "deployment": {
        "fleet": C("utilization", "How the fleet is sized. utilization: enough whole instances per pool for the "
                   "load at economics.target_utilization (at least instances / prefill_instances); fixed: "
                   "instances (and prefill_instances) serve the load, whatever it is; slo: the smallest whole "
                   "fleet whose simulated slo_quantile TTFT and TPOT meet ttft_target_s and tpot_target_s. fixed "
                   "and slo always run the batching simulator.", "utilization", "fixed", "slo"),
        "instances": I(4, "Decode (or colocated) instances: the fleet in fleet = 'fixed', its smallest size in "
                          "'utilization'. The prefix caches are split over these instances (over the prefill "
                          "instances when disaggregated) unless routing = 'pooled'.", 1, 100_000),
        "prefill_instances": I(0, "Prefill instances when disaggregated: the prefill fleet in fleet = 'fixed', its "
                                  "smallest size in 'utilization' (0 = as many as instances).", 0, 100_000),
        "max_instances": I(1024, "The most instances per pool: fleet = 'slo' tries no more, fleet = 'utilization' "
                                 "deploys no more (a sample whose load needs more is infeasible, with its reason); "
                                 "fleet = 'fixed' deploys deployment.instances as given.", 1, 1_000_000),
        "slo_quantile": F(0.99, "Quantile of TTFT and TPOT that must meet their targets in fleet = 'slo' (also "
                                "reported as ttft_at_slo_quantile_s / tpot_at_slo_quantile_s).", 0, 1,
                          lo_open=True),
        "gpus_per_instance": I(0, "Decode GPUs per instance (the EP/TP group); 0 = tp x pp (an instance of TP 8 is 8 "
                                  "GPUs; more makes the rest attention data parallelism).", 0, 100_000),
        "prefill_gpus_per_instance": I(0, "Prefill GPUs per instance when disaggregated; 0 = prefill_tp.", 0,
                                       100_000),
        "disaggregated": B(True, "Prefill and decode on separate pools (lever: prefill/decode split)."),
        "batching": C("continuous", "Batching policy (lever: continuous batching).", "continuous", "static"),
        "scheduler": C("fcfs", "Scheduler policy of continuous batching (mcsim.scenario.policies): fcfs; priority "
                               "(workload.classes.<name>.priority, higher first, FCFS within a class); "
                               "shortest-prompt-first; exclusive-prefill (a step is prefill or decode, prefill "
                               "first); chunked-prefill (Sarathi-style, as fcfs). Static batching ignores it.",
                       *SCHEDULERS),
        "max_new_per_step": I(0, "Sequences a continuous-batching step admits at most (0 = no cap).", 0, 1_000_000),
        "routing": C("prefix-affinity", "How requests are routed to instances (and their prefix caches): random; "
                     "round-robin; prefix-affinity (by a hash of the first block: one system prompt or session, "
                     "one instance); cache-aware (the longest cached prefix, unless the instances' loads are "
                     "imbalanced, SGLang's rule); pooled (one cache of all instances' capacity: a shared KV "
                     "store, requests placed by least-outstanding); least-outstanding (fewest requests in "
                     "flight) and least-kv (most free KV blocks), which read the instances' current state "
                     "(replicas only). With "
                     "fleet_simulation = 'replicas' the router sees each instance's queue and cache at the "
                     "arrival; with 'representative' the caches are replayed in arrival order and cache-aware's "
                     "load is the blocks routed so far.", *ROUTING_POLICIES),
        "fleet_simulation": C("representative", "How the batching simulator models a pool's instances: "
                              "representative (fast) simulates one instance receiving 1/N of the arrivals, with "
                              "cache hits from the cache stage's replay in arrival order, and tiles the measured "
                              "requests to fill its queue; replicas simulates all N on one clock behind "
                              "deployment.routing, each with its own prefix cache (or the pooled one) looked up "
                              "and filled as it admits requests, over the whole request stream (warm-up requests "
                              "included, latencies from the measured ones), and cost, hit rate and busy time "
                              "come from that run; disaggregated, the prefill replicas hold the caches and feed "
                              "the decode replicas. Replicas always run (as fleet = 'fixed' and 'slo' do), under every "
                              "scheduler policy (static batching and exclusive prefill included; "
                              "performance.preempt and max_new_per_step apply); a closed loop runs on a colocated "
                              "pool only.", *FLEET_SIMULATIONS),
        "routing_balance": F(0.25, "Cache-aware routing's relative load guard. Representative: an instance more "
                                   "than (1 + this) x the least loaded one's load (blocks routed so far) is passed "
                                   "over. Replicas: the fleet counts as imbalanced, and the request goes to the "
                                   "least loaded instance, when the largest in-flight count exceeds (1 + this) x "
                                   "the smallest and by more than routing_balance_requests.", 0, None),
        "routing_balance_requests": I(64, "fleet_simulation = 'replicas', cache-aware routing: the absolute load "
                                          "guard, requests in flight (SGLang's balance_abs_threshold, 64).",
                                      0, 1_000_000),
        "max_batch_per_gpu": F(256, "Cap on concurrent decode sequences per GPU.", 1, None),
        "tpot_target_s": F(0.05, "Time-per-output-token target; the operating batch is the largest that meets it.",
                           0, None, lo_open=True),
        "ttft_target_s": F(0.0, "Time-to-first-token SLO for slo_attainment (0 = none).", 0, None),
        "memory_fraction": F(0.9, "Fraction of HBM usable for weights, activations and KV.", 0, 1, lo_open=True),
        "tp": I(1, "Tensor-parallel degree of a decode instance (roofline); attention data-parallel groups fill "
                   "the rest of gpus_per_instance / (tp x pp).", 1, 4096),
        "pp": I(1, "Pipeline-parallel stages of a decode instance (roofline).", 1, 1024),
        "prefill_tp": I(1, "Tensor-parallel degree of a prefill instance (roofline).", 1, 4096),
        "activation_gb_per_gpu": F(4.0, "HBM reserved per GPU for activations and workspace, GB (at most "
                                        "100,000, more than any GPU holds).", 0, MAX_GPU_MEMORY_GB),
    },
    "workload": {
        "trace": S("", "Replay a real trace instead of the generator: a path, or 'bundled:mooncake', "
                       "'bundled:azure-code', 'bundled:azure-conv'. Relative paths are from the scenario file."),
        "trace_format": C("auto", "Trace format.", "auto", "mooncake", "azure", "burstgpt"),
        "trace_time_scale": F(1.0, "Replay a trace at this multiple of its recorded request rate: arrival gaps are "
                                   "divided by it (2 = the same requests in half the time). Lengths and order are "
                                   "unchanged.", 0, None, lo_open=True),
        "trace_start_s": F(0.0, "Replay a trace from this time, seconds after its first request on the trace's own "
                                "clock (before trace_time_scale); the first request at or after it arrives at 0.",
                           0, None),
        "rate_rps": F(50.0, "Mean arrival rate of the simulated traffic, requests/s (generator only; traces "
                            "keep their own timestamps).", 0, None, lo_open=True),
        "arrivals": C("poisson", "Arrival process.", "poisson", "gamma"),
        "burstiness": F(1.0, "Gamma arrivals: 1/shape of the inter-arrival gamma, the squared coefficient of "
                              "variation of the gaps (1 = Poisson, >1 = bursty). At most 100, gaps whose standard "
                              "deviation is ten times their mean (beyond it nearly every gamma gap is 0 and a "
                              "sample's requests arrive at one instant).", 0, MAX_BURSTINESS, lo_open=True),
        "rate_profile": W("Arrival rate over a period (a diurnal profile): relative rates, one per equal slice of "
                          "rate_profile_period_s (e.g. 24 hourly values), normalised to mean 1 so that rate_rps "
                          "stays the mean rate over a whole period; a slice of rate 0 gets no arrival. The "
                          "arrival process runs in operational time and is mapped through the cumulative "
                          "intensity (Poisson arrivals make a non-homogeneous Poisson process). Generator only: "
                          "a trace brings its own arrival times. Empty: a constant rate."),
        "rate_profile_period_s": replace(F(86400.0, "Length of the period rate_profile covers, s; the profile "
                                                    "repeats after it.", 0, None, lo_open=True), plain=True),
        "rate_profile_start_s": F(0.0, "Where in rate_profile's period the sample's first arrival falls, s from the "
                                       "period's start, in [0, rate_profile_period_s) (14 x 3600 = 2 pm of a daily "
                                       "profile; within a slice of rate 0, the next slice with traffic). A "
                                       "distribution places each sample at its own time of the period.", 0, None),
        "system_prompts": I(64, "Pool of shared system prompts (Zipf-popular).", 1, 10_000_000),
        "system_prompt_zipf": F(1.0, "Zipf exponent of system-prompt popularity.", 0, 10),
        "system_prompt_tokens": R({"dist": "lognormal", "median": 1500, "sigma": 0.6},
                                  "Length of each system prompt, tokens (drawn per system prompt).", 0, None),
        "think_time_s": F(30.0, "Mean gap between turns of a session, seconds.", 0, None),
        "max_context": I(0, "Longest prompt allowed, tokens; later turns beyond it are dropped "
                            "(0 = the model's max_context).", 0, None),
    },
    "cache": {
        "enabled": B(True, "Reuse prefix KV (lever: tiered KV cache)."),
        "block_tokens": I(64, "Tokens per KV block; only whole blocks are reused.", 1, 1_000_000),
        "hbm_gb_per_instance": F(100.0, "HBM set aside for reusable prefix KV per instance, GB (the short form of "
                                        "the tiers: with dram_gb_per_node and nvme_gb_per_node it makes the tiers "
                                        "hbm, dram and nvme; [[cache.tiers]] replaces all four keys).", 0, None),
        "dram_gb_per_node": F(1024.0, "Host DRAM for KV per node, GB (0 = no DRAM tier; short form, read over each "
                                      "GPU's hardware.host_link_gb_s).", 0, None),
        "nvme_gb_per_node": F(8000.0, "NVMe for KV per node, GB (0 = no NVMe tier; short form).", 0, None),
        "nvme_gb_s_per_node": F(25.0, "NVMe read bandwidth per node, GB/s (short form).", 0, None, lo_open=True),
        "dram_usd_per_gb_month": F(0.10, "Price of the DRAM tier's capacity, USD per GB-month (short form; the "
                                         "dram kind's estimate: 4.5 USD/GB over 48 months).", 0, None),
        "nvme_usd_per_gb_month": F(0.0025, "Price of the NVMe tier's capacity, USD per GB-month (short form; the "
                                           "nvme kind's estimate: 0.12 USD/GB over 48 months).", 0, None),
    },
    "speculative": {
        "enabled": B(True, "Speculative decoding / MTP (lever)."),
        "draft_tokens": I(1, "Draft tokens k per verification pass.", 0, 64),
        "acceptance_decay": F(1.0, "Acceptance of draft position i is alpha * decay**i.", 0, 1, lo_open=True),
        "draft_cost": F(0.02, "Cost of drafting one token, as a fraction of a decode step.", 0, None),
        "verify_cost": F(0.02, "Extra cost of verifying one more token per sequence, fraction of a decode step.",
                         0, None, fidelity="factor"),
    },
    "moe": {
        "redundant_experts": I(32, "Redundant expert slots replicated from a past window's hottest experts "
                                   "(lever: expert replication; 0 = static contiguous placement).", 0, 100_000),
        "ep_ranks": I(0, "Expert-parallel ranks (0 = gpus_per_instance).", 0, 100_000),
        "groups": I(1, "Expert groups for hierarchical placement (EPLB).", 1, 100_000),
        "nodes": I(1, "Nodes for hierarchical placement (EPLB).", 1, 100_000),
        "window_steps": I(32, "Past steps whose loads decide the placement.", 1, 1_000_000),
        "eval_steps": I(32, "Fresh steps on which the placement is measured.", 1, 1_000_000),
        "tokens_per_step": I(0, "Tokens per MoE step across the EP group (0 = operating batch x EP ranks).",
                             0, 1_000_000),
        "ffn_time_fraction": F(0.5, "Share of a decode step spent in the MoE FFN (the part the slowest rank "
                                    "slows down).", 0, 1, fidelity="factor"),
    },
    "precision": {
        "enabled": B(True, "Low-precision weights and KV (lever)."),
        "weight_bytes": F(1.0, "Bytes per weight when enabled (baseline: 2, BF16), from one bit (0.125) to FP64 "
                               "(8).", *ELEMENT_BYTES),
        "kv_bytes": F(1.0, "Bytes per KV element when enabled (baseline: 2, BF16), from one bit (0.125) to FP64 "
                           "(8). MLA latent caches are commonly kept at 2.", *ELEMENT_BYTES),
        "decode_gain": F(1.3, "Decode throughput gain from low precision.", 0, None, lo_open=True, fidelity="factor"),
        "prefill_gain": F(1.5, "Prefill throughput gain from low precision.", 0, None, lo_open=True, fidelity="factor"),
        "compute": C("fp8", "Matmul precision when enabled (roofline; falls back to a wider format the hardware "
                            "has).", "fp32", "bf16", "fp8", "fp4", fidelity="roofline"),
        "activation_bytes": F(2.0, "Bytes per activation element (roofline), from one bit (0.125) to FP64 (8).",
                              *ELEMENT_BYTES, fidelity="roofline"),
        "linear": C("", "Compute format of the dense linear layers when enabled (attention projections, dense and "
                        "shared-expert FFNs, LM head; roofline): \"\" = precision.compute. A format narrower than the "
                        "activations reads GEMM inputs at its width and, without fused kernels, pays a cast kernel "
                        "per input.", "", "fp32", "bf16", "fp8", "fp4", fidelity="roofline"),
        "experts": C("", "Compute format of the routed experts' GEMMs when enabled (roofline): \"\" = "
                         "precision.linear's.", "", "fp32", "bf16", "fp8", "fp4", fidelity="roofline"),
        "expert_weight_bytes": F(0.0, "Bytes per routed-expert weight when enabled: 0 = weight_bytes; e.g. 0.5 for a "
                                      "4-bit expert checkpoint beside 8-bit attention (storage, apart from "
                                      "precision.experts, the compute format).", 0.0, ELEMENT_BYTES[1]),
    },
    "performance": {
        "fidelity": C("roofline", "factor: throughput as base x lever factors; roofline: step times from the model "
                      "and hardware (FLOPs, bytes, collectives, overheads).", "factor", "roofline"),
        "calibration": S("", "A calibration file (mcsim calibrate, mcsim trace --save-calibration), relative to the "
                             "scenario file: its fitted parameters replace the scenario's, drawn per sample from "
                             "their bootstrap replicates; refused for another regime (hardware, matmul format, "
                             "fidelity). --calibration FILE sets it."),
        "simulate_batching": B(False, "Run the continuous-batching simulator for latency under load (queueing, "
                                      "TTFT/TPOT/E2E quantiles) instead of service times."),
        "flops_fraction": F(0.0, "Largest achievable fraction of peak FLOP/s of a GEMM (and the fraction of attention "
                                 "and routers); 0 = the hardware catalog's, fitted to measured GEMM times where it "
                                 "has one (hardware.gemm_flops_fraction), else performance.unmeasured_flops_fraction.",
                            0, 1, fidelity="roofline"),
        "bandwidth_fraction": F(0.0, "Achievable fraction of HBM bandwidth; 0 = the hardware catalog's, fitted to "
                                     "measured GEMM times where it has one (hardware.gemm_bandwidth_fraction), else "
                                     "performance.unmeasured_bandwidth_fraction.", 0, 1, fidelity="roofline"),
        "unmeasured_flops_fraction": F(UNMEASURED_FLOPS_FRACTION,
                                       "What performance.flops_fraction is on an accelerator with no measured GEMMs "
                                       "(the catalog's gemm_flops_fraction 0: MI300X): an uncertain input, "
                                       "drawn per sample, since nothing measured says it. The default spans the "
                                       "bundled fits (A100 0.74, H100 0.76 of peak) and below, as a new "
                                       "generation's or another vendor's kernels often reach less of a higher peak "
                                       "(a judgement, not a measurement); read only where it applies.", 0, 1,
                                       fidelity="roofline"),
        "unmeasured_bandwidth_fraction": F(UNMEASURED_BANDWIDTH_FRACTION,
                                           "What performance.bandwidth_fraction is on an accelerator with no measured "
                                           "GEMMs: an uncertain input, drawn per sample. The default spans the "
                                           "bundled fits (A100 0.81, H100 0.97 of HBM) and below (a judgement); read "
                                           "only where it applies.", 0, 1, fidelity="roofline"),
        "gemm_half_tokens": F(0.0, "Rows (tokens) at which a GEMM reaches half its largest FLOP share: small GEMMs "
                                   "cannot fill the tensor cores; 0 = the hardware catalog's "
                                   "(hardware.gemm_half_tokens), none where it has none.", 0, None,
                                   fidelity="roofline"),
        "gemm_floor_s": F(0.0, "Fixed GPU time of one GEMM kernel, s, added to its roofline; 0 = the hardware "
                               "catalog's (hardware.gemm_floor_us), none where it has none.", 0, None,
                               fidelity="roofline"),
        "gemm_surface": S("", "GEMM efficiency by shape: a calibration file (mcsim calibrate) whose measured surface "
                              "corrects each GEMM's roofline time by its rows, columns and depth (tile and wave "
                              "quantization, the kernel the library picks); '' = the hardware catalog's "
                              "(hardware.gemm_surface: measured on H100 and A100, H100's for H200 and H800, none "
                              "elsewhere); 'none' = the roofline's one curve per GPU. A calibration file with a "
                              "surface sets it.", fidelity="roofline"),
        "kernel_floor_s": F(0.0, "Fixed GPU time of one element-wise kernel (RMSNorm, RoPE, activation, residual add), "
                                 "s, which CUDA graphs do not remove; 0 = the hardware catalog's "
                                 "(hardware.kernel_floor_us), none where it has none.", 0, None, fidelity="roofline"),
        "elementwise_bandwidth_fraction": F(0.0, "Achievable fraction of HBM bandwidth of element-wise kernels; 0 = "
                                                 "the hardware catalog's, else 0.8.", 0, 1, fidelity="roofline"),
        "attention_floor_s": F(0.0, "Fixed GPU time of one attention call per layer and step (KV-cache write, "
                                    "attention kernel, reshape), s; 0 = the hardware's measured attention call "
                                    "(hardware.attention_floor_us) for a GQA model, else three element-wise kernel "
                                    "floors.", 0, None, fidelity="roofline"),
        "gemm_error": F(1.0, "Multiplier on modelled GEMM times (the model's error against measurements; a "
                             "calibration draws it per sample from its residuals).", 0, None, lo_open=True,
                             fidelity="roofline"),
        "elementwise_error": F(1.0, "Multiplier on modelled element-wise kernel times (as gemm_error).", 0, None,
                               lo_open=True, fidelity="roofline"),
        "allreduce_error": F(1.0, "Multiplier on modelled all-reduce times inside a node (as gemm_error).", 0, None,
                             lo_open=True, fidelity="roofline"),
        "allreduce_nodes_error": F(1.0, "Multiplier on modelled all-reduce times across nodes (as gemm_error).", 0,
                                   None, lo_open=True, fidelity="roofline"),
        "send_error": F(1.0, "Multiplier on modelled point-to-point send times (as gemm_error).", 0, None,
                        lo_open=True, fidelity="roofline"),
        "attention_error": F(1.0, "Multiplier on modelled attention-kernel times (as gemm_error).", 0, None,
                             lo_open=True, fidelity="roofline"),
        "mla_error": F(1.0, "Multiplier on the modelled time of MLA attention calls priced by their measured kernels "
                            "(as gemm_error).", 0, None, lo_open=True, fidelity="roofline"),
        "experts_error": F(1.0, "Multiplier on the modelled time of BF16 routed experts priced by their measured fused "
                                "MoE kernels (as gemm_error).", 0, None, lo_open=True, fidelity="roofline"),
        "experts_fp4_error": F(1.0, "Multiplier on the modelled time of NVFP4 routed experts priced by their measured "
                                    "fused MoE kernels (as gemm_error).", 0, None, lo_open=True,
                               fidelity="roofline"),
        "experts_fp8_error": F(1.0, "Multiplier on the modelled time of FP8 routed experts priced by their measured "
                                    "fused MoE kernels (as gemm_error).", 0, None, lo_open=True,
                               fidelity="roofline"),
        "step_error": F(1.0, "Multiplier on the whole modelled step (a calibration's residual against measured "
                             "whole steps).", 0, None, lo_open=True, fidelity="roofline"),
        "network_fraction": F(0.7, "Achievable fraction of scale-up/scale-out bandwidth (roofline).", 0, 1,
                              lo_open=True, fidelity="roofline"),
        "allreduce": C("auto", "NCCL's TP all-reduce algorithm where NCCL runs it (performance.allreduce_impl); auto: "
                       "the fastest for each message size and group (as NCCL's tuner picks).", *ALLREDUCE_ALGORITHMS,
                       fidelity="roofline"),
        "prefill_allreduce": C("same", "TP all-reduce algorithm of prefill steps (a disaggregated prefill pool, or "
                               "every step with prefill tokens in a colocated one); same: performance.allreduce.",
                               "same", *ALLREDUCE_ALGORITHMS, fidelity="roofline"),
        "alltoall": C("hierarchical", "EP all-to-all algorithm: direct or hierarchical (analytic, on the links' "
                      "bandwidths), or DeepEP's low-latency or normal kernels (deepep_low_latency, deepep_normal: "
                      "priced from measured dispatches and combines where the GPU has them, hardware.deepep_table; "
                      "else hierarchical).", *ALLTOALL_ALGORITHMS, fidelity="roofline"),
        "prefill_alltoall": C("same", "EP all-to-all algorithm of steps with prefill tokens (engines run DeepEP's "
                              "normal kernels for prefill and its low-latency ones for decode); same: "
                              "performance.alltoall.", "same", *ALLTOALL_ALGORITHMS, fidelity="roofline"),
        "collective_latency_s": F(0.0, "Latency per collective step (hop), s; 0 = the hardware catalog's, fitted to "
                                       "measured NCCL times where it has one (hardware.collective_hop_us), else "
                                       "5 us.", 0, None, fidelity="roofline"),
        "decode_comm_overlap": F(0.7, "Share of the EP all-to-all and PP send time of a decode step hidden behind "
                                      "compute when the comm_overlap lever is on (0 when off): two micro-batches, "
                                      "one computing while the other communicates (DeepSeek's dual-batch overlap); "
                                      "never more in all than the step's compute, the only work there is to hide "
                                      "behind.", 0, 1, fidelity="roofline"),
        "prefill_comm_overlap": F(0.7, "The same share in a step with prefill tokens (DeepSeek overlaps prefill's "
                                       "two micro-batches, and splits decode's attention in stages, so the two "
                                       "phases hide differently).", 0, 1, fidelity="roofline"),
        "stack": C("vllm", "The serving engine that runs the steps (mcsim.perf.stacks): its TP all-reduce "
                           "(vllm, sglang, trtllm: their own kernels inside a node; generic: NCCL) and whether its "
                           "host work per step overlaps the GPU (sglang's and trtllm's overlap schedulers hide "
                           "performance.step_overhead_s). Recorded in the result's attributes.", *STACKS,
                   fidelity="roofline"),
        "allreduce_impl": C("stack", "Who runs the TP all-reduce: stack = performance.stack's choice; auto, as vLLM, "
                            "SGLang and TensorRT-LLM do, their own one-shot/two-shot kernels inside one NVLink node "
                            "where they are the faster (never at 8 MiB or more) and NCCL beyond and across nodes; nccl: NCCL always; custom: "
                            "the engine's kernels for every message inside a node. mcsim steps shows which ran.",
                            "stack", *ALLREDUCE_IMPLS, fidelity="roofline"),
        "allreduce_overlap": F(0.0, "Share of the TP all-reduce hidden behind compute: 0 in a plain forward pass "
                                    "(each all-reduce waits for its GEMM, the next op for it); a lever for a GEMM "
                                    "fused with its all-reduce (TensorRT-LLM's GEMM + all-reduce plugin, Flux).",
                               0, 1, fidelity="roofline"),
        "launch_overhead_s": F(1e-5, "Per kernel launch.", 0, None, fidelity="roofline"),
        "kernels_per_layer": I(12, "Kernel launches per layer (halved by fused kernels).", 1, 1000,
                               fidelity="roofline"),
        "cudagraph_mode": C("stack", "How a step's kernels are launched: stack = performance.stack's choice; none "
                                     "(eagerly), piecewise (graphs between the attention calls, launched eagerly), "
                                     "full (one graph, launches ~10x cheaper), full_decode_only and "
                                     "full_and_piecewise (full for decode-only steps; none or piecewise for steps "
                                     "with prefill tokens), as vLLM's CUDAGraphMode.", *CUDAGRAPH_MODES,
                            fidelity="roofline"),
        "step_overhead_s": F(2e-4, "Host work per step (scheduling, sampling, input preparation), s: on the step's "
                                   "critical path unless performance.stack overlaps it (sglang, trtllm).", 0, None,
                             fidelity="roofline"),
        "attention_window": I(0, "Sliding-window attention span, tokens (0 = full attention).", 0, None,
                              fidelity="roofline"),
        "sparse_topk": I(0, "Sparse top-k attention: tokens attended per query (0 = dense).", 0, None,
                         fidelity="roofline"),
        "token_budget": I(8192, "Tokens per scheduler step (batching simulator).", 1, None),
        "chunk_tokens": I(2048, "Largest prefill chunk of one request per step (0 = no chunking).", 0, None),
        "preempt": B(True, "Allocate KV as sequences grow and preempt (recompute) when the pool runs out; false: "
                           "reserve a request's whole KV at admission."),
        "closed_loop_users": I(0, "Closed-loop arrivals: users that send their next request after the previous "
                                  "one ends plus a think time (0 = open loop).", 0, None),
        "batching_requests": I(0, "Requests given to the batching simulator (0 = all measured requests, the "
                                   f"first {WINDOW_REQUESTS} in a streamed sample).", 0, None),
    },
    "host": {
        "request_overhead_s": F(0.002, "Per-request overhead on the host (HTTP, routing, scheduling).", 0, None),
        "tokenize_s_per_token": F(2e-7, "Tokenizer time per prompt token, before each request's first token (by its "
                                        "own prompt).", 0, None),
        "detokenize_s_per_token": F(1e-6, "Detokenizer time per output token: inside each token's time (TPOT, and "
                                          "TTFT for the first).", 0, None),
        "stream_interval_tokens": I(1, "Tokens per streamed chunk (the first chunk waits for this many).", 1, None),
    },
    "efficiency": {
        "base_decode_tok_s_per_gpu": F(1500.0, "Saturated decode tok/s per GPU at BF16 with no optimization "
                                               "(the batch -> infinity asymptote).", 0, None, lo_open=True,
                                               fidelity="factor"),
        "base_prefill_tok_s_per_gpu": F(5000.0, "Prefill tok/s per GPU at BF16 with no optimization.",
                                        0, None, lo_open=True, fidelity="factor"),
        "base_source": C("auto", "Where the factor fidelity's two base throughputs come from: stated (the two keys "
                                 "below, estimated on base_hardware), roofline (the roofline's decode and prefill "
                                 "tokens/s per GPU of the scenario's own model, parallelism and hardware at BF16 with "
                                 "no lever on, decode at the largest batch per GPU over 2,048 tokens of context; the "
                                 "two keys unread), or auto: stated where the scenario states either key, else "
                                 "roofline.", "auto", "stated", "roofline", fidelity="factor"),
        "base_hardware": S("", "Hardware preset the two base throughputs were estimated on (default: the scenario's "
                               "[hardware] preset). On other hardware (a file written for another GPU, --set, a "
                               "grid) they are carried over by the ratio of the roofline's decode and prefill "
                               "throughput of the scenario's model on the two, at BF16 with no lever on "
                               "(mcsim.perf.roofline_model.base_scales).", fidelity="factor"),
        "batch_half_saturation": F(16.0, "Per-GPU batch at which decode reaches half its saturated throughput "
                                         "(weight-read time / per-sequence time).", 0, None, fidelity="factor"),
        "fused_kernels": B(True, "Fused kernels (lever)."),
        "fused_kernel_gain": F(1.1, "Decode gain from fused kernels.", 0, None, lo_open=True, fidelity="factor"),
        "comm_overlap": B(True, "Overlap of communication with compute (lever)."),
        "comm_overlap_gain": F(1.15, "Decode gain from communication overlap.", 0, None, lo_open=True,
                               fidelity="factor"),
        "colocated_interference": F(0.2, "Decode throughput lost to prefill interference when prefill and "
                                         "decode share GPUs (at most 0.95: a pool that loses all of it serves "
                                         "nothing).", 0, 0.95, fidelity="factor"),
        "kv_transfer_latency_s": F(0.002, "Fixed latency of a prefill -> decode KV transfer.", 0, None),
    },
    "economics": {
        "target_utilization": F(0.7, "Mean utilization the fleet is sized for.", 0, 1, lo_open=True),
        "pricing": C("purchase", "Cost basis: purchase (depreciation + electricity) or rental (an hourly price that "
                     "includes power).", "purchase", "rental"),
        "rental_usd_per_gpu_hour": F(0.0, "One rental price for whatever GPU the scenario runs on (0 = each GPU's "
                                          "own, hardware.rental_usd_per_hour). A hardware.preset sweep that sets it "
                                          "must also set pin_price = true.", 0, None),
        "price_usd": F(0.0, "One purchase price per GPU, accelerator only, for whatever GPU the scenario runs on (0 = "
                            "each GPU's own, hardware.price_usd). A hardware.preset sweep that sets it must also set "
                            "pin_price = true.", 0, None),
        "gpu_price_factor": F(1.0, "Multiplier on each GPU's own price (hardware.rental_usd_per_hour under rental "
                                   "pricing, hardware.price_usd under purchase); make it uncertain for prices around "
                                   "the catalog's estimate, e.g. uniform 0.8-1.4, and in a hardware.preset sweep it "
                                   "scales every GPU's own price. A price set in [economics] is charged as written.",
                              0, None, lo_open=True),
        "pin_price": B(False, "Charge one price to every GPU of a hardware.preset sweep: the scenario's "
                              "economics.rental_usd_per_gpu_hour / price_usd, or its own hardware.rental_usd_per_hour "
                              "/ hardware.price_usd. Without it such a sweep is refused; the result's pricing_note "
                              "says when a price was pinned."),
        "lifetime_years": F(4.0, "Depreciation period.", 0, None, lo_open=True),
        "electricity_usd_per_kwh": F(0.08, "Electricity price.", 0, None),
        "pue": F(1.3, "Power usage effectiveness of the data centre.", 1, None),
        "price_input_cache_hit_usd_per_mtok": F(0.14, "Price of cached input tokens, USD per million.", 0, None),
        "price_input_cache_miss_usd_per_mtok": F(0.55, "Price of uncached input tokens, USD per million.", 0, None),
        "price_output_usd_per_mtok": F(2.19, "Price of output tokens, USD per million.", 0, None),
        "billed_fraction": F(1.0, "Fraction of tokens that are paid for (free tiers, discounts).", 0, 1),
    },
}

#: Fields of each ``[workload.classes.<name>]`` table.
CLASS_FIELDS: dict[str, Field] = {
    "share": F(1.0, "Share of requests from this class (shares are normalised).", 0, None),
    "prompt_tokens": R({"dist": "lognormal", "median": 400, "sigma": 1.0},
                       "New user tokens per turn (the prompt adds the system prompt and the earlier turns); rounded, "
                       "at least 1.", 0, None),
    "output_tokens": R({"dist": "lognormal", "median": 300, "sigma": 0.8},
                       "Output tokens per request; rounded, at least 1.", 0, None),
    "turns": F(1.0, "Mean turns per session (geometric); turn t carries the whole earlier conversation.", 1, None),
    "system_prompt_share": F(0.8, "Probability that a session starts with a shared system prompt.", 0, 1),
    "acceptance": R({"dist": "beta", "a": 17, "b": 3}, "Per-request draft acceptance rate.", 0, 1),
    "priority": I(0, "Scheduling priority of this class under deployment.scheduler = 'priority' (higher served "
                     "first).", -1_000_000, 1_000_000),
    "expert_skew": F(1.0, "Zipf exponent of this class's expert popularity (0 = uniform routing; at most 3, beyond "
                          "which nearly every token picks the same experts and the routing kernel's draws slow "
                          "down).", 0, 3),
}

DEFAULT_CLASSES = {"chat": {}}

#: Where a cache tier's capacity is: private to each instance (``instance``; ``node``: per node, an instance has it
#: x the nodes it spans) or one capacity shared by the fleet's instances (``pooled``, a KV store).
TIER_SCOPES = ("instance", "node", "pooled")
#: The most tiers a cache may have (mcsim.kernels.kv_tiers.MAX_TIERS).
MAX_TIERS = 8
#: The keys of today's three tiers (hbm, dram, nvme): the short form, which [[cache.tiers]] replaces.
TIER_SHORT_FORM = ("cache.hbm_gb_per_instance", "cache.dram_gb_per_node", "cache.nvme_gb_per_node",
                   "cache.nvme_gb_s_per_node")
#: The short form's prices (read by the economics, not by the step model, unlike :data:`TIER_SHORT_FORM`).
TIER_SHORT_FORM_PRICES = ("cache.dram_usd_per_gb_month", "cache.nvme_usd_per_gb_month")
#: Every key of the short form, which [[cache.tiers]] replaces.
TIER_SHORT_FORM_KEYS = TIER_SHORT_FORM + TIER_SHORT_FORM_PRICES
#: A tier's name: the ``tier`` coordinate of the results and the third part of its keys (cache.tiers.<name>.gb).
TIER_NAME_PATTERN = r"[A-Za-z][A-Za-z0-9_-]{0,31}"

#: Kinds of tier a ``[[cache.tiers]]`` name selects: what sets its default read bandwidth (gb_s), its default
#: latency_us, and where the figures come from. Latencies are estimates of a restore's time to first byte.
TIER_KINDS: dict[str, tuple[str, float, str]] = {
    "hbm": ("hardware.hbm_tb_s per GPU of the instance", 0.0,
            "the GPUs' own memory: blocks found there are used in place"),
    "dram": ("hardware.host_link_gb_s per GPU of the instance (each GPU restores over its own PCIe link, as the "
             "short form's dram tier)", 5.0,
             "host link: the hardware catalog (one direction of PCIe x16); latency an estimate of a host-to-GPU "
             "copy's start-up (driver submission and a PCIe round trip, a few us)"),
    "cxl": ("64 GB/s per unit of its scope (one CXL 2.0 x16 memory expander at PCIe 5.0's 32 GT/s, one direction)",
            5.5, "CXL 2.0 runs on the PCIe 5.0 physical layer (CXL Consortium, CXL 2.0 specification, 2020); "
                 "latency: dram's plus the expander's extra load latency, 2-5x local DRAM's ~0.1 us (Liu et al., "
                 "Exploring and Evaluating Real-world CXL, arXiv:2405.14209, 2024; Sun et al., Demystifying CXL "
                 "Memory with Genuine CXL-Ready Systems and Devices, MICRO 2023, arXiv:2303.15375)"),
    "nvme": ("cache.nvme_gb_s_per_node's default, 25 GB/s, per unit of its scope (as the short form's nvme tier)",
             80.0, "latency an estimate: a 4 KiB read of a TLC NAND NVMe drive at queue depth 1 takes tens of us "
                   "(70-100 us in enterprise drives' datasheets)"),
    "remote": ("hardware.scale_out_gb_s per GPU of the instance (the NIC each GPU reads the store over, as KV "
               "transfers between pools are priced)", 10.0,
               "a shared KV store read over RDMA, as Mooncake's (Qin et al., Mooncake, FAST 2025; its transfer "
               "engine moves 190 GB/s over 8 x 400 Gb/s RoCE NICs, about half their line rate); latency an "
               "estimate: an RDMA read's round trip (a few us) plus the store's look-up"),
}
TIER_KINDS["pool"] = TIER_KINDS["remote"]

#: A tier kind's default price, USD per GB-month of capacity, and how it was estimated: a purchase price of the
#: medium spread over four years (economics.lifetime_years' default). Estimates, not quotes or measurements, to be
#: replaced by a provider's own (``usd_per_gb_month``); a tier of another name costs 0 unless given one.
TIER_PRICES: dict[str, tuple[float, str]] = {
    "hbm": (0.0, "the GPUs' own memory: paid for with the GPUs (economics)"),
    "dram": (0.10, "estimate: server DDR5 RDIMMs at about 4.5 USD/GB, over 48 months"),
    "cxl": (0.14, "estimate: dram's modules plus a CXL expander card, taken as 40 % more per GB"),
    "nvme": (0.0025, "estimate: enterprise TLC NVMe drives at about 0.12 USD/GB, over 48 months"),
    "remote": (0.01, "estimate: a pooled store on NVMe servers, taken as 4x the drives alone (CPUs, NICs, chassis)"),
}
TIER_PRICES["pool"] = TIER_PRICES["remote"]

#: Fields of each ``[[cache.tiers]]`` table: the cache as an ordered list of exclusive tiers, first (the GPUs'
#: memory, where blocks are used) to last. ``name``, ``gb`` and ``scope`` are required; ``gb_s`` and ``latency_us``
#: default to the kind the name selects (:data:`TIER_KINDS`) and must be given for another name (except for the
#: first tier, which restores nothing).
TIER_FIELDS: dict[str, Field] = {
    "name": S("", "The tier's name: the tier coordinate of the results and its keys' paths (cache.tiers.<name>.gb); "
                  "hbm, dram, cxl, nvme, remote and pool are kinds with a default bandwidth and latency."),
    "gb": F(0.0, "Capacity per unit of the tier's scope, GB: per instance, per node (an instance has gb x the nodes "
                 "it spans), or the whole pool's (0 = the tier is absent).", 0, None),
    "scope": C("instance", "instance: private to each instance; node: private, gb per node of the instance; pooled: "
                           "one capacity shared by the fleet's instances (a KV store), after every private tier.",
               *TIER_SCOPES),
    "gb_s": F(0.0, "Read bandwidth per unit of the tier's scope, GB/s (pooled: per instance reading the pool); "
                   "default: its kind's.", 0, None, lo_open=True),
    "latency_us": F(0.0, "Time to the first byte of a restore from the tier, once per request that restores from "
                         "it, us; default: its kind's.", 0, None),
    "usd_per_gb_month": F(0.0, "Price of the tier's capacity, USD per GB-month, charged on every GB the deployed "
                               "fleet holds (kv_tier_cost_usd_per_day); default: its kind's (mcsim list keys cache), "
                               "0 for a name of no known kind.", 0, None),
}
TIER_REQUIRED = ("name", "gb", "scope")


def _physical_ranges(fields: dict, prefix: str) -> None:
    """Give each numeric key of ``fields`` whose range states only a sign its physical range
    (:data:`mcsim.scenario.bounds.SCENARIO_UPPER` and ``SCENARIO_LOWER``), so that every numeric key is bounded."""
    for key, f in list(fields.items()):
        path = prefix + key
        hi = SCENARIO_UPPER.get(path) if f.hi is None else f.hi
        lo, lo_open = (SCENARIO_LOWER[path], False) if path in SCENARIO_LOWER else (f.lo, f.lo_open)
        if (lo, hi, lo_open) != (f.lo, f.hi, f.lo_open):
            fields[key] = replace(f, lo=lo, hi=hi, lo_open=lo_open)


for _section, _fields in SECTIONS.items():
    _physical_ranges(_fields, f"{_section}.")
_physical_ranges(CLASS_FIELDS, "workload.classes.*.")
_physical_ranges(TIER_FIELDS, "cache.tiers.*.")


#: What ``compare`` switches off for its baseline (before the scenario's own ``[baseline]`` overrides).
LEVERS: dict[str, dict[str, Any]] = {
    "continuous_batching": {"deployment.batching": "static"},
    "kv_cache": {"cache.enabled": False},
    "speculative": {"speculative.enabled": False},
    "expert_replication": {"moe.redundant_experts": 0},
    "low_precision": {"precision.enabled": False},
    "fused_kernels": {"efficiency.fused_kernels": False},
    "comm_overlap": {"efficiency.comm_overlap": False},
    "pd_split": {"deployment.disaggregated": False},
}


#: Keys that only one fidelity reads, ``path -> fidelity``, gathered from the fields' own ``fidelity`` (every other key
#: is read by both). An uncertain input that the scenario's fidelity does not read is not drawn, so it neither fills
#: the result nor enters the sensitivity analysis.
FIDELITY_ONLY: dict[str, str] = {f"{section}.{key}": spec.fidelity for section, fields in SECTIONS.items()
                                 for key, spec in fields.items() if spec.fidelity}


#: Keys outside ``[workload]`` that shape the requests (the workload stage reads them too).
WORKLOAD_OTHER_KEYS = ("cache.block_tokens", "model.max_context")


def workload_reads(path: str) -> bool:
    """Whether the workload stage reads this dotted path: all of ``[workload]`` and :data:`WORKLOAD_OTHER_KEYS`.
    The variants of a sample share their requests, so none of these may differ between them."""
    return path.startswith("workload.") or path in WORKLOAD_OTHER_KEYS


def read_by(path: str, fidelity: str) -> bool:
    """Whether a sample of ``fidelity`` reads the dotted ``path``."""
    return FIDELITY_ONLY.get(path, fidelity) == fidelity


def baseline_overrides() -> dict[str, Any]:
    """Every lever off."""
    out: dict[str, Any] = {}
    for overrides in LEVERS.values():
        out.update(overrides)
    return out


class ScenarioError(McsimError, ValueError):
    """Bad scenario input. ``str(err)`` is the one-line message the CLI prints."""

    def __init__(self, source: str, key: str, message: str):
        where = f"{source}: " if source else ""
        keypart = f"{key}: " if key else ""
        super().__init__(f"{where}{keypart}{message}")
        self.source, self.key, self.detail = source, key, message

    def __reduce__(self):  # rebuilt from its three parts when it crosses to another process (a Dask worker)
        return type(self), (self.source, self.key, self.detail)


def field_for(path: str) -> Field | None:
    """The schema Field of a dotted path (catalog fields are typed ``float``/``int``/``str``)."""
    parts = path.split(".")
    if len(parts) == 4 and parts[0] == "workload" and parts[1] == "classes":
        return CLASS_FIELDS.get(parts[3])
    if len(parts) == 4 and parts[0] == "cache" and parts[1] == "tiers":
        return TIER_FIELDS.get(parts[3]) if parts[3] != "name" else None
    if len(parts) != 2:
        return None
    section, key = parts
    if section in SECTIONS and key in SECTIONS[section]:
        return SECTIONS[section][key]
    fields = {"model": catalog.MODEL_FIELDS, "hardware": catalog.HARDWARE_FIELDS}.get(section)
    if fields and key in fields:
        t = fields[key]
        if t is str:
            return Field("str", None, "catalog field")
        lo, lo_open = CATALOG_LOWER.get(path, (0, False))
        return Field({int: "int", float: "float"}[t], None, "catalog field", lo, CATALOG_UPPER.get(path),
                     lo_open=lo_open)
    return None

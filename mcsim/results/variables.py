"""The registry of output variables: every result Dataset is built and checked through it.

Each entry gives the variable's name, its own dims (the run adds ``sample`` and, where present, ``variant`` and
grid axes in front), units, a long name and a one-line description. A name or a unit is written here once.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from mcsim.perf.batching import QUANTILES
from mcsim.results.units import variable_units

#: The tiers of the short form (cache.hbm_gb_per_instance, ...); a scenario's [[cache.tiers]] names its own, and the
#: ``tier`` coordinate of a result is the scenario's.
TIERS = ("hbm", "dram", "nvme")
#: The performance stage's per-request quantiles of the latency variables (:data:`QUANTILES`) lie along the
#: ``request_quantile`` dim (not ``quantile``, which xarray's own ``.quantile()`` over samples creates).
REQUEST_QUANTILE = "request_quantile"
#: The scenario's workload classes, for per-class latency (not ``class``: a Python keyword, so ``ds.sel(class=...)``
#: could not be written).
WORKLOAD_CLASS = "workload_class"


@dataclass(frozen=True)
class Variable:
    name: str
    dims: tuple
    units: str
    long_name: str
    description: str
    headline: bool = False
    dtype: str = "float64"
    #: a fraction (units "1") that figures and tables show in percent
    percent: bool = False


_VARS = [
    # performance
    Variable("decode_tok_s_per_gpu", (), "tokens/s/GPU", "decode throughput per GPU at load",
             "Output tokens per second per decode GPU at the operating point the deployed load sets (its batch, all "
             "factors applied), during decode steps: what the fleet does per step, not what a GPU can do "
             "(decode_capacity_tok_s_per_gpu), nor what the fleet delivers over the day "
             "(delivered_output_tok_s_per_gpu).", True),
    Variable("prefill_tok_s_per_gpu", (), "tokens/s/GPU", "prefill throughput per GPU",
             "Input tokens (cached ones included) served per prefill GPU-second; cached tokens cost only their "
             "restore time.", True),
    Variable("delivered_output_tok_s_per_gpu", (), "tokens/s/GPU", "output tokens delivered per GPU-second",
             "Output tokens the fleet served per second of the trace, per GPU deployed (prefill GPUs, idle time and "
             "every step's prefill share included): what cost_usd_per_mtok is charged against. "
             "decode_tok_s_per_gpu is larger: per decode GPU, during its decode steps.", True),
    Variable("decode_capacity_tok_s_per_gpu", (), "tokens/s/GPU", "decode capacity per GPU",
             "Output tokens per second one decode GPU sustains at the largest batch that meets the TPOT target, "
             "fits its KV memory and deployment.max_batch_per_gpu: what a GPU can do, to compare with published "
             "per-node figures (decode_tok_s_per_gpu is the rate at the deployed load).", True),
    Variable("prefill_capacity_tok_s_per_gpu", (), "tokens/s/GPU", "prefill capacity per GPU",
             "Prompt tokens computed per second by one prefill GPU running full prefill steps (cache hits not "
             "counted: they are restored, not computed).", True),
    Variable("batch_efficiency", (), "1", "batch efficiency",
             "Fraction of saturated decode throughput reached at the operating batch (b / (b + b_half)), times "
             "the useful-slot fraction under static batching: how fully the fleet amortizes weight movement.", True,
             percent=True),
    Variable("operating_batch_per_gpu", (), "sequences/GPU", "operating decode batch per GPU",
             "Concurrent sequences per decode GPU: the batching simulator's mean decode batch when it runs (the "
             "batch throughput and cost are charged at), else what Little's law gives on the deployed fleet, at "
             "most the largest batch that fits KV memory, meets the TPOT target and the batch cap."),
    Variable("mean_concurrency_per_gpu", (), "sequences/GPU", "mean decode concurrency per GPU",
             "Little's law: arrival rate x mean decode time per request / decode GPUs (NaN when a fixed colocated "
             "fleet's prefill alone takes all its GPUs)."),
    Variable("max_batch_by_memory", (), "sequences/GPU", "KV-memory batch limit per GPU",
             "Sequences of mean length whose KV fits in the HBM left after weights, activations and prefix cache."),
    Variable("spec_tokens_per_pass", (), "1", "realized speculative gain",
             "Tokens per verification pass after the cost of drafting and of verifying k+1 tokens per sequence "
             "(1 when off): the realized decode speed-up.", True),
    Variable("spec_raw_tokens_per_pass", (), "1", "raw tokens per verification pass",
             "Accepted drafts + 1 per pass as drawn, before draft and verification costs."),
    Variable("expert_efficiency", (), "1", "expert load efficiency",
             "Mean expert-GPU load / slowest GPU's load, time-weighted over steps (sum of means / sum of maxima, "
             "since the slowest GPU sets each step); 1 for dense models.", True, percent=True),
    Variable("distinct_experts_per_step", (), "experts", "distinct experts touched per step",
             "Routed experts with at least one token in a step, per MoE layer."),
    Variable("cache_hit_rate", (), "1", "prefix cache hit rate",
             "Cached input tokens / all input tokens (a token fraction, not a request fraction).", True, percent=True),
    Variable("cache_hit_rate_by_tier", ("tier",), "1", "prefix cache hit rate by tier",
             "Input tokens reused from each tier (the scenario's, in order) / all input tokens.", percent=True),
    Variable("kv_tier_gb", ("tier",), "GB", "KV tier capacity in the fleet",
             "Capacity of each tier the deployed fleet holds: per instance x the instances that hold prefix caches, "
             "per node x their nodes, or the pooled tier's once."),
    Variable("kv_tier_cost_usd_per_day", ("tier",), "USD/day", "KV tier cost per day",
             "kv_tier_gb at the tier's price per GB-month (cache.tiers.<name>.usd_per_gb_month, or the short form's "
             "dram_usd_per_gb_month, nvme_usd_per_gb_month; the first tier's HBM is paid with the GPUs). Not in "
             "cost_usd_per_day, which counts accelerators and electricity."),
    Variable("kv_tier_recompute_saved_usd_per_day", ("tier",), "USD/day", "prefill saved by the tier's hits per day",
             "Input tokens restored from the tier per day, priced as the prefill GPU time they would have taken "
             "(prefill_capacity_tok_s_per_gpu) at the fleet's cost per GPU-second: what the tier's hits are worth, "
             "beside kv_tier_cost_usd_per_day (modelled)."),
    Variable("restore_gb_per_request_by_tier", ("tier",), "GB/request", "KV restored per request by tier",
             "Prefix KV bytes brought back to the first tier from each tier, per request (the first tier's hits "
             "move nothing)."),
    Variable("kv_bytes_per_token", (), "bytes/token", "KV cache bytes per token",
             "GQA: 2 x layers x kv_heads x head_dim x bytes; MLA: (kv_lora_rank + rope_dim) x layers x bytes."),
    Variable("ttft_s", ("request_quantile",), "s", "time to first token",
             "Per-request quantiles of queueing + prefill + KV restore + KV transfer (+ the first decode pass "
             "without the batching simulator, which then gives service times only)."),
    Variable("tpot_s", ("request_quantile",), "s", "time per output token",
             "Per-request quantiles of (end-to-end - TTFT) / (output tokens - 1); service time at the operating "
             "batch unless performance.simulate_batching."),
    Variable("e2e_s", ("request_quantile",), "s", "end-to-end latency",
             "Per-request quantiles of arrival to last token, including host costs."),
    Variable("queue_wait_s", ("request_quantile",), "s", "queue wait",
             "Per-request quantiles of the time spent waiting for admission (0 without the batching simulator)."),
    Variable("slo_attainment", (), "1", "share of requests within the SLOs",
             "Fraction of requests whose TTFT <= deployment.ttft_target_s (when set) and whose TPOT <= "
             "deployment.tpot_target_s.", percent=True),
    Variable("ttft_s_by_class", ("workload_class", "request_quantile"), "s", "time to first token by class",
             "ttft_s over the requests of each workload class (NaN for a class without measured requests)."),
    Variable("tpot_s_by_class", ("workload_class", "request_quantile"), "s", "time per output token by class",
             "tpot_s over the requests of each workload class."),
    Variable("slo_attainment_by_class", ("workload_class",), "1", "share of requests within the SLOs by class",
             "slo_attainment over the requests of each workload class.", percent=True),
    Variable("ttft_at_slo_quantile_s", (), "s", "TTFT at the SLO quantile",
             "The deployment.slo_quantile quantile of per-request TTFT (what fleet = 'slo' sizes the fleet for)."),
    Variable("tpot_at_slo_quantile_s", (), "s", "TPOT at the SLO quantile",
             "The deployment.slo_quantile quantile of per-request TPOT (what fleet = 'slo' sizes the fleet for)."),
    Variable("saturated", (), "1", "load exceeds capacity",
             "1 when the batching simulator's queue grows without bound (arrivals outpace completions).",
             dtype="int8"),
    Variable("little_law_ratio", (), "1", "Little's-law check of the simulator",
             "Time-averaged requests in the system / (arrival rate x mean time in system); 1 for a consistent, "
             "stable simulation (NaN without the batching simulator)."),
    # steady state (mcsim.stages.steady_state)
    Variable("steady_state", (), "1", "sample reached steady state",
             "1 when the cache hit rate of the last quarter of the measured requests is within "
             "mc.steady_state_tolerance of the third quarter's and, when the batching simulator runs, its mean queue "
             "wait moved by at most mc.queue_steady_state_tolerance of the mean time in system between the same "
             "quarters of its window; under workload.rate_profile the windows are the last whole periods and as "
             "many periods before them (the result's steady_state_windows attribute), and a run shorter than two "
             "periods is not judged (1, with NaN drifts); 0: the figures still depend on mc.requests.",
             dtype="int8"),
    Variable("cache_hit_rate_drift", (), "1", "cache hit rate drift",
             "Token hit rate of the last quarter of the measured requests minus that of the third quarter (under "
             "workload.rate_profile: of the last whole periods minus as many periods before them, NaN when the run "
             "is shorter than two periods); ~0 once the cache is warm."),
    Variable("queue_wait_drift", (), "1", "queue wait drift of the batching simulator",
             "Mean queue wait of the requests arriving in the last quarter of the simulator's measured window minus "
             "the third quarter's (under workload.rate_profile: of the last whole periods minus as many periods "
             "before them), / the mean time in system; ~0 for a settled queue, large for a growing one (NaN "
             "without the simulator, or when its measured window is too short to compare)."),
    Variable("requests_for_steady_state", (), "requests", "requests per sample for steady state (estimate)",
             "Requests per sample at which the drifts would fall to their tolerances (mc.requests when steady): the "
             "drift of the run and of its first half (as a run of its own) fitted by a power law in the run length, "
             "exponent bounded to [0.5, 4] (0.5, the rate of sampling noise, when the drift did not shrink). An "
             "estimate from one sample; inf when the simulated queue is saturated."),
    # fleet and economics
    Variable("gpus", (), "GPUs", "GPUs deployed", "GPUs of the whole instances deployed (decode + prefill), "
             "sized as deployment.fleet says; the fleet that is simulated is the fleet that is charged.", True),
    Variable("decode_gpus", (), "GPUs", "decode GPUs", "GPUs serving decode (all GPUs when colocated)."),
    Variable("prefill_gpus", (), "GPUs", "prefill GPUs", "GPUs serving prefill when disaggregated (0 otherwise)."),
    Variable("instances", (), "instances", "instances deployed", "Decode (or colocated) + prefill instances."),
    Variable("decode_instances", (), "instances", "decode instances",
             "Whole instances of the decode pool (all instances when colocated)."),
    Variable("prefill_instances", (), "instances", "prefill instances",
             "Whole instances of the prefill pool when disaggregated (0 otherwise)."),
    Variable("busy_fraction", (), "1", "busy fraction of the fleet",
             "Share of the fleet's GPU time spent computing steps (from the simulated steps when the batching "
             "simulator runs); sets power between idle and TDP.", percent=True),
    Variable("instance_load_imbalance", (), "1", "load imbalance across instances",
             "deployment.fleet_simulation = 'replicas': the most measured requests one instance of the pool served "
             "over the mean per instance (1 = even; NaN in 'representative' mode or without the batching "
             "simulator)."),
    Variable("gpu_hours", (), "GPU-hours", "busy GPU-hours for the trace",
             "GPU time the fleet spends computing the simulated trace: busy_fraction x gpus x trace duration."),
    Variable("energy_j_per_token", (), "J/token", "energy per output token",
             "Fleet energy incl. PUE (idle + busy power) / output tokens (NaN with no output tokens)."),
    Variable("cost_usd_per_mtok", (), "USD/Mtok", "cost per million output tokens",
             "Daily cost / daily output tokens x 1e6 (NaN with no output tokens).", True),
    Variable("revenue_usd_per_day", (), "USD/day", "revenue per day",
             "Cache-hit input, cache-miss input and output tokens at their prices, scaled to a day.", True),
    Variable("cost_usd_per_day", (), "USD/day", "cost per day",
             "Accelerator depreciation + electricity (or rental) for the fleet, per day.", True),
    Variable("gross_margin", (), "1", "gross margin",
             "1 - cost/revenue, counting accelerators and electricity only (NaN with no revenue: zero prices or "
             "economics.billed_fraction = 0 leave no margin to take).", True, percent=True),
    Variable("cost_profit_margin", (), "1", "cost-profit margin",
             "(revenue - cost) / cost, the form DeepSeek published (NaN at zero cost).", True, percent=True),
    Variable("payback_months", (), "months", "payback of one GPU",
             "GPU price / (monthly revenue - electricity per GPU); an inference-unit indicator, not an "
             "accounting forecast (NaN when it never pays back, revenue not covering electricity; NaN under rental "
             "pricing: nothing was bought).", True),
    Variable("feasible", (), "1", "recipe feasible",
             "1 when weights and KV fit in both pools, the TPOT target is met at a batch of at least one and (fleet "
             "= 'slo') a fleet meets the SLOs; every performance and money figure of an infeasible sample is NaN.",
             True, "int8"),
    # memory, the limits a sample is held to, and the figures that say why one cannot run (the summary's fixes)
    Variable("hbm_gb_per_gpu", (), "GB", "HBM per GPU", "HBM capacity of one GPU (hardware.hbm_gb)."),
    Variable("hbm_usable_gb_per_gpu", (), "GB", "HBM per GPU for weights and KV (decode pool)",
             "hbm_gb_per_gpu x deployment.memory_fraction - deployment.activation_gb_per_gpu - the prefix cache's "
             "first tier per GPU when the pool holds it: what weights and KV may fill on a GPU of a decode (or "
             "colocated) instance."),
    Variable("weights_gb_per_gpu", (), "GB", "weights per GPU (decode pool)",
             "Weight bytes on the fullest GPU of a decode (or colocated) instance by the memory projection: split "
             "over deployment.tp, layers over deployment.pp, routed experts over the EP ranks, at the sample's "
             "weight precision."),
    Variable("kv_gb_per_sequence", (), "GB", "KV of one sequence per GPU (decode pool)",
             "KV bytes one sequence of the mean decode context (prompt + half the output, whole blocks) occupies on "
             "a GPU of a decode (or colocated) instance that holds it."),
    Variable("smallest_fitting_tp", (), "GPUs", "smallest tp whose memory fits (decode pool)",
             "The smallest deployment.tp (a divisor of the attention heads, and of gpus_per_instance / pp when that "
             "is set) at which a decode (or colocated) instance's weights and one sequence's KV fit, by the memory "
             "projection at the sample's other settings; NaN when none does."),
    Variable("prefill_hbm_usable_gb_per_gpu", (), "GB", "HBM per GPU for weights and KV (prefill pool)",
             "hbm_usable_gb_per_gpu of a GPU of a prefill instance when disaggregated (NaN otherwise)."),
    Variable("prefill_weights_gb_per_gpu", (), "GB", "weights per GPU (prefill pool)",
             "Weight bytes on the fullest GPU of a prefill instance (split over deployment.prefill_tp) when "
             "disaggregated (NaN otherwise)."),
    Variable("prefill_kv_gb_per_sequence", (), "GB", "KV of one sequence per GPU (prefill pool)",
             "KV bytes one prompt of the mean length occupies on a GPU of a prefill instance when disaggregated "
             "(NaN otherwise)."),
    Variable("smallest_fitting_prefill_tp", (), "GPUs", "smallest prefill_tp whose memory fits (prefill pool)",
             "smallest_fitting_tp of the prefill pool, over deployment.prefill_tp (a divisor of the attention heads, "
             "and of prefill_gpus_per_instance when that is set), when disaggregated (NaN otherwise)."),
    Variable("longest_context_by_memory", (), "tokens", "longest context whose KV fits",
             "Tokens of the longest context (whole blocks) whose one sequence's KV fits in the HBM left after "
             "weights, the least over the pools; 0 when the weights do not fit."),
    Variable("weight_bytes_that_fit", (), "bytes", "bytes per weight at which memory fits",
             "The most bytes per weight, of the sample's own, 1 (FP8) and 0.5 (FP4), at which every pool's weights "
             "and one sequence's KV fit at the sample's layout and KV precision; NaN when none does."),
    Variable("kv_bytes_that_fit", (), "bytes", "bytes per KV element at which memory fits",
             "The most bytes per KV element, of the sample's own, 1 and 0.5, at which every pool's weights and one "
             "sequence's KV fit at the sample's layout and weight precision; NaN when none does."),
    Variable("tpot_target_s", (), "s", "TPOT target",
             "deployment.tpot_target_s of the sample: the TPOT the operating batch and the SLOs are held to."),
    Variable("ttft_target_s", (), "s", "TTFT target",
             "deployment.ttft_target_s of the sample (0: none): the TTFT the SLOs are held to."),
    Variable("max_instances", (), "instances", "most instances per pool",
             "deployment.max_instances of the sample: the most instances fleet = 'slo' tries and fleet = "
             "'utilization' deploys per pool.", dtype="int64"),
    Variable("tpot_at_batch_1_s", (), "s", "TPOT at one sequence per GPU",
             "Seconds per output token of a decode instance holding one sequence per GPU: its pass over the tokens "
             "a pass gains, a service time without queueing or host costs, the least TPOT the deployment reaches "
             "(a sample above deployment.tpot_target_s cannot run); NaN when memory does not fit."),
    Variable("instances_needed", (), "instances", "instances the load needs in its largest pool",
             "Whole instances of the pool that needs the most (decode or colocated, or prefill when "
             "disaggregated) for the load at economics.target_utilization and the batch cap, in every fleet mode: "
             "what fleet = 'utilization' deploys before its floor (deployment.instances) and its cap "
             "(deployment.max_instances); NaN when the sample cannot run at a batch of one."),
    Variable("ttft_at_max_instances_s", (), "s", "TTFT at max_instances when no fleet meets the SLOs",
             "fleet = 'slo' with no fleet up to deployment.max_instances meeting the SLOs: the "
             "deployment.slo_quantile TTFT, host costs included, of max_instances instances of the pool that "
             "missed (colocated, or the prefill pool); inf when they cannot keep up with the load (the queue "
             "saturates); NaN otherwise."),
    Variable("tpot_at_max_instances_s", (), "s", "TPOT at max_instances when no fleet meets the SLOs",
             "As ttft_at_max_instances_s for the deployment.slo_quantile TPOT (colocated, or the decode pool)."),
    # trace facts
    Variable("requests", (), "requests", "requests simulated", "Measured requests of the sample: its trace less the leading mc.warmup_fraction that only warms "
             "the caches.", dtype="int64"),
    Variable("mean_input_tokens", (), "tokens", "mean input tokens", "Mean prompt length of the trace."),
    Variable("mean_output_tokens", (), "tokens", "mean output tokens", "Mean output length of the trace."),
    Variable("trace_duration_s", (), "s", "trace duration", "Span of the simulated arrivals."),
]

REGISTRY: dict[str, Variable] = {v.name: v for v in _VARS}
#: What a sample reports besides the registered variables: its reason, stored as the flag variable
#: ``infeasible_reason`` over :data:`FEASIBLE_REASONS`.
FLAGS = ("infeasible_reason",)
HEADLINE = [v.name for v in _VARS if v.headline]
FEASIBLE_REASONS = ("ok", "weights do not fit in HBM", "KV for one sequence does not fit",
                    "TPOT target not met at batch 1", "prefill pool: weights do not fit in HBM",
                    "prefill pool: KV for one sequence does not fit", "SLO not met", "fleet over max_instances")


class UnknownVariable(KeyError):
    """An output name the registry does not have (a metric no stage registered, or a misspelt one)."""

    def __str__(self) -> str:
        return str(self.args[0])


def variable(name: str) -> Variable:
    """The registered variable ``name``; :class:`UnknownVariable`, naming the nearest registered ones, otherwise."""
    try:
        return REGISTRY[name]
    except KeyError:
        near = difflib.get_close_matches(name, list(REGISTRY), n=3)
        hint = f" (did you mean {', '.join(near)}?)" if near else ""
        raise UnknownVariable(f"{name!r} is not a registered output variable{hint}: every output a Dataset holds "
                              "is declared in mcsim.results.variables") from None


def check_metrics(metrics, where: str = "a sample") -> None:
    """Refuse metrics (name -> value) that are not exactly the registered variables and :data:`FLAGS`: an
    unknown name is :class:`UnknownVariable` (as :func:`variable` says it), a missing one a ``KeyError``."""
    for name in metrics:
        if name not in REGISTRY and name not in FLAGS:
            variable(name)
    missing = [name for name in (*REGISTRY, *FLAGS) if name not in metrics]
    if missing:
        raise KeyError(f"{where} lacks the registered output(s) {', '.join(missing)}")


def attrs_for(name: str, kind: str = "modelled") -> dict:
    """NetCDF (CF) attributes of a registered variable: CF ``units`` and the ``display_units`` people read (see
    :mod:`mcsim.results.units`), ``long_name``, ``description``, ``cell_methods`` and whether it is modelled."""
    v = variable(name)
    methods = "sample: point"
    if REQUEST_QUANTILE in v.dims:
        methods += f" {REQUEST_QUANTILE}: point (comment: quantiles over the measured requests of each sample)"
    return {**variable_units(v.units), "long_name": v.long_name, "description": v.description,
            "cell_methods": methods, "source": kind}

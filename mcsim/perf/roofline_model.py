"""Stage 5, roofline fidelity: the :class:`~mcsim.perf.factor.StepModel` priced op by op by :mod:`mcsim.perf.roofline`.

The levers map onto the roofline's inputs instead of onto factors: low precision sets the weight, KV and matmul
formats; fused kernels halve the launches and activation round-trips; communication overlap hides
``performance.decode_comm_overlap`` (``prefill_comm_overlap`` in a step with prefill tokens) of the collectives;
speculative decoding verifies k+1 tokens per sequence per pass (priced by the roofline) and adds
``speculative.draft_cost`` of a plain decode step per draft token; expert
replication lowers the hottest rank's load (the experts kernel's max/mean); the prefill/decode split gives each
phase its own pool and parallelism. Achievable fractions of peak are scenario inputs, so they can be uncertain.

A step that mixes decode sequences and prefill tokens is one roofline step over all of its tokens: the weights
are read once, whatever the mix.

The factor fidelity borrows the roofline once: :func:`base_scales` carries its base throughputs from the
hardware they were estimated on to the sample's.
"""

from __future__ import annotations

from mcsim.perf import gemm_surface as surfaces
from mcsim.perf import roofline
from mcsim.perf.stacks import stack_entry
from mcsim.perf.capacity import _instance_step_time
from mcsim.perf.hardware import Hardware, as_hardware, gemm_figures, performance_defaults
from mcsim.perf.factor import StepModel, StepTime, _model, parallelism, precision
from mcsim.scenario import catalog
from mcsim.scenario.distributions import Dist


def _hardware(p: dict) -> Hardware:
    return as_hardware(p)


def options(p: dict, *, prefill: bool = False, hot_rank_factor: float = 1.0, distinct_experts=None,
            distinct_tokens=None) -> dict:
    """Keyword arguments of :func:`mcsim.perf.roofline.step_cost` (and friends) for the decode or prefill pool."""
    linear, attention, experts = linear_gemms(p), attention_figures(p), linear_gemms(p, experts=True)
    moe, mla = expert_figures(p), mla_figures(p)
    p = performance_defaults(p)
    stack = stack_entry(p["performance.stack"])
    impl = stack.allreduce_impl if p["performance.allreduce_impl"] == "stack" else p["performance.allreduce_impl"]
    return {
        "precision": precision(p),
        "parallel": parallelism(p, prefill=prefill),
        "collectives": roofline.Collectives(
            allreduce=p["performance.allreduce"], alltoall=p["performance.alltoall"],
            prefill_alltoall=("" if p.get("performance.prefill_alltoall", "same") == "same"
                              else p["performance.prefill_alltoall"]),
            overlap=p["performance.decode_comm_overlap"] if p["efficiency.comm_overlap"] else 0.0,
            prefill_overlap=p["performance.prefill_comm_overlap"] if p["efficiency.comm_overlap"] else 0.0,
            latency_s=p["performance.collective_latency_s"] or None,
            prefill_allreduce=("" if p["performance.prefill_allreduce"] == "same"
                               else p["performance.prefill_allreduce"]),
            allreduce_impl=impl, allreduce_overlap=p["performance.allreduce_overlap"]),
        "achievable": roofline.Achievable(
            flops_fraction=p["performance.flops_fraction"], bandwidth_fraction=p["performance.bandwidth_fraction"],
            network_fraction=p["performance.network_fraction"], launch_overhead_s=p["performance.launch_overhead_s"],
            kernels_per_layer=p["performance.kernels_per_layer"],
            cudagraph_mode=(stack.cudagraph_mode if p["performance.cudagraph_mode"] == "stack"
                            else p["performance.cudagraph_mode"]),
            fused=p["efficiency.fused_kernels"],
            step_overhead_s=0.0 if stack.overlaps_host else p["performance.step_overhead_s"],
            gemm_half_tokens=p["performance.gemm_half_tokens"], gemm_floor_s=p["performance.gemm_floor_s"],
            kernel_floor_s=p["performance.kernel_floor_s"],
            elementwise_bandwidth_fraction=p["performance.elementwise_bandwidth_fraction"],
            attention_floor_s=p["performance.attention_floor_s"],
            errors={cls: p[f"performance.{cls}_error"] for cls in roofline.ERROR_CLASSES},
            step_error=p["performance.step_error"], gemm_surface=gemm_surface(p), linear=linear,
            attention=attention, experts=experts, moe=moe, mla=mla),
        "hot_rank_factor": hot_rank_factor,
        "distinct_experts": distinct_experts,
        "distinct_tokens": distinct_tokens,
        "attention_window": p["performance.attention_window"],
        "sparse_topk": p["performance.sparse_topk"],
    }


#: The GEMM keys a scenario leaves at 0 ("the hardware's") for the hardware's own figures of the compute dtype.
LINEAR_KEYS = ("performance.flops_fraction", "performance.bandwidth_fraction", "performance.gemm_half_tokens",
               "performance.gemm_floor_s")


def _leaves_to_hardware(p: dict, hw: Hardware, keys) -> bool:
    """Whether the scenario leaves the GEMM figures ``keys`` to the hardware: each at 0, or at the very value
    :func:`mcsim.perf.hardware.performance_defaults` fills in (a scenario's or a calibration's own figure is neither,
    and then prices every op it names)."""
    hardware_own = gemm_figures(hw)
    return all(p.get(k, 0) in (0, hardware_own[k]) for k in keys)


def linear_gemms(p: dict, *, experts: bool = False):
    """The linear layers' (``experts``: the routed experts') GEMM figures where they are not the BF16 ones: FP8 or
    FP4 compute on hardware whose GEMMs of that dtype were measured (the catalog's ``gemm_fp8_*`` / ``gemm_fp4_*``
    and surface), where the scenario leaves the GEMM figures and the surface to the hardware (a scenario's own
    figures, or a calibration's, apply to every GEMM); else None."""
    hw = _hardware(p)
    own = precision(p)
    compute = own.experts_compute if experts else own.linear_compute
    figures = hw.gemm_dtype_figures(compute) if p["precision.enabled"] else None
    if figures is None or str(p.get("performance.gemm_surface", "")) or not _leaves_to_hardware(p, hw, LINEAR_KEYS):
        return None
    *numbers, surface = figures
    return roofline.LinearGemms(*numbers, surfaces.for_hardware(surface))


def expert_figures(p: dict):
    """The hardware's measured fused MoE kernels of the routed experts' compute dtype (the catalog's ``experts_*``
    or ``experts_fp8_*``), where the scenario leaves the GEMM figures and the surface to the hardware (a scenario's
    own figures, or a calibration's, price the experts as grouped GEMMs at those figures); else None."""
    hw = _hardware(p)
    figures = hw.expert_figures(precision(p).experts_compute)
    if figures is None or str(p.get("performance.gemm_surface", "")) or not _leaves_to_hardware(p, hw, LINEAR_KEYS):
        return None
    return figures


def mla_figures(p: dict):
    """The hardware's measured MLA attention kernels (the catalog's ``mla_*``), where the scenario leaves the achievable
    fractions to the hardware (as :func:`attention_figures`); else None (MLA attention then takes the roofline)."""
    hw = _hardware(p)
    if hw.mla_bandwidth_fraction <= 0 or not _leaves_to_hardware(p, hw, LINEAR_KEYS[:2]):
        return None
    return roofline.AttentionFigures(hw.mla_bandwidth_fraction, hw.mla_unit_ns * 1e-9, hw.mla_flops_fraction,
                                     hw.mla_prefill_bandwidth_fraction, hw.mla_half_work, 0.0, hw.mla_half_context,
                                     hw.mla_fp8_kv_bandwidth_fraction, hw.mla_fp8_kv_unit_ns * 1e-9)


def attention_figures(p: dict):
    """The hardware's measured GQA attention kernels (the catalog's ``attention_*``), where the scenario leaves the
    achievable fractions to the hardware (a scenario's own ``flops_fraction`` or ``bandwidth_fraction``, or a
    calibration's, prices attention as it always has: at those figures); else None (attention then takes the GEMM
    figures)."""
    hw = _hardware(p)
    if hw.attention_bandwidth_fraction <= 0 or not _leaves_to_hardware(p, hw, LINEAR_KEYS[:2]):
        return None
    return roofline.AttentionFigures(hw.attention_bandwidth_fraction, hw.attention_unit_ns * 1e-9,
                                     hw.attention_flops_fraction, hw.attention_prefill_bandwidth_fraction,
                                     hw.attention_half_work, hw.attention_head_dim_half, hw.attention_half_context,
                                     hw.attention_fp8_kv_bandwidth_fraction, hw.attention_fp8_kv_unit_ns * 1e-9)


#: Where the roofline compares two accelerators for the factor fidelity's base throughputs: a decode step at the
#: scenario's largest batch per GPU over this many tokens of context, and a prefill step of this many tokens.
REFERENCE_CONTEXT = 2048
REFERENCE_PREFILL = 8192
#: What "BF16 with no optimization" switches off for that comparison.
PLAIN = {"precision.enabled": False, "efficiency.fused_kernels": False, "efficiency.comm_overlap": False}


def base_scales(p: dict) -> tuple[float, float]:
    """Factors that carry the factor fidelity's base throughputs from ``efficiency.base_hardware`` (where they were
    estimated) to the sample's hardware: the ratio of the roofline's decode and prefill throughput per GPU of the
    scenario's model and parallelism on the two, at BF16 with no lever on, each accelerator with its own peaks,
    bandwidths and measured kernels. A GPU so moves decode and prefill as it would for this model and batch, not by
    one catalog ratio (HBM bandwidth, BF16 peak) whatever the model. (1, 1) on the base hardware itself."""
    base = catalog.hardware_preset(p["efficiency.base_hardware"])
    own = {k: p[k] for k in p if k.startswith("hardware.") and k != "hardware.preset"}
    on_base = {f"hardware.{k}": v for k, v in base.items() if f"hardware.{k}" in own}
    if all(own[k] == on_base.get(k, own[k]) for k in own):
        return 1.0, 1.0
    decode, prefill = _plain_throughputs(p, {})
    base_decode, base_prefill = _plain_throughputs(p, on_base)
    return decode / base_decode, prefill / base_prefill


def factor_bases(p: dict) -> tuple[float, float]:
    """The factor fidelity's base decode and prefill tokens/s per GPU on the sample's hardware (BF16, no lever on):
    with ``efficiency.base_source = "stated"``, the scenario's two base throughputs carried from
    ``efficiency.base_hardware`` (:func:`base_scales`); with ``"roofline"``, the roofline's own on the sample's model,
    parallelism and hardware, the decode one as the saturated asymptote its factor model reaches at the largest
    batch: ``X = roofline(b) x (b + b_half) / b`` per GPU, so that ``X b / (b + b_half)`` is the roofline's
    throughput at that batch ``b``."""
    if p["efficiency.base_source"] != "roofline":
        decode_scale, prefill_scale = base_scales(p)
        return (p["efficiency.base_decode_tok_s_per_gpu"] * decode_scale,
                p["efficiency.base_prefill_tok_s_per_gpu"] * prefill_scale)
    decode, prefill = _plain_throughputs(p, {})
    batch = max(float(p["deployment.max_batch_per_gpu"]), 1.0)
    return decode * (batch + p["efficiency.batch_half_saturation"]) / batch, prefill


def _plain_throughputs(p: dict, hardware: dict) -> tuple[float, float]:
    """Decode and prefill tokens/s per GPU of the roofline at BF16 with no lever, on ``p``'s hardware with
    ``hardware``'s ``hardware.*`` figures in place of its own; uncertain roofline inputs at their means (a factor
    sample does not draw them)."""
    q = {k: (v.mean() if isinstance(v, Dist) else v) for k, v in {**p, **hardware, **PLAIN}.items()
         if k.startswith(("model.", "hardware.", "deployment.", "precision.", "efficiency.", "performance.", "moe."))}
    opts = options({**q, "performance.fidelity": "roofline"})
    gpus = opts["parallel"].gpus
    model, hw = _model(q), _hardware(q)
    batch = max(float(q["deployment.max_batch_per_gpu"]), 1.0) * gpus
    decode = roofline.step_cost(model, hw, decode_seqs=batch, decode_context=REFERENCE_CONTEXT, **opts)
    prefill = roofline.step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=REFERENCE_PREFILL,
                                 prefill_context=REFERENCE_PREFILL / 2, **opts)
    return batch / decode.t_step / gpus, REFERENCE_PREFILL / prefill.t_step / gpus


def gemm_surface(p: dict):
    """The GEMM surface a sample prices with (``performance.gemm_surface``; :mod:`mcsim.perf.gemm_surface`)."""
    choice = str(p.get("performance.gemm_surface", ""))
    if choice == "none":
        return None
    if choice:
        return surfaces.read(choice)
    return surfaces.for_hardware(_hardware(p).gemm_surface)


class RooflineStepModel(StepModel):
    """Roofline fidelity: a step is :func:`mcsim.perf.roofline.step_cost` over all of its tokens, ``pp`` stages as
    ``pp`` micro-batches, plus ``draft_tokens x draft_cost`` plain decode steps of drafting."""

    fidelity = "roofline"

    def __init__(self, p: dict, requests, passes, experts: dict):
        super().__init__(p, requests, passes)
        eff = experts.get("expert_efficiency", 1.0)
        distinct = experts.get("distinct_experts_per_step") or None
        hot = 1.0 / eff if eff > 0 else 1.0
        self.model_entry, self.hardware_entry = _model(p), _hardware(p)
        # the stage's distinct experts hold at its own tokens a step; a step of other tokens scales them
        self.decode_options = options(p, hot_rank_factor=hot, distinct_experts=distinct,
                                      distinct_tokens=experts.get("distinct_experts_tokens") if distinct else None)
        self.prefill_options = options(p, prefill=True, hot_rank_factor=hot) if self.disaggregated \
            else self.decode_options
        self.draft_cost = float(p["speculative.draft_cost"])
        self._plain_memo: dict = {}

    def _cost(self, decode_seqs, decode_context, prefill_tokens, prefill_context, verify, prefill_pool):
        opts = self.prefill_options if prefill_pool else self.decode_options
        kwargs = dict(opts, decode_context=decode_context, prefill_context=prefill_context, verify_tokens=verify)
        return _instance_step_time(self.model_entry, self.hardware_entry, decode_seqs, prefill_tokens, kwargs)

    def _step(self, decode_seqs, decode_context, prefill_tokens, prefill_context, prefill_pool) -> StepTime:
        if decode_seqs <= 0 and prefill_tokens <= 0:
            return StepTime(0.0)
        opts = self.prefill_options if prefill_pool else self.decode_options
        pp = opts["parallel"].pp
        cost = roofline.step_cost(self.model_entry, self.hardware_entry, decode_seqs=decode_seqs / pp,
                                  decode_context=decode_context, prefill_tokens=prefill_tokens / pp,
                                  prefill_context=prefill_context, verify_tokens=self.verify_tokens, **opts)
        # pp micro-batches pass every stage: per GPU, the step is pp times one micro-batch's stage (the breakdown
        # itself, a fresh dict per step, at pp = 1)
        ops = dict(cost.breakdown) if pp == 1 else {
            name: {"t": pp * entry["t"], "flops": pp * entry["flops"], "bytes": pp * entry["bytes"],
                   "floor": pp * entry["floor"], "bound": entry["bound"],
                   **({"impl": entry["impl"]} if "impl" in entry else {}),
                   **({"hidden": pp * entry["hidden"]} if "hidden" in entry else {})}
            for name, entry in cost.breakdown.items()}
        if decode_seqs > 0 and self.draft_tokens:
            nan = float("nan")
            ops["drafting"] = {"t": self.draft_tokens * self.draft_cost * self._plain_at(decode_seqs, decode_context),
                               "flops": nan, "bytes": nan, "floor": nan, "bound": "drafting"}
        return StepTime(sum(op["t"] for op in ops.values()), ops)

    def _plain_at(self, decode_seqs, context) -> float:
        # A plain decode step prices every drafting row of the step table: once per (sequences, context).
        key = (decode_seqs, context)
        if key not in self._plain_memo:
            self._plain_memo[key] = self._cost(decode_seqs, context, 0.0, 0.0, 1, False)
        return self._plain_memo[key]

    def _plain(self, decode_seqs) -> float:
        return self._plain_at(decode_seqs, self.decode_context)

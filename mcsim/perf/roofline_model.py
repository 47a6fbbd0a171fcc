"""Stage 5, roofline fidelity: a sample's scenario values turned into :mod:`mcsim.perf.roofline` calls.

The levers map onto the roofline's inputs instead of onto factors: low precision sets the weight, KV and matmul
formats; fused kernels halve the launches and activation round-trips; communication overlap hides
``performance.overlap_fraction`` of the collectives; speculative decoding verifies k+1 tokens per sequence per
pass (priced by the roofline) and adds ``speculative.draft_cost`` of a step per draft token; expert replication
lowers the hottest rank's load (the experts kernel's max/mean); the prefill/decode split gives each phase its own
pool and parallelism. Achievable fractions of peak are scenario inputs, so they can be uncertain.
"""

from __future__ import annotations


from mcsim.perf import capacity, roofline
from mcsim.perf.factor import BF16_BYTES, DecodeModel, _model, tokens_per_pass


def _hardware(p: dict) -> dict:
    return {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("hardware.")}


def options(p: dict, *, prefill: bool = False, hot_rank_factor: float = 1.0, distinct_experts=None) -> dict:
    """Keyword arguments of :func:`mcsim.perf.roofline.step_cost` (and friends) for the decode or prefill pool."""
    on = p["precision.enabled"]
    precision = roofline.Precision(
        weight_bytes=p["precision.weight_bytes"] if on else BF16_BYTES,
        kv_bytes=p["precision.kv_bytes"] if on else BF16_BYTES,
        compute=p["precision.compute"] if on else "bf16",
        activation_bytes=p["precision.activation_bytes"],
    )
    return {
        "precision": precision,
        "parallel": parallelism(p, prefill=prefill),
        "collectives": roofline.Collectives(
            allreduce=p["performance.allreduce"], alltoall=p["performance.alltoall"],
            overlap=p["performance.overlap_fraction"] if p["efficiency.comm_overlap"] else 0.0,
            latency_s=p["performance.collective_latency_s"]),
        "achievable": roofline.Achievable(
            flops_fraction=p["performance.flops_fraction"], bandwidth_fraction=p["performance.bandwidth_fraction"],
            network_fraction=p["performance.network_fraction"], launch_overhead_s=p["performance.launch_overhead_s"],
            kernels_per_layer=p["performance.kernels_per_layer"], cuda_graphs=p["performance.cuda_graphs"],
            fused=p["efficiency.fused_kernels"], step_overhead_s=p["performance.step_overhead_s"]),
        "hot_rank_factor": hot_rank_factor,
        "distinct_experts": distinct_experts,
        "attention_window": p["performance.attention_window"],
        "sparse_topk": p["performance.sparse_topk"],
    }


def parallelism(p: dict, *, prefill: bool = False) -> roofline.Parallelism:
    """Layout of one instance: tp x pp x attention-DP GPUs, experts over EP ranks."""
    disagg = p["deployment.disaggregated"]
    gpus = p["deployment.prefill_gpus_per_instance"] if (prefill and disagg) else p["deployment.gpus_per_instance"]
    tp = p["deployment.prefill_tp"] if (prefill and disagg) else p["deployment.tp"]
    pp = 1 if prefill else p["deployment.pp"]
    if gpus % (tp * pp):
        raise ValueError(f"gpus per instance ({gpus}) must be a multiple of tp x pp ({tp} x {pp})")
    dp = gpus // (tp * pp)
    ep = 1
    if p["model.experts"] > 0:
        ep = tp * dp if (prefill or not p["moe.ep_ranks"]) else p["moe.ep_ranks"]
    return roofline.Parallelism(tp=tp, ep=ep, pp=pp, attention_dp=dp)


def mean_contexts(requests) -> tuple[float, float]:
    """Mean decode context (prompt + half the output) and mean attended prefix of a prefill token."""
    return (float(requests.prompt_tokens.mean() + requests.output_tokens.mean() / 2.0),
            float(requests.prompt_tokens.mean() / 2.0))


def memory(p: dict, requests, opts: dict) -> roofline.Memory:
    """HBM projection of a decode instance (the prefix cache's HBM counts when colocated)."""
    context, _ = mean_contexts(requests)
    reserved = p["cache.hbm_gb_per_instance"] / p["deployment.gpus_per_instance"] \
        if p["cache.enabled"] and not p["deployment.disaggregated"] else 0.0
    return capacity.memory_projection(
        _model(p), _hardware(p), precision=opts["precision"], parallel=opts["parallel"],
        block_tokens=requests.block_tokens, context=context, memory_fraction=p["deployment.memory_fraction"],
        activation_gb=p["deployment.activation_gb_per_gpu"], reserved_gb=reserved,
        include_mtp=bool(p["speculative.enabled"] and p.get("model.mtp_layers", 0)))


def instance_step(p: dict, opts: dict, decode_seqs: float, context: float, verify_tokens: int,
                  prefill_tokens: float = 0.0, prefill_context: float = 0.0) -> float:
    """Seconds of one step of an instance (pipeline stages included)."""
    table = capacity.step_time_table(_model(p), _hardware(p), [decode_seqs], [prefill_tokens],
                                     decode_context=context, prefill_context=prefill_context,
                                     verify_tokens=verify_tokens, **opts)
    return float(table[0, 0])


def roofline_decode_model(p: dict, requests, passes, experts: dict) -> DecodeModel:
    """The roofline's price of decoding one sample's requests (see :class:`mcsim.perf.factor.DecodeModel`)."""
    eff = experts.get("expert_efficiency", 1.0)
    distinct = experts.get("distinct_experts_per_step") or None
    opts = options(p, hot_rank_factor=1.0 / eff if eff > 0 else 1.0, distinct_experts=distinct)
    gpus = p["deployment.gpus_per_instance"]
    context, _ = mean_contexts(requests)
    k = p["speculative.draft_tokens"] if passes is not None else 0
    draft = 1.0 + k * p["speculative.draft_cost"]
    mem = memory(p, requests, opts)
    b_mem = mem.max_sequences / gpus if mem.fits else 0.0
    cache: dict = {}

    def step(b, verify):
        key = (round(b * gpus, 6), verify)
        if key not in cache:
            cache[key] = instance_step(p, opts, max(b * gpus, 1e-9), context, verify)
        return cache[key]

    def t_pass(b):
        return step(b, k + 1) * draft

    # Prefill at full steps: every attention data-parallel group fills its own token budget.
    prefill_opts = options(p, prefill=True, hot_rank_factor=opts["hot_rank_factor"])
    layout = prefill_opts["parallel"]
    tokens = float(p["performance.token_budget"]) * layout.attention_dp
    _, prefill_context = mean_contexts(requests)
    x_prefill = tokens / instance_step(p, prefill_opts, 0.0, 0.0, 1, tokens, prefill_context) / layout.gpus
    tpp = tokens_per_pass(requests, passes)
    big = 4096.0
    return DecodeModel(t_pass, tpp, b_mem, mem.reason, x_prefill, tpp * big / t_pass(big),
                       lambda b: t_pass(b) / step(b, 1))

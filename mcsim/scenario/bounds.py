"""The physical bounds of scenario keys and catalog fields whose products the model forms (bytes, sizes, rates):
far beyond any hardware or model, so that every figure a sample computes stays finite and every search over a model's
sizes stays short, yet a value past them is refused in one line naming the key and the range
(:mod:`mcsim.scenario.loading`). Without them 1e300 GB of HBM per GPU could not be counted in bytes, 1e300 bytes per
weight made the weights' size infinite, and a model of 10^18 attention heads never finished listing its
tensor-parallel degrees.

Every numeric scenario key has a range: the schema's own (a fraction in [0, 1]) or, where the schema states only a
sign, the physical one of :data:`SCENARIO_UPPER` and :data:`SCENARIO_LOWER` (1e300 turns a session or 1e-300
requests/s are refused, not run). Keys whose values are commonly uncertain with an unbounded law (a lognormal price,
a normal PUE bounded below only) keep those laws: a distribution's unbounded tail is judged by its quantiles at
:data:`DRAW_TAIL` and 1 - :data:`DRAW_TAIL` (a lognormal price of median 30,000 USD and sigma 1 reaches 3.4 million
there), and a draw beyond the key's range, rarer than that, is clipped to it.

Examples
--------
>>> CATALOG_UPPER["hardware.hbm_gb"] == MAX_GPU_MEMORY_GB
True
"""

from __future__ import annotations

#: HBM of one GPU, GB (the catalog's largest holds 192).
MAX_GPU_MEMORY_GB = 100_000
#: The burstiest gamma arrivals (squared coefficient of variation of the gaps): beyond it nearly every gap is 0.
MAX_BURSTINESS = 100
#: Bytes per weight, KV or activation element: one bit to FP64.
ELEMENT_BYTES = (0.125, 8)

#: Catalog fields that must be above 0 (or at least 1) for a model or accelerator to make sense; every other
#: numeric catalog field is >= 0 (0: absent or not measured).
CATALOG_LOWER = {
    **{f"hardware.{k}": (0, True) for k in ("hbm_gb", "hbm_tb_s", "bf16_tflops", "fp32_tflops")},
    "hardware.gpus_per_node": (1, False),
    **{f"model.{k}": (1, False) for k in ("layers", "hidden_size", "attention_heads", "vocab", "max_context")},
}

#: The most a catalog field may be: far beyond any model or accelerator (the catalog's largest are a hundredth of
#: these or less), so that a model's sizes and an accelerator's rates multiply to finite figures and the searches over
#: a model's heads (tensor-parallel degrees) and experts stay short; a fraction of a peak is at most 1.
CATALOG_UPPER = {
    **{f"model.{k}": 10_000 for k in ("layers", "dense_layers")},
    "model.mtp_layers": 1_000,
    **{f"model.{k}": 100_000 for k in ("attention_heads", "kv_heads", "experts")},
    **{f"model.{k}": 1_000 for k in ("active_experts", "shared_experts")},
    **{f"model.{k}": 1_000_000 for k in ("hidden_size", "head_dim", "kv_lora_rank", "qk_rope_head_dim", "q_lora_rank",
                                         "qk_nope_head_dim", "v_head_dim")},
    **{f"model.{k}": 10_000_000 for k in ("expert_ffn", "dense_ffn")},
    "model.vocab": 100_000_000,
    "model.max_context": 1_000_000_000,
    **{f"model.{k}": 1e6 for k in ("total_params_b", "active_params_b")},
    **{f"hardware.{k}": 1e7 for k in ("bf16_tflops", "fp32_tflops", "fp8_tflops", "fp4_tflops")},
    "hardware.hbm_gb": MAX_GPU_MEMORY_GB,
    "hardware.hbm_tb_s": 1e4,
    **{f"hardware.{k}": 1e7 for k in ("scale_up_gb_s", "scale_out_gb_s", "host_link_gb_s", "send_gb_s",
                                      "remote_send_gb_s", "custom_allreduce_gb_s", "allreduce_bus_gb_s",
                                      "remote_allreduce_bus_gb_s")},
    **{f"hardware.{k}": 1e9 for k in ("collective_base_us", "collective_hop_us", "send_base_us", "remote_send_base_us",
                                      "gemm_floor_us", "kernel_floor_us", "custom_allreduce_hop_us",
                                      "remote_allreduce_base_us", "gemm_half_tokens", "gemm_fp8_floor_us",
                                      "gemm_fp4_floor_us", "gemm_fp4_half_tokens",
                                      "gemm_fp8_half_tokens", "attention_floor_us", "attention_unit_ns",
                                      "attention_half_work", "attention_head_dim_half", "attention_half_context",
                                      "attention_fp8_kv_unit_ns",
                                      *(f"experts_{d}{k}" for d in ("", "fp8_", "fp4_")
                                        for k in ("half_rows", "floor_us", "tile_ns")),
                                      "mla_floor_us", "mla_unit_ns", "mla_half_work", "mla_half_context",
                                      "mla_fp8_kv_floor_us", "mla_fp8_kv_unit_ns")},
    **{f"hardware.{k}": 1 for k in ("gemm_flops_fraction", "gemm_bandwidth_fraction", "gemm_fp8_flops_fraction",
                                    "gemm_fp4_flops_fraction", "gemm_fp4_bandwidth_fraction",
                                    "gemm_fp8_bandwidth_fraction", "elementwise_bandwidth_fraction",
                                    "attention_bandwidth_fraction", "attention_flops_fraction",
                                    "attention_prefill_bandwidth_fraction", "attention_fp8_kv_bandwidth_fraction",
                                    *(f"experts_{d}{k}" for d in ("", "fp8_", "fp4_")
                                      for k in ("flops_fraction", "weight_bandwidth_fraction",
                                                "stream_bandwidth_fraction")),
                                    "mla_bandwidth_fraction", "mla_flops_fraction", "mla_prefill_bandwidth_fraction",
                                    "mla_fp8_kv_bandwidth_fraction")},
    **{f"hardware.{k}": 1e6 for k in ("tdp_w", "idle_w")},
    "hardware.gpus_per_node": 100_000,
    "hardware.price_usd": 1e9,
    "hardware.rental_usd_per_hour": 1e6,
}
#: The catalog bounds that, as :data:`SCENARIO_UPPER`'s, an unbounded law (a lognormal price) meets at its tails.
TAIL_CHECKED_CATALOG = ("hardware.price_usd", "hardware.rental_usd_per_hour")

#: The tail probability at which an unbounded distribution of an uncertain input is held to its key's range (see
#: the module's docstring); a draw beyond the range is rarer than this on either side, and clipped to it.
DRAW_TAIL = 1e-12

_SECONDS_IN_TEN_YEARS = 3.2e8

#: The most a scenario key whose schema states only a sign may be: far beyond any deployment, each with the unit
#: of its key (``workload.classes.*`` is every class's key).
SCENARIO_UPPER = {
    "deployment.routing_balance": 100.0,           # a relative load guard: 100 x the least loaded
    "deployment.max_batch_per_gpu": 1_000_000,     # sequences
    "deployment.tpot_target_s": 600.0,             # a token every ten minutes
    "deployment.ttft_target_s": 86_400.0,          # a day
    "workload.trace_time_scale": 1e6,
    "workload.trace_start_s": _SECONDS_IN_TEN_YEARS,
    "workload.rate_rps": 1e8,                      # 10^8 requests per second
    "workload.rate_profile_period_s": _SECONDS_IN_TEN_YEARS,
    "workload.rate_profile_start_s": _SECONDS_IN_TEN_YEARS,
    "workload.think_time_s": _SECONDS_IN_TEN_YEARS,
    "workload.max_context": 1_000_000_000,         # tokens, the catalog's own bound on model.max_context
    "workload.classes.*.share": 1e9,               # relative shares, normalised
    "workload.classes.*.turns": 10_000.0,          # mean turns of a session
    "cache.hbm_gb_per_instance": 1e7,              # GB: 10 PB of GPU memory per instance
    "cache.dram_gb_per_node": 1e8,
    "cache.nvme_gb_per_node": 1e9,                 # GB: an exabyte per node
    "cache.nvme_gb_s_per_node": 1e7,
    "speculative.draft_cost": 100.0,               # fractions of a decode step
    "speculative.verify_cost": 100.0,
    "precision.decode_gain": 1000.0,
    "precision.prefill_gain": 1000.0,
    "performance.gemm_half_tokens": 1e9,           # rows
    "performance.gemm_floor_s": 60.0,
    "performance.kernel_floor_s": 60.0,
    "performance.attention_floor_s": 60.0,
    **{f"performance.{k}_error": 1000.0 for k in ("gemm", "elementwise", "allreduce", "allreduce_nodes", "send",
                                                  "attention", "experts", "experts_fp8", "experts_fp4", "mla",
                                                  "step")},
    "performance.collective_latency_s": 60.0,
    "performance.launch_overhead_s": 60.0,
    "performance.step_overhead_s": 600.0,
    "performance.attention_window": 1_000_000_000,  # tokens
    "performance.sparse_topk": 1_000_000_000,
    "performance.token_budget": 1_000_000_000,
    "performance.chunk_tokens": 1_000_000_000,
    "performance.closed_loop_users": 100_000_000,
    "performance.batching_requests": 100_000_000,  # mc.requests' own bound
    "host.request_overhead_s": 3600.0,
    "host.tokenize_s_per_token": 60.0,
    "host.detokenize_s_per_token": 60.0,
    "host.stream_interval_tokens": 1_000_000_000,
    "efficiency.base_decode_tok_s_per_gpu": 1e9,
    "efficiency.base_prefill_tok_s_per_gpu": 1e10,
    "efficiency.batch_half_saturation": 1e7,       # sequences per GPU
    "efficiency.fused_kernel_gain": 1000.0,
    "efficiency.comm_overlap_gain": 1000.0,
    "efficiency.kv_transfer_latency_s": 3600.0,
    "economics.rental_usd_per_gpu_hour": 1e6,
    "economics.price_usd": 1e9,                    # USD per GPU
    "economics.gpu_price_factor": 1e4,
    "economics.lifetime_years": 1000.0,
    "economics.electricity_usd_per_kwh": 1e4,
    "economics.pue": 100.0,
    **{f"economics.price_{k}_usd_per_mtok": 1e6 for k in ("input_cache_hit", "input_cache_miss", "output")},
    "cache.tiers.*.gb": 1e9,
    "cache.tiers.*.gb_s": 1e7,
    "cache.tiers.*.latency_us": 3.6e9,             # an hour
    "cache.tiers.*.usd_per_gb_month": 1e4,         # USD per GB-month
    "cache.dram_usd_per_gb_month": 1e4,
    "cache.nvme_usd_per_gb_month": 1e4,
}

#: The least a scenario key whose schema excludes 0 only may be: 1e-300 requests/s or a 1e-300 s TPOT target are
#: not a deployment (a day would hold no request, no step would meet the target), and their arithmetic overflows.
SCENARIO_LOWER = {
    "deployment.tpot_target_s": 1e-6,              # a microsecond per token
    "workload.trace_time_scale": 1e-6,
    "workload.rate_rps": 1e-6,                     # one request in 11.6 days
    "workload.rate_profile_period_s": 1e-3,
    "cache.nvme_gb_s_per_node": 1e-6,
    "precision.decode_gain": 1e-3,
    "precision.prefill_gain": 1e-3,
    **{f"performance.{k}_error": 1e-3 for k in ("gemm", "elementwise", "allreduce", "allreduce_nodes", "send",
                                                "attention", "experts", "experts_fp8", "experts_fp4", "mla",
                                                  "step")},
    "efficiency.base_decode_tok_s_per_gpu": 1e-6,
    "efficiency.base_prefill_tok_s_per_gpu": 1e-6,
    "efficiency.fused_kernel_gain": 1e-3,
    "efficiency.comm_overlap_gain": 1e-3,
    "economics.gpu_price_factor": 1e-6,
    "economics.lifetime_years": 1e-3,              # nine hours
}

"""The physical bounds of scenario keys and catalog fields whose products the model forms (bytes, sizes, rates):
far beyond any hardware or model, so that every figure a sample computes stays finite and every search over a model's
sizes stays short, yet a value past them is refused in one line naming the key and the range
(:mod:`mcsim.scenario.loading`). Without them 1e300 GB of HBM per GPU could not be counted in bytes, 1e300 bytes per
weight made the weights' size infinite, and a model of 10^18 attention heads never finished listing its
tensor-parallel degrees.

Keys whose values are commonly uncertain with an unbounded law (a lognormal price, a normal PUE bounded below only)
have no upper bound here: a range with one refuses such laws (their support crosses it). Their arithmetic is kept
finite instead (:mod:`mcsim.stages.economics`, :func:`mcsim.stages.kvcache.capacity_blocks`).

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
#: a model's heads (tensor-parallel degrees) and experts stay short; a fraction of a peak is at most 1. The prices
#: (price_usd, rental_usd_per_hour) have none, as the [economics] prices (see the module's docstring).
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
                                      "remote_allreduce_base_us", "gemm_half_tokens")},
    **{f"hardware.{k}": 1 for k in ("gemm_flops_fraction", "gemm_bandwidth_fraction",
                                    "elementwise_bandwidth_fraction")},
    **{f"hardware.{k}": 1e6 for k in ("tdp_w", "idle_w")},
    "hardware.gpus_per_node": 100_000,
}

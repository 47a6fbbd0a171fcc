"""Model and hardware catalogs, and the sizes that follow from a model's shape.

The catalogs are package data (``mcsim/data/models.toml``, ``mcsim/data/hardware.toml``): one flat table
per preset, every entry citing its public source. A scenario names a preset and may override any field
with a dotted path (``model.kv_heads``, ``hardware.hbm_gb``); :data:`MODEL_FIELDS` and
:data:`HARDWARE_FIELDS` are the schema that the scenario validator checks those overrides against.

Examples
--------
>>> from mcsim import catalog
>>> model = catalog.model_preset("llama-3-70b")
>>> catalog.kv_bytes_per_token(model, kv_dtype_bytes=2)
327680.0
>>> round(catalog.param_counts(catalog.model_preset("deepseek-v3"))[0] / 1e9)
671
"""

from __future__ import annotations

from pathlib import Path

import difflib
import functools
import tomllib
from importlib import resources

from mcsim.errors import McsimError

__all__ = [
    "HARDWARE_FIELDS",
    "HARDWARE_FIELD_DOCS",
    "MODEL_FIELDS",
    "MODEL_FIELD_DOCS",
    "UnknownPresetError",
    "hardware",
    "hardware_preset",
    "kv_bytes_per_token",
    "model_preset",
    "models",
    "param_counts",
    "weight_bytes",
]

#: Model field -> (type, description with units).
MODEL_FIELD_DOCS: dict[str, tuple[type, str]] = {
    "name": (str, "display name"),
    "source": (str, "public sources of the figures (config.json, model card, paper)"),
    "layers": (int, "transformer layers of the main model (MTP modules excluded)"),
    "hidden_size": (int, "model (residual stream) width"),
    "attention_heads": (int, "query heads per layer"),
    "kv_heads": (int, "key/value heads per layer (GQA); for MLA the config value, unused by the KV size"),
    "head_dim": (int, "query/key dimension per head (MLA: qk_nope_head_dim + qk_rope_head_dim)"),
    "attention": (str, '"gqa" (grouped-query, incl. MHA/MQA) or "mla" (multi-head latent attention)'),
    "kv_lora_rank": (int, "MLA compressed KV latent width, cached per token per layer; 0 for GQA"),
    "qk_rope_head_dim": (int, "MLA decoupled RoPE key width, cached per token per layer; 0 for GQA"),
    "q_lora_rank": (int, "MLA query low-rank width (0: full-rank query projection)"),
    "qk_nope_head_dim": (int, "MLA per-head query/key width without RoPE; 0 for GQA"),
    "v_head_dim": (int, "MLA per-head value width; 0 for GQA (values use head_dim)"),
    "dense_layers": (int, "layers with a dense FFN (the rest are MoE); equals layers for a dense model"),
    "experts": (int, "routed experts per MoE layer; 0 for a dense model"),
    "active_experts": (int, "routed experts each token uses per MoE layer (top-k)"),
    "shared_experts": (int, "always-on shared experts per MoE layer"),
    "expert_ffn": (int, "intermediate size of one expert's SwiGLU FFN"),
    "dense_ffn": (int, "intermediate size of a dense layer's SwiGLU FFN"),
    "vocab": (int, "vocabulary size (rows of the embedding and of the output head)"),
    "max_context": (int, "published context window, tokens"),
    "total_params_b": (float, "published total parameters, billions (main model)"),
    "active_params_b": (float, "published parameters used per token, billions"),
    "mtp_layers": (int, "multi-token-prediction modules shipped with the weights (DeepSeek-V3: 1)"),
}

#: Hardware field -> (type, description with units).
HARDWARE_FIELD_DOCS: dict[str, tuple[type, str]] = {
    "name": (str, "display name"),
    "source": (str, "public sources: datasheets; how estimates (price, rental, idle power) were made"),
    "bf16_tflops": (float, "dense BF16 tensor peak, TFLOP/s (no sparsity)"),
    "fp32_tflops": (float, "dense FP32 peak, TFLOP/s"),
    "fp8_tflops": (float, "dense FP8 tensor peak, TFLOP/s; 0 where unsupported"),
    "fp4_tflops": (float, "dense FP4 tensor peak, TFLOP/s; 0 where unsupported"),
    "hbm_gb": (float, "HBM capacity usable per GPU, GB (1e9 bytes)"),
    "hbm_tb_s": (float, "HBM bandwidth per GPU, TB/s (1e12 bytes/s)"),
    "scale_up_gb_s": (float, "scale-up (NVLink / Infinity Fabric) bandwidth per GPU, one direction, GB/s"),
    "scale_out_gb_s": (float, "scale-out network bandwidth per GPU, one direction, GB/s"),
    "host_link_gb_s": (float, "GPU-host link (PCIe x16) bandwidth, one direction, GB/s"),
    "collective_base_us": (float, "fixed cost of one NCCL collective inside a node (launch, synchronisation), us; "
                                  "fitted to measured all-reduce times where the source says so, 0 where unknown"),
    "collective_hop_us": (float, "latency of one step (hop) of a collective inside a node, us; fitted like "
                                 "collective_base_us, 0 where unknown (then performance.collective_latency_s)"),
    "send_base_us": (float, "fixed cost of one point-to-point send inside a node, us, fitted to measured NCCL "
                            "send/recv times where the source says so; 0 where unknown"),
    "send_gb_s": (float, "achieved point-to-point bandwidth inside a node, GB/s, fitted like send_base_us; 0 where "
                         "unknown (then scale_up_gb_s x network_fraction)"),
    "remote_send_base_us": (float, "fixed cost of one point-to-point send between nodes, us, fitted like "
                                   "send_base_us; 0 where unknown"),
    "remote_send_gb_s": (float, "achieved point-to-point bandwidth between nodes, GB/s, fitted like send_base_us; 0 "
                                "where unknown (then scale_out_gb_s x network_fraction)"),
    "gemm_flops_fraction": (float, "largest share of the matmul peak a GEMM reaches, fitted to measured per-layer "
                                   "GEMM times where the source says so; 0 where unknown (then 0.6)"),
    "gemm_bandwidth_fraction": (float, "share of HBM bandwidth a weight-streaming GEMM reaches, fitted like "
                                       "gemm_flops_fraction; 0 where unknown (then 0.8)"),
    "gemm_half_tokens": (float, "tokens (rows) at which a GEMM reaches half its largest FLOP share, fitted like "
                                "gemm_flops_fraction; 0 where unknown (no size dependence)"),
    "gemm_floor_us": (float, "fixed GPU time of one GEMM kernel, us, fitted like gemm_flops_fraction; 0 where unknown"),
    "gemm_surface": (str, "the bundled calibration (mcsim/data/calibrations/<name>.toml) whose measured GEMM "
                          "surface corrects each GEMM by its shape (mcsim.perf.gemm_surface); \"\" where none"),
    **{f"gemm_{dtype}_{name}": (float, f"{bf16_name} of {label} GEMMs (of the {label} peak), fitted to measured "
                                        f"{label} GEMM times where the source says so; 0 where unknown (then they "
                                        "take the BF16 figures at their peak)")
       for dtype, label in (("fp8", "FP8"), ("fp4", "FP4"))
       for name, bf16_name in (("flops_fraction", "gemm_flops_fraction"),
                               ("bandwidth_fraction", "gemm_bandwidth_fraction"),
                               ("half_tokens", "gemm_half_tokens"), ("floor_us", "gemm_floor_us"))},
    **{f"gemm_{dtype}_surface": (str, f"the bundled calibration whose measured {label} GEMM surface corrects each "
                                      f"{label} GEMM by its shape; \"\" where none")
       for dtype, label in (("fp8", "FP8"), ("fp4", "FP4"))},
    "kernel_floor_us": (float, "fixed GPU time of one element-wise kernel (RMSNorm, RoPE, activation, residual add), "
                               "us, fitted to measured per-layer kernel times where the source says so; 0 where "
                               "unknown"),
    "elementwise_bandwidth_fraction": (float, "share of HBM bandwidth element-wise kernels reach, fitted like "
                                              "kernel_floor_us; 0 where unknown (then 0.8)"),
    "attention_floor_us": (float, "fixed GPU time of one GQA attention call (per layer and step), us, fitted to "
                                  "measured attention kernels (decode and prefill) where the source says so; 0 where "
                                  "unknown (then 3 element-wise kernel floors)"),
    "attention_bandwidth_fraction": (float, "share of HBM bandwidth a decode attention call's KV stream reaches, "
                                            "fitted like attention_floor_us; 0 where unknown (then attention takes "
                                            "the GEMM figures)"),
    "attention_unit_ns": (float, "fixed time per decoding sequence and KV head of a decode attention call, ns, "
                                 "fitted like attention_floor_us"),
    "attention_flops_fraction": (float, "largest share of the BF16 peak a prefill attention call reaches, fitted "
                                        "like attention_floor_us"),
    "attention_prefill_bandwidth_fraction": (float, "share of HBM bandwidth a prefill attention call's bytes reach, "
                                                    "fitted like attention_floor_us"),
    "attention_half_work": (float, "query-head tokens (tokens x query heads on the GPU) at which prefill attention "
                                   "reaches half its FLOP share, fitted like attention_floor_us"),
    "attention_head_dim_half": (float, "head width at which prefill attention reaches half its FLOP share, fitted "
                                       "like attention_floor_us"),
    "attention_fp8_kv_bandwidth_fraction": (float, "attention_bandwidth_fraction of a decode call over an FP8 KV "
                                                   "cache, fitted to such calls with the other attention figures "
                                                   "held; 0 where unknown (then the BF16 cache's)"),
    "attention_fp8_kv_unit_ns": (float, "attention_unit_ns of a decode call over an FP8 KV cache, fitted like "
                                        "attention_fp8_kv_bandwidth_fraction"),
    "attention_half_context": (float, "context a prefill token attends to at which prefill attention reaches half "
                                      "its FLOP share, fitted like attention_floor_us"),
    **{f"experts_{dtype}{name}": (kind, f"{text} of {label} routed experts' fused MoE kernels "
                                        "(mcsim.perf.fused_moe), fitted to measured fused MoE layers where the source "
                                        "says so" + ("; 0 where unknown (then the experts are priced as grouped GEMMs "
                                                     "at the GEMM figures)" if name == "flops_fraction" else ""))
       for dtype, label in (("", "BF16"), ("fp8_", "block-scaled FP8"), ("fp4_", "NVFP4"))
       for name, kind, text in (
           ("flops_fraction", float, "largest share of the compute dtype's peak the grouped GEMMs reach"),
           ("weight_bandwidth_fraction", float, "share of HBM bandwidth at which the touched experts' weights "
                                                "stream"),
           ("stream_bandwidth_fraction", float, "share of HBM bandwidth at which the token-expert pairs' "
                                                "activations move"),
           ("half_rows", float, "pairs per expert at which the grouped GEMMs reach half their FLOP share"),
           ("floor_us", float, "fixed time of one layer's routed experts, us"),
           ("tile_ns", float, "time per output tile of the two grouped GEMMs over the whole GPU, ns"),
           ("surface", str, "the bundled calibration (mcsim/data/calibrations/<name>.toml) whose measured surface "
                            "corrects them by shape (width on the GPU, hidden size, tokens); \"\" where none"))},
    **{f"mla_{name}": (float, f"{text}, fitted to DeepSeek-V3's measured MLA attention modules (their projections at "
                              "the GEMM figures) where the source says so; 0 where unknown (then MLA attention takes "
                              "the roofline)")
       for name, text in (("floor_us", "fixed GPU time of one MLA attention module beyond its GEMMs' (norms, RoPE, the "
                                       "cache write, the absorbed BMMs' and the kernel's fixed time), us"),
                          ("bandwidth_fraction", "share of HBM bandwidth a decode MLA call's latent cache stream "
                                                 "reaches"),
                          ("unit_ns", "fixed time per decoding sequence and head of a decode MLA call, ns"),
                          ("flops_fraction", "largest share of the BF16 peak a prefill MLA call reaches"),
                          ("prefill_bandwidth_fraction", "share of HBM bandwidth a prefill MLA call's bytes reach"),
                          ("half_work", "query-head tokens at which prefill MLA reaches half its FLOP share"),
                          ("half_context", "context at which prefill MLA reaches half its FLOP share"),
                          ("fp8_kv_floor_us", "mla_floor_us over an FP8 cache, us (0: the BF16 cache's)"),
                          ("fp8_kv_bandwidth_fraction", "mla_bandwidth_fraction of a decode call over an FP8 cache "
                                                        "(0: the BF16 cache's)"),
                          ("fp8_kv_unit_ns", "mla_unit_ns of a decode call over an FP8 cache"))},
    "deepep_table": (str, "the bundled export of DeepEP's measured dispatches and combines "
                          "(mcsim/data/measurements/aiconfigurator/<name>_deepep.csv.gz) that prices "
                          "performance.alltoall = deepep_low_latency / deepep_normal on this GPU (mcsim.perf.deepep); "
                          "\"\" where none (then the hierarchical model)"),
    "custom_allreduce_hop_us": (float, "latency of one stage of the serving engine's own all-reduce (vLLM's, "
                                       "SGLang's and TensorRT-LLM's one-shot / two-shot kernels over NVLink), us, "
                                       "fitted to measured times where the source says so; 0 where it has none"),
    "custom_allreduce_gb_s": (float, "bandwidth per GPU those kernels reach, GB/s (the bytes each GPU reads: (p-1) S "
                                     "one-shot, 2 (p-1)/p S two-shot); 0 where it has none"),
    "allreduce_bus_gb_s": (float, "achieved all-reduce bandwidth per GPU and direction inside a node, GB/s, fitted "
                                  "like collective_base_us; 0 where unknown (then scale_up_gb_s x network_fraction)"),
    "remote_allreduce_base_us": (float, "fixed cost of one NCCL all-reduce across whole nodes, us, fitted to "
                                        "measured times where the source says so; 0 where unknown"),
    "remote_allreduce_bus_gb_s": (float, "achieved all-reduce bus bandwidth per GPU across whole nodes (NCCL's "
                                         "busbw: algorithm bandwidth x 2 (p-1)/p), GB/s, fitted like "
                                         "remote_allreduce_base_us; 0 where unknown (then the hierarchical model)"),
    "tdp_w": (float, "board power limit, W"),
    "idle_w": (float, "power of a powered-on idle GPU, W (estimate)"),
    "price_usd": (float, "purchase price of one accelerator, USD (estimate)"),
    "gpus_per_node": (int, "GPUs in one scale-up node"),
    "rental_usd_per_hour": (float, "typical on-demand rental price, USD per GPU-hour (estimate)"),
}

#: Model field name -> Python type (int, float or str), for the scenario validator.
MODEL_FIELDS: dict[str, type] = {key: kind for key, (kind, _) in MODEL_FIELD_DOCS.items()}

#: Hardware field name -> Python type (int, float or str), for the scenario validator.
HARDWARE_FIELDS: dict[str, type] = {key: kind for key, (kind, _) in HARDWARE_FIELD_DOCS.items()}

ATTENTION_KINDS = ("gqa", "mla")


class UnknownPresetError(McsimError, KeyError):
    """A preset name that is not in the catalog; the message lists the valid names."""

    def __str__(self) -> str:  # KeyError would print the message inside quotes
        return str(self.args[0]) if self.args else ""


def _check_entry(kind: str, preset: str, entry: dict, fields: dict[str, type]) -> None:
    """Raise ``ValueError`` if a catalog entry lacks a field, has an extra one or a wrong type."""
    missing = sorted(set(fields) - set(entry))
    extra = sorted(set(entry) - set(fields))
    if missing or extra:
        raise ValueError(f"{kind} catalog entry {preset!r}: missing fields {missing}, unknown fields {extra}")
    for key, expected in fields.items():
        value = entry[key]
        # bool is an int subclass; a catalog value of true/false is always a mistake here.
        if type(value) is not expected:
            raise ValueError(
                f"{kind} catalog entry {preset!r}: {key} = {value!r} is {type(value).__name__}, "
                f"expected {expected.__name__}"
            )
    if kind == "model" and entry["attention"] not in ATTENTION_KINDS:
        raise ValueError(f"model catalog entry {preset!r}: attention must be one of {ATTENTION_KINDS}")


def _load(filename: str, kind: str, fields: dict[str, type]) -> dict[str, dict]:
    text = resources.files("mcsim.data").joinpath(filename).read_text(encoding="utf-8")
    table = tomllib.loads(text)
    for preset, entry in table.items():
        _check_entry(kind, preset, entry, fields)
    return table


@functools.cache
def models() -> dict[str, dict]:
    """All model presets, ``{preset name: {field: value}}``.

    Loaded once from ``mcsim/data/models.toml`` and cached; treat the result as read-only and use
    :func:`model_preset` for a copy that can be modified.
    """
    return _load("models.toml", "model", MODEL_FIELDS)


@functools.cache
def hardware() -> dict[str, dict]:
    """All hardware presets, ``{preset name: {field: value}}``.

    Cached; treat as read-only and use :func:`hardware_preset` for a modifiable copy.
    """
    return _load("hardware.toml", "hardware", HARDWARE_FIELDS)


#: Scenario keys that name a catalog preset, and the catalog whose names each takes.
PRESET_KEYS = {"model.preset": models, "hardware.preset": hardware, "efficiency.base_hardware": hardware}


def _preset(table: dict[str, dict], name: str, kind: str) -> dict:
    key = name.strip().lower()
    if key in table:
        return dict(table[key])
    valid = sorted(table)
    nearest = difflib.get_close_matches(key, valid, n=1, cutoff=0.0)
    hint = f" Did you mean {nearest[0]!r}?" if nearest else ""
    raise UnknownPresetError(f"unknown {kind} preset {name!r}.{hint} Valid presets: {', '.join(valid)}.")


def model_preset(name: str) -> dict:
    """A copy of one model preset.

    Parameters
    ----------
    name : str
        Preset name, case-insensitive (``"deepseek-v3"``, ``"llama-3-70b"``, ...).

    Returns
    -------
    dict
        Field -> value (see :data:`MODEL_FIELDS`); a fresh copy the caller may modify.

    Raises
    ------
    UnknownPresetError
        A ``KeyError`` whose message names the nearest valid preset and lists them all.
    """
    return _preset(models(), name, "model")


def hardware_preset(name: str) -> dict:
    """A copy of one hardware preset (``"h100"``, ``"mi300x"``, ...); see :func:`model_preset`."""
    return _preset(hardware(), name, "hardware")


def kv_bytes_per_token(model: dict, kv_dtype_bytes: float) -> float:
    """KV-cache bytes one token occupies across all layers of the main model.

    GQA caches a key and a value vector per KV head: ``2 * layers * kv_heads * head_dim * bytes``.
    MLA caches one compressed latent plus the decoupled RoPE key, shared by all heads:
    ``(kv_lora_rank + qk_rope_head_dim) * layers * bytes``.

    Parameters
    ----------
    model : dict
        A model entry (preset, possibly overridden).
    kv_dtype_bytes : float
        Bytes per cached element (BF16: 2, FP8: 1).

    Returns
    -------
    float
        Bytes per token. MTP modules, if served, add their own (small) cache, not counted here.

    Examples
    --------
    >>> kv_bytes_per_token(model_preset("deepseek-v3"), 2)
    70272.0
    """
    layers = model["layers"]
    if model["attention"] == "mla":
        return float((model["kv_lora_rank"] + model["qk_rope_head_dim"]) * layers * kv_dtype_bytes)
    if model["attention"] == "gqa":
        return float(2 * layers * model["kv_heads"] * model["head_dim"] * kv_dtype_bytes)
    raise ValueError(f"attention must be one of {ATTENTION_KINDS}, got {model['attention']!r}")


def _attention_params(model: dict) -> int:
    """Weights of one attention block, including its internal norms (no biases in these models)."""
    hidden, heads = model["hidden_size"], model["attention_heads"]
    if model["attention"] == "gqa":
        head_dim, kv_heads = model["head_dim"], model["kv_heads"]
        q_and_o = 2 * hidden * heads * head_dim
        k_and_v = 2 * hidden * kv_heads * head_dim
        return q_and_o + k_and_v
    # MLA, as in DeepSeek-V2/V3 (q_a_proj, q_a_layernorm, q_b_proj, kv_a_proj_with_mqa, kv_a_layernorm,
    # kv_b_proj, o_proj).
    q_lora, kv_lora = model["q_lora_rank"], model["kv_lora_rank"]
    nope, rope, v_dim = model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]
    q_head = nope + rope
    if q_lora > 0:
        query = hidden * q_lora + q_lora + q_lora * heads * q_head
    else:
        query = hidden * heads * q_head
    kv_down = hidden * (kv_lora + rope) + kv_lora  # latent + shared RoPE key, and the latent's norm
    kv_up = kv_lora * heads * (nope + v_dim)
    output = heads * v_dim * hidden
    return query + kv_down + kv_up + output


def _layer_params(model: dict, moe: bool) -> tuple[int, int]:
    """(total, active) weights of one transformer layer: attention, two RMSNorms, FFN or MoE."""
    hidden = model["hidden_size"]
    common = _attention_params(model) + 2 * hidden
    if not moe:
        ffn = 3 * hidden * model["dense_ffn"]  # SwiGLU: gate, up, down
        return common + ffn, common + ffn
    expert = 3 * hidden * model["expert_ffn"]
    router = model["experts"] * hidden  # every token is scored against every expert
    total = common + router + (model["experts"] + model["shared_experts"]) * expert
    active = common + router + (model["active_experts"] + model["shared_experts"]) * expert
    return total, active


def _mtp_params(model: dict) -> tuple[int, int]:
    """(total, active) weights of the MTP modules, excluding the embedding and head they share."""
    modules = model["mtp_layers"]
    if modules == 0:
        return 0, 0
    hidden = model["hidden_size"]
    # enorm + hnorm, eh_proj (2*hidden -> hidden), one transformer layer shaped like the main model's
    # last layer, and the shared head's own final norm.
    glue = 2 * hidden + 2 * hidden * hidden + hidden
    layer_total, layer_active = _layer_params(model, moe=model["experts"] > 0)
    return modules * (glue + layer_total), modules * (glue + layer_active)


def param_counts(model: dict, include_mtp: bool = False) -> tuple[float, float]:
    """Total and per-token active parameter counts computed from the model's shape.

    Counted: the input embedding and the (untied) output head, ``vocab * hidden_size`` each; per layer
    two RMSNorms and the attention projections (GQA: q, k, v, o; MLA: the low-rank query, the KV latent
    down-projection with its shared RoPE key, the KV up-projection, o, and the two latent norms); SwiGLU
    FFNs (three matrices) in the ``dense_layers`` dense layers; in each MoE layer every routed and shared
    expert plus the router matrix; the final norm. Not counted: the few-hundred-element router bias of
    DeepSeek's auxiliary-loss-free balancing, and anything not in the weights (rotary tables).

    Active counts everything a token touches: all of the above except that each MoE layer contributes
    ``active_experts + shared_experts`` experts instead of all of them. The input embedding is counted
    as active (a lookup rather than a matrix product; DeepSeek's 36.6B figure leaves it out).

    Parameters
    ----------
    model : dict
        A model entry.
    include_mtp : bool
        Add the multi-token-prediction modules (``mtp_layers``), which reuse the embedding and head.
        Published totals (DeepSeek-V3: 671B) exclude them.

    Returns
    -------
    (float, float)
        (total, active) parameter counts, in parameters (not billions).
    """
    hidden = model["hidden_size"]
    layers, dense = model["layers"], model["dense_layers"]
    if not 0 <= dense <= layers:
        raise ValueError(f"dense_layers must be between 0 and layers ({layers}), got {dense}")
    if layers > dense and model["experts"] == 0:
        raise ValueError("a model with MoE layers (dense_layers < layers) needs experts > 0")
    dense_total, _ = _layer_params(model, moe=False) if dense else (0, 0)
    moe_total, moe_active = _layer_params(model, moe=True) if layers > dense else (0, 0)
    embeddings = 2 * model["vocab"] * hidden + hidden  # input embedding, output head, final norm
    total = embeddings + dense * dense_total + (layers - dense) * moe_total
    active = embeddings + dense * dense_total + (layers - dense) * moe_active
    if include_mtp:
        mtp_total, mtp_active = _mtp_params(model)
        total, active = total + mtp_total, active + mtp_active
    return float(total), float(active)


def weight_bytes(model: dict, bytes_per_param: float, include_mtp: bool = False) -> float:
    """Bytes needed to hold all of the model's weights at ``bytes_per_param`` (BF16: 2, FP8: 1, FP4: 0.5).

    Uses the total of :func:`param_counts` (every expert is resident somewhere); quantization scales and
    other per-block metadata are not included. ``include_mtp`` adds the MTP modules, which a deployment
    that uses them for speculative decoding must also hold.
    """
    total, _ = param_counts(model, include_mtp=include_mtp)
    return total * bytes_per_param


def kernel_evidence(name: str, gemm_surface: str | None = None) -> tuple[str, str]:
    """What the roofline knows of an accelerator's kernels: ``(kind, sentence)``, kind one of ``"measured"`` (its
    own measured GEMMs, element-wise kernels and collectives), ``"borrowed"`` (another GPU's, of the same SMs
    and tensor cores, at its own peaks and bandwidths) or ``"none"`` (a roofline at the catalog's peaks whose
    efficiencies are uncertain inputs, ``performance.unmeasured_*``: unmeasured, and expected optimistic).
    ``gemm_surface`` is the scenario's own value where it overrides the catalog's."""
    kind, text = _bf16_evidence(name, gemm_surface)
    entry = hardware_preset(name)
    for dtype in ("fp8", "fp4"):
        own = str(entry.get(f"gemm_{dtype}_surface", "") or "")
        if own:
            label = dtype.upper()
            text += (f"; {label} GEMMs from the measured surface {own}.toml (AIConfigurator's vLLM tables)"
                     if own == f"{name}-{dtype}" else f"; {label} GEMMs from {own.split('-')[0]}'s measured {label} "
                     "surface")
    if kind == "none":
        return kind, text
    experts = [label for prefix, label in (("experts_", "BF16"), ("experts_fp8_", "FP8"), ("experts_fp4_", "FP4"))
               if entry.get(prefix + "flops_fraction", 0) > 0]
    if experts:
        source = str(entry.get("experts_surface", "") or "").split("-")[0] or name
        text += (f"; routed experts as vLLM 0.24.0's fused MoE kernel ({' and '.join(experts)}), "
                 + ("measured" if source == name else f"{source}'s"))
    if entry.get("mla_floor_us", 0) > 0:
        source = name if kind == "measured" else str(entry.get("gemm_surface", "") or name).split("-")[0]
        text += f"; MLA attention from DeepSeek-V3's attention modules measured on {source.upper()} (vLLM 0.24.0)"
    if entry.get("deepep_table", ""):
        table = str(entry["deepep_table"])
        gpu, version = table.split("_sglang_")
        text += (f"; DeepEP all-to-all from dispatches and combines measured on {gpu.upper()} under SGLang {version}"
                 + ("" if gpu == name else " (its NICs and NVLink at this GPU's)"))
    return kind, text


def _bf16_evidence(name: str, gemm_surface: str | None) -> tuple[str, str]:
    surface = hardware_preset(name).get("gemm_surface", "") if gemm_surface is None else gemm_surface
    surface = str(surface or "")
    if surface in ("", "none"):
        return "none", (f"{name}: no measured kernels; a roofline at the catalog's peaks with uncertain "
                        "efficiencies (performance.unmeasured_flops_fraction and unmeasured_bandwidth_fraction, "
                        "drawn per sample: a judgement; unmeasured, likely optimistic)")
    if surface.lower().startswith(f"{name.lower()}-"):  # fitted to a serving engine's kernel tables
        entry = hardware_preset(name)
        what = "GEMMs and attention kernels" if entry.get("attention_floor_us", 0) > 0 else "GEMMs"
        elementwise = entry.get("kernel_floor_us", 0) > 0
        collectives = entry.get("collective_hop_us", 0) > 0 or entry.get("collective_base_us", 0) > 0
        rest = ("element-wise kernels and NCCL collectives by fitted figures, its own or H100's (the catalog's "
                "comments say which)" if elementwise and collectives
                else "NCCL collectives by its own fitted figures; element-wise kernels not measured (the generic "
                     "model)" if collectives
                else "element-wise kernels and collectives not measured (the generic model)")
        return "measured", f"{name}: {what} measured under vLLM 0.24.0 (the bundled {surface}.toml); {rest}"
    if surface.lower() == name.lower():
        entry = hardware_preset(name)
        if entry.get("kernel_floor_us", 0) > 0 and entry.get("collective_hop_us", 0) > 0:
            return "measured", f"{name}: GEMMs, element-wise kernels and NCCL collectives measured (bundled profiles)"
        return "measured", (f"{name}: GEMMs measured (the bundled surface {surface}.toml); element-wise kernels and "
                            "collectives not measured (the generic model)")
    if surface.endswith(".toml"):
        return "measured", f"{name}: GEMMs from the measured surface {Path(surface).name}"
    return "borrowed", (f"{name}: not measured itself; {surface.split('-')[0]}'s measured kernels (the same SMs and "
                        "tensor cores) at its own peaks and bandwidths")

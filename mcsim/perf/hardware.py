"""The accelerator as a typed object: peaks per number format, HBM, links, power and price.

Every performance module reads hardware through :class:`Hardware` (``hw.peak_flops("fp8")``, ``hw.hbm_bytes_s``)
instead of scanning a dict for key names. :func:`as_hardware` turns a catalog entry (``mcsim.scenario.catalog``)
or a sample's resolved ``hardware.*`` parameters into one, so callers may pass either.

Examples
--------
>>> from mcsim.scenario import catalog
>>> h100 = as_hardware(catalog.hardware_preset("h100"))
>>> h100.peak_flops("fp8") / 1e12, h100.peak_flops("fp4") == h100.peak_flops("fp8")  # no FP4: falls back
(1978.9, True)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields

from mcsim.perf.fused_moe import EXPERTS_CLASSES, ExpertFigures
from mcsim.perf.gemm_surface import for_hardware
from mcsim.scenario.schema import UNMEASURED_STAND_INS

#: Number formats from the narrowest up; a format the hardware lacks falls back to the next wider one.
FORMATS = ("fp4", "fp8", "bf16", "fp32")


@dataclass(frozen=True)
class Hardware:
    """One accelerator (figures per GPU).

    Attributes
    ----------
    name : str
    tflops : dict
        Dense peak TFLOP/s per number format (``fp32``, ``bf16``, ``fp8``, ``fp4``; 0 where unsupported).
    hbm_gb, hbm_tb_s : float
        HBM capacity (GB) and bandwidth (TB/s).
    scale_up_gb_s, scale_out_gb_s, host_link_gb_s : float
        One-direction bandwidth of the scale-up link (NVLink), the scale-out network and the host link, GB/s.
    gpus_per_node : int
        GPUs in one scale-up node.
    collective_base_us, collective_hop_us, allreduce_bus_gb_s : float
        Fitted NCCL figures inside a node: the fixed cost of one collective, the latency of one hop and the
        achieved all-reduce bandwidth per direction (0 where not measured).
    custom_allreduce_hop_us, custom_allreduce_gb_s : float
        The serving engine's own all-reduce inside a node (one-shot / two-shot over NVLink): latency of one stage and
        the bandwidth its kernels reach (0 where it has none; :mod:`mcsim.perf.collectives`).
    remote_allreduce_base_us, remote_allreduce_bus_gb_s : float
        Fitted NCCL all-reduce figures across nodes (groups of whole nodes): fixed cost and bus bandwidth per GPU
        (0 where not measured).
    send_base_us, send_gb_s, remote_send_base_us, remote_send_gb_s : float
        Fitted NCCL point-to-point figures inside a node and between nodes: fixed cost and achieved bandwidth
        (0 where not measured).
    gemm_flops_fraction, gemm_bandwidth_fraction, gemm_half_tokens, gemm_floor_us : float
        Fitted GEMM figures: the largest share of the matmul peak, the share of HBM bandwidth of weight streaming,
        the rows at which half the largest FLOP share is reached, and the fixed time of one GEMM kernel (0 where
        not measured; see :func:`performance_defaults`).
    gemm_surface : str
        The bundled calibration whose GEMM surface corrects each GEMM by its shape ("" where none; see
        :mod:`mcsim.perf.gemm_surface`).
    gemm_fp8_flops_fraction, gemm_fp8_bandwidth_fraction, gemm_fp8_half_tokens, gemm_fp8_floor_us : float
        The same four figures fitted to measured FP8 GEMMs (0 where not measured: FP8 GEMMs then take the BF16
        figures at the FP8 peak).
    gemm_fp8_surface : str
        The bundled calibration whose FP8 GEMM surface corrects each FP8 GEMM by its shape ("" where none).
    gemm_fp4_flops_fraction, gemm_fp4_bandwidth_fraction, gemm_fp4_half_tokens, gemm_fp4_floor_us, gemm_fp4_surface
        The same for FP4 GEMMs (NVFP4 on Blackwell; 0 and "" where not measured).
    kernel_floor_us, elementwise_bandwidth_fraction : float
        Fitted element-wise kernel figures: the fixed time of one kernel and the share of HBM bandwidth the
        kernels reach (0 where not measured).
    attention_floor_us, attention_bandwidth_fraction, attention_unit_ns, attention_flops_fraction, \
    attention_prefill_bandwidth_fraction, attention_half_work, attention_head_dim_half, attention_half_context, \
    attention_fp8_kv_bandwidth_fraction, attention_fp8_kv_unit_ns : float
        Fitted GQA attention kernel figures (:class:`mcsim.perf.roofline.AttentionFigures`, with the fixed time of
        one call; 0 where not measured: attention then takes the GEMM figures).
    experts_flops_fraction, experts_weight_bandwidth_fraction, experts_stream_bandwidth_fraction, \
    experts_half_rows, experts_floor_us, experts_tile_ns : float
        Fitted fused-MoE kernel figures of BF16 routed experts (:class:`mcsim.perf.fused_moe.ExpertFigures`; 0 where
        not measured: the experts are then priced as grouped GEMMs at the GEMM figures).
    experts_surface : str
        The bundled calibration (or a calibration file's path) whose measured surface corrects them by shape.
    experts_fp8_flops_fraction, ... experts_fp8_tile_ns, experts_fp8_surface
        The same of block-scaled FP8 routed experts; ``experts_fp4_*`` of NVFP4 ones.
    mla_floor_us, mla_bandwidth_fraction, mla_unit_ns, mla_flops_fraction, mla_prefill_bandwidth_fraction, \
    mla_half_work, mla_half_context : float
        Fitted MLA attention figures (DeepSeek-V3's module, its projections at the GEMM figures): the module's fixed
        time beyond its GEMMs' and the attention call's :class:`mcsim.perf.roofline.AttentionFigures` (0 where not
        measured: MLA attention then takes the roofline).
    mla_fp8_kv_floor_us, mla_fp8_kv_bandwidth_fraction, mla_fp8_kv_unit_ns : float
        The module's fixed time and the decode call's figures over an FP8 cache (0: the BF16 cache's).
    deepep_table : str
        The bundled export of DeepEP's measured dispatches and combines that prices its all-to-all modes on this GPU
        (:mod:`mcsim.perf.deepep`; "" where none: they take the analytic hierarchical model).
    tdp_w, idle_w : float
        Board power limit and idle power, W.
    price_usd, rental_usd_per_hour : float
        Purchase price and on-demand rental price.
    """

    name: str
    tflops: dict
    hbm_gb: float
    hbm_tb_s: float
    scale_up_gb_s: float
    scale_out_gb_s: float
    host_link_gb_s: float
    gpus_per_node: int
    collective_base_us: float = 0.0
    collective_hop_us: float = 0.0
    allreduce_bus_gb_s: float = 0.0
    custom_allreduce_hop_us: float = 0.0
    custom_allreduce_gb_s: float = 0.0
    remote_allreduce_base_us: float = 0.0
    remote_allreduce_bus_gb_s: float = 0.0
    send_base_us: float = 0.0
    send_gb_s: float = 0.0
    remote_send_base_us: float = 0.0
    remote_send_gb_s: float = 0.0
    gemm_flops_fraction: float = 0.0
    gemm_bandwidth_fraction: float = 0.0
    gemm_half_tokens: float = 0.0
    gemm_floor_us: float = 0.0
    gemm_surface: str = ""
    gemm_fp8_flops_fraction: float = 0.0
    gemm_fp8_bandwidth_fraction: float = 0.0
    gemm_fp8_half_tokens: float = 0.0
    gemm_fp8_floor_us: float = 0.0
    gemm_fp8_surface: str = ""
    gemm_fp4_flops_fraction: float = 0.0
    gemm_fp4_bandwidth_fraction: float = 0.0
    gemm_fp4_half_tokens: float = 0.0
    gemm_fp4_floor_us: float = 0.0
    gemm_fp4_surface: str = ""
    kernel_floor_us: float = 0.0
    elementwise_bandwidth_fraction: float = 0.0
    attention_floor_us: float = 0.0
    attention_bandwidth_fraction: float = 0.0
    attention_unit_ns: float = 0.0
    attention_flops_fraction: float = 0.0
    attention_prefill_bandwidth_fraction: float = 0.0
    attention_half_work: float = 0.0
    attention_head_dim_half: float = 0.0
    attention_half_context: float = 0.0
    attention_fp8_kv_bandwidth_fraction: float = 0.0
    attention_fp8_kv_unit_ns: float = 0.0
    experts_flops_fraction: float = 0.0
    experts_weight_bandwidth_fraction: float = 0.0
    experts_stream_bandwidth_fraction: float = 0.0
    experts_half_rows: float = 0.0
    experts_floor_us: float = 0.0
    experts_tile_ns: float = 0.0
    experts_surface: str = ""
    experts_fp8_flops_fraction: float = 0.0
    experts_fp8_weight_bandwidth_fraction: float = 0.0
    experts_fp8_stream_bandwidth_fraction: float = 0.0
    experts_fp8_half_rows: float = 0.0
    experts_fp8_floor_us: float = 0.0
    experts_fp8_tile_ns: float = 0.0
    experts_fp8_surface: str = ""
    experts_fp4_flops_fraction: float = 0.0
    experts_fp4_weight_bandwidth_fraction: float = 0.0
    experts_fp4_stream_bandwidth_fraction: float = 0.0
    experts_fp4_half_rows: float = 0.0
    experts_fp4_floor_us: float = 0.0
    experts_fp4_tile_ns: float = 0.0
    experts_fp4_surface: str = ""
    deepep_table: str = ""
    mla_floor_us: float = 0.0
    mla_bandwidth_fraction: float = 0.0
    mla_unit_ns: float = 0.0
    mla_flops_fraction: float = 0.0
    mla_prefill_bandwidth_fraction: float = 0.0
    mla_half_work: float = 0.0
    mla_half_context: float = 0.0
    mla_fp8_kv_floor_us: float = 0.0
    mla_fp8_kv_bandwidth_fraction: float = 0.0
    mla_fp8_kv_unit_ns: float = 0.0
    tdp_w: float = 0.0
    idle_w: float = 0.0
    price_usd: float = 0.0
    rental_usd_per_hour: float = 0.0

    def gemm_dtype_figures(self, compute: str) -> tuple | None:
        """The measured GEMM figures of a low-precision compute dtype (``"fp8"``, ``"fp4"``): ``(flops_fraction,
        bandwidth_fraction, half_tokens, floor_s, surface)``, or None where that dtype's GEMMs were not measured."""
        if compute not in ("fp8", "fp4") or getattr(self, f"gemm_{compute}_flops_fraction") <= 0:
            return None
        return (getattr(self, f"gemm_{compute}_flops_fraction"), getattr(self, f"gemm_{compute}_bandwidth_fraction"),
                getattr(self, f"gemm_{compute}_half_tokens"), getattr(self, f"gemm_{compute}_floor_us") * 1e-6,
                getattr(self, f"gemm_{compute}_surface"))

    def expert_figures(self, compute: str) -> ExpertFigures | None:
        """The measured fused-MoE figures of routed experts computed in ``compute`` (``"bf16"``, ``"fp8"``), or None
        where that dtype's fused MoE kernels were not measured."""
        cls = EXPERTS_CLASSES.get(compute)
        prefix = cls + "_" if cls else None
        if prefix is None or getattr(self, prefix + "flops_fraction") <= 0:
            return None
        get = functools.partial(getattr, self)
        return ExpertFigures(get(prefix + "flops_fraction"), get(prefix + "weight_bandwidth_fraction"),
                             get(prefix + "stream_bandwidth_fraction"), get(prefix + "half_rows"),
                             get(prefix + "floor_us") * 1e-6, get(prefix + "tile_ns") * 1e-9,
                             for_hardware(get(prefix + "surface"), prefix.rstrip("_")))

    def peak_flops(self, compute: str) -> float:
        """Dense peak FLOP/s of ``compute``, or of the next wider format the hardware has."""
        for dtype in FORMATS[FORMATS.index(compute):]:
            if self.tflops.get(dtype, 0.0) > 0:
                return self.tflops[dtype] * 1e12
        raise ValueError(f"hardware {self.name!r} has no peak for {compute} or any wider format")

    @property
    def hbm_bytes(self) -> float:
        """HBM capacity, bytes."""
        return self.hbm_gb * 1e9

    @property
    def hbm_bytes_s(self) -> float:
        """HBM bandwidth, bytes/s."""
        return self.hbm_tb_s * 1e12


def as_hardware(entry) -> Hardware:
    """A :class:`Hardware` from a catalog entry, a sample's ``hardware.*`` parameters, or a Hardware (as is).

    Missing links and node size default to what a lone accelerator has (no network, one GPU per node), so a
    minimal entry such as ``{"hbm_gb": 80, "hbm_tb_s": 3.35, "bf16_tflops": 989}`` is enough for the parts of the
    model that need only those.
    """
    if isinstance(entry, Hardware):
        return entry
    entry = dict(entry)
    if any(k.startswith("hardware.") for k in entry):  # a sample's parameters: keep the hardware section
        entry = {k.split(".", 1)[1]: v for k, v in entry.items() if k.startswith("hardware.")}
    numbers = {f.name: float(entry.get(f.name, 0.0))  # every other field is a figure, 0 where not given
               for f in fields(Hardware) if f.name not in ("name", "tflops", "gpus_per_node", *NAME_FIELDS)}
    return Hardware(name=str(entry.get("name", entry.get("preset", ""))),
                    **{name: str(entry.get(name, "")) for name in NAME_FIELDS},
                    tflops={dtype: float(entry.get(f"{dtype}_tflops", 0.0)) for dtype in FORMATS},
                    gpus_per_node=int(entry.get("gpus_per_node", 1)), **numbers)


#: The catalog's fields that name a measured surface (a bundled calibration, or a calibration file's path).
SURFACE_FIELDS = ("gemm_surface", "gemm_fp8_surface", "gemm_fp4_surface",
                  *(f"{cls}_surface" for cls in EXPERTS_CLASSES.values()))
#: The catalog's fields that name something bundled (text, not figures).
NAME_FIELDS = (*SURFACE_FIELDS, "deepep_table")
#: The catalog's measured GQA attention figures (:class:`mcsim.perf.roofline.AttentionFigures`, and the call's floor).
ATTENTION_FIELDS = ("attention_floor_us", "attention_bandwidth_fraction", "attention_unit_ns",
                    "attention_flops_fraction", "attention_prefill_bandwidth_fraction", "attention_half_work",
                    "attention_head_dim_half", "attention_half_context", "attention_fp8_kv_bandwidth_fraction",
                    "attention_fp8_kv_unit_ns")
#: What the roofline assumes where neither the scenario nor the hardware catalog gives a figure. Kernel floors are
#: 0 (not modelled) on hardware without measurements, as the catalog says.
GENERIC = {"performance.flops_fraction": 0.6, "performance.bandwidth_fraction": 0.8,
           "performance.gemm_half_tokens": 0.0, "performance.gemm_floor_s": 0.0,
           "performance.kernel_floor_s": 0.0, "performance.elementwise_bandwidth_fraction": 0.8}
#: Scenario keys whose defaults are fitted to measurements (the catalog's figures of the hardware): a scenario that
#: sets one overrides a measurement, and a bundled scenario says why on the same line.
FITTED_KEYS = (*GENERIC, "performance.attention_floor_s", "performance.gemm_surface",
               "performance.collective_latency_s", "hardware.collective_base_us", "hardware.collective_hop_us",
               "hardware.allreduce_bus_gb_s", "hardware.remote_allreduce_base_us", "hardware.remote_allreduce_bus_gb_s",
               "hardware.send_base_us", "hardware.send_gb_s", "hardware.remote_send_base_us",
               "hardware.remote_send_gb_s", "hardware.custom_allreduce_hop_us", "hardware.custom_allreduce_gb_s",
               "hardware.gemm_flops_fraction", "hardware.gemm_bandwidth_fraction", "hardware.gemm_half_tokens",
               "hardware.gemm_floor_us", "hardware.gemm_surface", "hardware.kernel_floor_us",
               "hardware.elementwise_bandwidth_fraction", *(f"hardware.{k}" for k in ATTENTION_FIELDS))
#: Kernels of one attention call that pay the element-wise kernel floor (KV-cache write, attention, reshape); the
#: attention floor defaults to that many kernel floors where the hardware's attention kernels were not measured.
ATTENTION_CALL_KERNELS = 3


def performance_defaults(p: dict) -> dict:
    """A sample's parameters with every roofline input left at 0 ("the hardware's") filled in.

    Where each default comes from:

    * ``performance.flops_fraction``, ``bandwidth_fraction``, ``gemm_half_tokens``, ``gemm_floor_s``: the hardware
      catalog's GEMM figures (``gemm_*``), fitted by ``mcsim calibrate`` to measured GEMM times (H100, H200, B200:
      the GEMMs AIConfigurator's database times under vLLM 0.24.0, ``mcsim/data/measurements/aiconfigurator/``;
      A100: Vidur's per-layer profiles, ``mcsim/data/measurements/vidur/``);
    * ``performance.kernel_floor_s``, ``elementwise_bandwidth_fraction``: the catalog's ``kernel_floor_us`` and
      ``elementwise_bandwidth_fraction``, fitted the same way to the measured RMSNorm, RoPE, SwiGLU and residual-add
      kernels of Vidur's files (H100, A100);
    * ``performance.attention_floor_s``: the catalog's ``attention_floor_us`` for a GQA model on hardware whose
      attention kernels were measured, its ``mla_floor_us`` (``mla_fp8_kv_floor_us`` over an FP8 cache) for an MLA
      model on hardware whose MLA modules were, else :data:`ATTENTION_CALL_KERNELS` kernel floors (an assumption; a
      whole-step calibration fits it);
    * for an accelerator without fitted GEMM figures, ``performance.unmeasured_flops_fraction`` and
      ``unmeasured_bandwidth_fraction`` (drawn per sample: uncertain, not measured);
    * otherwise :data:`GENERIC`.
    """
    keys = [k for k in GENERIC if p.get(k, None) == 0]
    attention = p.get("performance.attention_floor_s", None) == 0
    if not keys and not attention:
        return p
    hw = as_hardware(p)
    figures = gemm_figures(hw, unmeasured={
        own: p[stand_in] for stand_in, (own, _) in UNMEASURED_STAND_INS.items()
        if isinstance(p.get(stand_in), (int, float))})
    out = {**p, **{key: value for key, value in figures.items() if key in keys}}
    if attention:  # the measured call's, else from the kernel floor in force (the scenario's own or the hardware's)
        kind = p.get("model.attention", "gqa")
        fp8_cache = p.get("precision.enabled", False) and p.get("precision.kv_bytes", 2.0) == 1.0
        mla = hw.mla_fp8_kv_floor_us if fp8_cache and hw.mla_fp8_kv_floor_us > 0 else hw.mla_floor_us
        measured = hw.attention_floor_us if kind == "gqa" else mla if kind == "mla" else 0.0
        out["performance.attention_floor_s"] = measured * 1e-6 if measured > 0 \
            else ATTENTION_CALL_KERNELS * out.get("performance.kernel_floor_s", 0.0)
    return out


def gemm_figures(hw: Hardware, unmeasured: dict | None = None) -> dict:
    """The roofline's fitted kernel inputs for ``hw`` (``performance.*`` keys): its fitted figures, where it has
    none ``unmeasured``'s (a sample's draws of the stand-ins, by the key they stand in for), else
    :data:`GENERIC`."""
    fitted = {"performance.flops_fraction": hw.gemm_flops_fraction,
              "performance.bandwidth_fraction": hw.gemm_bandwidth_fraction,
              "performance.gemm_half_tokens": hw.gemm_half_tokens,
              "performance.gemm_floor_s": hw.gemm_floor_us * 1e-6,
              "performance.kernel_floor_s": hw.kernel_floor_us * 1e-6,
              "performance.elementwise_bandwidth_fraction": hw.elementwise_bandwidth_fraction}
    fallback = {**GENERIC, **(unmeasured or {})}
    return {key: value if value > 0 else fallback[key] for key, value in fitted.items()}

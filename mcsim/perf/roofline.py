"""Stage 5, roofline fidelity: step time, memory and operating point from the model's shape and the hardware.

One forward step of one serving instance is costed op by op, per GPU. Each op's time is its roofline,

    t_op = max(flops / (peak x flops_fraction), bytes / (hbm_bw x bandwidth_fraction)),

the step is the sum of the ops over the layers a GPU holds, plus the communication left exposed after
overlap, plus launch and per-step overheads. All quantities are per GPU of the instance; the slowest GPU
sets the step (the expert-parallel rank that carries ``hot_rank_factor`` times the mean load).

Layout of an instance (``gpus = tp x pp x attention_dp``)
----------------------------------------------------------
* Layers are split evenly over ``pp`` pipeline stages; a stage has ``tp x attention_dp`` GPUs.
* Attention, dense FFNs, shared experts and the output head are tensor-parallel over ``tp`` (heads,
  intermediate columns, vocabulary rows) and replicated over ``attention_dp`` groups; the step's sequences
  and tokens are split evenly over the ``attention_dp`` groups.
* Routed experts are split over ``ep`` ranks (``ep`` divides ``tp x attention_dp``); each rank is
  ``etp = tp x attention_dp / ep`` GPUs that shard its experts by columns, so every GPU holds
  ``1 / (tp x attention_dp)`` of each MoE layer's routed weights.
* Examples: Llama-70B on 8 GPUs ``Parallelism(tp=8)``; Mixtral on 8 GPUs ``Parallelism(tp=8, ep=8)``;
  DeepSeek-V3 decode on 144 GPUs (as DeepSeek published) ``Parallelism(tp=1, attention_dp=144, ep=144)``:
  every GPU runs attention and the shared expert for its own sequences, two routed experts, and the
  all-to-all moves tokens between them.

FLOPs and bytes per layer and GPU
---------------------------------
``n`` = tokens of the step per attention-DP group (decode sequences x ``verify_tokens`` + prefill tokens,
divided by ``attention_dp``); ``h`` = hidden size; matmul FLOPs are 2 per weight per token.

* attention_proj: 2 n P_attn FLOPs, P_attn the attention weights on the GPU (GQA: q and o over ``tp``
  heads, k and v over ``ceil(kv_heads / tp)`` heads, i.e. replicated when ``kv_heads < tp``; MLA: q_b,
  kv_b and o over ``tp`` heads, the down-projections q_a and kv_a replicated, as vLLM and SGLang shard them).
  With weight absorption (decode) the absorbed W_UK / W_UV products use the kv_b weights once per token,
  so the count is the same.
* attention_core (always at the BF16 peak), per token of context ``c``:
  GQA ``4 x heads x head_dim x c`` (QK^T and PV); MLA decode with weight absorption (DeepSeek-V2 paper,
  section 2.1.3; FlashMLA runs it as MQA with 576-wide keys and 512-wide values)
  ``2 x heads x (2 kv_lora_rank + qk_rope_head_dim) x c``; MLA prefill runs in MHA form
  (``2 x heads x (qk_nope + qk_rope + v_head) x c`` per token), which first up-projects the cached prefix
  latent, ``2 x c_prefix x kv_lora_rank x heads x (qk_nope + v_head)`` once per chunk (vLLM's MLA backend
  documents this compute-friendly prefill / data-movement-friendly decode split). Heads split over ``tp``.
  KV bytes: each decode *sequence* reads its context once however many tokens it verifies (the k + 1
  tokens of a speculative pass share the read); a prefill chunk reads ``prefill_context`` tokens once;
  every new token writes its KV. ``attention_window`` caps the context (sliding window); ``sparse_topk``
  caps it at the top-k tokens (DeepSeek sparse attention) and adds the lightning indexer, which scores
  the whole (windowed) context: ``2 x 64 x 128`` FLOPs per context token and 128 FP8 bytes per cached
  token (DeepSeek-V3.2-Exp config: index_n_heads 64, index_head_dim 128), replicated over ``tp``.
* dense_ffn / shared_expert: SwiGLU, ``3 h F / tp`` weights. router: ``E h`` weights kept in BF16 and
  replicated (tiny). lm_head: ``vocab h / tp`` weights, on the last stage, for every decode token and one
  row per prefill chunk (the prompt's last token).
* moe_ffn: the instance routes ``T k`` token-expert pairs; the slowest rank computes
  ``hot_rank_factor x T k / ep`` of them and reads the weights of the distinct experts it holds,
  ``distinct_experts / ep`` (default: the expected distinct experts under uniform routing,
  ``E (1 - (1 - k/E)^T)``; the expert stage's skew-aware count at its own tokens a step, scaled to the step's by
  that expectation's ratio), each sharded over ``etp``. Where the routed experts' compute dtype has measured fused
  MoE kernels on the GPU (``Achievable.moe``), those pairs and experts are one fused kernel priced from its own
  figures (:mod:`mcsim.perf.fused_moe`: fixed time, weights and activations at their own bandwidth shares, a cost
  per output tile); else two grouped GEMMs at the GEMM figures, a SwiGLU and the casts.
* Activations: every matmul reads its input and writes its output once.
* elementwise: the element-wise ops (per layer two RMSNorms, RoPE, the SwiGLU activation of each FFN and two
  residual adds) move their bytes (RMSNorm 2h, residual add 3h, RoPE 2 x the rotated widths, SwiGLU 3 x the
  intermediate width, per token) at ``elementwise_bandwidth_fraction`` of HBM bandwidth; without fused kernels
  each is a kernel of its own that also costs ``kernel_floor_s``. Fused kernels (fused add + RMSNorm, SwiGLU in
  the GEMM's epilogue) save those floors and half the launches, not the data: the bytes stay.

Communication: two TP all-reduces of ``n h`` activations per layer (after attention and after the FFN),
a dispatch and a combine all-to-all per MoE layer (the hot rank receives ``hot_rank_factor`` times the
mean), and one activation send per pipeline boundary; formulas in :mod:`mcsim.perf.collectives`. The TP all-reduce
runs as a serving engine runs it (``Collectives.allreduce_impl``: its own one-shot / two-shot kernels inside a node,
NCCL beyond) and is exposed whole unless ``allreduce_overlap`` says a fused kernel hides some of it; a fraction
``overlap`` of the all-to-all and the sends hides behind compute (two micro-batches, each communicating while the
other computes), but never more in all than the step's compute: a step is never shorter than its communication
(:func:`hidden_communication`).

Kernel floors and overheads. Every kernel has a minimum GPU time however small its work (launch latency on the
GPU, ramp-up and tail of too few thread blocks): ``gemm_floor_s`` per GEMM, ``kernel_floor_s`` per element-wise
kernel and ``attention_floor_s`` per attention call (its KV-cache write, the attention kernel and the output
reshape). CUDA graphs do not remove these GPU-side floors; they remove most of the host's launch cost:
``kernels_per_layer x layers`` launches at ``launch_overhead_s`` each (a tenth with CUDA graphs, half the
kernels with fused kernels), plus ``step_overhead_s`` of host work per step (scheduling, sampling, input
preparation). Defaults, and where they come from: :func:`mcsim.perf.hardware.performance_defaults`.

Model error. Each measured op class has a multiplier on its modelled time (``Achievable.errors``, 1 = none):
a calibration (``mcsim calibrate``) draws it per Monte Carlo sample from the fit's residuals, so the spread of
the model against measurements reaches the result's bands.

Pipeline parallelism: :func:`step_cost` costs one stage (the last, which also holds the output head) for
the batch it is given. Serving keeps ``pp`` micro-batches in flight, so :func:`~mcsim.perf.capacity.operating_point` and
:class:`~mcsim.perf.roofline_model.RooflineStepModel` split a step's sequences into ``pp`` micro-batches and report
``pp x t_step(micro-batch)``, the time in which every sequence advances one pass.

GEMMs by shape. Every GEMM (the QKV and output projections, :func:`attention_gemms`; each FFN's gate/up and down,
:func:`ffn_gemms`; the router and the output head) is priced on its own, ``M`` rows by ``N`` columns by depth ``K``,
and a measured surface (``Achievable.gemm_surface``, :mod:`mcsim.perf.gemm_surface`) corrects its time by its shape:
the tile and wave quantization and the kernel choice that one curve per GPU cannot follow.

What it leaves out: attention kernel efficiency at short context, stage imbalance
(uneven layer counts), the embedding lookup, quantization scales, and the indexer's key cache in memory.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from mcsim.perf import deepep
from mcsim.perf.collectives import alltoall_time, send_time, tp_allreduce
from mcsim.perf.fused_moe import EXPERTS_CLASSES, ExpertFigures, expert_stream_bytes, expert_tiles, experts_seconds
from mcsim.perf.hardware import Hardware, as_hardware
from mcsim.scenario import catalog

__all__ = [
    "Achievable",
    "AttentionFigures",
    "Collectives",
    "Memory",
    "OperatingPoint",
    "Parallelism",
    "Precision",
    "StepCost",
    "step_cost",
]

COMPUTE_DTYPES = ("fp32", "bf16", "fp8", "fp4")
#: Bytes per element of each compute format.
COMPUTE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0, "fp4": 0.5}
OPS = ("attention_proj", "attention_core", "dense_ffn", "moe_ffn", "shared_expert", "router", "lm_head",
       "elementwise", "tp_allreduce", "ep_alltoall", "pp_send", "overhead")
COMM_OPS = ("tp_allreduce", "ep_alltoall", "pp_send")
#: The ops that compute (neither communication nor the per-step overhead), in OPS order.
_COMPUTE_OPS = tuple(name for name in OPS if name not in COMM_OPS and name != "overhead")
#: Routers stay in BF16 in low-precision deployments (DeepSeek-V3 keeps gating in high precision).
ROUTER_WEIGHT_BYTES = 2.0
#: DeepSeek-V3.2-Exp lightning indexer: heads, head width and bytes per cached key element (FP8).
INDEXER_HEADS, INDEXER_HEAD_DIM, INDEXER_KEY_BYTES = 64, 128, 1.0
#: Launch cost with CUDA graph replay relative to eager launches.
GRAPH_LAUNCH_FRACTION = 0.1
#: Kernels of one attention call launched eagerly between graph pieces in piecewise mode (the KV-cache write and
#: the attention kernel: vLLM's ``unified_attention`` custom op, the graph's splitting op).
EAGER_ATTENTION_KERNELS = 2
#: Runtime launch mode of decode-only steps and of steps with prefill tokens, per ``cudagraph_mode`` (vLLM,
#: ``vllm/config/compilation.py``: ``CUDAGraphMode.decode_mode()`` and ``mixed_mode()``).
CUDAGRAPH_RUNTIME = {"none": ("none", "none"), "piecewise": ("piecewise", "piecewise"), "full": ("full", "full"),
                     "full_decode_only": ("full", "none"), "full_and_piecewise": ("full", "piecewise")}
#: Kernels left per layer when element-wise ops are fused into the matmuls.
FUSED_KERNEL_FRACTION = 0.5
#: Op classes a calibration measures, and the ops whose time each class's error multiplier scales.
ERROR_CLASSES = {"gemm": ("attention_proj", "dense_ffn", "moe_ffn", "shared_expert", "router", "lm_head"),
                 "elementwise": ("elementwise",), "allreduce": ("tp_allreduce",), "send": ("pp_send",),
                 "attention": ("attention_core",),
                 "allreduce_nodes": ("tp_allreduce",),
                 **{cls: ("moe_ffn",) for cls in EXPERTS_CLASSES.values()}, "mla": ("attention_core",)}


def launch_seconds(launches: float, layers: float, launch_s: float, mode: str, gpu_s: float = 0.0) -> float:
    """Launch time a step of ``launches`` kernels over ``layers`` layers leaves exposed in runtime ``mode``
    (``"none"``, ``"piecewise"``, ``"full"``), s.

    Every kernel costs the GPU ``GRAPH_LAUNCH_FRACTION x launch_s`` between kernels, in any mode (what a graph's
    replay of it costs). The host's launches are asynchronous: they run ahead of the GPU, so only what they take
    beyond the ``gpu_s`` the GPU is busy with the step is exposed. The host launches every kernel at ``launch_s``
    eagerly (``"none"``); in ``"piecewise"`` graphs, each layer's attention call (``EAGER_ATTENTION_KERNELS``)
    and the ``layers + 1`` graphs between them; in a ``"full"`` graph, one launch (nothing a step's GPU time does
    not hide). A short decode step is launch-bound eagerly and not in a graph; a long prefill step hides its
    eager launches.

    Examples
    --------
    >>> round(launch_seconds(1200, 80, 1e-5, "none") * 1e3, 2), round(launch_seconds(1200, 80, 1e-5, "full") * 1e3, 2)
    (13.2, 1.2)
    >>> round(launch_seconds(1200, 80, 1e-5, "piecewise") * 1e3, 2)  # 160 eager + 81 graphs, 1,200 gaps
    3.61
    >>> round(launch_seconds(1200, 80, 1e-5, "piecewise", gpu_s=0.030) * 1e3, 2)  # a 30 ms step hides the host
    1.2
    """
    if mode not in ("none", "piecewise", "full"):
        raise ValueError(f"runtime CUDA-graph mode must be none, piecewise or full; got {mode!r}")
    host = {"none": launches, "full": 0.0,
            "piecewise": min(EAGER_ATTENTION_KERNELS * layers, launches) + layers + 1}[mode] * launch_s
    return launches * launch_s * GRAPH_LAUNCH_FRACTION + max(0.0, host - gpu_s)


@dataclass(frozen=True)
class Precision:
    """Number formats.

    Attributes
    ----------
    weight_bytes : float
        Bytes per weight (BF16 2, FP8 1, FP4 0.5); the router stays at 2.
    kv_bytes : float
        Bytes per cached KV element.
    compute : {"fp32", "bf16", "fp8", "fp4"}
        Peak FLOP/s used by the linear and expert matmuls (the short form of ``linear`` and ``experts``); attention
        core always runs at BF16. A format the hardware lacks (peak 0) falls back to the next wider one
        (weight-only quantization).
    activation_bytes : float
        Bytes per activation element, in HBM traffic and on the wire.
    linear : str
        Compute format of the dense linear layers (attention projections, dense and shared-expert FFNs, LM head);
        "" = ``compute``. A GEMM whose format is narrower than the activations reads its input at that width and
        pays a cast kernel per input (unless fused into the kernel before it).
    experts : str
        Compute format of the routed experts' GEMMs; "" = ``linear``'s.
    expert_weight_bytes : float
        Bytes per routed-expert weight; 0 = ``weight_bytes`` (a 4-bit expert checkpoint beside 8-bit attention:
        0.5). Storage and compute are separate: 4-bit weights computed in FP8 stream half the bytes at FP8's rate.
    """

    weight_bytes: float = 2.0
    kv_bytes: float = 2.0
    compute: str = "bf16"
    activation_bytes: float = 2.0
    linear: str = ""
    experts: str = ""
    expert_weight_bytes: float = 0.0

    @property
    def linear_compute(self) -> str:
        """The dense linear layers' compute format."""
        return self.linear or self.compute

    @property
    def experts_compute(self) -> str:
        """The routed experts' compute format."""
        return self.experts or self.linear_compute

    @property
    def expert_weights(self) -> float:
        """Bytes per routed-expert weight."""
        return self.expert_weight_bytes or self.weight_bytes

    def input_bytes(self, compute: str) -> float:
        """Bytes per element of a GEMM's input in ``compute``: the activations' own, or the compute format's where
        it is narrower (the input is cast to it)."""
        return min(self.activation_bytes, COMPUTE_BYTES[compute])


@dataclass(frozen=True)
class Parallelism:
    """Parallel layout of one instance of ``tp x pp x attention_dp`` GPUs (see the module docstring).

    Attributes
    ----------
    tp : int
        Tensor-parallel degree of attention, dense FFN, shared experts and the output head.
    ep : int
        Expert-parallel ranks per stage; must divide ``tp x attention_dp``.
    pp : int
        Pipeline stages (layers split evenly).
    attention_dp : int
        Data-parallel attention groups per stage; sequences split evenly over them.
    """

    tp: int = 1
    ep: int = 1
    pp: int = 1
    attention_dp: int = 1

    @property
    def gpus(self) -> int:
        """GPUs of one instance."""
        return self.tp * self.pp * self.attention_dp


@dataclass(frozen=True)
class Collectives:
    """Collective algorithms and their overlap with compute.

    Attributes
    ----------
    allreduce : {"auto", "ring", "one-shot", "two-shot", "tree", "hierarchical"}
        ``auto``: the fastest for each message (see :func:`mcsim.perf.collectives.allreduce_time`).
    prefill_allreduce : str
        The all-reduce algorithm of steps with prefill tokens ("": ``allreduce``): prefill messages are thousands of
        tokens, decode messages a few, and engines may pick differently for the two.
    alltoall : {"direct", "hierarchical", "deepep_low_latency", "deepep_normal"}
        The EP all-to-all: analytic (:func:`mcsim.perf.collectives.alltoall_time`), or DeepEP's measured kernels
        (:mod:`mcsim.perf.deepep`) where the hardware has them (``Hardware.deepep_table``; else hierarchical).
    prefill_alltoall : str
        The all-to-all of steps with prefill tokens ("": ``alltoall``).
    overlap : float
        Fraction of the EP all-to-all and PP send time hidden behind compute (two micro-batches, DeepSeek's
        dual-batch overlap), in [0, 1], in a decode step; never more than the step computes
        (:func:`hidden_communication`).
    prefill_overlap : float, optional
        The same in a step with prefill tokens (None: ``overlap``): prefill and decode micro-batches hide
        differently (DeepSeek overlaps prefill's two micro-batches and splits decode's attention in two stages).
    allreduce_impl : {"auto", "nccl", "custom"}
        Who runs the TP all-reduce (:func:`mcsim.perf.collectives.tp_allreduce`): the engine's own kernels inside a
        node under 8 MiB and NCCL beyond (auto), NCCL always, or the engine's kernels for every message in a node.
    allreduce_overlap : float
        Fraction of the TP all-reduce hidden behind compute, in [0, 1]: 0 in a plain forward pass, where each
        all-reduce waits for the GEMM before it and the next waits for it; a lever (a GEMM fused with its all-reduce,
        as TensorRT-LLM's and Flux's kernels do).
    latency_s : float, optional
        Latency per collective step (hop), s; default the hardware's fitted hop latency (or 5 us).
    """

    allreduce: str = "auto"
    alltoall: str = "direct"
    overlap: float = 0.0
    latency_s: float | None = None
    prefill_overlap: float | None = None
    prefill_allreduce: str = ""
    allreduce_impl: str = "auto"
    allreduce_overlap: float = 0.0
    prefill_alltoall: str = ""


@dataclass(frozen=True)
class Achievable:
    """Achievable fractions of the hardware peaks and the fixed costs of a step.

    Attributes
    ----------
    flops_fraction, bandwidth_fraction, network_fraction : float
        Achievable share of peak FLOP/s, HBM bandwidth and link bandwidth.
    launch_overhead_s : float
        Cost of one eager kernel launch, s.
    kernels_per_layer : int
        Kernel launches per layer without fusion.
    cudagraph_mode : str
        How the step's kernels are launched (:func:`launch_seconds`): ``"none"`` (eagerly), ``"piecewise"``
        (graphs between the attention calls, which launch eagerly), ``"full"`` (one graph), or a pair for decode-only
        steps and steps with prefill tokens, ``"full_decode_only"`` (full, none) and ``"full_and_piecewise"``
        (full, piecewise), as vLLM's ``CUDAGraphMode`` names them.
    fused : bool
        Fused kernels: ``FUSED_KERNEL_FRACTION`` of the launches and no element-wise activation round trips.
    step_overhead_s : float
        Scheduling and sampling per step, s.
    gemm_half_tokens : float
        A GEMM of ``M`` rows reaches ``flops_fraction x M / (M + gemm_half_tokens)`` of the matmul peak (0: always
        ``flops_fraction``): a few rows cannot fill the tensor cores.
    gemm_floor_s : float
        Fixed GPU time of one GEMM kernel, added to its roofline, s.
    kernel_floor_s : float
        Fixed GPU time of one element-wise kernel (RMSNorm, RoPE, activation, residual add), s.
    elementwise_bandwidth_fraction : float
        Achievable share of HBM bandwidth of the element-wise kernels.
    attention_floor_s : float
        Fixed GPU time of one attention call (per layer and step), s.
    errors : dict
        Op class of :data:`ERROR_CLASSES` -> multiplier on the modelled time of its ops (missing: 1).
    step_error : float
        Multiplier on the whole step (a calibration's residual against measured whole steps; 1 = none).
    gemm_surface : mcsim.perf.gemm_surface.GemmSurface, optional
        Measured correction of each GEMM's time by its shape (None: the roofline alone).
    linear : LinearGemms, optional
        The figures of the linear layers' GEMMs where their compute dtype has its own measured ones (FP8 or FP4 on a
        GPU whose GEMMs of that dtype were measured); None: the figures above, at the compute dtype's peak.
        Attention, the router and element-wise kernels keep the figures above.
    experts : LinearGemms, optional
        The same for the routed experts' GEMMs in their compute dtype (None: the figures above).
    moe : mcsim.perf.fused_moe.ExpertFigures, optional
        The measured fused MoE kernels of the routed experts' compute dtype: each MoE layer's routed experts are then
        one fused kernel (:func:`mcsim.perf.fused_moe.experts_seconds`: its GEMMs, SwiGLU, quantization and sum over
        ``top_k``), under the error class ``experts`` (``experts_fp8``, ``experts_fp4``) instead of ``gemm``. None:
        grouped GEMMs at ``experts``' figures, a SwiGLU and casts.
    mla : AttentionFigures, optional
        The measured MLA attention kernels (:func:`mla_calls` priced by :func:`attention_seconds`, the head width
        term unused); None: MLA attention takes the roofline.
    """

    flops_fraction: float = 0.6
    bandwidth_fraction: float = 0.8
    network_fraction: float = 0.7
    launch_overhead_s: float = 1e-5
    kernels_per_layer: int = 12
    cudagraph_mode: str = "full"
    fused: bool = False
    step_overhead_s: float = 2e-4
    gemm_half_tokens: float = 0.0
    gemm_floor_s: float = 0.0
    kernel_floor_s: float = 0.0
    elementwise_bandwidth_fraction: float = 0.8
    attention_floor_s: float = 0.0
    errors: dict = field(default_factory=dict, hash=False)
    step_error: float = 1.0
    gemm_surface: object = field(default=None, hash=False, compare=False)
    linear: "LinearGemms | None" = None
    attention: "AttentionFigures | None" = None
    experts: "LinearGemms | None" = None
    moe: "ExpertFigures | None" = None
    mla: "AttentionFigures | None" = None


@dataclass(frozen=True)
class AttentionFigures:
    """Measured GQA attention kernels of one GPU (the catalog's ``attention_*`` figures, SI units), priced by
    :func:`attention_seconds`; the kernel floor is :attr:`Achievable.attention_floor_s`.

    Attributes
    ----------
    bandwidth_fraction : float
        Share of HBM bandwidth a decode call's KV stream reaches.
    unit_s : float
        Fixed time per (decoding sequence, KV head on the GPU) of a decode call: its work units.
    flops_fraction : float
        Largest share of the BF16 peak a prefill call reaches.
    prefill_bandwidth_fraction : float
        Share of HBM bandwidth a prefill call's bytes reach (KV, queries and outputs).
    half_work : float
        Query-head tokens (tokens x query heads on the GPU) at which a prefill call reaches half its FLOP share: too
        few tiles to fill the GPU.
    head_dim_half : float
        Head width at which a prefill call reaches half its FLOP share (wider heads fill the tensor cores better).
    half_context : float
        Context each token attends to at which a prefill call reaches half its FLOP share (a tile's loop over
        keys amortizes its prologue and epilogue).
    fp8_kv_bandwidth_fraction, fp8_kv_unit_s : float
        ``bandwidth_fraction`` and ``unit_s`` of a decode call over an FP8 KV cache (dequantizing it costs more than
        its bytes save; 0: the BF16 cache's).
    """

    bandwidth_fraction: float
    unit_s: float
    flops_fraction: float
    prefill_bandwidth_fraction: float
    half_work: float
    head_dim_half: float
    half_context: float = 0.0
    fp8_kv_bandwidth_fraction: float = 0.0
    fp8_kv_unit_s: float = 0.0

    def for_kv(self, kv_bytes: float) -> "AttentionFigures":
        """The figures of a cache of ``kv_bytes`` an element: an FP8 cache's decode figures where measured."""
        if kv_bytes == 1.0 and self.fp8_kv_bandwidth_fraction > 0:
            return replace(self, bandwidth_fraction=self.fp8_kv_bandwidth_fraction, unit_s=self.fp8_kv_unit_s)
        return self


def attention_seconds(flops, nbytes, *, decode, sequences, kv_heads, work, head_dim, context, peak, hbm, figures,
                      floor_s=0.0):
    """Time of one attention call on one GPU from measured figures (:class:`AttentionFigures`), s (floats or arrays).

    A decode call (``decode`` true) over ``sequences`` sequences with ``kv_heads`` KV heads on the GPU moving
    ``nbytes`` costs ``floor_s + sequences x kv_heads x unit_s + max(nbytes / (hbm x bandwidth_fraction), flops /
    (peak x flops_fraction))``: decode attention streams the KV cache and pays per work unit, and only where many
    query heads share a cache entry (MLA's 128 over one latent) does its compute outrun the stream. A prefill call of
    ``flops`` over ``work`` query-head tokens of width ``head_dim``, each token attending to ``context`` others on
    average, costs
    ``floor_s + max(flops / (peak x flops_fraction x e), nbytes / (hbm x prefill_bandwidth_fraction))`` with
    ``e = head_dim / (head_dim + head_dim_half) x work / (work + half_work) x context / (context + half_context)``.
    ``peak`` is the BF16 peak and ``hbm`` the HBM bandwidth (bytes/s). The step model and ``mcsim calibrate`` both
    price attention with this function.

    Examples
    --------
    >>> f = AttentionFigures(0.9, 20e-9, 0.8, 0.3, 1e4, 64.0)
    >>> round(attention_seconds(0.0, 2.7e8, decode=True, sequences=64, kv_heads=1, work=0, head_dim=128,
    ...                         context=2048, peak=1e15, hbm=3e12, figures=f, floor_s=1e-5) * 1e6, 2)  # 10+1.28+100 us
    111.28
    """
    decode_t = (np.maximum(nbytes / (hbm * figures.bandwidth_fraction), flops / (peak * figures.flops_fraction))
                + sequences * kv_heads * figures.unit_s)
    work = np.where(decode, 1.0, work)  # the prefill form's efficiency is a prefill call's only
    context = np.where(decode, 1.0, context)
    rate = (peak * figures.flops_fraction * head_dim / (head_dim + figures.head_dim_half)
            * work / (work + figures.half_work) * context / (context + figures.half_context))
    prefill_t = np.maximum(flops / rate, nbytes / (hbm * figures.prefill_bandwidth_fraction))
    out = floor_s + np.where(decode, decode_t, prefill_t)
    return float(out) if np.ndim(out) == 0 else out


@dataclass(frozen=True)
class LinearGemms:
    """GEMM figures measured for one compute dtype (the fields of :class:`Achievable` of the same names)."""

    flops_fraction: float
    bandwidth_fraction: float
    gemm_half_tokens: float
    gemm_floor_s: float
    gemm_surface: object = field(default=None, hash=False, compare=False)


def gemm_seconds(flops, nbytes, peak, bandwidth, *, kernels=1, rows=None, half_tokens=0.0, floor_s=0.0,
                 factor=1.0):
    """Time of ``kernels`` GEMM kernels that together do ``flops`` and move ``nbytes``, s (floats or arrays).

    ``factor x (kernels x floor_s + max(flops / (peak x M / (M + half_tokens)), nbytes / bandwidth))`` with
    ``M = rows`` the GEMM's rows (tokens): the kernels' fixed time plus the roofline of their work, where a GEMM of
    few rows reaches only ``M / (M + half_tokens)`` of the achievable FLOP/s. ``peak`` and ``bandwidth`` are the
    achievable figures (peak x fraction); ``factor`` is the measured correction of the GEMM's shape
    (:mod:`mcsim.perf.gemm_surface`; 1 without one). The step model and ``mcsim calibrate`` both price GEMMs with
    this function.

    Examples
    --------
    >>> round(gemm_seconds(2e12, 1e9, 1e15, 1e12) * 1e3, 3)  # compute-bound: 2 ms of FLOPs, 1 ms of bytes
    2.0
    >>> round(gemm_seconds(2e9, 1e9, 1e15, 1e12, rows=1, half_tokens=100, floor_s=5e-6) * 1e6, 1)  # 5 us + 1 ms
    1005.0
    """
    compute = flops / peak
    if half_tokens > 0 and rows is not None:
        compute = compute * (rows + half_tokens) / rows
    memory = nbytes / bandwidth
    return factor * (kernels * floor_s + (np.maximum(compute, memory) if isinstance(compute, np.ndarray)
                                          else max(compute, memory)))


def mla_calls(model: dict, heads: float, kv_token: float, act_bytes: float, decode_seqs: float, decode_tokens: float,
              decode_context: float, prefill_tokens: float, prefill_context: float) -> list:
    """The MLA attention calls of one layer on one GPU (``heads`` query heads; the cache ``kv_token`` bytes a token) as
    keyword arguments of :func:`attention_seconds` (``flops``, ``nbytes``, ``decode``, ``sequences``, ``work``,
    ``context``): the decode sequences' call in the absorbed form (MQA over the latent: ``2 (2 kv_lora + rope)``
    FLOPs a head and cached token; it reads every sequence's cache), and the prefill chunk's in the MHA form
    (``2 (nope + rope + v)`` FLOPs a head and token pair, plus up-projecting the prefix's latent; it reads the
    prefix's cache once). Both write their tokens' cache entries."""
    kv_lora, rope = model["kv_lora_rank"], model["qk_rope_head_dim"]
    nope, v = model["qk_nope_head_dim"], model["v_head_dim"]
    calls = []
    if decode_seqs > 0:
        calls.append(dict(flops=2 * heads * (2 * kv_lora + rope) * decode_tokens * decode_context,
                          nbytes=((decode_seqs * decode_context + decode_tokens) * kv_token
                                  + decode_tokens * heads * (2 * kv_lora + rope) * act_bytes),
                          decode=True, sequences=decode_seqs, work=0.0, context=decode_context))
    if prefill_tokens > 0:
        calls.append(dict(flops=(2 * heads * (nope + rope + v) * prefill_tokens * prefill_context
                                 + 2 * prefill_context * kv_lora * heads * (nope + v)),
                          nbytes=((prefill_context + prefill_tokens) * kv_token
                                  + prefill_tokens * heads * (nope + rope + v) * act_bytes),
                          decode=False, sequences=0.0, work=prefill_tokens * heads, context=prefill_context))
    return calls


def attention_gemms(model: dict, tp: int) -> list:
    """The attention projections of one layer on one GPU as GEMMs ``(N, K)`` (output columns, depth), in order.

    GQA: the fused QKV projection (``q`` over ``tp`` heads, ``k`` and ``v`` over ``ceil(kv_heads / tp)``) and the
    output projection. MLA: the fused down-projections of ``q`` and the KV latent (replicated, as vLLM and SGLang
    run them; ``q`` has no down-projection when ``q_lora_rank`` is 0), the up-projections of ``q`` and of the latent
    (``kv_b``, over ``tp`` heads) and the output projection. Their FLOPs are ``2 N K`` per row.
    """
    h, hq = model["hidden_size"], model["attention_heads"] / tp
    if model["attention"] == "gqa":
        hd = model["head_dim"]
        kv = math.ceil(model["kv_heads"] / tp)
        return [((hq + 2 * kv) * hd, h), (h, hq * hd)]
    q_lora, kv_lora = model["q_lora_rank"], model["kv_lora_rank"]
    nope, rope, v = model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]
    q_up = (hq * (nope + rope), q_lora) if q_lora > 0 else None
    down = [(q_lora + kv_lora + rope, h)] if q_lora > 0 else [(hq * (nope + rope), h), (kv_lora + rope, h)]
    return [*down, *([q_up] if q_up else []), (hq * (nope + v), kv_lora), (h, hq * v)]


def ffn_gemms(hidden: int, width: float) -> list:
    """A SwiGLU FFN of ``width`` intermediate columns on one GPU as GEMMs ``(N, K)``: the fused gate and up
    projection, then the down projection."""
    return [(2 * width, hidden), (hidden, width)]


def elementwise_seconds(nbytes, bandwidth, *, kernels, floor_s):
    """Time of ``kernels`` element-wise kernels moving ``nbytes`` in all: ``kernels x floor_s + nbytes / bandwidth``
    (``bandwidth`` the achievable HBM bandwidth), s; floats or arrays."""
    return kernels * floor_s + nbytes / bandwidth


@dataclass(frozen=True)
class StepCost:
    """Cost of one step on one GPU of the instance (the slowest one).

    Attributes
    ----------
    flops : float
        FLOPs.
    weight_bytes, kv_bytes, activation_bytes : float
        HBM bytes read or written: weights, KV cache (reads and writes), activations.
    comm_bytes : float
        Bytes this GPU sends in collectives.
    t_compute, t_memory : float
        Sums over ops of flops / achievable FLOP/s and bytes / achievable bandwidth, s (diagnostic: the step
        takes the larger of the two per op).
    t_comm, t_comm_exposed : float
        Communication time, and the part not hidden behind compute, s.
    t_overhead : float
        Launch and per-step overheads, s.
    t_step : float
        Step time: sum over ops of the per-op roofline + t_comm_exposed + t_overhead, s.
    breakdown : dict
        op -> {"flops", "bytes", "t", "floor", "bound"} for each name in :data:`OPS`; communication ops give
        their bytes sent and their *exposed* time, so the ``t`` values add up to ``t_step``, and ``hidden``, the
        seconds hidden behind compute (:func:`hidden_communication`); ``floor`` is the part
        of ``t`` that is the kernels' fixed time (GEMM, element-wise and attention floors); ``bound`` says what
        sets the time ("compute", "memory", "floor" when the fixed time is the larger part, "network" or
        "overhead").
    """

    flops: float
    weight_bytes: float
    kv_bytes: float
    activation_bytes: float
    comm_bytes: float
    t_compute: float
    t_memory: float
    t_comm: float
    t_comm_exposed: float
    t_overhead: float
    t_step: float
    breakdown: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Memory:
    """HBM budget of one GPU of an instance (bytes are per GPU; sequences per instance).

    Attributes
    ----------
    weights_per_gpu : float
        Weight bytes on the fullest GPU.
    kv_bytes_per_token_per_gpu : float
        KV bytes one token of a sequence occupies on a GPU that holds that sequence.
    kv_bytes_per_sequence : float
        KV bytes of one sequence on such a GPU, its context rounded up to whole blocks (paged cache).
    activation_bytes : float
        Reserved for activations and workspace.
    free_kv_bytes : float
        HBM x memory_fraction - weights - activations - reserved (negative when weights do not fit).
    max_sequences : int
        Sequences of that context the instance holds (``attention_dp`` groups each fill their own HBM).
    fits : bool
    reason : str
        "ok", "weights do not fit in HBM" or "KV for one sequence does not fit".
    """

    weights_per_gpu: float
    kv_bytes_per_token_per_gpu: float
    kv_bytes_per_sequence: float
    activation_bytes: float
    free_kv_bytes: float
    max_sequences: int
    fits: bool
    reason: str


@dataclass(frozen=True)
class OperatingPoint:
    """Decode operating point of one instance.

    Attributes
    ----------
    batch : int
        Decode sequences per instance (0 when even one does not fit in memory).
    step_time_s : float
        Time in which every sequence of the batch completes one pass, s.
    tpot_s : float
        step_time_s / tokens_per_pass, s.
    decode_tok_s_per_gpu : float
        batch x tokens_per_pass / step_time_s / GPUs of the instance.
    feasible : bool
    reason : str
        "ok", a memory reason, or "TPOT target not met at batch 1".
    limited_by : str
        What capped the batch: "memory", "max_batch", "tpot" or "" when infeasible.
    """

    batch: int
    step_time_s: float
    tpot_s: float
    decode_tok_s_per_gpu: float
    feasible: bool
    reason: str
    limited_by: str = ""


# -- shapes on one GPU --------------------------------------------------------------------------------------

def _check_parallel(parallel: Parallelism) -> None:
    for name in ("tp", "ep", "pp", "attention_dp"):
        if getattr(parallel, name) < 1:
            raise ValueError(f"parallel.{name} must be >= 1, got {getattr(parallel, name)}")
    stage = parallel.tp * parallel.attention_dp
    if stage % parallel.ep:
        raise ValueError(f"parallel.ep ({parallel.ep}) must divide tp x attention_dp ({stage}): the experts of a "
                         "layer live on the GPUs of its pipeline stage")


def _attention_shard(model: dict, tp: int) -> dict:
    """Per-GPU, per-layer attention shapes: matmul weights, replicated norm weights, widths for traffic."""
    h, heads = model["hidden_size"], model["attention_heads"]
    hq = heads / tp
    if model["attention"] == "gqa":
        hd = model["head_dim"]
        kv = math.ceil(model["kv_heads"] / tp)  # a KV head is replicated when kv_heads < tp
        q_w, kv_w = hq * hd, kv * hd
        return {
            "matmul": 2 * h * q_w + 2 * h * kv_w,
            "norm": 2 * h,  # the layer's two RMSNorms (attention and FFN input)
            # q/k/v projection in -> out, o projection in -> out
            "io": (h + q_w + 2 * kv_w) + (q_w + h),
            "rope": q_w + kv_w,
            "kv_per_token": 2 * kv_w,  # elements cached per token (this GPU's heads)
            "heads": hq,
        }
    if model["attention"] != "mla":
        raise ValueError(f"attention must be one of {catalog.ATTENTION_KINDS}, got {model['attention']!r}")
    q_lora, kv_lora = model["q_lora_rank"], model["kv_lora_rank"]
    nope, rope, v = model["qk_nope_head_dim"], model["qk_rope_head_dim"], model["v_head_dim"]
    if q_lora > 0:
        q_down, q_up, q_norm = h * q_lora, q_lora * hq * (nope + rope), q_lora
        q_io = (h + q_lora) + (q_lora + hq * (nope + rope))
    else:
        q_down, q_up, q_norm = 0, h * hq * (nope + rope), 0
        q_io = h + hq * (nope + rope)
    kv_down = h * (kv_lora + rope)
    kv_up = kv_lora * hq * (nope + v)
    out = hq * v * h
    return {
        "matmul": q_down + q_up + kv_down + kv_up + out,
        "norm": 2 * h + q_norm + kv_lora,  # the layer's two RMSNorms and the two latent norms
        "io": q_io + (h + kv_lora + rope) + (kv_lora + hq * (nope + v)) + (hq * v + h),
        "rope": hq * rope + rope,
        "kv_per_token": kv_lora + rope,  # the latent is shared by all heads: replicated over tp
        "heads": hq,
    }


def _peak_flops(hw: Hardware, compute: str) -> float:
    """Peak FLOP/s of the widest-supported format at or above ``compute``."""
    if compute not in COMPUTE_DTYPES:
        raise ValueError(f"precision.compute must be one of {COMPUTE_DTYPES}, got {compute!r}")
    return hw.peak_flops(compute)


def _layer_counts(model: dict, pp: int) -> tuple[float, float, float]:
    """(all, dense, MoE) layers per pipeline stage, split evenly."""
    layers, dense = model["layers"], model["dense_layers"]
    return layers / pp, dense / pp, (layers - dense) / pp


def expected_distinct_experts(experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts touched when ``tokens`` tokens each pick ``top_k`` of ``experts`` uniformly.

    ``E (1 - (1 - k/E)^T)``: an expert is missed by one token with probability ``1 - k/E``.
    """
    if experts <= 0 or tokens <= 0:
        return 0.0
    return experts * (1.0 - (1.0 - top_k / experts) ** tokens)


# -- step cost -------------------------------------------------------------------------------------------------

def step_cost(model: dict, hw, *, decode_seqs: float, decode_context: float, prefill_tokens: float = 0,
              prefill_context: float = 0, verify_tokens: int = 1, precision: Precision = Precision(),
              parallel: Parallelism = Parallelism(), collectives: Collectives = Collectives(),
              achievable: Achievable = Achievable(), hot_rank_factor: float = 1.0,
              distinct_experts: float | None = None, attention_window: int = 0, sparse_topk: int = 0,
              distinct_tokens: float | None = None) -> StepCost:
    """Roofline cost of one forward step of one instance (one pipeline stage when ``pp > 1``).

    Parameters
    ----------
    model : dict
        Catalog entry (:func:`mcsim.scenario.catalog.model_preset`).
    hw : mcsim.perf.hardware.Hardware or dict
        The accelerator; a catalog entry (:func:`mcsim.scenario.catalog.hardware_preset`) is converted.
    decode_seqs : float
        Decode sequences in the step (per instance).
    decode_context : float
        Mean context of those sequences, tokens.
    prefill_tokens : float
        New prompt tokens in the step (a prefill chunk).
    prefill_context : float
        Earlier tokens a prefill token attends to on average (the chunk's prefix plus half the chunk).
    verify_tokens : int
        Tokens each decode sequence runs (k + 1 when verifying k drafts).
    precision, parallel, collectives, achievable
        Option groups; see their classes.
    hot_rank_factor : float
        Max / mean token-expert load over EP ranks (from :mod:`mcsim.stages.experts`), >= 1.
    distinct_experts : float, optional
        Distinct routed experts touched per MoE layer in the step; default: uniform-routing expectation.
    distinct_tokens : float, optional
        The tokens a step at which ``distinct_experts`` was counted (the expert stage's): a step of other tokens
        scales it by the uniform-routing expectation's ratio between the two, ``D_u(T) / D_u(T_ref)``, at most all
        experts (None: ``distinct_experts`` whatever the step's tokens).
    attention_window : int
        Sliding-window size, tokens (0: full attention).
    sparse_topk : int
        Tokens kept by sparse attention (0: dense), with the indexer's cost.

    Returns
    -------
    StepCost
        Per-GPU FLOPs, bytes and times; an empty step (no tokens) costs nothing.

    Examples
    --------
    >>> from mcsim.scenario import catalog
    >>> cost = step_cost(catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100"),
    ...                  decode_seqs=1, decode_context=1000)
    >>> cost.t_memory > cost.t_compute  # batch-1 decode streams the weights
    True
    """
    _check_parallel(parallel)
    hw = as_hardware(hw)
    if decode_seqs < 0 or prefill_tokens < 0 or decode_context < 0 or prefill_context < 0 or verify_tokens < 1:
        raise ValueError("token counts and contexts must be >= 0 and verify_tokens >= 1")
    if hot_rank_factor < 1:
        raise ValueError(f"hot_rank_factor is max/mean load, >= 1; got {hot_rank_factor}")
    tp, ep, pp, adp = parallel.tp, parallel.ep, parallel.pp, parallel.attention_dp
    stage_gpus = tp * adp
    decode_tokens = decode_seqs * verify_tokens
    tokens = decode_tokens + prefill_tokens
    ops = {name: {"flops": 0.0, "weight": 0.0, "kv": 0.0, "act": 0.0, "t": 0.0, "sent": 0.0, "floor": 0.0}
           for name in OPS}
    if tokens <= 0:
        return _assemble(ops, 0.0, 0.0, 0.0, 0.0)

    h = model["hidden_size"]
    a, wb, kvb = precision.activation_bytes, precision.weight_bytes, precision.kv_bytes
    unfused = 0.0 if achievable.fused else 1.0
    bf16 = LinearGemms(achievable.flops_fraction, achievable.bandwidth_fraction, achievable.gemm_half_tokens,
                       achievable.gemm_floor_s, achievable.gemm_surface)  # the figures above, as one dtype's
    linear = achievable.linear or bf16
    linear_compute, experts_compute = precision.linear_compute, precision.experts_compute
    peak_linear = _peak_flops(hw, linear_compute) * linear.flops_fraction
    linear_input = precision.input_bytes(linear_compute)
    peak_attention = hw.peak_flops("bf16") * achievable.flops_fraction
    bandwidth = hw.hbm_bytes_s * achievable.bandwidth_fraction
    linear_bandwidth = hw.hbm_bytes_s * linear.bandwidth_fraction
    elementwise_bw = hw.hbm_bytes_s * achievable.elementwise_bandwidth_fraction
    n = tokens / adp  # tokens per attention-DP group: what every GPU of a TP group processes
    has_prefill = 1.0 if prefill_tokens > 0 else 0.0
    layers, dense_layers, moe_layers = _layer_counts(model, pp)
    fused_moe = ""  # the compute dtype of routed experts priced as measured fused MoE kernels
    # the routed experts: their own format's measured figures, the linear layers' in the same format, else the
    # figures above at their format's peak
    expert_figures = achievable.experts or (linear if experts_compute == linear_compute else bf16)

    def add(name, count, flops, weight=0.0, kv=0.0, act=0.0, peak=peak_linear, bw=bandwidth, seconds=None):
        """``count`` times an op that is not a GEMM: its roofline alone, or the ``seconds`` a measured kernel's
        figures give it."""
        op = ops[name]
        op["flops"] += count * flops
        op["weight"] += count * weight
        op["kv"] += count * kv
        op["act"] += count * act
        op["t"] += count * (gemm_seconds(flops, weight + kv + act, peak, bw, kernels=0) if seconds is None else seconds)

    def add_gemms(name, count, rows, shapes, *, groups=1.0, weight_bytes=wb, figures=linear, peak=peak_linear,
                  gemm_bandwidth=linear_bandwidth, extra_weight=0.0, input_bytes=linear_input):
        """``count`` times the GEMMs ``shapes`` (``(N, K)`` each) over ``rows`` rows; a grouped GEMM spreads its rows
        over ``groups`` weight matrices (experts), each GEMM of ``rows / groups`` rows. Each kernel pays its floor,
        its roofline at its rows' FLOP share and its shape's measured correction (:func:`gemm_seconds`), all from
        ``figures`` (the linear layers' by default); it reads its input at ``input_bytes`` an element and writes its
        output at the activations' width; ``extra_weight`` bytes (a layer's norm weights) ride on the first."""
        op = ops[name]
        half, floor, surface = figures.gemm_half_tokens, figures.gemm_floor_s, figures.gemm_surface
        each = rows / max(groups, 1.0)
        for j, (n_cols, depth) in enumerate(shapes):
            flops = 2.0 * rows * n_cols * depth
            weight = groups * n_cols * depth * weight_bytes + (extra_weight if j == 0 else 0.0)
            act = rows * (n_cols * a + depth * input_bytes)
            factor = surface.factor(each, n_cols, depth) if surface is not None else 1.0
            op["flops"] += count * flops
            op["weight"] += count * weight
            op["act"] += count * act
            op["floor"] += count * floor * factor
            op["t"] += count * gemm_seconds(flops, weight + act, peak, gemm_bandwidth, rows=each, half_tokens=half,
                                            floor_s=floor, factor=factor)

    def add_elementwise(count, kernels, act):
        """``count`` times ``kernels`` element-wise kernels moving ``act`` bytes; fused, the same bytes without the
        kernels' floors (fusion saves launches, not the data each op reads and writes)."""
        op = ops["elementwise"]
        floors = kernels * unfused
        op["act"] += count * act
        op["floor"] += count * floors * achievable.kernel_floor_s
        op["t"] += count * elementwise_seconds(act, elementwise_bw, kernels=floors, floor_s=achievable.kernel_floor_s)

    def add_casts(count, rows, widths, compute):
        """Unfused, a cast kernel per GEMM input of ``widths`` elements a row whose ``compute`` format is narrower than
        the activations (read at their width, written at its); fused, the cast rides on the kernel that produces
        the input (an RMSNorm's or activation's epilogue) and costs nothing more."""
        narrow = precision.input_bytes(compute)
        if narrow < a and not achievable.fused:
            add_elementwise(count, len(widths), rows * sum(widths) * (a + narrow))

    # attention projections and core, every layer
    shard = _attention_shard(model, tp)
    projections = attention_gemms(model, tp)
    add_gemms("attention_proj", layers, n, projections, extra_weight=shard["norm"] * wb)
    add_casts(layers, n, [k for _, k in projections], linear_compute)
    add_elementwise(layers, 3, n * a * (5 * h + 2 * shard["rope"]))  # RMSNorm, RoPE, residual add
    full_d = min(decode_context, attention_window) if attention_window > 0 else decode_context
    full_p = min(prefill_context, attention_window) if attention_window > 0 else prefill_context
    ctx_d = min(full_d, sparse_topk) if sparse_topk > 0 else full_d
    ctx_p = min(full_p, sparse_topk) if sparse_topk > 0 else full_p
    hq = shard["heads"]
    if model["attention"] == "gqa":
        hd = model["head_dim"]
        core_flops = 4 * hq * hd * (decode_tokens * ctx_d + prefill_tokens * ctx_p)
        core_act = tokens * 2 * hq * hd
    else:
        kv_lora, rope = model["kv_lora_rank"], model["qk_rope_head_dim"]
        nope, v = model["qk_nope_head_dim"], model["v_head_dim"]
        core_flops = (2 * hq * (2 * kv_lora + rope) * decode_tokens * ctx_d  # absorbed, MQA over the latent
                      + 2 * hq * (nope + rope + v) * prefill_tokens * ctx_p  # MHA form for prefill
                      + has_prefill * 2 * ctx_p * kv_lora * hq * (nope + v))  # up-project the prefix latent
        core_act = decode_tokens * hq * (2 * kv_lora + rope) + prefill_tokens * hq * (nope + rope + v)
    kv_token = shard["kv_per_token"] * kvb
    kv_traffic = (decode_seqs * ctx_d + has_prefill * ctx_p + tokens) * kv_token  # reads + writes
    if sparse_topk > 0:
        core_flops += 2 * INDEXER_HEADS * INDEXER_HEAD_DIM * (decode_tokens * full_d + prefill_tokens * full_p)
        kv_traffic += (decode_seqs * full_d + has_prefill * full_p + tokens) * INDEXER_HEAD_DIM * INDEXER_KEY_BYTES
    measured = None
    if achievable.attention is not None and model["attention"] == "gqa" and sparse_topk == 0:
        # measured attention kernels: the decode sequences' call and the prefill chunk's priced apart (each by
        # its own figures), the FLOPs and bytes accounted as the roofline's
        hd, kv_heads = model["head_dim"], shard["kv_per_token"] / (2 * model["head_dim"])
        common = dict(kv_heads=kv_heads, head_dim=hd, peak=hw.peak_flops("bf16"), hbm=hw.hbm_bytes_s,
                      figures=achievable.attention.for_kv(kvb))
        measured = 0.0
        if decode_seqs > 0:
            measured += attention_seconds(4 * hq * hd * decode_tokens * ctx_d / adp,
                                          ((decode_seqs * ctx_d + decode_tokens) * kv_token
                                           + decode_tokens * 2 * hq * hd * a) / adp,
                                          decode=True, sequences=decode_seqs / adp, work=0.0, context=ctx_d,
                                          **common)
        if prefill_tokens > 0:
            measured += attention_seconds(4 * hq * hd * prefill_tokens * ctx_p / adp,
                                          ((ctx_p + prefill_tokens) * kv_token
                                           + prefill_tokens * 2 * hq * hd * a) / adp,
                                          decode=False, sequences=0.0, work=prefill_tokens * hq / adp,
                                          context=ctx_p, **common)
    elif achievable.mla is not None and model["attention"] == "mla" and sparse_topk == 0:
        # measured MLA kernels, each call by its own figures (decode: the absorbed form, MQA over the latent, a unit
        # per (sequence, head); prefill: the MHA form), the FLOPs and bytes accounted as the roofline's
        measured = sum(attention_seconds(**call, kv_heads=hq, head_dim=1.0, peak=hw.peak_flops("bf16"),
                                         hbm=hw.hbm_bytes_s, figures=achievable.mla.for_kv(kvb))
                       for call in mla_calls(model, hq, shard["kv_per_token"] * kvb, a, decode_seqs / adp,
                                             decode_tokens / adp, ctx_d, prefill_tokens / adp, ctx_p))
    # otherwise (MLA on a GPU without its kernels, a sparse span, an unmeasured GPU) the roofline, its KV stream at
    # the measured attention kernels' share where the GPU has one
    stream = hw.hbm_bytes_s * achievable.attention.bandwidth_fraction if achievable.attention is not None \
        else bandwidth
    add("attention_core", layers, core_flops / adp, kv=kv_traffic / adp, act=core_act / adp * a,
        peak=peak_attention, bw=stream, seconds=measured)
    ops["attention_core"]["t"] += layers * achievable.attention_floor_s
    ops["attention_core"]["floor"] += layers * achievable.attention_floor_s

    # dense FFN layers
    if dense_layers > 0:
        f = model["dense_ffn"] / tp
        add_gemms("dense_ffn", dense_layers, n, ffn_gemms(h, f))
        add_casts(dense_layers, n, [k for _, k in ffn_gemms(h, f)], linear_compute)
        add_elementwise(dense_layers, 3, n * a * (5 * h + 3 * f))  # RMSNorm, SwiGLU, residual add

    # MoE layers: router, shared experts, routed experts on the slowest EP rank
    if moe_layers > 0:
        experts, top_k = model["experts"], model["active_experts"]
        add_gemms("router", moe_layers, n, [(experts, h)], weight_bytes=ROUTER_WEIGHT_BYTES, figures=bf16,
                  peak=hw.peak_flops("bf16") * achievable.flops_fraction, gemm_bandwidth=bandwidth, input_bytes=a)
        add_elementwise(moe_layers, 2, n * a * 5 * h)  # RMSNorm, residual add
        if model["shared_experts"] > 0:
            fs = model["shared_experts"] * model["expert_ffn"] / tp
            add_gemms("shared_expert", moe_layers, n, ffn_gemms(h, fs))
            add_casts(moe_layers, n, [k for _, k in ffn_gemms(h, fs)], linear_compute)
            add_elementwise(moe_layers, 1, n * a * 3 * fs)  # SwiGLU
        etp = stage_gpus // ep
        fe = model["expert_ffn"] / etp
        pairs = hot_rank_factor * tokens * top_k / ep
        if distinct_experts is None:
            distinct = expected_distinct_experts(experts, top_k, tokens)
        elif distinct_tokens:  # skew-aware at the stage's tokens a step, scaled to this step's
            distinct = min(float(experts), float(distinct_experts) * expected_distinct_experts(experts, top_k, tokens)
                           / expected_distinct_experts(experts, top_k, distinct_tokens))
        else:
            distinct = float(distinct_experts)
        distinct_on_rank = min(distinct, experts) / ep
        add_gemms("moe_ffn", moe_layers, pairs, ffn_gemms(h, fe), groups=distinct_on_rank,  # grouped GEMMs
                  weight_bytes=precision.expert_weights, figures=expert_figures,
                  peak=_peak_flops(hw, experts_compute) * expert_figures.flops_fraction,
                  gemm_bandwidth=hw.hbm_bytes_s * expert_figures.bandwidth_fraction,
                  input_bytes=precision.input_bytes(experts_compute))
        if achievable.moe is not None:  # one fused MoE kernel, from its measured figures
            fused_moe = experts_compute
            weight = distinct_on_rank * 3.0 * h * fe * precision.expert_weights
            stream = expert_stream_bytes(pairs, pairs / top_k, h, fe, activation_bytes=a,
                                         input_bytes=precision.input_bytes(experts_compute))
            op = ops["moe_ffn"]
            op.update(flops=0.0, weight=0.0, act=0.0, floor=0.0, t=0.0)  # not the grouped GEMMs' figures
            op["flops"] = moe_layers * 6.0 * pairs * h * fe
            op["weight"] = moe_layers * weight
            op["act"] = moe_layers * stream
            factor = achievable.moe.factor(pairs / top_k, h, fe)  # the measured surface's correction
            op["floor"] = moe_layers * achievable.moe.floor_s * factor
            op["t"] = moe_layers * factor * experts_seconds(
                6.0 * pairs * h * fe, weight, stream, rows_per_expert=pairs / max(distinct_on_rank, 1e-9),
                tiles=expert_tiles(pairs, distinct_on_rank, h, fe), peak=_peak_flops(hw, experts_compute),
                hbm=hw.hbm_bytes_s, figures=achievable.moe)
        else:
            add_casts(moe_layers, pairs, [k for _, k in ffn_gemms(h, fe)], experts_compute)
            add_elementwise(moe_layers, 1, pairs * a * 3 * fe)  # SwiGLU of the routed experts

    # output head, on the last stage: every decode token, one row per prefill chunk
    rows = (decode_tokens + has_prefill) / adp
    vocab_gpu = model["vocab"] / tp
    add_gemms("lm_head", 1, rows, [(vocab_gpu, h)])

    # communication
    net = {"latency_s": collectives.latency_s, "network_fraction": achievable.network_fraction}
    if tp > 1:
        algorithm = collectives.prefill_allreduce if prefill_tokens > 0 and collectives.prefill_allreduce \
            else collectives.allreduce
        t, sent, ran = tp_allreduce(n * h * a, tp, hw, impl=collectives.allreduce_impl, algorithm=algorithm, **net)
        ops["tp_allreduce"].update(t=2 * layers * t, sent=2 * layers * sent, impl=ran)
    if ep > 1 and moe_layers > 0:
        tokens_per_gpu = hot_rank_factor * tokens / stage_gpus
        algorithm = collectives.prefill_alltoall if prefill_tokens > 0 and collectives.prefill_alltoall \
            else collectives.alltoall
        measured = None
        if algorithm in deepep.MODES and hw.deepep_table:  # DeepEP's kernels, from their measured dispatches
            measured = deepep.alltoall_seconds(algorithm, tokens_per_gpu, model["active_experts"], h * a, ep,
                                               hw.gpus_per_node, deepep.for_hardware(hw.deepep_table),
                                               hw.scale_up_gb_s)
        if measured is not None:
            dispatch, combine, sent = measured
            ops["ep_alltoall"].update(t=moe_layers * (dispatch + combine), sent=2 * moe_layers * sent,
                                      impl=algorithm)
        else:  # analytic: DeepEP's modes where they were not measured (that span, that GPU) as hierarchical
            ran = "hierarchical" if algorithm in deepep.MODES else algorithm
            t, sent = alltoall_time(tokens_per_gpu, model["active_experts"], h * a, ep, hw, algorithm=ran,
                                    experts=model["experts"], **net)
            ops["ep_alltoall"].update(t=2 * moe_layers * t, sent=2 * moe_layers * sent, impl=ran)
    if pp > 1:
        nbytes = n * h * a / tp  # the TP ranks each send their share of the boundary activations
        t = send_time(nbytes, hw, across_nodes=stage_gpus >= hw.gpus_per_node, **net)
        ops["pp_send"].update(t=t, sent=nbytes)

    launches = achievable.kernels_per_layer * layers * (FUSED_KERNEL_FRACTION if achievable.fused else 1.0)
    if achievable.cudagraph_mode not in CUDAGRAPH_RUNTIME:
        raise ValueError(f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_RUNTIME)}; got "
                         f"{achievable.cudagraph_mode!r}")
    mode = CUDAGRAPH_RUNTIME[achievable.cudagraph_mode][1 if prefill_tokens > 0 else 0]
    spans_nodes = tp > hw.gpus_per_node  # the TP all-reduce's error is that of all-reduces across nodes
    for cls, names in ERROR_CLASSES.items():
        if cls == ("allreduce" if spans_nodes else "allreduce_nodes"):
            continue
        if cls.startswith("experts") and cls != EXPERTS_CLASSES.get(fused_moe):
            continue  # the fused kernels' error where they priced the experts
        if cls == "mla" and model["attention"] != "mla":
            continue
        if cls == "gemm" and fused_moe:
            names = tuple(name for name in names if name != "moe_ffn")
        factor = achievable.errors.get(cls, 1.0)
        if factor != 1.0:
            for name in names:
                ops[name]["t"] *= factor
                ops[name]["floor"] *= factor
    gpu_busy = sum(op["t"] for name, op in ops.items() if name != "overhead")  # what eager launches run ahead of
    t_launch = launch_seconds(launches, layers, achievable.launch_overhead_s, mode, gpu_s=gpu_busy)
    ops["overhead"]["t"] = t_launch + achievable.step_overhead_s
    if achievable.step_error != 1.0:
        for op in ops.values():
            op["t"] *= achievable.step_error
            op["floor"] *= achievable.step_error
    overlap = collectives.prefill_overlap if prefill_tokens > 0 and collectives.prefill_overlap is not None \
        else collectives.overlap
    return _assemble(ops, peak_linear, peak_attention, bandwidth, overlap, collectives.allreduce_overlap)


def _bound(name: str, op: dict, peak_linear: float, peak_attention: float, bandwidth: float) -> str:
    """What sets an op's time: "compute", "memory", "floor" (kernel fixed times are the larger part), "network"
    (collectives) or "overhead" (launches, per step)."""
    if name in COMM_OPS:
        return "network"
    if name == "overhead":
        return "overhead"
    if op["floor"] > 0 and op["floor"] >= op["t"] - op["floor"]:
        return "floor"
    if name == "elementwise":
        return "memory"
    peak = peak_attention if name in ("attention_core", "router") else peak_linear
    compute = op["flops"] / peak if peak else 0.0
    memory = (op["weight"] + op["kv"] + op["act"]) / bandwidth if bandwidth else 0.0
    return "compute" if compute >= memory else "memory"


def hidden_communication(comm: dict, compute_s: float, overlap: float, allreduce_overlap: float) -> dict:
    """Seconds of each collective hidden behind compute: a share ``allreduce_overlap`` of the TP all-reduce (a GEMM
    fused with it) and ``overlap`` of the others (two micro-batches, each communicating while the other computes),
    never more in all than the step's compute, ``compute_s``, the only work there is to hide behind (the TP
    all-reduce's claim first, the others' shrunk in proportion).

    Examples
    --------
    >>> hidden_communication({"tp_allreduce": 0.0, "ep_alltoall": 10.0, "pp_send": 0.0}, 4.0, 0.7, 0.0)
    {'tp_allreduce': 0.0, 'ep_alltoall': 4.0, 'pp_send': 0.0}
    >>> hidden_communication({"tp_allreduce": 0.0, "ep_alltoall": 10.0, "pp_send": 0.0}, 40.0, 0.7, 0.0)
    {'tp_allreduce': 0.0, 'ep_alltoall': 7.0, 'pp_send': 0.0}
    """
    allreduce = min(allreduce_overlap * comm["tp_allreduce"], compute_s)
    wanted = {name: overlap * t for name, t in comm.items() if name != "tp_allreduce"}
    room = compute_s - allreduce
    scale = min(1.0, room / sum(wanted.values())) if sum(wanted.values()) > 0 else 1.0
    return {"tp_allreduce": allreduce, **{name: t * scale for name, t in wanted.items()}}


def _assemble(ops: dict, peak_linear: float, peak_attention: float, bandwidth: float, overlap: float,
              allreduce_overlap: float = 0.0) -> StepCost:
    """Totals and breakdown from the per-op accumulators; communication ``t`` becomes its exposed part, less what
    :func:`hidden_communication` hides behind the step's compute."""
    for name, value in (("overlap", overlap), ("allreduce_overlap", allreduce_overlap)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"collectives.{name} must be in [0, 1], got {value}")
    t_comm = sum(ops[name]["t"] for name in COMM_OPS)
    hidden = hidden_communication({name: ops[name]["t"] for name in COMM_OPS},
                                  sum(ops[name]["t"] for name in _COMPUTE_OPS), overlap, allreduce_overlap)
    for name in COMM_OPS:
        ops[name]["hidden"] = hidden[name]
        ops[name]["t"] -= hidden[name]
    t_compute = t_memory = 0.0
    for name in _COMPUTE_OPS:
        op = ops[name]
        peak = peak_attention if name in ("attention_core", "router") else peak_linear
        t_compute += op["flops"] / peak if peak else 0.0
        t_memory += (op["weight"] + op["kv"] + op["act"]) / bandwidth if bandwidth else 0.0
    breakdown = {}
    for name in OPS:
        op = ops[name]
        entry = {"flops": op["flops"], "bytes": op["weight"] + op["kv"] + op["act"] + op["sent"], "t": op["t"],
                 "floor": op["floor"], "bound": _bound(name, op, peak_linear, peak_attention, bandwidth)}
        if "impl" in op:
            entry["impl"] = op["impl"]
        if name in COMM_OPS:
            entry["hidden"] = op["hidden"]
        breakdown[name] = entry
    return StepCost(
        flops=sum(op["flops"] for op in ops.values()),
        weight_bytes=sum(op["weight"] for op in ops.values()),
        kv_bytes=sum(op["kv"] for op in ops.values()),
        activation_bytes=sum(op["act"] for op in ops.values()),
        comm_bytes=sum(ops[name]["sent"] for name in COMM_OPS),
        t_compute=t_compute,
        t_memory=t_memory,
        t_comm=t_comm,
        t_comm_exposed=sum(ops[name]["t"] for name in COMM_OPS),
        t_overhead=ops["overhead"]["t"],
        t_step=sum(op["t"] for op in ops.values()),
        breakdown=breakdown,
    )


"""The routed experts of one MoE layer as an engine runs them: one fused MoE kernel, priced from measured figures.

A fused MoE layer (vLLM's and SGLang's Triton ``fused_moe``, TensorRT-LLM's CUTLASS MoE) sorts its token-expert
pairs by expert, runs the experts' gate/up projections as one grouped GEMM, the SwiGLU, the down projections as a
second grouped GEMM, and sums each token's ``top_k`` outputs. Measured, it is neither a dense GEMM of the same bytes
nor the sum of its GEMMs at a dense GEMM's efficiency: it pays a fixed time (routing, sorting, several launches),
streams the touched experts' weights and, apart from them, every pair's activations (at another share of HBM
bandwidth: gathered rows, scattered writes), and pays per output tile (a tile of :data:`TILE_ROWS` pairs of one
expert by :data:`TILE_COLUMNS` columns), which is what narrow experts and many experts with few rows each cost.

:func:`experts_seconds` is that model; :class:`ExpertFigures` its six figures, fitted per GPU and compute dtype to
the fused MoE kernels AIConfigurator times (``mcsim calibrate``, classes ``experts``, ``experts_fp8``, ``experts_fp4``)
and held in the hardware catalog as ``experts_*`` (BF16), ``experts_fp8_*`` (block-scaled FP8) and ``experts_fp4_*``
(NVFP4). The step model and the fit both price with it. As a GEMM's roofline is corrected by its shape
(:mod:`mcsim.perf.gemm_surface`), the formula is corrected by the fit's measured residuals, kept per (width on the
GPU, hidden size) as a curve over tokens: a measured shape takes its own, another the blend of those near it
(``ExpertFigures.surface``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

#: The op class (and catalog prefix) of each compute dtype whose fused MoE kernels can be measured: BF16,
#: block-scaled FP8 and NVFP4.
EXPERTS_CLASSES = {"bf16": "experts", "fp8": "experts_fp8", "fp4": "experts_fp4"}
#: Rows (token-expert pairs of one expert) and columns of one output tile of the grouped GEMMs: the typical Triton
#: fused-MoE block (``BLOCK_SIZE_M`` 64, ``BLOCK_SIZE_N`` 128); each expert's last tile of rows is partial.
TILE_ROWS = 64
TILE_COLUMNS = 128


@dataclass(frozen=True)
class ExpertFigures:
    """Measured fused-MoE kernels of one GPU in one compute dtype (SI units), priced by :func:`experts_seconds`.

    Attributes
    ----------
    flops_fraction : float
        Largest share of the compute dtype's peak the grouped GEMMs reach.
    weight_bandwidth_fraction : float
        Share of HBM bandwidth at which the touched experts' weights stream.
    stream_bandwidth_fraction : float
        Share of HBM bandwidth at which the pairs' activations move (gathered inputs, scattered outputs, the
        SwiGLU, the input quantization, the sum over ``top_k``).
    half_rows : float
        Pairs per expert at which the grouped GEMMs reach half their FLOP share.
    floor_s : float
        Fixed time of one layer's experts (routing, sorting, the kernels' launches), s.
    tile_s : float
        Time per output tile of the two grouped GEMMs (:func:`expert_tiles`) over the whole GPU, s.
    surface : mcsim.perf.gemm_surface.GemmSurface, optional
        The fit's measured residuals by shape (width on the GPU as ``N``, hidden size as ``K``, tokens as rows):
        the correction of :func:`experts_seconds` for a layer of that shape (None: the formula alone).
    """

    flops_fraction: float
    weight_bandwidth_fraction: float
    stream_bandwidth_fraction: float
    half_rows: float
    floor_s: float
    tile_s: float
    surface: object = field(default=None, hash=False, compare=False, repr=False)

    def factor(self, tokens: float, hidden: float, width: float) -> float:
        """The measured correction of a layer of ``tokens`` tokens (token-expert pairs / ``top_k``), hidden size
        ``hidden`` and ``width`` intermediate columns on the GPU (1 without a surface)."""
        return 1.0 if self.surface is None else self.surface.factor(tokens, width, hidden)


def expert_tiles(pairs, experts, hidden, width):
    """Output tiles of the two grouped GEMMs of ``pairs`` token-expert pairs over ``experts`` touched experts of
    ``width`` intermediate columns on the GPU: ``(pairs / TILE_ROWS + experts) x (ceil(2 width / TILE_COLUMNS) +
    ceil(hidden / TILE_COLUMNS))`` (each expert's partial last tile of rows counted as one half on average)."""
    return ((np.asarray(pairs, dtype=float) / TILE_ROWS + experts)
            * (np.ceil(2.0 * np.asarray(width, dtype=float) / TILE_COLUMNS)
               + np.ceil(np.asarray(hidden, dtype=float) / TILE_COLUMNS)))


def expert_stream_bytes(pairs, tokens, hidden, width, *, activation_bytes, input_bytes):
    """Bytes of activations one fused MoE layer moves besides the weights: the gate/up GEMM reads each pair's input
    (``hidden`` at ``input_bytes``) and writes ``2 width``; the SwiGLU reads those and writes ``width``; the down GEMM
    reads ``width`` (at ``input_bytes``) and writes ``hidden``; the sum over ``top_k`` reads every pair's output and
    writes each of the ``tokens`` rows once. A compute format narrower than the activations adds the quantization of
    the tokens' inputs and of the SwiGLU's output (each read at the activations' width, written at its own)."""
    a, q = activation_bytes, input_bytes
    out = (pairs * (hidden * q + 2.0 * width * a)  # gate/up GEMM
           + pairs * 3.0 * width * a  # SwiGLU
           + pairs * (width * q + hidden * a)  # down GEMM
           + pairs * hidden * a + tokens * hidden * a)  # sum over top_k
    if q < a:
        out = out + tokens * hidden * (a + q) + pairs * width * (a + q)
    return out


def experts_seconds(flops, weight_bytes, stream_bytes, *, rows_per_expert, tiles, peak, hbm, figures):
    """Time of one MoE layer's routed experts on one GPU, one fused kernel, from measured figures, s (floats or
    arrays).

    ``floor_s + max(flops / (peak x flops_fraction x r / (r + half_rows)), weight_bytes / (hbm x
    weight_bandwidth_fraction) + stream_bytes / (hbm x stream_bandwidth_fraction)) + tiles x tile_s`` with ``r``
    the pairs per touched expert, ``peak`` the compute dtype's peak FLOP/s and ``hbm`` the HBM bandwidth, bytes/s
    (:class:`ExpertFigures`).

    Examples
    --------
    >>> f = ExpertFigures(0.5, 0.9, 0.5, 50.0, 30e-6, 5e-9)
    >>> round(experts_seconds(1e9, 9e8, 1e7, rows_per_expert=1.0, tiles=1000.0, peak=1e15, hbm=3e12,
    ...                       figures=f) * 1e6, 1)  # 30 us + 333.3 + 6.7 us of bytes + 5 us of tiles
    375.0
    """
    rows = np.maximum(rows_per_expert, 1e-9)
    compute = flops / (peak * figures.flops_fraction) * (rows + figures.half_rows) / rows
    memory = (weight_bytes / (hbm * figures.weight_bandwidth_fraction)
              + stream_bytes / (hbm * figures.stream_bandwidth_fraction))
    out = figures.floor_s + np.maximum(compute, memory) + tiles * figures.tile_s
    return float(out) if np.ndim(out) == 0 else out

"""The MoE all-to-all as DeepEP runs it (SGLang's and vLLM's expert-parallel backend), from measured kernels.

DeepEP has two modes. **Low latency** (``deepep_low_latency``, for decode): every token-expert copy is its own
message (FP8 on dispatch, BF16 on combine) sent straight to the rank holding the expert, over NVLink inside a node and
RDMA (GPUDirect, one NIC per GPU) across nodes, with no deduplication; it is tuned for a few hundred tokens a rank.
**Normal** (``deepep_normal``, for prefill): a token goes once to each node that holds one of its experts (over
RDMA, to the GPU of the same index) and is forwarded inside the node over NVLink, so the bytes crossing nodes are
deduplicated; it pays a notify phase and more fixed time, and reaches higher throughput on large batches.

AIConfigurator's database times both (``wideep_deepep_ll_perf`` and ``wideep_deepep_normal_perf`` under SGLang) per
phase (dispatch, combine), node count (8 GPUs a node) and tokens a rank. Per mode, phase and node count the time is
linear in the bytes each rank sends, ``base + units x tokens x token_bytes / bandwidth``, with ``units`` the copies
a token sends that the measured time pays for (:func:`units`):

* low latency, one node of ``g`` ranks: ``k (g - 1) / g`` (the top-k copies bound for other GPUs); several nodes
  ``n``: ``k (n - 1) / n`` (the copies bound for other nodes, which the RDMA link carries; NVLink's share is
  faster and runs beside it);
* normal, one node: the distinct other ranks a token's experts lie on, ``(g - 1)(1 - (1 - 1/g)^k)``; several
  nodes: the distinct other nodes, ``(n - 1)(1 - (1 - 1/n)^k)`` (uniform routing).

:func:`fit` fits ``base`` and ``bandwidth`` per (mode, phase, node count) to an export of those tables
(``mcsim/data/measurements/aiconfigurator/<gpu>_sglang_<version>_deepep.csv.gz``); ``token_bytes`` is the hidden size
at two bytes (BF16), whatever the kernel sends, so the bandwidth is an effective one. An all-to-all over a node count
not measured takes the fit of the nearest measured one (in octaves), with its own ``units``; beyond one node on a
GPU measured inside one node only, there is no figure (None: the analytic model prices it). A GPU whose NVLink
differs from the measured one's (H800) scales the one-node bandwidth by the ratio of their links.
"""

from __future__ import annotations

import csv
import functools
import gzip
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

#: The modes (``performance.alltoall`` names) and the table's name of each.
MODES = {"deepep_low_latency": "ll", "deepep_normal": "normal"}
PHASES = ("dispatch", "combine")
#: GPUs a node in the measured tables.
TABLE_GPUS_PER_NODE = 8
#: Columns of an export.
COLUMNS = ("op_name", "node_num", "hidden_size", "num_token", "num_topk", "num_experts", "dispatch_us", "combine_us")
#: Bytes an element the fits count (BF16).
ELEMENT_BYTES = 2.0


def units(mode: str, nodes: int, topk: float, ranks_per_node: int) -> float:
    """Copies of one token the measured time pays for, in ``mode`` over ``nodes`` nodes of ``ranks_per_node`` ranks
    (module docstring)."""
    if mode not in MODES:
        raise ValueError(f"DeepEP mode must be one of {', '.join(MODES)}; got {mode!r}")
    g, n = max(int(ranks_per_node), 1), max(int(nodes), 1)
    if MODES[mode] == "ll":
        return topk * ((n - 1) / n if n > 1 else (g - 1) / g)
    if n > 1:
        return (n - 1) * (1.0 - (1.0 - 1.0 / n) ** topk)
    return (g - 1) * (1.0 - (1.0 - 1.0 / g) ** topk)


@dataclass(frozen=True)
class DeepEPFigures:
    """Fitted DeepEP figures of one GPU: ``(mode, phase, nodes) -> (base_s, bytes_per_s)``, with the source and the
    NVLink bandwidth of the GPU measured (GB/s a direction)."""

    fits: dict
    source: str
    scale_up_gb_s: float

    def nodes(self, mode: str) -> tuple:
        """The node counts measured in ``mode``."""
        return tuple(sorted({n for m, _, n in self.fits if m == mode}))

    def figure(self, mode: str, phase: str, nodes: int) -> tuple | None:
        """``(base_s, bytes_per_s)`` of the nearest measured node count (in octaves; one node only for one node),
        or None where none applies."""
        measured = self.nodes(mode)
        if nodes <= 1:
            return self.fits.get((mode, phase, 1))
        across = [n for n in measured if n > 1]
        if not across:
            return None
        nearest = min(across, key=lambda n: (abs(math.log2(n) - math.log2(nodes)), n))
        return self.fits[(mode, phase, nearest)]


def alltoall_seconds(mode: str, tokens: float, copies: float, token_bytes: float, group: int, gpus_per_node: int,
                     figures: DeepEPFigures, scale_up_gb_s: float) -> tuple | None:
    """``(dispatch_s, combine_s, bytes_sent)`` of one DeepEP dispatch and one combine of ``tokens`` tokens a rank,
    each to ``copies`` experts, over ``group`` ranks (``gpus_per_node`` a node; NVLink ``scale_up_gb_s``), with the
    bytes one of them sends as the fits count them, or None where the figures have no fit for that span.

    Examples
    --------
    >>> f = DeepEPFigures({("deepep_low_latency", p, 1): (10e-6, 200e9) for p in PHASES}, "test", 450.0)
    >>> d, c, sent = alltoall_seconds("deepep_low_latency", 100, 8, 7168 * 2, 8, 8, f, 450.0)
    >>> round(d * 1e6, 2), round(sent / 1e6, 3)  # 10 us + 7/8 of 8 copies of 100 tokens of 14,336 B at 200 GB/s
    (60.18, 10.035)
    """
    if group <= 1 or tokens <= 0:
        return 0.0, 0.0, 0.0
    nodes = math.ceil(group / gpus_per_node)
    ranks_per_node = min(group, gpus_per_node)
    sent = tokens * units(mode, nodes, copies, ranks_per_node) * token_bytes
    out = []
    for phase in PHASES:
        fit = figures.figure(mode, phase, nodes)
        if fit is None:
            return None
        base, rate = fit
        if nodes == 1 and scale_up_gb_s > 0 and figures.scale_up_gb_s > 0:
            rate = rate * min(1.0, scale_up_gb_s / figures.scale_up_gb_s)  # a slower NVLink (H800)
        out.append(base + sent / rate)
    return out[0], out[1], sent


def read_export(path) -> dict:
    """An export (:data:`COLUMNS`) as arrays: ``op_name`` as str, the rest as float64."""
    with gzip.open(path, "rt", newline="") as handle:
        rows = list(csv.DictReader(handle))
    if not rows or any(c not in rows[0] for c in COLUMNS):
        raise ValueError(f"{path}: expected a DeepEP export with columns {', '.join(COLUMNS)}")
    return {c: np.array([r[c] for r in rows], dtype=str if c == "op_name" else float) for c in COLUMNS}


def _line(sent: np.ndarray, measured: np.ndarray) -> tuple:
    """``(base_s, bytes_per_s)`` of ``base + sent / rate`` minimising the squared relative error against ``measured``
    (a weighted linear least squares; ``base`` held at 0 where the free fit would make it negative)."""
    design = np.stack([1.0 / measured, sent / measured], axis=1)
    (base, per_byte), *_ = np.linalg.lstsq(design, np.ones_like(measured), rcond=None)
    if base < 0:
        base, per_byte = 0.0, float(np.sum(sent / measured) / np.sum((sent / measured) ** 2))
    return float(base), 1.0 / float(per_byte)


def fit(table: dict, source: str = "", scale_up_gb_s: float = 0.0) -> DeepEPFigures:
    """Fit ``base`` and ``bandwidth`` per (mode, phase, node count) of an export, minimising the relative error
    (:func:`_line`)."""
    fits = {}
    for mode, name in MODES.items():
        for nodes in np.unique(table["node_num"][table["op_name"] == name]):
            rows = (table["op_name"] == name) & (table["node_num"] == nodes)
            n = int(nodes)
            sent = np.array([units(mode, n, k, TABLE_GPUS_PER_NODE) for k in table["num_topk"][rows]]) \
                * table["num_token"][rows] * table["hidden_size"][rows] * ELEMENT_BYTES
            for phase in PHASES:
                fits[(mode, phase, n)] = _line(sent, table[f"{phase}_us"][rows] * 1e-6)
    return DeepEPFigures(fits, source, scale_up_gb_s)


def errors(table: dict, figures: DeepEPFigures) -> dict:
    """Modelled / measured - 1 of every row of an export at ``figures``: ``(mode, phase) -> array``."""
    out = {}
    for mode, name in MODES.items():
        rows = table["op_name"] == name
        for phase in PHASES:
            modelled = []
            for tokens, k, h, n in zip(table["num_token"][rows], table["num_topk"][rows], table["hidden_size"][rows],
                                       table["node_num"][rows]):
                group = int(n) * TABLE_GPUS_PER_NODE
                d, c, _ = alltoall_seconds(mode, tokens, k, h * ELEMENT_BYTES, group, TABLE_GPUS_PER_NODE, figures,
                                           figures.scale_up_gb_s)
                modelled.append(d if phase == "dispatch" else c)
            out[(mode, phase)] = np.array(modelled) / (table[f"{phase}_us"][rows] * 1e-6) - 1.0
    return out


def bundled_path(name: str) -> Path:
    """The bundled export a catalog entry names (``deepep_table``)."""
    return Path(str(resources.files("mcsim.data") / "measurements" / "aiconfigurator" / f"{name}_deepep.csv.gz"))


#: The NVLink bandwidth (GB/s a direction) of the GPU each bundled export was measured on.
MEASURED_SCALE_UP = {"h100_sglang_0.5.6.post2": 450.0, "b200_sglang_0.5.12": 900.0}


@functools.lru_cache(maxsize=8)
def for_hardware(name: str) -> DeepEPFigures | None:
    """The fitted figures of the bundled export a catalog entry names ("" = none)."""
    if not name:
        return None
    return fit(read_export(bundled_path(name)), source=name, scale_up_gb_s=MEASURED_SCALE_UP.get(name, 0.0))

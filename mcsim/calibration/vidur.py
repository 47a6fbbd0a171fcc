"""Readers of Vidur's public profiling data: measured NCCL collective and per-layer GEMM times (external truth
for step times).

The bundled files (``mcsim/data/measurements/vidur/``, MIT licence, see its README) are CSVs with one row per
(message size, GPUs, placement) and the median, mean, min, max and standard deviation of the measured time in
milliseconds. :func:`read_collectives` returns them as arrays in SI units (bytes, seconds); a malformed file is a
:class:`MeasurementError` naming ``file:line``.

Examples
--------
>>> times = read_collectives(bundled_collectives("h100_dgx", "all_reduce"))
>>> times.collective, sorted(set(times.workers.tolist()))
('all_reduce', [2, 4, 8])
"""

from __future__ import annotations

import csv
import math
import os
import stat
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from mcsim.errors import McsimError

#: Bytes per unit of the ``size`` column. Vidur's collective profiler records the buffer in bytes: its wrapper
#: stores ``self._size * 2  # bytes`` for a ``torch.float16`` tensor of ``_size`` elements.
SIZE_UNIT_BYTES = 1
CLUSTERS = ("h100_dgx", "a100_dgx")
COLLECTIVES = ("all_reduce", "send_recv")
#: Bundled per-layer measurements: GPU -> models (Hugging Face names).
LINEAR_MODELS = {"h100": ("Llama-2-7b-hf", "Llama-2-70b-hf", "CodeLlama-34b-Instruct-hf"),
                 "a100": ("Llama-2-7b-hf", "Llama-2-70b-hf", "Meta-Llama-3-8B", "Meta-Llama-3-70B")}
#: The measured GEMMs, grouped as mcsim's roofline prices them (one op per group and layer).
LINEAR_GROUPS = {"attention_proj": ("attn_pre_proj", "attn_post_proj"), "dense_ffn": ("mlp_up_proj", "mlp_down_proj")}
#: The measured element-wise kernels of one layer and how many times a layer runs each: mcsim's ``elementwise`` op
#: (two RMSNorms, RoPE, SwiGLU and two residual adds; the profile times one residual add).
ELEMENTWISE_OPS = {"input_layernorm": 1, "post_attention_layernorm": 1, "attn_rope": 1, "mlp_act": 1, "add": 2}


class MeasurementError(McsimError, ValueError):
    """A measurement file that cannot be read; ``str(err)`` is ``file:line: what is wrong``."""


@dataclass(frozen=True)
class CollectiveTimes:
    """Measured times of one collective, one entry per row.

    Attributes
    ----------
    collective : str
        ``all_reduce`` or ``send_recv``.
    nbytes : int64[n]
        Message per GPU, bytes.
    workers, devices_per_node : int64[n]
        GPUs in the collective, and how many of them share a node.
    median_s, mean_s, std_s : float64[n]
        Measured time over the profiler's repeats, s.
    source : str
        The file.
    """

    collective: str
    nbytes: np.ndarray
    workers: np.ndarray
    devices_per_node: np.ndarray
    median_s: np.ndarray
    mean_s: np.ndarray
    std_s: np.ndarray
    source: str


def bundled_collectives(cluster: str, collective: str) -> Path:
    """Path of a bundled measurement file (``cluster`` in :data:`CLUSTERS`, ``collective`` in :data:`COLLECTIVES`)."""
    if cluster not in CLUSTERS or collective not in COLLECTIVES:
        raise MeasurementError(f"no bundled measurement for {cluster}/{collective}; clusters: {', '.join(CLUSTERS)}, "
                               f"collectives: {', '.join(COLLECTIVES)}")
    root = resources.files("mcsim.data") / "measurements" / "vidur" / "network" / cluster / f"{collective}.csv"
    return Path(str(root))


def _number(text) -> float:
    """A finite number from a CSV field (ValueError for text, NaN and infinities: ``inf`` or ``1e400`` would get
    past every range check and fail inside the fit)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError("not a finite number")
    return value


def _rows(reader, path: Path, start: int = 2):
    """``(line, row)`` of a CSV reader; the csv module's own errors (a field over its 128 KiB limit, a stray NUL)
    become one-line :class:`MeasurementError` naming the line."""
    line = start
    try:
        for row in reader:
            yield line, row
            line += 1
    except csv.Error as err:
        raise MeasurementError(f"{path}:{line}: not a measurement row ({err})") from None


def _open(path: Path):
    """The measurement file opened for ``csv`` (a one-line :class:`MeasurementError` when it cannot be read, or is
    not a regular file: opening a named pipe would wait for a writer forever)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise MeasurementError(f"{path}: not a regular file (a pipe, device or folder); give a CSV file")
        return path.open(newline="", encoding="utf-8")
    except OSError as err:
        raise MeasurementError(f"{path}: cannot read the file ({err.strerror})") from None


def read_collectives(path) -> CollectiveTimes:
    """Read a Vidur ``all_reduce.csv`` or ``send_recv.csv`` (columns found by name)."""
    path = Path(path)
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        kinds = {name.split(".")[1] for name in header if name.startswith("time_stats.") and name.count(".") == 2}
        if len(kinds) != 1:
            raise MeasurementError(f"{path}:1: expected time_stats.<collective>.<stat> columns of one collective, "
                                   f"got columns of {len(kinds) or 'no'} collective{'' if len(kinds) == 1 else 's'}")
        kind = kinds.pop()
        needed = ["size", "num_workers", "devices_per_node"] + [f"time_stats.{kind}.{s}" for s in ("median", "mean",
                                                                                                    "std")]
        missing = [c for c in needed if c not in header]
        if missing:
            raise MeasurementError(f"{path}:1: missing column(s) {', '.join(missing)}")
        rows = []
        for line, row in _rows(reader, path):
            try:
                size, workers, per_node = int(row["size"]), int(row["num_workers"]), int(row["devices_per_node"])
                median, mean, std = (_number(row[f"time_stats.{kind}.{s}"]) for s in ("median", "mean", "std"))
            except (TypeError, ValueError):
                raise MeasurementError(f"{path}:{line}: expected integers for size, num_workers, devices_per_node "
                                       f"and finite numbers for the times") from None
            if size <= 0 or workers < 1 or per_node < 1 or not median > 0 or not mean > 0:
                raise MeasurementError(f"{path}:{line}: sizes, GPUs and times must be positive")
            rows.append((size, workers, per_node, median, mean, std))
    if not rows:
        raise MeasurementError(f"{path}: no measurements")
    a = np.array(rows, dtype=float)
    return CollectiveTimes(kind, a[:, 0].astype(np.int64) * SIZE_UNIT_BYTES, a[:, 1].astype(np.int64),
                           a[:, 2].astype(np.int64), a[:, 3] / 1e3, a[:, 4] / 1e3, a[:, 5] / 1e3, str(path))


@dataclass(frozen=True)
class LinearTimes:
    """Measured per-layer GEMM times of one model on one GPU, one entry per (tokens, TP) row.

    Attributes
    ----------
    tokens, tp : int64[n]
        Tokens in the forward pass and tensor-parallel degree (the GEMMs are one GPU's shards).
    hidden, heads, kv_heads, ffn : int
        The model's shape.
    seconds : dict
        :data:`LINEAR_GROUPS` name -> float64[n], the summed median times of that group's GEMMs, s.
    gemm_seconds : dict
        Each GEMM of :data:`LINEAR_GROUPS` (``attn_pre_proj``, ...) -> float64[n], its median time, s.
    elementwise_s : float64[n]
        The layer's element-wise kernels (:data:`ELEMENTWISE_OPS`, each as often as a layer runs it), s.
    source : str
    model : str
        The model's name: the folder the file is in (Vidur's layout ``<gpu>/<org>/<model>/mlp.csv``).
    """

    tokens: np.ndarray
    tp: np.ndarray
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    seconds: dict
    elementwise_s: np.ndarray
    source: str
    model: str = ""
    gemm_seconds: dict = field(default_factory=dict)


def bundled_linear(gpu: str, model: str) -> Path:
    """Path of a bundled ``mlp.csv`` (``gpu`` and ``model`` from :data:`LINEAR_MODELS`)."""
    if model not in LINEAR_MODELS.get(gpu, ()):
        raise MeasurementError(f"no bundled per-layer measurement for {gpu}/{model}; bundled: "
                               + ", ".join(f"{g}/{m}" for g, ms in LINEAR_MODELS.items() for m in ms))
    return Path(str(resources.files("mcsim.data") / "measurements" / "vidur" / "compute" / gpu / model / "mlp.csv"))


def read_linear(path) -> LinearTimes:
    """Read a Vidur ``mlp.csv``: per-layer GEMM times by tokens and TP (columns found by name)."""
    path = Path(path)
    ops = [op for group in LINEAR_GROUPS.values() for op in group] + list(ELEMENTWISE_OPS)
    shape_columns = ("n_embd", "n_head", "n_kv_head", "n_expanded_embd")
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        needed = ["num_tokens", "num_tensor_parallel_workers", *shape_columns,
                  *(f"time_stats.{op}.median" for op in ops)]
        missing = [c for c in needed if c not in header]
        if missing:
            raise MeasurementError(f"{path}:1: missing column(s) {', '.join(missing)}")
        rows, shape = [], None
        for line, row in _rows(reader, path):
            try:
                this = tuple(int(row[c]) for c in shape_columns)
                values = [int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])] + [
                    _number(row[f"time_stats.{op}.median"]) for op in ops]
            except (TypeError, ValueError):
                raise MeasurementError(f"{path}:{line}: expected integers for the shape, tokens and TP and "
                                       "finite numbers for the times") from None
            if shape is not None and this != shape:
                raise MeasurementError(f"{path}:{line}: the model shape changes within the file")
            if values[0] < 1 or values[1] < 1 or not all(v > 0 for v in values[2:]):
                raise MeasurementError(f"{path}:{line}: tokens, TP and times must be positive")
            shape = this
            rows.append(values)
    if not rows:
        raise MeasurementError(f"{path}: no measurements")
    a = np.array(rows, dtype=float)
    seconds, each, column = {}, {}, 2
    for name, group in LINEAR_GROUPS.items():
        seconds[name] = a[:, column:column + len(group)].sum(axis=1) / 1e3
        for j, op in enumerate(group):
            each[op] = a[:, column + j] / 1e3
        column += len(group)
    elementwise = sum(count * a[:, column + i] for i, count in enumerate(ELEMENTWISE_OPS.values())) / 1e3
    hidden, heads, kv_heads, ffn = shape
    return LinearTimes(a[:, 0].astype(np.int64), a[:, 1].astype(np.int64), hidden, heads, kv_heads, ffn, seconds,
                       elementwise, str(path), path.parent.name, each)

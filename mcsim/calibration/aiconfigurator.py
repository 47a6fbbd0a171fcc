"""GEMM tables of AIConfigurator's kernel database (NVIDIA's ``aiconfigurator``, Apache-2.0): GEMMs timed one by one
on a real GPU under a serving engine, by dtype and shape, read as the GEMM op class of :mod:`mcsim.calibration.fit`.

A table (``systems/data/<gpu>/gemm/<engine>/<version>/gemm_perf.parquet`` in the database) has one row per timed
GEMM: ``gemm_dtype`` (``bfloat16``, ``fp8`` per-tensor scaled, ``fp8_block`` block-scaled, ``nvfp4`` where
measured), ``m`` (rows: tokens), ``n``, ``k`` and ``latency`` (milliseconds), with the kernel that ran it
(``kernel_source``). :func:`gemm_observations` turns the rows of one dtype into observations priced as the
roofline prices a GEMM (``2 m n k`` FLOPs at the dtype's peak; the weights at the dtype's width, the input at the
compute width and the output in BF16), so :func:`fit_dtype` fits the four figures the catalog keeps per dtype
(``hardware.gemm_<dtype>_*``).

Reading the parquet file needs a parquet library (``pip install "mcsim[aiconfigurator]"``); a CSV export of a table
(the same columns, optionally gzip-compressed) needs none. The catalog keeps the fitted figures; the measured rows
they were fitted to ship as such exports (:func:`export_gemms`, :func:`bundled`), so that ``mcsim validate`` checks
every bundled table without the database. Sources in ``mcsim/data/measurements/aiconfigurator/README.md``.

    python -m mcsim.calibration.aiconfigurator gemm_perf.parquet --hardware h100
"""

from __future__ import annotations

import argparse
import csv
import functools
import gzip
from importlib import resources
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from mcsim.calibration.files import load
from mcsim.calibration.fit import PARAMETERS, Observations, band_errors, fit_point, held_out, predict
from mcsim.perf import deepep, gemm_surface, roofline
from mcsim.perf.collectives import CUSTOM_GROUPS, CUSTOM_MAX_BYTES, custom_allreduce, custom_allreduce_shape
from mcsim.perf.fused_moe import EXPERTS_CLASSES, expert_stream_bytes, expert_tiles
from mcsim.perf.hardware import ATTENTION_CALL_KERNELS, as_hardware, gemm_figures
from mcsim.scenario import catalog

try:  # optional: the database is an extra, never a dependency (pip install "mcsim[aiconfigurator]")
    import fastparquet
except ImportError:
    fastparquet = None
try:  # optional, the other parquet reader
    import pyarrow.parquet as pyarrow_parquet
except ImportError:
    pyarrow_parquet = None

#: The database's dtype names -> (the roofline's compute dtype, weight bytes, input bytes per element).
DTYPES = {"bfloat16": ("bf16", 2.0, 2.0), "fp8": ("fp8", 1.0, 1.0), "fp8_block": ("fp8", 1.0, 1.0),
          "nvfp4": ("fp4", 0.5, 0.5)}
#: The table's dtype that ``mcsim calibrate --dtype`` fits (FP8: the per-tensor scaled GEMMs a checkpoint in FP8
#: runs by default; block-scaled ones are ``fp8_block``).
TABLE_DTYPE = {"bf16": "bfloat16", "fp8": "fp8", "fp4": "nvfp4", "fp32": "float32"}
#: Output bytes per element (BF16, as the engines' scaled GEMMs write it).
OUTPUT_BYTES = 2.0
#: The shapes a transformer's layers have: at least this many columns and this depth, and at most this many rows.
MIN_N = MIN_K = 512
MAX_M = 16384
COLUMNS = ("gemm_dtype", "m", "n", "k", "latency")
PARAMETER_KEYS = ("performance.flops_fraction", "performance.bandwidth_fraction", "performance.gemm_half_tokens",
                  "performance.gemm_floor_s")


#: Columns of the database's tables that hold text, not numbers.
TEXT_COLUMNS = ("gemm_dtype", "allreduce_dtype", "moe_dtype", "nccl_dtype", "backend", "op_name", "kernel_source",
                "kv_cache_dtype", "distribution", "gemm_type")


def _is_number(value) -> bool:
    try:
        float(value)
    except (TypeError, ValueError):
        return False
    return True


def read_table(path, columns=COLUMNS, what: str = "a GEMM table") -> dict:
    """The ``columns`` of a table (:data:`COLUMNS`: a GEMM table; :data:`ALLREDUCE_COLUMNS`: a custom all-reduce
    table): a parquet file (with ``fastparquet`` or ``pyarrow``) or a CSV export; numbers as float64 arrays, the
    first column (a dtype) and any other text as arrays of str."""
    path = Path(path)
    expected = f"expected {what} with columns {', '.join(columns)}"
    text = {columns[0], *TEXT_COLUMNS}
    if not path.is_file():
        raise ValueError(f"{path}: no such file; {expected}")
    if path.name.endswith((".csv", ".csv.gz")):
        opener = gzip.open if path.suffix == ".gz" else open
        try:
            with opener(path, "rt", newline="", errors="replace") as handle:
                rows = list(csv.DictReader(handle))
        except (OSError, EOFError):  # a .gz that is not gzip
            raise ValueError(f"{path}: not a gzip-compressed CSV; {expected}") from None
        if not rows or any(c not in rows[0] for c in columns):
            raise ValueError(f"{path}: {expected}")
        out = {}
        for c in columns:
            values = [r[c] for r in rows]
            try:
                out[c] = np.array(values, dtype=str if c in text else float)
            except (TypeError, ValueError):  # the first row that is not a number, by position, never by content
                line = next(i for i, v in enumerate(values, start=2) if not _is_number(v))
                raise ValueError(f"{path}:{line}: column {c} is not a number; {expected} (latency in ms)") from None
        return out
    if fastparquet is None and pyarrow_parquet is None:
        raise ValueError(f"{path}: reading parquet needs fastparquet or pyarrow "
                         "(pip install \"mcsim[aiconfigurator]\"), or give a CSV export")
    try:
        if fastparquet is not None:
            frame = fastparquet.ParquetFile(str(path)).to_pandas(columns=list(columns))
        else:
            frame = pyarrow_parquet.read_table(str(path), columns=list(columns)).to_pandas()
        return {c: frame[c].to_numpy(dtype=str if c in text else float) for c in columns}
    except Exception as err:  # a parquet library's own errors, of many kinds: one line naming the file
        raise ValueError(f"{path}: not a parquet table mcsim reads ({type(err).__name__}); {expected}") from None


#: The bundled exports (:func:`bundled`): the stack and version they were measured under.
BUNDLED_STACK = "vllm_0.24.0"


def bundled(gpu: str, what: str = "gemm"):
    """The bundled export of ``gpu``'s ``what`` table (``gemm``: every transformer-shaped GEMM of its fitted dtypes;
    ``custom_allreduce``), measured under vLLM 0.24.0; None where none ships."""
    folder = resources.files("mcsim.data") / "measurements" / "aiconfigurator"
    name = f"{gpu}_{BUNDLED_STACK}_{what}.csv" + (".gz" if what in ("gemm", "attention", "moe", "mla") else "")
    path = Path(str(folder / name))
    return path if path.is_file() else None


def export_gemms(table: dict, dtypes, path) -> int:
    """Write the rows of ``dtypes`` (the database's names) with transformer-layer shapes (what :func:`fit_dtype`
    fits) as an export of :data:`COLUMNS` (:func:`write_export`); returns the rows written."""
    keep = (np.isin(table["gemm_dtype"], list(dtypes)) & (table["n"] >= MIN_N) & (table["k"] >= MIN_K)
            & (table["m"] <= MAX_M) & (table["latency"] > 0))
    return write_export([(table, keep)], COLUMNS, path, order=("gemm_dtype", "n", "k", "m"))


#: Columns of times, written to five significant digits (every other number is an integer).
TIMES = ("latency", "dispatch_us", "combine_us")


def write_export(parts, columns, path, order=None) -> int:
    """Write the rows ``keep`` of each ``(table, keep)`` of ``parts`` as a gzip-compressed CSV of ``columns`` (the
    database's own names, so :func:`read_table` reads it as it reads the table), each table's rows sorted by
    ``order`` (default: every column but the last, the latency), text as is, latency to five significant digits
    (below the spread of repeated timings), other numbers as integers; returns the rows written. The bytes depend on
    the rows alone (no timestamp)."""
    order = order or columns[:-1]
    lines = [",".join(columns)]
    for table, keep in parts:
        for i in np.flatnonzero(keep)[np.lexsort(tuple(table[c][keep] for c in reversed(order)))]:
            lines.append(",".join(str(table[c][i]) if c in TEXT_COLUMNS else f"{table[c][i]:.5g}" if c in TIMES
                                  else str(int(table[c][i])) for c in columns))
    Path(path).write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), 9, mtime=0))
    return len(lines) - 1


def gemm_observations(table: dict, hw, dtype: str, source: str = "") -> Observations:
    """The rows of ``dtype`` (a name of :data:`DTYPES`) with transformer-layer shapes, as GEMM observations on
    ``hw`` (a catalog entry or :class:`~mcsim.perf.hardware.Hardware`); each measured ``(n, k)`` is one shape."""
    if dtype not in DTYPES:
        raise ValueError(f"no {dtype} GEMM the roofline prices (its dtypes: {', '.join(DTYPES)})")
    compute, weight_bytes, input_bytes = DTYPES[dtype]
    hw = as_hardware(hw)
    keep = ((table["gemm_dtype"] == dtype) & (table["n"] >= MIN_N) & (table["k"] >= MIN_K) & (table["m"] <= MAX_M)
            & (table["latency"] > 0))
    m, n, k = table["m"][keep], table["n"][keep], table["k"][keep]
    if m.size == 0:
        raise ValueError(f"no {dtype} GEMM of a transformer layer's shape in the table")
    shape = np.unique(np.stack([n, k], axis=1), axis=0, return_inverse=True)[1].astype(np.int64).ravel()
    data = {"flops": 2.0 * m * n * k, "bytes": weight_bytes * n * k + input_bytes * m * k + OUTPUT_BYTES * m * n,
            "rows": m, "n": n, "k": k, "tp": np.ones_like(m), "kernels": np.ones_like(m),
            "peak": np.full(m.size, hw.peak_flops(compute)), "hbm": np.full(m.size, hw.hbm_bytes_s)}
    return Observations("gemm", table["latency"][keep] * 1e-3, shape, data, PARAMETER_KEYS,
                        sources=[source] if source else [])


def fit_dtype(table: dict, hw, dtype: str) -> dict:
    """The four GEMM figures of ``dtype`` fitted to the table (key units: fractions, rows, seconds), with the fit's
    ``rows``, ``shapes`` and in-sample ``mape`` (one curve per dtype, no surface by shape)."""
    obs = gemm_observations(table, hw, dtype)
    fitted = dict(zip(obs.active, (float(x) for x in fit_point(obs))))  # in the fit's units (the floor in us)
    modelled = predict(obs, fitted)
    units = {key: unit for key, unit, *_ in PARAMETERS["gemm"]}
    return {**{key: value * units[key] for key, value in fitted.items()}, "rows": int(len(obs)),
            "shapes": int(obs.shape.max() + 1), "mape": float(np.mean(np.abs(modelled / obs.measured_s - 1.0)))}


#: The columns of a custom all-reduce table (``comm/<engine>/<version>/custom_allreduce_perf.parquet``):
#: ``message_size`` in elements of ``allreduce_dtype``, ``latency`` in ms, ``backend`` e.g. ``vllm_graph`` (under
#: CUDA graphs, as an engine runs its decode steps) or ``vllm_eager``.
ALLREDUCE_COLUMNS = ("allreduce_dtype", "num_gpus", "message_size", "latency", "backend")
ELEMENT_BYTES = {"bfloat16": 2.0, "float16": 2.0, "float32": 4.0}


def fit_custom_allreduce(table: dict, backend: str = "vllm_graph") -> dict:
    """The serving engine's own all-reduce (:func:`mcsim.perf.collectives.custom_allreduce`: vLLM's one-shot /
    two-shot rule, a stage cost and the bandwidth of the bytes each GPU reads) fitted to the ``backend`` rows of a
    custom all-reduce table where the engine runs its kernels (groups of 2, 4, 6 or 8 GPUs, messages under
    8 MiB), by least squares of the log ratio: ``hardware.custom_allreduce_hop_us`` and ``custom_allreduce_gb_s``,
    the fit's ``rows``, its in-sample ``mape`` and each group's (``mape_by_group``)."""
    p = table["num_gpus"]
    nbytes = table["message_size"] * np.array([ELEMENT_BYTES.get(d, 2.0) for d in table["allreduce_dtype"]])
    keep = ((table["backend"] == backend) & np.isin(p, CUSTOM_GROUPS) & (nbytes < CUSTOM_MAX_BYTES)
            & (table["latency"] > 0))
    if not np.any(keep):
        raise ValueError(f"no {backend} all-reduce of 2, 4, 6 or 8 GPUs under 8 MiB in the table")
    p, nbytes, measured = p[keep], nbytes[keep], table["latency"][keep] * 1e-3
    _, stages, sent = custom_allreduce_shape(nbytes, p)  # vLLM's rule, as the step model prices it

    def model(x):
        return stages * x[0] * 1e-6 + sent / (x[1] * 1e9)

    fit = least_squares(lambda x: np.log(model(x)) - np.log(measured), [4.0, 100.0], bounds=([0.0, 1.0], [1e3, 1e4]),
                        x_scale="jac")
    error = np.abs(model(fit.x) / measured - 1.0)
    return {"hardware.custom_allreduce_hop_us": float(fit.x[0]), "hardware.custom_allreduce_gb_s": float(fit.x[1]),
            "rows": int(keep.sum()), "mape": float(error.mean()),
            "mape_by_group": {int(g): float(error[p == g].mean()) for g in np.unique(p)}}


#: The columns of an attention table (``attention/<engine>/<version>/generation_attention_perf.parquet`` and
#: ``context_attention_perf.parquet``), in an export both in one: ``op_name`` (``generation_attention``: one decode
#: token of each of ``batch_size`` sequences over ``step`` cached tokens; ``context_attention``: ``batch_size``
#: prompts of ``isl`` tokens), the heads and width on the GPU, ``kv_cache_dtype``, ``window_size`` (0: full
#: attention) and ``latency`` (ms).
ATTENTION_COLUMNS = ("op_name", "kernel_source", "kv_cache_dtype", "batch_size", "isl", "step", "num_heads",
                     "num_key_value_heads", "head_dim", "window_size", "latency")
#: KV-cache bytes per element by the table's dtype.
KV_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0}
#: Kernels of an opt-in backend, left out of a fit of what an engine runs by default (FlashAttention 4 on Hopper).
OPT_IN_KERNELS = ("vllm_flash_attn_fa4",)


def attention_observations(table: dict, hw, kv_dtype: str = "bfloat16", source: str = "") -> Observations:
    """The full-attention rows of ``kv_dtype`` run by the engine's default kernels, as attention observations on
    ``hw``: each decode row one call over ``batch_size`` sequences of ``step`` cached tokens, each prefill row one
    call over ``batch_size`` prompts of ``isl`` tokens with no prefix (each token attends to ``isl / 2`` earlier ones
    on average), FLOPs and bytes as the step model counts them (:func:`mcsim.perf.roofline.step_cost`); each
    (phase, query heads, KV heads, head width) is one shape."""
    keep = ((table["window_size"] == 0) & (table["kv_cache_dtype"] == kv_dtype) & (table["latency"] > 0)
            & ~np.isin(table["kernel_source"], OPT_IN_KERNELS)
            & np.isin(table["op_name"], ("generation_attention", "context_attention")))
    if not np.any(keep):
        raise ValueError(f"no full-attention row with a {kv_dtype} KV cache in the table")
    decode = table["op_name"][keep] == "generation_attention"
    b, hq = table["batch_size"][keep], table["num_heads"][keep]
    kv, hd = table["num_key_value_heads"][keep], table["head_dim"][keep]
    tokens = np.where(decode, b, b * table["isl"][keep])
    context = np.where(decode, table["step"][keep], table["isl"][keep] / 2.0)  # what each new token attends to
    kv_token = 2.0 * kv * hd * KV_BYTES[kv_dtype]
    reads = np.where(decode, b * context, context)  # decode: every sequence's cache; a prompt chunk: its prefix
    hw = as_hardware(hw)
    data = {"flops": 4.0 * hq * hd * tokens * context,
            "bytes": (reads + tokens) * kv_token + tokens * 2 * hq * hd * 2.0,
            "decode": decode.astype(float), "sequences": np.where(decode, b, 0.0), "kv_heads": kv,
            "work": np.where(decode, 0.0, tokens * hq), "head_dim": hd, "context": context, "rows": tokens,
            "peak": np.full(b.size, hw.peak_flops("bf16")), "hbm": np.full(b.size, hw.hbm_bytes_s)}
    shape = np.unique(np.stack([decode, hq, kv, hd], axis=1), axis=0, return_inverse=True)[1].astype(np.int64).ravel()
    return Observations("attention", table["latency"][keep] * 1e-3, shape, data,
                        tuple(key for key, *_ in PARAMETERS["attention"]), sources=[source] if source else [])


def export_attention(tables, path) -> int:
    """Write the full-attention rows (bf16 and fp8 KV caches) of ``tables`` (a generation and a context attention
    table), without the opt-in kernels', as one export of :data:`ATTENTION_COLUMNS` (:func:`write_export`); returns
    the rows written."""
    return write_export([(table, (table["window_size"] == 0) & np.isin(table["kv_cache_dtype"], list(KV_BYTES))
                          & ~np.isin(table["kernel_source"], OPT_IN_KERNELS) & (table["latency"] > 0))
                         for table in tables], ATTENTION_COLUMNS, path)


#: The dtypes of each bundled GEMM export (the database's names).
BUNDLED_DTYPES = {"h100": ("bfloat16", "fp8"), "h200": ("bfloat16", "fp8"), "b200": ("bfloat16", "fp8", "nvfp4")}


@functools.lru_cache(maxsize=None)
def _bundled_table(gpu: str, what: str = "gemm") -> dict:
    columns, label = {"gemm": (COLUMNS, "a GEMM table"), "attention": (ATTENTION_COLUMNS, "an attention table"),
                      "moe": (MOE_COLUMNS, "a fused MoE table"), "mla": (MLA_COLUMNS, "an MLA module table"),
                      "custom_allreduce": (ALLREDUCE_COLUMNS, "a custom all-reduce table")}[what]
    return read_table(bundled(gpu, what), columns, label)


def bundled_held_out(gpu: str, dtype: str, max_folds: int = 40) -> tuple[float, dict, int, int]:
    """Each bundled GEMM of ``gpu`` in ``dtype`` (the database's name) predicted by a fit and surface built without
    its shape (:func:`mcsim.calibration.fit.held_out`): ``(MAPE, MAPE by row band, GEMMs, shapes)``."""
    obs = gemm_observations(_bundled_table(gpu), catalog.hardware_preset(gpu), dtype)
    predicted, _ = held_out(obs, fit_point(obs), max_folds)
    return (float(np.mean(np.abs(predicted / obs.measured_s - 1.0))),
            band_errors(predicted, obs.measured_s, obs.data["rows"]), len(obs),
            int(obs.shape.max() + 1))


def bundled_attention_held_out(gpu: str, max_folds: int = 40) -> dict:
    """Each bundled attention call of ``gpu`` (BF16 KV cache) predicted by a fit without its shape, and by the
    catalog's GEMM figures (how attention was priced before its kernels were measured): phase -> (held-out MAPE,
    GEMM-figures MAPE, calls); and, for the FP8 KV-cache calls, the catalog's figures at one byte an element."""
    hw = catalog.hardware_preset(gpu)
    table = _bundled_table(gpu, "attention")
    obs = attention_observations(table, hw)
    predicted, _ = held_out(obs, fit_point(obs), max_folds)
    figures = as_hardware(hw)
    # the GEMM figures on attention: a roofline at the BF16 peak and HBM bandwidth shares, plus 3 kernel floors
    flops_share, bandwidth_share = figures.gemm_flops_fraction, figures.gemm_bandwidth_fraction
    before = (np.maximum(obs.data["flops"] / (obs.data["peak"] * flops_share),
                         obs.data["bytes"] / (obs.data["hbm"] * bandwidth_share)) + 3 * figures.kernel_floor_us * 1e-6)
    out = {}
    for phase, rows in (("decode", obs.data["decode"] > 0), ("prefill", obs.data["decode"] == 0)):
        out[phase] = (float(np.mean(np.abs(predicted[rows] / obs.measured_s[rows] - 1.0))),
                      float(np.mean(np.abs(before[rows] / obs.measured_s[rows] - 1.0))), int(rows.sum()))
    fp8 = attention_observations(table, hw, kv_dtype="fp8")
    catalog_values = {key: hw[key.split(".", 1)[1]] for key in fp8.active}
    if hw["attention_fp8_kv_bandwidth_fraction"] > 0:  # the FP8 cache's own decode figures (fit_fp8_kv)
        catalog_values["hardware.attention_bandwidth_fraction"] = hw["attention_fp8_kv_bandwidth_fraction"]
        catalog_values["hardware.attention_unit_ns"] = hw["attention_fp8_kv_unit_ns"]
    errors = predict(fp8, catalog_values) / fp8.measured_s - 1.0
    out["fp8 kv decode"] = (float(np.mean(np.abs(errors[fp8.data["decode"] > 0]))), float("nan"),
                            int((fp8.data["decode"] > 0).sum()))
    return out


def fit_fp8_kv(gpu: str) -> dict:
    """The decode attention figures of an FP8 KV cache on ``gpu``: the catalog's attention fit (a BF16 cache's)
    held, ``attention_bandwidth_fraction`` and ``attention_unit_ns`` refitted to the bundled FP8-KV decode calls;
    with the in-sample MAPE of the held fit at one byte an element and of the refit."""
    hw = catalog.hardware_preset(gpu)
    obs = attention_observations(_bundled_table(gpu, "attention"), hw, kv_dtype="fp8")
    decode = obs.subset(np.flatnonzero(obs.data["decode"] > 0))
    held = {key: hw[key.split(".", 1)[1]] for key in decode.active}

    def modelled(x):
        return predict(decode, {**held, "hardware.attention_bandwidth_fraction": x[0],
                                "hardware.attention_unit_ns": x[1]})

    x = least_squares(lambda x: np.log(modelled(x)) - np.log(decode.measured_s), [0.9, 20.0],
                      bounds=([0.05, 0.0], [1.0, 1e4]), x_scale="jac").x
    return {"attention_fp8_kv_bandwidth_fraction": float(x[0]), "attention_fp8_kv_unit_ns": float(x[1]),
            "calls": len(decode),
            "mape_held": float(np.mean(np.abs(predict(decode, held) / decode.measured_s - 1.0))),
            "mape": float(np.mean(np.abs(modelled(x) / decode.measured_s - 1.0)))}


def calibration_gemm_errors(gpu: str, calibration: str) -> np.ndarray:
    """Relative errors (modelled / measured - 1) of a bundled calibration's GEMM figures and surface
    (``mcsim/data/calibrations/<calibration>.toml``) against every bundled BF16 GEMM of ``gpu``, as the step model
    prices a GEMM: one measured source against another."""
    path = gemm_surface.bundled_path(calibration)
    units = {key: unit for key, unit, *_ in PARAMETERS["gemm"]}  # a file keeps SI; the fit's units differ
    values = {key: spec["estimate"] / units[key] for key, spec in load(path).parameters.items() if key in units}
    obs = gemm_observations(_bundled_table(gpu), catalog.hardware_preset(gpu), "bfloat16")
    return predict(obs, values, gemm_surface.read(path)) / obs.measured_s - 1.0


def custom_allreduce_errors(gpu: str, backend: str = "vllm_graph") -> np.ndarray:
    """Relative errors of the catalog's custom all-reduce of ``gpu`` (:func:`mcsim.perf.collectives.custom_allreduce`,
    as the step model prices it) against every bundled ``backend`` row it runs (2-8 GPUs, under 8 MiB)."""
    table = _bundled_table(gpu, "custom_allreduce")
    hw = catalog.hardware_preset(gpu)
    nbytes = table["message_size"] * np.array([ELEMENT_BYTES.get(d, 2.0) for d in table["allreduce_dtype"]])
    errors = []
    for b, p, nb, ms in zip(table["backend"], table["num_gpus"], nbytes, table["latency"]):
        priced = custom_allreduce(nb, int(p), hw) if b == backend else None
        if priced is not None:
            errors.append(priced[0] / (ms * 1e-3) - 1.0)
    return np.array(errors)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="Fit the roofline's GEMM figures per dtype to a GEMM table of "
                                                 "AIConfigurator's database, or the engine's all-reduce to a custom "
                                                 "all-reduce table.")
    parser.add_argument("table", help="gemm_perf.parquet or custom_allreduce_perf.parquet (or a CSV export)")
    parser.add_argument("--hardware", required=True, help="the catalog's accelerator the table was measured on")
    parser.add_argument("--export", metavar="OUT.csv.gz", help="write the table's transformer-shaped GEMMs of "
                                                                 "--dtypes as a compressed CSV (what ships)")
    parser.add_argument("--dtypes", default="bfloat16,fp8", help="the database's dtypes to export")
    parser.add_argument("more", nargs="*", help="with --export of an attention table: the other phase's table; of "
                                                "DeepEP's low-latency table: its normal table")
    args = parser.parse_args(argv)
    if "nccl" in Path(args.table).name:
        table = read_table(args.table, NCCL_COLUMNS, "an NCCL table")
        if args.export:
            keep = (table["op_name"] == "all_reduce") & (table["nccl_dtype"] == "half")
            print(f"{args.export}: {write_export([(table, keep)], NCCL_COLUMNS, args.export):,} all-reduces")
            return
        obs = nccl_allreduce_observations(table)
        x = fit_point(obs)
        mape = float(np.mean(np.abs(predict(obs, dict(zip(obs.active, x))) / obs.measured_s - 1.0)))
        print("NCCL all-reduce: " + ", ".join(f"{k.split('.', 1)[1]} {v:.4g}" for k, v in zip(obs.active, x))
              + f" ({len(obs)} messages, in-sample MAPE {mape:.3f})")
        return
    if "deepep" in Path(args.table).name:  # the low-latency table, then the normal one
        low_latency = read_table(args.table, DEEPEP_LL_COLUMNS, "a DeepEP low-latency table")
        normal = read_table(args.more[0], DEEPEP_NORMAL_COLUMNS, "a DeepEP normal table")
        print(f"{args.export}: {export_deepep(low_latency, normal, args.export):,} all-to-alls")
        return
    if "moe" in Path(args.table).name:
        table = read_table(args.table, MOE_COLUMNS, "a fused MoE table")
        if args.export:
            print(f"{args.export}: {export_moe(table, args.export):,} MoE layers")
            return
        for compute in MOE_DTYPES:
            if np.any(table["moe_dtype"] == MOE_DTYPES[compute][0]):
                obs = experts_observations(table, catalog.hardware_preset(args.hardware), compute)
                x = fit_point(obs)
                mape = float(np.mean(np.abs(predict(obs, dict(zip(obs.active, x))) / obs.measured_s - 1.0)))
                print(f"{compute} experts: " + ", ".join(f"{k.split('.', 1)[1]} {v:.4g}" for k, v in
                                                          zip(obs.active, x))
                      + f" ({len(obs):,} layers of {int(obs.shape.max() + 1)} shapes, in-sample MAPE {mape:.3f})")
        return
    if "mla" in Path(args.table).name:
        tables = [read_table(t, MLA_COLUMNS, "an MLA module table") for t in (args.table, *args.more)]
        if args.export:
            print(f"{args.export}: {export_mla(tables, args.export):,} MLA modules")
            return
        obs = mla_observations(tables[0] if len(tables) == 1 else
                               {c: np.concatenate([t[c] for t in tables]) for c in MLA_COLUMNS},
                               catalog.hardware_preset(args.hardware))
        x = fit_point(obs)
        mape = float(np.mean(np.abs(predict(obs, dict(zip(obs.active, x))) / obs.measured_s - 1.0)))
        print("MLA modules: " + ", ".join(f"{k.split('.', 1)[1]} {v:.4g}" for k, v in zip(obs.active, x))
              + f" ({len(obs):,} modules, in-sample MAPE {mape:.3f})")
        return
    if args.export and "attention" in Path(args.table).name:
        tables = [read_table(t, ATTENTION_COLUMNS, "an attention table") for t in (args.table, *args.more)]
        print(f"{args.export}: {export_attention(tables, args.export):,} attention calls")
        return
    if args.export:
        rows = export_gemms(read_table(args.table), args.dtypes.split(","), args.export)
        print(f"{args.export}: {rows:,} GEMMs")
        return
    if "allreduce" in Path(args.table).name:
        fit = fit_custom_allreduce(read_table(args.table, ALLREDUCE_COLUMNS, "a custom all-reduce table"))
        hop = fit["hardware.custom_allreduce_hop_us"]
        print(f"custom all-reduce under CUDA graphs: custom_allreduce_hop_us {hop:.3f}, "
              f"custom_allreduce_gb_s {fit['hardware.custom_allreduce_gb_s']:.1f} ({fit['rows']} messages, MAPE "
              f"{fit['mape']:.3f}; by group " + ", ".join(f"{g}: {m:.3f}" for g, m in fit["mape_by_group"].items())
              + ")")
        return
    table = read_table(args.table)
    hw = catalog.hardware_preset(args.hardware)
    for dtype in DTYPES:
        if not np.any(table["gemm_dtype"] == dtype):
            continue
        fit = fit_dtype(table, hw, dtype)
        print(f"{dtype}: flops_fraction {fit['performance.flops_fraction']:.4f}, bandwidth_fraction "
              f"{fit['performance.bandwidth_fraction']:.4f}, half_tokens {fit['performance.gemm_half_tokens']:.1f}, "
              f"floor_us {fit['performance.gemm_floor_s'] * 1e6:.3f} ({fit['rows']:,} GEMMs of {fit['shapes']} "
              f"shapes, in-sample MAPE {fit['mape']:.3f})")



#: Llama-3.1-70B's per-GPU GEMMs at TP 8 (QKV, O, gate/up, down) as ``(N, K)``: the layer :func:`layer_kernels`
#: sums. The QKV projection's 1,280 columns lie between the measured 1,024 and 1,536 (their mean is taken).
LLAMA70B_TP8_GEMMS = ((1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584))


def layer_kernels(gpu: str, batch: int, context: int = 2047, dtype: str = "bfloat16") -> float:
    """One Llama-3.1-70B TP8 decode layer of ``batch`` sequences over ``context`` cached tokens as the sum of its
    kernels measured on ``gpu`` under vLLM 0.24.0, s: the four GEMMs in ``dtype``, the attention call (BF16 KV) and
    the two custom all-reduces under CUDA graphs (the bundled rows; element-wise kernels are not in the tables)."""
    gemms, attention = _bundled_table(gpu), _bundled_table(gpu, "attention")
    allreduce = _bundled_table(gpu, "custom_allreduce")

    def measured(table, **where):
        rows = np.ones(len(table["latency"]), dtype=bool)
        for column, value in where.items():
            rows &= table[column] == value
        if not rows.any():
            raise ValueError(f"no measured row of {gpu} with {where}")
        return float(table["latency"][rows].mean()) * 1e-3

    total = 0.0
    for n, k in LLAMA70B_TP8_GEMMS:
        columns = (1024, 1536) if n == 1280 else (n,)
        total += np.mean([measured(gemms, gemm_dtype=dtype, m=batch, n=c, k=k) for c in columns])
    total += measured(attention, op_name="generation_attention", batch_size=batch, step=context, num_heads=8,
                      num_key_value_heads=1, head_dim=128, kv_cache_dtype="bfloat16", window_size=0)
    return total + 2 * measured(allreduce, backend="vllm_graph", num_gpus=8, message_size=batch * 8192)


#: The columns of a fused MoE table (``moe/<engine>/<version>/moe_perf.parquet``): one MoE layer's experts on one
#: GPU (routing, both grouped GEMMs, the activation) over ``num_tokens`` tokens, ``latency`` in ms.
MOE_COLUMNS = ("moe_dtype", "kernel_source", "distribution", "num_tokens", "hidden_size", "inter_size", "topk",
               "num_experts", "moe_tp_size", "moe_ep_size", "latency")
#: The table's MoE dtypes by the experts' compute format, and their weight and input bytes per element.
MOE_DTYPES = {"bf16": ("bfloat16", 2.0, 2.0), "fp8": ("fp8_block", 1.0, 1.0), "fp4": ("nvfp4", 0.5, 0.5)}


def _moe_rows(table: dict, dtype: str) -> np.ndarray:
    """The rows a fit of ``dtype`` (the table's name) reads: balanced routing, every expert on the GPU (``moe_ep_size``
    1: experts sharded by columns, as the step model's ``etp`` shards them), the kernel the engine runs by default for
    that dtype (the one with the most such rows)."""
    keep = ((table["moe_dtype"] == dtype) & (table["distribution"] == "balanced") & (table["moe_ep_size"] == 1)
            & (table["latency"] > 0))
    if not np.any(keep):
        raise ValueError(f"no balanced {dtype} MoE row with every expert on the GPU in the table")
    kernels, counts = np.unique(table["kernel_source"][keep], return_counts=True)
    return keep & (table["kernel_source"] == kernels[np.argmax(counts)])


@functools.lru_cache(maxsize=None)
def balanced_experts(tokens: int, experts: int, topk: int) -> int:
    """Distinct experts the collector's balanced routing touches: token ``t``'s ``j``-th expert is
    ``(t + j s) mod E`` with stride ``s = ceil(E / k)`` (``(t s / T + j s) mod E``, truncated, for ``T < s``), as
    AIConfigurator's ``balanced_logits`` builds its router logits (``collector/helper.py``)."""
    stride = -(-experts // topk)
    t = np.arange(int(tokens))
    touched = np.zeros(int(experts), dtype=bool)
    for j in range(int(topk)):
        first = t if tokens >= stride else t * stride / tokens
        touched[np.floor((first + j * stride) % experts).astype(np.int64)] = True
    return int(touched.sum())


def experts_observations(table: dict, hw, compute: str, source: str = "") -> Observations:
    """The kept rows of a fused MoE table in ``compute`` (``"bf16"``, ``"fp8"``, ``"fp4"``; :func:`_moe_rows`) as
    observations of the experts class (``experts``, ``experts_fp8`` or ``experts_fp4``): each row one layer's routed
    experts on one GPU over ``num_tokens`` tokens, with its FLOPs, the touched experts' weight bytes, the pairs'
    activation bytes (:func:`mcsim.perf.fused_moe.expert_stream_bytes`), pairs per touched expert and output tiles,
    as the step model counts them. Balanced routing touches the experts :func:`balanced_experts` counts. Rows faster
    than those experts' weights can be read at HBM's peak are left out: their model routes tokens by groups
    (DeepSeek-style grouped top-k), so the logits touched fewer. Each (hidden, width on the GPU, top-k, experts) is
    one shape; each row's index in the table is kept as ``table_row``."""
    name, weight_bytes, input_bytes = MOE_DTYPES[compute]
    hw = as_hardware(hw)
    rows = _moe_rows(table, name)
    tokens, hidden = table["num_tokens"][rows], table["hidden_size"][rows]
    width = table["inter_size"][rows] / table["moe_tp_size"][rows]
    pairs = tokens * table["topk"][rows]
    touched = np.array([balanced_experts(int(t), int(e), int(k)) for t, e, k in zip(
        tokens, table["num_experts"][rows], table["topk"][rows])], dtype=float)
    measured = table["latency"][rows] * 1e-3
    weights = touched * 3.0 * hidden * width * weight_bytes
    keep = measured > weights / hw.hbm_bytes_s
    data = {"flops": 6.0 * pairs * hidden * width, "weight_bytes": weights,
            "stream_bytes": expert_stream_bytes(pairs, tokens, hidden, width, activation_bytes=2.0,
                                                input_bytes=input_bytes),
            "per_expert": pairs / touched, "tiles": expert_tiles(pairs, touched, hidden, width), "rows": tokens,
            "n": width, "k": hidden, "table_row": np.flatnonzero(rows).astype(float),
            "peak": np.full(tokens.size, hw.peak_flops(compute)), "hbm": np.full(tokens.size, hw.hbm_bytes_s)}
    shape = np.unique(np.stack([hidden, width, table["topk"][rows], table["num_experts"][rows]], axis=1)[keep],
                      axis=0, return_inverse=True)[1].astype(np.int64).ravel()
    cls = EXPERTS_CLASSES[compute]
    return Observations(cls, measured[keep], shape, {k: v[keep] for k, v in data.items()},
                        tuple(key for key, *_ in PARAMETERS[cls]), sources=[source] if source else [])


def bundled_experts_held_out(gpu: str, compute: str, max_folds: int = 40) -> tuple[float, dict, int, int]:
    """Each bundled fused MoE layer of ``gpu`` in ``compute`` predicted by a fit without its shape:
    ``(MAPE, MAPE by tokens band, layers, shapes)``."""
    obs = experts_observations(_bundled_table(gpu, "moe"), catalog.hardware_preset(gpu), compute)
    predicted, _ = held_out(obs, fit_point(obs), max_folds)
    return (float(np.mean(np.abs(predicted / obs.measured_s - 1.0))),
            band_errors(predicted, obs.measured_s, obs.data["rows"]), len(obs), int(obs.shape.max() + 1))


def catalog_achievable(hw, compute: str, **extra) -> "roofline.Achievable":
    """The step model's GEMM and element-wise figures of ``hw`` (a :class:`~mcsim.perf.hardware.Hardware`) with its
    linear layers in ``compute`` (its own measured figures and surface where it has them), fused kernels, no
    launch or step overhead: what a measured kernel of a table is compared with; ``extra`` sets other fields."""
    figures = gemm_figures(hw)
    bf16 = roofline.LinearGemms(figures["performance.flops_fraction"], figures["performance.bandwidth_fraction"],
                                figures["performance.gemm_half_tokens"], figures["performance.gemm_floor_s"],
                                gemm_surface.for_hardware(hw.gemm_surface))
    own = hw.gemm_dtype_figures(compute)
    linear = bf16 if own is None else roofline.LinearGemms(*own[:4], gemm_surface.for_hardware(own[4]))
    return roofline.Achievable(
        flops_fraction=bf16.flops_fraction, bandwidth_fraction=bf16.bandwidth_fraction,
        gemm_half_tokens=bf16.gemm_half_tokens, gemm_floor_s=bf16.gemm_floor_s, gemm_surface=bf16.gemm_surface,
        kernel_floor_s=figures["performance.kernel_floor_s"],
        elementwise_bandwidth_fraction=figures["performance.elementwise_bandwidth_fraction"], fused=True,
        linear=linear, experts=linear, **extra)


def step_model_experts_errors(gpu: str, compute: str, measured: bool = True, stride: int = 1) -> np.ndarray:
    """Modelled / measured - 1 of every kept row of ``gpu``'s bundled fused MoE table in ``compute``, each row priced
    by the step model (:func:`mcsim.perf.roofline.step_cost`, its ``moe_ffn`` op) as one MoE layer of that shape over
    that many tokens, experts sharded by TP, the touched experts the collector's: with the catalog's measured
    experts figures (``measured``), else as the grouped GEMMs of the GEMM tables' figures and surface (how routed
    experts were priced before their kernels were measured). ``stride`` prices every stride-th row only (a quick
    check)."""
    table = _bundled_table(gpu, "moe")
    hw = as_hardware(catalog.hardware_preset(gpu))
    obs = experts_observations(table, hw, compute)
    _, weight_bytes, _ = MOE_DTYPES[compute]
    prec = roofline.Precision(weight_bytes=weight_bytes, kv_bytes=2.0, activation_bytes=2.0, compute=compute)
    achievable = catalog_achievable(hw, compute, moe=hw.expert_figures(compute) if measured else None)
    picked = np.arange(0, len(obs), max(int(stride), 1))
    out = np.empty(picked.size)
    for j, i in enumerate(obs.data["table_row"][picked].astype(np.int64)):
        tokens, experts, topk = int(table["num_tokens"][i]), int(table["num_experts"][i]), int(table["topk"][i])
        model = {"hidden_size": int(table["hidden_size"][i]), "expert_ffn": float(table["inter_size"][i]),
                 "experts": experts, "active_experts": topk, "shared_experts": 0, "layers": 1, "dense_layers": 0,
                 "moe_layers": 1, "attention": "gqa", "attention_heads": 8, "kv_heads": 8, "head_dim": 128,
                 "vocab": 1, "dense_ffn": 0}
        cost = roofline.step_cost(model, hw, decode_seqs=tokens, decode_context=1, precision=prec,
                                  parallel=roofline.Parallelism(tp=int(table["moe_tp_size"][i])),
                                  achievable=achievable, distinct_experts=balanced_experts(tokens, experts, topk))
        out[j] = cost.breakdown["moe_ffn"]["t"]
    return out / obs.measured_s[picked] - 1.0


#: The columns of an MLA module table (``mla/<engine>/<version>/mla_{generation,context}_module_perf.parquet``):
#: DeepSeek-V3's whole MLA attention module (projections, norms, RoPE, the cache write, the attention kernel) on one
#: GPU, ``num_heads`` of its 128 heads, ``batch_size`` sequences of ``step`` cached tokens (decode) or ``isl`` new
#: ones (prefill), ``latency`` in ms, under CUDA graphs.
MLA_COLUMNS = ("op_name", "kernel_source", "kv_cache_dtype", "gemm_type", "num_heads", "batch_size", "isl", "step",
               "latency")
#: The MLA tables' GEMM dtypes by the projections' compute dtype and their weight bytes.
MLA_GEMMS = {"bfloat16": ("bf16", 2.0), "fp8_block": ("fp8", 1.0)}
#: The model the MLA tables time.
MLA_MODEL = "deepseek-v3"


def _mla_rows(table: dict, kv_dtype: str = "bfloat16") -> np.ndarray:
    """The rows an MLA fit reads: a ``kv_dtype`` cache, projections in a dtype of :data:`MLA_GEMMS`, per phase the
    kernel with the most such rows (the engine's default)."""
    keep = np.zeros(len(table["latency"]), dtype=bool)
    for op in ("mla_generation_module", "mla_context_module"):
        rows = ((table["op_name"] == op) & (table["kv_cache_dtype"] == kv_dtype) & (table["latency"] > 0)
                & np.isin(table["gemm_type"], list(MLA_GEMMS)))
        if np.any(rows):
            kernels, counts = np.unique(table["kernel_source"][rows], return_counts=True)
            keep |= rows & (table["kernel_source"] == kernels[np.argmax(counts)])
    if not np.any(keep):
        raise ValueError(f"no MLA module row with a {kv_dtype} KV cache in the table")
    return keep


def mla_observations(table: dict, hw, source: str = "", kv_dtype: str = "bfloat16",
                     stride: int = 1) -> Observations:
    """The kept rows of an MLA module table (:func:`_mla_rows`, BF16 cache) as observations of the ``mla`` class: each
    row one module on one GPU, its projections priced by the step model at the catalog's GEMM figures (``proj_s``:
    held, not fitted) and its attention calls as the step model counts them (:func:`mcsim.perf.roofline.mla_calls`);
    each (phase, heads, projection dtype) is one shape. ``before_s`` is what the step model priced the module at before
    MLA's kernels were measured: its projections and the roofline's attention with three element-wise kernel floors
    (:data:`mcsim.perf.hardware.ATTENTION_CALL_KERNELS`)."""
    hw = as_hardware(hw)
    rows = np.flatnonzero(_mla_rows(table, kv_dtype))[::max(int(stride), 1)]  # every stride-th row (a quick check)
    model = dict(catalog.model_preset(MLA_MODEL), layers=1, dense_layers=1)
    floor = ATTENTION_CALL_KERNELS * gemm_figures(hw)["performance.kernel_floor_s"]
    achievable = {compute: catalog_achievable(hw, compute, attention_floor_s=floor)
                  for compute, _ in MLA_GEMMS.values()}
    kv_token = (model["kv_lora_rank"] + model["qk_rope_head_dim"]) * KV_BYTES[kv_dtype]
    columns = {k: [] for k in ("proj_s", "before_s", "flops", "bytes", "decode", "sequences", "work", "context",
                               "kv_heads", "rows")}
    for i in rows:
        compute, weight_bytes = MLA_GEMMS[table["gemm_type"][i]]
        heads, batch = float(table["num_heads"][i]), float(table["batch_size"][i])
        decode = table["op_name"][i] == "mla_generation_module"
        tokens = batch if decode else batch * table["isl"][i]
        context = table["step"][i] if decode else table["isl"][i] / 2.0
        cost = roofline.step_cost(model, hw, decode_seqs=batch if decode else 0, decode_context=context if decode
                                  else 0, prefill_tokens=0 if decode else tokens, prefill_context=0 if decode
                                  else context,
                                  precision=roofline.Precision(weight_bytes=weight_bytes, compute=compute,
                                                               kv_bytes=KV_BYTES[kv_dtype]),
                                  parallel=roofline.Parallelism(tp=int(round(model["attention_heads"] / heads))),
                                  achievable=achievable[compute])
        call, = (roofline.mla_calls(model, heads, kv_token, 2.0, batch, tokens, context, 0, 0) if decode else
                 roofline.mla_calls(model, heads, kv_token, 2.0, 0, 0, 0, tokens, context))
        proj = cost.breakdown["attention_proj"]["t"]
        for key, value in (("proj_s", proj), ("before_s", proj + cost.breakdown["attention_core"]["t"]),
                           ("flops", call["flops"]),
                           ("bytes", call["nbytes"]), ("decode", float(decode)), ("sequences", call["sequences"]),
                           ("work", call["work"]), ("context", call["context"]), ("kv_heads", heads),
                           ("rows", tokens)):
            columns[key].append(value)
    data = {k: np.array(v, dtype=float) for k, v in columns.items()}
    data.update(peak=np.full(rows.size, hw.peak_flops("bf16")), hbm=np.full(rows.size, hw.hbm_bytes_s))
    shape = np.unique(np.stack([data["decode"], data["kv_heads"], table["gemm_type"][rows] == "fp8_block"], axis=1),
                      axis=0, return_inverse=True)[1].astype(np.int64).ravel()
    return Observations("mla", table["latency"][rows] * 1e-3, shape, data,
                        tuple(key for key, *_ in PARAMETERS["mla"]), sources=[source] if source else [])


def export_mla(tables, path) -> int:
    """Write the MLA module rows with a BF16 or FP8 cache and projections of :data:`MLA_GEMMS` of ``tables`` (a
    generation and a context table) as one export of :data:`MLA_COLUMNS`; returns the rows written."""
    return write_export([(t, np.isin(t["gemm_type"], list(MLA_GEMMS)) & (t["latency"] > 0)) for t in tables],
                        MLA_COLUMNS, path)


def fit_mla_fp8_kv(gpu: str) -> dict:
    """The MLA figures of an FP8 cache on ``gpu``: the catalog's MLA fit (a BF16 cache's) held, the module's fixed
    time and the decode call's bandwidth share and unit refitted to the bundled FP8-cache decode modules (FlashMLA's);
    with the in-sample MAPE of the held fit and of the refit, on decode and on all FP8-cache modules."""
    hw = catalog.hardware_preset(gpu)
    obs = mla_observations(_bundled_table(gpu, "mla"), hw, kv_dtype="fp8")
    decode = obs.subset(np.flatnonzero(obs.data["decode"] > 0))
    held = {key: hw[key.split(".", 1)[1]] for key in decode.active}
    names = ("hardware.mla_bandwidth_fraction", "hardware.mla_unit_ns", "hardware.mla_floor_us")

    def values(x):
        return {**held, **dict(zip(names, x))}

    x = least_squares(lambda x: np.log(predict(decode, values(x))) - np.log(decode.measured_s),
                      [held[n] for n in names], bounds=([0.05, 0.0, 0.0], [1.0, 1e4, 1e3]), x_scale="jac").x

    def mape(sub, v):
        return float(np.mean(np.abs(predict(sub, v) / sub.measured_s - 1.0)))

    return {"mla_fp8_kv_bandwidth_fraction": float(x[0]), "mla_fp8_kv_unit_ns": float(x[1]),
            "mla_fp8_kv_floor_us": float(x[2]), "modules": len(obs), "decode_mape_held": mape(decode, held),
            "decode_mape": mape(decode, values(x)), "mape": mape(obs, values(x))}


def bundled_mla_held_out(gpu: str, max_folds: int = 40, stride: int = 1) -> dict:
    """Each bundled MLA module of ``gpu`` (BF16 cache) predicted by a fit without its shape, and as the step model
    priced it before (:func:`mla_observations`' ``before_s``): phase -> (held-out MAPE, before MAPE, median before /
    measured, modules); and ``"fp8 kv"`` -> (MAPE, median modelled / measured, modules) of the modules over an FP8
    cache at the catalog's figures (its FP8-cache figures where fitted, :func:`fit_mla_fp8_kv`; else the BF16
    cache's at one byte an element)."""
    hw = catalog.hardware_preset(gpu)
    obs = mla_observations(_bundled_table(gpu, "mla"), hw, stride=stride)
    predicted, _ = held_out(obs, fit_point(obs), max_folds)
    fp8 = mla_observations(_bundled_table(gpu, "mla"), hw, kv_dtype="fp8", stride=stride)
    own = {key: hw[key.split(".", 1)[1]] for key in fp8.active}
    for name in ("floor_us", "bandwidth_fraction", "unit_ns"):  # the FP8 cache's own figures, where fitted
        if hw[f"mla_fp8_kv_{name}"] > 0:
            own[f"hardware.mla_{name}"] = hw[f"mla_fp8_kv_{name}"]
    ratio = predict(fp8, own) / fp8.measured_s
    out = {"fp8 kv": (float(np.mean(np.abs(ratio - 1.0))), float(np.median(ratio)), len(fp8))}
    for phase, rows in (("decode", obs.data["decode"] > 0), ("prefill", obs.data["decode"] == 0)):
        before = obs.data["before_s"][rows] / obs.measured_s[rows]
        out[phase] = (float(np.mean(np.abs(predicted[rows] / obs.measured_s[rows] - 1.0))),
                      float(np.mean(np.abs(before - 1.0))), float(np.median(before)), int(rows.sum()))
    return out


#: The columns of an NCCL table (``comm/nccl/<version>/nccl_perf.parquet``) mcsim reads: one collective over
#: ``num_gpus`` GPUs of one node, ``message_size`` elements of ``nccl_dtype``, ``latency`` in ms.
NCCL_COLUMNS = ("op_name", "nccl_dtype", "num_gpus", "message_size", "latency")
#: Bytes an element of the NCCL tables' dtypes.
NCCL_BYTES = {"half": 2.0, "bfloat16": 2.0, "float": 4.0, "int8": 1.0}
#: The NCCL version of the bundled NCCL exports, and the message sizes a fit reads (those of Vidur's profiles,
#: which the catalog's other NCCL fits read: 2 KiB-64 MiB).
BUNDLED_NCCL = "nccl_2.29.2"
NCCL_MIN_BYTES, NCCL_MAX_BYTES = 2048, 64 * 2 ** 20


def nccl_allreduce_observations(table: dict, source: str = "") -> Observations:
    """The NCCL all-reduces of an NCCL table (``all_reduce`` in 16-bit elements, 2 KiB-64 MiB) as observations of the
    ``allreduce`` class (:func:`mcsim.perf.collectives.allreduce_auto_seconds`), each (GPUs, bytes) one shape."""
    keep = ((table["op_name"] == "all_reduce") & (table["nccl_dtype"] == "half") & (table["latency"] > 0))
    nbytes = table["message_size"] * 2.0
    keep &= (nbytes >= NCCL_MIN_BYTES) & (nbytes <= NCCL_MAX_BYTES)
    if not np.any(keep):
        raise ValueError("no 16-bit NCCL all-reduce of 2 KiB-64 MiB in the table")
    workers = table["num_gpus"][keep]
    shape = np.unique(np.stack([workers, nbytes[keep]], axis=1), axis=0, return_inverse=True)[1].astype(np.int64)
    return Observations("allreduce", table["latency"][keep] * 1e-3, shape.ravel(),
                        {"bytes": nbytes[keep], "workers": workers},
                        tuple(key for key, *_ in PARAMETERS["allreduce"]), sources=[source] if source else [])


def bundled_nccl(gpu: str):
    """The bundled export of ``gpu``'s NCCL all-reduces (:data:`BUNDLED_NCCL`), or None where none ships."""
    path = Path(str(resources.files("mcsim.data") / "measurements" / "aiconfigurator"
                    / f"{gpu}_{BUNDLED_NCCL}_all_reduce.csv.gz"))
    return path if path.is_file() else None


def nccl_allreduce_errors(gpu: str, figures_of: str | None = None) -> np.ndarray:
    """Modelled / measured - 1 of ``gpu``'s bundled NCCL all-reduces priced by the catalog's NCCL figures of
    ``figures_of`` (default ``gpu``'s own)."""
    obs = nccl_allreduce_observations(read_table(bundled_nccl(gpu), NCCL_COLUMNS, "an NCCL table"))
    hw = catalog.hardware_preset(figures_of or gpu)
    return predict(obs, {key: hw[key.split(".", 1)[1]] for key in obs.active}) / obs.measured_s - 1.0


def export_moe(table: dict, path) -> int:
    """Write the rows every MoE fit reads (:func:`_moe_rows` of each of :data:`MOE_DTYPES`) as an export of
    :data:`MOE_COLUMNS` (:func:`write_export`); returns the rows written."""
    keep = np.zeros(len(table["latency"]), dtype=bool)
    for name, *_ in MOE_DTYPES.values():
        if np.any(table["moe_dtype"] == name):
            keep |= _moe_rows(table, name)
    return write_export([(table, keep)], MOE_COLUMNS, path)


if __name__ == "__main__":
    main()

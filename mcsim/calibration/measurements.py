"""Measured times as :class:`~mcsim.calibration.fit.Observations` of the step model's op classes.

Files are recognised by their header:

* Vidur's ``mlp.csv`` (``time_stats.attn_pre_proj.*`` ...): per-layer GEMMs (class ``gemm``) and element-wise
  kernels (class ``elementwise``) of one model on one GPU;
* Vidur's ``all_reduce.csv`` / ``send_recv.csv``: NCCL collectives (classes ``allreduce`` inside one node,
  ``allreduce_nodes`` over whole nodes, and ``send``); all-reduce rows of partly filled nodes (1-4 GPUs per node)
  are left out: mcsim lays a group out on consecutive GPUs;
* a plain step CSV (:data:`STEP_COLUMNS`): whole measured steps (class ``step``).

The step CSV
------------
One row per measured step of a serving engine (what vLLM's or SGLang's benchmark and step logs give)::

    hardware,model,tp,decode_seqs,mean_context,prefill_tokens,time_ms
    h100,llama-3.1-70b,8,64,2048,0,31.2

``hardware`` and ``model`` are mcsim catalog presets; ``tp`` the tensor-parallel degree of the instance;
``decode_seqs`` the sequences decoding one token in the step and ``mean_context`` their mean context (tokens);
``prefill_tokens`` the prompt tokens prefilled in the same step (a prefill chunk attends, on average, to half of
itself); ``time_ms`` the measured step time in milliseconds. Lines starting with ``#`` are comments. Each row is
modelled by the roofline with the scenario schema's defaults (CUDA graphs on, unfused kernels off per
``efficiency.fused_kernels``, no speculative drafting), the matmul format of the calibration's ``dtype`` and the
parameters this calibration fits from the other files; the fit then frees the per-step host overhead.
"""

from __future__ import annotations

import csv
import gzip
from dataclasses import replace
from pathlib import Path

import numpy as np

from mcsim.calibration.fit import Observations
from mcsim.calibration.vidur import (LINEAR_GROUPS, MeasurementError, _number, _open, _rows, read_collectives,
                                     read_linear)
from mcsim.perf import roofline
from mcsim.perf.factor import _model
from mcsim.perf.hardware import as_hardware
from mcsim.perf.roofline_model import options
from mcsim.scenario import catalog
from mcsim.scenario.loading import draw_uncertain, load_scenario, resolve
from mcsim.text import one_line

STEP_COLUMNS = ("hardware", "model", "tp", "decode_seqs", "mean_context", "prefill_tokens", "time_ms")
KINDS = ("vidur-mlp", "vidur-all_reduce", "vidur-send_recv", "steps", "aiconfigurator-gemm",
         "aiconfigurator-attention", "aiconfigurator-moe", "aiconfigurator-mla", "aiconfigurator-nccl")


def shape_ids(*columns) -> np.ndarray:
    """One id per row: rows with equal values in every column (one measured configuration) share it."""
    _, ids = np.unique(np.stack([np.asarray(c, float) for c in columns], axis=1), axis=0, return_inverse=True)
    return ids.ravel().astype(np.int64)


def kind_of(path) -> str:
    """Which of :data:`KINDS` a measurement file is, from its header (a :class:`MeasurementError` otherwise)."""
    path = Path(path)
    if path.suffix == ".parquet":  # AIConfigurator's database keeps its tables so, named by what they time
        return ("aiconfigurator-attention" if "attention" in path.name
                else "aiconfigurator-moe" if path.name.startswith("moe")
                else "aiconfigurator-mla" if path.name.startswith("mla")
                else "aiconfigurator-nccl" if path.name.startswith("nccl") else "aiconfigurator-gemm")
    if path.name.endswith(".csv.gz"):  # an export of one of its tables
        try:
            with gzip.open(path, "rt", newline="", errors="replace") as handle:
                header = next(csv.reader(handle), [])
        except (OSError, EOFError):
            raise MeasurementError(f"{path}: not a gzip-compressed CSV") from None
        names = {h.strip() for h in header}
        if {"op_name", "batch_size", "num_key_value_heads", "latency"} <= names:
            return "aiconfigurator-attention"
        if {"moe_dtype", "num_tokens", "num_experts", "latency"} <= names:
            return "aiconfigurator-moe"
        if {"op_name", "gemm_type", "num_heads", "latency"} <= names:
            return "aiconfigurator-mla"
        if {"op_name", "nccl_dtype", "num_gpus", "message_size", "latency"} <= names:
            return "aiconfigurator-nccl"
        return "aiconfigurator-gemm"
    with _open(path) as handle:
        try:
            header = next(csv.reader(line for line in handle if not line.startswith("#")), [])
        except (UnicodeDecodeError, csv.Error) as err:
            raise MeasurementError(f"{path}:1: not a CSV file ({type(err).__name__})") from None
    names = {h.strip() for h in header}
    if any(n.startswith("time_stats.attn_pre_proj.") for n in names):
        return "vidur-mlp"
    if any(n.startswith("time_stats.all_reduce.") for n in names):
        return "vidur-all_reduce"
    if any(n.startswith("time_stats.send_recv.") for n in names):
        return "vidur-send_recv"
    if set(STEP_COLUMNS) <= names:
        return "steps"
    if {"gemm_dtype", "m", "n", "k", "latency"} <= names:
        return "aiconfigurator-gemm"
    raise MeasurementError(f"{path}:1: not a measurement file mcsim reads: expected Vidur's mlp.csv, all_reduce.csv "
                           f"or send_recv.csv columns, AIConfigurator's gemm_perf table, or the step CSV columns "
                           f"{', '.join(STEP_COLUMNS)}")


def _dense_model(hidden: int, heads: int, kv_heads: int, ffn: int) -> dict:
    """A dense GQA model entry of this shape (the layer count is irrelevant: times are per layer)."""
    return dict(catalog.model_preset("llama-3-70b"), hidden_size=hidden, attention_heads=heads, kv_heads=kv_heads,
                head_dim=hidden // heads, dense_ffn=ffn, layers=1, dense_layers=1)


def linear_observations(path, hw, dtype: str = "bf16") -> tuple[Observations, Observations]:
    """(gemm, elementwise) observations of one ``mlp.csv``: each measured GEMM a row of its own, shaped as the
    roofline shapes it (:func:`mcsim.perf.roofline.attention_gemms`, :func:`~mcsim.perf.roofline.ffn_gemms`).

    A file row of ``num_tokens = M`` at TP ``tp`` gives four GEMMs of ``M`` rows: the QKV and output projections and
    the FFN's gate/up and down projections, each with its ``N`` and ``K`` (the data's ``n`` and ``k``), ``2 M N K``
    FLOPs and its BF16 weights and activations as bytes; the row's element-wise kernels are one elementwise row,
    priced as a prefill of ``M`` tokens on one layer. The four GEMMs of a file row share its shape id (they are left
    out of a fit together).
    """
    measured = read_linear(path)
    hw = as_hardware(hw)
    model = _dense_model(measured.hidden, measured.heads, measured.kv_heads, measured.ffn)
    unit = roofline.Achievable(flops_fraction=1.0, bandwidth_fraction=1.0, gemm_floor_s=1.0, kernel_floor_s=1.0,
                               launch_overhead_s=0.0, step_overhead_s=0.0)  # floor / 1 s = the kernel count
    precision = roofline.Precision(weight_bytes=2.0, kv_bytes=2.0, compute=dtype, activation_bytes=2.0)
    shape = shape_ids(measured.tokens, measured.tp)
    gemm = {k: [] for k in ("flops", "bytes", "rows", "n", "k", "tp", "measured", "shape")}
    elem = {k: [] for k in ("bytes", "kernels", "measured", "shape")}
    names = [op for group in LINEAR_GROUPS.values() for op in group]
    for i, (t, tp) in enumerate(zip(measured.tokens.tolist(), measured.tp.tolist())):
        shapes = (roofline.attention_gemms(model, tp)
                  + roofline.ffn_gemms(measured.hidden, measured.ffn / tp))
        for name, (n_cols, depth) in zip(names, shapes):
            gemm["flops"].append(2.0 * t * n_cols * depth)
            gemm["bytes"].append(2.0 * (n_cols * depth + t * (n_cols + depth)))
            gemm["rows"].append(float(t))
            gemm["n"].append(float(n_cols))
            gemm["k"].append(float(depth))
            gemm["tp"].append(float(tp))
            gemm["measured"].append(measured.gemm_seconds[name][i])
            gemm["shape"].append(shape[i])
        cost = roofline.step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=t,
                                  parallel=roofline.Parallelism(tp=tp), achievable=unit, precision=precision)
        op = cost.breakdown["elementwise"]
        elem["bytes"].append(op["bytes"])
        elem["kernels"].append(op["floor"])
        elem["measured"].append(measured.elementwise_s[i])
        elem["shape"].append(shape[i])
    peak, hbm = hw.peak_flops(dtype), hw.hbm_bytes_s
    g = {k: np.asarray(v, float) for k, v in gemm.items()}
    e = {k: np.asarray(v, float) for k, v in elem.items()}
    n_g, n_e = len(g["measured"]), len(e["measured"])
    gemm_obs = Observations("gemm", g.pop("measured"), g.pop("shape").astype(np.int64),
                            {**g, "kernels": np.ones(n_g), "peak": np.full(n_g, peak), "hbm": np.full(n_g, hbm)},
                            ("performance.flops_fraction", "performance.bandwidth_fraction",
                             "performance.gemm_half_tokens", "performance.gemm_floor_s"), sources=[str(path)])
    elem_obs = Observations("elementwise", e.pop("measured"), e.pop("shape").astype(np.int64),
                            {**e, "hbm": np.full(n_e, hbm)},
                            ("performance.kernel_floor_s", "performance.elementwise_bandwidth_fraction"),
                            sources=[str(path)])
    return gemm_obs, elem_obs


def allreduce_observations(path) -> Observations:
    """All-reduces inside one node (rows whose GPUs all share a node)."""
    times = read_collectives(path)
    if times.collective != "all_reduce":
        raise MeasurementError(f"{path}:1: expected all_reduce times, got {times.collective}")
    inside = times.devices_per_node == times.workers
    if not inside.any():
        raise MeasurementError(f"{path}: no all-reduce inside one node to fit")
    nbytes, workers = times.nbytes[inside].astype(float), times.workers[inside].astype(float)
    shape = shape_ids(workers, nbytes)
    return Observations("allreduce", times.median_s[inside], shape, {"bytes": nbytes, "workers": workers},
                        ("hardware.collective_base_us", "hardware.collective_hop_us", "hardware.allreduce_bus_gb_s"),
                        sources=[str(path)])


def allreduce_node_observations(path, gpus_per_node: int) -> Observations | None:
    """All-reduces over whole nodes of ``gpus_per_node`` GPUs (the layout mcsim gives a group that spans nodes);
    None when the file has none."""
    times = read_collectives(path)
    rows = (times.devices_per_node == gpus_per_node) & (times.workers > gpus_per_node)
    if times.collective != "all_reduce" or not rows.any():
        return None
    nbytes, workers = times.nbytes[rows].astype(float), times.workers[rows].astype(float)
    shape = shape_ids(workers, nbytes)
    return Observations("allreduce_nodes", times.median_s[rows], shape, {"bytes": nbytes, "workers": workers},
                        ("hardware.remote_allreduce_base_us", "hardware.remote_allreduce_bus_gb_s"),
                        sources=[str(path)])


def send_observations(path) -> Observations:
    """Point-to-point sends: inside a node (``devices_per_node`` 2) and between nodes (1)."""
    times = read_collectives(path)
    if times.collective != "send_recv":
        raise MeasurementError(f"{path}:1: expected send_recv times, got {times.collective}")
    across = (times.devices_per_node == 1).astype(float)
    nbytes = times.nbytes.astype(float)
    shape = shape_ids(across, nbytes)
    active = []
    if (across == 0).any():
        active += ["hardware.send_base_us", "hardware.send_gb_s"]
    if (across == 1).any():
        active += ["hardware.remote_send_base_us", "hardware.remote_send_gb_s"]
    return Observations("send", times.median_s, shape, {"bytes": nbytes, "across": across}, tuple(active),
                        sources=[str(path)])


def read_steps(path) -> list[dict]:
    """Rows of a step CSV (see the module docstring), checked: a :class:`MeasurementError` names file:line."""
    path = Path(path)

    rows = []
    with _open(path) as handle:
        lines = [(n, line) for n, line in enumerate(handle, start=1) if line.strip() and not line.startswith("#")]
        if not lines:
            raise MeasurementError(f"{path}: no measurements")
        reader = csv.DictReader([line for _, line in lines])
        try:
            reader.fieldnames
        except csv.Error as err:
            raise MeasurementError(f"{path}:{lines[0][0]}: not a step CSV header ({err})") from None
        missing = [c for c in STEP_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise MeasurementError(f"{path}:{lines[0][0]}: missing column(s) {', '.join(missing)}")
        for (line, _), (_, row) in zip(lines[1:], _rows(reader, path)):
            try:
                hardware, model = row["hardware"].strip(), row["model"].strip()
                tp, seqs, prefill = int(row["tp"]), int(row["decode_seqs"]), int(row["prefill_tokens"])
                context, time_ms = _number(row["mean_context"]), _number(row["time_ms"])
            except (TypeError, ValueError, AttributeError):
                raise MeasurementError(f"{path}:{line}: expected integers for tp, decode_seqs and prefill_tokens "
                                       "and finite numbers for mean_context and time_ms") from None
            if tp < 1 or seqs < 0 or prefill < 0 or seqs + prefill == 0 or not context >= 0 or not time_ms > 0:
                raise MeasurementError(f"{path}:{line}: tp >= 1, some decode sequences or prefill tokens, "
                                       "mean_context >= 0 and time_ms > 0 are needed")
            for section, name, names in (("hardware", hardware, sorted(catalog.hardware())),
                                         ("model", model, sorted(catalog.models()))):
                if name not in names:
                    raise MeasurementError(f"{path}:{line}: unknown {section} preset {one_line(name, 40)!r}; known: "
                                           + ", ".join(names))
            rows.append({"hardware": hardware, "model": model, "tp": tp, "decode_seqs": seqs,
                         "mean_context": context, "prefill_tokens": prefill, "time_s": time_ms / 1e3, "line": line})
    if not rows:
        raise MeasurementError(f"{path}: no measurements")
    return rows


def step_parameters(hardware: str, model: str, tp: int, dtype: str, values: dict) -> dict:
    """A resolved parameter set of the roofline for one measured step: the schema's defaults, these presets, the
    matmul format ``dtype`` and ``values`` (fitted parameters, key units) on top."""
    precision = 'enabled = false' if dtype == "bf16" else f'enabled = true\ncompute = "{dtype}"'
    text = (f'[model]\npreset = "{model}"\n[hardware]\npreset = "{hardware}"\n[performance]\nfidelity = "roofline"\n'
            f'[deployment]\ngpus_per_instance = {tp}\ntp = {tp}\nprefill_tp = {tp}\n[precision]\n{precision}\n'
            '[speculative]\nenabled = false\n')
    scn = load_scenario("<step CSV row>", text=text)
    draws = {k: float(v[0]) for k, v in draw_uncertain(scn, [0], 0, 1).items()}
    p = resolve(scn, draws)
    p.update(values)
    return p


def step_observations(path, dtype: str, values: dict) -> Observations:
    """Whole measured steps, each modelled without host overhead or attention floor (the parameters freed)."""
    rows = read_steps(path)
    with_floor, without_floor, calls = [], [], []
    for row in rows:
        p = step_parameters(row["hardware"], row["model"], row["tp"], dtype,
                            {**values, "performance.step_overhead_s": 0.0, "performance.step_error": 1.0})
        opts = options(p)
        entry = _model(p)
        for out, achievable in ((with_floor, opts["achievable"]),
                                (without_floor, replace(opts["achievable"], attention_floor_s=0.0))):
            cost = roofline.step_cost(entry, as_hardware(p), decode_seqs=row["decode_seqs"],
                                      decode_context=row["mean_context"], prefill_tokens=row["prefill_tokens"],
                                      prefill_context=row["prefill_tokens"] / 2, verify_tokens=1,
                                      **{**opts, "achievable": achievable})
            out.append(cost.t_step)
        calls.append(entry["layers"] / opts["parallel"].pp)
    measured = np.array([row["time_s"] for row in rows])
    if len(set(calls)) > 1:  # several layer counts: the attention floor and the host overhead can be told apart
        active, modelled = ("performance.step_overhead_s", "performance.attention_floor_s"), without_floor
    else:  # one layer count: the attention floor stays the scenario's, only the host overhead is freed
        active, modelled = ("performance.step_overhead_s",), with_floor
    return Observations("step", measured, np.arange(len(rows), dtype=np.int64),
                        {"modelled_s": np.array(modelled), "attention_calls": np.array(calls, float)}, active,
                        fixed={"performance.attention_floor_s": 0.0}, sources=[str(path)])


def concat(parts: list[Observations]) -> Observations:
    """Observations of one class from several files (shape ids kept apart)."""
    first = parts[0]
    if len(parts) == 1:
        return first
    offset, shapes = 0, []
    for part in parts:
        shapes.append(part.shape + offset)
        offset += int(part.shape.max()) + 1
    active = tuple(k for k in first.active if all(k in p.active for p in parts)) if first.cls != "send" else \
        tuple(dict.fromkeys(k for p in parts for k in p.active))
    data = {k: np.concatenate([p.data[k] for p in parts]) for k in first.data}
    return Observations(first.cls, np.concatenate([p.measured_s for p in parts]), np.concatenate(shapes), data,
                        active, first.fixed, [s for p in parts for s in p.sources])

"""Outputs of an op trace: per-op JSONL, a JSON summary, a Markdown report, and calibration.

Every figure here is one of two kinds, and the outputs say which:

- MEASURED: wall times of the NumPy decoder on this machine (:attr:`OpRecord.wall_s`, the trace's
  prefill and decode step times) and the 'this machine' peaks from micro-benchmarks
  (:func:`mcsim.optrace.profiles.measure_this_machine`);
- SYNTHETIC ESTIMATE: every per-profile latency, the roofline ``max(flops / peak, bytes / bandwidth)``
  of the counted FLOPs and bytes (:func:`mcsim.optrace.profiles.price`). Nothing was run on those devices.

Examples
--------
>>> from mcsim.optrace.decoder import run_trace
>>> from mcsim.optrace.profiles import default_profiles
>>> trace = run_trace(prompt_tokens=8, decode_tokens=2, max_params=2e5)
>>> summary = summarize(trace, default_profiles())
>>> summary["profiles"]["NVIDIA H100 SXM5 80GB"]["bound_decode"]
'memory'
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from mcsim.fileio import atomic_write
from mcsim.optrace.decoder import LANES, PHASES, Trace
from mcsim.optrace.profiles import Profile, price
from mcsim.text import markdown_text

__all__ = ["aggregate_ops", "calibration", "render_markdown", "summarize", "write_trace_outputs"]

MEASURED_NOTE = ("Wall times are MEASURED on this machine (time.perf_counter around each op of the NumPy "
                 "decoder, after a warm-up pass); 'this machine' peaks are MEASURED by micro-benchmarks "
                 "(numpy GEMM, large-array streaming).")
ESTIMATE_NOTE = ("Every per-profile latency is a SYNTHETIC ESTIMATE from the roofline "
                 "max(flops / peak_flops, bytes / bandwidth) of FLOPs and bytes counted from the op shapes; "
                 "nothing was run on those devices, and the estimate assumes peak rates and perfect overlap.")


def _priced(trace: Trace, profiles: list[Profile]) -> list[list[dict]]:
    """``price(record, profile)`` for every record (outer list) and profile (inner list)."""
    return [[price(record, profile) for profile in profiles] for record in trace.records]


def _memory_share(priced, indices, column) -> float:
    total = sum(priced[i][column]["t_estimate"] for i in indices)
    memory = sum(priced[i][column]["t_estimate"] for i in indices if priced[i][column]["bound"] == "memory")
    return memory / total if total > 0 else float("nan")


def _profile_summary(trace: Trace, profile: Profile, priced, column: int) -> dict:
    by_phase = {phase: [i for i, r in enumerate(trace.records) if r.phase == phase] for phase in PHASES}
    times = {phase: sum(priced[i][column]["t_estimate"] for i in idx) for phase, idx in by_phase.items()}
    lanes = {phase: {lane: sum(priced[i][column]["t_estimate"] for i in idx if trace.records[i].lane == lane)
                     for lane in LANES} for phase, idx in by_phase.items()}
    shares = {phase: _memory_share(priced, idx, column) for phase, idx in by_phase.items()}
    overall = _memory_share(priced, range(len(trace.records)), column)

    def bound(share):
        return "n/a" if math.isnan(share) else ("memory" if share >= 0.5 else "compute")

    return {
        "kind": profile.kind, "source": profile.source, "peak_dtype": profile.peak_dtype,
        "peak_flops": profile.peak_flops, "bandwidth_bytes_s": profile.bandwidth_bytes_s,
        "ridge_flop_per_byte": profile.ridge,
        "estimated_prefill_s": times["prefill"], "estimated_decode_s": times["decode"],
        "estimated_total_s": times["prefill"] + times["decode"],
        "estimated_prefill_tok_s": trace.prompt_tokens / times["prefill"] if times["prefill"] > 0 else None,
        "estimated_decode_tok_s": trace.decode_tokens / times["decode"] if times["decode"] > 0 else None,
        "estimated_s_by_lane": lanes,
        "memory_bound_share_prefill": shares["prefill"], "memory_bound_share_decode": shares["decode"],
        "memory_bound_share_overall": overall,
        "bound_prefill": bound(shares["prefill"]), "bound_decode": bound(shares["decode"]),
        "bound_overall": bound(overall),
    }


def _totals(trace: Trace) -> dict:
    totals = {}
    for phase in PHASES:
        records = [r for r in trace.records if r.phase == phase]

        def sums(rs):
            return {"ops": len(rs), "flops": sum(r.flops for r in rs), "bytes_read": sum(r.bytes_read for r in rs),
                        "bytes_written": sum(r.bytes_written for r in rs), "measured_wall_s": sum(r.wall_s for r in rs)}

        totals[phase] = dict(sums(records), by_lane={lane: sums([r for r in records if r.lane == lane])
                                                     for lane in LANES})
    return totals


def calibration(trace: Trace, this_machine: Profile) -> dict:
    """Measured decode speed of the NumPy decoder against the roofline estimate for this machine.

    Parameters
    ----------
    trace : Trace
        A recorded run (:func:`mcsim.optrace.decoder.run_trace`) with at least one decode step.
    this_machine : Profile
        Normally :func:`mcsim.optrace.profiles.measure_this_machine` run on the machine that recorded the trace.

    Returns
    -------
    dict
        ``measured_decode_tok_s`` (measured end to end), ``estimated_decode_tok_s`` (roofline on
        ``this_machine``), ``calibration_factor = measured / estimated`` (1 means the decoder runs at
        the roofline; below 1, the share it misses: per-op overhead, cache effects, kernel efficiency),
        the same three for prefill, ``memory_bound_score`` (share of estimated decode time spent in
        memory-bound ops), ``bottleneck`` (``"memory"`` if that score is at least 0.5, else
        ``"compute"``), ``op_time_share`` (summed op wall time / decode wall time; the rest is Python
        between ops), ``measured`` (tokens/s and the profile's measured peaks), ``estimated``
        (tokens/s and seconds) and ``regime`` (dtype, kernel backend, model and scaled shape, hardware).
    """
    if trace.decode_tokens == 0:
        raise ValueError("calibration needs a trace with decode steps")
    decode = [r for r in trace.records if r.phase == "decode"]
    prefill = [r for r in trace.records if r.phase == "prefill"]
    priced_decode = [price(r, this_machine) for r in decode]
    est_decode_s = sum(p["t_estimate"] for p in priced_decode)
    est_prefill_s = sum(price(r, this_machine)["t_estimate"] for r in prefill)
    memory_s = sum(p["t_estimate"] for p in priced_decode if p["bound"] == "memory")
    score = memory_s / est_decode_s
    estimated_tok_s = trace.decode_tokens / est_decode_s
    estimated_prefill_tok_s = trace.prompt_tokens / est_prefill_s
    env = trace.environment
    return {
        "measured_decode_tok_s": trace.measured_decode_tok_s,
        "estimated_decode_tok_s": estimated_tok_s,
        "calibration_factor": trace.measured_decode_tok_s / estimated_tok_s,
        "measured_prefill_tok_s": trace.measured_prefill_tok_s,
        "estimated_prefill_tok_s": estimated_prefill_tok_s,
        "prefill_calibration_factor": trace.measured_prefill_tok_s / estimated_prefill_tok_s,
        "memory_bound_score": score,
        "bottleneck": "memory" if score >= 0.5 else "compute",
        "op_time_share": sum(r.wall_s for r in decode) / trace.decode_wall_s,
        "labels": {"measured": "measured on this machine", "estimated": "synthetic estimate (roofline)"},
        "measured": {"decode_tok_s": trace.measured_decode_tok_s, "prefill_tok_s": trace.measured_prefill_tok_s,
                     "peak_flops": this_machine.peak_flops, "bandwidth_bytes_s": this_machine.bandwidth_bytes_s},
        "estimated": {"decode_tok_s": estimated_tok_s, "prefill_tok_s": estimated_prefill_tok_s,
                      "decode_s": est_decode_s, "prefill_s": est_prefill_s},
        "regime": {
            "dtype": trace.dtype,
            "matmul_dtype": {"float32": "fp32", "float16": "fp16"}.get(trace.dtype, trace.dtype),
            "estimate_backend": "roofline",
            "kernel_backend": f"numpy {env.get('numpy_version', '?')} + {env.get('blas', 'unknown BLAS')}",
            "model": trace.model_name,
            "scaled_shape": {k: v for k, v in trace.shape.items() if k != "source"},
            "hardware": {"profile": this_machine.name, "kind": this_machine.kind,
                          "peak_flops": this_machine.peak_flops,
                          "bandwidth_bytes_s": this_machine.bandwidth_bytes_s,
                          "processor": env.get("processor"), "cpu_count": env.get("cpu_count"),
                          "system": env.get("system")},
            "prompt_tokens": trace.prompt_tokens, "decode_tokens": trace.decode_tokens,
        },
    }


def summarize(trace: Trace, profiles: list[Profile], priced=None) -> dict:
    """The content of ``summary.json`` (see :func:`write_trace_outputs`)."""
    priced = priced if priced is not None else _priced(trace, profiles)
    summary = {
        "labels": {"measured": MEASURED_NOTE, "estimates": ESTIMATE_NOTE},
        "model": trace.model_name, "shape": trace.shape, "dtype": trace.dtype, "seed": trace.seed,
        "temperature": trace.temperature, "prompt_tokens": trace.prompt_tokens, "decode_tokens": trace.decode_tokens,
        "environment": trace.environment,
        "measured": {"prefill_wall_s": trace.prefill_wall_s, "decode_wall_s": trace.decode_wall_s,
                      "decode_tok_s": trace.measured_decode_tok_s, "prefill_tok_s": trace.measured_prefill_tok_s,
                      "decode_step_wall_s": trace.decode_step_wall_s},
        "totals": _totals(trace),
        "profiles": {p.name: _profile_summary(trace, p, priced, j) for j, p in enumerate(profiles)},
    }
    measured = [p for p in profiles if p.kind == "measured"]
    if measured and trace.decode_tokens > 0:
        summary["calibration"] = calibration(trace, measured[0])
    return summary


def aggregate_ops(trace: Trace, profiles: list[Profile], priced=None) -> list[dict]:
    """Records summed by (op name, phase), in first-executed order, with estimates per profile."""
    priced = priced if priced is not None else _priced(trace, profiles)
    rows: dict[tuple, dict] = {}
    for i, r in enumerate(trace.records):
        row = rows.setdefault((r.name, r.phase), {
            "name": r.name, "phase": r.phase, "lane": r.lane, "calls": 0, "flops": 0.0, "bytes": 0.0, "wall_s": 0.0,
            "estimated_s": [0.0] * len(profiles), "memory_bound_s": [0.0] * len(profiles)})
        row["calls"] += 1
        row["flops"] += r.flops
        row["bytes"] += r.bytes_total
        row["wall_s"] += r.wall_s
        for j, p in enumerate(priced[i]):
            row["estimated_s"][j] += p["t_estimate"]
            if p["bound"] == "memory":
                row["memory_bound_s"][j] += p["t_estimate"]
    for row in rows.values():
        row["intensity"] = row["flops"] / row["bytes"] if row["bytes"] else 0.0
        # The op's class on a profile: where most of its estimated time falls.
        row["bound"] = ["memory" if m >= 0.5 * t else "compute"
                        for m, t in zip(row["memory_bound_s"], row["estimated_s"])]
    return list(rows.values())


def _ms(seconds) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.3f}"


def _table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def render_markdown(trace: Trace, profiles: list[Profile], summary: dict | None = None,
                    priced=None, top: int = 10) -> str:
    """The Markdown report: provenance, profiles, lanes, per-op table, top ops, intensity, calibration."""
    priced = priced if priced is not None else _priced(trace, profiles)
    summary = summary or summarize(trace, profiles, priced)
    ops = aggregate_ops(trace, profiles, priced)
    keys = [f"P{j + 1}" for j in range(len(profiles))]
    s = trace.shape
    out = [f"# Op trace: {markdown_text(trace.model_name)} (scaled), {trace.dtype}", "",
           f"- **Measured**: {MEASURED_NOTE}",
           f"- **Synthetic estimate**: {ESTIMATE_NOTE}", "",
           (f"Decoder run: {s['layers']} layers, hidden {s['hidden_size']}, {s['attention_heads']} query heads / "
           f"{s['kv_heads']} KV heads of {s['head_dim']}, SwiGLU FFN {s['ffn']}, vocab {s['vocab']} "
           f"({s.get('params', 0) / 1e6:.1f} M weights, width scale {s.get('scale', 1.0):.3f} of the preset); "
           f"prompt {trace.prompt_tokens} tokens, {trace.decode_tokens} decode steps, seed {trace.seed}, "
           f"temperature {trace.temperature}."),
           *[f"Approximation: {note}." for note in s.get("approximations", [])], "",
           "## Measured on this machine", ""]
    m, env = summary["measured"], trace.environment
    out += [(f"- backend: numpy {env.get('numpy_version')} + {env.get('blas')}; CPU {env.get('processor')} "
            f"x {env.get('cpu_count')}; 1-min load average when the trace ended {env.get('load_average_1min')} "
            "(other work on the CPUs slows multi-threaded BLAS)"),
            (f"- prefill: {_ms(m['prefill_wall_s'])} ms for {trace.prompt_tokens} tokens "
            f"({m['prefill_tok_s']:.1f} tok/s, measured)"),
            (f"- decode: {m['decode_tok_s']:.2f} tok/s (measured; {_ms(m['decode_wall_s'])} ms over "
            f"{trace.decode_tokens} steps)"), ""]
    out += ["## Profiles and estimated times (synthetic estimates)", "",
            "Ridge point = peak / bandwidth (FLOP/byte): ops of lower arithmetic intensity are memory-bound.",
            (f"Bytes are counted in the trace's dtype ({trace.dtype}); datacenter peaks are dense BF16 tensor "
             "rates and laptop/desktop GPU peaks FP32 shader rates, so a BF16 deployment of the same ops "
             "would move half the bytes of a float32 trace."), ""]
    rows = []
    for key, p in zip(keys, profiles):
        e = summary["profiles"][p.name]
        tok_s = e["estimated_decode_tok_s"]
        rows.append([key, p.name, p.kind, f"{p.peak_flops / 1e12:.3g}", f"{p.bandwidth_bytes_s / 1e9:.4g}",
                     f"{p.ridge:.1f}", _ms(e["estimated_prefill_s"]), _ms(e["estimated_decode_s"]),
                     "n/a" if tok_s is None else f"{tok_s:.1f}", f"{e['memory_bound_share_decode']:.0%}",
                     e["bound_prefill"], e["bound_decode"], e["bound_overall"]])
    out += _table(["key", "profile", "kind", "peak TFLOP/s", "GB/s", "ridge FLOP/B", "est. prefill ms",
                   "est. decode ms", "est. decode tok/s", "decode time memory-bound", "prefill bound",
                   "decode bound", "overall bound"], rows)
    out += ["", "## Time by lane", "", "Measured wall time (ms) on this machine:", ""]
    totals = summary["totals"]
    out += _table(["lane", "prefill ms (measured)", "decode ms (measured)", "prefill GFLOP", "decode GFLOP",
                   "prefill MB", "decode MB"],
                  [[lane, _ms(totals["prefill"]["by_lane"][lane]["measured_wall_s"]),
                    _ms(totals["decode"]["by_lane"][lane]["measured_wall_s"]),
                    f"{totals['prefill']['by_lane'][lane]['flops'] / 1e9:.3f}",
                    f"{totals['decode']['by_lane'][lane]['flops'] / 1e9:.3f}",
                    f"{(totals['prefill']['by_lane'][lane]['bytes_read'] + totals['prefill']['by_lane'][lane]['bytes_written']) / 1e6:.2f}",
                    f"{(totals['decode']['by_lane'][lane]['bytes_read'] + totals['decode']['by_lane'][lane]['bytes_written']) / 1e6:.2f}"]
                   for lane in LANES])
    out += ["", "Share of estimated decode time by lane (synthetic estimate):", ""]
    rows = []
    for key, p in zip(keys, profiles):
        lanes = summary["profiles"][p.name]["estimated_s_by_lane"]["decode"]
        total = sum(lanes.values()) or 1.0
        rows.append([key, p.name, *[f"{lanes[lane] / total:.0%}" for lane in LANES]])
    out += _table(["key", "profile", *LANES], rows)
    out += ["", "## Per-op table (summed over layers and steps)", "",
            (f"`bound` lists each profile {keys[0]}..{keys[-1]} in order: M = memory-bound "
            "(intensity below the ridge), C = compute-bound."), ""]
    ref = 0
    rows = [[o["name"], o["phase"], o["lane"], o["calls"], f"{o['flops'] / 1e9:.4f}", f"{o['bytes'] / 1e6:.3f}",
             f"{o['intensity']:.2f}", _ms(o["wall_s"]), _ms(o["estimated_s"][ref]),
             "".join("M" if b == "memory" else "C" for b in o["bound"])] for o in ops]
    out += _table(["op", "phase", "lane", "calls", "GFLOP", "MB moved", "FLOP/B", "measured ms",
                   f"est. ms on {keys[ref]}", "bound"], rows)
    out += ["", f"## Top {top} ops by measured wall time", ""]
    total_wall = sum(o["wall_s"] for o in ops) or 1.0
    ranked = sorted(ops, key=lambda o: o["wall_s"], reverse=True)[:top]
    out += _table(["op", "phase", "measured ms", "share of op time", "FLOP/B"],
                  [[o["name"], o["phase"], _ms(o["wall_s"]), f"{o['wall_s'] / total_wall:.1%}",
                    f"{o['intensity']:.2f}"] for o in ranked])
    out += ["", f"## Top {top} decode ops by estimated time on {keys[ref]} ({profiles[ref].name})", ""]
    decode_ops = sorted((o for o in ops if o["phase"] == "decode"), key=lambda o: o["estimated_s"][ref],
                        reverse=True)[:top]
    out += _table(["op", "est. ms (synthetic)", "measured ms", "bound"],
                  [[o["name"], _ms(o["estimated_s"][ref]), _ms(o["wall_s"]), o["bound"][ref]] for o in decode_ops])
    out += ["", "## Arithmetic intensity against ridge points", ""]
    for phase in PHASES:
        phase_ops = [o for o in ops if o["phase"] == phase]
        if not phase_ops:
            continue
        flops, moved = sum(o["flops"] for o in phase_ops), sum(o["bytes"] for o in phase_ops)
        intensity = flops / moved if moved else 0.0
        above = [k for k, p in zip(keys, profiles) if intensity >= p.ridge]
        out.append(f"- {phase}: {intensity:.2f} FLOP/byte over the phase; at or above the ridge of "
                   f"{', '.join(above) if above else 'no profile'}.")
    if "calibration" in summary:
        c = summary["calibration"]
        out += ["", "## Calibration against this machine", "",
                (f"- measured decode: {c['measured_decode_tok_s']:.2f} tok/s; roofline estimate on "
                f"'{c['regime']['hardware']['profile']}': {c['estimated_decode_tok_s']:.2f} tok/s; "
                f"calibration factor (measured / estimated) = {c['calibration_factor']:.3f}"),
                (f"- measured prefill: {c['measured_prefill_tok_s']:.1f} tok/s; estimate "
                f"{c['estimated_prefill_tok_s']:.1f} tok/s; factor {c['prefill_calibration_factor']:.3f}"),
                (f"- memory-bound score (share of estimated decode time in memory-bound ops): "
                f"{c['memory_bound_score']:.1%}; bottleneck: {c['bottleneck']}-bound"),
                f"- op wall time / decode wall time: {c['op_time_share']:.1%} (the rest is Python between ops)"]
    return "\n".join(out) + "\n"


def _json_safe(value):
    """Non-finite floats become None (JSON has no Infinity or NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_trace_outputs(trace: Trace, profiles: list[Profile], out_dir, overwrite: bool = False) -> dict:
    """Write ``trace.jsonl``, ``summary.json`` and ``report.md`` into ``out_dir`` (created if needed).

    ``trace.jsonl`` has one line per executed op: its record (counted FLOPs and bytes, measured
    ``wall_s``), ``intensity`` and, per profile name, ``estimated_s`` and ``bound`` (synthetic).
    ``summary.json`` holds totals per phase and lane, the measured tokens/s, per-profile estimated
    times, tokens/s and bound, and the calibration when a ``kind="measured"`` profile is given.
    Files are written atomically; existing ones are kept unless ``overwrite``.

    Returns
    -------
    dict
        ``{"trace_jsonl": Path, "summary_json": Path, "report_md": Path}``.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    priced = _priced(trace, profiles)
    lines = []
    for index, (record, prices) in enumerate(zip(trace.records, priced)):
        line = {"index": index, "name": record.name, "layer": record.layer, "phase": record.phase, "step": record.step,
                    "lane": record.lane, "flops": record.flops, "bytes_read": record.bytes_read,
                    "bytes_written": record.bytes_written, "wall_s_measured": record.wall_s,
                    "intensity": prices[0]["intensity"] if prices else None,
                    "estimated_s": {p.name: q["t_estimate"] for p, q in zip(profiles, prices)},
                    "bound": {p.name: q["bound"] for p, q in zip(profiles, prices)}}
        lines.append(json.dumps(_json_safe(line)))
    summary = summarize(trace, profiles, priced)
    paths = {"trace_jsonl": out / "trace.jsonl", "summary_json": out / "summary.json", "report_md": out / "report.md"}
    existing = [str(path) for path in paths.values() if path.exists()]
    if existing and not overwrite:  # check all three first, so a refusal leaves nothing half-written
        raise FileExistsError(f"{', '.join(existing)} exist(s); pass overwrite=True to replace")
    # owner-only permissions, as these files were always written
    atomic_write(paths["trace_jsonl"], "\n".join(lines) + "\n", mode=0o600)
    atomic_write(paths["summary_json"], json.dumps(_json_safe(summary), indent=2) + "\n", mode=0o600)
    atomic_write(paths["report_md"], render_markdown(trace, profiles, summary, priced), mode=0o600)
    return paths

"""``mcsim trace``: run the NumPy decoder, price it on every profile, calibrate, optionally measure Ollama.

The command-line layer stays thin; this function is what it calls (and what a notebook can call).
"""

from __future__ import annotations

import json
from pathlib import Path

from mcsim.fileio import atomic_write

DTYPE_NAMES = {"float32": "fp32", "float16": "fp16"}
HOST_PRESET = "cpu-host"


def trace_and_calibrate(*, model: str = "llama-3.1-8b", prompt_tokens: int = 64, decode_tokens: int = 16,
                        max_params: float = 2e8, dtype: str = "float32", seed: int = 0, out_dir="outputs/trace",
                        overwrite: bool = False, bench_seconds: float = 1.0, ollama_url: str | None = None,
                        ollama_model: str | None = None, ollama_runs: int = 1, ollama_timeout_s: float = 30.0,
                        save_calibration=None, warn=print) -> dict:
    """Trace the decoder, write ``trace.jsonl``, ``summary.json``, ``report.md`` (and ``ollama.json``), and
    optionally save a calibration for scenarios of this machine (``hardware.preset = "cpu-host"``).

    Returns a dict: ``paths``, ``this_machine`` (the measured profile), ``calibration`` (measured vs estimated
    decode tokens/s), ``ollama`` (the measurement, or None with ``ollama_skipped`` saying why).
    """
    from mcsim.optrace import decoder as optrace, report as optrace_report, profiles

    out_dir = Path(out_dir)
    this = profiles.measure_this_machine(seconds=bench_seconds, dtype=dtype)
    trace = optrace.run_trace(model, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens,
                              max_params=max_params, seed=seed, dtype=dtype)
    peak = "fp32" if dtype == "float32" else "bf16"
    paths = optrace_report.write_trace_outputs(trace, profiles.default_profiles(this, peak=peak), out_dir,
                                               overwrite=overwrite)
    cal = optrace_report.calibration(trace, this)

    ollama, skipped = None, None
    if ollama_url:
        from mcsim.optrace.ollama import OllamaUnavailable, measure_ollama

        try:
            ollama = measure_ollama(ollama_url, ollama_model, num_predict=64, timeout_s=ollama_timeout_s,
                                    runs=ollama_runs)
        except OllamaUnavailable as err:
            skipped = str(err)
            warn(f"warning: {skipped}")
    _append_ollama_section(Path(paths["report_md"]), ollama, skipped, ollama_url)
    if ollama is not None:
        path = out_dir / "ollama.json"
        path.write_text(json.dumps(ollama, indent=2))
        paths["ollama_json"] = str(path)

    if save_calibration:
        from mcsim.optrace.calibration import Calibration, save

        measured = dict(cal["measured"])
        if ollama is not None:
            measured["ollama"] = ollama
        calibration = Calibration(
            regime={"dtype": DTYPE_NAMES.get(dtype, dtype), "backend": "roofline", "model": model,
                    "hardware": HOST_PRESET},
            factor=float(cal["calibration_factor"]), memory_bound_score=float(cal["memory_bound_score"]),
            bottleneck=str(cal["bottleneck"]), measured=measured, estimated=dict(cal["estimated"]),
            source=f"mcsim trace of {model} (scaled, {dtype}, numpy) on this machine; outputs in {out_dir}")
        paths["calibration"] = str(save(calibration, save_calibration))
    return {"paths": paths, "this_machine": this, "calibration": cal, "ollama": ollama, "ollama_skipped": skipped}


def _append_ollama_section(report: Path, ollama: dict | None, skipped: str | None, url: str | None):
    lines = ["", "## A real local model (Ollama)", ""]
    if ollama is not None:
        lines += [f"MEASURED on this machine through Ollama's API at {ollama['url']}: model `{ollama['model']}`, "
                  f"{ollama['decode_tok_s']:.3g} decode tokens/s over {ollama['eval_count']} generated tokens"
                  + (f", {ollama['prefill_tok_s']:.3g} prompt tokens/s" if ollama.get("prefill_tok_s") else "")
                  + " (from its eval counts and durations)."]
    else:
        why = skipped or "no --ollama URL was given"
        lines += [f"Not measured ({why}). Every latency above other than this machine's own wall times is a "
                  "synthetic estimate."]
    atomic_write(report, report.read_text() + "\n".join(lines) + "\n", encoding=None)

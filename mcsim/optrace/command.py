"""``mcsim trace``: run the NumPy decoder, price it on every profile, calibrate, optionally measure Ollama.

The command-line layer stays thin; this function is what it calls (and what a notebook can call).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mcsim.calibration.files import new_calibration, parameter, save
from mcsim.fileio import atomic_write
from mcsim.optrace import decoder as optrace, report as optrace_report, profiles
from mcsim.optrace.ollama import OllamaUnavailable, measure_ollama
from mcsim.optrace.report import price
from mcsim.text import markdown_text

#: The decoder's NumPy dtype -> the matmul format of a calibration's regime (a 16-bit matmul counts as bf16).
DTYPE_NAMES = {"float32": "fp32", "float16": "bf16"}
HOST_PRESET = "cpu-host"


def trace_and_calibrate(*, model: str = "llama-3.1-8b", prompt_tokens: int = 64, decode_tokens: int = 16,
                        max_params: float = 2e8, dtype: str = "float32", seed: int = 0, out_dir="outputs/trace",
                        overwrite: bool = False, bench_seconds: float = 1.0, ollama_url: str | None = None,
                        ollama_model: str | None = None, ollama_runs: int = 1, ollama_timeout_s: float = 30.0,
                        ollama_weights_gb: float | None = None, save_calibration=None, replicates: int = 200,
                        warn=print) -> dict:
    """Trace the decoder, write ``trace.jsonl``, ``summary.json``, ``report.md`` (and ``ollama.json``), and
    optionally save a calibration for scenarios of this machine (``hardware.preset = "cpu-host"``; the format of
    :mod:`mcsim.calibration.files`, see :func:`trace_calibration`).

    Returns a dict: ``paths``, ``this_machine`` (the measured profile), ``calibration`` (measured vs estimated
    decode tokens/s), ``ollama`` (the measurement, or None with ``ollama_skipped`` saying why).
    """
    out_dir = Path(out_dir)
    # refuse what cannot be written before any work, and write nothing until every measurement has succeeded
    existing = [str(out_dir / n) for n in ("trace.jsonl", "summary.json", "report.md", "ollama.json")
                if (out_dir / n).exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{', '.join(existing)} exist(s); pass --force to replace them")
    if save_calibration and Path(save_calibration).exists() and not overwrite:
        raise FileExistsError(f"{save_calibration} exists; pass --force to replace it")
    ollama, skipped = None, None
    if ollama_url:
        try:
            ollama = measure_ollama(ollama_url, ollama_model, num_predict=64, timeout_s=ollama_timeout_s,
                                    runs=ollama_runs)
        except OllamaUnavailable as err:
            skipped = str(err)
            warn(f"warning: {skipped}")
    this = profiles.measure_this_machine(seconds=bench_seconds, dtype=dtype)
    trace = optrace.run_trace(model, prompt_tokens=prompt_tokens, decode_tokens=decode_tokens,
                              max_params=max_params, seed=seed, dtype=dtype)
    peak = "fp32" if dtype == "float32" else "bf16"
    calibration_file = None
    if save_calibration:
        calibration_file = trace_calibration(trace, this, ollama=ollama, ollama_weights_gb=ollama_weights_gb,
                                             dtype=dtype, replicates=replicates, seed=seed,
                                             source=f"mcsim trace of {model} (scaled, {dtype}, numpy) on this "
                                                    f"machine; outputs in {out_dir}")
    paths = optrace_report.write_trace_outputs(trace, profiles.default_profiles(this, peak=peak), out_dir,
                                               overwrite=overwrite)
    cal = optrace_report.calibration(trace, this)
    _append_ollama_section(Path(paths["report_md"]), ollama, skipped, ollama_url)
    if ollama is not None:
        path = out_dir / "ollama.json"
        atomic_write(path, json.dumps(ollama, indent=2), mode=0o600)
        paths["ollama_json"] = str(path)

    if calibration_file is not None:
        paths["calibration"] = str(save(calibration_file, save_calibration, overwrite=overwrite))
    return {"paths": paths, "this_machine": this, "calibration": cal, "ollama": ollama, "ollama_skipped": skipped}


def _append_ollama_section(report: Path, ollama: dict | None, skipped: str | None, url: str | None):
    lines = ["", "## A real local model (Ollama)", ""]
    if ollama is not None:
        lines += [f"MEASURED on this machine through Ollama's API at {markdown_text(ollama['url'])}: model "
                  f"{markdown_text(ollama['model'])}, "
                  f"{ollama['decode_tok_s']:.3g} decode tokens/s over {ollama['eval_count']} generated tokens"
                  + (f", {ollama['prefill_tok_s']:.3g} prompt tokens/s" if ollama.get("prefill_tok_s") else "")
                  + " (from its eval counts and durations)."]
    else:
        why = markdown_text(skipped or "no --ollama URL was given")
        lines += [f"Not measured ({why}). Every latency above other than this machine's own wall times is a "
                  "synthetic estimate."]
    atomic_write(report, report.read_text() + "\n".join(lines) + "\n", encoding=None)


def trace_calibration(trace, this, *, ollama=None, ollama_weights_gb=None, dtype="float32", replicates=200, seed=0,
                      source=""):
    """A calibration of this machine (:mod:`mcsim.calibration.files`) from a decoder trace and, optionally, Ollama.

    Parameters it carries (each replaces the scenario's value; nothing is multiplied):

    * ``hardware.fp32_tflops``, ``hardware.bf16_tflops`` and ``hardware.hbm_tb_s``: this machine's measured GEMM
      and memory-bandwidth peaks (the micro-benchmarks of :func:`mcsim.optrace.profiles.measure_this_machine`);
    * ``performance.bandwidth_fraction`` and ``performance.flops_fraction``: the share of those peaks the decoder
      reached. Each decode step is a data point: its measured time against its roofline estimate at 100 % of the
      measured peaks gives ``factor = estimated / measured``, split between the two fractions by the share ``s`` of
      the estimate that is memory-bound (``bandwidth = factor ** s``, ``flops = factor ** (1 - s)``, each at most 1).
      With ``ollama`` and ``ollama_weights_gb`` (the served model's weights, as ``ollama list`` shows) the Ollama
      measurement is one more data point of the bandwidth fraction: ``decode tok/s x weight bytes / measured
      bandwidth`` (a memory-bound decode streams its weights once per token).

    The replicates resample the data points (the decode steps, then the decoder and Ollama points) with
    replacement. The regime is cpu-host, the decoder's matmul format and the roofline fidelity; the decoder shape
    that actually ran is recorded in ``notes.measured_shape`` (a scaled stand-in, not the full model).
    """
    decode = [r for r in trace.records if r.phase == "decode"]
    if not decode:
        raise ValueError("a calibration needs a trace with decode steps")
    priced = [price(r, this) for r in decode]
    steps, step_of = np.unique([r.step for r in decode], return_inverse=True)
    estimate = np.bincount(step_of, weights=[p["t_estimate"] for p in priced])  # estimated time of each step
    memory = sum(p["t_estimate"] for p in priced if p["bound"] == "memory")
    score = memory / sum(p["t_estimate"] for p in priced)
    measured = np.asarray(trace.decode_step_wall_s, float)[:len(steps)]
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(7,)))
    n = len(steps)
    rows = rng.integers(n, size=(replicates, n))  # each replicate resamples the decode steps
    factors = estimate[rows].sum(axis=1) / measured[rows].sum(axis=1)
    factor = estimate.sum() / measured.sum()
    bandwidth = np.minimum(factors ** score, 1.0)
    flops = np.minimum(factors ** (1.0 - score), 1.0)
    bandwidth_point = min(factor ** score, 1.0)
    notes = {"measured_shape": {k: v for k, v in trace.shape.items() if k != "source"},
             "measured_model": f"{trace.model_name} scaled to the shape that ran (see measured_shape)",
             "decode_steps": n, "memory_bound_score": float(score), "decoder_factor": float(factor)}
    if ollama is not None and ollama_weights_gb:
        ollama_fraction = min(ollama["decode_tok_s"] * ollama_weights_gb * 1e9 / this.bandwidth_bytes_s, 1.0)
        points = np.stack([bandwidth, np.full(replicates, ollama_fraction)], axis=1)
        pick = rng.integers(2, size=(replicates, 2))
        bandwidth = np.exp(np.log(np.take_along_axis(points, pick, axis=1)).mean(axis=1))
        bandwidth_point = float(np.sqrt(bandwidth_point * ollama_fraction))  # both data points, as each replicate
        notes["ollama"] = {"model": ollama["model"], "decode_tok_s": ollama["decode_tok_s"],
                           "weights_gb": ollama_weights_gb, "bandwidth_fraction": ollama_fraction}
    elif ollama is not None:
        notes["ollama"] = {"model": ollama["model"], "decode_tok_s": ollama["decode_tok_s"],
                           "used": "no: its weight size is unknown (give --ollama-weights-gb)"}
    peak_tflops, hbm_tb_s = this.peak_flops / 1e12, this.bandwidth_bytes_s / 1e12

    constant = np.ones(replicates)
    parameters = {
        "hardware.fp32_tflops": parameter("peaks", constant * peak_tflops, peak_tflops),
        "hardware.bf16_tflops": parameter("peaks", constant * peak_tflops, peak_tflops),
        "hardware.hbm_tb_s": parameter("peaks", constant * hbm_tb_s, hbm_tb_s),
        "performance.bandwidth_fraction": parameter("decoder", bandwidth, bandwidth_point),
        "performance.flops_fraction": parameter("decoder", flops, min(factor ** (1.0 - score), 1.0)),
    }
    regime = {"hardware": HOST_PRESET, "dtype": DTYPE_NAMES.get(dtype, dtype),
              "fidelity": "roofline", "stack": "numpy", "stack_version": np.__version__}
    classes = {"decoder": {"rows": n, "shapes": 1, "fit_mape": float(np.mean(np.abs(estimate / factor - measured)
                                                                              / measured)),
                           "cv_mape": float("nan"), "cv_scheme": "not cross-validated (one shape)",
                           "sources": [source]}}
    return new_calibration(regime, parameters, classes, source=source, seed=seed, notes=notes)

"""`mcsim trace` and `--calibration` end to end: outputs, honest labels, a calibration that changes a run."""

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from mcsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
THIS = ROOT / "scenarios" / "this-machine.toml"
TRACE = ["trace", "--max-params", "3e6", "--prompt-tokens", "12", "--decode-tokens", "3", "--bench-seconds", "0.1"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def traced(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trace")
    cal = folder / "cal.toml"
    result = invoke(*TRACE, "-o", folder / "out", "--save-calibration", cal,
                    "--ollama", "http://127.0.0.1:9", "--ollama-model", "llama3")  # nothing listens on port 9
    return folder, cal, result


def test_trace_writes_its_outputs_with_honest_labels(traced):
    folder, cal, result = traced
    assert result.exit_code == 0, result.output
    out = folder / "out"
    records = [json.loads(line) for line in (out / "trace.jsonl").read_text().splitlines()]
    assert records and {"name", "lane", "flops", "bytes_read"} <= set(records[0])
    json.loads((out / "summary.json").read_text())
    report = (out / "report.md").read_text().lower()
    assert "synthetic estimate" in report and "measured" in report
    # Ollama was unreachable: said so, and nothing presented as measured from it
    assert "not measured" in report and "skipped" in result.stderr
    assert not (out / "ollama.json").exists()


def test_a_calibration_changes_a_run_of_its_regime(traced, tmp_path):
    _, cal, _ = traced
    plain = invoke("run", THIS, "--samples", "2", "--requests", "400", "-o", tmp_path / "a.nc", "--no-progress")
    calibrated = invoke("run", THIS, "--samples", "2", "--requests", "400", "-o", tmp_path / "b.nc",
                        "--no-progress", "--calibration", cal)
    assert plain.exit_code == 0 and calibrated.exit_code == 0, calibrated.output
    with xr.open_dataset(tmp_path / "a.nc") as a, xr.open_dataset(tmp_path / "b.nc") as b:
        assert float(a.tpot_s.sel(request_quantile=0.5)[0]) != float(b.tpot_s.sel(request_quantile=0.5)[0])
        assert "calibration" in b.attrs and "calibration" not in a.attrs
        assert json.loads(b.attrs["calibration"])["regime"]["hardware"] == "cpu-host"


def test_a_calibration_from_another_regime_is_refused(traced, tmp_path):
    _, cal, _ = traced
    result = invoke("run", ROOT / "scenarios" / "factory.toml", "--samples", "1", "--calibration", cal,
                    "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and "another regime" in result.stderr and "h800" in result.stderr
    assert not (tmp_path / "x.nc").exists()


def test_ollama_options_go_together(tmp_path):
    result = invoke(*TRACE, "-o", tmp_path / "o", "--ollama", "http://127.0.0.1:9")
    assert result.exit_code == 2


def test_a_calibrated_fraction_replaces_the_scenarios(traced, tmp_path):
    from mcsim.calibration.files import load

    _, cal_path, _ = traced
    cal = load(cal_path)
    assert cal.regime == {"hardware": "cpu-host", "dtype": "fp32", "fidelity": "roofline", "stack": "numpy",
                          "stack_version": cal.regime["stack_version"]}
    assert cal.notes["measured_shape"]["layers"] >= 1  # the scaled decoder that ran, not the full model
    out = tmp_path / "c.nc"
    result = invoke("run", THIS, "--samples", "3", "--requests", "300", "-o", out, "--no-progress",
                    "--set", "performance.bandwidth_fraction=0.5", "--calibration", cal_path)
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        drawn = ds["performance_bandwidth_fraction"].values.ravel().tolist()
    assert set(drawn) <= set(cal.parameters["performance.bandwidth_fraction"]["replicates"])  # not x 0.5


def test_an_ollama_measurement_is_a_data_point():
    from mcsim.optrace import decoder, profiles
    from mcsim.optrace.command import trace_calibration

    trace = decoder.run_trace("llama-3.1-8b", prompt_tokens=8, decode_tokens=4, max_params=2e6, seed=0)
    this = profiles.measure_this_machine(seconds=0.05)
    alone = trace_calibration(trace, this, replicates=50)
    decoder_only = alone.parameters["performance.bandwidth_fraction"]["replicates"]
    target = 0.5 * min(decoder_only)  # an Ollama point well below every decoder replicate
    ollama = {"model": "tiny", "decode_tok_s": 1.0}
    weights_gb = target * this.bandwidth_bytes_s / 1e9  # weight bytes streamed per token at 1 token/s
    both = trace_calibration(trace, this, ollama=ollama, ollama_weights_gb=weights_gb, replicates=50)
    assert both.notes["ollama"]["bandwidth_fraction"] == pytest.approx(target)
    reps = both.parameters["performance.bandwidth_fraction"]["replicates"]
    # replicates draw among the two data points: some take the Ollama point twice, all lie between the two
    assert min(reps) == pytest.approx(target) and max(reps) <= max(decoder_only) * (1 + 1e-12)
    assert np.median(reps) < np.median(decoder_only)
    without_size = trace_calibration(trace, this, ollama=ollama, replicates=50)
    assert "no" in without_size.notes["ollama"]["used"]

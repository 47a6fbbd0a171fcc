"""`mcsim calibrate`: fits that recover known parameters, joint bootstrap draws, regime refusal, files, CLI."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from click.testing import CliRunner

from mcsim.calibration import fit, measurements
from mcsim.calibration.command import calibrate
from mcsim.calibration.files import CalibrationError, load, save
from mcsim.calibration.vidur import MeasurementError, bundled_collectives, bundled_linear
from mcsim.cli import main
from mcsim.perf import gemm_surface
from mcsim.scenario import load_scenario
from mcsim.scenario.distributions import DistributionError, parse
from mcsim.scenario.loading import draw_uncertain

ROOT = Path(__file__).resolve().parents[1]
DENSE = ROOT / "scenarios" / "dense-node.toml"
MLP = bundled_linear("h100", "Llama-2-70b-hf")
ALLREDUCE = bundled_collectives("h100_dgx", "all_reduce")


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def hand_gemm(flops, nbytes, rows, peak, hbm, f, b, half, floor):
    """Two GEMM kernels: their floors plus the larger of the size-dependent FLOP time and the byte time."""
    out = []
    for F, B, M in zip(flops, nbytes, rows):
        out.append(2 * floor + max(F / (peak * f * M / (M + half)), B / (hbm * b)))
    return np.array(out)


def test_gemm_fit_recovers_known_parameters():
    rng = np.random.default_rng(1)
    rows = np.repeat([1, 4, 16, 64, 256, 1024, 4096], 6).astype(float)
    flops = 2 * rows * rng.uniform(2e7, 3e8, rows.size)
    nbytes = rng.uniform(4e7, 6e8, rows.size)
    truth = (0.71, 0.88, 120.0, 7e-6)
    measured = hand_gemm(flops, nbytes, rows, 1e15, 3e12, *truth) * np.exp(rng.normal(0, 0.01, rows.size))
    obs = fit.Observations("gemm", measured, np.arange(rows.size), {
        "flops": flops, "bytes": nbytes, "rows": rows, "kernels": np.full(rows.size, 2.0),
        "peak": np.full(rows.size, 1e15), "hbm": np.full(rows.size, 3e12)},
        ("performance.flops_fraction", "performance.bandwidth_fraction", "performance.gemm_half_tokens",
         "performance.gemm_floor_s"))
    f, b, half, floor_us = fit.fit_point(obs)
    assert f == pytest.approx(0.71, rel=0.03) and b == pytest.approx(0.88, rel=0.03)
    assert half == pytest.approx(120, rel=0.15) and floor_us == pytest.approx(7.0, rel=0.15)


def hand_allreduce(size, p, base, hop, bw):
    """The fastest of ring, one-shot, two-shot and tree inside a node, written out."""
    ring = base + 2 * (p - 1) / p * size / bw + 2 * (p - 1) * hop
    one_shot = base + (p - 1) * size / bw + hop
    two_shot = base + 2 * (p - 1) / p * size / bw + 2 * hop
    tree = base + 2 * size / bw + 2 * math.ceil(math.log2(p)) * hop
    return min(ring, one_shot, two_shot, tree)


def test_allreduce_fit_recovers_known_parameters():
    sizes = np.repeat(2.0 ** np.arange(11, 27), 3)
    workers = np.tile([2.0, 4.0, 8.0], 16)
    measured = np.array([hand_allreduce(s, p, 25e-6, 2e-6, 300e9) for s, p in zip(sizes, workers)])
    obs = fit.Observations("allreduce", measured, np.arange(sizes.size), {"bytes": sizes, "workers": workers},
                           ("hardware.collective_base_us", "hardware.collective_hop_us",
                            "hardware.allreduce_bus_gb_s"))
    base, hop, bus = fit.fit_point(obs)
    assert base == pytest.approx(25, rel=0.02) and hop == pytest.approx(2, rel=0.05)
    assert bus == pytest.approx(300, rel=0.01)


@pytest.fixture(scope="module")
def h100(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cal")
    path = folder / "h100.toml"
    result = invoke("calibrate", MLP, ALLREDUCE, "--replicates", "30", "-o", path)
    return path, result


def test_calibrate_command_prints_cross_validated_errors_and_writes_intervals(h100):
    path, result = h100
    assert result.exit_code == 0, result.output
    assert "cross-validated MAPE" in result.output and "leave one shape out" in result.output
    cal = load(path)
    assert cal.regime["hardware"] == "h100" and cal.regime["dtype"] == "bf16" and cal.replicates == 30
    for cls in ("gemm", "elementwise", "allreduce"):
        # the measured data: linear ops within 8 %, all-reduce within 15 % even left out
        assert cal.classes[cls]["cv_mape"] < {"gemm": 0.08, "elementwise": 0.15, "allreduce": 0.15}[cls]
    frac = cal.parameters["performance.flops_fraction"]
    assert frac["low"] <= frac["estimate"] <= frac["high"] and frac["low"] < frac["high"]
    assert 300 < cal.parameters["hardware.allreduce_bus_gb_s"]["estimate"] < 400  # GB/s, not bytes/s
    assert 1e-6 < cal.parameters["performance.gemm_floor_s"]["estimate"] < 2e-5  # seconds
    again = invoke("calibrate", MLP, "-o", path)
    assert again.exit_code == 2 and "--force" in again.stderr


def test_a_run_draws_one_joint_replicate_per_sample(h100, tmp_path):
    path, _ = h100
    cal = load(path)
    scn = load_scenario(DENSE, overrides=["precision.enabled=false", f"performance.calibration={json.dumps(str(path))}"])
    draws = draw_uncertain(scn, np.arange(12), 3)
    keys = [k for k, spec in cal.parameters.items() if min(spec["replicates"]) < max(spec["replicates"])]
    for s in range(12):
        index = {cal.parameters[k]["replicates"].index(draws[k][s]) for k in keys}
        assert len(index) == 1  # every parameter from the same bootstrap replicate
    assert len({tuple(draws[k][s] for k in keys) for s in range(12)}) > 6
    out = tmp_path / "run.nc"
    result = invoke("run", DENSE, "--set", "precision.enabled=false", "--calibration", path, "--samples", "3",
                    "--requests", "300", "-o", out, "--no-progress")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(out) as ds:
        drawn = ds["performance_flops_fraction"].values.ravel()
        # the calibrated value replaces the scenario's uniform(0.45, 0.7): no multiplication
        assert set(drawn.tolist()) <= set(cal.parameters["performance.flops_fraction"]["replicates"])
        assert json.loads(ds.attrs["calibration"])["regime"]["hardware"] == "h100"


def test_another_regime_is_refused_naming_every_difference(h100, tmp_path):
    path, _ = h100
    result = invoke("run", DENSE, "--calibration", path, "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and "dtype: calibrated for 'bf16'" in result.stderr and "'fp8'" in result.stderr
    assert not (tmp_path / "x.nc").exists()
    result = invoke("run", DENSE, "--set", "precision.enabled=false", "--set", 'hardware.preset="a100"',
                    "--calibration", path, "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and "hardware: calibrated for 'h100'" in result.stderr
    result = invoke("run", ROOT / "scenarios" / "factory.toml", "--calibration", path, "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and "fidelity" in result.stderr


def test_held_out_half_within_its_band(tmp_path):
    # every other measured token count held out, at every TP: the fit and its surface have seen the GEMM shapes
    # (N, K), not these rows
    gemm, _ = measurements.linear_observations(MLP, measurements_hw())
    tokens = np.unique(gemm.data["rows"])
    train = np.isin(gemm.data["rows"], tokens[::2])
    fitted = fit.fit_class(gemm.subset(np.flatnonzero(train)), replicates=40, cross_validation=False)
    test = gemm.subset(np.flatnonzero(~train))
    predicted = fit.predict(test, fitted.estimate, fitted.surface)
    alone = fit.predict(test, fitted.estimate)
    error = np.mean(np.abs(predicted - test.measured_s) / test.measured_s)
    assert error < 0.05 < np.mean(np.abs(alone - test.measured_s) / test.measured_s)
    assert max(fit.band_errors(predicted, test.measured_s, test.data["rows"]).values()) < 0.08
    low, high = fitted.band(test)
    coverage = np.mean((test.measured_s >= low) & (test.measured_s <= high))
    assert coverage > 0.75  # a 90 % band of parameters and model error


def test_unmeasured_gemm_shapes_take_the_blend_of_measured_ones():
    # TP 1 and 4 predict TP 2 and 8: shapes the surface has not measured, between measured ones
    gemm, _ = measurements.linear_observations(MLP, measurements_hw())
    train = np.isin(gemm.data["tp"], (1, 4))
    fitted = fit.fit_class(gemm.subset(np.flatnonzero(train)), replicates=2, cross_validation=False)
    test = gemm.subset(np.flatnonzero(~train))
    blended = np.mean(np.abs(fit.predict(test, fitted.estimate, fitted.surface) / test.measured_s - 1))
    alone = np.mean(np.abs(fit.predict(test, fitted.estimate) / test.measured_s - 1))
    assert blended < 0.09 and blended < alone - 0.01


def measurements_hw():
    from mcsim.scenario import catalog

    return catalog.hardware_preset("h100")


def test_step_csv_fit_recovers_an_injected_host_overhead(tmp_path):
    rows = [("h100", "llama-3.1-8b", 1, s, c, q) for s, c, q in
            ((1, 512, 0), (8, 1024, 0), (32, 2048, 0), (64, 512, 256), (4, 4096, 0), (16, 1000, 512))]
    modelled = measurements.step_observations(_write_steps(tmp_path / "a.csv", rows, [1.0] * len(rows)), "bf16", {})
    times_ms = modelled.data["modelled_s"] * 1e3 + 0.75  # 0.75 ms of host work per step
    path = _write_steps(tmp_path / "b.csv", rows, times_ms)
    cal, fits = calibrate([path], replicates=10)
    assert cal.regime["hardware"] == "h100"
    assert cal.parameters["performance.step_overhead_s"]["estimate"] == pytest.approx(0.75e-3, rel=1e-3)


def _write_steps(path, rows, times_ms):
    lines = ["# measured steps", ",".join(measurements.STEP_COLUMNS)]
    lines += [",".join(str(x) for x in (*row, t)) for row, t in zip(rows, times_ms)]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("text, words", [
    ("hardware,model,tp\nh100,x,1\n", "not a measurement file"),
    ("hardware,model,tp,decode_seqs,mean_context,prefill_tokens,time_ms\nh100,llama-3.1-8b,one,1,10,0,1\n",
     ":2: expected integers"),
    ("hardware,model,tp,decode_seqs,mean_context,prefill_tokens,time_ms\nh100,nope,1,1,10,0,1\n",
     "unknown model preset 'nope'"),
    ("hardware,model,tp,decode_seqs,mean_context,prefill_tokens,time_ms\nh100,llama-3.1-8b,1,1,10,0,-1\n",
     ":2: tp >= 1"),
])
def test_bad_measurement_files_are_one_line_errors(tmp_path, text, words):
    path = tmp_path / "m.csv"
    path.write_text(text)
    result = invoke("calibrate", path, "--hardware", "h100", "-o", tmp_path / "c.toml")
    assert result.exit_code == 2 and words in result.stderr and "Traceback" not in result.output
    assert not (tmp_path / "c.toml").exists()


def test_unknown_hardware_is_refused(tmp_path):
    path = tmp_path / "all_reduce.csv"
    path.write_text(Path(ALLREDUCE).read_text())
    result = invoke("calibrate", path, "-o", tmp_path / "c.toml")
    assert result.exit_code == 2 and "--hardware" in result.stderr


def test_calibration_files_are_checked(h100, tmp_path):
    path, _ = h100
    text = path.read_text()
    broken = tmp_path / "b.toml"
    broken.write_text(text.replace("format = 2", "format = 1"))
    with pytest.raises(CalibrationError, match="calibration.format"):
        load(broken)
    broken.write_text(text.replace('[parameters."performance.gemm_error"]', '[parameters."performance.nope"]'))
    with pytest.raises(CalibrationError, match="performance.nope: not a numeric scenario key"):
        load(broken)
    broken.write_text(text.replace('hardware = "h100"', 'hardware = ""'))
    with pytest.raises(CalibrationError, match="regime.hardware: missing"):
        load(broken)
    cal = load(path)
    with pytest.raises(CalibrationError, match="exists"):
        save(cal, path)


def test_a_named_stream_is_shared_and_checked():
    assert parse({"dist": "choice", "values": [1, 2], "stream": "s"}, "a.b", allow_nested=False).stream == "s"
    with pytest.raises(DistributionError, match="a.b.stream"):
        parse({"dist": "choice", "values": [1, 2], "stream": 3}, "a.b", allow_nested=False)


def test_unreadable_vidur_file_is_a_measurement_error(tmp_path):
    with pytest.raises(MeasurementError):
        measurements.kind_of(tmp_path / "missing.csv")


@pytest.mark.parametrize("gpu", ["h100", "a100"])
def test_catalog_defaults_are_what_calibrate_fits_on_the_bundled_data(gpu):
    from mcsim.calibration.vidur import LINEAR_MODELS
    from mcsim.scenario import catalog

    files = [bundled_linear(gpu, m) for m in LINEAR_MODELS[gpu]]
    files += [bundled_collectives(f"{gpu}_dgx", c) for c in ("all_reduce", "send_recv")]
    cal, _ = calibrate(files, hardware=gpu, replicates=2, cross_validation=False)
    hw = catalog.hardware_preset(gpu)
    catalog_units = {"performance.flops_fraction": ("gemm_flops_fraction", 1), "performance.bandwidth_fraction":
                     ("gemm_bandwidth_fraction", 1), "performance.gemm_half_tokens": ("gemm_half_tokens", 1),
                     "performance.gemm_floor_s": ("gemm_floor_us", 1e-6), "performance.kernel_floor_s":
                     ("kernel_floor_us", 1e-6), "performance.elementwise_bandwidth_fraction":
                     ("elementwise_bandwidth_fraction", 1)}
    # A100's GEMMs are Vidur's fit; H100's are vLLM 0.24.0's (test_the_catalogs_aiconfigurator_figures_...), and
    # its Vidur fit is kept as the second source, mcsim/data/calibrations/h100.toml
    vidur_gemms = hw["gemm_surface"] == gpu
    gemm_keys = [f"performance.{k}" for k in ("flops_fraction", "bandwidth_fraction", "gemm_half_tokens",
                                              "gemm_floor_s")]
    for key, spec in cal.parameters.items():
        if key.endswith("_error") or (key in gemm_keys and not vidur_gemms):
            continue
        name, unit = catalog_units.get(key, (key.split(".", 1)[1], 1))
        assert hw[name] * unit == pytest.approx(spec["estimate"], rel=0.01, abs=0.05 * unit), key
    # the bundled Vidur calibration is this fit, to the digits written, surface included (and the catalog's GEMM
    # figures where they are Vidur's)
    bundled = load(gemm_surface.bundled_path(gpu))
    for key in gemm_keys:
        assert bundled.parameters[key]["estimate"] == pytest.approx(cal.parameters[key]["estimate"], rel=5e-4)
        name, unit = catalog_units[key]
        if vidur_gemms:
            assert hw[name] * unit == pytest.approx(bundled.parameters[key]["estimate"], rel=5e-4)
    fresh, table = cal.surfaces["gemm"], bundled.surfaces["gemm"]
    assert fresh["n"] == table["n"] and fresh["rows"] == table["rows"]
    assert np.allclose(fresh["log_ratio"], table["log_ratio"], atol=1e-5)


def test_a_scenario_names_its_calibration_relative_to_itself(h100, tmp_path):
    import shutil

    from mcsim.execution import api

    path, _ = h100
    folder = tmp_path / "study"
    folder.mkdir()
    shutil.copy(path, folder / "gpu.toml")
    text = DENSE.read_text().replace('[performance]\n', '[performance]\ncalibration = "gpu.toml"\n')
    text = text.replace("[precision]\nenabled = true", "[precision]\nenabled = false")
    (folder / "s.toml").write_text(text)
    scn = load_scenario(folder / "s.toml")
    assert scn.calibration is not None and scn.calibration.digest == load(path).digest
    # further overrides keep it; the Python API attaches one the way --calibration does
    again = api._as_scenario(scn, ("mc.samples=2",))
    assert again.calibration is not None and again["mc.samples"] == 2
    plain = load_scenario(DENSE, overrides=["precision.enabled=false"])
    assert api.calibrate(plain, path).calibration.digest == scn.calibration.digest
    with pytest.raises(CalibrationError, match="another regime"):
        scn.with_values({"hardware.preset": "a100"}, origin="--grid")


@pytest.mark.parametrize("value, message", [("inf", "finite"), ("1e400", "finite"), ("nan", "finite"),
                                            ('"' + "7" * 200_000 + '"', "field larger than field limit")])
def test_non_finite_or_huge_measurement_fields_are_one_line_errors(tmp_path, value, message):
    lines = bundled_collectives("h100_dgx", "all_reduce").read_text().splitlines()
    header, row = lines[0].split(","), lines[1].split(",")
    row[header.index("time_stats.all_reduce.median")] = value
    bad = tmp_path / "all_reduce.csv"
    bad.write_text("\n".join([lines[0], ",".join(row), *lines[2:6]]) + "\n")
    result = CliRunner().invoke(main, ["calibrate", str(bad), "--hardware", "h100", "-o", str(tmp_path / "c.toml")])
    assert result.exit_code == 2 and f"{bad}:2:" in result.stderr and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "c.toml").exists()
    steps = tmp_path / "steps.csv"
    steps.write_text("hardware,model,tp,decode_seqs,mean_context,prefill_tokens,time_ms\n"
                     f"h100,llama-3.1-70b,8,64,2048,0,{value}\n")
    result = CliRunner().invoke(main, ["calibrate", str(steps), "-o", str(tmp_path / "c.toml")])
    assert result.exit_code == 2 and f"{steps}:2:" in result.stderr and message in result.stderr


def test_a_calibration_sets_only_what_its_classes_measure(h100, tmp_path):
    from mcsim.calibration.fit import ERROR_KEY, PARAMETERS
    from mcsim.scenario.calibration_file import CLASS_KEYS

    # every fitted parameter and model error is allowed for its class
    for cls, specs in PARAMETERS.items():
        assert {key for key, *_ in specs} | {ERROR_KEY.format(cls=cls)} == set(CLASS_KEYS[cls]), cls
    path, _ = h100
    text = Path(path).read_text()
    replicates = ", ".join(["3.0"] * load(path).replicates)
    forgeries = []
    for key in ("deployment.instances", "economics.price_output_usd_per_mtok", "mc.requests"):
        table = (f'[parameters."{key}"]\nclass = "gemm"\nestimate = 3.0\nlow = 3.0\nhigh = 3.0\n'
                 f"replicates = [{replicates}]\n\n")
        forgeries.append(text.replace("[classes.", table + "[classes.", 1))
    moved = '[parameters."performance.gemm_floor_s"]\nclass = "gemm"'  # a GEMM figure claimed by another class
    assert moved in text
    forgeries.append(text.replace(moved, moved.replace('"gemm"', '"send"')))
    for forged_text in forgeries:
        forged = tmp_path / "forged.toml"
        forged.write_text(forged_text)
        with pytest.raises(CalibrationError, match="sets only what its op class measures"):
            load(forged)


def test_files_measured_on_one_gpu_are_not_calibrated_as_another(tmp_path):
    result = CliRunner().invoke(main, ["calibrate", str(bundled_collectives("h100_dgx", "send_recv")),
                                       "--hardware", "h200", "-o", str(tmp_path / "c.toml")])
    assert result.exit_code == 2 and "measured on 'h100'" in result.stderr and "--hardware h100" in result.stderr
    assert not (tmp_path / "c.toml").exists()
    # files whose folders name no GPU are taken at the user's word
    plain = tmp_path / "send_recv.csv"
    plain.write_text(bundled_collectives("h100_dgx", "send_recv").read_text())
    result = CliRunner().invoke(main, ["calibrate", str(plain), "--hardware", "h200", "-o", str(tmp_path / "c.toml"),
                                       "--replicates", "2"])
    assert result.exit_code == 0, result.stderr


# ---------------------------------------------------------------------------------------------------------------
# AIConfigurator's GEMM tables (mcsim.calibration.aiconfigurator)
# ---------------------------------------------------------------------------------------------------------------


def _aiconfigurator_table(tmp_path, truth_bf16, truth_fp8):
    """A GEMM table as the database lays it out (a CSV export): BF16 and FP8 rows over layer shapes, timed by the
    hand formula at known figures on H100, plus rows the reader must leave out (a tiny K, a 32,768-row GEMM, a
    dtype it does not fit)."""
    from mcsim.scenario import catalog

    hw = catalog.hardware_preset("h100")
    rng = np.random.default_rng(3)
    lines = ["framework,gemm_dtype,m,n,k,latency,kernel_source"]
    for dtype, truth, peak, wb in (("bfloat16", truth_bf16, hw["bf16_tflops"], 2), ("fp8", truth_fp8,
                                                                                    hw["fp8_tflops"], 1)):
        for n in (1024, 4096, 8192, 28672):
            for k in (1024, 8192):
                for m in (1, 8, 64, 256, 1024, 4096, 16384, 32768):
                    flops, nbytes = 2.0 * m * n * k, wb * n * k + wb * m * k + 2 * m * n  # one kernel:
                    f, b, half, floor = truth
                    t = floor + max(flops / (peak * 1e12 * f * m / (m + half)), nbytes / (hw["hbm_tb_s"] * 1e12 * b))
                    lines.append(f"VLLM,{dtype},{m},{n},{k},{t * 1e3 * math.exp(rng.normal(0, 0.005))},x")
    lines += ["VLLM,fp8,64,4096,64,0.01,x", "VLLM,int8,64,4096,4096,0.01,x"]
    path = tmp_path / "gemm_perf.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_aiconfigurator_gemm_fit_per_dtype_recovers_known_figures(tmp_path):
    from mcsim.calibration import aiconfigurator as aic
    from mcsim.scenario import catalog

    bf16, fp8 = (0.78, 0.84, 60.0, 4e-6), (0.45, 0.86, 90.0, 8e-6)
    table = aic.read_table(_aiconfigurator_table(tmp_path, bf16, fp8))
    hw = catalog.hardware_preset("h100")
    obs = aic.gemm_observations(table, hw, "fp8")
    assert len(obs) == 4 * 2 * 7 and obs.shape.max() + 1 == 8  # 32,768 rows, K = 64 and int8 left out
    for dtype, truth in (("bfloat16", bf16), ("fp8", fp8)):
        fitted = aic.fit_dtype(table, hw, dtype)
        got = [fitted[key] for key in aic.PARAMETER_KEYS]
        assert got[0] == pytest.approx(truth[0], rel=0.02) and got[1] == pytest.approx(truth[1], rel=0.02), dtype
        assert got[2] == pytest.approx(truth[2], rel=0.15) and got[3] == pytest.approx(truth[3], rel=0.15), dtype
        assert fitted["mape"] < 0.01 and fitted["rows"] == 56 and fitted["shapes"] == 8


def test_aiconfigurator_tables_refused_in_one_line(tmp_path):
    from mcsim.calibration import aiconfigurator as aic

    bad = tmp_path / "t.csv"
    bad.write_text("m,n,k\n1,2,3\n")
    with pytest.raises(ValueError, match="expected a GEMM table with columns"):
        aic.read_table(bad)
    with pytest.raises(ValueError, match="no such file"):
        aic.read_table(tmp_path / "missing.parquet")
    bad.write_text("gemm_dtype,m,n,k,latency\nfp8,1,2,3,0.1\nfp8,1,2,3,\x1b[31msecret\n")
    with pytest.raises(ValueError) as err:
        aic.read_table(bad)
    assert str(err.value).startswith(f"{bad}:3: column latency is not a number") and "secret" not in str(err.value)
    table = aic.read_table(_aiconfigurator_table(tmp_path, (0.7, 0.8, 50.0, 5e-6), (0.4, 0.8, 50.0, 5e-6)))
    with pytest.raises(ValueError, match="no nvfp4 GEMM"):
        aic.gemm_observations(table, {"bf16_tflops": 989.4, "fp4_tflops": 0.0, "hbm_tb_s": 3.35}, "nvfp4")


def test_aiconfigurator_parquet_reads_as_its_csv(tmp_path):
    """The parquet file and its CSV export read the same (where a parquet reader is installed: the optional extra)."""
    fastparquet = pytest.importorskip("fastparquet")
    import pandas as pd

    from mcsim.calibration import aiconfigurator as aic

    csv_path = _aiconfigurator_table(tmp_path, (0.7, 0.8, 50.0, 5e-6), (0.4, 0.8, 50.0, 5e-6))
    fastparquet.write(str(tmp_path / "gemm_perf.parquet"), pd.read_csv(csv_path))
    from_csv, from_parquet = aic.read_table(csv_path), aic.read_table(tmp_path / "gemm_perf.parquet")
    for column in aic.COLUMNS:
        np.testing.assert_array_equal(from_parquet[column], from_csv[column], err_msg=column)


def test_calibrate_reads_an_aiconfigurator_table_for_the_dtype_asked():
    """`mcsim calibrate` takes an AIConfigurator GEMM table (here the measured rows of tests/data) and fits the rows
    of --dtype only: the FP8 calibration's regime says FP8 and its GEMMs reach far less of their peak than BF16's."""
    table = Path(__file__).parent / "data" / "aiconfigurator" / "h100_vllm_0.24.0_llama70b_tp8_gemms.csv"
    assert measurements.kind_of(table) == "aiconfigurator-gemm"
    fits = {}
    for dtype in ("bf16", "fp8"):
        cal, class_fits = calibrate([table], hardware="h100", dtype=dtype, replicates=4, cross_validation=False)
        assert cal.regime["dtype"] == dtype and [f.cls for f in class_fits] == ["gemm"]
        fits[dtype] = class_fits[0].estimate["performance.flops_fraction"]
    assert fits["fp8"] < 0.75 * fits["bf16"]  # of the doubled peak: FP8 is not twice BF16's speed


def test_calibrate_refuses_a_file_that_is_not_a_gemm_table_in_one_line(tmp_path):
    """A .parquet that is no parquet file, or a table with a value that is not a number, stops `mcsim calibrate`
    with exit 2 and one line naming the file, never its content."""
    garbage = tmp_path / "gemm_perf.parquet"
    garbage.write_bytes(b"\x1b[31mnot parquet\n")
    table = tmp_path / "gemm_perf.csv"
    table.write_text("gemm_dtype,m,n,k,latency\nfp8,1,2,three,0.1\n")
    for path in (garbage, table):
        result = CliRunner().invoke(main, ["calibrate", str(path), "--hardware", "h100", "--dtype", "fp8", "-o",
                                           str(tmp_path / "out.toml")])
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert result.exit_code == 2 and len(lines) == 1 and str(path) in lines[0], result.output
        assert "not parquet" not in lines[0] and "three" not in lines[0]
        assert not (tmp_path / "out.toml").exists()


def test_custom_allreduce_fit_recovers_known_figures():
    """Messages timed by vLLM's one-shot/two-shot rule at a known stage cost and bandwidth (under CUDA graphs), with
    eager rows and rows the engine would hand to NCCL (8 MiB and more, a group of 16) that the fit must leave out."""
    from mcsim.calibration import aiconfigurator as aic

    rows = []
    for p in (2, 4, 8):
        for elements in 2 ** np.arange(7, 24):
            nbytes = 2.0 * elements
            one = p == 2 or (p <= 4 and nbytes < 512 * 1024) or nbytes < 256 * 1024
            sent = (p - 1) * nbytes if one else 2 * (p - 1) / p * nbytes
            t = (1 if one else 2) * 5.0e-6 + sent / 250e9
            rows.append(("bfloat16", p, elements, t * 1e3, "vllm_graph"))
            rows.append(("bfloat16", p, elements, t * 4e3, "vllm_eager"))
    rows.append(("bfloat16", 16, 1024, 1.0, "vllm_graph"))
    table = {c: np.array([r[i] for r in rows], dtype=str if c in ("allreduce_dtype", "backend") else float)
             for i, c in enumerate(aic.ALLREDUCE_COLUMNS)}
    fit = aic.fit_custom_allreduce(table)
    assert fit["hardware.custom_allreduce_hop_us"] == pytest.approx(5.0, rel=1e-6)
    assert fit["hardware.custom_allreduce_gb_s"] == pytest.approx(250.0, rel=1e-6)
    assert fit["rows"] == 3 * 15 and fit["mape"] < 1e-6  # 128 elements to 4 M elements (8 MiB left out)


def test_gemm_exports_round_trip_and_bad_ones_are_one_line_errors(tmp_path):
    """A table exported as compressed CSV reads back row for row (latency to five significant digits), is taken by
    `mcsim calibrate` as a GEMM table, and a .csv.gz that is not gzip is refused in one line naming the file."""
    from mcsim.calibration import aiconfigurator as aic

    table = aic.read_table(_aiconfigurator_table(tmp_path, (0.7, 0.8, 50.0, 5e-6), (0.4, 0.8, 50.0, 5e-6)))
    out = tmp_path / "export.csv.gz"
    assert aic.export_gemms(table, ["fp8"], out) == 56  # the transformer-shaped FP8 rows only
    back = aic.read_table(out)
    keep = ((table["gemm_dtype"] == "fp8") & (table["n"] >= aic.MIN_N) & (table["k"] >= aic.MIN_K)
            & (table["m"] <= aic.MAX_M))
    assert sorted(zip(back["m"], back["n"], back["k"])) == sorted(zip(table["m"][keep], table["n"][keep],
                                                                      table["k"][keep]))
    original = {(m, n, k): t for m, n, k, t in zip(table["m"][keep], table["n"][keep], table["k"][keep],
                                                    table["latency"][keep])}
    for m, n, k, t in zip(back["m"], back["n"], back["k"], back["latency"]):
        assert t == pytest.approx(original[(m, n, k)], rel=5e-5)  # half a unit in the fifth digit
    assert measurements.kind_of(out) == "aiconfigurator-gemm"
    assert out.read_bytes() == (aic.export_gemms(table, ["fp8"], tmp_path / "again.csv.gz"),
                                (tmp_path / "again.csv.gz").read_bytes())[1]  # no timestamp: the same bytes
    bad = tmp_path / "bad.csv.gz"
    bad.write_bytes(b"\x1b[31mnot gzip\n")
    with pytest.raises(ValueError) as err:
        aic.read_table(bad)
    assert str(err.value).startswith(f"{bad}: not a gzip-compressed CSV") and "\n" not in str(err.value)


@pytest.mark.parametrize("gpu", ["h100", "h200", "b200"])
def test_the_catalogs_aiconfigurator_figures_are_fits_of_the_bundled_rows(gpu):
    """The measured rows that ship are the rows behind the catalog: refitting them gives the catalog's BF16 and FP8
    GEMM figures, its attention figures, its custom all-reduce, its fused MoE figures of every measured dtype and its
    MLA figures, to the digits the catalog keeps."""
    from mcsim.calibration import aiconfigurator as aic
    from mcsim.scenario import catalog

    hw = catalog.hardware_preset(gpu)
    table = aic.read_table(aic.bundled(gpu))
    for dtype, prefix in (("fp8", "gemm_fp8_"), ("bfloat16", "gemm_")):
        fitted = aic.fit_dtype(table, hw, dtype)
        assert fitted["performance.flops_fraction"] == pytest.approx(hw[prefix + "flops_fraction"], abs=1e-3)
        assert fitted["performance.bandwidth_fraction"] == pytest.approx(hw[prefix + "bandwidth_fraction"], abs=1e-3)
        assert fitted["performance.gemm_half_tokens"] == pytest.approx(hw[prefix + "half_tokens"], abs=0.05)
        assert fitted["performance.gemm_floor_s"] * 1e6 == pytest.approx(hw[prefix + "floor_us"], abs=1e-3)
    attention = aic.attention_observations(aic.read_table(aic.bundled(gpu, "attention"), aic.ATTENTION_COLUMNS), hw)
    assert measurements.kind_of(aic.bundled(gpu, "attention")) == "aiconfigurator-attention"
    for key, value in zip(attention.active, fit.fit_point(attention)):
        assert value == pytest.approx(hw[key.split(".", 1)[1]], rel=1e-3), key
    allreduce = aic.fit_custom_allreduce(aic.read_table(aic.bundled(gpu, "custom_allreduce"), aic.ALLREDUCE_COLUMNS))
    assert allreduce["hardware.custom_allreduce_hop_us"] == pytest.approx(hw["custom_allreduce_hop_us"], abs=1e-3)
    assert allreduce["hardware.custom_allreduce_gb_s"] == pytest.approx(hw["custom_allreduce_gb_s"], abs=0.05)
    moe = aic.read_table(aic.bundled(gpu, "moe"), aic.MOE_COLUMNS)
    for compute, (name, *_) in aic.MOE_DTYPES.items():
        if not np.any(moe["moe_dtype"] == name):
            continue
        experts = aic.experts_observations(moe, hw, compute)
        for key, value in zip(experts.active, fit.fit_point(experts)):
            assert value == pytest.approx(hw[key.split(".", 1)[1]], rel=1e-3, abs=1e-3), key
    mla = aic.mla_observations(aic.read_table(aic.bundled(gpu, "mla"), aic.MLA_COLUMNS), hw)
    for key, value in zip(mla.active, fit.fit_point(mla)):
        assert value == pytest.approx(hw[key.split(".", 1)[1]], rel=1e-3, abs=1e-3), key
    for key, value in aic.fit_mla_fp8_kv(gpu).items():
        if key.startswith("mla_fp8_kv_"):
            assert value == pytest.approx(hw[key], rel=1e-3), key
    if gpu == "b200":  # B200's NCCL figures are its own NCCL 2.29.2 all-reduces' (H100's and H200's are Vidur's)
        assert measurements.kind_of(aic.bundled_nccl(gpu)) == "aiconfigurator-nccl"
        nccl = aic.nccl_allreduce_observations(aic.read_table(aic.bundled_nccl(gpu), aic.NCCL_COLUMNS))
        for key, value in zip(nccl.active, fit.fit_point(nccl)):
            assert value == pytest.approx(hw[key.split(".", 1)[1]], rel=1e-3, abs=1e-3), key


def test_attention_fit_recovers_known_figures():
    """Decode and prefill calls timed by :func:`mcsim.perf.roofline.attention_seconds` at known figures (with 1 %
    noise), over batch sizes, contexts, prompt lengths and head shapes, and rows the fit must leave out (a window,
    an opt-in kernel): the attention class recovers the figures and prices the rows within the noise."""
    from mcsim.calibration import aiconfigurator as aic
    from mcsim.scenario import catalog

    truth = {"hardware.attention_floor_us": 10.0, "hardware.attention_bandwidth_fraction": 0.9,
             "hardware.attention_unit_ns": 25.0, "hardware.attention_flops_fraction": 0.8,
             "hardware.attention_prefill_bandwidth_fraction": 0.3, "hardware.attention_half_work": 8000.0,
             "hardware.attention_head_dim_half": 60.0, "hardware.attention_half_context": 400.0}
    hw = catalog.hardware_preset("h100")
    rng = np.random.default_rng(7)
    rows = []
    for hq, kv, hd in ((8, 1, 128), (16, 2, 128), (32, 8, 64), (4, 4, 256)):
        for b in (1, 4, 16, 64, 256):
            for s in (15, 255, 2047, 16383):
                rows.append(("generation_attention", "fa3", "bfloat16", b, 1, s, hq, kv, hd, 0))
            for isl in (64, 512, 2048, 8192):
                rows.append(("context_attention", "fa3", "bfloat16", max(b // 16, 1), isl, 0, hq, kv, hd, 0))
    rows += [("generation_attention", "fa3", "bfloat16", 8, 1, 100, 8, 1, 128, 128),
             ("generation_attention", "vllm_flash_attn_fa4", "bfloat16", 8, 1, 100, 8, 1, 128, 0)]
    columns = aic.ATTENTION_COLUMNS[:-1]
    table = {c: np.array([r[i] for r in rows], dtype=str if c in aic.TEXT_COLUMNS else float)
             for i, c in enumerate(columns)}
    table["latency"] = np.ones(len(rows))
    obs = aic.attention_observations(table, hw)
    assert len(obs) == len(rows) - 2
    clean = fit.predict(obs, truth)
    keep = (table["window_size"] == 0) & (table["kernel_source"] == "fa3")
    table["latency"][keep] = clean * 1e3 * np.exp(rng.normal(0, 0.01, clean.size))
    obs = aic.attention_observations(table, hw)
    fitted = dict(zip(obs.active, fit.fit_point(obs)))
    for key in ("hardware.attention_floor_us", "hardware.attention_bandwidth_fraction",
                "hardware.attention_unit_ns", "hardware.attention_prefill_bandwidth_fraction"):
        assert fitted[key] == pytest.approx(truth[key], rel=0.05), key
    assert np.mean(np.abs(fit.predict(obs, fitted) / obs.measured_s - 1)) < 0.015


def test_experts_fit_recovers_known_figures_and_leaves_out_impossible_rows():
    """Fused MoE layers timed by the fused-MoE formula written out here in plain Python (fixed time; the touched
    experts' weights and the pairs' activations at their own bandwidth shares, or the FLOPs at a share that grows
    with pairs per expert; a cost per 64 x 128 output tile) at known figures, over tokens, expert counts and widths,
    plus a row faster than its experts' weights can be read: the fit leaves that row out and recovers the
    figures."""
    from mcsim.calibration import aiconfigurator as aic
    from mcsim.scenario import catalog

    hw = catalog.hardware_preset("h100")
    peak, hbm = hw["bf16_tflops"] * 1e12, hw["hbm_tb_s"] * 1e12
    truth = {"flops_fraction": 0.55, "weight_bandwidth_fraction": 0.9, "stream_bandwidth_fraction": 0.6,
             "half_rows": 60.0, "floor_us": 30.0, "tile_ns": 6.0}

    def reference(tokens, hidden, inter, experts, topk, tp):
        width, pairs = inter / tp, tokens * topk
        touched = aic.balanced_experts(tokens, experts, topk)
        per_expert = pairs / touched
        weights = touched * 3 * hidden * width * 2
        stream = (pairs * (hidden * 2 + 2 * width * 2) + pairs * 3 * width * 2 + pairs * (width * 2 + hidden * 2)
                  + pairs * hidden * 2 + tokens * hidden * 2)
        compute = 6 * pairs * hidden * width / (peak * truth["flops_fraction"]) * (per_expert + truth["half_rows"]) \
            / per_expert
        memory = (weights / (hbm * truth["weight_bandwidth_fraction"])
                  + stream / (hbm * truth["stream_bandwidth_fraction"]))
        tiles = (pairs / 64 + touched) * (math.ceil(2 * width / 128) + math.ceil(hidden / 128))
        return truth["floor_us"] * 1e-6 + max(compute, memory) + tiles * truth["tile_ns"] * 1e-9

    rows = []
    for hidden, inter, experts, topk, tp in ((4096, 14336, 8, 2, 2), (2048, 768, 128, 8, 1), (7168, 2048, 64, 6, 4),
                                             (2816, 176, 128, 8, 8)):
        for tokens in (1, 4, 16, 64, 256, 1024, 4096, 16384):
            rows.append(("bfloat16", "triton", "balanced", tokens, hidden, inter, topk, experts, tp, 1,
                         reference(tokens, hidden, inter, experts, topk, tp) * 1e3))
    rows.append(("bfloat16", "triton", "balanced", 4096, 4096, 14336, 2, 8, 1, 1, 1e-6))  # impossibly fast
    table = {c: np.array([r[i] for r in rows], dtype=str if c in aic.TEXT_COLUMNS else float)
             for i, c in enumerate(aic.MOE_COLUMNS)}
    obs = aic.experts_observations(table, hw, "bf16")
    assert len(obs) == len(rows) - 1 and obs.cls == "experts" and len(np.unique(obs.shape)) == 4
    fitted = dict(zip(obs.active, fit.fit_point(obs)))
    for key, value in truth.items():
        assert fitted[f"hardware.experts_{key}"] == pytest.approx(value, rel=0.02), key
    assert np.mean(np.abs(fit.predict(obs, fitted) / obs.measured_s - 1)) < 1e-3


def test_balanced_routing_touches_the_experts_the_collectors_pattern_names():
    """AIConfigurator's balanced router logits, written out in plain Python: token t's j-th expert is (t + j s) mod E
    (or (t s / T + j s) mod E, truncated, for T < s), s = ceil(E / k)."""
    import math

    from mcsim.calibration.aiconfigurator import balanced_experts

    def reference(tokens, experts, topk):
        stride = math.ceil(experts / topk)
        chosen = set()
        for t in range(tokens):
            for j in range(topk):
                first = t if tokens >= stride else t * stride / tokens
                chosen.add(int((first + j * stride) % experts))
        return len(chosen)

    for tokens, experts, topk in ((1, 8, 2), (3, 8, 2), (8, 8, 2), (1, 256, 8), (5, 256, 8), (40, 256, 8),
                                  (4, 512, 22), (30, 512, 22), (100, 128, 6), (7, 160, 6)):
        assert balanced_experts(tokens, experts, topk) == reference(tokens, experts, topk)

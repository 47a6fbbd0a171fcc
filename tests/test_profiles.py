"""Tests of hardware profiles, roofline pricing and this machine's micro-benchmarks (mcsim.optrace.profiles)."""

import math

import pytest

from mcsim.optrace.decoder import OpRecord
from mcsim.optrace.profiles import (
    HOST_PRESETS,
    THEORETICAL,
    Profile,
    catalog_profiles,
    datasheet_profiles,
    default_profiles,
    measure_this_machine,
    price,
)
from mcsim.scenario import catalog


def _by_name():
    return {p.name: p for p in default_profiles()}


@pytest.mark.parametrize("fragment, flops, bandwidth", [
    ("M1", 2.6e12, 68.25e9),
    ("3060 Ti", 16.2e12, 448e9),
    ("2070 Super", 9.1e12, 448e9),
    ("theoretical", 100e12, 512e9),
])
def test_required_device_figures(fragment, flops, bandwidth):
    matches = [p for p in default_profiles() if fragment in p.name]
    assert len(matches) == 1
    p = matches[0]
    assert (p.peak_flops, p.bandwidth_bytes_s) == (flops, bandwidth)
    assert p.kind in ("datasheet", "theoretical") and p.source


def test_every_catalog_gpu_has_a_datasheet_profile():
    profiles = _by_name()
    gpus = {key: entry for key, entry in catalog.hardware().items() if key not in HOST_PRESETS}
    assert {"a100", "h100", "h800", "h200", "b200", "mi300x"} <= set(gpus)
    for entry in gpus.values():
        p = profiles[entry["name"]]
        assert p.kind == "datasheet" and entry["source"] in p.source
        assert p.peak_flops == entry["bf16_tflops"] * 1e12
        assert p.bandwidth_bytes_s == entry["hbm_tb_s"] * 1e12
    # The catalog's placeholder for the host is not a datasheet device.
    assert not any(catalog.hardware()[key]["name"] in profiles for key in HOST_PRESETS if key in catalog.hardware())


def test_fp32_catalog_peaks_when_asked():
    fp32 = {p.name: p for p in catalog_profiles("fp32")}
    h100 = catalog.hardware_preset("h100")
    assert fp32[h100["name"]].peak_flops == h100["fp32_tflops"] * 1e12
    with pytest.raises(ValueError):
        catalog_profiles("int8")


def test_consumer_profiles_cite_sources():
    for p in datasheet_profiles()[:3]:
        assert "https://" in p.source


def test_price_matches_hand_roofline():
    # 1e12 FLOP and 1e9 bytes on 100 TFLOP/s and 512 GB/s: 10 ms of compute, 1.953 ms of memory.
    record = OpRecord("x", 0, "prefill", "matmul", 1e12, 6e8, 4e8, 0.0)
    result = price(record, THEORETICAL)
    assert result["t_compute"] == pytest.approx(1e-2)
    assert result["t_memory"] == pytest.approx(1e9 / 512e9)
    assert result["t_estimate"] == pytest.approx(1e-2)
    assert result["bound"] == "compute"
    assert result["intensity"] == pytest.approx(1000.0) and result["ridge"] == pytest.approx(100e12 / 512e9)
    # A mapping works the same; exactly at the ridge counts as compute-bound.
    ridge = THEORETICAL.ridge
    at_ridge = price({"flops": ridge * 1e6, "bytes_read": 1e6, "bytes_written": 0.0}, THEORETICAL)
    assert at_ridge["bound"] == "compute" and at_ridge["t_compute"] == pytest.approx(at_ridge["t_memory"])


def test_large_gemm_is_compute_bound_and_gemv_memory_bound_everywhere():
    n, b = 16384, 4
    gemm = OpRecord("gemm", 0, "prefill", "matmul", 2 * n**3, 2 * n * n * b, n * n * b, 0.0)  # 2730 FLOP/B
    gemv = OpRecord("gemv", 0, "decode", "matmul", 2 * n * n, (n * n + n) * b, n * b, 0.0)  # ~0.5 FLOP/B
    measured = Profile("this machine", 2e11, 5e10, "measured", "test")
    for p in default_profiles(measured):
        assert price(gemm, p)["bound"] == "compute", p.name
        assert price(gemv, p)["bound"] == "memory", p.name


def test_zero_flop_op_is_memory_bound():
    result = price(OpRecord("kv_append", 0, "decode", "memory", 0, 100, 100, 0.0), THEORETICAL)
    assert result["bound"] == "memory" and result["t_compute"] == 0 and result["intensity"] == 0


def test_profile_validation():
    with pytest.raises(ValueError):
        Profile("x", 1.0, 1.0, "guessed", "")
    with pytest.raises(ValueError):
        Profile("x", 0.0, 1.0, "datasheet", "")


def test_measure_this_machine_is_positive_finite_and_labelled():
    p = measure_this_machine(seconds=0.1)
    assert p.kind == "measured" and p.name == "this machine"
    assert math.isfinite(p.peak_flops) and p.peak_flops > 1e8  # any machine that runs numpy beats 0.1 GFLOP/s
    assert math.isfinite(p.bandwidth_bytes_s) and p.bandwidth_bytes_s > 1e8
    assert "measured" in p.source and "GEMM" in p.source

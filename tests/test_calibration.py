"""Calibration files: round trip, strict loading, regime refusal and the documented correction rule."""

import copy
import doctest
import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcsim import fileio
from mcsim.optrace import calibration
from mcsim.optrace.calibration import (
    Calibration,
    CalibrationError,
    apply,
    check_regime,
    load,
    regime_of,
    save,
)
from mcsim.scenario import load_scenario, resolve

REGIME = {"dtype": "fp32", "backend": "roofline", "model": "llama-3-70b", "hardware": "this machine"}


def make(**changes) -> Calibration:
    fields = {"regime": dict(REGIME), "factor": 0.5, "memory_bound_score": 0.75, "bottleneck": "memory",
              "measured": {"decode_tok_s": 20.0, "runs": 3, "note": "numpy trace"},
              "estimated": {"decode_tok_s": 40.0}, "source": "optrace on this machine"}
    fields.update(changes)
    return Calibration(**fields)


def valid_dict() -> dict:
    return {"version": 1, **make().to_dict()}


def write_json(path, data) -> None:
    path.write_text(json.dumps(data, indent=2))


PARAMS = {
    "precision.enabled": False,
    "precision.compute": "fp8",
    "performance.fidelity": "roofline",
    "model.preset": "llama-3-70b",
    "hardware.preset": "this machine",
    "performance.flops_fraction": 0.3,
    "performance.bandwidth_fraction": 0.2,
    "performance.network_fraction": 0.7,
    "efficiency.base_decode_tok_s_per_gpu": 1500.0,
    "efficiency.base_prefill_tok_s_per_gpu": 5000.0,
    "efficiency.batch_half_saturation": 16.0,
    "mc.seed": 7,
}


# --- save / load ---------------------------------------------------------------------------------------------

def test_round_trip(tmp_path):
    cal = make()
    path = save(cal, tmp_path / "cal.json")
    assert load(path) == cal
    on_disk = json.loads(path.read_text())
    assert on_disk["version"] == 1 and on_disk["regime"] == REGIME and on_disk["factor"] == 0.5


def test_write_is_atomic_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "cal.json"
    save(make(factor=2.0), target)
    save(make(factor=3.0), target)  # replaces the existing file
    assert sorted(os.listdir(tmp_path)) == ["cal.json"]
    assert load(target).factor == 3.0


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "cal.json"
    save(make(factor=2.0), target)
    before = target.read_text()

    def refuse(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio.os, "replace", refuse)
    with pytest.raises(CalibrationError, match="No space left on device") as info:
        save(make(factor=3.0), target)
    assert str(target) in str(info.value)
    assert target.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["cal.json"]


def test_unserializable_measurement_is_refused_before_writing(tmp_path):
    target = tmp_path / "cal.json"
    with pytest.raises(CalibrationError, match="JSON"):
        save(make(measured={"decode_tok_s": float("nan")}), target)
    with pytest.raises(CalibrationError, match="JSON"):
        save(make(measured={"when": object()}), target)
    assert os.listdir(tmp_path) == []


def _drop(key):
    def edit(d):
        del d[key]
    return edit


def _drop_regime(key):
    def edit(d):
        del d["regime"][key]
    return edit


def _set(key, value):
    def edit(d):
        d[key] = value
    return edit


def _set_regime(key, value):
    def edit(d):
        d["regime"][key] = value
    return edit


INVALID = [
    *[(_drop(key), key, "missing") for key in calibration.FIELDS],
    *[(_drop_regime(key), f"regime.{key}", "missing") for key in calibration.REGIME_KEYS],
    (_set("regime", ["fp32"]), "regime", "object"),
    (_set_regime("dtype", 32), "regime.dtype", "string"),
    (_set_regime("hardware", "  "), "regime.hardware", "string"),
    (_set_regime("quantization", "q4"), "regime.quantization", "unknown"),
    (_set("factor", "2"), "factor", "number"),
    (_set("factor", True), "factor", "number"),
    (_set("factor", 0), "factor", "> 0"),
    (_set("factor", -1.5), "factor", "> 0"),
    (_set("memory_bound_score", 1.5), "memory_bound_score", "[0, 1]"),
    (_set("memory_bound_score", None), "memory_bound_score", "[0, 1]"),
    (_set("bottleneck", 3), "bottleneck", "string"),
    (_set("source", None), "source", "string"),
    (_set("measured", [1, 2]), "measured", "object"),
    (_set("estimated", "40"), "estimated", "object"),
    (_set("extra", 1), "extra", "unknown"),
    (_set("version", 2), "version", "not supported"),
]


@pytest.mark.parametrize("edit, key, words", INVALID, ids=[f"{k}-{w}" for _, k, w in INVALID])
def test_invalid_file_names_file_and_key(tmp_path, edit, key, words):
    data = valid_dict()
    edit(data)
    path = tmp_path / "broken.json"
    write_json(path, data)
    with pytest.raises(CalibrationError) as info:
        load(path)
    message = str(info.value)
    assert str(path) in message
    assert repr(key) in message
    assert words in message
    assert info.value.key == key


def test_bad_json_names_file_and_line(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text('{\n  "factor": 0.5,\n  "bottleneck": "memory",,\n  "source": "x"\n}\n')
    with pytest.raises(CalibrationError, match="line 3") as info:
        load(path)
    assert str(path) in str(info.value)
    assert info.value.line == 3


@pytest.mark.parametrize("text, words", [
    ('{"factor": NaN}', "NaN"),
    ("[1, 2]", "object"),
    ("", "line 1"),
])
def test_other_bad_contents(tmp_path, text, words):
    path = tmp_path / "odd.json"
    path.write_text(text)
    with pytest.raises(CalibrationError, match=words) as info:
        load(path)
    assert str(path) in str(info.value)


def test_unreadable_files(tmp_path):
    missing = tmp_path / "nope.json"
    with pytest.raises(CalibrationError, match="cannot be read") as info:
        load(missing)
    assert str(missing) in str(info.value)
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00{")
    with pytest.raises(CalibrationError, match="cannot be read"):
        load(binary)


def test_invalid_object_in_memory():
    with pytest.raises(CalibrationError, match="^calibration: 'factor'"):
        make(factor=float("inf"))
    with pytest.raises(CalibrationError, match="regime.backend"):
        make(regime={"dtype": "fp32", "model": "m", "hardware": "h"})


# --- regime --------------------------------------------------------------------------------------------------

def test_regime_of_the_factory_scenario(factory_path):
    scn = load_scenario(factory_path)
    assert regime_of(scn.values) == {"dtype": "fp8", "backend": "factor", "model": "deepseek-v3",
                                     "hardware": "h800"}
    # The baseline variant turns low precision off: BF16, a different regime.
    assert regime_of(scn.variant("baseline").values)["dtype"] == "bf16"


def test_regime_of_uses_schema_defaults():
    # Defaults: precision enabled with fp8 compute, factor fidelity, deepseek-v3 on h800.
    assert regime_of({}) == {"dtype": "fp8", "backend": "factor", "model": "deepseek-v3", "hardware": "h800"}
    assert regime_of(PARAMS) == REGIME | {"dtype": "bf16"}


def test_matching_regime_is_accepted():
    check_regime(make(), dict(REGIME))
    # Case and surrounding spaces do not matter.
    check_regime(make(), {k: f" {v.upper()} " for k, v in REGIME.items()})


def test_mismatching_regime_is_refused_with_both_values():
    scenario = {"dtype": "fp8", "backend": "roofline", "model": "llama-3-70b", "hardware": "h800"}
    with pytest.raises(CalibrationError) as info:
        check_regime(make(), scenario)
    message = str(info.value)
    assert "dtype: calibrated for 'fp32', scenario has 'fp8'" in message
    assert "hardware: calibrated for 'this machine', scenario has 'h800'" in message
    assert "backend: calibrated" not in message and "model: calibrated" not in message  # only mismatches
    assert "optrace on this machine" in message
    assert info.value.key == "dtype"


def test_missing_scenario_regime_key_is_a_mismatch():
    with pytest.raises(CalibrationError, match=r"model: calibrated for 'llama-3-70b', scenario has \(not given\)"):
        check_regime(make(), {k: v for k, v in REGIME.items() if k != "model"})


# --- apply ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("factor, score, bandwidth, flops, decode, prefill", [
    # factor 4 split evenly: each fraction doubles (0.2 -> 0.4, 0.3 -> 0.6); base throughputs x4.
    (4.0, 0.5, 0.4, 0.6, 6000.0, 20000.0),
    # wholly memory-bound: only bandwidth moves.
    (0.25, 1.0, 0.05, 0.3, 375.0, 1250.0),
    # wholly compute-bound: only FLOP/s moves.
    (0.25, 0.0, 0.2, 0.075, 375.0, 1250.0),
    # 0.5 ** 0.75 = 0.5946035575, 0.5 ** 0.25 = 0.8408964153.
    (0.5, 0.75, 0.2 * 0.5946035575, 0.3 * 0.8408964153, 750.0, 2500.0),
    # 16 ** 0.75 = 8 and 16 ** 0.25 = 2: bandwidth 0.2 x 8 = 1.6 is clipped to 1; FLOP/s 0.3 x 2 = 0.6.
    (16.0, 0.75, 1.0, 0.6, 24000.0, 80000.0),
])
def test_apply_scales_as_documented(factor, score, bandwidth, flops, decode, prefill):
    params = copy.deepcopy(PARAMS)
    out = apply(make(factor=factor, memory_bound_score=score), params)
    assert out["performance.bandwidth_fraction"] == pytest.approx(bandwidth, rel=1e-9)
    assert out["performance.flops_fraction"] == pytest.approx(flops, rel=1e-9)
    assert out["efficiency.base_decode_tok_s_per_gpu"] == pytest.approx(decode, rel=1e-12)
    assert out["efficiency.base_prefill_tok_s_per_gpu"] == pytest.approx(prefill, rel=1e-12)
    changed = {"performance.bandwidth_fraction", "performance.flops_fraction",
               "efficiency.base_decode_tok_s_per_gpu", "efficiency.base_prefill_tok_s_per_gpu"}
    assert {k: v for k, v in out.items() if k not in changed} == {k: v for k, v in PARAMS.items()
                                                                   if k not in changed}
    assert params == PARAMS  # the input is not modified


@settings(max_examples=30, deadline=None)
@given(factor=st.floats(0.05, 20.0), score=st.floats(0.0, 1.0),
       bandwidth=st.floats(0.01, 1.0), flops=st.floats(0.01, 1.0))
def test_apply_splits_the_factor_and_keeps_fractions_in_range(factor, score, bandwidth, flops):
    params = {"performance.bandwidth_fraction": bandwidth, "performance.flops_fraction": flops}
    out = apply(make(factor=factor, memory_bound_score=score), params)
    new_bw, new_fl = out["performance.bandwidth_fraction"], out["performance.flops_fraction"]
    assert 0.0 < new_bw <= 1.0 and 0.0 < new_fl <= 1.0
    if bandwidth * factor ** score < 1.0 and flops * factor ** (1.0 - score) < 1.0:
        # Unclipped, the two corrections multiply back to the measured factor.
        assert (new_bw / bandwidth) * (new_fl / flops) == pytest.approx(factor, rel=1e-9)


def test_apply_leaves_absent_keys_absent():
    out = apply(make(factor=2.0), {"mc.seed": 1})
    assert out == {"mc.seed": 1}


def test_apply_to_undrawn_distribution_is_refused(factory_path):
    scn = load_scenario(factory_path)
    with pytest.raises(CalibrationError, match="efficiency.base_decode_tok_s_per_gpu.*resolved"):
        apply(make(factor=2.0), scn.values)


def test_apply_to_resolved_scenario_parameters(factory_path):
    scn = load_scenario(factory_path)
    draws = {path: dist.ppf(0.5) for path, dist in scn.uncertain().items()}
    params = resolve(scn, draws)
    out = apply(make(factor=2.0, memory_bound_score=1.0), params)
    assert out["efficiency.base_decode_tok_s_per_gpu"] == pytest.approx(
        2.0 * params["efficiency.base_decode_tok_s_per_gpu"])
    assert out["performance.flops_fraction"] == params["performance.flops_fraction"]


def test_module_example():
    result = doctest.testmod(calibration)
    assert result.attempted > 0 and result.failed == 0

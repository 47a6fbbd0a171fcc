"""Extreme values: every numeric key has a range, so 1e300 (and -1e300) is refused when the scenario loads, in one
line naming the key and the range it accepts; 1e-300 is refused the same way or runs to finite figures (NaN only where
a sample is infeasible or a variable's description says). The ranges are physical (:mod:`mcsim.scenario.bounds`):
far beyond any deployment, and an unbounded law on an uncertain input (a lognormal price) is held to them at its
1e-12 tails."""

import numpy as np
import pytest
from helpers import DENSE_NODE, invoke

from mcsim.errors import McsimError
from mcsim.execution import executor
from mcsim.scenario import ScenarioError, field_for, load_scenario
from mcsim.scenario.bounds import CATALOG_UPPER, SCENARIO_LOWER, SCENARIO_UPPER
from mcsim.scenario.schema import CLASS_FIELDS, SECTIONS, TIER_FIELDS


def _every_numeric_key() -> list[str]:
    """Every numeric key of the schema (one class's keys, the catalog's fields), read from the schema itself so a
    key added later is walked too."""
    from mcsim.scenario import catalog

    paths = [f"{s}.{k}" for s, table in SECTIONS.items() for k, f in table.items() if f.kind in ("int", "float")]
    paths += [f"workload.classes.chat.{k}" for k, f in CLASS_FIELDS.items() if f.kind in ("int", "float")]
    paths += [f"{s}.{k}" for s, fields in (("model", catalog.MODEL_FIELDS), ("hardware", catalog.HARDWARE_FIELDS))
              for k, t in fields.items() if t is not str]
    return paths


def test_every_numeric_key_has_a_finite_range():
    unbounded = [p for p in _every_numeric_key() if field_for(p).lo is None or field_for(p).hi is None]
    assert unbounded == [] and all(0 < v < 1e12 for v in (*SCENARIO_UPPER.values(), *SCENARIO_LOWER.values()))
    assert all(f.hi is not None for f in TIER_FIELDS.values() if f.kind in ("int", "float"))


@pytest.mark.slow
@pytest.mark.parametrize("path", _every_numeric_key())
def test_every_numeric_key_at_both_extremes(path):
    spec = field_for(path)
    for value in (1e300, -1e300):  # past every range: refused in one line naming the key and its range
        with pytest.raises(ScenarioError) as err:
            load_scenario(DENSE_NODE, overrides=[f"{path}={value!r}"])
        message = str(err.value)
        assert "\n" not in message and f"{path}: expected {spec.describe()}, got " in message, message
    try:  # 1e-300: refused the same way, or it runs (a refusal found while running is a one-line McsimError)
        scn = load_scenario(DENSE_NODE, overrides=[f"{path}=1e-300"])
    except ScenarioError as err:
        assert "\n" not in str(err) and f"{path}: expected {spec.describe()}, got " in str(err), str(err)
        return
    try:
        executor.run_task(executor.make_plan(scn, ("factory",), samples=1, requests=150), 0, 0)
    except McsimError as err:
        assert "\n" not in str(err).strip() and "." in str(err), str(err)

#: Each key an extreme value broke and now refuses, the value, and what broke.
REFUSED = [
    ("deployment.activation_gb_per_gpu", 1e300),  # hbm_usable_gb_per_gpu -inf
    ("workload.burstiness", 1e300),  # busy_fraction, gpu_hours, energy NaN: every request at one instant
    ("precision.weight_bytes", 1e300),  # weights_gb_per_gpu inf
    ("precision.kv_bytes", 1e-300),  # OverflowError
    ("precision.activation_bytes", 1e300),
    ("hardware.hbm_gb", 1e300),  # OverflowError
    ("hardware.gemm_flops_fraction", 1e300),  # a fraction of the peak above 1
    ("model.attention_heads", 10**18),  # a hang: listing the tensor-parallel degrees
    ("model.experts", 10**18),
]


@pytest.mark.parametrize("path, value", REFUSED, ids=[p for p, _ in REFUSED])
def test_an_extreme_value_is_refused_in_one_line_naming_the_key_and_range(path, value):
    spec = field_for(path)
    with pytest.raises(ScenarioError) as err:
        load_scenario(DENSE_NODE, overrides=[f"{path}={value!r}"])
    message = str(err.value)
    assert "\n" not in message and f"{path}: expected {spec.describe()}, got " in message, message
    assert np.isfinite(spec.hi if value > 1 else spec.lo)


def test_every_catalog_number_has_a_finite_upper_bound():
    from mcsim.scenario import catalog

    prices = ("price_usd", "rental_usd_per_hour")  # unbounded, as the [economics] prices
    for section, fields in (("model", catalog.MODEL_FIELDS), ("hardware", catalog.HARDWARE_FIELDS)):
        for key, kind in fields.items():
            if kind in (int, float) and key not in prices:
                assert np.isfinite(field_for(f"{section}.{key}").hi), key
    assert all(field_for(path).hi == hi for path, hi in CATALOG_UPPER.items())


def test_each_catalog_bound_refuses_past_it_and_is_a_hundred_times_the_catalogs_largest():
    """A value ten times a bound is refused when the scenario loads, naming the key; and every bound but a fraction's
    (1) is at least a hundred times the largest value the bundled catalog holds, as mcsim.scenario.bounds says."""
    from mcsim.scenario import catalog

    for path, hi in CATALOG_UPPER.items():
        with pytest.raises(ScenarioError, match=path.replace(".", r"\.")):
            load_scenario(DENSE_NODE, overrides=[f"{path}={hi * 10!r}"])
    entries = [("model", catalog.model_preset(n)) for n in catalog.models()]
    entries += [("hardware", catalog.hardware_preset(n)) for n in catalog.hardware()]
    for section, entry in entries:
        for key, value in entry.items():
            hi = CATALOG_UPPER.get(f"{section}.{key}")
            if hi is not None and hi != 1 and isinstance(value, (int, float)):
                assert value <= hi / 100, (section, key, value)


def test_a_moe_model_routes_each_token_to_at_least_one_of_its_experts():
    """dense-node's model is dense (0 experts, 0 active): made a MoE by its expert count alone, it was a traceback
    in the expert stage."""
    with pytest.raises(ScenarioError, match=r"model.active_experts: expected an integer in \[1, 8\] .* got 0$"):
        load_scenario(DENSE_NODE, overrides=["model.experts=8"])


def test_the_extremes_that_now_run_give_finite_figures(tmp_path):
    """Prices, PUE and a GPU's price at the top of their ranges, a DRAM tier of 10^8 GB, more closed-loop users
    than requests (past these, 1e300 was an infinite figure, a traceback or a failed allocation), and the other
    ranges' edges, in one run: every figure finite or NaN, the samples feasible."""
    import xarray as xr

    extremes = {"economics.price_output_usd_per_mtok": 1e6, "economics.price_input_cache_hit_usd_per_mtok": 1e6,
                "economics.price_input_cache_miss_usd_per_mtok": 1e6, "economics.pue": 100.0,
                "hardware.price_usd": 1e9, "cache.dram_gb_per_node": 1e8, "workload.burstiness": 100.0,
                "precision.kv_bytes": 0.125, "performance.closed_loop_users": 10**8}
    overrides = [arg for path, value in extremes.items() for arg in ("--set", f"{path}={value!r}")]
    result = invoke("run", DENSE_NODE, "--samples", "2", "--requests", "300", "--no-progress", *overrides, "-o",
                    tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(tmp_path / "x.nc") as ds:
        assert ds.feasible.values.all()
        assert (ds.revenue_usd_per_day.values > 1e6).all() and (ds.energy_j_per_token.values > 0).all()
        for name, var in ds.data_vars.items():
            if var.dtype.kind == "f":
                assert not np.isinf(var.values).any(), name


def test_a_value_past_the_edge_is_a_one_line_error_from_the_command_line(tmp_path):
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "100", "--set", "precision.weight_bytes=1e300",
                    "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "precision.weight_bytes: expected a number in [0.125, 8], got 1e+300" in result.output
    assert not (tmp_path / "x.nc").exists()


@pytest.mark.parametrize("path, value, words", [
    ("deployment.tpot_target_s", 50, "milliseconds? 50 ms is 0.05"),
    ("economics.lifetime_years", 48, "months?"),
    ("economics.electricity_usd_per_kwh", 8, "cents?"),
    ("deployment.tpot_target_s", '{dist="uniform", low=20, high=80}', "uniform distribution over [20, 80]"),
])
def test_a_unit_slip_runs_with_one_warning_line(tmp_path, path, value, words):
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "150", "--no-progress", "--set",
                    f"{path}={value}", "-o", tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1 and f"{path} = " in lines[0] and words in lines[0] and "implausible" in lines[0], lines


def test_plausible_values_say_nothing(tmp_path):
    import warnings

    from mcsim.scenario.plausible import ImplausibleValue
    from mcsim.scenario.loading import bundled

    with warnings.catch_warnings():
        warnings.simplefilter("error", ImplausibleValue)  # every bundled scenario is quiet
        for name in ("dense-node", "factory", "frontier-day", "deepseek-disaggregated", "dense-model", "conservative",
                     "sweep", "this-machine"):
            load_scenario(bundled(name))

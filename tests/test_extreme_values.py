"""Extreme values: every numeric key set to 1e300 (and 1e-300 where its range allows, 10^18 for an integer), one at a
time, on dense-node, either runs to finite figures (NaN only where a sample is infeasible or a variable's description
says) or is refused when the scenario loads, in one line naming the key and the range it accepts.

Where such a value made an output infinite, a traceback or a hang, and the key is not one commonly made uncertain with
an unbounded law (a range with an upper bound refuses those), its range got a physical bound
(:mod:`mcsim.scenario.bounds`); elsewhere the arithmetic was made to hold (prices, PUE, cache capacities, closed-loop
users)."""

import numpy as np
import pytest
from helpers import DENSE_NODE, invoke

from mcsim.scenario import ScenarioError, field_for, load_scenario
from mcsim.scenario.bounds import CATALOG_UPPER

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
    """Prices, PUE and a GPU's price at 1e300, a DRAM tier of 1e300 GB, more closed-loop users than requests (each
    was an infinite figure, a traceback or a failed allocation), and the new ranges' edges, in one run: every figure
    finite or NaN, the samples feasible."""
    import xarray as xr

    extremes = {"economics.price_output_usd_per_mtok": 1e300, "economics.price_input_cache_hit_usd_per_mtok": 1e300,
                "economics.price_input_cache_miss_usd_per_mtok": 1e300, "economics.pue": 1e300,
                "hardware.price_usd": 1e300, "cache.dram_gb_per_node": 1e300, "workload.burstiness": 100.0,
                "precision.kv_bytes": 0.125, "performance.closed_loop_users": 10**18}
    overrides = [arg for path, value in extremes.items() for arg in ("--set", f"{path}={value!r}")]
    result = invoke("run", DENSE_NODE, "--samples", "2", "--requests", "300", "--no-progress", *overrides, "-o",
                    tmp_path / "x.nc")
    assert result.exit_code == 0, result.output
    with xr.open_dataset(tmp_path / "x.nc") as ds:
        assert ds.feasible.values.all()
        assert (ds.revenue_usd_per_day.values > 1e300).all() and (ds.energy_j_per_token.values > 1e290).all()
        for name, var in ds.data_vars.items():
            if var.dtype.kind == "f":
                assert not np.isinf(var.values).any(), name


def test_a_value_past_the_edge_is_a_one_line_error_from_the_command_line(tmp_path):
    result = invoke("run", DENSE_NODE, "--samples", "1", "--requests", "100", "--set", "precision.weight_bytes=1e300",
                    "-o", tmp_path / "x.nc")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "precision.weight_bytes: expected a number in [0.125, 8], got 1e+300" in result.output
    assert not (tmp_path / "x.nc").exists()

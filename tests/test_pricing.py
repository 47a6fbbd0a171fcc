"""Prices per hardware: a hardware sweep charges each GPU its own catalog price, one price for all only when pinned,
an explicit ``hardware.*`` value or distribution holds at every grid point, payback is NaN under rental.

The references are the catalog data file read here with ``tomllib`` (not through mcsim's pricing code) and the
closed forms of the economics stage: rental cost = GPUs x 24 h x price per GPU-hour; purchase cost = GPUs x
(price / (lifetime x 8760 h) x 24 h + power x PUE / 1000 x 24 h x USD/kWh), power = idle + (TDP - idle) x busy.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import mcsim
from mcsim.cli import main
from mcsim.results.report import write_report
from mcsim.results.summary import format_table
from mcsim.scenario import ScenarioError, load_scenario
from mcsim.scenario.grid import Axis, validate_axes
from mcsim.stages import economics

ROOT = Path(__file__).resolve().parents[1]
DENSE_MODEL = ROOT / "scenarios" / "dense-model.toml"
CONSERVATIVE = ROOT / "scenarios" / "conservative.toml"
CATALOG = tomllib.loads((ROOT / "mcsim" / "data" / "hardware.toml").read_text())
GPUS = ("h100", "h200", "mi300x")
SMALL = dict(samples=3, requests=600, workers=1)


def _at(ds, path: str, value):
    """The result at one grid value (the grid dim is named by its dotted path, or carries it as ``path``)."""
    dim = next(d for d in ds.dims if d == path or ds[d].attrs.get("path") == path)
    return ds.sel({dim: value})


def _input(ds, path: str) -> np.ndarray:
    """The stored draws of an uncertain input (stored under its path without dots, the path in its attrs)."""
    name = path.replace(".", "_")
    assert ds[name].attrs["path"] == path
    return ds[name].values


@pytest.fixture(scope="module")
def own_prices():
    return mcsim.sweep(DENSE_MODEL, [f"hardware.preset={','.join(GPUS)}"], **SMALL)


def test_a_hardware_sweep_charges_each_gpu_its_own_catalog_rental_price(own_prices):
    ds = own_prices
    factor = _input(ds, "economics.gpu_price_factor")  # dense-model's spread around each GPU's own price
    assert np.all((factor >= 0.8) & (factor <= 1.4))
    for gpu in GPUS:
        point = _at(ds, "hardware.preset", gpu)
        assert np.all(point.feasible.values == 1)
        expected = point.gpus.values * 24 * CATALOG[gpu]["rental_usd_per_hour"] * factor
        np.testing.assert_allclose(point.cost_usd_per_day.values, expected, rtol=1e-12)
        # rental: nothing was bought, so there is nothing to pay back
        assert np.all(np.isnan(point.payback_months.values))
    assert "pricing_note" not in ds.attrs
    assert "pricing:" not in format_table(ds)


def test_each_gpus_own_price_at_factor_one_is_the_catalog_price():
    ds = mcsim.sweep(DENSE_MODEL, ["hardware.preset=h100,h200"], overrides=["economics.gpu_price_factor=1"],
                     samples=2, requests=400, workers=1)
    for gpu in ("h100", "h200"):
        point = _at(ds, "hardware.preset", gpu)
        np.testing.assert_allclose(point.cost_usd_per_day.values,
                                   point.gpus.values * 24 * CATALOG[gpu]["rental_usd_per_hour"], rtol=1e-12)


def test_a_purchase_sweep_charges_each_gpu_its_own_purchase_price_and_has_a_payback():
    ds = mcsim.sweep(DENSE_MODEL, ["hardware.preset=h100,mi300x"], overrides=['economics.pricing="purchase"'],
                     samples=2, requests=400, workers=1)
    factor = _input(ds, "economics.gpu_price_factor")
    lifetime, pue, usd_per_kwh = 4.0, 1.3, 0.08  # the schema defaults dense-model keeps
    for gpu in ("h100", "mi300x"):
        point, hw = _at(ds, "hardware.preset", gpu), CATALOG[gpu]
        busy = np.clip(point.busy_fraction.values, 0, 1)
        watts = (hw["idle_w"] + (hw["tdp_w"] - hw["idle_w"]) * busy) * pue
        electricity = watts / 1000 * 24 * usd_per_kwh
        price = hw["price_usd"] * factor
        per_gpu_day = price / (lifetime * 8760) * 24 + electricity
        np.testing.assert_allclose(point.cost_usd_per_day.values, point.gpus.values * per_gpu_day, rtol=1e-12)
        monthly_net = (point.revenue_usd_per_day.values / point.gpus.values - electricity) * 365.25 / 12
        np.testing.assert_allclose(point.payback_months.values, price / monthly_net, rtol=1e-12)


def test_one_price_for_all_gpus_must_be_pinned_explicitly():
    with pytest.raises(ScenarioError, match=r"economics\.rental_usd_per_gpu_hour: .*every GPU of the "
                                            r"hardware\.preset sweep \(h100, h200, mi300x\).*economics\.pin_price"):
        mcsim.sweep(DENSE_MODEL, [f"hardware.preset={','.join(GPUS)}"],
                    overrides=["economics.rental_usd_per_gpu_hour=3.0"], **SMALL)
    # the command line says so in one line and exits 2
    result = CliRunner().invoke(main, ["sweep", str(DENSE_MODEL), "--grid", "hardware.preset=h100,h200", "--set",
                                       "economics.rental_usd_per_gpu_hour=3.0", "--samples", "1", "--no-progress"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "economics.rental_usd_per_gpu_hour" in result.stderr and "economics.pin_price" in result.stderr


def test_a_pinned_price_is_charged_to_every_gpu_and_the_result_says_so(tmp_path):
    ds = mcsim.sweep(DENSE_MODEL, [f"hardware.preset={','.join(GPUS)}"],
                     overrides=["economics.rental_usd_per_gpu_hour=3.0", "economics.pin_price=true"], **SMALL)
    for gpu in GPUS:
        point = _at(ds, "hardware.preset", gpu)
        # charged as written: the price factor scales each GPU's own price, not a pinned one
        np.testing.assert_allclose(point.cost_usd_per_day.values, point.gpus.values * 24 * 3.0, rtol=1e-12)
    note = ds.attrs["pricing_note"]
    assert "h100, h200, mi300x" in note and "economics.rental_usd_per_gpu_hour = 3 USD/GPU-hour" in note
    assert f"pricing: {note}." in " ".join(format_table(ds).split())  # footnotes wrap to the terminal
    summary = write_report(ds, tmp_path / "report", metrics=["cost_usd_per_mtok"]).read_text()
    assert "| pricing | one price pinned for every GPU of the hardware.preset sweep" in summary.replace("\\", "")


def test_a_hardware_distribution_applies_at_every_grid_point():
    # An explicit hardware.* value holds on whatever preset a grid point swaps in: the rental price (a price for
    # all, so pinned) and the TDP (not a price: each point keeps its own preset's idle power).
    ds = mcsim.sweep(DENSE_MODEL, ["hardware.preset=h100,mi300x"], overrides=[
        'hardware.rental_usd_per_hour={dist="uniform",low=1,high=5}', 'hardware.tdp_w={dist="uniform",low=500,high=900}',
        "economics.pin_price=true"], samples=3, requests=600, workers=1)
    rental, tdp = _input(ds, "hardware.rental_usd_per_hour"), _input(ds, "hardware.tdp_w")
    factor = _input(ds, "economics.gpu_price_factor")
    assert np.all((rental >= 1) & (rental <= 5)) and np.all((tdp >= 500) & (tdp <= 900))
    assert len(set(np.round(rental, 9))) == 3  # one draw per sample
    for gpu in ("h100", "mi300x"):
        point = _at(ds, "hardware.preset", gpu)
        np.testing.assert_allclose(point.cost_usd_per_day.values, point.gpus.values * 24 * rental * factor,
                                   rtol=1e-12)
        # energy per output token = GPUs x power x PUE x 86400 s / output tokens per day, with the drawn TDP
        output_per_day = point.cost_usd_per_day.values / point.cost_usd_per_mtok.values * 1e6
        idle = CATALOG[gpu]["idle_w"]
        watts = (idle + (tdp - idle) * np.clip(point.busy_fraction.values, 0, 1)) * 1.3
        np.testing.assert_allclose(point.energy_j_per_token.values,
                                   point.gpus.values * watts * 86400 / output_per_day, rtol=1e-9)
    assert "hardware.rental_usd_per_hour = uniform(low=1, high=5) USD/GPU-hour x economics.gpu_price_factor" in \
        ds.attrs["pricing_note"]


def test_a_preset_swap_keeps_the_scenarios_own_catalog_values():
    scn = load_scenario(DENSE_MODEL, overrides=['hardware.tdp_w={dist="uniform",low=500,high=900}',
                                                "model.max_context=8192"])
    point = scn.with_values({"hardware.preset": "h200", "model.preset": "llama-3.1-8b"}, origin="--grid")
    assert point["hardware.tdp_w"] == scn["hardware.tdp_w"]  # the same distribution, drawn per sample
    assert point["hardware.hbm_gb"] == CATALOG["h200"]["hbm_gb"]  # every other field is the new preset's
    assert point["model.max_context"] == 8192
    assert list(point.uncertain()) == list(scn.uncertain())


def test_a_files_own_hardware_price_is_a_pin_too():
    scn = load_scenario(CONSERVATIVE)  # hardware.price_usd = triangular(25k, 30k, 40k) under purchase pricing
    with pytest.raises(ScenarioError, match=r"hardware\.price_usd: .*one purchase price.*\(h800, h200\)"):
        validate_axes(scn, [Axis("hardware.preset", ("h800", "h200"))])
    pinned = load_scenario(CONSERVATIVE, overrides=["economics.pin_price=true"])
    validate_axes(pinned, [Axis("hardware.preset", ("h800", "h200"))])
    # a price that is itself a grid axis is shown by its coordinate, and the other pricing mode's keys are unused
    rental = load_scenario(CONSERVATIVE, overrides=['economics.pricing="rental"'])
    validate_axes(rental, [Axis("hardware.preset", ("h800", "h200"))])
    validate_axes(load_scenario(DENSE_MODEL), [Axis("hardware.preset", ("h100", "h200")),
                                               Axis("economics.rental_usd_per_gpu_hour", (2.0, 3.0))])


def test_payback_is_nan_under_rental_and_finite_under_purchase():
    common = dict(hit_tokens_per_day=0, miss_tokens_per_day=0, output_tokens_per_day=1e9, prices=(0, 0, 1.0),
                  price_usd=30_000, tdp_w=700, idle_w=100)
    rental = economics.daily(1.0, 0.5, pricing="rental", rental_usd_per_gpu_hour=2.0, **common)
    assert math.isnan(rental.payback_months)
    assert rental.cost_usd_per_day == pytest.approx(48.0)
    purchase = economics.daily(1.0, 0.5, pricing="purchase", **common)
    assert purchase.payback_months == pytest.approx(30_000 / (1000.0 * 365.25 / 12))

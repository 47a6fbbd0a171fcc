"""Economics against DeepSeek's published day and hand-computed closed forms."""

import math

import numpy as np

import pytest

from mcsim.stages import economics

R1_PRICES = (0.14, 0.55, 2.19)  # USD per million cache-hit input, cache-miss input, output tokens


def test_deepseek_published_day():
    # DeepSeek Open Infra Index, day 6 (2025-03-01): 226.75 H800 nodes on average over 24 h at $2/GPU-hour cost
    # $87,072/day; 608 B input tokens with 342 B (56.3 %) cache hits and 168 B output tokens at R1 prices would
    # bring $562,027/day; cost-profit margin 545 %.
    gpus = 226.75 * 8
    e = economics.daily(gpus, 1.0, hit_tokens_per_day=342e9, miss_tokens_per_day=608e9 - 342e9,
                        output_tokens_per_day=168e9, prices=R1_PRICES, pricing="rental", rental_usd_per_gpu_hour=2.0,
                        price_usd=27_500)
    assert e.cost_usd_per_day == pytest.approx(87_072, rel=1e-9)
    # The published revenue comes from rounded token counts; agree to 0.1 %.
    assert e.revenue_usd_per_day == pytest.approx(562_027, rel=1e-3)
    assert e.cost_profit_margin == pytest.approx(5.45, abs=0.01)
    assert e.gross_margin == pytest.approx(1 - 87_072 / 562_027, abs=1e-3)
    assert e.cost_usd_per_mtok == pytest.approx(87_072 / 168e3, rel=1e-9)


def test_purchase_cost_is_depreciation_plus_electricity():
    # One GPU, $30,000 over 4 years, 700 W TDP, 100 W idle, busy half the time, PUE 1.25, $0.10/kWh.
    e = economics.daily(1.0, 0.5, hit_tokens_per_day=0, miss_tokens_per_day=0, output_tokens_per_day=1e9,
                        prices=(0, 0, 1.0), pricing="purchase", price_usd=30_000, lifetime_years=4, tdp_w=700,
                        idle_w=100, pue=1.25, electricity_usd_per_kwh=0.10)
    watts = (100 + 600 * 0.5) * 1.25
    depreciation = 30_000 / (4 * 8760) * 24
    electricity = watts / 1000 * 24 * 0.10
    assert e.cost_usd_per_day == pytest.approx(depreciation + electricity)
    assert e.energy_j_per_token == pytest.approx(watts * 86400 / 1e9)
    revenue = 1e9 / 1e6 * 1.0
    assert e.revenue_usd_per_day == pytest.approx(revenue)
    assert e.payback_months == pytest.approx(30_000 / ((revenue - electricity) * 365.25 / 12))


def test_unprofitable_gpu_never_pays_back():
    e = economics.daily(10.0, 1.0, hit_tokens_per_day=0, miss_tokens_per_day=0, output_tokens_per_day=1.0,
                        prices=(0, 0, 0), price_usd=1000, tdp_w=100, idle_w=10, electricity_usd_per_kwh=1.0)
    # no revenue: a margin over zero and a payback that never comes are NaN, never +-inf
    assert math.isnan(e.payback_months) and math.isnan(e.gross_margin)
    assert e.cost_profit_margin == pytest.approx(-1.0)
    free = economics.daily(10.0, 1.0, hit_tokens_per_day=0, miss_tokens_per_day=0, output_tokens_per_day=0.0,
                           prices=(1, 1, 1), pricing="rental", rental_usd_per_gpu_hour=0.0, tdp_w=0, idle_w=0,
                           electricity_usd_per_kwh=0.0)
    assert math.isnan(free.cost_profit_margin) and math.isnan(free.cost_usd_per_mtok)
    assert math.isnan(free.energy_j_per_token)


def test_delivered_tokens_per_gpu_are_what_the_cost_per_token_is_charged_against():
    """cost_usd_per_mtok = cost per day / (delivered tokens per GPU-second x GPUs x 86,400) x 10^6, sample by
    sample; and a colocated fleet delivers less per GPU than a decode GPU does in its decode steps."""
    import mcsim
    from helpers import DENSE_NODE

    ds = mcsim.run(DENSE_NODE, samples=3, requests=2000, workers=1)
    delivered = ds.delivered_output_tok_s_per_gpu.values.ravel()
    per_day = delivered * ds.gpus.values.ravel() * 86400.0
    np.testing.assert_allclose(ds.cost_usd_per_day.values.ravel() / per_day * 1e6,
                               ds.cost_usd_per_mtok.values.ravel(), rtol=1e-9)
    assert (delivered < ds.decode_tok_s_per_gpu.values.ravel()).all()

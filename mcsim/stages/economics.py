"""Stage 6: fleet, energy and money.

Everything here is closed-form arithmetic over a few totals, so it is easy to check by hand — for example against
DeepSeek's published day (2025-02-28): 226.75 H800 nodes on average at $2/GPU-hour cost $87,072; 608 B input
tokens (56.3 % cache hits) and 168 B output tokens at $0.14 / $0.55 / $2.19 per million would bring $562,027, a
cost-profit margin of 545 %.

Boundaries: cost counts accelerator depreciation and electricity (or a rental price) only — not networking,
storage, CPUs, staff, tax, R&D or financing. Payback is an inference-unit indicator, not an accounting forecast,
and exists under purchase pricing only (NaN under rental: nothing was bought).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

HOURS_PER_YEAR = 8760.0
DAYS_PER_MONTH = 365.25 / 12


@dataclass(frozen=True)
class Economics:
    """Daily money and energy of a fleet."""

    cost_usd_per_day: float
    revenue_usd_per_day: float
    gross_margin: float
    cost_profit_margin: float
    cost_usd_per_mtok: float
    energy_j_per_token: float
    payback_months: float


def gpu_power_w(tdp_w: float, idle_w: float, busy_fraction: float) -> float:
    """Mean electrical power of a GPU that is busy ``busy_fraction`` of the time (linear idle -> TDP)."""
    return idle_w + (tdp_w - idle_w) * min(max(busy_fraction, 0.0), 1.0)


def revenue_usd(hit_tokens: float, miss_tokens: float, output_tokens: float, price_hit: float, price_miss: float,
                price_output: float, billed_fraction: float = 1.0) -> float:
    """Revenue of token counts at prices in USD per million tokens (each price taken per token first, so that a
    price near the largest float does not overflow with the count)."""
    return billed_fraction * (hit_tokens * (price_hit / 1e6) + miss_tokens * (price_miss / 1e6)
                              + output_tokens * (price_output / 1e6))


def daily(gpus: float, busy_fraction: float, *, hit_tokens_per_day: float, miss_tokens_per_day: float,
          output_tokens_per_day: float, prices: tuple[float, float, float], billed_fraction: float = 1.0,
          pricing: str = "purchase", price_usd: float = 0.0, lifetime_years: float = 4.0,
          rental_usd_per_gpu_hour: float = 0.0, tdp_w: float = 0.0, idle_w: float = 0.0, pue: float = 1.0,
          electricity_usd_per_kwh: float = 0.0) -> Economics:
    """Daily economics of ``gpus`` accelerators serving the given daily token volumes.

    Parameters
    ----------
    gpus : float
        GPUs deployed (may be fractional: a share of a larger fleet).
    busy_fraction : float
        Mean fraction of time the GPUs compute (sets power between idle and TDP).
    prices : (hit, miss, output)
        USD per million cache-hit input, cache-miss input and output tokens.
    pricing : {'purchase', 'rental'}
        Purchase: depreciation ``price_usd / lifetime_years`` plus electricity (power x PUE). Rental: the hourly
        price, which includes power.

    Returns
    -------
    Economics
        ``payback_months`` is the GPU's purchase price over its monthly net revenue (revenue less electricity);
        under rental pricing there is no purchase to pay back and it is NaN.
    """
    watts = gpu_power_w(tdp_w, idle_w, busy_fraction) * pue
    electricity_per_gpu_day = watts / 1000.0 * 24.0 * electricity_usd_per_kwh
    if pricing == "rental":
        cost_per_gpu_day = rental_usd_per_gpu_hour * 24.0
        electricity_per_gpu_day_paid = 0.0
    else:
        cost_per_gpu_day = price_usd / (lifetime_years * HOURS_PER_YEAR) * 24.0 + electricity_per_gpu_day
        electricity_per_gpu_day_paid = electricity_per_gpu_day
    cost = gpus * cost_per_gpu_day
    revenue = revenue_usd(hit_tokens_per_day, miss_tokens_per_day, output_tokens_per_day, *prices,
                          billed_fraction=billed_fraction)
    # A ratio over a zero is not a figure: NaN, never +-inf (no revenue to take a margin of, no cost to profit on,
    # no output tokens to spread the cost over; each variable's description says so).
    margin = 1.0 - cost / revenue if revenue > 0 else math.nan
    cost_profit = (revenue - cost) / cost if cost > 0 else math.nan
    per_mtok = cost / output_tokens_per_day * 1e6 if output_tokens_per_day > 0 else math.nan
    # the fleet's joules per day over the tokens, the small factor first (a day's joules may exceed the float range)
    energy_per_token = watts * (gpus * 86400.0 / output_tokens_per_day) if output_tokens_per_day > 0 else math.nan
    monthly_net_per_gpu = (revenue / gpus - electricity_per_gpu_day_paid) * DAYS_PER_MONTH if gpus > 0 else 0.0
    if pricing == "rental":
        payback = math.nan  # nothing was bought; a rental's "payback" would mix two cost bases
    else:
        payback = price_usd / monthly_net_per_gpu if monthly_net_per_gpu > 0 else math.nan  # never pays back
    return Economics(cost, revenue, margin, cost_profit, per_mtok, energy_per_token, payback)


def kv_tier_money(gb, usd_per_gb_month, hit_tokens_per_day, prefill_tok_s_per_gpu: float, cost_usd_per_day: float,
                  gpus: float) -> tuple[np.ndarray, np.ndarray]:
    """Per KV tier: what its capacity costs a day, and what the prefill its hits spared is worth a day.

    ``cost = gb x usd_per_gb_month / DAYS_PER_MONTH``; ``saved = hit_tokens_per_day / prefill_tok_s_per_gpu x
    cost_usd_per_day / (gpus x 86,400)``: the GPU-seconds the restored tokens would have taken to compute, at the
    fleet's cost per GPU-second. Neither is part of ``cost_usd_per_day`` (accelerators and electricity).
    """
    cost = np.asarray(gb, dtype=float) * np.asarray(usd_per_gb_month, dtype=float) / DAYS_PER_MONTH
    gpu_s_per_token = 1.0 / prefill_tok_s_per_gpu if prefill_tok_s_per_gpu > 0 else math.nan
    usd_per_gpu_s = cost_usd_per_day / (gpus * 86400.0) if gpus > 0 else math.nan
    return cost, np.asarray(hit_tokens_per_day, dtype=float) * gpu_s_per_token * usd_per_gpu_s

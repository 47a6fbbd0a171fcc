"""Which lever brings how much: one-at-a-time ablations and Shapley shares of the factory/baseline gain.

The levers are the switches of :data:`mcsim.scenario.schema.LEVERS` whose factory value differs from the baseline's
(plus, if the scenario's ``[baseline]`` changes anything else, one more lever ``other_baseline_settings``). For
every subset S of levers the scenario is run with the levers in S as the factory has them and the others as the
baseline has them, on the same requests and draws, so v(empty) is the baseline and v(all) the factory.

A lever's Shapley value is its average marginal contribution over all orders in which the levers could be
switched on:

    phi_i = sum over S not containing i of |S|! (L - |S| - 1)! / L! * (v(S + i) - v(S))

The values add up exactly to v(all) - v(empty), however strongly the levers interact. Throughput and cost per
token are attributed on a log scale (the levers multiply), margins on a linear scale. With L levers that is
2^L variants per sample; the kernels' work is shared between them (:func:`mcsim.execution.sample.run_sample`).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from mcsim.scenario.schema import LEVERS

#: metric -> scale of its attribution
ATTRIBUTED = {
    "decode_tok_s_per_gpu": "log",
    "prefill_tok_s_per_gpu": "log",
    "cost_usd_per_mtok": "log",
    "gross_margin": "linear",
}
OTHER = "other_baseline_settings"


def levers_of(scn) -> dict[str, dict]:
    """Levers of this scenario: name -> the baseline's overrides that switch it off."""
    out = {}
    baseline = dict(scn.baseline)
    for name, paths in LEVERS.items():
        off = {p: baseline.pop(p) for p in paths if p in baseline}
        if any(scn.values.get(p) != v for p, v in off.items()):
            out[name] = off
    rest = {p: v for p, v in baseline.items() if scn.values.get(p) != v}
    if rest:
        out[OTHER] = rest
    return out


def _subset_name(on: tuple) -> str:
    return "levers:" + "+".join(on)


def ablation_variants(scn) -> dict[str, dict]:
    """Every subset of levers as a variant: name -> overrides."""
    levers = levers_of(scn)
    names = list(levers)
    specs = {}
    for r in range(len(names) + 1):
        for on in itertools.combinations(names, r):
            overrides = {}
            for lever in names:
                if lever not in on:
                    overrides.update(levers[lever])
            specs[_subset_name(on)] = overrides
    return specs


def _lever_names(plan) -> list[str]:
    full = max(plan.variants, key=lambda k: len(k))
    return [n for n in full.removeprefix("levers:").split("+") if n]


def saved_variants(plan) -> tuple:
    names = _lever_names(plan)
    return ("baseline", "factory", *(f"without:{n}" for n in names), *(f"only:{n}" for n in names))


def shapley(values: dict[frozenset, float], levers: list[str]) -> np.ndarray:
    """Exact Shapley values from v(S) for every subset S of ``levers``."""
    n = len(levers)
    phi = np.zeros(n)
    for i, lever in enumerate(levers):
        others = [x for x in levers if x != lever]
        for r in range(n):
            weight = math.factorial(r) * math.factorial(n - r - 1) / math.factorial(n)
            for subset in itertools.combinations(others, r):
                s = frozenset(subset)
                phi[i] += weight * (values[s | {lever}] - values[s])
    return phi


def reduce_row(plan, row: dict) -> dict:
    """From one sample's results for every subset to the saved variants plus Shapley values."""
    names = _lever_names(plan)
    by_subset = {}
    for key, metrics in row.items():
        if key.startswith("__"):  # the sample's coords, not a variant
            continue
        on = key.removeprefix("levers:")
        by_subset[frozenset(x for x in on.split("+") if x)] = metrics
    everything = frozenset(names)
    out = {"baseline": by_subset[frozenset()], "factory": by_subset[everything]}
    for n in names:
        out[f"without:{n}"] = by_subset[everything - {n}]
        out[f"only:{n}"] = by_subset[frozenset({n})]
    extra = {}
    for metric, scale in ATTRIBUTED.items():
        with np.errstate(divide="ignore", invalid="ignore"):
            values = {s: (math.log(m[metric]) if scale == "log" and m[metric] > 0 and math.isfinite(m[metric])
                          else (m[metric] if scale == "linear" and math.isfinite(m[metric]) else math.nan))
                      for s, m in by_subset.items()}
        phi = shapley(values, names)
        total = values[everything] - values[frozenset()]
        share = phi / total if abs(total) > 1e-12 else np.full(len(names), math.nan)
        # a log-scale contribution is a natural log of a ratio: dimensionless, shown as such
        unit = {"units": "1", "display_units": "ln(factory/baseline)" if scale == "log" else "1",
                "scale": scale, "cell_methods": "sample: point"}
        extra[f"shapley_{metric}"] = (("lever",), phi, {
            **unit, "long_name": f"Shapley contribution to {metric}",
            "description": f"Average marginal contribution of each lever to {'log ' if scale == 'log' else ''}"
                           f"{metric} over all orders of switching levers on; sums to factory - baseline.",
            "scale": scale, "source": "modelled"})
        extra[f"shapley_share_{metric}"] = (("lever",), share, {
            "units": "1", "display_units": "1", "cell_methods": "sample: point", "long_name": f"Shapley share of the {metric} gain",
            "description": "Each lever's Shapley contribution / the total factory - baseline change; sums to 1.",
            "source": "modelled"})
    out["__extra__"] = extra
    out["__coords__"] = {**row.get("__coords__", {}), "lever": names}
    return out

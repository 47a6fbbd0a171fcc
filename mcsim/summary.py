"""Text and JSON summaries of a result Dataset: median and 5-95 % band of each headline metric."""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from mcsim.variables import HEADLINE, REGISTRY

#: Metrics compared as factory - baseline (a ratio of margins or of a rate that may be 0 says nothing).
DIFFERENCE = {"gross_margin", "cost_profit_margin", "cache_hit_rate"}

#: Rows of the summary: (label, variable, quantile index or None).
ROWS = [(name, name, None) for name in HEADLINE if name not in ("feasible",)]
ROWS[5:5] = [("ttft_s p50", "ttft_s", 0.5), ("ttft_s p99", "ttft_s", 0.99), ("tpot_s p50", "tpot_s", 0.5)]


def _values(ds: xr.Dataset, name: str, q) -> xr.DataArray:
    da = ds[name]
    if q is not None:
        da = da.sel(quantile=q)
    return da.astype(float)


def band(values: np.ndarray) -> dict:
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"median": math.nan, "p5": math.nan, "p95": math.nan}
    p5, med, p95 = np.quantile(v, [0.05, 0.5, 0.95])
    return {"median": float(med), "p5": float(p5), "p95": float(p95)}


def summarize(ds: xr.Dataset) -> dict:
    """``{variant: {label: {median, p5, p95, units}}}`` plus ``ratio``: factory/baseline per sample (paired, on
    the same draws), or factory - baseline for the metrics in :data:`DIFFERENCE` (marked ``"difference": true``)."""
    variants = list(ds["variant"].values) if "variant" in ds.dims else ["factory"]
    out = {"variants": {}, "feasible_fraction": {}}
    for v in variants:
        sub = ds.sel(variant=v) if "variant" in ds.dims else ds
        out["variants"][str(v)] = {
            label: {**band(_values(sub, name, q).values), "units": REGISTRY[name].units} for label, name, q in ROWS
        }
        out["feasible_fraction"][str(v)] = float(sub["feasible"].mean())
    if len(variants) == 2:
        base, fact = (ds.sel(variant=v) for v in variants)
        out["ratio"] = {}
        for label, name, q in ROWS:
            f, b = _values(fact, name, q).values, _values(base, name, q).values
            if name in DIFFERENCE:
                out["ratio"][label] = {**band(f - b), "difference": True}
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                r = f / b
            out["ratio"][label] = {**band(np.where(np.isfinite(r), r, np.nan)), "difference": False}
    return out


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    a = abs(x)
    if a != 0 and (a >= 1e6 or a < 1e-3):
        return f"{x:.3g}"
    if a >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _cell(b: dict) -> str:
    return f"{_fmt(b['median'])} [{_fmt(b['p5'])}, {_fmt(b['p95'])}]"


def format_table(ds: xr.Dataset) -> str:
    """A plain-text table; every cell is 'median [5 %, 95 %]' over Monte Carlo samples."""
    s = summarize(ds)
    variants = list(s["variants"])
    header = ["metric (modelled)", "units"] + variants + (["factory vs baseline"] if "ratio" in s else [])
    lines = []
    for label, name, _ in ROWS:
        row = [label, REGISTRY[name].units] + [_cell(s["variants"][v][label]) for v in variants]
        if "ratio" in s:
            r = s["ratio"][label]
            row.append(("+ " if r["difference"] else "x ") + _cell(r))
        lines.append(row)
    widths = [max(len(str(r[i])) for r in [header] + lines) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    text = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    text += [fmt.format(*r) for r in lines]
    feas = ", ".join(f"{v}: {100 * f:.0f} %" for v, f in s["feasible_fraction"].items())
    n = ds.sizes["sample"]
    text.append("")
    text.append(f"{n} samples x {ds.attrs.get('requests_per_sample', '?')} requests; cells are median [5 %, 95 %] "
                f"over samples; feasible recipes: {feas}.")
    if "ratio" in s:
        text.append("factory vs baseline: 'x' is the per-sample ratio factory/baseline, '+' the difference "
                    "factory - baseline, both on identical requests and draws.")
    return "\n".join(text)

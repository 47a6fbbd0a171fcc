"""How the report reads a result Dataset: grid axes and variants, reported series, arrays, quantiles, waterfalls.

Shared by :mod:`mcsim.results.report` (tables and the Markdown summary) and :mod:`mcsim.results.figures`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import xarray as xr

from mcsim.results.names import path_of
from mcsim.results.variables import HEADLINE, REGISTRY, REQUEST_QUANTILE, WORKLOAD_CLASS

#: Quantiles over Monte Carlo samples written to quantiles.csv.
LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Dims that are never grid axes.
FIXED_DIMS = ("variant", "sample", "tier", REQUEST_QUANTILE, WORKLOAD_CLASS, "lever")


@dataclass(frozen=True)
class Series:
    """One reported quantity: a variable, possibly at one coordinate of its own extra dims."""

    label: str
    name: str
    select: tuple = ()  # ((dim, value), ...)


class _Layout:
    """Grid axes, variants, the points (grid x variant) and the point the figures show."""

    def __init__(self, ds: xr.Dataset):
        reference = next((ds[n] for n in HEADLINE if n in ds),
                         next(v for v in ds.data_vars.values() if "sample" in v.dims))
        self.axes = [str(d) for d in reference.dims if d not in FIXED_DIMS]
        #: dim -> the dotted scenario path it stands for (how the user names it)
        self.paths = {d: path_of(ds, d) for d in self.axes}
        self.variants = [str(v) for v in ds["variant"].values] if "variant" in ds.dims else []
        self.dims = self.axes + (["variant"] if self.variants else [])
        self.coords = {d: [_plain(v) for v in ds[d].values] for d in self.dims}
        self.shape = tuple(len(self.coords[d]) for d in self.dims)
        self.points = list(np.ndindex(*self.shape))
        focus_variant = ("factory" if "factory" in self.variants else self.variants[0]) if self.variants else None
        self.focus = tuple([0] * len(self.axes) + ([self.variants.index(focus_variant)] if self.variants else []))
        self.samples = ds.sizes["sample"]

    def values(self, index) -> dict:
        return {d: self.coords[d][i] for d, i in zip(self.dims, index)}

    def name(self, index) -> str:
        parts = [f"{self.paths[d]}={_text(v)}" for d, v in self.values(index).items() if d != "variant"]
        if self.variants:
            parts.append(self.coords["variant"][index[-1]])
        return ", ".join(parts) or "all samples"

    def focus_note(self) -> str:
        if len(self.points) == 1:
            return ""
        return f"shown at {self.name(self.focus)}"


def _array(ds: xr.Dataset, layout: _Layout, dims: list, name: str, select=()) -> np.ndarray:
    """``ds[name]`` as floats with dims (*dims, sample), broadcast over the dims it lacks."""
    da = ds[name]
    if select:
        da = da.sel(dict(select))
    missing = {d: ds[d].values for d in dims if d not in da.dims}
    if missing:
        da = da.expand_dims(missing)
    return np.asarray(da.transpose(*dims, "sample").values, dtype=float)


def _meta(ds: xr.Dataset, name: str) -> tuple[str, str]:
    attrs = ds[name].attrs if name in ds else {}
    registered = REGISTRY.get(name)
    long_name = attrs.get("long_name") or (registered.long_name if registered else name)
    units = attrs.get("units") or (registered.units if registered else "")
    return str(long_name), str(units)


def _axis_label(ds: xr.Dataset, series: Series) -> str:
    long_name, units = _meta(ds, series.name)
    units = "dimensionless" if units in ("1", "") else units
    return f"{long_name} ({units})"


def quantiles(values: np.ndarray, levels=LEVELS) -> np.ndarray:
    """Linear-interpolation quantiles (as ``numpy.quantile``) of the non-NaN values; +-inf are kept as values.

    ``numpy.quantile`` gives NaN when it interpolates next to an infinity (inf - inf); here a quantile that falls
    on or next to an infinite value is that infinity (an infinite payback is the worst value, not a missing one).
    """
    v = np.sort(np.asarray(values, dtype=float).ravel())
    v = v[~np.isnan(v)]
    if v.size == 0:
        return np.full(len(levels), np.nan)
    if np.all(np.isfinite(v)):
        return np.quantile(v, levels)
    out = []
    for q in levels:
        h = (v.size - 1) * q
        lo = math.floor(h)
        hi = min(lo + 1, v.size - 1)
        frac = h - lo
        if frac == 0 or v[lo] == v[hi] or np.isinf(v[lo]):
            out.append(v[lo])
        elif np.isinf(v[hi]):
            out.append(v[hi])
        else:
            out.append(v[lo] + frac * (v[hi] - v[lo]))
    return np.array(out)


def _plain(v):
    """A coordinate value as a plain Python scalar (str, int or float)."""
    v = v.item() if hasattr(v, "item") else v
    return v.decode() if isinstance(v, bytes) else v


def _text(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _fmt(x) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x != 0 and (abs(x) >= 1e6 or abs(x) < 1e-3):
        return f"{x:.3g}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def _slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", label).strip("_")


def waterfall_steps(ds: xr.Dataset, metric: str) -> tuple[float, list, float, str]:
    """Baseline -> factory steps of ``metric`` at the first grid point.

    Uses, in this order, the ``shapley_<metric>`` variable (median Shapley contribution of each lever), the
    ``without:<lever>`` variants (median over samples of factory - without:lever), the ``only:<lever>`` variants
    (median of only:lever - baseline), or nothing (no steps).

    Returns
    -------
    start : float
        Median of the baseline.
    steps : list of (lever, float)
        Contribution of each lever.
    end : float
        Median of the factory.
    how : str
        How the steps were obtained, for the figure.
    """
    layout = _Layout(ds)
    variants = layout.variants
    grid0 = tuple([0] * len(layout.axes))
    data = _array(ds, layout, layout.dims, metric)
    base, fact = (data[grid0 + (variants.index(v),)] for v in ("baseline", "factory"))
    steps, how = [], "no lever breakdown in this run"
    name = f"shapley_{metric}"
    if name in ds and "lever" in ds[name].dims:
        phi = ds[name].isel({d: 0 for d in layout.axes if d in ds[name].dims})
        if "variant" in phi.dims:
            phi = phi.sel(variant="factory")
        for lever in phi["lever"].values:
            steps.append((str(_plain(lever)), _median(phi.sel(lever=lever).values)))
        how = "median Shapley contribution of each lever"
    else:
        without = [v for v in variants if v.startswith("without:")]
        only = [v for v in variants if v.startswith("only:")]
        if without:
            steps = [(v.split(":", 1)[1], _median(fact - data[grid0 + (variants.index(v),)])) for v in without]
            how = "median of factory - without:<lever> per sample (one lever removed at a time)"
        elif only:
            steps = [(v.split(":", 1)[1], _median(data[grid0 + (variants.index(v),)] - base)) for v in only]
            how = "median of only:<lever> - baseline per sample (one lever added at a time)"
    return _median(base), steps, _median(fact), how


def _median(values) -> float:
    return float(quantiles(values, [0.5])[0])

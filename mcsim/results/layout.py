"""How the report reads a result Dataset: grid axes and variants, the focus point, reported series, arrays, quantiles.

Shared by :mod:`mcsim.results.report` (tables and the Markdown summary), :mod:`mcsim.results.waterfall` and
:mod:`mcsim.results.figures`. Grid axes are read from the dims (whatever they are named); a grid axis's label is
its dotted scenario path, ``ds[dim].attrs.get("path", dim)``, so a dim named ``hardware_preset`` with
``attrs["path"] = "hardware.preset"`` and a dim named ``hardware.preset`` read the same.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import xarray as xr

from mcsim.errors import McsimError
from mcsim.results.names import path_of
from mcsim.results.units import input_units
from mcsim.results.variables import HEADLINE, REGISTRY, REQUEST_QUANTILE, WORKLOAD_CLASS

#: Quantiles over Monte Carlo samples written to quantiles.csv.
LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)
#: Dims that are never grid axes.
FIXED_DIMS = ("variant", "sample", "tier", "quantile", REQUEST_QUANTILE, WORKLOAD_CLASS, "lever", "trial")
#: Names the per-request quantile dim has had (the first one present is used; files before 0.2 say "quantile").
REQUEST_QUANTILE_DIMS = (REQUEST_QUANTILE, "quantile")
class ReportError(McsimError, ValueError):
    """A report option that does not fit the result: an unknown metric, grid axis or grid value."""


def path_units(path: str) -> str:
    """Units of a scenario path as people read them (``cache.dram_gb_per_node`` -> ``GB``), or ``""`` for counts,
    fractions and factors (:func:`mcsim.results.units.input_units`, the rule the result's attributes follow)."""
    display = input_units(path)["display_units"]
    return "" if display == "1" else display


def request_quantile_dim(ds: xr.Dataset) -> str | None:
    """The per-request quantile dim of this Dataset, whichever name it has."""
    return next((d for d in REQUEST_QUANTILE_DIMS if d in ds.dims), None)


@dataclass(frozen=True)
class Series:
    """One reported quantity: a variable, possibly at one coordinate of its own extra dims."""

    label: str
    name: str
    select: tuple = ()  # ((dim, value), ...)


class _Layout:
    """Grid axes, variants, the points (grid x variant) and the point the figures focus on.

    Parameters
    ----------
    ds : xarray.Dataset
        A result Dataset.
    at : dict, optional
        ``{path: value}`` (both strings, as ``--at PATH=VALUE`` gives them): the grid value the figures show for
        that axis, instead of its first one. ``path`` is the axis's dotted path or its dim name; ``value`` matches
        a coordinate as written (``h200``, ``512``, ``512.0``) or ``variant`` names a variant.

    Raises
    ------
    ReportError
        An unknown path or value (the message lists the valid ones).
    """

    def __init__(self, ds: xr.Dataset, at: dict | None = None):
        reference = next((ds[n] for n in HEADLINE if n in ds),
                         next(v for v in ds.data_vars.values() if "sample" in v.dims))
        self.axes = [str(d) for d in reference.dims if d not in FIXED_DIMS]
        self.variants = [str(v) for v in ds["variant"].values] if "variant" in ds.dims else []
        self.dims = self.axes + (["variant"] if self.variants else [])
        self.coords = {d: [_plain(v) for v in ds[d].values] for d in self.dims}
        self.labels = {d: path_of(ds, d) for d in self.dims}
        self.shape = tuple(len(self.coords[d]) for d in self.dims)
        self.points = list(np.ndindex(*self.shape))
        focus_variant = ("factory" if "factory" in self.variants else self.variants[0]) if self.variants else None
        focus = [0] * len(self.axes) + ([self.variants.index(focus_variant)] if self.variants else [])
        for path, value in (at or {}).items():
            d = self._dim_of(path)
            focus[self.dims.index(d)] = self._index_of(d, value)
        self.focus = tuple(focus)
        self.samples = ds.sizes["sample"]

    def _dim_of(self, path: str) -> str:
        for d in self.dims:
            if path in (d, self.labels[d]):
                return d
        valid = ", ".join(self.labels[d] for d in self.dims) or "none (this result has no grid axis or variant)"
        raise ReportError(f"--at {path}: not a grid axis of this result; grid axes: {valid}")

    def _index_of(self, d: str, value: str) -> int:
        for i, v in enumerate(self.coords[d]):
            if str(value) in (str(v), _text(v)):
                return i
            try:
                if not isinstance(v, str) and float(value) == float(v):
                    return i
            except (TypeError, ValueError):
                pass
        valid = ", ".join(_text(v) for v in self.coords[d])
        raise ReportError(f"--at {self.labels[d]}={value}: not a value of this grid axis; values: {valid}")

    def label(self, d: str) -> str:
        """A dim's label: the dotted path of a grid axis, ``variant`` for the variant dim."""
        return self.labels.get(d, d)

    def at(self, d: str):
        """The focus value of dim ``d``."""
        return self.coords[d][self.focus[self.dims.index(d)]]

    def values(self, index) -> dict:
        return {d: self.coords[d][i] for d, i in zip(self.dims, index)}

    def name(self, index) -> str:
        parts = [f"{self.label(d)}={_text(v)}" for d, v in self.values(index).items() if d != "variant"]
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
    # "display_units" (where a result has them) are the units for people; "units" may be the CF form ("1" for a
    # currency amount per token)
    units = attrs.get("display_units") or attrs.get("units") or (registered.units if registered else "")
    return str(long_name), str(units)


def is_percent(ds: xr.Dataset, name: str) -> bool:
    """Whether a variable is a fraction shown in percent (the registry's ``percent`` flag)."""
    registered = REGISTRY.get(name)
    return bool(getattr(registered, "percent", False)) if registered else False


def display_scale(ds: xr.Dataset, name: str) -> tuple[float, str]:
    """(factor, units) a figure shows a variable in: fractions x 100 in %, others as stored."""
    if is_percent(ds, name):
        return 100.0, "%"
    units = _meta(ds, name)[1]
    return 1.0, ("dimensionless" if units in ("1", "") else units)


def _axis_label(ds: xr.Dataset, series: Series) -> str:
    long_name = _meta(ds, series.name)[0]
    return f"{long_name} ({display_scale(ds, series.name)[1]})"


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


def _median(values) -> float:
    return float(quantiles(values, [0.5])[0])


def infeasible(ds: xr.Dataset, layout: _Layout) -> np.ndarray:
    """Boolean (*layout.dims, sample): the samples whose recipe is infeasible (``feasible == 0``)."""
    if "feasible" not in ds:
        return np.zeros(layout.shape + (layout.samples,), dtype=bool)
    return _array(ds, layout, layout.dims, "feasible") == 0

"""Baseline -> factory waterfalls: how much of the change in a metric each lever brings, in the metric's units.

Three sources, in this order:

1. ``shapley_<metric>`` (an ablation, ``mcsim compare --ablate``): per-sample Shapley values of the levers. They
   add up exactly to factory - baseline on the scale they were computed on (``attrs["scale"]``; throughput and
   cost per token are attributed on a log scale, margins on a linear one, see :mod:`mcsim.results.attribution`).
   The waterfall takes their **mean over the samples** where every value is defined, because means keep the
   Shapley sum exactly (medians do not):

   - linear scale: the bars are the mean Shapley values, from the mean baseline to the mean factory value;
   - log scale: the mean Shapley values phi_i are log factors, so the waterfall is multiplicative. It starts at
     the geometric mean of the baseline, G_b = exp(mean log baseline), and applies the levers one after the
     other, largest |phi_i| first: level_k = level_(k-1) x exp(phi_k). Each bar is level_k - level_(k-1) in the
     metric's units (USD/Mtok, tokens/s/GPU), and the bars add up exactly to G_f - G_b, the geometric mean of the
     factory minus that of the baseline. A bar's size depends on where in the order its lever comes (a factor
     applied to a larger level moves it more); the factor exp(phi_k) does not, and is printed on the bar.

2. ``without:<lever>`` variants: median over samples of factory - without:lever (one lever removed at a time);
3. ``only:<lever>`` variants: median of only:lever - baseline (one lever added at a time).

One-at-a-time steps are not additive: what they leave of factory - baseline (medians, interactions) is its own
step, in the metric's units.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import xarray as xr

from mcsim.results.layout import _array, _Layout, _median, _plain

#: Scale of each attributed metric when its Shapley variable does not say (results written before attrs["scale"]).
DEFAULT_SCALES = {"decode_tok_s_per_gpu": "log", "prefill_tok_s_per_gpu": "log", "cost_usd_per_mtok": "log",
                  "gross_margin": "linear"}


@dataclass
class Waterfall:
    """The steps of one baseline -> factory waterfall, every number in the metric's units.

    ``steps`` are ``(lever, change)``; ``factors`` the multiplicative factor of each step on a log scale (else
    empty); ``rest`` what the steps leave of ``end - start`` (0 for Shapley steps, which are exact).
    """

    metric: str
    start: float
    end: float
    steps: list = field(default_factory=list)
    factors: list = field(default_factory=list)
    how: str = "no lever breakdown in this run"
    scale: str = "linear"
    exact: bool = False
    samples: int = 0
    left_out: int = 0

    @property
    def rest(self) -> float:
        return self.end - self.start - sum(d for _, d in self.steps if math.isfinite(d))


def shapley_scale(ds: xr.Dataset, metric: str) -> str:
    """``"log"`` or ``"linear"``: the scale the Shapley values of ``metric`` were computed on."""
    attrs = ds[f"shapley_{metric}"].attrs
    if attrs.get("scale") in ("log", "linear"):
        return str(attrs["scale"])
    if str(attrs.get("units", "")).startswith("log"):
        return "log"
    return DEFAULT_SCALES.get(metric, "linear")


def waterfall(ds: xr.Dataset, metric: str, layout: _Layout | None = None) -> Waterfall:
    """Baseline -> factory steps of ``metric`` at the layout's focus grid point (see the module docstring)."""
    layout = layout or _Layout(ds)
    variants = layout.variants
    grid = layout.focus[:len(layout.axes)]
    data = _array(ds, layout, layout.dims, metric)
    base, fact = (data[grid + (variants.index(v),)] for v in ("baseline", "factory"))
    name = f"shapley_{metric}"
    if name in ds and "lever" in ds[name].dims:
        phi = ds[name].isel({d: i for d, i in zip(layout.axes, grid) if d in ds[name].dims})
        if "variant" in phi.dims:
            phi = phi.sel(variant="factory")
        levers = [str(_plain(v)) for v in phi["lever"].values]
        return _shapley(metric, levers, np.asarray(phi.transpose("lever", "sample").values, dtype=float), base,
                        fact, shapley_scale(ds, metric))
    out = Waterfall(metric, _median(base), _median(fact), samples=int(np.sum(np.isfinite(base) & np.isfinite(fact))))
    without = [v for v in variants if v.startswith("without:")]
    only = [v for v in variants if v.startswith("only:")]
    if without:
        out.steps = [(v.split(":", 1)[1], _median(fact - data[grid + (variants.index(v),)])) for v in without]
        out.how = "median of factory - without:<lever> per sample (one lever removed at a time)"
    elif only:
        out.steps = [(v.split(":", 1)[1], _median(data[grid + (variants.index(v),)] - base)) for v in only]
        out.how = "median of only:<lever> - baseline per sample (one lever added at a time)"
    return out


def _shapley(metric, levers, phi, base, fact, scale) -> Waterfall:
    # phi: (lever, sample). A sample counts only where every Shapley value and both ends are defined, so the
    # means below describe one set of samples and keep the Shapley sum exactly.
    ok = np.all(np.isfinite(phi), axis=0) & np.isfinite(base) & np.isfinite(fact)
    if scale == "log":
        ok &= (base > 0) & (fact > 0)
    n, left_out = int(ok.sum()), int(ok.size - ok.sum())
    out = Waterfall(metric, math.nan, math.nan, scale=scale, exact=True, samples=n, left_out=left_out)
    if n == 0:
        out.steps = [(lever, math.nan) for lever in levers]
        out.how = "no sample with every Shapley value defined"
        return out
    mean_phi = phi[:, ok].mean(axis=1)
    order = sorted(range(len(levers)), key=lambda i: -abs(mean_phi[i]))
    if scale == "log":
        out.start = float(np.exp(np.mean(np.log(base[ok]))))
        out.end = float(np.exp(np.mean(np.log(fact[ok]))))
        level = out.start
        for i in order:
            factor = math.exp(mean_phi[i])
            out.steps.append((levers[i], level * factor - level))
            out.factors.append(factor)
            level *= factor
        out.how = ("geometric means; each bar is the change when that lever's factor exp(mean Shapley value of "
                   "log " + metric + ") is applied, largest first; the bars add up to factory - baseline")
    else:
        out.start, out.end = float(np.mean(base[ok])), float(np.mean(fact[ok]))
        out.steps = [(levers[i], float(mean_phi[i])) for i in order]
        out.how = "means; each bar is the lever's mean Shapley value; the bars add up to factory - baseline"
    return out


def waterfall_steps(ds: xr.Dataset, metric: str, layout: _Layout | None = None) -> tuple[float, list, float, str]:
    """``(start, steps, end, how)`` of :func:`waterfall`: its ends, its ``(lever, change)`` steps and how."""
    w = waterfall(ds, metric, layout)
    return w.start, w.steps, w.end, w.how

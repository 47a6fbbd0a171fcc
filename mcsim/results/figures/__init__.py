"""The figures of :func:`mcsim.results.report.write_report`.

Drawn on bare matplotlib Figures with an Agg canvas (no pyplot state), titled and labelled with units so a figure
reads without the code:

- :mod:`~.distributions` — box plots over samples per grid value and variant, small multiples over a third dim;
- :mod:`~.tornado` — rank correlations with the uncertain inputs;
- :mod:`~.grid` — heatmaps of medians over two grid axes, and service level against load;
- :mod:`~.paired` — per-sample comparisons with a reference grid value or variant;
- :mod:`~.waterfalls` — baseline -> factory steps per lever;
- :mod:`~.capacity` — a capacity result's bisections and its capacity over samples.

Every figure is drawn at the report's focus point (``--at``) for the dims it does not show. Every figure of
samples marks the runs that had not reached steady state (hollow points, or a count where it aggregates) and says
how many were infeasible and left out (:class:`~.common.Tally`). Text is drawn with mathtext off, so log axes are
labelled in plain numbers (:func:`~.common.log_scale`).
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

from mcsim.results.figures.capacity import capacity_figure
from mcsim.results.figures.common import has_values, save
from mcsim.results.figures.distributions import distribution
from mcsim.results.figures.grid import heatmap, load_axis, load_curves
from mcsim.results.figures.paired import paired_figure
from mcsim.results.figures.tornado import tornado
from mcsim.results.figures.waterfalls import waterfall_figure, waterfall_metrics

#: Sections of the report's figures, in the order the summary shows them.
SECTIONS = ("capacity", "distributions", "paired", "load", "tornado", "heatmap", "waterfall")
#: Metrics drawn as heatmaps over two grid axes and compared sample by sample (those reported).
HEATMAP_METRICS = ("gross_margin", "cost_usd_per_mtok")
PAIRED_METRICS = ("gross_margin", "cost_usd_per_mtok", "decode_tok_s_per_gpu", "ttft_s p99")
LOAD_METRICS = ("slo_attainment", "queue_wait_s p50", "queue_wait_s p99", "ttft_s p99")


def build_figures(ds, layout, quantities, outputs, focus_sens, series_of=None) -> dict:
    """Every figure of a report as ``{section: [(file name, Figure), ...]}``, nothing saved.

    ``series_of(labels)`` gives the series of extra metric labels the load curves need (``slo_attainment``,
    ``queue_wait_s p99``) when they are not among ``quantities``.
    """
    # labels carry scenario text (grid values, names): a "$" in them is text, never mathtext (hence
    # common.log_scale: matplotlib's log tick labels are mathtext)
    with matplotlib.rc_context({"text.parse_math": False}):
        figures = {key: [] for key in SECTIONS}
        if ds.attrs.get("capacity_result") and "rate_tried_rps" in ds:
            figures["capacity"].append(capacity_figure(ds))
        for s in quantities:
            if has_values(ds, s):  # an all-NaN metric (payback_months under rental) says so in the summary instead
                figures["distributions"].append(distribution(ds, layout, s))
        labels = {s.label: s for s in quantities}
        chosen = [labels[m] for m in PAIRED_METRICS if m in labels] or quantities[:4]
        for d in layout.dims:
            if len(layout.coords[d]) > 1 and chosen:
                figures["paired"].append(paired_figure(ds, layout, chosen, d))
        if load_axis(layout):
            extra = series_of([m for m in LOAD_METRICS if m not in labels]) if series_of else []
            load = [s for s in quantities + extra if s.label in LOAD_METRICS]
            load.sort(key=lambda s: LOAD_METRICS.index(s.label))
            drawn = load_curves(ds, layout, load[:3])
            if drawn:
                figures["load"].append(drawn)
        for s in outputs:
            if s.label in focus_sens:
                drawn = tornado(ds, layout, s, focus_sens[s.label])
                if drawn:
                    figures["tornado"].append(drawn)
        if sum(len(layout.coords[d]) > 1 for d in layout.axes) >= 2:
            heat = [labels[m] for m in HEATMAP_METRICS if m in labels] or quantities[:1]
            figures["heatmap"] = [heatmap(ds, layout, s) for s in heat]
        if {"baseline", "factory"} <= set(layout.variants):
            figures["waterfall"] = [waterfall_figure(ds, layout, m)[:2] for m in waterfall_metrics(ds)]
    return figures


def draw_figures(ds, layout, quantities, outputs, focus_sens, out: Path, series_of=None) -> dict:
    """Draw and save every figure into ``out``: ``{section: [file name, ...]}``."""
    figures = build_figures(ds, layout, quantities, outputs, focus_sens, series_of)
    with matplotlib.rc_context({"text.parse_math": False}):
        return {key: [save(fig, out / name) for name, fig in items] for key, items in figures.items()}

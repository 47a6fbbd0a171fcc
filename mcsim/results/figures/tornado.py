"""Tornado charts: the rank correlation of an output with each uncertain input, strongest first.

The correlations are over the samples at the focus point; the subtitle says how many of them were infeasible (left
out) and how many had not reached steady state (kept).
"""

from __future__ import annotations

import numpy as np

from mcsim.results.figures.common import Tally, new_figure, suptitle, values
from mcsim.results.layout import Series, _Layout, _meta, _slug, path_of

MAX_TORNADO_BARS = 12
#: Samples per uncertain input below which the indices are rough (the summary uses the same rule).
SAMPLES_PER_INPUT = 10


def few_samples_warning(samples: int, inputs: int) -> str:
    """The caution for indices estimated from too few samples, or ``""``."""
    if samples >= SAMPLES_PER_INPUT * inputs:
        return ""
    return (f"only {samples} samples for {inputs} uncertain inputs (want {SAMPLES_PER_INPUT * inputs}): the bars "
            "are rough; trust the sign and order of the strongest ones, not their values")


def s1_text(value: float) -> str:
    """A first-order Sobol index as printed: a negative estimate is noise around 0, shown as such."""
    return "S1 = 0 (< 0, noise)" if value < 0 else f"S1 = {value:.2f}"


def tornado(ds, layout: _Layout, s: Series, result: dict):
    """The tornado figure of one output at the focus point: ``(file name, Figure)``, or None when nothing is defined."""
    correlations, kind = result["prcc"], "PRCC (partial rank correlation)"
    low, high = result["low"], result["high"]
    if not np.any(np.isfinite(correlations)):
        correlations, kind = result["spearman"], "Spearman rank correlation"
        low = high = np.full(correlations.shape, np.nan)
    defined = np.flatnonzero(np.isfinite(correlations))
    if defined.size == 0:
        return None
    order = defined[np.argsort(-np.abs(correlations[defined]), kind="stable")][:MAX_TORNADO_BARS][::-1]
    names = [path_of(ds, result["inputs"][j]) for j in order]
    fig = new_figure(8.0, max(3.6, 2.2 + 0.36 * len(order)))
    ax = fig.add_subplot()
    y = np.arange(len(order))
    ax.barh(y, correlations[order], color=["C3" if correlations[j] < 0 else "C0" for j in order], alpha=0.8)
    has_ci = np.isfinite(low[order]) & np.isfinite(high[order])
    if np.any(has_ci):
        lo, hi, mid = low[order][has_ci], high[order][has_ci], correlations[order][has_ci]
        ax.errorbar(mid, y[has_ci], xerr=[np.maximum(mid - lo, 0), np.maximum(hi - mid, 0)], fmt="none",
                    ecolor="black", capsize=3, lw=1, label="90 % bootstrap interval")
        ax.legend(fontsize=8, loc="lower right")
    sobol = result["sobol"]
    if np.any(np.isfinite(sobol[order])):
        # the S1 column sits in a second axes on the right, so constrained layout makes room for it
        side = ax.inset_axes([1.01, 0, 0.2, 1], sharey=ax)
        side.set_axis_off()
        for yi, j in zip(y, order):
            if np.isfinite(sobol[j]):
                side.text(0.02, yi, s1_text(sobol[j]), va="center", fontsize=8)
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlim(-1, 1)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"{kind} with {s.label} (dimensionless, -1 to 1)", fontsize=9)
    ax.grid(axis="x", alpha=0.3)
    tally = Tally(ds, layout)
    tally.add(layout.focus, drawn_values=values(ds, layout, s)[0][layout.focus])
    notes = [f"correlations over {result['samples']} samples", *tally.notes(), layout.focus_note(),
             "blue raises it, red lowers it",
             "S1 = first-order Sobol index; a negative estimate is shown as 0" if np.any(np.isfinite(sobol)) else ""]
    suptitle(fig, f"What drives {_meta(ds, s.name)[0]} [{s.label}] (modelled)", notes,
             warning=few_samples_warning(result["samples"], len(result["inputs"])))
    return f"tornado_{_slug(s.label)}.png", fig

"""Figures over grid axes: heatmaps of medians over two axes (small multiples over a third) and load curves.

Both aggregate over samples, so they mark where the runs behind a number had not all reached steady state: a
heatmap cell names how many of its samples had not, a load curve draws such a point hollow. Their subtitles count
those runs and the infeasible ones, which are left out.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.lines import Line2D

from mcsim.results.figures.common import (
    Tally,
    dim_label,
    fixed_note,
    fmt,
    new_figure,
    suptitle,
    tick_text,
    values,
    wrap,
)
from mcsim.results.layout import Series, _Layout, _meta, _slug, display_scale, quantiles

MAX_PANELS = 6
#: A colour scale spanning less than this fraction of its level is drawn relative to its median.
RELATIVE_SPAN = 0.05
#: Scenario paths that set the offered load: a grid axis over one of them gets the load curves.
LOAD_PATHS = ("workload.rate_rps", "workload.trace_time_scale")


def _medians(block: np.ndarray) -> np.ndarray:
    out = np.full(block.shape[:-1], np.nan)
    for i in np.ndindex(*block.shape[:-1]):
        out[i] = quantiles(block[i], [0.5])[0]
    return out


def heatmap(ds, layout: _Layout, s: Series):
    """Medians over the first two varying grid axes, one panel per value of a third: ``(file name, Figure)``."""
    varying = [d for d in layout.axes if len(layout.coords[d]) > 1]
    a, b = varying[0], varying[1]
    panel = next((d for d in varying[2:] if len(layout.coords[d]) <= MAX_PANELS), None)
    data, _ = values(ds, layout, s)
    tally = Tally(ds, layout)
    blocks, counts = [], []  # counts: per cell, (samples not at steady state, infeasible samples)
    for p in range(len(layout.coords[panel]) if panel else 1):
        index = list(layout.focus)
        index[layout.dims.index(a)] = slice(None)
        index[layout.dims.index(b)] = slice(None)
        if panel:
            index[layout.dims.index(panel)] = p
        blocks.append(_medians(data[tuple(index)]))  # (a, b)
        bad, slow = tally.add(tuple(index), drawn_values=data[tuple(index)])
        counts.append((slow.sum(axis=-1), bad.sum(axis=-1)))
    stack = np.array(blocks)
    finite = stack[np.isfinite(stack)]
    span = (float(finite.min()), float(finite.max())) if finite.size else (0.0, 1.0)
    level = float(np.median(finite)) if finite.size else 0.0
    relative = bool(finite.size and span[1] > span[0] and level != 0
                    and (span[1] - span[0]) / abs(level) < RELATIVE_SPAN)
    shown = 100.0 * (stack / level - 1.0) if relative else stack
    vmin, vmax = (np.nanmin(shown), np.nanmax(shown)) if finite.size else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 0.5, vmax + 0.5
    units = display_scale(ds, s.name)[1]
    digits = 4 if relative else 3

    cols = min(3, len(blocks))
    rows = math.ceil(len(blocks) / cols)
    nb, na = len(layout.coords[b]), len(layout.coords[a])
    fig = new_figure(max(6.0, cols * (1.4 + 0.85 * nb) + 1.6), 1.8 + rows * (1.2 + 0.42 * na))
    axes = [fig.add_subplot(rows, cols, i + 1) for i in range(len(blocks))]
    image = None
    for k, (ax, block) in enumerate(zip(axes, shown)):
        image = ax.imshow(block, aspect="auto", cmap="viridis", origin="lower", vmin=vmin, vmax=vmax)
        for i, j in np.ndindex(block.shape):
            defined = np.isfinite(stack[k][i, j])
            light = np.isfinite(block[i, j]) and (block[i, j] - vmin) / (vmax - vmin) > 0.6
            text = f"{stack[k][i, j]:.{digits}g}" if defined else "n/a"
            colour = "black" if light else "white" if defined else "0.3"  # an undefined cell is not painted
            slow, bad = (int(c[i, j]) for c in counts[k])
            marks = [f"{slow} unsteady" if slow else "", f"{bad} infeasible" if bad else ""]
            marks = "\n".join(m for m in marks if m)
            lift = 0.0 if not marks else 0.22 if "\n" in marks else 0.12
            ax.text(j, i + lift, text, ha="center", va="center", fontsize=7, color=colour)
            if marks:
                ax.text(j, i + lift - 0.34 - 0.03 * marks.count("\n"), marks, ha="center", va="center",
                        fontsize=6, color=colour, linespacing=1.0)
        rotate = nb > 4 or max(len(tick_text(v)) for v in layout.coords[b]) > 6
        ax.set_xticks(range(nb), [tick_text(v) for v in layout.coords[b]], rotation=30 if rotate else 0,
                      ha="right" if rotate else "center", fontsize=8)
        ax.set_yticks(range(na), [tick_text(v) for v in layout.coords[a]], fontsize=8)
        ax.set_xlabel(dim_label(ds, layout, b), fontsize=8)
        if k % cols == 0:
            ax.set_ylabel(dim_label(ds, layout, a), fontsize=8)
        if panel:
            ax.set_title(f"{layout.label(panel)} = {tick_text(layout.coords[panel][k], 30)}", fontsize=9)
    label = (f"median, % relative to {fmt(level)} {units}" if relative else f"median {_meta(ds, s.name)[0]} ({units})")
    bar = fig.colorbar(image, ax=axes, shrink=0.9)
    bar.set_label(wrap(label, 28), fontsize=8)
    bar.ax.tick_params(labelsize=7)
    notes = [f"cells: median over {layout.samples} samples ({units})",
             f"colours span {fmt(span[0])} to {fmt(span[1])} {units}, "
             f"{100 * (span[1] - span[0]) / abs(level):.2g} % of the median" if relative else "",
             tally.infeasible_note(),
             tally.unsteady_note() if tally.unsteady else "",
             "a cell's 'k unsteady' and 'k infeasible' count its own samples" if tally.unsteady or tally.infeasible
             else "",
             fixed_note(layout, [a, b] + ([panel] if panel else []))]
    suptitle(fig, f"{_meta(ds, s.name)[0]} [{s.label}] (modelled)", notes)
    return f"heatmap_{_slug(s.label)}.png", fig


def load_axis(layout: _Layout) -> str | None:
    """The grid axis that varies the offered load, if any (numeric, more than one value)."""
    for d in layout.axes:
        if layout.label(d) in LOAD_PATHS and len(layout.coords[d]) > 1 \
                and all(isinstance(v, (int, float)) for v in layout.coords[d]):
            return d
    return None


def load_curves(ds, layout: _Layout, series: list[Series]):
    """SLO attainment and queue wait against the load axis: median lines with 25-75 % and 5-95 % bands."""
    axis = load_axis(layout)
    if axis is None or not series:
        return None
    x = np.array(layout.coords[axis], dtype=float)
    lines = ("variant" if 1 < len(layout.variants) <= 4 else
             next((d for d in layout.axes if d != axis and 1 < len(layout.coords[d]) <= 4), None))
    fig = new_figure(max(6.0, 3.6 * len(series) + 0.6), 4.4)
    tally = Tally(ds, layout)
    for k, s in enumerate(series):
        ax = fig.add_subplot(1, len(series), k + 1)
        data, bad = values(ds, layout, s)
        for c in range(len(layout.coords[lines]) if lines else 1):
            index = list(layout.focus)
            index[layout.dims.index(axis)] = slice(None)
            if lines:
                index[layout.dims.index(lines)] = c
            block = data[tuple(index)]  # (load, sample)
            if k == 0:  # every panel draws the same runs: count them once
                tally.add(tuple(index))
            slow = np.any(tally.slow[tuple(index)] & ~bad[tuple(index)], axis=-1)  # (load,)
            q = np.array([quantiles(block[i], [0.05, 0.25, 0.5, 0.75, 0.95]) for i in range(len(x))])
            label = f"{tick_text(layout.coords[lines][c], 24)}" if lines else "median"
            ax.fill_between(x, q[:, 0], q[:, 4], color=f"C{c}", alpha=0.12, lw=0)
            ax.fill_between(x, q[:, 1], q[:, 3], color=f"C{c}", alpha=0.25, lw=0)
            ax.plot(x, q[:, 2], color=f"C{c}", marker="o", ms=3, label=label)
            if slow.any():
                ax.plot(x[slow], q[slow, 2], linestyle="none", marker="o", ms=6.5, mfc="white", mec=f"C{c}",
                        mew=1.2)
        ax.set_xlabel(dim_label(ds, layout, axis), fontsize=9)
        ax.set_ylabel(wrap(f"{_meta(ds, s.name)[0]} [{s.label}] ({display_scale(ds, s.name)[1]})", 40), fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=8)
        if k == 0:
            handles = ax.get_legend_handles_labels()[0]
            if tally.unsteady:
                handles.append(Line2D([], [], linestyle="none", marker="o", ms=6.5, mfc="white", mec="black",
                                      label=f"some samples not at steady state ({tally.unsteady} of "
                                            f"{tally.drawn} in all)"))
            ax.legend(handles=handles, fontsize=7, title=layout.label(lines) if lines else None, title_fontsize=7,
                      loc="best")
    notes = [f"line: median over {layout.samples} samples; bands 25-75 % and 5-95 %",
             tally.infeasible_note(),
             tally.unsteady_note() + "; a hollow point is a median over some of them"
             if tally.unsteady else "",
             fixed_note(layout, [axis] + ([lines] if lines else []))]
    suptitle(fig, f"Service level against load ({layout.label(axis)}) (modelled)", notes)
    return f"load_{_slug(layout.label(axis))}.png", fig

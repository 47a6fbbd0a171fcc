"""The figures of :func:`mcsim.results.report.write_report`: distributions, tornado charts, heatmaps, waterfalls.

Drawn on bare matplotlib Figures with an Agg canvas (no pyplot state), titled and labelled with units so a figure
reads without the code.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np

from mcsim.results.layout import (
    Series,
    _array,
    _axis_label,
    _fmt,
    _Layout,
    _meta,
    _slug,
    _text,
    quantiles,
    waterfall_steps,
)

#: Metrics of the baseline -> factory waterfall when the run has no Shapley variables.
WATERFALL_METRICS = ("cost_usd_per_mtok", "gross_margin", "decode_tok_s_per_gpu")
#: Metrics drawn as heatmaps over the first two grid axes (those present).
HEATMAP_METRICS = ("gross_margin", "cost_usd_per_mtok")
MAX_GROUPS = 12
MAX_TORNADO_BARS = 12
DPI = 110


def _figure(width: float, height: float):
    # A bare Figure on an Agg canvas: no pyplot, so the caller's backend and global figure state stay untouched.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: Path) -> str:
    fig.savefig(path, dpi=DPI)
    return path.name


def draw_figures(ds, layout, quantities, outputs, focus_sens, out: Path) -> dict:
    import matplotlib

    # labels carry scenario text (grid values, names): a "$" in them is text, never mathtext
    with matplotlib.rc_context({"text.parse_math": False}):
        return _draw_figures(ds, layout, quantities, outputs, focus_sens, out)


def _draw_figures(ds, layout, quantities, outputs, focus_sens, out: Path) -> dict:
    figures = {"distributions": [], "tornado": [], "heatmap": [], "waterfall": []}
    for s in quantities:
        figures["distributions"].append(_distribution(ds, layout, s, out))
    for s in outputs:
        if s.label in focus_sens:
            name = _tornado(ds, layout, s, focus_sens[s.label], out)
            if name:
                figures["tornado"].append(name)
    if len(layout.axes) >= 2:
        labels = {s.label: s for s in quantities}
        chosen = [labels[m] for m in HEATMAP_METRICS if m in labels] or quantities[:1]
        figures["heatmap"] = [_heatmap(ds, layout, s, out) for s in chosen]
    if {"baseline", "factory"} <= set(layout.variants):
        figures["waterfall"] = _waterfalls(ds, layout, out)
    return figures


def _title(ax, head: str, notes: list[str], width: int = 90) -> None:
    """A bold-ish headline and notes wrapped to the figure's width, so nothing is cut off."""
    body = textwrap.fill("; ".join(n for n in notes if n), width=width)
    ax.set_title(head + ("\n" + body if body else ""), fontsize=9)


def _fixed_axes_note(layout: _Layout, shown: list[str]) -> str:
    fixed = [f"{d}={_text(layout.coords[d][0])}" for d in layout.axes if d not in shown]
    return f"{'other ' if shown else ''}grid axes at {', '.join(fixed)}" if fixed else ""


def _distribution(ds, layout: _Layout, s: Series, out: Path) -> str:
    from matplotlib.patches import Patch

    data = _array(ds, layout, layout.dims, s.name, s.select)
    axis = layout.axes[0] if layout.axes else None
    groups = layout.coords[axis][:MAX_GROUPS] if axis else [None]
    variants = layout.variants or [None]
    colors = [f"C{i}" for i in range(len(variants))]
    # With a grid axis the variants sit side by side within each grid value; without one, each variant is a group.
    width = 0.8 / len(variants) if axis else 0.6
    boxes, positions, box_colors, hidden = [], [], [], 0
    for g in range(len(groups)):
        for v in range(len(variants)):
            index = tuple([g] + [0] * (len(layout.axes) - 1) if axis else []) + ((v,) if layout.variants else ())
            values = data[index]
            finite = values[np.isfinite(values)]
            hidden += values.size - finite.size
            if finite.size:
                boxes.append(finite)
                positions.append(g + (v - (len(variants) - 1) / 2) * width if axis else v)
                box_colors.append(colors[v])
    fig = _figure(max(5.5, 1.0 + 0.55 * len(groups) * len(variants)), 4.4)
    ax = fig.add_subplot()
    if boxes:
        parts = ax.boxplot(boxes, positions=positions, widths=width * 0.8, whis=(5, 95), showfliers=False,
                           patch_artist=True, manage_ticks=False)
        for patch, color in zip(parts["boxes"], box_colors):
            patch.set_facecolor(color)
            patch.set_alpha(0.55)
        for median in parts["medians"]:
            median.set_color("black")
        everything = np.concatenate(boxes)
        if everything.min() > 0 and everything.max() / everything.min() > 50:
            ax.set_yscale("log")
    else:
        ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center")
    ax.set_xticks(range(len(groups) if axis else len(variants)))
    ax.set_xticklabels([_text(g) for g in groups] if axis else [v or "" for v in variants])
    if axis:
        ax.set_xlabel(axis + (f" (first {MAX_GROUPS} values)" if len(layout.coords[axis]) > MAX_GROUPS else ""))
    elif layout.variants:
        ax.set_xlabel("variant")
    ax.set_ylabel(_axis_label(ds, s))
    if axis and layout.variants:
        ax.legend(handles=[Patch(facecolor=c, alpha=0.55, label=v) for c, v in zip(colors, variants)],
                  title="variant", fontsize=8, loc="best")
    notes = [f"{layout.samples} Monte Carlo samples; box 25-75 %, line median, whiskers 5-95 %"]
    if hidden:
        notes.append(f"{hidden} non-finite values not drawn")
    fixed = _fixed_axes_note(layout, layout.axes[:1])
    if fixed:
        notes.append(fixed)
    _title(ax, f"{_meta(ds, s.name)[0]} [{s.label}] (modelled)", notes, width=int(fig.get_figwidth() * 13))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out / f"dist_{_slug(s.label)}.png")


def _tornado(ds, layout: _Layout, s: Series, result: dict, out: Path) -> str | None:
    values, kind = result["prcc"], "PRCC (partial rank correlation)"
    low, high = result["low"], result["high"]
    if not np.any(np.isfinite(values)):
        values, kind = result["spearman"], "Spearman rank correlation"
        low = high = np.full(values.shape, np.nan)
    defined = np.flatnonzero(np.isfinite(values))
    if defined.size == 0:
        return None
    order = defined[np.argsort(-np.abs(values[defined]), kind="stable")][:MAX_TORNADO_BARS][::-1]
    names = [result["inputs"][j] for j in order]
    fig = _figure(7.5, max(3.2, 1.6 + 0.36 * len(order)))
    ax = fig.add_subplot()
    y = np.arange(len(order))
    colors = ["C3" if values[j] < 0 else "C0" for j in order]
    ax.barh(y, values[order], color=colors, alpha=0.8)
    has_ci = np.isfinite(low[order]) & np.isfinite(high[order])
    if np.any(has_ci):
        lo, hi, mid = low[order][has_ci], high[order][has_ci], values[order][has_ci]
        ax.errorbar(mid, y[has_ci], xerr=[np.maximum(mid - lo, 0), np.maximum(hi - mid, 0)], fmt="none",
                    ecolor="black", capsize=3, lw=1, label="90 % bootstrap interval")
        ax.legend(fontsize=8, loc="lower right")
    for yi, j in zip(y, order):
        sobol = result["sobol"][j]
        if np.isfinite(sobol):
            ax.text(1.02, yi, f"S1={sobol:.2f}", va="center", fontsize=8, transform=ax.get_yaxis_transform())
    ax.set_yticks(y)
    ax.set_yticklabels(names, fontsize=8)
    ax.set_xlim(-1, 1)
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"{kind} with {s.label} (dimensionless, -1 to 1)")
    where = layout.focus_note()
    _title(ax, f"What drives {_meta(ds, s.name)[0]} [{s.label}] (modelled)",
           [f"{result['samples']} samples", where, "blue raises it, red lowers it",
            "S1 = first-order Sobol index" if np.any(np.isfinite(result["sobol"])) else ""], width=95)
    ax.grid(axis="x", alpha=0.3)
    return _save(fig, out / f"tornado_{_slug(s.label)}.png")


def _heatmap(ds, layout: _Layout, s: Series, out: Path) -> str:
    data = _array(ds, layout, layout.dims, s.name, s.select)
    a, b = layout.axes[0], layout.axes[1]
    index = (slice(None), slice(None)) + (0,) * (len(layout.axes) - 2) + \
        ((layout.focus[-1],) if layout.variants else ())
    block = data[index]  # (a, b, sample)
    medians = np.array([[quantiles(block[i, j], [0.5])[0] for j in range(block.shape[1])]
                        for i in range(block.shape[0])])
    fig = _figure(max(5.0, 1.8 + 0.9 * medians.shape[1]), max(3.5, 1.6 + 0.5 * medians.shape[0]))
    ax = fig.add_subplot()
    shown = np.where(np.isfinite(medians), medians, np.nan)
    image = ax.imshow(shown, aspect="auto", cmap="viridis", origin="lower")
    fig.colorbar(image, ax=ax, label="median " + _axis_label(ds, s))
    span = (np.nanmin(shown), np.nanmax(shown)) if np.any(np.isfinite(shown)) else (0.0, 1.0)
    for i, j in np.ndindex(medians.shape):
        light = np.isfinite(shown[i, j]) and span[1] > span[0] and (shown[i, j] - span[0]) / (span[1] - span[0]) > 0.6
        ax.text(j, i, _fmt(float(medians[i, j])), ha="center", va="center", fontsize=8,
                color="black" if light else "white")
    ax.set_xticks(range(medians.shape[1]))
    ax.set_xticklabels([_text(v) for v in layout.coords[b]], rotation=30 if medians.shape[1] > 6 else 0)
    ax.set_yticks(range(medians.shape[0]))
    ax.set_yticklabels([_text(v) for v in layout.coords[a]])
    ax.set_xlabel(b)
    ax.set_ylabel(a)
    notes = [f"median over {layout.samples} samples"]
    if layout.variants:
        notes.append(f"variant {layout.variants[layout.focus[-1]]}")
    fixed = _fixed_axes_note(layout, [a, b])
    if fixed:
        notes.append(fixed)
    _title(ax, f"{_meta(ds, s.name)[0]} [{s.label}] (modelled)", notes, width=int(fig.get_figwidth() * 13))
    return _save(fig, out / f"heatmap_{_slug(s.label)}.png")


def _waterfalls(ds, layout: _Layout, out: Path) -> list[str]:
    shapley = [n[len("shapley_"):] for n in ds.data_vars if n.startswith("shapley_") and "lever" in ds[n].dims
               and n[len("shapley_"):] in ds]
    names = []
    for metric in shapley or [m for m in WATERFALL_METRICS if m in ds]:
        start, steps, end, how = waterfall_steps(ds, metric)
        names.append(_waterfall(ds, layout, Series(metric, metric), start, end, steps, how, out))
    return names


def _waterfall(ds, layout, s: Series, start: float, end: float, steps: list, how: str, out: Path) -> str:
    from matplotlib.patches import Patch

    labels, bottoms, heights, colors = ["baseline"], [0.0], [start], ["0.45"]
    level = start
    for lever, delta in steps:
        delta = 0.0 if not np.isfinite(delta) else float(delta)
        labels.append(lever)
        bottoms.append(level)
        heights.append(delta)
        colors.append("C2" if delta >= 0 else "C3")
        level += delta
    rest = end - level
    if steps and np.isfinite(rest) and abs(rest) > 1e-9 * max(abs(start), abs(end), 1e-300):
        labels.append("interactions /\nmedians not additive")
        bottoms.append(level)
        heights.append(rest)
        colors.append("0.75")
    labels.append("factory")
    bottoms.append(0.0)
    heights.append(end)
    colors.append("C0")
    fig = _figure(max(7.0, 1.5 + 0.85 * len(labels)), 4.5)
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    finite = np.isfinite(heights) & np.isfinite(bottoms)
    ax.bar(x[finite], np.array(heights)[finite], bottom=np.array(bottoms)[finite],
           color=[c for c, f in zip(colors, finite) if f], edgecolor="black", linewidth=0.5)
    for xi, b, h in zip(x, bottoms, heights):
        if np.isfinite(b + h):
            ax.text(xi, b + h, _fmt(float(h)), ha="center", va="bottom" if h >= 0 else "top", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30 if len(labels) > 4 else 0, ha="right" if len(labels) > 4 else "center",
                       fontsize=8)
    ax.set_ylabel(_axis_label(ds, s))
    if steps:
        ax.legend(handles=[Patch(color="C2", label="lever raises it"), Patch(color="C3", label="lever lowers it")],
                  fontsize=8, loc="best")
    fixed = _fixed_axes_note(layout, [])
    ends = np.array([0.0] + [v for b, h in zip(bottoms, heights) for v in (b, b + h)])
    ends = ends[np.isfinite(ends)]
    pad = 0.12 * (ends.max() - ends.min() or 1.0)  # room for the value labels; bars' sticky edges defeat margins
    ax.set_ylim(ends.min() - (pad if ends.min() < 0 else 0), ends.max() + pad)
    _title(ax, f"Baseline -> factory: {_meta(ds, s.name)[0]} (modelled)",
           [f"medians over {layout.samples} samples", how, fixed], width=int(fig.get_figwidth() * 13))
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, out / f"waterfall_{_slug(s.label)}.png")


# -- summary.md --------------------------------------------------------------------------------------------------

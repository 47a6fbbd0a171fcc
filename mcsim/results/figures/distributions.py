"""Distributions over Monte Carlo samples: box plots per grid value and variant, small multiples over a third dim.

The samples of a box are drawn over it as points when they are few (:data:`~.common.STRIP_MAX`), hollow where the
run did not reach steady state; with more, only those hollow points are drawn. The legend counts them.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import Patch

from mcsim.results.figures.common import (
    Tally,
    boxplot,
    constant_value,
    dim_label,
    fixed_note,
    fmt,
    log_scale,
    new_figure,
    point_handles,
    sample_points,
    suptitle,
    tick_text,
    values,
)
from mcsim.results.layout import Series, _axis_label, _Layout, _meta, _slug, display_scale

#: Most values of a dim drawn side by side within a group (colours), and most panels of small multiples.
MAX_HUE = 4
MAX_PANELS = 6
MAX_GROUPS = 12
#: Ratio of largest to smallest positive value above which the value axis is logarithmic.
LOG_SPAN = 50


def roles(layout: _Layout) -> dict:
    """Which dim goes where: ``x`` (groups), ``hue`` (colours within a group), ``panel`` (small multiples).

    Variants go on the value axis's cross direction as horizontal boxes when there are more than
    :data:`MAX_HUE` of them or no grid axis varies (``horizontal``); every dim left over is held at the focus.
    """
    varying = [d for d in layout.dims if len(layout.coords[d]) > 1]
    axes = [d for d in varying if d != "variant"]
    if "variant" in varying and (len(layout.variants) > MAX_HUE or not axes):
        return {"x": "variant", "hue": None, "panel": None, "horizontal": True}
    x = axes[0] if axes else None
    rest = axes[1:]
    hue = "variant" if "variant" in varying else next((d for d in rest if len(layout.coords[d]) <= MAX_HUE), None)
    rest = [d for d in rest if d != hue]
    panel = next((d for d in rest if len(layout.coords[d]) <= MAX_PANELS), None)
    return {"x": x, "hue": hue, "panel": panel, "horizontal": False}


def _index(layout: _Layout, fixed: dict) -> tuple:
    """A point's index: the focus, with the dims in ``fixed`` ({dim: position}) replaced."""
    return tuple(fixed.get(d, f) for d, f in zip(layout.dims, layout.focus))


def distribution(ds, layout: _Layout, s: Series):
    """The box-plot figure of one series: ``(file name, Figure)``."""
    data, _ = values(ds, layout, s)
    flag = s.name == "feasible"
    tally = Tally(ds, layout, left_out=not flag)
    steady_drawn = False
    r = roles(layout)
    units = display_scale(ds, s.name)[1]
    n = lambda d: len(layout.coords[d]) if d else 1  # noqa: E731
    x_count = min(n(r["x"]), MAX_GROUPS)
    panels = list(range(n(r["panel"])))
    hues = list(range(n(r["hue"])))
    everything = data[np.isfinite(data)]
    log = not flag and bool(everything.size and everything.min() > 0
                            and everything.max() / everything.min() > LOG_SPAN)
    value_label = f"share of samples where the {_meta(ds, s.name)[0]} (%)" if flag else _axis_label(ds, s)

    if r["horizontal"]:
        fig = new_figure(7.5, max(3.4, 1.7 + 0.34 * x_count))
        axes = [fig.add_subplot()]
    else:
        cols = min(3, len(panels))
        rows = math.ceil(len(panels) / cols)
        width = max(3.4, 1.0 + 0.45 * x_count * len(hues))
        fig = new_figure(max(6.0, width * cols + 0.8), 1.6 + 3.0 * rows)
        axes = [fig.add_subplot(rows, cols, 1)]
        axes += [fig.add_subplot(rows, cols, i + 1, sharey=axes[0]) for i in range(1, len(panels))]

    constants = []
    for ax, p in zip(axes, panels):
        box_width = 0.8 / len(hues)
        for h in hues:
            for g in range(x_count):
                fixed = {d: i for d, i in ((r["x"], g), (r["hue"], h), (r["panel"], p)) if d}
                v = data[_index(layout, fixed)]
                slow = tally.add(_index(layout, fixed), drawn_values=v)[1]
                finite = v[np.isfinite(v)]
                if not finite.size:
                    continue
                pos = g + (h - (len(hues) - 1) / 2) * box_width
                if flag:  # a 0/1 flag: the share of samples where it holds, not a box
                    share = 100.0 * float(np.mean(finite))
                    draw = ax.barh if r["horizontal"] else ax.bar
                    draw(pos, share, 0.8 * box_width, color=f"C{h}", alpha=0.7)
                    ax.text(*((share, pos) if r["horizontal"] else (pos, share)),
                            f" {int(np.sum(finite))}/{finite.size}", fontsize=7,
                            ha="left" if r["horizontal"] else "center", va="center" if r["horizontal"] else "bottom")
                    continue
                c = constant_value(finite)
                if c is not None:
                    constants.append(c)
                    line = ([c, c], [pos - 0.35 * box_width, pos + 0.35 * box_width])
                    ax.plot(*(line if r["horizontal"] else line[::-1]), color=f"C{h}", lw=2.5,
                            solid_capstyle="butt")
                else:
                    parts = boxplot(ax, [finite], r["horizontal"], positions=[pos], widths=box_width * 0.8,
                                    whis=(5, 95), showfliers=False, patch_artist=True, manage_ticks=False)
                    parts["boxes"][0].set_facecolor(f"C{h}")
                    parts["boxes"][0].set_alpha(0.55)
                    parts["medians"][0].set_color("black")
                steady_drawn |= sample_points(ax, pos, v, slow, 0.5 * box_width, r["horizontal"])
        ticks = ([tick_text(layout.coords[r["x"]][g], 24 if r["horizontal"] else 16) for g in range(x_count)]
                 if r["x"] else [""])
        if r["horizontal"]:
            ax.set_yticks(range(x_count), ticks, fontsize=8)
            ax.set_ylim(x_count - 0.5, -0.5)  # first variant on top
            ax.set_xlabel(value_label, fontsize=9)
            if flag:
                ax.set_xlim(0, 118)
            if log:
                log_scale(ax, "x")
            ax.grid(axis="x", alpha=0.3)
        else:
            rotate = x_count > 5 or max((len(t) for t in ticks), default=0) > 8
            ax.set_xticks(range(x_count), ticks, rotation=30 if rotate else 0, ha="right" if rotate else "center",
                          fontsize=8)
            ax.set_xlim(-0.6, x_count - 0.4)
            if r["x"]:
                ax.set_xlabel(dim_label(ds, layout, r["x"]), fontsize=9)
            if ax is axes[0] or (len(axes) > 3 and axes.index(ax) % 3 == 0):
                ax.set_ylabel(value_label, fontsize=9)
            if flag:
                ax.set_ylim(0, 112)
            if log:
                log_scale(ax, "y")
            ax.grid(axis="y", alpha=0.3)
        if r["panel"]:
            ax.set_title(f"{layout.label(r['panel'])} = {tick_text(layout.coords[r['panel']][p], 30)}",
                         fontsize=9)
        if not everything.size:
            ax.text(0.5, 0.5, "no finite values", transform=ax.transAxes, ha="center")
    handles = [] if flag else point_handles(tally, steady_drawn)
    if r["hue"]:
        labels = [tick_text(v, 24) for v in layout.coords[r["hue"]]]
        handles = [Patch(facecolor=f"C{h}", alpha=0.55, label=lab) for h, lab in enumerate(labels)] + handles
    if handles:  # below the plots, where it hides no box or point
        fig.legend(handles=handles, title=layout.label(r["hue"]) if r["hue"] else None, fontsize=7,
                   title_fontsize=7, loc="outside lower center", ncols=min(len(handles), 6))
    single = not flag and everything.size and np.all(everything == everything[0])
    notes = [f"{layout.samples} Monte Carlo samples" + ("" if flag else "; box 25-75 %, line median, whiskers 5-95 %"),
             f"constant: {fmt(everything[0])} {units} in every sample" if single else
             "a flat line is a value without spread" if constants else "",
             "bars: share of samples, with their count" if flag else "",
             "a point per sample, hollow where it had not reached steady state" if steady_drawn else
             "hollow points: samples not at steady state" if tally.unsteady and not flag else "",
             tally.infeasible_note(),
             f"first {MAX_GROUPS} of {n(r['x'])} values" if n(r["x"]) > MAX_GROUPS else "",
             fixed_note(layout, [d for d in (r["x"], r["hue"], r["panel"]) if d])]
    suptitle(fig, f"{_meta(ds, s.name)[0]} [{s.label}] (modelled)", notes)
    return f"dist_{_slug(s.label)}.png", fig

"""Paired differences: each sample compared with itself at a reference grid value or variant.

Grid points and variants share the samples' random streams (common random numbers), so two boxes that overlap can
still differ in the same direction in almost every sample. These figures show the per-sample ratio to the
reference (or, for fractions shown in percent, the difference in percentage points) and the share of samples on
each side of it. The pairs are drawn over the boxes as points when they are few, hollow where either run had not
reached steady state (with many, only those); pairs with an infeasible side are left out, and counted.
"""

from __future__ import annotations

import numpy as np

from mcsim.results.figures.common import (
    Tally,
    boxplot,
    fixed_note,
    log_scale,
    new_figure,
    point_handles,
    sample_points,
    suptitle,
    tick_text,
    values,
)
from mcsim.results.layout import Series, _Layout, _meta, _slug, is_percent
from mcsim.results.summary import DIFFERENCE

MAX_PANELS = 4
MAX_ROWS = 12


def reference_index(layout: _Layout, d: str) -> int:
    """The reference of dim ``d``: the baseline among variants, else the focus value."""
    if d == "variant" and "baseline" in layout.variants:
        return layout.variants.index("baseline")
    return layout.focus[layout.dims.index(d)]


def paired(ds, layout: _Layout, s: Series, d: str, tally: Tally | None = None) -> tuple[list[dict], int]:
    """Per-sample comparison of every value of dim ``d`` with its reference, other dims at the focus.

    ``tally`` (a :class:`~.common.Tally` of pairs), when given, counts the pairs compared.

    Returns
    -------
    rows : list of dict
        One per compared value: ``value``, ``kind`` (``"ratio"`` or ``"difference"``), ``paired`` (per-sample
        ratios or differences, pairs with a missing side left out), ``unsteady`` (for each of those, whether
        either run had not reached steady state), ``higher`` and ``lower`` (shares of those pairs where the value
        is above or below the reference).
    hidden : int
        Pairs left out because a side is infeasible.
    """
    data, _ = values(ds, layout, s)
    tally = tally or Tally(ds, layout, unit="pairs")
    hidden = 0
    axis = layout.dims.index(d)
    ref = reference_index(layout, d)
    kind = "difference" if is_percent(ds, s.name) or s.name in DIFFERENCE else "ratio"
    rows = []
    for i, value in enumerate(layout.coords[d]):
        if i == ref:
            continue
        if len(rows) == MAX_ROWS:
            break
        at = list(layout.focus)
        at[axis] = i
        here, here_at = data[tuple(at)], tuple(at)
        at[axis] = ref
        there = data[tuple(at)]
        with np.errstate(divide="ignore", invalid="ignore"):
            diff = here / there if kind == "ratio" else here - there
        bad, slow = tally.add(here_at, tuple(at), drawn_values=diff)
        hidden += int(bad.sum())
        ok = np.isfinite(diff)
        n = int(ok.sum())
        rows.append({"value": value, "kind": kind, "paired": diff[ok], "unsteady": slow[ok],
                     "higher": float(np.mean(here[ok] > there[ok])) if n else np.nan,
                     "lower": float(np.mean(here[ok] < there[ok])) if n else np.nan})
    return rows, hidden


def paired_figure(ds, layout: _Layout, series: list[Series], d: str):
    """Per-sample ratios (or differences) against the reference of dim ``d``: ``(file name, Figure)``."""
    series = series[:MAX_PANELS]
    ref = layout.coords[d][reference_index(layout, d)]
    ref_name = tick_text(ref, 24) if d == "variant" else f"{layout.label(d)}={tick_text(ref, 24)}"
    count = min(len(layout.coords[d]) - 1, MAX_ROWS)
    fig = new_figure(max(7.0, 2.0 + 3.3 * len(series)), max(3.4, 2.3 + 0.42 * count))
    tallies, panels = [], []
    first = None
    for k, s in enumerate(series):
        ax = fig.add_subplot(1, len(series), k + 1, sharey=first)
        first = first or ax
        tallies.append(Tally(ds, layout, unit="pairs"))
        rows, _ = paired(ds, layout, s, d, tallies[-1])
        steady_drawn = False
        kind = rows[0]["kind"] if rows else "ratio"
        centre = 1.0 if kind == "ratio" else 0.0
        for y, r in enumerate(rows):
            v = r["paired"]
            if v.size == 0:
                continue
            if np.all(v == v[0]):
                ax.plot([v[0], v[0]], [y - 0.3, y + 0.3], color="C0", lw=2.5)
            else:
                parts = boxplot(ax, [v], True, positions=[y], widths=0.6, whis=(5, 95), showfliers=False,
                                patch_artist=True, manage_ticks=False)
                parts["boxes"][0].set_facecolor("C0")
                parts["boxes"][0].set_alpha(0.5)
                parts["medians"][0].set_color("black")
            steady_drawn |= sample_points(ax, y, v, r["unsteady"], 0.45, True)
            equal = 1.0 - r["higher"] - r["lower"]
            share = f"higher {100 * r['higher']:.0f} %, lower {100 * r['lower']:.0f} %" + (
                f", equal {100 * equal:.0f} %" if equal > 0.005 else "")
            ax.text(0.98, y - 0.33, share,
                    transform=ax.get_yaxis_transform(), ha="right", va="bottom", fontsize=7, color="0.25")
        ax.axvline(centre, color="C3", lw=1)
        everything = np.concatenate([r["paired"] for r in rows]) if rows else np.array([])
        if kind == "ratio" and everything.size and everything.min() > 0 and everything.max() / everything.min() > 20:
            log_scale(ax, "x")
        units = "percentage points" if is_percent(ds, s.name) else _meta(ds, s.name)[1]
        what = f"ratio to {ref_name}" if kind == "ratio" else f"minus {ref_name} ({units})"
        ax.set_xlabel(f"{s.label}\n{what}", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(axis="x", alpha=0.3)
        ax.set_ylim(count - 0.5, -0.7)
        if k == 0:
            ax.set_yticks(range(count), [tick_text(r["value"], 20) for r in rows], fontsize=8)
        else:
            ax.tick_params(labelleft=False)
        panels.append((ax, point_handles(tallies[-1], steady_drawn)))
    # one legend below the plots says it all when every panel counts the same runs; else each panel has its own
    labels = {tuple(h.get_label() for h in handles) for _, handles in panels}
    if len(labels) == 1 and panels[0][1]:
        fig.legend(handles=panels[0][1], fontsize=7, loc="outside lower center", ncols=len(panels[0][1]))
    elif len(labels) > 1:
        for ax, handles in panels:
            if handles:
                ax.legend(handles=handles, fontsize=7, loc="best")
    steady_drawn = any(h.get_label() == "sample" for _, handles in panels for h in handles)
    notes = [f"each box: the {layout.samples} samples compared one by one (same random streams); box 25-75 %, "
             "whiskers 5-95 %; 'higher' and 'lower' are shares of samples",
             "a point per sample, hollow where either run had not reached steady state" if steady_drawn else
             "hollow points: samples where either run had not reached steady state"
             if any(t.unsteady for t in tallies) else "",
             tallies[0].infeasible_note() if tallies else "",  # the same runs are infeasible in every panel
             fixed_note(layout, [d])]
    suptitle(fig, f"Paired comparison over {layout.label(d)}, against {ref_name} (modelled)", notes)
    return f"paired_{_slug(layout.label(d))}.png", fig

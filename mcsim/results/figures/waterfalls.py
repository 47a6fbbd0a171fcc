"""Baseline -> factory waterfalls, every bar in the metric's units (see :mod:`mcsim.results.waterfall`).

A waterfall aggregates over samples and over the variants behind its bars; its subtitle says how many samples were
infeasible in some variant (their undefined values left out) or had not reached steady state in some (kept).
"""

from __future__ import annotations

import numpy as np
from matplotlib.patches import Patch

from mcsim.results.figures.common import fixed_note, fmt, new_figure, suptitle, tick_text, unsteady
from mcsim.results.layout import _Layout, _meta, _slug, display_scale, infeasible
from mcsim.results.waterfall import Waterfall, waterfall

#: Metrics of the baseline -> factory waterfall when the run has no Shapley variables.
WATERFALL_METRICS = ("cost_usd_per_mtok", "gross_margin", "decode_tok_s_per_gpu")


def waterfall_metrics(ds) -> list[str]:
    shapley = [n.removeprefix("shapley_") for n in ds.data_vars
               if n.startswith("shapley_") and not n.startswith("shapley_share_") and "lever" in ds[n].dims
               and n.removeprefix("shapley_") in ds]
    return shapley or [m for m in WATERFALL_METRICS if m in ds]


def bars(w: Waterfall, factor: float = 1.0) -> list[tuple]:
    """The drawn bars ``(label, bottom, height, kind)`` of a waterfall, in display units (x ``factor``).

    ``kind`` is ``"end"`` for the baseline and factory bars, ``"step"`` for a lever and ``"rest"`` for what
    one-at-a-time steps leave of the change.
    """
    out = [("baseline", 0.0, w.start * factor, "end")]
    level = w.start * factor
    for lever, delta in w.steps:
        delta = float(delta) * factor if np.isfinite(delta) else 0.0
        out.append((lever, level, delta, "step"))
        level += delta
    rest = w.end * factor - level
    if w.steps and not w.exact and np.isfinite(rest) and abs(rest) > 1e-9 * max(abs(w.start), abs(w.end), 1e-300):
        out.append(("interactions /\nmedians not additive", level, rest, "rest"))
    out.append(("factory", 0.0, w.end * factor, "end"))
    return out


def sample_notes(ds, layout: _Layout) -> list[str]:
    """How many samples at the focus grid point are infeasible, or not at steady state, in some variant."""
    grid = layout.focus[:len(layout.axes)]
    bad = infeasible(ds, layout)[grid]  # (variant, sample)
    slow = unsteady(ds, layout)[grid]
    # a sample infeasible in some variant is counted as such only, so the two counts never overlap
    bad, slow = bad.any(axis=0), slow.any(axis=0) & ~bad.any(axis=0)
    n = layout.samples
    k_bad, k_slow = int(bad.sum()), int(slow.sum())
    return [f"{k_bad} of {n} samples infeasible in some variant (their undefined values left out)" if k_bad else "",
            f"{k_slow} of {n} samples not at steady state in some variant (kept: their values still depend on "
            "mc.requests)" if k_slow else ""]


def waterfall_figure(ds, layout: _Layout, metric: str):
    """``(file name, Figure, Waterfall)`` of one metric at the focus grid point."""
    w = waterfall(ds, metric, layout)
    factor, units = display_scale(ds, metric)
    drawn = bars(w, factor)
    labels = [b[0] for b in drawn]
    bottoms = np.array([b[1] for b in drawn], dtype=float)
    heights = np.array([b[2] for b in drawn], dtype=float)
    colors = ["0.45" if k == "end" and i == 0 else "C0" if k == "end" else "0.75" if k == "rest"
              else ("C2" if h >= 0 else "C3") for i, (_, _, h, k) in enumerate(drawn)]
    fig = new_figure(max(7.0, 1.6 + 0.95 * len(labels)), 5.0)
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    finite = np.isfinite(heights) & np.isfinite(bottoms)
    ax.bar(x[finite], heights[finite], bottom=bottoms[finite], color=[c for c, f in zip(colors, finite) if f],
           edgecolor="black", linewidth=0.5)
    step = 0
    for xi, b, h, (_, _, _, kind) in zip(x, bottoms, heights, drawn):
        if not np.isfinite(b + h):
            continue
        text = fmt(h) if kind == "end" else f"{'+' if h >= 0 else ''}{fmt(h)}"
        if kind == "step" and w.factors:
            text += f"\nx{w.factors[step]:.3g}"
        step += kind == "step"
        ax.text(xi, b + h if h >= 0 else b + h, text, ha="center", va="bottom" if h >= 0 else "top", fontsize=7)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(x, [tick_text(lab, 14) for lab in labels], rotation=30 if len(labels) > 5 else 0,
                  ha="right" if len(labels) > 5 else "center", fontsize=8)
    ax.set_ylabel(f"{_meta(ds, metric)[0]} ({units})", fontsize=9)
    if w.steps:
        ax.legend(handles=[Patch(color="C2", label="lever raises it"), Patch(color="C3", label="lever lowers it")],
                  fontsize=8, loc="best")
    ends = np.concatenate([[0.0], bottoms[finite], (bottoms + heights)[finite]])
    pad = 0.15 * (ends.max() - ends.min() or 1.0)  # room for the value labels; bars' sticky edges defeat margins
    ax.set_ylim(ends.min() - (pad if ends.min() < 0 else 0), ends.max() + pad)
    ax.grid(axis="y", alpha=0.3)
    counted = (f"{w.samples} samples" + (f" ({w.left_out} with an undefined value left out)" if w.left_out else "")
               if w.exact else f"medians over {layout.samples} samples")
    suptitle(fig, f"Baseline -> factory: {_meta(ds, metric)[0]} ({units}, modelled)",
             [counted, w.how, "x: the lever's factor" if w.factors else "", *sample_notes(ds, layout),
              fixed_note(layout, ["variant"])])
    return f"waterfall_{_slug(metric)}.png", fig, w

"""What every figure of the report shares: bare Agg figures, titles that wrap, values in display units."""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mcsim.results.layout import (
    Series,
    _array,
    _fmt,
    _Layout,
    _text,
    display_scale,
    infeasible,
    path_units,
)

DPI = 110
#: Characters of title text per inch of figure width at the title's font size (9 pt).
CHARS_PER_INCH = 12
#: Longest tick label before it is wrapped onto more lines.
TICK_CHARS = 16


def new_figure(width: float, height: float):
    """A bare Figure on an Agg canvas: no pyplot, so the caller's backend and global figure state stay untouched."""
    fig = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def save(fig, path: Path) -> str:
    fig.savefig(path, dpi=DPI)
    return path.name


def wrap(text: str, width: int) -> str:
    return "\n".join(textwrap.fill(part, width=max(20, width)) for part in text.split("\n"))


def suptitle(fig, head: str, notes: list[str], warning: str = "") -> None:
    """A headline and notes across the whole figure, wrapped to its width so nothing is cut off."""
    width = int(fig.get_figwidth() * CHARS_PER_INCH)
    body = "; ".join(n for n in notes if n)
    text = wrap(head, width) + ("\n" + wrap(body, int(width * 1.1)) if body else "")
    fig.suptitle(text, fontsize=9)
    if warning:
        # a caution that belongs to the figure, not a footnote: in red under the plots
        fig.supxlabel(wrap(warning, int(width * 1.1)), fontsize=8, color="C3")


def tick_text(v, width: int = TICK_CHARS) -> str:
    """A tick label: a grid value or variant name, wrapped at ``:``, ``+`` and spaces when long."""
    text = _text(v)
    if len(text) <= width:
        return text
    return textwrap.fill(text.replace(":", ": ").replace("+", "+ "), width=width).replace(": ", ":")


def dim_label(ds, layout: _Layout, d: str) -> str:
    """An axis label for a grid axis (its dotted path and, from its name, its units) or the variant dim."""
    label = layout.label(d)
    attrs = ds[d].attrs if d in ds.variables else {}
    units = str(attrs.get("display_units") or attrs.get("units") or "")
    units = path_units(label) if units in ("", "1") else units
    return f"{label} ({units})" if units and d != "variant" else label


def values(ds, layout: _Layout, s: Series) -> tuple[np.ndarray, np.ndarray]:
    """``s`` in display units as (*layout.dims, sample) with infeasible samples as NaN, and where they were.

    An infeasible sample has no defined performance or money figures; its latency or payback would only stretch
    the scales, so figures leave every one of its values out (and say how many, of the samples they draw).
    """
    factor = display_scale(ds, s.name)[0]
    data = _array(ds, layout, layout.dims, s.name, s.select) * factor
    bad = infeasible(ds, layout)
    if s.name == "feasible":
        return data, np.zeros_like(bad)
    return np.where(bad, np.nan, data), bad


def infeasible_note(count: int, total: int) -> str:
    return f"{count} of {total} infeasible samples left out" if count else ""


def fixed_note(layout: _Layout, shown: list[str]) -> str:
    """Which value the dims not drawn are held at."""
    fixed = [f"{layout.label(d)}={_text(layout.at(d))}" for d in layout.dims if d not in shown
             and len(layout.coords[d]) > 1]
    return f"at {', '.join(fixed)}" if fixed else ""


def fmt(x: float) -> str:
    return _fmt(float(x))


def constant_value(values: np.ndarray):
    """The single value of a non-empty array without spread, else None."""
    finite = values[np.isfinite(values)]
    if finite.size and np.all(finite == finite[0]):
        return float(finite[0])
    return None


def boxplot(ax, data: list, horizontal: bool, **kwargs) -> dict:
    """``ax.boxplot`` laid out vertically or horizontally (``orientation`` from matplotlib 3.10, ``vert`` before)."""
    major, minor = (int(p) for p in matplotlib.__version__.split(".")[:2])
    if (major, minor) >= (3, 10):
        kwargs["orientation"] = "horizontal" if horizontal else "vertical"
    else:
        kwargs["vert"] = not horizontal
    return ax.boxplot(data, **kwargs)


def has_values(ds, s) -> bool:
    """Whether a reported series has any finite value (NaN everywhere: nothing to draw)."""
    da = ds[s.name]
    if s.select:
        da = da.sel(dict(s.select))
    return bool(np.isfinite(np.asarray(da.values, dtype=float)).any())

"""What every figure of the report shares: bare Agg figures, titles that wrap, values in display units, log axes
labelled in plain text, and how samples that are infeasible or not at steady state are counted and marked."""

from __future__ import annotations

import textwrap
from collections import Counter
from pathlib import Path

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogFormatter

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
from mcsim.results.variables import FEASIBLE_REASONS

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


def unsteady(ds, layout: _Layout) -> np.ndarray:
    """Boolean (*layout.dims, sample): the sample runs that did not reach steady state (``steady_state == 0``).

    Their figures are kept but still depend on ``mc.requests`` (see :mod:`mcsim.stages.steady_state`); results
    written before the check have no ``steady_state`` and count as steady.
    """
    if "steady_state" not in ds:
        return np.zeros(layout.shape + (layout.samples,), dtype=bool)
    return _array(ds, layout, layout.dims, "steady_state") == 0


def reason_codes(ds, layout: _Layout) -> np.ndarray:
    """``infeasible_reason`` as (*layout.dims, sample) indices into :data:`FEASIBLE_REASONS` (0 = ok; -1 unknown)."""
    if "infeasible_reason" not in ds:
        return np.full(layout.shape + (layout.samples,), -1)
    codes = _array(ds, layout, layout.dims, "infeasible_reason")
    return np.where(np.isfinite(codes), codes, -1).astype(int)


class Tally:
    """What the sample runs one figure draws were: how many, which infeasible (and why), which not at steady state.

    A figure calls :meth:`add` for each block of runs it draws and puts :meth:`notes` (or, where it marks the
    runs one by one, :meth:`unsteady_label` in a legend) on the figure, so every figure counts alike.

    Parameters
    ----------
    ds : xarray.Dataset
        The result.
    layout : _Layout
        Its grid axes and variants.
    left_out : bool
        Whether infeasible runs are left out (False for the figure of ``feasible`` itself, which draws them).
    unit : str
        What is counted: ``"samples"``, or ``"pairs"`` where two runs of a sample are compared.

    Examples
    --------
    >>> tally = Tally(ds, layout)                                   # doctest: +SKIP
    >>> bad, slow = tally.add(layout.focus)                         # doctest: +SKIP
    >>> tally.notes()                                               # doctest: +SKIP
    ['2 of 20 samples infeasible, left out (SLO not met: 2)',
     '5 of 18 samples not at steady state (kept: their values still depend on mc.requests)']
    """

    def __init__(self, ds, layout: _Layout, left_out: bool = True, unit: str = "samples"):
        self.bad = infeasible(ds, layout) if left_out else np.zeros(layout.shape + (layout.samples,), dtype=bool)
        self.slow = unsteady(ds, layout)
        self.codes = reason_codes(ds, layout)
        self.unit = unit
        self.total = self.infeasible = self.drawn = self.unsteady = 0
        self.reasons: Counter = Counter()

    def add(self, index, ref=None, drawn_values: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Count the runs at ``index`` (paired with those at ``ref``, if given); ``drawn_values``: what is drawn.

        A pair is infeasible when either side is, and not at steady state when either side is. Runs whose drawn
        value is not finite (a payback that never comes) are not counted as drawn.

        Returns
        -------
        infeasible, unsteady : numpy.ndarray
            Boolean masks over the runs (or pairs); ``unsteady`` only where the run is feasible.
        """
        bad, slow = self.bad[index], self.slow[index]
        for at in (index,) if ref is None else (index, ref):
            self.reasons.update(int(c) for c in self.codes[at][self.bad[at]] if c > 0)
        if ref is not None:
            bad, slow = bad | self.bad[ref], slow | self.slow[ref]
        slow = slow & ~bad
        drawn = ~bad if drawn_values is None else ~bad & np.isfinite(drawn_values)
        self.total += bad.size
        self.infeasible += int(bad.sum())
        self.drawn += int(drawn.sum())
        self.unsteady += int((slow & drawn).sum())
        return bad, slow

    def infeasible_note(self) -> str:
        """``"4 of 20 samples infeasible, left out (SLO not met: 3, weights do not fit in HBM: 1)"``, or ``""``."""
        if not self.infeasible:
            return ""
        why = ", ".join(f"{FEASIBLE_REASONS[c] if c < len(FEASIBLE_REASONS) else f'reason {c}'}: {k}"
                        for c, k in self.reasons.most_common())
        runs = " runs" if self.unit == "pairs" and why else ""
        subject = f"{self.unit} with an infeasible side" if self.unit == "pairs" else f"{self.unit} infeasible"
        return f"{self.infeasible} of {self.total} {subject}, left out" + (f" ({why}{runs})" if why else "")

    def unsteady_label(self) -> str:
        """The legend entry of the runs drawn hollow: ``"not at steady state (5 of 16)"``."""
        return f"not at steady state ({self.unsteady} of {self.drawn})"

    def unsteady_note(self) -> str:
        """For figures that aggregate over samples: ``"5 of 16 samples not at steady state (kept; ...)"``, or ``""``."""
        if not self.unsteady:
            return ""
        return (f"{self.unsteady} of {self.drawn} {self.unit} not at steady state (kept: their values still depend "
                "on mc.requests)")

    def notes(self) -> list[str]:
        return [self.infeasible_note(), self.unsteady_note()]


#: Most samples of one box drawn as points as well (filled: steady, hollow: not at steady state); above it only
#: the runs not at steady state are drawn over the box, which stands for the others.
STRIP_MAX = 30
#: Marker styles of a drawn sample run: steady, and not at steady state (hollow).
STEADY_MARKER = {"marker": "o", "ms": 2.8, "mfc": "0.15", "mec": "none", "alpha": 0.7, "linestyle": "none"}
UNSTEADY_MARKER = {"marker": "o", "ms": 5.5, "mfc": "none", "mec": "black", "mew": 1.0, "linestyle": "none"}


def sample_points(ax, pos: float, values: np.ndarray, slow: np.ndarray, spread: float, horizontal: bool) -> bool:
    """Draw the runs of one box as points across ``pos`` (``spread`` wide); whether steady ones were drawn.

    The spread is a fixed pseudo-random jitter (the same picture on every run) so that equal values stay visible.
    """
    finite = np.isfinite(values)
    every = int(finite.sum()) <= STRIP_MAX
    shown = finite if every else finite & slow
    if not shown.any():
        return False
    across = pos + spread * (np.random.default_rng(0).uniform(-0.5, 0.5, values.size))
    for mask, style in ((shown & ~slow, STEADY_MARKER), (shown & slow, UNSTEADY_MARKER)):
        if mask.any():
            xy = (values[mask], across[mask]) if horizontal else (across[mask], values[mask])
            ax.plot(*xy, **style, zorder=4)
    return every


def point_handles(tally: Tally, steady_drawn: bool) -> list:
    """Legend entries of the drawn points: ``sample`` (when steady runs were drawn) and the hollow runs."""
    handles = [Line2D([], [], **STEADY_MARKER, label="sample")] if steady_drawn else []
    if tally.unsteady:
        handles.append(Line2D([], [], **UNSTEADY_MARKER, label=tally.unsteady_label()))
    return handles


#: Superscript digits, for powers of ten written as plain text.
SUPERSCRIPTS = str.maketrans("-0123456789",
                             "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def log_tick_text(x: float) -> str:
    """A log axis's tick label as plain text: ``0.05``, ``0.5``, ``1``, ``2``, ``1,000``; ``10⁻⁵``, ``2×10⁶`` beyond.

    Examples
    --------
    >>> [log_tick_text(x) for x in (0.05, 0.5, 1.0, 2.0, 3000.0, 1e-5, 2e6)]
    ['0.05', '0.5', '1', '2', '3,000', '10⁻⁵', '2×10⁶']
    """
    if not np.isfinite(x) or x <= 0:
        return ""
    exponent = int(np.floor(np.log10(x) + 1e-9))
    if -4 <= exponent < 6:
        return f"{x:,.{max(0, -exponent)}f}"
    mantissa = x / 10.0 ** exponent
    power = "10" + str(exponent).translate(SUPERSCRIPTS)
    return power if abs(mantissa - 1) < 1e-6 else f"{mantissa:.2g}\u00d7{power}"


class PlainLogFormatter(LogFormatter):
    """Matplotlib's choice of which log ticks to label, each label in plain text (:func:`log_tick_text`).

    Matplotlib's own log formatter writes mathtext (``$\\mathdefault{10^{0}}$``), but the report draws with
    ``text.parse_math`` off, so that scenario text with a ``$`` stays text, and would print those labels raw.
    """

    def __call__(self, x, pos=None):
        return log_tick_text(x) if super().__call__(x, pos) else ""


def log_scale(ax, which: str) -> None:
    """Make the ``"x"`` or ``"y"`` axis of ``ax`` logarithmic, labelled by :class:`PlainLogFormatter`."""
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")
    axis = ax.xaxis if which == "x" else ax.yaxis
    axis.set_major_formatter(PlainLogFormatter(labelOnlyBase=False))
    axis.set_minor_formatter(PlainLogFormatter(labelOnlyBase=False))


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

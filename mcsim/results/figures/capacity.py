"""The figure of a ``mcsim capacity`` result: where each sample's SLOs broke, and the capacity over samples.

Left: every rate each sample's bisection ran, in order (filled where the SLOs held, crossed where they broke), so
a reader sees the bracket narrow to the sample's ``capacity_rps``. Right: the capacity over samples as an empirical
distribution with its 5, 50 and 95 % quantiles marked: the rate a deployment can take with a stated probability.
"""

from __future__ import annotations

import numpy as np

from mcsim.results.figures.common import fmt, new_figure, suptitle

#: Samples whose bisections are drawn (the first ones; the distribution uses every sample).
MOST_PATHS = 40


def capacity_figure(ds):
    """``("capacity.png", Figure)`` of a capacity result (attribute ``capacity_result``)."""
    rates = np.asarray(ds["rate_tried_rps"].values, dtype=float)  # (sample, trial), NaN pad
    met = np.asarray(ds["slo_met_tried"].values, dtype=float)
    capacity = np.asarray(ds["capacity_rps"].values, dtype=float)
    fig = new_figure(9.0, 4.2)
    paths, spread = fig.subplots(1, 2)
    shown = min(len(rates), MOST_PATHS)
    for i in range(shown):
        ran = np.isfinite(rates[i])
        x = np.flatnonzero(ran) + 1
        paths.plot(x, rates[i][ran], color="0.75", lw=0.8, zorder=1)
        held = ran & (met[i] == 1)
        broke = ran & (met[i] == 0)
        paths.scatter(np.flatnonzero(held) + 1, rates[i][held], s=14, color="C2", zorder=2,
                      label="SLOs met" if i == 0 else None)
        paths.scatter(np.flatnonzero(broke) + 1, rates[i][broke], s=18, color="C3", marker="x", zorder=2,
                      label="SLOs broken" if i == 0 else None)
    paths.set_xlabel("run of the bisection")
    paths.set_ylabel("arrival rate tried (requests/s)")
    paths.set_title(f"each sample's bisection ({shown} of {len(rates)} samples)", fontsize=9)
    paths.legend(fontsize=8, loc="best")

    finite = np.sort(capacity[np.isfinite(capacity)])
    if finite.size:
        spread.step(finite, np.arange(1, finite.size + 1) / finite.size, where="post", color="C0")
        for q, style in ((0.05, ":"), (0.5, "-"), (0.95, ":")):
            value = float(np.quantile(finite, q))
            spread.axvline(value, color="0.3", ls=style, lw=1)
            right = q > 0.5  # the top quantile's label to the left of its line, inside the axes
            spread.annotate(f"{q:.0%}: {fmt(value)}", (value, q), textcoords="offset points",
                            xytext=(-4 if right else 4, -10), ha="right" if right else "left", fontsize=8)
        spread.set_ylim(0, 1.02)
    else:
        spread.text(0.5, 0.5, "no sample met its SLOs at any rate tried", ha="center", va="center",
                    transform=spread.transAxes, fontsize=9)
    spread.set_xlabel("capacity_rps: highest rate meeting the SLOs (requests/s)")
    spread.set_ylabel("share of samples at or below")
    spread.set_title("capacity over samples", fontsize=9)
    unbracketed = int(np.sum(np.asarray(ds["capacity_outcome"].values) != 0))
    notes = [f"SLOs: {ds.attrs.get('capacity_slo', '?')}", f"deployment: {ds.attrs.get('capacity_deployment', '?')}",
             f"bracketed within {float(ds.attrs.get('capacity_rtol', np.nan)):.0%}"]
    warning = (f"{unbracketed} of {len(capacity)} samples were not bracketed (see capacity_outcome): their capacity "
               "is a bound or missing" if unbracketed else "")
    suptitle(fig, f"Capacity of {ds.attrs.get('scenario_name', 'the scenario')} (modelled)", notes, warning)
    return "capacity.png", fig

"""The result of ``mcsim capacity``: its Dataset and its summary.

Dim ``sample``. Every result variable of a run is there (same names, units and attributes,
:mod:`mcsim.results.variables`), for the run of each sample at its ``capacity_rps``; a sample that met its SLOs at
no rate tried shows its run at the lowest rate tried, one that cannot run at all its infeasible row (NaN). The
capacity's own variables:

``capacity_rps``
    The highest arrival rate tried at which the sample met its SLOs (NaN when none did).
``breaking_rps``
    The lowest rate tried above it at which the SLOs broke (NaN when none did): the capacity lies between the two.
``capacity_outcome``
    A CF flag: bracketed, or why not (met at the highest rate tried: ``capacity_rps`` is a lower bound; not met at
    the lowest; infeasible at every rate).
``rate_tried_rps`` / ``slo_met_tried``
    Every rate the bisection ran, in order, along ``trial``, and whether the SLOs held there (-1 and NaN pad).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from mcsim.results import dataset as results
from mcsim.results.summary import _fmt, band, kernel_data_note, steady_state_note
from mcsim.tables import paragraph, table, terminal_width

#: Marks a capacity result.
CAPACITY_MARK = "capacity_result"

#: Outcomes of a sample's bisection, as ``capacity_outcome`` flags.
OUTCOMES = ("bracketed", "SLOs met at the highest rate tried", "SLOs not met at the lowest rate tried",
            "infeasible")

_RATE = {"units": "1/s", "display_units": "requests/s", "cell_methods": "sample: point", "source": "modelled"}


def capacity_dataset(outcomes: list[dict], draws: dict, attrs: dict) -> xr.Dataset:
    """The Dataset of every sample's bisection (:func:`mcsim.optimize.capacity.sample_capacity`'s dicts, in
    sample order) with the uncertain inputs ``draws`` and the run's ``attrs``."""
    n = len(outcomes)
    table_ = results.rows_to_table([o["row"] for o in outcomes], ("factory",))
    ds = results.dataset_from_table(table_, ("factory",), np.arange(n), draws, attrs)
    trials = max(o["trials"] for o in outcomes)
    rates = np.full((n, trials), np.nan)
    met = np.full((n, trials), -1, dtype=np.int8)
    for i, o in enumerate(outcomes):
        rates[i, :o["trials"]] = o["rates_tried_rps"]
        met[i, :o["trials"]] = o["slo_met_tried"]
    ds["capacity_rps"] = ("sample", np.array([o["capacity_rps"] for o in outcomes]), {
        **_RATE, "long_name": "highest arrival rate meeting the SLOs",
        "description": "The highest arrival rate tried at which the sample's fixed fleet met its SLOs "
                       "(attrs capacity_slo); NaN when it met them at no rate tried."})
    ds["breaking_rps"] = ("sample", np.array([o["breaking_rps"] for o in outcomes]), {
        **_RATE, "long_name": "lowest arrival rate breaking the SLOs",
        "description": "The lowest rate tried above capacity_rps at which the SLOs broke; NaN when none did."})
    ds["capacity_outcome"] = ("sample", np.array([o["outcome"] for o in outcomes], dtype=np.int8), {
        "long_name": "outcome of the rate bisection", "units": "1",
        "flag_values": np.arange(len(OUTCOMES), dtype=np.int8),
        "flag_meanings": " ".join(results.flag_meaning(o) for o in OUTCOMES), "cell_methods": "sample: point",
        "source": "modelled"})
    ds["rate_tried_rps"] = (("sample", "trial"), rates, {
        **_RATE, "long_name": "arrival rate of each run of the bisection",
        "description": "The rates the sample ran, in the order the bisection ran them (NaN pads)."})
    ds["slo_met_tried"] = (("sample", "trial"), met, {
        "long_name": "SLOs met at the rate tried", "units": "1", "_FillValue": np.int8(-1),
        "description": "1 where the run at rate_tried_rps met the SLOs, 0 where it broke them (-1 pads).",
        "cell_methods": "sample: point", "source": "modelled"})
    ds["trial"] = ("trial", np.arange(trials), {"long_name": "run of the bisection", "units": "1"})
    return ds


def capacity_summary(ds: xr.Dataset) -> dict:
    """Counts by outcome, the capacity's median and 5-95 % band over the samples that have one, and what the
    deployment does there."""
    outcome = ds["capacity_outcome"].values
    counts = {o: int((outcome == k).sum()) for k, o in enumerate(OUTCOMES)}
    at = {"ttft_at_slo_quantile_s": "s", "tpot_at_slo_quantile_s": "s", "decode_tok_s_per_gpu": "tokens/s/GPU",
          "gpus": "GPUs", "cost_usd_per_mtok": "USD/Mtok"}
    met = outcome <= 1
    return {
        "capacity_rps": band(ds["capacity_rps"].values),
        "breaking_rps": band(ds["breaking_rps"].values),
        "outcomes": counts,
        "at_capacity": {name: {**band(ds[name].values[met]), "units": units} for name, units in at.items()},
        "deployment": ds.attrs.get("capacity_deployment", ""),
        "slo": ds.attrs.get("capacity_slo", ""),
        "rtol": float(ds.attrs.get("capacity_rtol", math.nan)),
        "samples": int(ds.sizes["sample"]),
        "requests_per_sample": int(ds.attrs.get("requests_per_sample", 0)),
    }


def format_capacity(ds: xr.Dataset, width: int | None = None) -> str:
    """The summary as text: the capacity's band, the outcomes, the figures at capacity."""
    width = width or terminal_width()
    s = capacity_summary(ds)

    def cell(b):
        return f"{_fmt(b['median'])} [{_fmt(b['p5'])}, {_fmt(b['p95'])}]"

    rows = [["capacity_rps", "requests/s", cell(s["capacity_rps"])],
            ["breaking_rps", "requests/s", cell(s["breaking_rps"])]]
    rows += [[f"{name} at capacity", b["units"], cell(b)] for name, b in s["at_capacity"].items()]
    lines = table([["", "units", "median [5 %, 95 %]"], *rows], width=width)
    n = s["samples"]
    lines += [""]
    lines += paragraph(f"deployment: {s['deployment']}; SLOs: {s['slo']}.", width)
    outcome = "; ".join(f"{o}: {k} of {n}" for o, k in s["outcomes"].items() if k)
    lines += paragraph(f"samples by outcome: {outcome}.", width)
    if s["outcomes"]["SLOs met at the highest rate tried"]:
        lines += paragraph("capacity_rps is a lower bound where the SLOs held at the highest rate tried (raise "
                           "--high, or drop it).", width)
    for note in steady_state_note(ds, runs="samples' runs at capacity") + kernel_data_note(ds):
        lines += paragraph(note, width)
    lines += paragraph(f"{n} samples x {s['requests_per_sample']} requests; each sample bisected on its own common "
                       f"random numbers until the rate that met and the rate that broke the SLOs are within "
                       f"{100 * s['rtol']:g} % (rtol); cells are median [5 %, 95 %] over samples; every figure is "
                       "modelled.", width)
    return "\n".join(lines)

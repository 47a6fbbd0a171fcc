"""The report of a result Dataset: quantile tables, sensitivity to the uncertain inputs, figures, a Markdown summary.

:func:`write_report` is what ``mcsim report RESULTS.nc -o DIR`` calls; notebooks can call it too. It reads any result
Dataset mcsim writes: zero or more grid axes (dimension and coordinate named by a dotted scenario path), an optional
``variant`` dim, the ``sample`` dim, vector metrics over ``tier`` or ``request_quantile``, uncertain inputs (``role =
"input"``, dims ``("sample",)``) and, for ablations, ``shapley_<metric>`` variables over a ``lever`` dim.

Files written into the output folder:

- ``quantiles.csv`` / ``quantiles.json`` — 5/25/50/75/95 % quantiles over samples per metric, grid point and variant;
- ``sensitivity.csv`` — Spearman, PRCC (with a bootstrap interval at the plotted point) and first-order Sobol
  indices of the headline outputs for every uncertain input, per grid point and variant;
- ``dist_<metric>.png`` (box plots over samples), ``paired_<dim>.png`` (each sample against itself at a reference
  grid value or variant), ``load_<path>.png`` (SLO attainment and queue wait when a grid axis varies the load),
  ``tornado_<metric>.png``, ``heatmap_<metric>.png`` (two or more grid axes), ``waterfall_<metric>.png``
  (baseline -> factory, in the metric's units);
- ``summary.md`` — run description, headline table, top sensitivities, the figures.

A search result (``mcsim search``, attribute ``search_result``) gets the report of
:mod:`mcsim.results.search_report` instead: the two Pareto figures, ``regret.csv`` and its own ``summary.md``.

The figures show every grid point where it reads well (groups, colours, small multiples); dims they do not show are
held at the *focus point*: the first value of each grid axis and the factory variant, or what ``at`` chooses.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.fileio import earlier_output_folder, output_folder, readable_kind
from mcsim.results import sensitivity
from mcsim.results.dataset import MODEL_STATEMENT
from mcsim.results.figures import draw_figures
from mcsim.results.figures.common import has_values
from mcsim.results.figures.tornado import SAMPLES_PER_INPUT, few_samples_warning, s1_text
from mcsim.text import markdown_text, strict_json
from mcsim.results.search_report import write_search_files
from mcsim.results.layout import (  # quantiles, waterfall_steps, ReportError and LEVELS are part of this API
    LEVELS,
    ReportError,
    Series,
    _array,
    _fmt,
    _Layout,
    _meta,
    _plain,
    _text,
    is_percent,
    path_of,
    quantiles,
    request_quantile_dim,
)
from mcsim.results.summary import (NOT_JUDGED, PROFILE_DRIFT, compares_like_hours, infeasible_lines,
                                   infeasible_summary, not_judged_facts, simulated_requests, steady_state_facts,
                                   under_rate_profile)
from mcsim.results.variables import HEADLINE, WORKLOAD_CLASS
from mcsim.results.waterfall import waterfall_steps

#: Per-request quantiles reported for latency metrics that carry a ``request_quantile`` dim.
REQUEST_QUANTILES = (0.5, 0.99)
#: Outputs whose sensitivity to the uncertain inputs is reported (those present).
SENSITIVITY_OUTPUTS = ("gross_margin", "cost_usd_per_mtok", "decode_tok_s_per_gpu", "ttft_s", "tpot_s")
MAX_TABLE_ROWS = 30
#: What a capacity result's report leads with.
CAPACITY_HEADLINE = ("capacity_rps", "breaking_rps")
BOOTSTRAP = 200


def write_report(results, out_dir, metrics=None, overwrite: bool = False, at: dict | None = None) -> Path:
    """Write the report of a result Dataset into ``out_dir``.

    Parameters
    ----------
    results : str, os.PathLike or xarray.Dataset
        A result file (NetCDF, as ``mcsim run`` / ``compare`` write it) or the Dataset itself.
    out_dir : str or os.PathLike
        Folder for the report: a new or empty folder, or one that holds only an earlier report (its manifest,
        ``.mcsim-manifest.json``, lists the files). The report is written into a temporary folder and moved into
        place when whole, so a failed report leaves nothing behind. A folder holding anything else (the working
        folder, the result's own folder) is refused, ``overwrite`` or not: nothing of the user's is ever removed.
    overwrite : bool
        Replace an earlier report in ``out_dir``.
    metrics : sequence of str, optional
        Variables to report instead of the headline ones (quantiles, distributions and sensitivity). A variable
        with a per-request quantile dim is reported at the per-request quantiles 0.5 and 0.99.
    at : dict, optional
        ``{grid axis path: value}``: the grid point the figures and the sensitivity table focus on (default:
        the first value of each axis); ``{"variant": name}`` chooses the variant.

    Raises
    ------
    ReportError
        An unknown metric, grid axis or grid value; the message names it and lists the valid ones.

    Returns
    -------
    pathlib.Path
        Path of ``summary.md``.

    Examples
    --------
    >>> ds = mcsim.compare("scenarios/factory.toml", samples=64)  # doctest: +SKIP
    >>> write_report(ds, "outputs/factory-report")  # doctest: +SKIP
    PosixPath('outputs/factory-report/summary.md')
    """
    ds = _load(results)
    final = Path(out_dir)
    earlier_output_folder(final, "report", overwrite)  # before any work: a folder of the user's is never used
    if not any("sample" in v.dims for v in ds.data_vars.values()):
        raise ValueError("no variable over the 'sample' dimension: nothing to report")
    search = bool(ds.attrs.get("search_result"))  # a search result gets its own report (Pareto fronts, regret)
    if search and (metrics or at):
        raise ReportError("--metrics and --at do not apply to a search result: its report shows every candidate")
    layout = None if search else _Layout(ds, at)
    if not search:
        _check_metrics(ds, metrics)
    with output_folder(final, "report", overwrite=overwrite) as out:
        if search:
            write_search_files(ds, out)
        else:
            _write_report_files(ds, layout, metrics, out)
    return final / "summary.md"


def _write_report_files(ds, layout, metrics, out: Path) -> None:
    if metrics is None:
        quantity_names = [n for n in CAPACITY_HEADLINE if ds.attrs.get("capacity_result") and n in ds]
        quantity_names += [n for n in HEADLINE if n in ds] + [n for n in ("ttft_s", "tpot_s") if n in ds]
        # Simulated replicas: how evenly the router spread the requests.
        quantity_names += [n for n in ("instance_load_imbalance",) if n in ds and bool(np.isfinite(ds[n]).any())]
        sensitivity_names = [n for n in SENSITIVITY_OUTPUTS if n in ds]
    else:
        quantity_names = sensitivity_names = list(dict.fromkeys(metrics))
    quantities = _series(ds, quantity_names)
    outputs = _series(ds, sensitivity_names)

    quantile_rows = _quantile_rows(ds, layout, quantities)
    _write_csv(out / "quantiles.csv", quantile_rows)
    (out / "quantiles.json").write_text(json.dumps(strict_json({
        "scenario_name": ds.attrs.get("scenario_name", ""), "statement": MODEL_STATEMENT,
        "quantile_levels": list(LEVELS), "grid_axes": layout.axes, "rows": quantile_rows}), indent=1,
        allow_nan=False))
    sens_rows, focus_sens = _sensitivity_rows(ds, layout, outputs)
    _write_csv(out / "sensitivity.csv", sens_rows, header=_sensitivity_header(layout))

    def series_of(labels):
        names = {label.split(" ")[0] for label in labels}
        return [s for s in _series(ds, [n for n in names if n in ds]) if s.label in labels]

    figures = draw_figures(ds, layout, quantities, outputs, focus_sens, out, series_of)
    (out / "summary.md").write_text(_summary(ds, layout, quantities, quantile_rows, outputs, focus_sens, figures))


# -- reading the Dataset -----------------------------------------------------------------------------------------


def _load(results) -> xr.Dataset:
    if isinstance(results, xr.Dataset):
        ds = results
    else:
        kind = readable_kind(results)
        if kind:  # reading a pipe or a device would block or never end
            raise ValueError(f"is {kind}, not a NetCDF result file of mcsim")
        with xr.open_dataset(results) as opened:
            ds = opened.load()
    if "sample" not in ds.dims:
        raise ValueError("not an mcsim result: no 'sample' dimension")
    return ds


def _check_metrics(ds: xr.Dataset, metrics) -> None:
    if metrics is None:
        return
    missing = [m for m in metrics if m not in ds or "sample" not in ds[m].dims]
    if missing or not metrics:
        known = sorted(n for n, v in ds.data_vars.items() if "sample" in v.dims and v.attrs.get("role") != "input")
        raise ReportError(f"--metrics: not a metric of this result: {', '.join(missing) or '(none given)'}; "
                          f"metrics: {', '.join(known)}")


def _series(ds: xr.Dataset, names) -> list[Series]:
    out = []
    request_q = request_quantile_dim(ds)
    for name in names:
        extra = [d for d in ds[name].dims if d in ("tier", "lever", WORKLOAD_CLASS) or d == request_q]
        if not extra:
            out.append(Series(name, name))
            continue
        choices = []
        for d in extra:
            values = [_plain(v) for v in ds[d].values]
            if d == request_q:
                values = [q for q in values if any(math.isclose(q, r) for r in REQUEST_QUANTILES)] or values
            choices.append([(d, v) for v in values])
        for combo in itertools.product(*choices):
            tags = [f"p{100 * v:g}" if d == request_q else str(v) for d, v in combo]
            out.append(Series(" ".join([name, *tags]), name, tuple(combo)))
    return out


def _inputs(ds: xr.Dataset, layout: _Layout) -> list[str]:
    allowed = set(layout.dims) | {"sample"}
    return [str(n) for n, v in ds.data_vars.items()
            if v.attrs.get("role") == "input" and "sample" in v.dims and set(v.dims) <= allowed
            and v.dtype.kind in "fiub"]


# -- tables ------------------------------------------------------------------------------------------------------


def _quantile_rows(ds, layout: _Layout, quantities: list[Series]) -> list[dict]:
    rows = []
    for s in quantities:
        data = _array(ds, layout, layout.dims, s.name, s.select)
        units = _meta(ds, s.name)[1]
        request_q = next((v for d, v in s.select if d == request_quantile_dim(ds)), "")
        for index in layout.points:
            v = data[index]
            finite_or_inf = v[~np.isnan(v)]
            row = {**layout.values(index), "metric": s.label, "variable": s.name, "request_quantile": request_q,
                   "selection": " ".join(f"{d}={_text(v)}" for d, v in s.select), "units": units, "samples": int(finite_or_inf.size), "nan_samples": int(v.size - finite_or_inf.size),
                   "mean": float(np.mean(finite_or_inf)) if finite_or_inf.size else math.nan}
            for level, q in zip(LEVELS, quantiles(v)):
                row[f"p{100 * level:g}"] = float(q)
            rows.append(row)
    return rows


def _sensitivity_header(layout: _Layout) -> list[str]:
    return [*layout.dims, "output", "input", "samples", "spearman", "prcc", "prcc_low", "prcc_high",
            "sobol_first_order", "note"]


def _sensitivity_rows(ds, layout: _Layout, outputs: list[Series]):
    """Rows of sensitivity.csv, and {output label: per-input results} at the focus point (for figures)."""
    inputs = _inputs(ds, layout)
    rows, focus = [], {}
    if not inputs:
        return rows, focus
    X_all = np.stack([_array(ds, layout, layout.dims, n) for n in inputs], axis=-1)  # (*point, sample, input)
    inputs = [path_of(ds, n) for n in inputs]  # shown by scenario path
    try:  # the run's seed, so the bootstrap intervals of a result are reproducible
        seed = abs(int(ds.attrs.get("seed", 0)))
    except (TypeError, ValueError):
        seed = 0
    for s in outputs:
        y_all = _array(ds, layout, layout.dims, s.name, s.select)
        for index in layout.points:
            X, y = X_all[index], y_all[index]
            complete = int(np.sum(np.isfinite(y) & np.all(np.isfinite(X), axis=1)))
            rho, why_rho = sensitivity.spearman(X, y, return_reasons=True)
            pr, why_pr = sensitivity.prcc(X, y, return_reasons=True)
            sobol, why_sobol = sensitivity.first_order_sobol(X, y, return_reasons=True)
            low = high = np.full(len(inputs), np.nan)
            if index == layout.focus and np.any(np.isfinite(pr)):
                low, high = sensitivity.prcc_bootstrap(X, y, n_boot=BOOTSTRAP, level=0.90, seed=seed)
            for j, name in enumerate(inputs):
                notes = [f"{kind}: {why[j]}" for kind, why in
                         (("spearman", why_rho), ("prcc", why_pr), ("sobol", why_sobol)) if why[j]]
                rows.append({**layout.values(index), "output": s.label, "input": name, "samples": complete,
                             "spearman": rho[j], "prcc": pr[j], "prcc_low": low[j], "prcc_high": high[j],
                             "sobol_first_order": sobol[j], "note": "; ".join(dict.fromkeys(notes))})
            if index == layout.focus:
                focus[s.label] = {"inputs": inputs, "spearman": rho, "prcc": pr, "low": low, "high": high,
                                  "sobol": sobol, "samples": complete, "why_prcc": why_pr}
    return rows, focus


def _write_csv(path: Path, rows: list[dict], header=None) -> None:
    header = header or (list(rows[0]) if rows else [])
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: _csv_value(v) for k, v in row.items()})


def _csv_value(v):
    if isinstance(v, float):
        return "" if math.isnan(v) else repr(float(v))
    return v


def _table(header: list, rows: list) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return lines


def _infeasible_section(ds) -> list[str]:
    """Why samples are infeasible, with a fix for each reason, as the command line's summary prints it."""
    lines = [line.strip() for line in infeasible_lines(infeasible_summary(ds))]
    if not lines:
        return []
    return ["## Infeasible samples", "",
            "Samples that could not run are NaN and left out of every band. By reason, how many and a fix in their own "
            "figures:", "", *(f"- {markdown_text(line.rstrip('.'))}." for line in lines), ""]


def _summary(ds, layout: _Layout, quantities, quantile_rows, outputs, focus_sens, figures) -> str:
    attrs = ds.attrs
    name = markdown_text(attrs.get("scenario_name", "unnamed scenario"))
    lines = [f"# mcsim report: {name}", "", f"> {MODEL_STATEMENT}", ""]
    measured = str(attrs.get("measured_variables", "")).strip()
    lines += [f"Measured on the user's machine: {measured}." if measured else
              "Every figure in this report is modelled; none is measured.", ""]
    grid = "; ".join(f"`{layout.label(d)}` = {', '.join(markdown_text(_text(v)) for v in layout.coords[d])}"
                     for d in layout.axes) or "none"
    inputs = _inputs(ds, layout)
    run = [("scenario", f"{name}" + (f" ({markdown_text(attrs['scenario_file'])})" if attrs.get("scenario_file")
                                     else "")),
           ("samples", f"{layout.samples} Monte Carlo samples x {simulated_requests(ds)}"),
           ("seed", f"{attrs.get('seed', 'n/a')}" + (f" ({attrs['sampling']} sampling)" if "sampling" in attrs
                                                     else "")),
           ("grid axes", grid), ("variants", ", ".join(layout.variants) or "one (as written)"),
           ("uncertain inputs", f"{len(inputs)}" + (f": {', '.join(f'`{path_of(ds, n)}`' for n in inputs)}"
                                                     if inputs else "")),
           ("workload", markdown_text(attrs.get("workload", "?"))),
           ("model", markdown_text(f"fidelity {attrs.get('fidelity', '?')}; fleet {attrs.get('fleet', '?')}; "
                                   f"fleet simulation {attrs.get('fleet_simulation', 'representative')}")),
           ("mcsim", f"{attrs.get('mcsim_version', '?')}, created {attrs.get('created', '?')}"),
           ("overrides", markdown_text(attrs.get("overrides")) if attrs.get("overrides") else "none")]
    if attrs.get("pricing_note"):
        run.append(("pricing", markdown_text(attrs["pricing_note"])))
    lines += ["## Run", ""] + _table(["", ""], run) + [""]
    if attrs.get("capacity_result"):
        lines += ["## Capacity question", "",
                  markdown_text(f"The highest arrival rate ({attrs.get('capacity_knob', '?')}) at which "
                                f"{attrs.get('capacity_deployment', 'the deployment')} meets "
                                f"{attrs.get('capacity_slo', 'its SLOs')}, bisected per sample on its own common "
                                f"random numbers to within {float(attrs.get('capacity_rtol', math.nan)):.0%}. "
                                "The other figures describe each sample's run at its capacity."), ""]

    lines += ["## Headline metrics (modelled)", "",
              ("Cells are median [5 %, 95 %] over Monte Carlo samples. All five quantiles (5/25/50/75/95 %) for "
               "every grid point and variant: [quantiles.csv](quantiles.csv), [quantiles.json](quantiles.json)."), ""]
    lines += _headline_table(ds, layout, quantities, quantile_rows) + [""]
    lines += _infeasible_section(ds)
    lines += _steady_state_section(ds)
    unmeasured = str(ds.attrs.get("kernel_data_unmeasured", "")).split()
    if unmeasured:
        lines += ["## Unmeasured accelerators", "",
                  markdown_text(f"{', '.join(unmeasured)}: no measured kernels, so the step times are a roofline "
                                "at the catalog's peaks with uncertain efficiencies (performance.unmeasured_"
                                "flops_fraction and unmeasured_bandwidth_fraction, drawn per sample: a judgement), "
                                "likely optimistic; compare them with measured GPUs with care."), "", markdown_text(f"What each accelerator's figures stand on: "
                                                                 f"{ds.attrs.get('kernel_data', '')}."), ""]

    lines += ["## Sensitivity to the uncertain inputs", ""]
    if not inputs:
        lines += ["No uncertain inputs: every scenario number was fixed, so there is nothing to attribute the spread to.",
                  ""]
    else:
        lines += [f"Spearman, PRCC and (with at least {sensitivity.SOBOL_MIN_SAMPLES} samples) first-order Sobol "
                  "indices for every grid point and variant are in [sensitivity.csv](sensitivity.csv). "
                  + (f"The table and the tornado charts show {layout.name(layout.focus)}; the 90 % PRCC intervals "
                     "(bootstrap) are computed there only. " if len(layout.points) > 1 else
                     "The 90 % PRCC intervals are bootstrap percentiles. ")
                  + "PRCC is the rank correlation left after removing the other inputs' effects; S1 is the share of "
                  "the output's variance explained by that input alone.", ""]
        rows = []
        for s in outputs:
            r = focus_sens.get(s.label)
            if r is None:
                continue
            score = r["prcc"] if np.any(np.isfinite(r["prcc"])) else r["spearman"]
            defined = np.flatnonzero(np.isfinite(score))
            if defined.size == 0:
                rows.append([s.label, "n/a", "", "", "", r["why_prcc"][0] if r["why_prcc"] else ""])
                continue
            for j in defined[np.argsort(-np.abs(score[defined]), kind="stable")][:3]:
                ci = (f" [{r['low'][j]:.2f}, {r['high'][j]:.2f}]" if np.isfinite(r["low"][j]) else "")
                notes = ["" if np.isfinite(r["prcc"][j]) else r["why_prcc"][j]]
                if np.isfinite(r["sobol"][j]) and r["sobol"][j] < 0:
                    notes.append(f"S1 estimate {r['sobol'][j]:.2f} < 0: noise around 0")
                rows.append([s.label, f"`{path_of(ds, r['inputs'][j])}`",
                             f"{r['prcc'][j]:.2f}{ci}" if np.isfinite(r["prcc"][j]) else "n/a",
                             f"{r['spearman'][j]:.2f}", _s1(r["sobol"][j]), "; ".join(n for n in notes if n)])
        lines += _table(["output", "input (top 3)", "PRCC [90 %]", "Spearman", "S1", "note"], rows) + [""]
        rough = [s.label for s in outputs if s.label in focus_sens
                 and few_samples_warning(focus_sens[s.label]["samples"], len(inputs))]
        if rough:
            n = min(focus_sens[label]["samples"] for label in rough)
            lines += [(f"**Too few samples:** {n} samples for {len(inputs)} uncertain inputs (want "
                       f"{SAMPLES_PER_INPUT * len(inputs)}): the indices of {', '.join(rough)} and their tornado "
                       "charts are rough; trust the sign and order of the strongest ones, not their values; run "
                       "more samples for more."), ""]

    lines += ["## Figures (modelled)", ""]
    if len(layout.points) > 1:
        lines += [f"Dims a figure does not show are held at {layout.name(layout.focus)} (choose with `--at`).", ""]
    sections = [("capacity", "Capacity (each sample's bisection, and the capacity over samples)"),
                ("distributions", "Distributions over samples"),
                ("paired", "Paired comparisons (each sample against itself)"),
                ("load", "Service level against load"), ("tornado", "Sensitivity (tornado charts)"),
                ("heatmap", "Medians over two grid axes"), ("waterfall", "Baseline -> factory")]
    for key, title in sections:
        if figures.get(key):
            lines += [f"### {title}", ""]
            lines += [f"![{Path(f).stem}]({f})" for f in figures[key]] + [""]
    empty = [s for s in quantities if not has_values(ds, s)]
    if empty:
        lines += [f"Not drawn, NaN in every sample: {', '.join(f'`{s.label}`' for s in empty)}"
                  + (" (payback_months is NaN under rental pricing: nothing was bought)."
                     if any(s.name == "payback_months" for s in empty) else "."), ""]
    return "\n".join(lines)


def _steady_state_section(ds) -> list[str]:
    """A section that says which samples have not reached steady state, or could not be judged (nothing when all
    have)."""
    facts, unjudged = steady_state_facts(ds), not_judged_facts(ds)
    if facts is None and unjudged is None:
        return []
    lines = ["## Steady state"]
    if facts is not None:
        windows = ("the last whole periods of their measured window and as many periods before them"
                   if compares_like_hours(ds) else "the third and the last quarter of their requests")
        lines += ["",
                  f"**{facts['count']} of {facts['runs']} sample runs have not reached steady state**: their cache "
                  f"hit rate (or the batching simulator's queue wait) still drifts between {windows} "
                  "(`steady_state`, `cache_hit_rate_drift`, `queue_wait_drift`), so their figures still depend on "
                  "the number of requests per sample."]
        if facts["points"]:
            lines += ["", "Grid points: " + "; ".join(markdown_text(p) for p in facts["points"][:MAX_TABLE_ROWS])
                      + (f" and {len(facts['points']) - MAX_TABLE_ROWS} more."
                         if len(facts["points"]) > MAX_TABLE_ROWS else ".")]
        if under_rate_profile(ds) and not compares_like_hours(ds):
            lines += ["", markdown_text(PROFILE_DRIFT[0].upper() + PROFILE_DRIFT[1:])]
        elif facts["requests"] is not None:
            lines += ["", f"Estimated requests per sample for steady state: `--set mc.requests={facts['requests']}` "
                      "(`requests_for_steady_state`, an extrapolation from how the drift shrinks; re-run to check)."]
        if facts["saturated"]:
            lines += ["", f"{facts['saturated']} of them saturate the simulated queue: no request count settles it."]
    if unjudged is not None:
        lines += ["", f"**{unjudged['count']} of {unjudged['runs']} sample runs were not judged**: "
                  + markdown_text(NOT_JUDGED) + "."]
    return lines + [""]


def _headline_table(ds, layout: _Layout, quantities, quantile_rows) -> list[str]:
    cells = {}
    for row in quantile_rows:
        key = tuple(row[d] for d in layout.dims)
        if row["variable"] == "feasible":  # a 0/1 flag: count the samples that could not run
            infeasible = int(round((1.0 - row["mean"]) * row["samples"]))
            cells[(row["metric"], key)] = f"{infeasible} of {row['samples']} infeasible" if row["samples"] else "n/a"
        else:
            f = _percent if is_percent(ds, row["variable"]) else _fmt
            cells[(row["metric"], key)] = f"{f(row['p50'])} [{f(row['p5'])}, {f(row['p95'])}]"
    keys = [tuple(layout.values(i).values()) for i in layout.points]
    names = [layout.name(i) for i in layout.points]
    if len(keys) <= 6:
        rows = [[s.label, _units(ds, s.name)] + [cells[(s.label, k)] for k in keys] for s in quantities]
        return _table(["metric", "units"] + names, rows)
    preferred = ["gross_margin", "cost_usd_per_mtok", "decode_tok_s_per_gpu", "ttft_s p99", "feasible"]
    columns = [s for s in quantities if s.label in preferred] or quantities[:5]
    rows = [[n] + [cells[(s.label, k)] for s in columns] for n, k in zip(names, keys)][:MAX_TABLE_ROWS]
    lines = _table(["grid point"] + [f"{s.label} ({_units(ds, s.name)})" for s in columns], rows)
    if len(keys) > MAX_TABLE_ROWS:
        lines += ["", f"First {MAX_TABLE_ROWS} of {len(keys)} grid points; all are in quantiles.csv."]
    return lines


def _s1(value: float) -> str:
    if not np.isfinite(value):
        return "n/a"
    return s1_text(value).removeprefix("S1 = ")


def _percent(x) -> str:
    """A fraction as a percentage for the summary's tables (quantiles.csv keeps the fraction)."""
    if x is None or not math.isfinite(x):
        return _fmt(x)
    return f"{100 * x:.3g} %"


def _units(ds, name: str) -> str:
    return "%" if is_percent(ds, name) else _meta(ds, name)[1]

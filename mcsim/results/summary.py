"""Text and JSON summaries of a result Dataset: median and 5-95 % band of each headline metric."""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from mcsim.results.infeasible import grid_notes, point_notes, reasons
from mcsim.results.layout import FIXED_DIMS, request_quantile_dim
from mcsim.results.names import path_of
from mcsim.results.variables import HEADLINE, REGISTRY, REQUEST_QUANTILE
from mcsim.stages.kvcache import warmup_requests
from mcsim.stages.steady_state import STEADY_WINDOWS_PROFILE
from mcsim.tables import paragraph, table, terminal_width

#: Metrics compared as factory - baseline (a ratio of margins or of a rate that may be 0 says nothing).
DIFFERENCE = {"gross_margin", "cost_profit_margin", "cache_hit_rate"}

#: Rows of the summary: (label, variable, quantile index or None).
ROWS = [(name, name, None) for name in HEADLINE if name not in ("feasible",)]
ROWS[5:5] = [("ttft_s p50", "ttft_s", 0.5), ("ttft_s p99", "ttft_s", 0.99), ("tpot_s p50", "tpot_s", 0.5),
             ("tpot_s p99", "tpot_s", 0.99), ("e2e_s p50", "e2e_s", 0.5), ("queue_wait_s p99", "queue_wait_s", 0.99),
             ("slo_attainment", "slo_attainment", None)]
ROWS[ROWS.index(("gpus", "gpus", None)) + 1:ROWS.index(("gpus", "gpus", None)) + 1] = [
    ("  decode_gpus", "decode_gpus", None), ("  prefill_gpus", "prefill_gpus", None),
    ("instances", "instances", None), ("  decode_instances", "decode_instances", None),
    ("  prefill_instances", "prefill_instances", None)]
ROWS.insert(ROWS.index(("slo_attainment", "slo_attainment", None)) + 1, ("saturated", "saturated", None))


def _values(ds: xr.Dataset, name: str, q) -> xr.DataArray:
    da = ds[name]
    if q is not None:
        da = da.sel({request_quantile_dim(ds) or REQUEST_QUANTILE: q})  # files before 0.2 say "quantile"
    return da.astype(float)


#: Counts of whole things (GPUs of whole instances, instances): their median and band are samples' own values,
#: never a fleet that cannot exist ("prefill_instances 6.5", "GPUs 20" of 8-GPU instances).
WHOLE_COUNTS = frozenset({"gpus", "decode_gpus", "prefill_gpus", "instances", "decode_instances",
                          "prefill_instances"})


def band(values: np.ndarray, whole: bool = False) -> dict:
    """Median and 5-95 % band of ``values`` over samples (NaN left out); ``whole``: each the value of a sample (the
    inverted empirical CDF: of an even count, the lower middle sample is the median)."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    if v.size == 0:
        return {"median": math.nan, "p5": math.nan, "p95": math.nan}
    p5, med, p95 = np.quantile(v, [0.05, 0.5, 0.95], method="inverted_cdf" if whole else "linear")
    return {"median": float(med), "p5": float(p5), "p95": float(p95)}


NON_GRID = FIXED_DIMS  # the report's own list of dims that are never grid axes

#: Columns of the per-grid-point table of a sweep.
GRID_COLUMNS = [("decode tok/s/GPU", "decode_tok_s_per_gpu", None), ("GPUs", "gpus", None),
                ("cache hit", "cache_hit_rate", None), ("ttft p99 s", "ttft_s", 0.99), ("tpot p50 s", "tpot_s", 0.5),
                ("SLO attained", "slo_attainment", None), ("USD/Mtok", "cost_usd_per_mtok", None),
                ("gross margin", "gross_margin", None)]


def grid_dims(ds: xr.Dataset) -> list[str]:
    return [d for d in ds.dims if d not in NON_GRID]


def _variants(ds: xr.Dataset) -> list[str]:
    return [str(v) for v in ds["variant"].values] if "variant" in ds.dims else ["factory"]


def _point_reasons(ds: xr.Dataset) -> dict:
    """Why samples of one grid point are infeasible, per variant (:func:`mcsim.results.infeasible.reasons`)."""
    return {"infeasible_reasons": {v: reasons(ds.sel(variant=v) if "variant" in ds.dims else ds)
                                   for v in _variants(ds)}}


def _point_summary(ds: xr.Dataset) -> dict:
    variants = _variants(ds)
    out = {"variants": {}, "feasible_fraction": {}}
    for v in variants:
        sub = ds.sel(variant=v) if "variant" in ds.dims else ds
        out["variants"][v] = {
            label: {**band(_values(sub, name, q).values, whole=name in WHOLE_COUNTS), "units": REGISTRY[name].units}
            for label, name, q in ROWS
        }
        out["feasible_fraction"][v] = float(sub["feasible"].mean())
        out.setdefault("infeasible_samples", {})[v] = int((sub["feasible"] == 0).sum())
        out.setdefault("saturated_samples", {})[v] = int((sub["saturated"] == 1).sum())
    out.update(_point_reasons(ds))
    if "baseline" in variants and "factory" in variants:
        base, fact = ds.sel(variant="baseline"), ds.sel(variant="factory")
        out["ratio"] = {}
        for label, name, q in ROWS:
            f, b = _values(fact, name, q).values, _values(base, name, q).values
            if name in DIFFERENCE:
                out["ratio"][label] = {**band(f - b), "difference": True}
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                r = f / b
            out["ratio"][label] = {**band(np.where(np.isfinite(r), r, np.nan)), "difference": False}
    shares = [n for n in ds.data_vars if n.startswith("shapley_share_")]
    if shares:
        out["shapley_share"] = {
            name.removeprefix("shapley_share_"): {str(lever): band(ds[name].sel(lever=lever).values)
                                                  for lever in ds["lever"].values}
            for name in shares
        }
    return out


def summarize(ds: xr.Dataset) -> dict:
    """Medians and 5-95 % bands over samples.

    ``{variants: {variant: {label: {median, p5, p95, units}}}, feasible_fraction, infeasible_samples,
    infeasible_reasons, ratio, shapley_share}``, where ``ratio`` is factory/baseline per sample (paired, on the same
    draws), or factory - baseline for the metrics in :data:`DIFFERENCE` (marked ``"difference": true``), and
    ``infeasible_reasons`` is, per variant, each reason that stopped samples with their count and a fix in their
    own figures (:func:`mcsim.results.infeasible.reasons`). A sweep gives ``{"grid_axes": [path, ...], "grid":
    [{"point": {path: value}, ...}, ...]}``, grid axes named by their dotted scenario paths.
    """
    return _per_point(ds, _point_summary)


def infeasible_summary(ds: xr.Dataset) -> dict:
    """:func:`summarize`'s ``infeasible_reasons`` alone (no quantile computed), in the same layout: what
    :func:`infeasible_lines` reads."""
    return _per_point(ds, _point_reasons)


def _per_point(ds: xr.Dataset, of_point) -> dict:
    """``of_point`` of the result, or, over a grid, of each grid point with its values by scenario path."""
    dims = grid_dims(ds)
    if not dims:
        return of_point(ds)
    stacked = ds.stack(__point__=dims)
    points = []
    for i in range(stacked.sizes["__point__"]):
        sub = stacked.isel(__point__=i)
        point = {path_of(ds, d): _plain(sub[d].values) for d in dims}  # by scenario path
        points.append({"point": point, **of_point(sub.drop_vars(["__point__", *dims]))})
    return {"grid_axes": [path_of(ds, d) for d in dims], "grid": points}


def simulated_requests(ds: xr.Dataset) -> str:
    """How many requests each sample measured, from the result itself (a replayed trace may hold fewer than asked
    for): ``"450 measured requests"``, or their range over samples, grid points and variants when it varies, and a
    note when the trace held fewer than ``mc.requests`` (less the warm-up)."""
    if "requests" not in ds:
        return f"{ds.attrs.get('requests_per_sample', '?')} requests"
    counts = np.asarray(ds["requests"].values, dtype=float).ravel()
    counts = counts[np.isfinite(counts)]
    if counts.size == 0:
        return "no requests"
    low, high = int(counts.min()), int(counts.max())
    text = f"{low} measured requests" if low == high else f"{low}-{high} measured requests (by sample or grid point)"
    asked, warmup = ds.attrs.get("requests_per_sample"), ds.attrs.get("warmup_fraction")
    if asked is not None and warmup is not None:
        expected = int(asked) - warmup_requests(int(asked), float(warmup))
        if low < expected:
            text += f" (the trace held fewer than the {int(asked)} asked for, {expected} measured)"
    return text


def _plain(value):
    value = value.item() if hasattr(value, "item") else value
    return value


def _fmt(x: float) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    a = abs(x)
    if a != 0 and (a >= 1e6 or a < 1e-3):
        return f"{x:.3g}"
    if a >= 100:
        return f"{x:,.0f}"
    return f"{x:.3g}"


def _cell(b: dict) -> str:
    return f"{_fmt(b['median'])} [{_fmt(b['p5'])}, {_fmt(b['p95'])}]"


def _table(header: list, rows: list, width: int, keep: int = 1) -> list[str]:
    return table([header, *rows], width=width, keep=keep)


def infeasible_lines(s: dict) -> list[str]:
    """Why samples are infeasible, from a :func:`summarize` (or :func:`infeasible_summary`) result: per variant and
    reason, how many samples and a fix (over a grid, at each grid point where it stopped some); empty when all
    ran."""
    if "grid" in s:
        return grid_notes([(", ".join(f"{d}={_fmt_coord(v)}" for d, v in entry["point"].items()),
                            entry["infeasible_reasons"]) for entry in s["grid"]])
    return point_notes(s.get("infeasible_reasons", {}))


def kernel_data_note(ds: xr.Dataset) -> list[str]:
    """A line naming the accelerators whose figures rest on no measurement (a roofline with uncertain
    efficiencies), or none."""
    unmeasured = str(ds.attrs.get("kernel_data_unmeasured", "")).split()
    if not unmeasured:
        return []
    whose = "its" if len(unmeasured) == 1 else "their"
    return [f"UNMEASURED: {', '.join(unmeasured)}: no measured kernels, so {whose} "
            "step times are a roofline at the catalog's peaks with uncertain efficiencies (drawn per sample: "
            "performance.unmeasured_flops_fraction, unmeasured_bandwidth_fraction), likely optimistic; compare "
            "them with measured GPUs with care (kernel_data attribute)."]


def format_table(ds: xr.Dataset, max_points: int = 60, width: int | None = None) -> str:
    """A plain-text table; every cell is 'median [5 %, 95 %]' over Monte Carlo samples.

    No line is longer than ``width`` (default: the terminal's, 80 when unknown): a wider table is printed in
    blocks of columns, and a sweep of few grid points with metrics as rows and grid points as columns.
    """
    width = width or terminal_width()
    s = summarize(ds)
    n = ds.sizes["sample"]
    foot = [""]
    if "grid" in s:
        text = _grid_table(ds, s, max_points, width)
        reasons_at_points = infeasible_lines(s)
        if reasons_at_points:
            foot += ["infeasible samples (NaN, left out of every band), by reason:", *reasons_at_points]
    else:
        text = _point_table(s, width)
        if "shapley_share" in s:
            text += ["", *paragraph("Shapley share of the factory vs baseline change (log scale for throughput "
                                    "and cost):", width)]
            metrics = list(s["shapley_share"])
            levers = list(s["shapley_share"][metrics[0]])
            text += _table(["lever"] + metrics, [[lever] + [_cell(s["shapley_share"][m][lever]) for m in metrics]
                                                 for lever in levers], width)
        feas = ", ".join(f"{v}: {k} of {n}" for v, k in s["infeasible_samples"].items()
                         if v in ("baseline", "factory"))
        foot.append(f"infeasible samples (NaN, left out of every band): {feas}.")
        foot += infeasible_lines(s)
    foot += steady_state_note(ds)
    foot += kernel_data_note(ds)
    if ds.attrs.get("pricing_note"):
        foot.append(f"pricing: {ds.attrs['pricing_note']}.")
    if "decode_capacity_tok_s_per_gpu" in ds:
        foot.append("decode_tok_s_per_gpu is what a decode GPU does in its decode steps at the deployed load; "
                    "*_capacity_tok_s_per_gpu what one sustains (decode at the largest batch meeting the TPOT target, "
                    "prefill at full steps); delivered_output_tok_s_per_gpu what the whole fleet serves per GPU over "
                    "the trace (prefill GPUs and idle time included): what a token's cost is charged against.")
    foot.append(f"{n} samples x {simulated_requests(ds)}; cells are median [5 %, 95 %] "
                "over samples (of GPUs and instances, samples' own whole counts: of two middle samples, the "
                "lower); every figure is modelled.")
    if "ratio" in s or ("grid" in s and s["grid"] and "ratio" in s["grid"][0]):
        foot.append("factory vs baseline: 'x' is the per-sample ratio factory/baseline, '+' the difference "
                    "factory - baseline, both on identical requests and draws.")
    return "\n".join(text + [line for note in foot for line in paragraph(note, width)])


def _point_table(s: dict, width: int) -> list[str]:
    variants = [v for v in s["variants"] if v in ("baseline", "factory")] or list(s["variants"])
    header = ["metric (modelled)", "units"] + variants + (["factory vs baseline"] if "ratio" in s else [])
    rows = []
    for label, name, _ in ROWS:
        row = [label, REGISTRY[name].units] + [_cell(s["variants"][v][label]) for v in variants]
        if "ratio" in s:
            r = s["ratio"][label]
            row.append(("+ " if r["difference"] else "x ") + _cell(r))
        rows.append(row)
    lines = _table(header, rows, width, keep=2)
    if len(lines) > len(rows) + 2:  # split: units last, so that the variants stay side by side with the metrics
        lines = _table([header[0], *header[2:], header[1]], [[r[0], *r[2:], r[1]] for r in rows], width)
    return lines


def _grid_table(ds: xr.Dataset, s: dict, max_points: int, width: int) -> list[str]:
    dims = s["grid_axes"]
    variant = "factory"
    header = list(dims) + [c[0] for c in GRID_COLUMNS] + ["saturated", "infeasible"]
    rows = []
    for entry in s["grid"][:max_points]:
        shown = variant if variant in entry["variants"] else next(iter(entry["variants"]))
        v = entry["variants"][shown]
        rows.append([_fmt_coord(entry["point"][d]) for d in dims]
                    + [_cell(v[_label(name, q)]) for _, name, q in GRID_COLUMNS]
                    + [f"{entry['saturated_samples'][shown]}/{ds.sizes['sample']}",
                       f"{entry['infeasible_samples'][shown]}/{ds.sizes['sample']}"])
    by_point = table([header, *rows], width=width, keep=len(dims))
    # Metrics as rows, one column per grid point (the axes' values head each column): whichever layout is
    # shorter, so a sweep of few points reads as one or two blocks instead of one block per metric.
    columns = [[header[i], *(row[i] for row in rows)] for i in range(len(header))]
    by_metric = table(columns, header=len(dims), width=width, keep=1)
    if len(by_metric) < len(by_point):
        text = [f"variant: {variant}; one column per grid point"] + by_metric
    else:
        text = [f"variant: {variant}; one row per grid point"] + by_point
    if len(s["grid"]) > max_points:
        text.append(f"... {len(s['grid']) - max_points} more grid points in the file")
    return text


def _label(name, q):
    for label, n, qq in ROWS:
        if n == name and qq == q:
            return label
    raise KeyError(name)


def _fmt_coord(value) -> str:
    return _fmt(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)


def steady_state_facts(ds: xr.Dataset) -> dict | None:
    """Which sample runs have not reached steady state: ``{count, runs, points, requests, saturated}`` (grid points
    as ``"axis=value, ..."`` strings, the largest finite estimate of requests per sample or None, the runs whose
    simulated queue saturates); None when every run is steady or the Dataset predates the check."""
    if "steady_state" not in ds or "requests_for_steady_state" not in ds:
        return None
    unsteady = ds["steady_state"] == 0
    count = int(unsteady.sum())
    if count == 0:
        return None
    points = []
    dims = grid_dims(ds)
    if dims:
        per_point = unsteady.any([d for d in unsteady.dims if d not in dims]).stack(__point__=dims)
        points = [", ".join(f"{path_of(ds, d)}={_fmt_coord(per_point[d].values[i])}" for d in dims)
                  for i in np.flatnonzero(per_point.values)]
    needed = ds["requests_for_steady_state"].where(unsteady).values.astype(float)
    finite = needed[np.isfinite(needed)]
    flags = ds["steady_state"].values.astype(float)
    ran = int(np.sum(np.isfinite(flags) & (flags >= 0)))  # a search's candidates dropped early ran fewer (-1, NaN)
    return {"count": count, "runs": ran, "points": points,
            "requests": int(finite.max()) if finite.size else None, "saturated": int(np.isinf(needed).sum())}


def _trace_supply(ds: xr.Dataset) -> int | None:
    """Requests a replayed trace holds, warm-up included: the ``trace_records`` attribute the run recorded, or, for
    a result without it, what the run replayed when it asked for more than the trace held (None when the workload
    is generated, or the size is not known from the result)."""
    if not str(ds.attrs.get("workload", "")).startswith("replayed trace"):
        return None
    if ds.attrs.get("trace_records") is not None:
        return int(ds.attrs["trace_records"])
    if "requests" not in ds:
        return None
    asked, warmup = ds.attrs.get("requests_per_sample"), ds.attrs.get("warmup_fraction")
    counts = np.asarray(ds["requests"].values, dtype=float).ravel()
    counts = counts[np.isfinite(counts)]
    if asked is None or warmup is None or counts.size == 0:
        return None
    measured = int(counts.max())
    if measured >= int(asked) - warmup_requests(int(asked), float(warmup)):
        return None
    return int(round(measured / (1.0 - float(warmup)))) if float(warmup) < 1 else measured


#: Why a steady-state flag of a result written before the checks compared like hours gives no request count (the
#: summary's and the report's words).
PROFILE_DRIFT = ("under workload.rate_profile the last two quarters of a run arrive at different rates, so part or "
                 "all of this drift may be the profile's own, not a start-up transient, and an extrapolated request "
                 "count would mislead: this result's check did not compare like loads (later versions compare the "
                 "same hours in whole periods). Compare two runs at different mc.requests (or sample the hour you "
                 "study, rate_profile_start_s) instead.")


def under_rate_profile(ds: xr.Dataset) -> bool:
    """Whether the result's arrivals followed a rate profile (its ``rate_profile_slices`` attribute)."""
    return int(ds.attrs.get("rate_profile_slices", 0)) > 0


def compares_like_hours(ds: xr.Dataset) -> bool:
    """Whether the result's steady-state checks compared whole periods of a rate profile (its
    ``steady_state_windows`` attribute), as they do under a rate profile."""
    return ds.attrs.get("steady_state_windows") == STEADY_WINDOWS_PROFILE


def not_judged_facts(ds: xr.Dataset) -> dict | None:
    """Under a rate profile, the runs whose measured window was too short to compare the same hours one period
    apart (every drift NaN): ``{count, runs}``; None when there are none, or the result's checks were not of that
    kind."""
    if not compares_like_hours(ds) or "steady_state" not in ds:
        return None
    drifts = [ds[name] for name in ("cache_hit_rate_drift", "queue_wait_drift") if name in ds]
    if not drifts:
        return None
    flags = ds["steady_state"]
    ran = np.isfinite(flags.values.astype(float)) & (flags.values.astype(float) >= 0)
    unjudged = ran.copy()
    for drift in drifts:
        unjudged &= np.isnan(drift.broadcast_like(flags).values.astype(float))
    count = int(unjudged.sum())
    return {"count": count, "runs": int(ran.sum())} if count else None


#: The words for runs too short to judge under a rate profile.
NOT_JUDGED = ("under workload.rate_profile the check compares the last whole periods of the measured window with "
              "as many periods before them, and their measured window spans fewer than two periods "
              "(workload.rate_profile_period_s), so a cold start cannot be told from the profile's own swing: "
              "raise mc.requests past two periods of arrivals to judge them")


def steady_state_note(ds: xr.Dataset, max_points: int = 5, runs: str = "sample runs") -> list[str]:
    """Lines of the summary that say which samples have not reached steady state and the requests per sample
    they would need, and, under a rate profile, which could not be judged (none when every sample is steady)."""
    facts, unjudged = steady_state_facts(ds), not_judged_facts(ds)
    lines = [] if facts is None else _unsteady_lines(ds, facts, max_points, runs)
    if unjudged is not None:
        lines.append(f"STEADY STATE NOT JUDGED: {unjudged['count']} of {unjudged['runs']} {runs}: {NOT_JUDGED}.")
    return lines


def _unsteady_lines(ds: xr.Dataset, facts: dict, max_points: int, runs: str) -> list[str]:
    points = facts["points"]
    where = ("; at " + "; ".join(points[:max_points])
             + (f" and {len(points) - max_points} more grid points" if len(points) > max_points else "")) if points else ""
    profiled = under_rate_profile(ds) and not compares_like_hours(ds)  # an older result's quarters
    depends = ("their figures may still depend on mc.requests" if profiled else
               "their figures still depend on mc.requests")
    windows = ("the last whole periods and as many before them" if compares_like_hours(ds) else "the last two quarters of the "
               "requests")
    lines = [f"NOT AT STEADY STATE: {facts['count']} of {facts['runs']} {runs} (cache hit rate, or the batching "
             f"simulator's queue wait, still drifting between {windows}){where}; "
             f"{depends} (see steady_state, cache_hit_rate_drift, queue_wait_drift)."]
    if profiled:
        # an older result under a rate profile: its check compared the last two quarters, of different loads
        lines.append("  " + PROFILE_DRIFT)
    elif facts["requests"] is not None:
        held = _trace_supply(ds)
        if held is not None and facts["requests"] > held:
            lines.append(f"  steady state would need about {facts['requests']} requests per sample "
                         f"(requests_for_steady_state, an extrapolation), more than the replayed trace holds "
                         f"(about {held}): replay a longer trace; more mc.requests cannot help.")
        else:
            trace_note = f" (the replayed trace holds {held})" if held is not None else ""
            lines.append(f"  estimated requests per sample for steady state: --set mc.requests={facts['requests']} "
                         f"(requests_for_steady_state, an extrapolation: re-run to check){trace_note}.")
    if facts["saturated"]:
        lines.append(f"  {facts['saturated']} of them saturate the simulated queue: no request count settles it.")
    return lines

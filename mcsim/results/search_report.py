"""The report of a search result (``mcsim report`` on the file ``mcsim search`` writes): two Pareto figures, the
regret table and a Markdown summary; and the text and JSON summaries the command prints.

Files written:

- ``pareto_throughput.png`` -- decode throughput per GPU against tokens/s per user (1 / median TPOT), medians with
  5-95 % bands over each candidate's feasible samples, the front of candidates no other beats on both medians;
- ``pareto_cost.png`` -- the objective (median, 5-95 % band) against P(constraints met), with the confidence
  asked and the front of candidates no other beats on both;
- ``regret.csv`` -- per candidate: its axis values, samples run, last round, P(constraints met), objective, GPUs
  and decode throughput per GPU at the quantile, whether it ties with the optimum, share of samples it is the best
  in, median and 90 % regret;
- ``summary.md`` -- the question, the robust optimum and the candidates tied with it, the rules and the racing
  rule's risk, the rounds, the tables, the figures.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import matplotlib
import numpy as np
import xarray as xr

from mcsim.results.dataset import MODEL_STATEMENT
from mcsim.results.figures.common import new_figure, save, suptitle
from mcsim.results.layout import _fmt, _plain
from mcsim.results.search_dataset import OUTCOMES, candidate_text
from mcsim.results.summary import NOT_JUDGED, kernel_data_note, not_judged_facts, steady_state_facts
from mcsim.results.variables import REGISTRY, REQUEST_QUANTILE
from mcsim.tables import paragraph, table
from mcsim.text import markdown_text, strict_json

#: Candidates listed in the printed table and the summary's (all are in regret.csv).
SHOWN = 12
LOW, HIGH = 0.05, 0.95


def _objective(ds) -> tuple[str, float | None]:
    name, _, q = str(ds.attrs["search_objective"]).partition("@")
    return name, float(q) if q else None


def _values(ds, name: str, request_quantile=None) -> np.ndarray:
    """(candidate, sample) values, NaN where not run or infeasible."""
    da = ds[name]
    if request_quantile is not None:
        da = da.sel({REQUEST_QUANTILE: request_quantile})
    values = np.asarray(da.values, dtype=float)
    feasible = np.asarray(ds["feasible"].values, dtype=float) == 1
    return np.where(feasible, values, np.nan)


def _band(values: np.ndarray) -> np.ndarray:
    """(candidate, 3): 5 %, median and 95 % over each row's finite values (NaN for a row with none)."""
    out = np.full((values.shape[0], 3), np.nan)
    for c, row in enumerate(values):
        finite = row[np.isfinite(row)]
        if finite.size:
            out[c] = np.quantile(finite, [LOW, 0.5, HIGH])
    return out


def pareto_front(x: np.ndarray, y: np.ndarray, maximize_x: bool, maximize_y: bool) -> np.ndarray:
    """Whether each point is on the front: no other point is at least as good on both and better on one
    (points with a NaN are never on it)."""
    sx = x if maximize_x else -x
    sy = y if maximize_y else -y
    ok = np.isfinite(sx) & np.isfinite(sy)
    front = ok.copy()
    for i in np.flatnonzero(ok):
        others = ok & (sx >= sx[i]) & (sy >= sy[i]) & ((sx > sx[i]) | (sy > sy[i]))
        front[i] = not others.any()
    return front


def _short(ds, index: int) -> str:
    """``tp=2 max_batch_per_gpu=256 h100``: a candidate in few characters."""
    words = []
    for name in str(ds.attrs.get("search_axes", "")).split():
        value = _plain(ds[name].values[index])
        key = str(ds[name].attrs.get("path", name)).rsplit(".", 1)[-1]
        text = f"{value:g}" if isinstance(value, float) else str(value)
        words.append(text if key == "preset" else f"{key}={text}")
    return " ".join(words)


def _per_candidate(ds, name: str) -> np.ndarray:
    """A search variable per candidate, NaN throughout in a file written before the variable existed."""
    if name in ds:
        return np.asarray(ds[name].values, dtype=float)
    return np.full(ds.sizes["candidate"], np.nan)


def tied_candidates(ds) -> list[int]:
    """The candidates tied with the robust optimum on the objective, in the order the tie-break rule ranks them
    (the optimum first); empty when there is no optimum (or the file predates ties)."""
    tied = np.flatnonzero(_per_candidate(ds, "tied_with_best") == 1)
    gpus, throughput = _per_candidate(ds, "gpus_at_quantile"), _per_candidate(ds, "decode_tok_s_per_gpu_at_quantile")
    optimum = int(ds.attrs["robust_optimum_candidate"])

    def key(c):
        return (c != optimum, _nan_last(gpus[c]), _nan_last(-throughput[c]), c)

    return [int(c) for c in sorted(tied, key=key)]


def _nan_last(x: float) -> float:
    return math.inf if math.isnan(x) else x


def _optimum_accelerator(ds, unmeasured: list[str]) -> str | None:
    """The robust optimum's ``hardware.preset``: its search axis's value, or the one preset of a search that does
    not vary it (None without an optimum, or where it cannot be told)."""
    best = int(ds.attrs["robust_optimum_candidate"])
    if best < 0:
        return None
    for name in str(ds.attrs.get("search_axes", "")).split():
        if ds[name].attrs.get("path") == "hardware.preset":
            return str(_plain(ds[name].values[best]))
    return unmeasured[0] if len(unmeasured) == 1 else None


def _unsettled(ds, c: int) -> int:
    """Sample runs of candidate ``c`` not at steady state (their figures still depend on mc.requests)."""
    if "steady_state" not in ds:
        return 0
    return int(np.sum(ds["steady_state"].values[c] == 0))


def candidate_rows(ds) -> list[dict]:
    """One row per candidate, best first: the robust optimum and the candidates tied with it in the tie-break
    rule's order, then qualified candidates by objective, then the others."""
    q = float(ds.attrs["search_confidence"])
    maximize = ds.attrs["search_direction"] == "maximize"
    tied = tied_candidates(ds)
    gpus, throughput = _per_candidate(ds, "gpus_at_quantile"), _per_candidate(ds, "decode_tok_s_per_gpu_at_quantile")
    rows = []
    for c in range(ds.sizes["candidate"]):
        row = {"candidate": c}
        for name in str(ds.attrs.get("search_axes", "")).split():
            value = _plain(ds[name].values[c])
            row[str(ds[name].attrs["path"])] = value
        row.update({
            "samples_run": int(ds.samples_run.values[c]), "survived_round": int(ds.survived_round.values[c]),
            "outcome": OUTCOMES[int(ds.racing_outcome.values[c])],
            "p_constraints_met": float(ds.constraints_met_probability.values[c]),
            "objective_at_quantile": float(ds.objective_at_quantile.values[c]),
            "gpus_at_quantile": float(gpus[c]), "decode_tok_s_per_gpu_at_quantile": float(throughput[c]),
            "tied_with_best": int(c in tied),
            "best_in_sample_share": float(ds.best_in_sample_share.values[c]),
            "regret_p50": float(ds.regret_p50.values[c]), "regret_p90": float(ds.regret_p90.values[c]),
            "unsettled_samples": _unsettled(ds, c),
        })
        rows.append(row)

    def key(row):
        if row["candidate"] in tied:
            return (False, -math.inf, tied.index(row["candidate"]))
        value = row["objective_at_quantile"]
        value = math.inf if not math.isfinite(value) else (-value if maximize else value)
        return (not row["p_constraints_met"] >= q, -row["samples_run"], value, row["candidate"])

    return sorted(rows, key=key)


def search_summary(ds) -> dict:
    """The search as plain data (strict JSON: non-finite numbers are None)."""
    a = ds.attrs
    keys = ("robust_optimum", "robust_optimum_candidate", "robust_optimum_objective", "search_objective",
            "search_direction", "search_quantile", "search_constraints", "search_confidence", "search_alpha",
            "search_rounds", "search_candidates_per_round", "search_sample_runs", "search_exhaustive_sample_runs",
            "search_rule", "search_tie_rule", "search_tie_rtol", "robust_optimum_decided_by")
    out = {k: (a[k].item() if hasattr(a[k], "item") else a[k]) for k in keys if k in a}
    out["robust_optimum_tied"] = tied_candidates(ds)
    out["candidates"] = candidate_rows(ds)
    return strict_json(out)


def _units(ds) -> str:
    return REGISTRY[_objective(ds)[0]].units


def format_search(ds) -> str:
    """What ``mcsim search`` prints: the optimum, the rounds and the best candidates."""
    a = ds.attrs
    units = _units(ds)
    lines = paragraph(f"robust optimum: {a['robust_optimum']}" + (
        f" ({a['search_objective']} at quantile {a['search_quantile']:g}: {_fmt(a['robust_optimum_objective'])} "
        f"{units})" if int(a["robust_optimum_candidate"]) >= 0 else ""))
    lines += paragraph(f"question: {a['search_direction']} {a['search_objective']} at quantile "
                       f"{a['search_quantile']:g} over samples, subject to {a['search_constraints']} in at least "
                       f"{100 * a['search_confidence']:g} % of samples (infeasible samples fail the constraints)")
    lines += paragraph(f"rounds: {a['search_rounds']} samples per candidate, {a['search_candidates_per_round']} "
                       f"candidates in the race; {a['search_sample_runs']} sample runs of the "
                       f"{a['search_exhaustive_sample_runs']} an exhaustive sweep needs")
    lines += _tie_lines(ds)
    rows = candidate_rows(ds)
    header = ["#", "candidate", "samples", "unsettled", "P(met)", f"objective ({units})", "best in",
              "regret p50/p90"]
    body = [[r["candidate"], _short(ds, r["candidate"]), r["samples_run"], r["unsettled_samples"] or "-",
             _pct(r["p_constraints_met"]), _fmt(r["objective_at_quantile"]), _pct(r["best_in_sample_share"]),
             f"{_fmt(r['regret_p50'])} / {_fmt(r['regret_p90'])}"] for r in rows[:SHOWN]]
    lines += [""] + table([header, *body])
    if len(rows) > SHOWN:
        lines.append(f"first {SHOWN} of {len(rows)} candidates (all in the result file and the report's regret.csv)")
    facts = steady_state_facts(ds)
    if facts is not None:
        unsettled = [r for r in rows if r["unsettled_samples"]]
        named = ", ".join(f"#{r['candidate']} {_short(ds, r['candidate'])} ({r['unsettled_samples']} of "
                          f"{r['samples_run']})" for r in unsettled[:SHOWN])
        best = int(a["robust_optimum_candidate"])
        lines += paragraph(f"NOT AT STEADY STATE: {facts['count']} of {facts['runs']} sample runs, in {len(unsettled)} "
                           f"of {len(rows)} candidates: {named}; their figures, and so the ranking"
                           + (" and the optimum" if any(r["candidate"] == best for r in unsettled) else "")
                           + ", still depend on mc.requests"
                           + (f"; run again with --requests {facts['requests']} (an extrapolation: re-run to check)"
                              if facts["requests"] else ""))
    unjudged = not_judged_facts(ds)
    if unjudged is not None:
        lines += paragraph(f"STEADY STATE NOT JUDGED: {unjudged['count']} of {unjudged['runs']} sample runs: "
                           f"{NOT_JUDGED}")
    unmeasured = str(a.get("kernel_data_unmeasured", "")).split()
    if unmeasured:
        on_unmeasured = [name for name in unmeasured if name == _optimum_accelerator(ds, unmeasured)]
        caveat = (f"CAVEAT: the optimum runs on {', '.join(on_unmeasured)}, which has no measured kernels: its "
                  "figures are a roofline with uncertain efficiencies, likely optimistic against the measured "
                  "GPUs it beat. "
                  if on_unmeasured else "")
        lines += paragraph(caveat + kernel_data_note(ds)[0])
    lines.append("every figure is modelled")
    return "\n".join(lines)


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:.0f} %"


#: What ``robust_optimum_decided_by`` says, as the printed sentence ends.
_DECIDED = {"gpus": "it needs the fewest GPUs", "decode_tok_s_per_gpu": "it has the highest decode throughput "
            "per GPU among those with the fewest GPUs", "candidate order": "it comes first in the space's order "
            "(GPUs and throughput tie too)"}


def tie_sentence(ds) -> str:
    """``#1 of the tied #0, #1, #3 was picked because ...``; empty when nothing tied with the optimum."""
    tied = tied_candidates(ds)
    if len(tied) < 2:
        return ""
    decided = str(ds.attrs.get("robust_optimum_decided_by", ""))
    return (f"{len(tied)} candidates tie on {ds.attrs['search_objective']} at quantile "
            f"{ds.attrs['search_quantile']:g} (within a relative {ds.attrs['search_tie_rtol']:g}): "
            f"{', '.join(f'#{c}' for c in sorted(tied))}; #{tied[0]} was picked because "
            f"{_DECIDED.get(decided, decided)}")


def _tie_rows(ds, units: str) -> list[list]:
    """The tied candidates' table: objective, GPUs and throughput at the quantile, the optimum first."""
    objective = ds.objective_at_quantile.values
    gpus, throughput = _per_candidate(ds, "gpus_at_quantile"), _per_candidate(ds, "decode_tok_s_per_gpu_at_quantile")
    optimum = int(ds.attrs["robust_optimum_candidate"])
    header = ["#", "candidate", f"{ds.attrs['search_objective']} ({units})", "GPUs", "decode tokens/s/GPU", ""]
    # six significant digits: enough to see the throughput that decided, which the three of _fmt can hide
    body = [[c, _short(ds, c), f"{objective[c]:.6g}", f"{gpus[c]:.6g}", f"{throughput[c]:.6g}",
             "picked" if c == optimum else ""] for c in tied_candidates(ds)]
    return [header, *body]


def _tie_lines(ds) -> list[str]:
    """The printed tie block: the sentence, the tied candidates' table and the rule (nothing when no tie)."""
    sentence = tie_sentence(ds)
    if not sentence:
        return []
    return (paragraph(sentence) + [""] + table(_tie_rows(ds, _units(ds))) + [""]
            + paragraph(f"tie-break rule: {ds.attrs['search_tie_rule']}"))


# -- figures -----------------------------------------------------------------------------------------------------


def _draw(ax, x: np.ndarray, y: np.ndarray, front: np.ndarray, ds, optimum: int) -> None:
    """Bands and medians of every candidate, the front joined and numbered, the optimum starred."""
    ran_all = np.asarray(ds.samples_run.values) == ds.sizes["sample"]
    for c in range(x.shape[0]):
        if not (np.isfinite(x[c, 1]) and np.isfinite(y[c, 1])):
            continue
        color = "C0" if front[c] else "0.6"
        ax.errorbar(x[c, 1], y[c, 1], xerr=[[x[c, 1] - x[c, 0]], [x[c, 2] - x[c, 1]]],
                    yerr=[[y[c, 1] - y[c, 0]], [y[c, 2] - y[c, 1]]], fmt="none", ecolor=color, lw=0.8, alpha=0.7)
        ax.plot(x[c, 1], y[c, 1], "o", color=color, mfc=color if ran_all[c] else "white", ms=5)
    order = np.flatnonzero(front)
    order = order[np.argsort(x[order, 1])]
    ax.plot(x[order, 1], y[order, 1], "-", color="C0", lw=1.2, label="Pareto front (medians)")
    # candidates within 3 % of the axes' spans of each other share one label ("#4, #6, #8") instead of overprinting
    span_x = max(float(np.ptp(x[order, 1])) if order.size else 0.0, 1e-12)
    span_y = max(float(np.ptp(y[order, 1])) if order.size else 0.0, 1e-12)
    labels: list = []
    for c in order:
        near = next((g for g in labels if abs(x[g[0], 1] - x[c, 1]) <= 0.03 * span_x
                     and abs(y[g[0], 1] - y[c, 1]) <= 0.03 * span_y), None)
        (near.append(c) if near is not None else labels.append([c]))
    for group in labels:
        ax.annotate(", ".join(f"#{c}" for c in sorted(group)), (x[group[0], 1], y[group[0], 1]), textcoords="offset points",
                    xytext=(4, 4), fontsize=7, color="C0")
    if optimum >= 0 and np.isfinite(x[optimum, 1]) and np.isfinite(y[optimum, 1]):
        ax.plot(x[optimum, 1], y[optimum, 1], "*", color="C3", ms=13, label=f"robust optimum #{optimum}")
    ax.plot([], [], "o", color="0.6", mfc="white", ms=5, label="dropped by the race (fewer samples)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    ax.margins(0.08)


def _figure(title: str, notes: str):
    fig = new_figure(7.5, 5.2)
    suptitle(fig, title, [notes])
    return fig, fig.add_subplot(1, 1, 1)


def throughput_figure(ds, front_out: dict):
    """Decode tokens/s per GPU against tokens/s per user (1 / median TPOT)."""
    per_gpu = _band(_values(ds, "decode_tok_s_per_gpu"))
    with np.errstate(divide="ignore"):
        per_user = _band(1.0 / _values(ds, "tpot_s", 0.5))
    front = pareto_front(per_user[:, 1], per_gpu[:, 1], True, True)
    front_out["throughput"] = front
    fig, ax = _figure("Throughput per GPU against speed per user (modelled)",
                      "medians and 5-95 % bands over each candidate's feasible samples; filled: ran every sample")
    _draw(ax, per_user, per_gpu, front, ds, int(ds.attrs["robust_optimum_candidate"]))
    ax.set_xlabel("tokens/s per user = 1 / median TPOT (tokens/s)")
    ax.set_ylabel("decode throughput per GPU (tokens/s/GPU)")
    return fig


def cost_figure(ds, front_out: dict):
    """The objective against P(constraints met)."""
    name, rq = _objective(ds)
    objective = _band(_values(ds, name, rq))
    p = np.asarray(ds.constraints_met_probability.values, dtype=float) * 100
    p_band = np.stack([p, p, p], axis=1)
    maximize = ds.attrs["search_direction"] == "maximize"
    front = pareto_front(p, objective[:, 1], True, maximize)
    front_out["cost"] = front
    fig, ax = _figure(f"{ds.attrs['search_objective']} against P(constraints met) (modelled)",
                      f"constraints: {ds.attrs['search_constraints']}; objective median and 5-95 % band over "
                      "feasible samples; P over each candidate's samples")
    _draw(ax, p_band, objective, front, ds, int(ds.attrs["robust_optimum_candidate"]))
    ax.axvline(100 * float(ds.attrs["search_confidence"]), color="C3", ls="--", lw=0.8,
               label="confidence asked")
    finite = p[np.isfinite(p)]
    low = min(float(finite.min()) if finite.size else 100.0, 100 * float(ds.attrs["search_confidence"]))
    ax.set_xlim(low - 0.06 * (101.0 - low) - 0.5, 101.0 + 0.02 * (101.0 - low))
    ax.legend(fontsize=7, loc="upper left")
    ax.set_xlabel("P(constraints met) over samples (%)")
    ax.set_ylabel(f"{ds.attrs['search_objective']} ({_units(ds)})")
    return fig


# -- the report --------------------------------------------------------------------------------------------------


def write_search_files(ds: xr.Dataset, out: Path) -> Path:
    """Write the search report into the folder ``out``; returns the path of ``summary.md``."""
    fronts: dict = {}
    with matplotlib.rc_context({"text.parse_math": False}):
        figures = [save(throughput_figure(ds, fronts), out / "pareto_throughput.png"),
                   save(cost_figure(ds, fronts), out / "pareto_cost.png")]
    rows = candidate_rows(ds)
    for row in rows:
        row["on_throughput_front"] = int(fronts["throughput"][row["candidate"]])
        row["on_cost_front"] = int(fronts["cost"][row["candidate"]])
    with open(out / "regret.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()})
    (out / "summary.md").write_text(_markdown(ds, rows, figures, fronts))
    return out / "summary.md"


def _markdown(ds, rows, figures, fronts) -> str:
    a = ds.attrs
    units = _units(ds)
    name = markdown_text(a.get("scenario_name", "unnamed scenario"))
    optimum = int(a["robust_optimum_candidate"])
    lines = [f"# mcsim search: {name}", "", f"> {MODEL_STATEMENT}", "",
             "## Question", "",
             f"{a['search_direction'].capitalize()} `{a['search_objective']}` at quantile {a['search_quantile']:g} "
             f"over Monte Carlo samples, among the candidates that meet `{a['search_constraints']}` "
             f"in at least {100 * a['search_confidence']:g} % of their samples. An infeasible sample fails every "
             "constraint; the objective's quantile is over the candidate's feasible samples.", "",
             f"Space: {markdown_text(a['search_space'])} ({ds.sizes['candidate']} candidates), "
             f"{ds.sizes['sample']} samples x {a.get('requests_per_sample', '?')} requests, seed {a.get('seed')}.",
             "", "## Robust optimum", ""]
    if optimum >= 0:
        lines += [f"**#{optimum}: {markdown_text(candidate_text(ds, optimum))}** -- `{a['search_objective']}` "
                  f"{_fmt(a['robust_optimum_objective'])} {units} at quantile {a['search_quantile']:g}, "
                  f"P(constraints met) {_pct(float(ds.constraints_met_probability.values[optimum]))}.", ""]
    else:
        lines += [f"**{markdown_text(a['robust_optimum'])}.**", ""]
    sentence = tie_sentence(ds)
    if sentence:
        header, *body = _tie_rows(ds, units)
        lines += [markdown_text(sentence) + ".", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(markdown_text(str(c)) for c in row) + " |" for row in body]
        lines += ["", f"Tie-break rule: {markdown_text(a['search_tie_rule'])}", ""]
    elif optimum >= 0 and "search_tie_rtol" in a:
        lines += [f"No other candidate ties with it on the objective (within a relative {a['search_tie_rtol']:g}).",
                  ""]
    lines += ["## The race", "",
              f"Samples per candidate after each round: {a['search_rounds']}; candidates kept after each: "
              f"{a['search_candidates_per_round']}. {a['search_sample_runs']} sample runs, of the "
              f"{a['search_exhaustive_sample_runs']} an exhaustive sweep of the space at {ds.sizes['sample']} "
              "samples needs.", "", f"Rule: {markdown_text(a['search_rule'])}", "",
              "## Regret", "",
              "Per candidate, over the samples it ran: how often it is the best (among the candidates that ran the "
              "sample and met the constraints in it), and by how much it loses where it met them but was not the "
              f"best ({units}). Best first; all candidates in [regret.csv](regret.csv).", ""]
    header = ["#", "candidate", "samples", "last round", "P(met)", f"objective ({units})", "best in",
              f"regret p50 ({units})", f"regret p90 ({units})"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows[:SHOWN]:
        cells = [r["candidate"], markdown_text(_short(ds, r["candidate"])), r["samples_run"], r["survived_round"],
                 _pct(r["p_constraints_met"]), _fmt(r["objective_at_quantile"]), _pct(r["best_in_sample_share"]),
                 _fmt(r["regret_p50"]), _fmt(r["regret_p90"])]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if len(rows) > SHOWN:
        lines += ["", f"First {SHOWN} of {len(rows)} candidates."]
    lines += ["", "## Pareto fronts (modelled)", ""]
    for key, figure, what in (("throughput", figures[0], "throughput per GPU against tokens/s per user"),
                              ("cost", figures[1], "objective against P(constraints met)")):
        members = ", ".join(f"#{c} ({markdown_text(_short(ds, c))})" for c in np.flatnonzero(fronts[key]))
        lines += [f"![{Path(figure).stem}]({figure})", "", f"Front of {what}: {members or 'none'}.", ""]
    lines += ["Candidates the race dropped have fewer samples: their bands are wider and less sure.", ""]
    return "\n".join(lines)

"""The result Dataset of a search (``mcsim search``): dims ``(candidate, sample)``, built through the registries.

Every per-sample variable of a sweep is there (same names, units and attributes, :mod:`mcsim.results.variables`),
for the samples each candidate ran: a sample a candidate did not run is NaN (integer flags: their ``_FillValue``,
-1, which ``xarray.open_dataset`` reads back as NaN). Each search axis is a coordinate along ``candidate`` named by
its path without dots (``deployment.tp`` -> ``deployment_tp``, the path in ``attrs["path"]``). The search's own
variables are registered in :data:`SEARCH_REGISTRY` (``tied_with_best`` marks the candidates tied with the robust
optimum on the objective); the robust optimum (``robust_optimum*``: the candidate, its objective, the candidates
tied with it and the key that chose among them), the racing and tie-break rules and the settings are Dataset
attributes (``search_*``).
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from mcsim.results import dataset as results
from mcsim.results.layout import _plain
from mcsim.results.names import dataset_name
from mcsim.results.units import variable_units
from mcsim.results.variables import REGISTRY, Variable
from mcsim.scenario import draw_uncertain
from mcsim.scenario.schema import READS_CHANGING_KEYS

#: Marks a search result (``mcsim report`` writes the search report for it).
SEARCH_MARK = "search_result"

#: Outcomes of the racing rule, as ``racing_outcome`` flags.
OUTCOMES = ("ran every sample", "dropped: cannot meet the constraints with the confidence asked",
            "dropped: the leader beats it in too many samples")

#: Values of ``tied_with_best``.
TIE_FLAGS = ("not tied with the best", "tied with the best")

#: Units "objective": the objective's own units.
_VARS = [
    Variable("samples_run", (), "samples", "samples run", "Monte Carlo samples the candidate ran: 0 .. n-1 of the "
             "plan (a racing search runs fewer for the candidates it drops).", dtype="int64"),
    Variable("survived_round", (), "1", "last round run",
             "The last round of the search whose samples the candidate ran (1: only the first; the number of rounds: "
             "it ran every sample).", dtype="int64"),
    Variable("racing_outcome", (), "1", "outcome of the racing rule",
             "Whether the candidate ran every sample or why the racing rule dropped it (search_rule says how).",
             dtype="int8"),
    Variable("leader_wins", (), "samples", "samples the optimum beats it in",
             "Samples of the candidate's in which the robust optimum (the final leader) has a strictly better "
             "objective.", dtype="int64"),
    Variable("leader_differs", (), "samples", "samples it and the optimum differ in",
             "Samples of the candidate's in which its objective and the robust optimum's differ (ties are left out "
             "of the sign test).", dtype="int64"),
    Variable("sign_test_p", (), "1", "sign-test p-value against the optimum",
             "P(Binomial(leader_differs, 1/2) >= leader_wins): the racing rule drops a candidate when it is <= "
             "search_alpha (1 when they never differ; NaN for the optimum itself)."),
    Variable("constraints_met", ("sample",), "1", "constraints met in the sample",
             "1 when the candidate is feasible in the sample and every constraint holds (infeasible samples fail "
             "them); -1 (the fill value) where it did not run the sample.", dtype="int8"),
    Variable("constraints_met_probability", (), "1", "P(constraints met)",
             "Share of the candidate's samples that meet every constraint (infeasible samples count as failures).",
             percent=True),
    Variable("objective_at_quantile", (), "objective", "objective at the search quantile",
             "The objective's search_quantile quantile over the candidate's feasible samples."),
    Variable("tied_with_best", (), "1", "tied with the robust optimum on the objective",
             "1 when the candidate is one the robust optimum was chosen from and its objective at the quantile "
             "ties with the best (within a relative search_tie_rtol; the optimum included): search_tie_rule says "
             "which of them was picked.", dtype="int8"),
    Variable("gpus_at_quantile", (), "GPUs", "GPUs deployed at the search quantile",
             "gpus at search_quantile over the candidate's feasible samples: the first tie-break key (fewer wins)."),
    Variable("decode_tok_s_per_gpu_at_quantile", (), "tokens/s/GPU", "decode throughput per GPU at the search quantile",
             "decode_tok_s_per_gpu at search_quantile over the candidate's feasible samples: the second tie-break "
             "key (more wins)."),
    Variable("best_in_sample_share", (), "1", "share of samples it is the best in",
             "Share of its samples in which the candidate has the best objective among the candidates that ran the "
             "sample and met the constraints in it (ties count for each).", percent=True),
    Variable("regret_p50", (), "objective", "median regret",
             "Median over the samples where it met the constraints but was not the best of the objective's distance "
             "from that sample's best (objective units; NaN when it was always the best)."),
    Variable("regret_p90", (), "objective", "90th-percentile regret", "As regret_p50, the 90 % quantile."),
]
SEARCH_REGISTRY: dict[str, Variable] = {v.name: v for v in _VARS}


def search_attrs(name: str, objective: str) -> dict:
    """CF attributes of a search variable; ``objective`` units are those of the registered objective variable."""
    v = SEARCH_REGISTRY[name]
    units = variable_units(REGISTRY[objective].units if v.units == "objective" else v.units)
    long_name = v.long_name.replace("objective", objective) if v.units == "objective" else v.long_name
    attrs = {**units, "long_name": long_name, "description": v.description, "source": "modelled"}
    if v.dims:  # a per-candidate summary over samples has no sample dim for a CF cell method to name
        attrs["cell_methods"] = "sample: point"
    flags = {"racing_outcome": OUTCOMES, "tied_with_best": TIE_FLAGS}.get(name)
    if flags:
        attrs.update(flag_values=np.arange(len(flags), dtype=np.int8),
                     flag_meanings=" ".join(results.flag_meaning(o) for o in flags))
    if v.dtype.startswith("int") and v.dims:
        attrs["_FillValue"] = np.array(-1, dtype=v.dtype)
    return attrs


def _per_candidate(plan, parts, runs) -> list[xr.Dataset]:
    """Each candidate's samples as a sweep's Dataset, reindexed to every sample of the plan."""
    every = np.arange(plan.samples)
    out = []
    for point, n in enumerate(runs):
        chunks = range(math.ceil(int(n) / plan.chunk_size))
        table = results.concat_tables([parts[(point, c)] for c in chunks])
        ds = results.dataset_from_table(table, ("factory",), np.arange(int(n)), {}, {})
        fill = {name: -1 for name, v in ds.data_vars.items() if v.dtype.kind in "iu"}
        for name in fill:
            ds[name].attrs["_FillValue"] = np.array(-1, dtype=ds[name].dtype)
        out.append(ds.reindex(sample=every, fill_value={**fill}))
    return out


def _describe(v) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def candidate_text(ds: xr.Dataset, index: int) -> str:
    """``deployment.tp=2, hardware.preset=h100`` for candidate ``index`` of a search result."""
    names = str(ds.attrs.get("search_axes", "")).split()
    return ", ".join(f"{ds[n].attrs['path']}={_describe(_plain(ds[n].values[index]))}" for n in names)


def search_dataset(plan, settings, state, decision, schedule, history, parts, attrs, values) -> xr.Dataset:
    """The Dataset of a finished search (see the module docstring); ``values``: the search's own variables of
    every candidate, by name (:func:`mcsim.optimize.criteria.candidate_figures`)."""
    q = settings.question
    runs = state.runs
    stacked = xr.concat(_per_candidate(plan, parts, runs), dim="candidate", data_vars="all", coords="minimal",
                        compat="override", combine_attrs="override")
    stacked = stacked.assign_coords(candidate=np.arange(len(plan.grid), dtype=np.int64))
    stacked.candidate.attrs.update(long_name="candidate configuration", units="1",
                                   description="index of the grid point of the search space (C order, the last "
                                               "--space axis fastest)")
    names = []
    for axis in plan.axes:
        name = dataset_name(axis.path)
        names.append(name)
        stacked = stacked.assign_coords({name: ("candidate", [g[axis.path] for g in plan.grid])})
        stacked[name].attrs.update(results.grid_axis_attrs(axis.path))
    for name, data in values.items():
        dims = ("candidate",) + SEARCH_REGISTRY[name].dims
        stacked[name] = (dims, np.asarray(data, dtype=SEARCH_REGISTRY[name].dtype),
                         search_attrs(name, q.objective.name))
    swept = {a.path for a in plan.axes}

    draws = draw_uncertain(plan.scn, np.arange(plan.samples), plan.seed, n_samples=plan.samples,
                           include_unused=bool(swept & set(READS_CHANGING_KEYS)))
    for path, drawn in draws.items():
        if path not in swept:
            name, variable = results.input_variable(path, drawn)
            stacked[name] = variable
    optimum = decision.leader
    total = len(plan.grid) * plan.samples
    attrs = dict(attrs)
    attrs.update({
        SEARCH_MARK: 1,
        "search_axes": " ".join(names),
        "search_space": "; ".join(f"{a.path}={','.join(_describe(v) for v in a.values)}" for a in plan.axes),
        "search_objective": q.objective.label,
        "search_direction": q.direction,
        "search_quantile": float(q.quantile),
        "search_constraints": "; ".join(c.text for c in q.constraints) or "none",
        "search_confidence": float(q.confidence),
        "search_alpha": float(settings.alpha),
        "search_rounds": " ".join(str(n) for n in schedule),
        "search_candidates_per_round": " ".join(str(k) for _, k in history),
        "search_sample_runs": int(runs.sum()),
        "search_exhaustive_sample_runs": int(total),
        "search_rule": RULE_TEXT.format(first=schedule[0], alpha=settings.alpha),
        "search_tie_rule": decision.tie_rule,
        "search_tie_rtol": float(decision.tie_rtol),
        "robust_optimum_candidate": -1 if optimum is None else int(optimum),
        # the candidates tied on the objective, the optimum included, as space-separated indices ("none": no optimum)
        "robust_optimum_tied": " ".join(str(c) for c in np.flatnonzero(values["tied_with_best"])) or "none",
        "robust_optimum_decided_by": decision.decided_by,
    })
    stacked.attrs = attrs
    if optimum is None:
        stacked.attrs["robust_optimum"] = (f"none: no candidate meets the constraints with probability >= "
                                           f"{q.confidence:g} over its samples")
        stacked.attrs["robust_optimum_objective"] = math.nan
    else:
        stacked.attrs["robust_optimum"] = candidate_text(stacked, optimum)
        stacked.attrs["robust_optimum_objective"] = float(values["objective_at_quantile"][optimum])
    return results.describe_coordinates(stacked)


#: The racing rule and its risk, as the search_rule attribute states it.
RULE_TEXT = (
    "Successive rounds of samples on common random numbers: every candidate runs the first {first} samples, "
    "then the candidates still in the race double their samples each round up to the final count. After a round "
    "a candidate is dropped when (1) even meeting the constraints in every remaining sample it could not reach "
    "P(constraints met) >= confidence, or the one-sided upper {alpha:g}-level Clopper-Pearson bound on that "
    "probability is below the confidence; or (2) the leader (the robust optimum among the candidates with the "
    "most samples, on those samples) is better in so many of the candidate's samples that a paired sign test "
    "rejects, at level {alpha:g}, that the candidate is better in half of the samples where they differ (ties are "
    "left out: a candidate equal to the leader so far stays in the race). A dropped candidate "
    "returns when the leader that dropped it loses its lead. Risk: the rule judges a dropped candidate by its "
    "own first samples; a candidate truly better than the final optimum is dropped with probability at most "
    "{alpha:g} per round it is tested in when it beats it in half the samples (much less when it beats it more "
    "often), and the sign test compares candidates sample by sample, which ranks their quantiles the same way "
    "only when their objectives move together over samples (common random numbers make them); a candidate that "
    "wins rarely but by much in the quantile's tail can be dropped wrongly. Infeasible samples count as "
    "constraint failures."
)

"""The Python API of a search: :func:`search` (``mcsim.search``)."""

from __future__ import annotations

import math

from mcsim.execution.api import _as_scenario, _call
from mcsim.optimize import criteria, racing
from mcsim.scenario import grid

#: Most candidates a search races (each runs at least a first round of samples): more is a sweep's job.
MAX_CANDIDATES = 1024


def search(scenario, space=(), *, objective: str = "cost_usd_per_mtok", maximize: bool = False,
           constraints=(), confidence: float = 0.9, quantile: float = 0.5, samples=None, requests=None, seed=None,
           overrides=(), first_round: int = 4, alpha: float = 0.1, workers=None, progress=False, output=None,
           force=False, resume=False, command=None, **dask_options):
    """The robust optimum of ``space`` (the scenario's ``[sweep]`` axes plus ``space``: ``"path=v1,v2"`` or
    ``"path=start:stop:num[:log]"`` strings, or :class:`~mcsim.scenario.grid.Axis`) by a racing search.

    Parameters
    ----------
    scenario : str, Path or Scenario
    space : sequence of str or Axis
        The search axes; every grid point is a candidate.
    objective : str
        A per-sample result variable (``NAME@Q`` picks a per-request quantile of a latency variable).
    maximize : bool
        Maximize the objective (default: minimize it).
    constraints : sequence of str
        ``"NAME>=VALUE"`` (or ``<=``, ``>``, ``<``), each to hold in a sample for it to count as met.
    confidence : float
        The share of samples in which a candidate must meet every constraint.
    quantile : float
        The objective's quantile over samples that is optimized (0.5: the median).
    samples : int, optional
        Final samples per candidate (default: ``[mc] samples``).
    first_round : int
        Samples of the first round (every candidate runs them).
    alpha : float
        Level of the racing rule's tests (:func:`mcsim.optimize.criteria.decide`).
    output, force, resume, workers, progress, processes, scheduler
        As in :func:`mcsim.sweep`.

    Returns
    -------
    xarray.Dataset
        Dims ``(candidate, sample)``; ``attrs["robust_optimum"]`` names the optimum (see
        :mod:`mcsim.results.search_dataset`). Candidates whose objective at the quantile ties with the optimum's
        (within a relative 1e-12) have ``tied_with_best == 1``; the optimum is the one of them with the fewest GPUs,
        then the highest ``decode_tok_s_per_gpu``, then the first in the space's order
        (``attrs["robust_optimum_decided_by"]`` says which key chose, ``attrs["search_tie_rule"]`` states the rule).

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.search("scenarios/dense-node.toml", ["deployment.tp=2,4,8", "hardware.preset=h100,h200"],
    ...                   constraints=["slo_attainment>=0.95"], samples=8)  # doctest: +SKIP
    >>> ds.attrs["robust_optimum"]  # doctest: +SKIP
    """
    command = command or _call(
        "search", scenario, [a if isinstance(a, str) else f"{a.path}={','.join(map(str, a.values))}" for a in space],
        objective=None if objective == "cost_usd_per_mtok" else objective, maximize=maximize,
        constraints=tuple(constraints), confidence=None if confidence == 0.9 else confidence,
        quantile=None if quantile == 0.5 else quantile, samples=samples, requests=requests, seed=seed,
        overrides=overrides, first_round=None if first_round == 4 else first_round,
        alpha=None if alpha == 0.1 else alpha, output=None if output is None else str(output), force=force,
        resume=resume)
    question = criteria.Question(criteria.parse_metric(objective, "--objective"), bool(maximize), float(quantile),
                                 tuple(criteria.parse_constraint(c) for c in constraints), float(confidence))
    settings = racing.Settings(question, int(first_round), float(alpha))
    scn = _as_scenario(scenario, overrides)
    axes = list(scn.sweep) + grid.command_line_axes(space, "--space")
    if not axes:
        raise criteria.SearchError("--space: a search needs at least one axis, e.g. --space deployment.tp=2,4,8")
    axes = grid.validate_axes(scn, axes, "--space")
    candidates = math.prod(len(a.values) for a in axes)
    if candidates > MAX_CANDIDATES:
        raise criteria.SearchError(f"--space: {candidates:,} candidates; a search races at most {MAX_CANDIDATES:,} "
                                   "(narrow an axis, or sweep the space with mcsim sweep)")
    plan = racing.search_plan(scn, axes, settings, samples=samples, requests=requests, seed=seed, workers=workers)
    return racing.race(plan, settings, output=output, resume=resume, force=force, workers=workers,
                       progress=progress, command=command, **dask_options)

"""The racing search on Dask: rounds of samples for the candidates still in the race, parts saved as they finish.

A candidate is a grid point of the search space and a task is (candidate, chunk of samples), exactly as in a sweep
(:mod:`mcsim.execution.executor`): the same :class:`~mcsim.execution.executor.Plan`, the same
:func:`~mcsim.execution.executor.run_task`, the same parts on disk with their fingerprints and the same Dask
clients. Every candidate runs the samples ``0 .. n-1`` of the plan, so a candidate's value in sample ``s`` is
bit-for-bit the value a sweep of the same space gives there (common random numbers across candidates).

Round ``r`` brings every candidate still in the race to ``schedule[r]`` samples; then the racing rule
(:func:`mcsim.optimize.criteria.decide`) drops those that can no longer be the robust optimum. A dropped candidate
comes back (and catches up on the samples it missed) when the leader that dropped it loses its lead, so the search
ends with every candidate either run on all samples or dropped by its own samples against the final leader.

Each decision depends only on the values of the samples run, so the search is bit-identical whatever the workers,
the scheduler or an interruption: ``resume`` reloads the parts saved and replays the same rounds, running only what
is missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.execution import executor
from mcsim.optimize import criteria
from mcsim.results import dataset as results
from mcsim.results.search_dataset import search_dataset


class SearchInterrupted(executor.SweepInterrupted):
    """The search stopped before its last round finished; its finished parts are kept."""

    def __init__(self, saved: int, round_number: int, parts_dir: Path | None):
        where = f" in {parts_dir}" if parts_dir else ""
        hint = "; run the same command again with --resume to finish it" if parts_dir else ""
        executor.McsimError.__init__(self, f"interrupted in round {round_number}: {saved} tasks finished and "
                                           f"saved{where}{hint}")
        self.done, self.total, self.parts_dir = saved, None, parts_dir


@dataclass(frozen=True)
class Settings:
    """How a search races: the question, the first round's samples and the rule's level ``alpha``."""

    question: criteria.Question
    first_round: int = 4
    alpha: float = 0.1

    def __post_init__(self):
        if self.first_round < 1:
            raise criteria.SearchError(f"--first-round {self.first_round}: expected at least 1 sample")
        if not 0.0 < self.alpha < 1.0:
            raise criteria.SearchError(f"--alpha {self.alpha:g}: expected a level in (0, 1), e.g. 0.1")


@dataclass
class Race:
    """The state of a search: values of the samples run, per candidate and sample."""

    settings: Settings
    candidates: int
    samples: int

    def __post_init__(self):
        shape = (self.candidates, self.samples)
        q = self.settings.question
        self.objective = np.full(shape, np.nan)
        self.feasible = np.full(shape, np.nan)
        self.values = {c.metric.label: np.full(shape, np.nan) for c in q.constraints}
        # the tie-break keys of the robust optimum (criteria.pick_optimum), whatever the objective
        self.gpus = np.full(shape, np.nan)
        self.throughput = np.full(shape, np.nan)
        self.runs = np.zeros(self.candidates, dtype=np.int64)

    def add(self, point: int, samples: np.ndarray, table: dict) -> None:
        q = self.settings.question
        self.objective[point, samples] = q.objective.from_table(table)
        self.feasible[point, samples] = np.asarray(table["feasible"], dtype=float)[:, 0]
        for c in q.constraints:
            self.values[c.metric.label][point, samples] = c.metric.from_table(table)
        self.gpus[point, samples] = criteria.TIE_GPUS.from_table(table)
        self.throughput[point, samples] = criteria.TIE_THROUGHPUT.from_table(table)

    @property
    def met(self) -> np.ndarray:
        return self.settings.question.met(self.feasible, self.values)

    @property
    def tie_keys(self) -> dict:
        """GPUs and throughput over feasible samples only, as the objective's quantile is."""
        feasible = self.feasible == 1
        return {"gpus": np.where(feasible, self.gpus, np.nan),
                "throughput": np.where(feasible, self.throughput, np.nan)}

    def decide(self) -> criteria.Decision:
        return criteria.decide(self.settings.question, self.objective, self.met, self.runs, self.samples,
                               self.settings.alpha, **self.tie_keys)


def _chunks_between(plan: executor.Plan, start: int, stop: int) -> range:
    """Chunks holding samples ``start .. stop-1`` (``start`` is a chunk boundary)."""
    return range(start // plan.chunk_size, math.ceil(stop / plan.chunk_size))


def search_plan(scn, axes, settings: Settings, samples=None, requests=None, seed=None, workers=None) -> executor.Plan:
    """The plan of a search: the space's grid, the final sample count, one chunk per first-round block."""
    total = int(samples or scn["mc.samples"])
    return executor.make_plan(scn, ("factory",), axes=axes, samples=total, requests=requests, seed=seed,
                              chunk_size=min(settings.first_round, total), workers=workers)


def race(plan: executor.Plan, settings: Settings, *, output=None, resume: bool = False, force: bool = False,
         workers=None, processes: bool = False, scheduler=None, progress: bool = False,
         command: str | None = None) -> xr.Dataset:
    """Run the search of ``plan`` round by round and return its result Dataset (see
    :func:`mcsim.results.search_dataset.search_dataset`); with ``output``, parts are saved as in a sweep and the
    result is written there as NetCDF.

    Raises
    ------
    SearchInterrupted
        On Ctrl-C; finished parts are kept for ``resume``.
    """
    workers = executor.check_workers(plan, workers, processes, scheduler)
    fingerprint = plan.fingerprint()
    grid = plan.grid
    schedule = criteria.round_schedule(plan.samples, plan.chunk_size)
    every = [(p, c) for p in range(len(grid)) for c in range(len(plan.chunks))]
    output = None if output is None else Path(output)
    # parts are a cache: a part a round does not ask for (left by a search with other settings) is never used
    parts, parts_dir, reused, recomputed = executor.open_parts(plan, every, fingerprint, output, resume, force)
    state = Race(settings, len(grid), plan.samples)
    active = np.ones(len(grid), dtype=bool)
    history = []
    client = cluster = None
    round_index = 0
    try:
        while True:
            target = schedule[round_index]
            need = [(int(p), c) for p in np.flatnonzero(active & (state.runs < target))
                    for c in _chunks_between(plan, int(state.runs[p]), target)]
            todo = [t for t in need if t not in parts]
            if todo:
                if client is None:
                    executor.check_inputs(plan)
                    executor._warm_up(plan)
                    client, cluster = executor._client(workers, processes, scheduler)
                try:
                    executor._run_tasks(plan, todo, parts, parts_dir, fingerprint, workers, processes, scheduler,
                                        progress, len(need), client=client)
                except executor.SweepInterrupted:
                    raise SearchInterrupted(len(parts), round_index + 1, parts_dir) from None
            for p, c in need:
                state.add(p, plan.chunks[c], parts[(p, c)])
            state.runs[active & (state.runs < target)] = target
            decision = state.decide()
            active = ~decision.dropped
            if np.any(active & (state.runs < target)):
                continue  # a candidate back in the race catches up on this round's samples first
            history.append((target, int(active.sum())))
            if round_index == len(schedule) - 1:
                break
            round_index += 1
    except BaseException:
        if parts_dir is not None and parts_dir.is_dir() and not any(parts_dir.glob("*.npz")):
            executor.remove_parts(parts_dir)
        raise
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    attrs = executor.run_attrs(plan, command, fingerprint, reused, recomputed)
    try:
        values = criteria.candidate_figures(settings.question, state.objective, state.met, state.runs, decision,
                                            schedule, plan.samples, **state.tie_keys)
        ds = search_dataset(plan, settings, state, decision, schedule, history, parts, attrs, values)
        if output is not None:
            results.write_netcdf(ds, output, force=force)
    except KeyboardInterrupt:  # every part is saved: the rerun with --resume only assembles them
        raise SearchInterrupted(len(parts), len(schedule), parts_dir if output is not None else None) from None
    if output is not None:
        executor.remove_parts(parts_dir)
    return ds

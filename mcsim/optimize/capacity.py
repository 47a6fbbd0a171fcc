"""The highest arrival rate a deployment serves within its SLOs: ``mcsim capacity`` and :func:`mcsim.capacity`.

The deployment is the scenario's fleet held fixed (``deployment.fleet = "fixed"`` with its ``instances`` and
``prefill_instances``: a fleet that grows with the load has no capacity). A sample *meets its SLOs* at a rate when it
is feasible, the batching simulator does not saturate, and its ``slo_quantile`` TTFT and TPOT (host costs included,
the figures ``ttft_at_slo_quantile_s`` / ``tpot_at_slo_quantile_s`` of a run) are within ``deployment.ttft_target_s``
(when set) and ``deployment.tpot_target_s`` -- the test ``fleet = "slo"`` puts each candidate fleet to.

Each sample is bisected on its own, on common random numbers: every rate it tries runs the same sample (the same
draws of the uncertain inputs, the same random streams; the arrival gaps of a rate are those of another scaled), so
two rates differ only by the rate. From the scenario's rate (its draw, for an uncertain rate) the rate is doubled
until the SLOs break or halved until they hold, then bisected geometrically until the highest rate that met them and
the lowest that broke them are within ``rtol`` of each other. A sample's answer therefore depends only on its own
runs: bit-identical whatever the workers, the scheduler or the order the samples run in.

A replayed trace is bisected on ``workload.trace_time_scale`` (its recorded gaps divided by the scale) and the rate
is reported in requests per second of the replay. Sessions do not scale with the rate: their turns keep their think
times, so at a higher rate more sessions overlap in the first ``mc.requests`` requests (the mix of turns a sample
sees shifts a little with the rate). Whether the SLOs hold need not be monotone in the rate for one sample; the
bisection returns one crossing, bracketed by a rate that met and one that broke.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.errors import McsimError
from mcsim.execution import executor
from mcsim.execution import sample as one_sample
from mcsim.execution.api import _as_scenario, _call
from mcsim.results import dataset as results
from mcsim.results.capacity_dataset import CAPACITY_MARK, OUTCOMES, capacity_dataset
from mcsim.scenario import Scenario, draw_uncertain, resolve

RATE = "workload.rate_rps"
SCALE = "workload.trace_time_scale"
#: How far (a factor of 2 a step) the bracket search goes from the scenario's rate before it gives up.
MAX_DOUBLINGS = 12


class CapacityError(McsimError, ValueError):
    """A capacity question that cannot be asked of this scenario (a closed loop, a bad bracket)."""


#: The narrowest final bracket: below it a rate's SLO verdict is decided by one sample's noise, and a bracket of
#: 1e-17 would need more bisections than a float can tell apart (they would never end).
MIN_RTOL = 1e-4
#: At most this many bisections, whatever the bracket: from a bracket of 10^6 x, 40 reach 1e-4.
MAX_BISECTIONS = 40


@dataclass(frozen=True)
class Settings:
    """How the rate is bisected: the relative width of the final bracket, and optional bounds in requests/s."""

    rtol: float = 0.02
    low: float | None = None
    high: float | None = None

    def __post_init__(self):
        if not MIN_RTOL <= self.rtol <= 1.0:
            raise CapacityError(f"--rtol {self.rtol:g}: expected a relative width in [{MIN_RTOL:g}, 1], e.g. 0.02 "
                                "(a sample's own noise is wider than the floor)")
        for name, value in (("--low", self.low), ("--high", self.high)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise CapacityError(f"{name} {value:g}: expected a positive rate in requests/s")
        if self.low is not None and self.high is not None and not self.low < self.high:
            raise CapacityError(f"--low {self.low:g} --high {self.high:g}: expected low < high")


def knob(scn: Scenario) -> str:
    """The scenario path the rate is set through: ``workload.rate_rps``, or a trace's ``trace_time_scale``."""
    return SCALE if scn["workload.trace"] else RATE


def fixed_deployment(scn: Scenario) -> Scenario:
    """The scenario, checked for a capacity question: a closed loop, or a disaggregated deployment without its
    prefill fleet, is refused. A fleet the scenario sizes (``fleet = "utilization"`` or ``"slo"``) is sized per
    sample at the scenario's own rate and then held fixed (:func:`sample_capacity`)."""
    if scn["performance.closed_loop_users"]:
        raise CapacityError(f"{scn.source}: performance.closed_loop_users = {scn['performance.closed_loop_users']}: "
                            "a closed loop sets its own arrival rate; capacity is asked of open-loop arrivals "
                            "(set performance.closed_loop_users = 0)")
    fixed = scn["deployment.fleet"] == "fixed"  # a sized fleet sizes its prefill pool too
    if fixed and scn["deployment.disaggregated"] and scn["deployment.prefill_instances"] < 1:
        raise CapacityError(f"{scn.source}: deployment.prefill_instances = 0: a disaggregated deployment's capacity "
                            "needs its prefill fleet (set deployment.prefill_instances >= 1)")
    return scn


def slo_met(metrics: dict, p: dict) -> bool:
    """Whether one run of a sample meets the SLOs (see the module docstring): ``metrics`` its outputs, ``p`` its
    resolved parameters."""
    if not metrics["feasible"] or metrics["saturated"]:
        return False
    ttft_target = p["deployment.ttft_target_s"]
    if ttft_target > 0 and not metrics["ttft_at_slo_quantile_s"] <= ttft_target:  # NaN: no first token measured
        return False
    return not metrics["tpot_at_slo_quantile_s"] > p["deployment.tpot_target_s"]  # NaN: one-token outputs only


@dataclass(frozen=True)
class Trial:
    """One run of a sample at one rate."""

    value: float  # the knob's value (rate_rps, or a trace's time scale)
    met: bool
    row: dict  # the run's result row (variant -> metric -> value, and its coords)


def sample_capacity(scn: Scenario, settings: Settings, sample: int, seed: int, requests: int,
                    draws: dict) -> dict:
    """One sample's bisection: its trials in order and its outcome (see :data:`OUTCOMES`)."""
    path = knob(scn)
    p0 = resolve(scn, draws)
    start = float(p0[path])
    # the scale of one request/s: a generated workload's rate is the knob itself; a trace's is its time scale times
    # its recorded rate, learnt from the first run (its arrival span scales exactly as 1 / time scale)
    per_rps = None if path == SCALE else 1.0
    trials: list[Trial] = []
    if scn["deployment.fleet"] != "fixed":
        # the fleet the scenario deploys for its own load, held fixed while the rate moves: its capacity
        sized = one_sample.run_sample(scn, {"factory": {}}, sample, seed, requests, draws)
        fleet = sized["factory"]
        if not fleet["feasible"]:
            trials.append(Trial(start, False, sized))
            return _outcome(trials, None, None, "infeasible", per_rps)
        held = {"deployment.fleet": "fixed", "deployment.instances": max(1, int(fleet["decode_instances"]))}
        if scn["deployment.disaggregated"]:
            held["deployment.prefill_instances"] = max(1, int(fleet["prefill_instances"]))
        scn = scn.with_values(held, origin="capacity")

    def run(value: float) -> Trial:
        nonlocal per_rps
        at = scn.with_values({path: value}, origin="capacity")
        row = one_sample.run_sample(at, {"factory": {}}, sample, seed, requests, draws)
        metrics = row["factory"]
        if per_rps is None and metrics["trace_duration_s"] > 0:
            per_rps = value / (requests / metrics["trace_duration_s"])
        trial = Trial(value, slo_met(metrics, resolve(at, draws)), row)
        trials.append(trial)
        return trial

    def to_value(rps):
        return None if rps is None else rps * per_rps

    first = run(start if settings.low is None or path == SCALE else settings.low)
    if not first.row["factory"]["feasible"]:
        return _outcome(trials, None, None, "infeasible", per_rps)
    low, high = to_value(settings.low), to_value(settings.high)
    if settings.low is not None and path == SCALE:  # the trace's rate is known only now
        first = run(low)
    lo = first if first.met else None
    hi = None if first.met else first
    if high is not None and lo is not None:
        top = run(high)
        if top.met:
            return _outcome(trials, top, None, "SLOs met at the highest rate tried", per_rps)
        hi = top
    for _ in range(MAX_DOUBLINGS):
        if lo is not None and hi is not None:
            break
        if lo is None:
            trial = run(hi.value / 2)
            lo, hi = (trial, hi) if trial.met else (None, trial)
        else:
            trial = run(lo.value * 2 if high is None else min(lo.value * 2, high))
            lo, hi = (trial, None) if trial.met else (lo, trial)
    if lo is None:
        return _outcome(trials, None, hi, "SLOs not met at the lowest rate tried", per_rps)
    if hi is None:
        return _outcome(trials, lo, None, "SLOs met at the highest rate tried", per_rps)
    for _ in range(MAX_BISECTIONS):
        if hi.value <= lo.value * (1 + settings.rtol):
            break
        trial = run(math.sqrt(lo.value * hi.value))
        lo, hi = (trial, hi) if trial.met else (lo, trial)
    return _outcome(trials, lo, hi, "bracketed", per_rps)


def _outcome(trials, lo, hi, outcome: str, per_rps) -> dict:
    per_rps = per_rps or 1.0
    kept = lo if lo is not None else (hi if hi is not None else trials[0])
    return {"capacity_rps": lo.value / per_rps if lo is not None else math.nan,
            "breaking_rps": hi.value / per_rps if hi is not None else math.nan,
            "outcome": OUTCOMES.index(outcome), "trials": len(trials),
            "rates_tried_rps": [t.value / per_rps for t in trials], "slo_met_tried": [t.met for t in trials],
            "row": kept.row}


def _task(scn, settings, samples, seed, requests, draws) -> list[dict]:
    return [sample_capacity(scn, settings, int(s), seed, requests, {k: float(v[j]) for k, v in draws.items()})
            for j, s in enumerate(samples)]


def capacity(scenario, *, samples=None, requests=None, seed=None, overrides=(), rtol: float = 0.02, low=None,
             high=None, workers=None, processes=False, scheduler=None, progress=False, output=None, force=False,
             command=None) -> xr.Dataset:
    """The highest arrival rate at which the scenario's deployment meets its SLOs, per Monte Carlo sample.

    Parameters
    ----------
    scenario : str, Path or Scenario
    samples, requests, seed, overrides
        As in :func:`mcsim.run`.
    rtol : float
        Relative width of each sample's final bracket (0.02: the rate that met and the rate that broke differ by
        at most 2 %).
    low, high : float, optional
        Rates (requests/s) to bracket from instead of the scenario's own: the search never goes above ``high``.
    workers, processes, scheduler, progress
        As in :func:`mcsim.run`: samples run in parallel, each sample's bisection in one task.
    output : path, optional
        NetCDF file to write (refused when it exists, unless ``force``).

    Returns
    -------
    xarray.Dataset
        Dim ``sample``: ``capacity_rps`` (the highest rate tried that met the SLOs), ``breaking_rps`` (the lowest
        above it that broke them), ``capacity_outcome`` and every result variable of the run at ``capacity_rps``
        (see :mod:`mcsim.results.capacity_dataset`).

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.capacity("scenarios/dense-node.toml", samples=8, requests=3000)  # doctest: +SKIP
    >>> ds.capacity_rps.quantile([0.05, 0.5, 0.95])  # doctest: +SKIP
    """
    command = command or _call("capacity", scenario, samples=samples, requests=requests, seed=seed,
                               overrides=overrides, rtol=None if rtol == 0.02 else rtol, low=low, high=high,
                               output=None if output is None else str(output), force=force)
    settings = Settings(float(rtol), None if low is None else float(low), None if high is None else float(high))
    scn = fixed_deployment(_as_scenario(scenario, overrides))
    plan = executor.make_plan(scn, ("factory",), samples=samples, requests=requests, seed=seed, workers=workers)
    if output is not None:
        executor.check_output(Path(output), force, inputs=plan.own_inputs())
    workers = executor.check_workers(plan, workers, processes, scheduler)
    executor.check_inputs(plan)
    draws = draw_uncertain(scn, np.arange(plan.samples), plan.seed, n_samples=plan.samples)
    executor._warm_up(plan)
    outcomes = _fan_out(plan, settings, draws, workers, processes, scheduler, progress)
    attrs = results.provenance(scn, plan.seed, plan.samples, plan.requests, command, {
        CAPACITY_MARK: 1, "capacity_knob": knob(scn), "capacity_rtol": settings.rtol,
        "capacity_low_rps": math.nan if low is None else float(low),
        "capacity_high_rps": math.nan if high is None else float(high),
        "capacity_deployment": "",
        "capacity_slo": _slo(scn),
    })
    ds = capacity_dataset(outcomes, draws, attrs)
    ds.attrs["capacity_deployment"] = _deployment(scn, ds)
    if output is not None:
        results.write_netcdf(ds, output, force=force)
    return ds


def _deployment(scn: Scenario, ds: xr.Dataset | None = None) -> str:
    """The fleet whose capacity was asked, in words: as written (``fixed``) or as the scenario sized it per sample
    (the range over samples, read from the runs at capacity)."""
    simulation = f"({scn['deployment.fleet_simulation']} simulation)"
    if scn["deployment.fleet"] == "fixed":
        pools = f"{scn['deployment.instances']} decode instance(s)"
        if scn["deployment.disaggregated"]:
            pools += f" and {scn['deployment.prefill_instances']} prefill instance(s)"
        return f"fleet = fixed: {pools} {simulation}"

    def span(name):
        values = ds[name].values[np.isfinite(ds[name].values)] if ds is not None and name in ds else []
        if len(values) == 0:
            return "?"
        lo, hi = int(values.min()), int(values.max())
        return f"{lo}" if lo == hi else f"{lo}-{hi}"

    pools = f"{span('decode_instances')} decode instance(s)"
    if scn["deployment.disaggregated"]:
        pools += f" and {span('prefill_instances')} prefill instance(s)"
    return (f"fleet = {scn['deployment.fleet']}, sized per sample at the scenario's own rate and then held fixed: "
            f"{pools} {simulation}")


def _slo(scn: Scenario) -> str:
    q = scn["deployment.slo_quantile"]
    parts = []
    if not isinstance(scn["deployment.ttft_target_s"], float) or scn["deployment.ttft_target_s"] > 0:
        parts.append(f"TTFT p{100 * q:g} <= {scn['deployment.ttft_target_s']} s")
    parts.append(f"TPOT p{100 * q:g} <= {scn['deployment.tpot_target_s']} s")
    return " and ".join(parts) + ", not saturated (deployment.slo_quantile, ttft_target_s, tpot_target_s)"


def _fan_out(plan, settings, draws, workers, processes, scheduler, progress) -> list[dict]:
    """Every sample's bisection, one task a chunk of samples, on the executor's Dask client (a local cluster of
    threads or processes, or a scheduler's)."""
    client, cluster = executor._client(workers, processes, scheduler)
    chunks = plan.chunks
    bar = executor._progress_bar(plan.samples, 0) if progress else None
    try:
        futures = [client.submit(_task, plan.scn, settings, indices, plan.seed, plan.requests,
                                 {k: v[indices] for k, v in draws.items()}, pure=False, key=f"mcsim-capacity-{c}")
                   for c, indices in enumerate(chunks)]
        out = []
        for future, indices in zip(futures, chunks):  # in sample order; Ctrl-C stops the wait and the client
            out += future.result()
            if bar is not None:
                bar.update(len(indices))
    finally:
        if bar is not None:
            bar.close()
        client.close()
        if cluster is not None:
            cluster.close()
    return out

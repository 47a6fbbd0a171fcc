"""The Python API of a run: :func:`run`, :func:`compare`, :func:`sweep` and :func:`open_results`.

Each is a few lines over :func:`mcsim.execution.executor.execute`, which fans (grid point x chunk of samples)
tasks out over Dask. Results are bit-identical whatever the chunk size, number of workers or scheduler.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.execution import auto_requests
from mcsim.execution import executor as _sweep
from mcsim.execution.sample import sample_variants, variant_specs, variant_stages
from mcsim.results.dataset import write_netcdf
from mcsim.scenario import Scenario, ScenarioError, draw_uncertain, grid, load_scenario


def _call(function: str, scenario, *args, **kwargs) -> str:
    """The Python statement that runs again what ``function`` was asked: the ``command_line`` attribute of a result
    made from Python (arguments at their defaults, and Dask options, which change no number, are left out)."""
    scn_overrides = list(scenario.overrides) if isinstance(scenario, Scenario) else []
    source = scenario.source if isinstance(scenario, Scenario) else str(scenario)
    if scn_overrides:
        kwargs["overrides"] = [*scn_overrides, *kwargs.get("overrides", ())]
    words = [repr(source), *(repr(a) for a in args)]
    for name, value in kwargs.items():
        if value is None or value is False or value == () or value == []:
            continue
        if isinstance(value, tuple):
            value = list(value)
        words.append(f"{name}={value!r}")
    return f"import mcsim; mcsim.{function}({', '.join(words)})"


def _as_scenario(scenario, overrides) -> Scenario:
    if isinstance(scenario, Scenario):
        if not overrides:
            return scenario
        # Re-read the text with every override, so --set values get the same checks as the file's.
        return load_scenario(scenario.source, overrides=[*scenario.overrides, *overrides], text=scenario.text)
    return load_scenario(scenario, overrides=overrides)


def run_variants(scn: Scenario, variants=("factory",), samples=None, requests=None, seed=None, workers=None,
                 chunk_size=None, progress=False, command=None, axes=(), ablate=False, output=None, resume=False,
                 force=False, processes=False, scheduler=None):
    """Run ``samples`` Monte Carlo samples of every variant (and grid point) and return the result Dataset.

    ``requests`` may be ``"auto"`` or ``"auto:N"``: the run grows them until every sample run is at steady state
    (:mod:`mcsim.execution.auto_requests`)."""
    auto = auto_requests.parse(requests, int(scn["mc.requests"]))
    if auto is not None:
        return _grow(scn, variants, auto, samples=samples, seed=seed, workers=workers, chunk_size=chunk_size,
                     progress=progress, command=command, axes=axes, ablate=ablate, output=output, resume=resume,
                     force=force, processes=processes, scheduler=scheduler)
    plan = _sweep.make_plan(scn, variants, axes=axes, samples=samples, requests=requests, seed=seed,
                            chunk_size=chunk_size, workers=workers, ablate=ablate)
    return _sweep.execute(plan, output=output, resume=resume, force=force, workers=workers, processes=processes,
                          scheduler=scheduler, progress=progress, command=command)


def _grow(scn, variants, auto, *, samples, seed, workers, chunk_size, progress, command, axes, ablate, output,
          resume, force, processes, scheduler):
    """Runs at growing requests per sample until steady (see :mod:`mcsim.execution.auto_requests`); only the last
    is written."""
    if resume:
        raise auto_requests.RequestsError("--requests auto and --resume exclude each other: each run of the growth "
                                          "has its own requests; resume a run with --requests N")
    if output is not None:
        _sweep.check_output(Path(output), force)
    requests, cap = auto
    tried = []
    while True:
        plan = _sweep.make_plan(scn, variants, axes=axes, samples=samples, requests=requests, seed=seed,
                                chunk_size=chunk_size, workers=workers, ablate=ablate)
        ds = _sweep.execute(plan, workers=workers, processes=processes, scheduler=scheduler, progress=progress,
                            command=command)
        tried.append(requests)
        requests = auto_requests.next_requests(ds, requests, cap)
        if requests is None:
            break
    ds.attrs["requests_auto"] = auto_requests.describe(tried, cap, ds)
    if output is not None:
        write_netcdf(ds, output, force=force)
    return ds


def run(scenario, *, samples=None, requests=None, seed=None, overrides=(), workers=None, progress=False,
        output=None, force=False, command=None, **dask_options):
    """Run a scenario (file path or :class:`~mcsim.scenario.Scenario`) as written.

    Returns the result :class:`xarray.Dataset` (dims ``sample``, ``tier``, ``request_quantile``); writes it to ``output``
    as NetCDF when given.

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.run("scenarios/factory.toml", samples=8, requests=2000)  # doctest: +SKIP
    >>> ds.gross_margin.quantile([0.05, 0.5, 0.95], dim="sample")  # doctest: +SKIP
    """
    command = command or _call("run", scenario, samples=samples, requests=requests, seed=seed, overrides=overrides,
                               output=None if output is None else str(output), force=force)
    scn = _as_scenario(scenario, overrides)
    return run_variants(scn, ("factory",), samples, requests, seed, workers, progress=progress, command=command,
                        output=output, force=force, **dask_options)


def compare(scenario, *, samples=None, requests=None, seed=None, overrides=(), workers=None, progress=False,
            output=None, force=False, command=None, ablate=False, **dask_options):
    """Run ``baseline`` and ``factory`` on identical requests and draws; the Dataset has a ``variant`` dim.

    With ``ablate=True`` it also runs each lever switched off alone (``without:<lever>``) and on alone
    (``only:<lever>``), and stores every lever's Shapley share of the factory/baseline gain.
    """
    command = command or _call("compare", scenario, samples=samples, requests=requests, seed=seed,
                               overrides=overrides, output=None if output is None else str(output), force=force,
                               ablate=ablate)
    scn = _as_scenario(scenario, overrides)
    return run_variants(scn, ("baseline", "factory"), samples, requests, seed, workers, progress=progress,
                        command=command, output=output, force=force, ablate=ablate, **dask_options)


def sweep(scenario, grid_axes=(), *, variants=("factory",), samples=None, requests=None, seed=None, overrides=(),
          workers=None, progress=False, output=None, force=False, resume=False, command=None, ablate=False,
          **dask_options):
    """Run a grid: the scenario's ``[sweep]`` axes plus ``grid_axes`` (``"path=v1,v2"`` strings or
    :class:`~mcsim.scenario.grid.Axis`). Each axis becomes a dim named by its dotted path without dots
    (``speculative.draft_tokens`` -> ``speculative_draft_tokens``; ``mcsim.sel`` selects by path).

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.sweep("scenarios/sweep.toml", ["speculative.draft_tokens=0,1,2"], samples=8)  # doctest: +SKIP
    >>> ds.cost_usd_per_mtok.median("sample")  # doctest: +SKIP
    """
    command = command or _call(
        "sweep", scenario, [a if isinstance(a, str) else f"{a.path}={','.join(map(str, a.values))}" for a in grid_axes],
        variants=None if tuple(variants) == ("factory",) else tuple(variants), samples=samples, requests=requests,
        seed=seed, overrides=overrides, output=None if output is None else str(output), force=force, resume=resume,
        ablate=ablate)
    scn = _as_scenario(scenario, overrides)
    axes = list(scn.sweep) + grid.command_line_axes(grid_axes)
    axes = grid.validate_axes(scn, axes)
    if ablate:
        variants = ("baseline", "factory")
    return run_variants(scn, variants, samples, requests, seed, workers, progress=progress, command=command,
                        axes=axes, ablate=ablate, output=output, resume=resume, force=force, **dask_options)


def step_log(scenario, *, sample: int = 0, variant: str = "factory", max_steps: int = 10_000, requests=None,
             seed=None, overrides=()):
    """The batching simulator's steps for one sample, for when a number is disbelieved.

    Re-runs sample ``sample`` (same draws and streams as in a run) with ``performance.simulate_batching`` on and
    returns its decode (or colocated) pool's first ``max_steps`` steps as a Dataset with dim ``step``:
    ``start_s``, ``decode_seqs``, ``prefill_tokens``, ``step_s`` and ``waiting`` (requests queued); with
    ``deployment.fleet_simulation = "replicas"`` every instance's steps in order of start, with ``instance``.
    """
    scn = _as_scenario(scenario, [*overrides, "performance.simulate_batching=true"])
    seed = int(scn["mc.seed"] if seed is None else seed)
    requests = int(requests or scn["mc.requests"])
    draws = draw_uncertain(scn, [sample], seed, n_samples=max(int(scn["mc.samples"]), sample + 1))
    (_, _, fleet, _), = sample_variants(scn, (variant,), sample, seed, requests,
                                        {k: float(v[0]) for k, v in draws.items()}, step_log=max_steps)
    log = fleet.step_log
    units = {"start_s": "s", "decode_seqs": "sequences", "prefill_tokens": "tokens", "step_s": "s",
             "waiting": "requests", "instance": "1"}
    replicas = scn["deployment.fleet_simulation"] == "replicas"
    description = ("per-step log of every instance of the pool simulated as replicas (the decode pool when "
                   "disaggregated), in order of start; real time" if replicas else
                   "per-step log of one instance of the batching simulator (the decode pool when disaggregated); "
                   "arrival times are stretched by the pool's instance count")
    return xr.Dataset({k: ("step", np.asarray(v), {"units": units[k], "source": "modelled"}) for k, v in log.items()},
                      attrs={"scenario_name": scn.name, "sample": sample, "variant": variant,
                             "description": description})


def step_time(scenario, *, decode_seqs: float = 1.0, context: float | None = None, prefill_tokens: float = 0.0,
              prefill_context: float | None = None, pool: str = "decode", sample: int = 0, variant: str = "factory",
              requests=None, seed=None, overrides=()) -> dict:
    """One step of one instance as the sample's step model prices it, op by op, with the memory of each pool.

    The stages of sample ``sample`` run first (same draws and streams as in a run), so the step model carries the
    sample's drawn inputs, speculative passes and expert loads; then one step of ``decode_seqs`` decoding
    sequences attending over ``context`` tokens each and ``prefill_tokens`` new prompt tokens is priced.

    Parameters
    ----------
    scenario : str, Path or Scenario
    decode_seqs : float
        Decoding sequences in the step, per instance.
    context : float, optional
        KV length of each decoding sequence, tokens (default: the sample's mean decode context).
    prefill_tokens, prefill_context : float
        Prompt tokens computed in the step, and the mean prefix they attend to (default: the sample's mean).
    pool : {"decode", "prefill"}
        The decode (or colocated) pool, or the prefill pool when disaggregated.
    sample, variant, requests, seed, overrides
        Which sample and variant, its requests, the root seed and ``--set`` overrides.

    Returns
    -------
    dict
        ``step_s``, ``ops`` (name -> ``t_s``, ``share``, ``floor_s`` (the kernel floors inside ``t_s``),
        ``flops``, ``bytes``, ``bound``: "compute", "memory",
        "network", "overhead", "drafting" or, in factor mode, "factor"; ``tp_allreduce`` also has ``implementation``,
        what ran: "custom one-shot", "nccl ring", ...), the step's inputs, ``fidelity`` and
        ``memory`` per pool (weights per GPU, KV bytes per sequence, free KV bytes, sequences that fit, reason).

    Examples
    --------
    >>> import mcsim
    >>> step = mcsim.step_time("scenarios/dense-node.toml", decode_seqs=1, context=2048)  # doctest: +SKIP
    >>> step["ops"]["tp_allreduce"]["t_s"], step["ops"]["overhead"]["t_s"]  # doctest: +SKIP
    """
    if pool not in ("decode", "prefill"):
        raise ValueError(f"pool must be 'decode' or 'prefill', got {pool!r}")
    scn = _as_scenario(scenario, overrides)
    seed = int(scn["mc.seed"] if seed is None else seed)
    n_requests = int(requests or min(int(scn["mc.requests"]), 4000))
    specs = variant_specs(scn, (variant,))
    draws = draw_uncertain(scn, [sample], seed, n_samples=max(int(scn["mc.samples"]), sample + 1))
    p, measured, _, _, _, model = variant_stages(scn, variant, specs[variant], sample, seed, n_requests,
                                                 {k: float(v[0]) for k, v in draws.items()})
    if pool == "prefill" and not model.disaggregated:
        raise ScenarioError(scn.source, "deployment.disaggregated", "a colocated deployment has no prefill pool; "
                            "ask for pool 'decode'")
    step = model.step_time(decode_seqs, context, prefill_tokens, prefill_context, pool=pool)
    total = step.total_s

    def memory(mem):
        return {"weights_gb_per_gpu": mem.weights_per_gpu / 1e9,
                "kv_bytes_per_token_per_gpu": mem.kv_bytes_per_token_per_gpu,
                "kv_gb_per_sequence": mem.kv_bytes_per_sequence / 1e9, "free_kv_gb": mem.free_kv_bytes / 1e9,
                "max_sequences": mem.max_sequences, "fits": bool(mem.fits), "reason": mem.reason}

    pools = {"decode": memory(model.decode_memory)}
    if model.disaggregated:
        pools["prefill"] = memory(model.prefill_memory)
    return {
        "scenario": scn.name, "sample": sample, "variant": variant, "fidelity": model.fidelity, "pool": pool,
        "stack": str(scn["performance.stack"]) if model.fidelity == "roofline" else "",
        "gpus_per_instance": model.prefill_gpus if pool == "prefill" else model.decode_gpus,
        "decode_seqs": float(decode_seqs), "decode_context": model.decode_context if context is None else float(context),
        "prefill_tokens": float(prefill_tokens),
        "prefill_context": model.prefill_context if prefill_context is None else float(prefill_context),
        "verify_tokens": model.verify_tokens, "step_s": total,
        "ops": {name: {"t_s": op["t"], "share": op["t"] / total if total > 0 else float("nan"),
                       "floor_s": op["floor"], "flops": op["flops"], "bytes": op["bytes"], "bound": op["bound"],
                       **({"implementation": op["impl"]} if op.get("impl") else {}),
                       **({"hidden_s": op["hidden"]} if "hidden" in op else {})}
                for name, op in step.ops.items()},
        "memory": pools,
        # what communication can hide behind: the step's compute (every op but the collectives, overheads, drafting)
        "compute_s": sum(op["t"] for name, op in step.ops.items()
                         if "hidden" not in op and name not in ("overhead", "drafting")),
        "modelled": "every figure is modelled from the scenario's assumptions, none is measured",
    }


def calibrate(scenario, path) -> Scenario:
    """The scenario with a calibration file (``mcsim calibrate``, ``mcsim trace --save-calibration``) attached, as
    ``--calibration`` does: ``performance.calibration`` set to ``path`` (relative to the working directory), so later
    overrides keep it (:func:`mcsim.scenario.loading.attach_calibration`; refused for another regime, naming every
    difference)."""
    return _as_scenario(scenario, (f"performance.calibration={json.dumps(str(path))}",))


def open_results(path):
    """Reopen a result file with its metadata (plain ``xarray.open_dataset`` works too).

    The Dataset is loaded into memory and the file closed; ``ds.attrs`` holds the provenance (scenario text,
    seed, command line, mcsim version) and ``ds.attrs["modelled_vs_measured"]`` says what was modelled.
    """
    with xr.open_dataset(path) as ds:
        return ds.load()

"""Result Datasets: built through the variable registry, saved as compressed NetCDF atomically.

A result reopens with plain ``xarray.open_dataset(path)`` and follows the CF conventions (``cfchecks`` passes):
every variable carries CF ``units`` (and the ``display_units`` people read), ``long_name``, ``description``,
``cell_methods`` and whether it is ``modelled`` or ``measured``; uncertain inputs are stored with ``role = "input"``,
named like grid axes by their scenario path without dots (``workload.rate_rps`` -> ``workload_rate_rps``, the path in
``attrs["path"]``, see :mod:`mcsim.results.names`); Dataset attrs carry provenance (:func:`provenance`).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

import numpy as np
import xarray as xr
from packaging.version import Version
from xarray.namedarray import pycompat as xarray_pycompat

from mcsim import __version__
from mcsim.fileio import atomic_path
from mcsim.results.names import dataset_name
from mcsim.scenario import catalog
from mcsim.stages.steady_state import STEADY_WINDOWS_PROFILE, STEADY_WINDOWS_QUARTERS
from mcsim.results.units import input_units
from mcsim.results.variables import (FEASIBLE_REASONS, QUANTILES, REGISTRY, REQUEST_QUANTILE, TIERS, WORKLOAD_CLASS,
                                     attrs_for, check_metrics)

MODEL_STATEMENT = (
    "All output variables are modelled: they follow from the scenario's assumptions through mcsim's comparative "
    "systems model; none was measured on this machine. Optimization factors overlap in reality; expert activation "
    "is model- and traffic-specific; prefix reuse needs exact prefixes; NVMe is restoration, not per-step reads; a "
    "provider's margin cannot be inferred from hardware throughput alone."
)


def flag_meaning(reason: str) -> str:
    """A reason as one CF ``flag_meanings`` word: letters, digits and ``_-.+@`` only
    (``"prefill pool: weights do not fit in HBM"`` -> ``"prefill_pool_weights_do_not_fit_in_HBM"``)."""
    return re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_.+@-]", "_", reason)).strip("_")


def rows_to_table(rows: list[dict], variants: tuple) -> dict[str, np.ndarray]:
    """Per-sample results as plain arrays, sample first: ``name -> (sample, variant, *dims)``.

    Rows are ``variant -> metric -> value`` and ``"__coords__"``: ``{dim: labels}`` for the dims of the sample's
    variables (``workload_class``, ``tier``: every sample and grid point of a run has the scenario's classes and
    tiers) and of its extra variables; a row may also carry ``"__extra__"``: ``{name: (dims, values, attrs)}``
    (e.g. Shapley shares). Those are stored as ``extra:<name>`` (sample, *dims), with their dims, attrs and coords
    as string arrays, so a table saves with ``numpy.savez`` and loads without pickle. Every variant's metrics are
    exactly the registered variables (:func:`~mcsim.results.variables.check_metrics`): an unknown name is refused.
    """
    for row in rows:
        for v in variants:
            check_metrics(row[v], f"variant {v}")
    table = {}
    for name, var in REGISTRY.items():
        table[name] = np.array([[row[v][name] for v in variants] for row in rows], dtype=var.dtype)
    table["infeasible_reason"] = np.array(
        [[FEASIBLE_REASONS.index(row[v]["infeasible_reason"]) for v in variants] for row in rows], dtype=np.int8)
    for name, (dims, _, var_attrs) in (rows[0].get("__extra__", {}) if rows else {}).items():
        table[f"extra:{name}"] = np.stack([np.asarray(row["__extra__"][name][1]) for row in rows])
        table[f"extra_meta:{name}"] = np.array(json.dumps({"dims": list(dims), "attrs": var_attrs}))
    for dim, labels in (rows[0].get("__coords__", {}) if rows else {}).items():
        table[f"coord:{dim}"] = np.asarray(labels, dtype=str)
    return table


def concat_tables(tables: list[dict]) -> dict[str, np.ndarray]:
    """Tables of consecutive chunks of samples, joined along the sample axis."""
    out = {}
    for name, first in tables[0].items():
        meta = name.startswith(("extra_meta:", "coord:"))
        out[name] = first if meta else np.concatenate([t[name] for t in tables])
    return out


def input_variable(path: str, values) -> tuple[str, tuple]:
    """An uncertain input as a Dataset variable: its name and its draws along ``sample``, marked
    ``role = "input"``, with its scenario ``path`` and units."""
    return dataset_name(path), (("sample",), np.asarray(values, dtype=float), {
        "role": "input", "path": path, "long_name": f"uncertain input {path}", **input_units(path),
        "description": "drawn once per Monte Carlo sample", "cell_methods": "sample: point"})


def grid_axis_attrs(path: str) -> dict:
    """Attributes of the coordinate of a grid axis."""
    return {"role": "grid", "path": path, "long_name": f"grid axis {path}", **input_units(path)}


def describe_coordinates(ds: xr.Dataset) -> xr.Dataset:
    """CF attributes of the fixed coordinates (in place; returns ``ds``)."""
    fixed = {
        "sample": {"long_name": "Monte Carlo sample", "units": "1",
                   "description": "index of the draw of the uncertain inputs and of the random streams"},
        "tier": {"long_name": "KV cache tier", "units": "1"},
        REQUEST_QUANTILE: {"long_name": "quantile over the requests of a sample", "units": "1"},
        WORKLOAD_CLASS: {"long_name": "workload class", "units": "1",
                         "description": "the scenario's workload.classes, in the scenario's order"},
        "variant": {"long_name": "scenario variant", "units": "1",
                    "description": "baseline: the levers off; factory: as written; without:/only: one lever off/on"},
        "lever": {"long_name": "optimization lever", "units": "1"},
    }
    for name, attrs in fixed.items():
        if name in ds.coords:
            ds[name].attrs.update(attrs)
    return ds


def dataset_from_table(table: dict, variants: tuple, samples, draws: dict[str, np.ndarray], attrs: dict) -> xr.Dataset:
    """The result Dataset of a table (see :func:`rows_to_table`); ``draws`` are the uncertain inputs."""
    coords = {"sample": np.asarray(samples, dtype=np.int64), "tier": list(TIERS), REQUEST_QUANTILE: list(QUANTILES)}
    with_variant = len(variants) > 1
    if with_variant:
        coords["variant"] = list(variants)
    for name, values in table.items():
        if name.startswith("coord:"):
            coords[name.removeprefix("coord:")] = [str(v) for v in values]

    def layout(values, dims):
        if with_variant:
            return ("variant", "sample") + dims, np.moveaxis(values, 1, 0)
        return ("sample",) + dims, values[:, 0]

    data_vars = {name: (*layout(table[name], var.dims), attrs_for(name)) for name, var in REGISTRY.items()}
    data_vars["infeasible_reason"] = (*layout(table["infeasible_reason"], ()), {
        "long_name": "why a recipe is infeasible", "units": "1",
        "flag_values": np.arange(len(FEASIBLE_REASONS), dtype=np.int8),
        "flag_meanings": " ".join(flag_meaning(r) for r in FEASIBLE_REASONS), "cell_methods": "sample: point",
        "source": "modelled"})
    for name, values in table.items():
        if name.startswith("extra:"):
            meta = json.loads(str(table["extra_meta:" + name.removeprefix("extra:")]))
            data_vars[name.removeprefix("extra:")] = (tuple(meta["dims"]) + ("sample",), np.moveaxis(values, 0, -1),
                                                      meta["attrs"])
    for path, values in draws.items():
        name, variable = input_variable(path, values)
        data_vars[name] = variable
    return describe_coordinates(xr.Dataset(data_vars, coords=coords, attrs=attrs))


#: Where a reader finds what the variables mean and where the model's figures come from.
REFERENCES = ("mcsim README.md (the model, how to read the outputs, its boundaries); docs/CALIBRATION.md and "
              "docs/VALIDATION.md (step times against measured GPU operation and NCCL times)")

#: Packages whose versions a result records (they can change its numbers or its file).
DEPENDENCIES = ("numpy", "numba", "scipy", "xarray", "dask", "distributed", "netCDF4", "click")


def dependency_versions() -> str:
    """``name version`` of every package in :data:`DEPENDENCIES`, ``; ``-separated."""
    def version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return "; ".join(f"{name} {version(name)}" for name in DEPENDENCIES)


def git_describe() -> str:
    """``git describe --always --dirty`` of the mcsim source tree, or "" when it is not a git checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return ""
    try:
        done = subprocess.run(["git", "-C", str(root), "describe", "--always", "--dirty", "--tags"],
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""


def workload_description(scn) -> str:
    """What requests a scenario's samples serve: a replayed trace (and how) or the generator."""
    trace = scn["workload.trace"]
    if not trace:
        profile = scn["workload.rate_profile"]
        start = scn["workload.rate_profile_start_s"]
        start = f"{start:g} s" if isinstance(start, (int, float)) else f"a {start.kind} distribution of times"
        return "generated (mcsim.stages.workload.generate)" + (
            f"; arrival rate of a {len(profile)}-slice profile over {scn['workload.rate_profile_period_s']:g} s, "
            f"from {start} into it" if profile else "")
    fmt = scn["workload.trace_format"]
    has_prefixes = fmt == "mooncake" or (fmt == "auto" and str(trace).lower().endswith((".jsonl", "mooncake")))
    return (f"replayed trace {trace} (time scale {scn['workload.trace_time_scale']:g}, from "
            f"{scn['workload.trace_start_s']:g} s)" + (
                "" if has_prefixes else "; no prefix information: cache figures are not meaningful"))


def numpy_arrays_only() -> None:
    """Tell xarray that Dask and Pint arrays are absent unless already imported: for a process of its own that
    builds and writes mcsim's results only (the ``mcsim`` command, a benchmark's fresh process).

    xarray asks of every coordinate it indexes and every array it writes whether it is a Dask or a Pint array, and
    imports ``dask.array`` and ``pint`` the first time to find out (``mcsim bench``'s small run shows the imports).
    mcsim's results are NumPy arrays only; a process that may hold other arrays (a notebook, a test) must not call
    this. An xarray without this cache is left as it is.
    """
    cache = getattr(getattr(xarray_pycompat, "_cached_duck_array_modules", None), "setdefault", None)
    module_type = getattr(xarray_pycompat, "DuckArrayModule", None)
    if cache is None or module_type is None:
        return
    for name in ("dask", "pint", "cubed", "sparse", "cupy"):
        if name in sys.modules:
            continue
        absent = object.__new__(module_type)
        absent.module, absent.version, absent.type, absent.available = None, Version("0.0.0"), (), False
        cache(name, absent)


def kernel_data(scn, presets=None, fidelities=None, stacks=None) -> dict:
    """What the step times of a result stand on, per accelerator: ``kernel_data`` (a sentence per preset, and one
    saying whose kernels priced a stack other than vLLM) and ``kernel_data_unmeasured`` (the presets whose roofline
    no measurement supports, space-separated; "" where none, or where no roofline ran). ``presets``, ``fidelities``
    and ``stacks`` default to the scenario's own (a grid passes its axes' values)."""
    presets = list(dict.fromkeys(presets or [str(scn["hardware.preset"])]))
    fidelities = set(fidelities or [str(scn["performance.fidelity"])])
    stacks = sorted(set(stacks or [str(scn["performance.stack"])]) - {"vllm"})
    own = str(scn["hardware.preset"])
    parts, unmeasured = [], []
    if "factor" in fidelities:
        parts.append("factor fidelity: throughputs from the scenario's efficiency.* assumptions, no kernel data")
    if "roofline" in fidelities:
        for name in presets:
            kind, text = catalog.kernel_evidence(name, scn["hardware.gemm_surface"] if name == own else None)
            parts.append(text)
            if kind == "none" and getattr(scn, "calibration", None) is None:
                unmeasured.append(name)
        if stacks:
            parts.append(f"performance.stack {', '.join(stacks)}: the measured kernels are vLLM 0.24.0's (DeepEP's, "
                         "SGLang's) whatever the stack; its own kernel tables are not read, the stack sets the "
                         "all-reduce, the CUDA-graph mode and the host's overlap")
    return {"kernel_data": "; ".join(parts), "kernel_data_unmeasured": " ".join(unmeasured)}


def provenance(scn, seed: int, samples: int, requests: int, command: str | None, extra: dict | None = None) -> dict:
    """CF and mcsim attributes of a result: what produced it, from what, and how to run it again."""
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    described = git_describe()
    attrs = {
        "Conventions": "CF-1.8",
        "title": f"mcsim results: {scn.name}",
        "source": f"mcsim {__version__}" + (f" ({described})" if described else "") +
                  ": Monte Carlo model of the cost of serving a large language model (modelled, not measured)",
        "history": f"{created}: {command or '(no command recorded)'}",
        "references": REFERENCES,
        "comment": MODEL_STATEMENT,
        "mcsim_version": __version__,
        "mcsim_git_describe": described,
        "dependencies": dependency_versions(),
        "scenario_name": scn.name,
        "scenario_file": scn.source,
        "scenario_text": scn.text,
        "overrides": "\n".join(scn.overrides),
        "seed": int(seed),
        "samples": int(samples),
        "requests_per_sample": int(requests),
        "warmup_fraction": float(scn["mc.warmup_fraction"]),
        "sampling": scn["mc.sampling"],
        "fidelity": str(scn["performance.fidelity"]),
        "serving_stack": str(scn["performance.stack"]) if scn["performance.fidelity"] == "roofline" else "",
        "fleet": str(scn["deployment.fleet"]),
        "fleet_simulation": str(scn["deployment.fleet_simulation"]),
        "command_line": command or "",
        "created": created,
        "modelled_vs_measured": MODEL_STATEMENT,
        "measured_variables": "",
        "workload": workload_description(scn),
        # slices of workload.rate_profile (0: a constant rate; mcsim.results.summary.under_rate_profile)
        "rate_profile_slices": 0 if scn["workload.trace"] else len(scn["workload.rate_profile"] or ()),
    }
    # the windows the steady-state checks compared (mcsim.stages.steady_state.time_windows)
    attrs["steady_state_windows"] = STEADY_WINDOWS_PROFILE if attrs["rate_profile_slices"] else STEADY_WINDOWS_QUARTERS
    attrs.update(kernel_data(scn))
    if getattr(scn, "calibration", None) is not None:
        cal = scn.calibration
        attrs["calibration"] = json.dumps(cal.summary(), sort_keys=True)
        attrs["measured_variables"] = (
            "none directly; the step-time parameters " + ", ".join(cal.parameters) + " were fitted to measurements on "
            f"{cal.regime.get('hardware')} ({cal.source}) and are drawn per sample from the fit's bootstrap "
            "replicates (see the calibration attribute)")
    attrs.update(extra or {})
    return attrs


def write_netcdf(ds: xr.Dataset, path, force: bool = False) -> Path:
    """Write ``ds`` compressed to ``path`` atomically (temporary file in the same folder, then rename).

    Raises
    ------
    FileExistsError
        When ``path`` exists and ``force`` is false.
    """
    path = Path(path)
    if path.exists() and not force:
        raise FileExistsError(f"{path} exists; use --force to overwrite it")
    path.parent.mkdir(parents=True, exist_ok=True)
    encoding = {name: {"zlib": True, "complevel": 4} for name, v in ds.data_vars.items() if v.dtype.kind in "fiu"}
    # Text as fixed-width character arrays: CF (and its checker) know no variable-length strings, and xarray reads
    # them back as the same string labels, so ``.sel(variant="factory")`` works on the reopened file.
    encoding.update({name: {"dtype": "S1"} for name, v in ds.variables.items() if v.dtype.kind in "OUS"})
    with atomic_path(path) as tmp:  # with the usual permissions of a new file
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)
    return path

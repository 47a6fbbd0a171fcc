"""Result Datasets: built through the variable registry, saved as compressed NetCDF atomically.

A result reopens with plain ``xarray.open_dataset(path)``; every variable carries ``units``, ``long_name``,
``description`` and whether it is ``modelled`` or ``measured``; uncertain inputs are stored as variables named by
their dotted path with ``role = "input"``; Dataset attrs carry provenance.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.fileio import atomic_path
from mcsim.results.variables import FEASIBLE_REASONS, QUANTILES, REGISTRY, TIERS, attrs_for

MODEL_STATEMENT = (
    "All output variables are modelled: they follow from the scenario's assumptions through mcsim's comparative "
    "systems model; none was measured on this machine. Optimization factors overlap in reality; expert activation "
    "is model- and traffic-specific; prefix reuse needs exact prefixes; NVMe is restoration, not per-step reads; a "
    "provider's margin cannot be inferred from hardware throughput alone."
)


def rows_to_table(rows: list[dict], variants: tuple) -> dict[str, np.ndarray]:
    """Per-sample results as plain arrays, sample first: ``name -> (sample, variant, *dims)``.

    Rows are ``variant -> metric -> value``; a row may also carry ``"__extra__"``: ``{name: (dims, values, attrs)}``
    (e.g. Shapley shares) and ``"__coords__"``: ``{dim: labels}`` for their dims. Those are stored as
    ``extra:<name>`` (sample, *dims), with their dims, attrs and coords as string arrays, so a table saves with
    ``numpy.savez`` and loads without pickle.
    """
    table = {}
    for name, var in REGISTRY.items():
        table[name] = np.array([[row[v][name] for v in variants] for row in rows], dtype=var.dtype)
    table["infeasible_reason"] = np.array(
        [[FEASIBLE_REASONS.index(row[v]["infeasible_reason"]) for v in variants] for row in rows], dtype=np.int8)
    for name, (dims, _, var_attrs) in (rows[0].get("__extra__", {}) if rows else {}).items():
        table[f"extra:{name}"] = np.stack([np.asarray(row["__extra__"][name][1]) for row in rows])
        table[f"extra_meta:{name}"] = np.array(json.dumps({"dims": list(dims), "attrs": var_attrs}))
    for dim, labels in (rows[0].get("__coords__", {}) if rows else {}).items():
        table[f"coord:{dim}"] = np.asarray(labels)
    return table


def concat_tables(tables: list[dict]) -> dict[str, np.ndarray]:
    """Tables of consecutive chunks of samples, joined along the sample axis."""
    out = {}
    for name, first in tables[0].items():
        meta = name.startswith(("extra_meta:", "coord:"))
        out[name] = first if meta else np.concatenate([t[name] for t in tables])
    return out


def input_variable(path: str, values) -> tuple:
    """An uncertain input as a Dataset variable: its draws along ``sample``, marked ``role = "input"``."""
    return (("sample",), np.asarray(values, dtype=float),
            {"role": "input", "long_name": f"uncertain input {path}",
             "description": "drawn once per Monte Carlo sample"})


def dataset_from_table(table: dict, variants: tuple, samples, draws: dict[str, np.ndarray], attrs: dict) -> xr.Dataset:
    """The result Dataset of a table (see :func:`rows_to_table`); ``draws`` are the uncertain inputs."""
    coords = {"sample": np.asarray(samples, dtype=np.int64), "tier": list(TIERS), "quantile": list(QUANTILES)}
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
        "flag_meanings": " ".join(r.replace(" ", "_") for r in FEASIBLE_REASONS), "source": "modelled"})
    for name, values in table.items():
        if name.startswith("extra:"):
            meta = json.loads(str(table["extra_meta:" + name.removeprefix("extra:")]))
            data_vars[name.removeprefix("extra:")] = (tuple(meta["dims"]) + ("sample",), np.moveaxis(values, 0, -1),
                                                      meta["attrs"])
    for path, values in draws.items():
        data_vars[path] = input_variable(path, values)
    ds = xr.Dataset(data_vars, coords=coords, attrs=attrs)
    ds["tier"].attrs["long_name"] = "KV cache tier"
    ds["quantile"].attrs["long_name"] = "quantile over requests"
    return ds


def provenance(scn, seed: int, samples: int, requests: int, command: str | None, extra: dict | None = None) -> dict:
    from mcsim import __version__

    attrs = {
        "title": f"mcsim results: {scn.name}",
        "mcsim_version": __version__,
        "scenario_name": scn.name,
        "scenario_file": scn.source,
        "scenario_text": scn.text,
        "overrides": "\n".join(scn.overrides),
        "seed": int(seed),
        "samples": int(samples),
        "requests_per_sample": int(requests),
        "sampling": scn["mc.sampling"],
        "fidelity": str(scn["performance.fidelity"]),
        "fleet": str(scn["deployment.fleet"]),
        "command_line": command or "",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "modelled_vs_measured": MODEL_STATEMENT,
        "measured_variables": "",
    }
    trace = scn["workload.trace"]
    if trace:
        fmt = scn["workload.trace_format"]
        has_prefixes = fmt == "mooncake" or (fmt == "auto" and str(trace).lower().endswith((".jsonl", "mooncake")))
        attrs["workload"] = (f"replayed trace {trace} (time scale {scn['workload.trace_time_scale']:g}, from "
                             f"{scn['workload.trace_start_s']:g} s)" + (
                                 "" if has_prefixes else "; no prefix information: cache figures are not meaningful"))
    else:
        attrs["workload"] = "generated (mcsim.stages.workload.generate)"
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
    with atomic_path(path) as tmp:  # with the usual permissions of a new file
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)
    return path

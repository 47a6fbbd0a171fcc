"""Result Datasets: built through the variable registry, saved as compressed NetCDF atomically.

A result reopens with plain ``xarray.open_dataset(path)``; every variable carries ``units``, ``long_name``,
``description`` and whether it is ``modelled`` or ``measured``; uncertain inputs are stored as variables named by
their dotted path with ``role = "input"``; Dataset attrs carry provenance.
"""

from __future__ import annotations

import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import xarray as xr

from mcsim.variables import FEASIBLE_REASONS, QUANTILES, REGISTRY, TIERS, attrs_for

MODEL_STATEMENT = (
    "All output variables are modelled: they follow from the scenario's assumptions through mcsim's comparative "
    "systems model; none was measured on this machine. Optimization factors overlap in reality; expert activation "
    "is model- and traffic-specific; prefix reuse needs exact prefixes; NVMe is restoration, not per-step reads; a "
    "provider's margin cannot be inferred from hardware throughput alone."
)


def build_dataset(rows: list[dict], variants: tuple, draws: dict[str, np.ndarray], attrs: dict,
                  samples=None) -> xr.Dataset:
    """Assemble per-sample results into a Dataset.

    Parameters
    ----------
    rows : list of dict
        One per sample, in sample order: variant -> metric -> value. A row may also carry ``"__extra__"``:
        ``{name: (dims, values, attrs)}`` of variables without the sample dim (e.g. Shapley shares), stacked here
        along ``sample``, and ``"__coords__"``: ``{dim: labels}`` for their dims.
    variants : tuple of str
        Variant names; a ``variant`` dim is added when there is more than one.
    draws : dict
        Uncertain input path -> values per sample.
    attrs : dict
        Provenance attributes.
    samples : array of int, optional
        Sample indices of the rows (default ``0..n-1``).
    """
    n = len(rows)
    sample_index = np.arange(n) if samples is None else np.asarray(samples, dtype=np.int64)
    coords = {"sample": sample_index, "tier": list(TIERS), "quantile": list(QUANTILES)}
    coords.update(rows[0].get("__coords__", {}) if rows else {})
    with_variant = len(variants) > 1
    if with_variant:
        coords["variant"] = list(variants)
    data_vars = {}
    for name, var in REGISTRY.items():
        stacked = np.array([[row[v][name] for v in variants] for row in rows], dtype=var.dtype)
        # stacked: (sample, variant, *var.dims)
        if with_variant:
            stacked = np.moveaxis(stacked, 1, 0)
            dims = ("variant", "sample") + var.dims
        else:
            stacked = stacked[:, 0]
            dims = ("sample",) + var.dims
        data_vars[name] = (dims, stacked, attrs_for(name))
    reasons = np.array([[FEASIBLE_REASONS.index(row[v]["infeasible_reason"]) for v in variants] for row in rows],
                       dtype=np.int8)
    reasons = np.moveaxis(reasons, 1, 0) if with_variant else reasons[:, 0]
    data_vars["infeasible_reason"] = (
        ("variant", "sample") if with_variant else ("sample",), reasons,
        {"long_name": "why a recipe is infeasible", "units": "1", "flag_values": np.arange(len(FEASIBLE_REASONS),
         dtype=np.int8), "flag_meanings": " ".join(r.replace(" ", "_") for r in FEASIBLE_REASONS),
         "source": "modelled"},
    )
    for name, (dims, _, var_attrs) in (rows[0].get("__extra__", {}) if rows else {}).items():
        values = np.stack([np.asarray(row["__extra__"][name][1]) for row in rows], axis=-1)
        data_vars[name] = (tuple(dims) + ("sample",), values, var_attrs)
    for path, values in draws.items():
        data_vars[path] = (("sample",), np.asarray(values, dtype=float),
                           {"role": "input", "long_name": f"uncertain input {path}",
                            "description": "drawn once per Monte Carlo sample"})
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
        "fidelity": "factor",
        "command_line": command or "",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "modelled_vs_measured": MODEL_STATEMENT,
        "measured_variables": "",
    }
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
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a result file should get the usual permissions
    try:
        ds.to_netcdf(tmp, engine="netcdf4", encoding=encoding)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path

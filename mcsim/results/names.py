"""Names in a result Dataset for scenario paths, and selection by path.

Grid axes and uncertain inputs are named after their dotted scenario path, but a NetCDF (CF) name has no dots and
xarray's ``.query``, ``.sel(**kw)`` and attribute access need identifiers. So ``speculative.draft_tokens`` is stored
as ``speculative_draft_tokens``: the section, an underscore, the key. Section names have no underscore, so the name
maps back to its path, and every such variable or coordinate also keeps its path in ``attrs["path"]``.

Examples
--------
>>> dataset_name("speculative.draft_tokens")
'speculative_draft_tokens'
"""

from __future__ import annotations

import xarray as xr

from mcsim.errors import McsimError


class PathError(McsimError, KeyError):
    """A scenario path that names no grid axis or input of a result."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def dataset_name(path: str) -> str:
    """The Dataset name of a dotted scenario path (``"a.b"`` -> ``"a_b"``)."""
    return path.replace(".", "_")


def path_of(ds: xr.Dataset, name: str) -> str:
    """The dotted scenario path of a Dataset variable or coordinate (its name when it has none)."""
    return str(ds[name].attrs.get("path", name)) if name in ds.variables else name


def paths(ds: xr.Dataset | xr.DataArray) -> dict[str, str]:
    """``{dotted path: Dataset name}`` of every grid axis and uncertain input of ``ds`` (of every grid-axis
    coordinate of a DataArray)."""
    items = ds.variables.items() if isinstance(ds, xr.Dataset) else ds.coords.items()
    return {str(v.attrs["path"]): str(name) for name, v in items if "path" in v.attrs}


def name_in(ds: xr.Dataset | xr.DataArray, path: str) -> str:
    """The Dataset name of ``path`` (a dotted scenario path or the Dataset name itself).

    Raises
    ------
    PathError
        When ``ds`` has no grid axis or input of that path.
    """
    known = paths(ds)
    if path in known:
        return known[path]
    if path in known.values():
        return path
    listed = ", ".join(sorted(known)) or "none"
    raise PathError(f"{path!r} is not a grid axis or uncertain input of this result (it has: {listed})")


def sel(ds: xr.Dataset | xr.DataArray, path: str | dict | None = None, value=None, /, **kwargs):
    """``ds.sel`` by dotted scenario paths: ``sel(ds, "speculative.draft_tokens", 2)`` or
    ``sel(ds, {"hardware.preset": "h200", "speculative.draft_tokens": 2})``; other keyword arguments (``method``,
    ``tolerance``, plain dims such as ``variant``) go to :meth:`xarray.Dataset.sel`.

    Examples
    --------
    >>> import mcsim
    >>> ds = mcsim.open_results("outputs/sweep-sweep.nc")  # doctest: +SKIP
    >>> mcsim.sel(ds, "hardware.preset", "h200").cost_usd_per_mtok  # doctest: +SKIP
    """
    if isinstance(path, dict):
        wanted = dict(path)
    elif path is not None:
        wanted = {path: value}
    else:
        wanted = {}
    options = {k: kwargs.pop(k) for k in ("method", "tolerance", "drop") if k in kwargs}
    wanted.update(kwargs)
    indexers = {(key if key in ds.dims else name_in(ds, key)): v for key, v in wanted.items()}
    return ds.sel(indexers, **options)

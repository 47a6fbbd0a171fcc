"""Grid axes for sweeps: from ``--grid`` options and the scenario's ``[sweep]`` table.

An axis is a dotted scenario path and its values. Values may be listed or given as a range:

``--grid speculative.draft_tokens=0,1,2,3``
    a list (strings work too: ``--grid hardware.preset=h800,h200,b200``);
``--grid cache.dram_gb_per_node=0:2048:5``
    ``start:stop:num``, linearly spaced, both ends included;
``--grid workload.rate_rps=10:1000:5:log``
    log-spaced.

In a scenario file::

    [sweep]
    "speculative.draft_tokens" = [0, 1, 2, 3]
    "cache.dram_gb_per_node" = { start = 0, stop = 2048, num = 5 }
    "workload.rate_rps" = { start = 10, stop = 1000, num = 5, log = true }
    "hardware.preset" = ["h800", "h200"]

Every value is validated like the scenario's own (type, range, choices, presets) before anything runs. A preset
axis keeps the catalog values the scenario sets itself (see :meth:`Scenario.with_values`); a ``hardware.preset``
axis charges each GPU its own price unless ``economics.pin_price`` pins one (:func:`pricing_note`).
"""

from __future__ import annotations

import itertools
import math
import tomllib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from mcsim.scenario.distributions import Dist
from mcsim.scenario.schema import ScenarioError, field_for

if TYPE_CHECKING:  # annotations only: loading imports this module for a file's [sweep] table
    from mcsim.scenario.loading import Scenario


#: Values one axis may have, and grid points a sweep may have.
MAX_AXIS_VALUES = 10_000
MAX_GRID_POINTS = 100_000


@dataclass(frozen=True)
class Axis:
    """One grid axis: a dotted scenario path and its values (numbers or strings)."""

    path: str
    values: tuple


def _number_or_string(text: str):
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except (tomllib.TOMLDecodeError, RecursionError):
        return text


def _range(path: str, start, stop, num, log: bool, source: str) -> tuple:
    try:
        start, stop, num = float(start), float(stop), int(num)
    except (TypeError, ValueError):
        raise ScenarioError(source, path, "a range needs numbers start, stop and an integer num") from None
    if num < 1 or num > MAX_AXIS_VALUES:
        raise ScenarioError(source, path, f"a range needs 1 <= num <= {MAX_AXIS_VALUES:,}, got {num}")
    if log:
        if start <= 0 or stop <= 0:
            raise ScenarioError(source, path, "a log-spaced range needs start > 0 and stop > 0")
        values = np.geomspace(start, stop, num)
    else:
        values = np.linspace(start, stop, num)
    return tuple(float(v) for v in values)


def parse_grid_option(text: str, option: str = "--grid") -> Axis:
    """Parse one ``--grid PATH=VALUES`` option (``option``: the option named in errors, e.g. ``--space``)."""
    if "=" not in text:
        raise ScenarioError(option, text, "expected PATH=V1,V2,... or PATH=START:STOP:NUM[:log]")
    path, spec = (part.strip() for part in text.split("=", 1))
    if not path or not spec:
        raise ScenarioError(option, text, "expected PATH=V1,V2,... or PATH=START:STOP:NUM[:log]")
    parts = spec.split(":")
    if len(parts) in (3, 4) and "," not in spec:
        if len(parts) == 4 and parts[3] not in ("log", "lin"):
            raise ScenarioError(option, path, f"the fourth part of a range is 'log' or 'lin', got {parts[3]!r}")
        return Axis(path, _range(path, *parts[:3], log=len(parts) == 4 and parts[3] == "log", source=option))
    values = [v.strip() for v in spec.split(",")]
    if "" in values:
        raise ScenarioError(option, path, f"an empty value in {spec!r}; expected V1,V2,... with a value between "
                            "every pair of commas")
    return Axis(path, tuple(_number_or_string(v) for v in values))


def command_line_axes(texts, option: str = "--grid") -> list[Axis]:
    """The axes of repeated ``--grid`` (or ``--space``) options; a path given twice is refused (one would silently
    replace the other)."""
    axes = [text if isinstance(text, Axis) else parse_grid_option(text, option) for text in texts]
    seen = set()
    for axis in axes:
        if axis.path in seen:
            raise ScenarioError(option, axis.path, f"given twice; give each axis once, with all its values "
                                f"({option} {axis.path}=V1,V2,...)")
        seen.add(axis.path)
    return axes


def axes_from_table(table: dict, source: str) -> list[Axis]:
    """Axes of a ``[sweep]`` table (dotted keys, quoted or as nested tables)."""
    axes = []

    def walk(node: dict, prefix: str):
        for key, value in node.items():
            path = f"{prefix}.{key}" if prefix else key
            if isinstance(value, dict) and not {"start", "stop", "num"} & set(value):
                walk(value, path)
            elif isinstance(value, dict):
                unknown = set(value) - {"start", "stop", "num", "log"}
                if unknown:
                    raise ScenarioError(source, f"sweep.{path}", f"unknown range key(s) {sorted(unknown)}; "
                                        "expected start, stop, num and optionally log")
                if not {"start", "stop", "num"} <= set(value):
                    raise ScenarioError(source, f"sweep.{path}", "a range needs start, stop and num")
                axes.append(Axis(path, _range(f"sweep.{path}", value["start"], value["stop"], value["num"],
                                              bool(value.get("log", False)), source)))
            elif isinstance(value, list):
                axes.append(Axis(path, tuple(value)))
            else:
                raise ScenarioError(source, f"sweep.{path}", "expected a list of values or a range table "
                                    "{ start, stop, num[, log] }")

    walk(table, "")
    return axes


def validate_axes(scn: Scenario, axes: list[Axis], option: str = "--grid") -> list[Axis]:
    """Check every axis path and value against the scenario schema; coerce numbers to the field's type.

    A later axis on the same path replaces an earlier one (``--grid`` overrides ``[sweep]``).
    """
    by_path: dict[str, Axis] = {}
    for axis in axes:
        if axis.path.startswith("mc."):
            raise ScenarioError(scn.source, axis.path, "[mc] keys cannot be grid axes: every grid point shares the "
                                "samples, requests and seed (set them in [mc] or with --samples, --requests, --seed)")
        if axis.path.startswith("meta."):
            raise ScenarioError(scn.source, axis.path, "[meta] keys name the study, they cannot be grid axes")
        if len(axis.values) > MAX_AXIS_VALUES:
            raise ScenarioError(scn.source, axis.path, f"{len(axis.values):,} values; a grid axis takes at most "
                                f"{MAX_AXIS_VALUES:,}")
        spec = field_for(axis.path)
        if spec is not None and spec.kind == "weights":
            raise ScenarioError(scn.source, axis.path, "a list-valued key cannot be a grid axis: a scenario has one "
                                "list (set it with --set or in the file)")
        bad = [v for v in axis.values if isinstance(v, (dict, list)) or v is None]
        if bad:
            raise ScenarioError(scn.source, axis.path, f"a grid value must be a number or a string, got {bad[0]!r} "
                                "(a distribution cannot be a grid value: put it on the key itself)")
        if spec is None and not axis.path.endswith(".preset"):
            scn.with_values({axis.path: axis.values[0] if axis.values else 0}, origin=option)  # raises, names it
        if not axis.values:
            raise ScenarioError(scn.source, axis.path, "a grid axis needs at least one value")
        if spec is not None and spec.kind == "perreq":
            raise ScenarioError(scn.source, axis.path, "a per-request distribution cannot be a grid axis; sweep "
                                "its parameters through a class field or an uncertain parameter instead")
        values = []
        for v in axis.values:
            if spec is not None and spec.kind == "int" and isinstance(v, float):
                if not math.isfinite(v) or v != round(v):
                    raise ScenarioError(scn.source, axis.path, f"expected integers on this axis, got {v!r}")
                v = int(round(v))
            scn.with_values({axis.path: v}, origin=option)
            values.append(v)
        if len(set(values)) != len(values):
            raise ScenarioError(scn.source, axis.path, f"grid values repeat: {values}")
        kinds = {isinstance(v, str) for v in values}
        if len(kinds) > 1:
            raise ScenarioError(scn.source, axis.path, "a grid axis mixes strings and numbers")
        by_path[axis.path] = Axis(axis.path, tuple(values))
    total = math.prod(len(a.values) for a in by_path.values())
    if total > MAX_GRID_POINTS:
        raise ScenarioError(scn.source, "sweep", f"the grid has {total:,} points; at most {MAX_GRID_POINTS:,} are "
                            "run (split the study into several sweeps)")
    pricing_note(scn, list(by_path.values()))  # refuses a price pinned for every GPU without economics.pin_price
    return list(by_path.values())


#: Pricing mode -> the keys that, set in a scenario, charge one price to whatever GPU it runs on (the first wins).
PINNED_PRICE_KEYS = {"rental": ("economics.rental_usd_per_gpu_hour", "hardware.rental_usd_per_hour"),
                     "purchase": ("economics.price_usd", "hardware.price_usd")}


def pricing_note(scn: Scenario, axes: list[Axis]) -> str:
    """The note a result carries when a hardware sweep charges one price to every GPU ("" when none).

    A sweep over ``hardware.preset`` charges each GPU its own catalog price (times ``economics.gpu_price_factor``)
    unless the scenario itself sets a price: ``economics.rental_usd_per_gpu_hour`` / ``price_usd``, or its own
    ``hardware.rental_usd_per_hour`` / ``hardware.price_usd``, which hold on whatever preset. That pins one price
    for all the GPUs, which only ``economics.pin_price = true`` may do. A price that is itself a grid axis is not
    pinned by the scenario: its coordinate shows it.

    Raises
    ------
    ScenarioError
        For a price pinned without ``economics.pin_price``.
    """
    hardware = next((a for a in axes if a.path == "hardware.preset"), None)
    if hardware is None:
        return ""
    swept = {a.path: a.values for a in axes}
    pins = []
    for mode in dict.fromkeys(swept.get("economics.pricing", (scn["economics.pricing"],))):
        economics_key, hardware_key = PINNED_PRICE_KEYS[mode]
        value = scn[economics_key]
        if economics_key not in swept and (isinstance(value, Dist) or value != 0):
            pins.append((mode, economics_key))
        elif economics_key not in swept and hardware_key not in swept and hardware_key in scn.catalog_overrides:
            pins.append((mode, hardware_key))
    if not pins:
        return ""
    gpus = ", ".join(str(v) for v in hardware.values)
    if not scn["economics.pin_price"]:
        mode, key = pins[0]
        raise ScenarioError(scn.source, key, f"set in the scenario, it charges one {mode} price to every GPU of the "
                            f"hardware.preset sweep ({gpus}); leave it out to charge each GPU its own catalog price "
                            "(economics.gpu_price_factor scales it), or set economics.pin_price = true to charge this "
                            "one price to all")
    units = {"rental": "USD/GPU-hour", "purchase": "USD per GPU"}
    factor = scn["economics.gpu_price_factor"]
    scaled = "" if factor == 1 else f" x economics.gpu_price_factor = {_shown(factor)}"
    pinned = "; ".join(f"{key} = {_shown(scn[key])} {units[mode]}{scaled if key.startswith('hardware.') else ''} "
                       f"under {mode} pricing" for mode, key in pins)
    return (f"one price pinned for every GPU of the hardware.preset sweep ({gpus}) by economics.pin_price: "
            f"{pinned}; the catalog's own prices are not used")


def _shown(value) -> str:
    """A scenario number or distribution, as a note shows it."""
    if not isinstance(value, Dist):
        return f"{value:g}"
    params = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}" for k, v in value.params.items())
    return f"{value.kind}({params})"


def points(axes: list[Axis]) -> list[dict]:
    """Every grid point as ``{path: value}``, in C order (the last axis varies fastest)."""
    if not axes:
        return [{}]
    return [dict(zip([a.path for a in axes], combo)) for combo in itertools.product(*(a.values for a in axes))]

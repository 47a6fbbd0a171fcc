"""Loading, validating and overriding scenarios; drawing their uncertain inputs.

A scenario is TOML (see ``scenarios/`` and :mod:`mcsim.scenario.schema`). Validation is strict: an unknown key, a wrong
type, a value out of range or a malformed distribution raises :class:`ScenarioError` naming the file, the dotted
key, what was expected and, for a misspelt key, the nearest valid one.

Examples
--------
>>> from mcsim.scenario import load_scenario
>>> scn = load_scenario("scenarios/factory.toml", overrides=["speculative.draft_tokens=2"])  # doctest: +SKIP
>>> sorted(scn.uncertain())[:2]  # doctest: +SKIP
['economics.electricity_usd_per_kwh', 'hardware.price_usd']
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
import zlib
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from mcsim.fileio import readable_kind
from mcsim.scenario.bounds import DRAW_TAIL
from mcsim.scenario import catalog, distributions, grid
from mcsim.scenario.calibration_file import CalibrationError, check_regime, regime_of
from mcsim.scenario.calibration_file import load as load_calibration
from mcsim.scenario.choices import REPLICA_KEYS, replica_mismatch
from mcsim.scenario.distributions import Dist, DistributionError
from mcsim.scenario.plausible import warn_implausible
from mcsim.scenario.schema import (
    CLASS_FIELDS,
    DEFAULT_CLASSES,
    MAX_TIERS,
    REMOVED_KEYS,
    SECTIONS,
    TIER_FIELDS,
    TIER_KINDS,
    TIER_PRICES,
    TIER_NAME_PATTERN,
    TIER_REQUIRED,
    TIER_SHORT_FORM,
    TIER_SHORT_FORM_KEYS,
    UNMEASURED_STAND_INS,
    Field,
    ScenarioError,
    baseline_overrides,
    read_by,
    reads_stand_in,
    workload_reads,
    field_for,
)

#: Random stream ids, one per stage; a sample's stream is SeedSequence(seed, spawn_key=(sample, stage, ...)).
STREAM_PARAMS, STREAM_WORKLOAD, STREAM_ROUTING, STREAM_SPECULATIVE, STREAM_EXPERTS, STREAM_BATCHING = range(6)


#: The factor fidelity's base throughputs (``efficiency.*``): stating either makes ``base_source = "auto"`` stated.
BASE_KEYS = frozenset({"base_decode_tok_s_per_gpu", "base_prefill_tok_s_per_gpu"})


def rng_for(seed: int, sample: int, stream: int, *extra: int) -> np.random.Generator:
    """The random generator of one sample and one stage; independent of chunking and workers."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed, spawn_key=(sample, stream, *extra))))


def _path_key(path: str) -> int:
    return zlib.crc32(path.encode())


@dataclass(frozen=True)
class Scenario:
    """A validated scenario.

    Attributes
    ----------
    values : dict
        Flat ``dotted.path -> value``; numbers that are uncertain are :class:`~mcsim.scenario.distributions.Dist`,
        per-request fields are always a Dist (possibly fixed).
    classes : tuple of str
        Names of the workload classes, in file order.
    baseline : dict
        Flat overrides that make the ``baseline`` variant (all levers off, then the file's ``[baseline]``).
    source : str
        File name for messages; ``text`` is the file's text, kept for provenance.
    """

    values: dict = field(hash=False)
    classes: tuple
    baseline: dict = field(hash=False)
    source: str = ""
    text: str = ""
    base_dir: Path | None = None
    overrides: tuple = ()
    sweep: tuple = ()  # grid axes of the file's [sweep] table (mcsim.scenario.grid.Axis)
    # model.* / hardware.* paths the scenario sets itself (file, --set, a later with_values): they hold whatever
    # preset a grid point or variant swaps in
    catalog_overrides: tuple = ()
    calibration: object = None  # the mcsim.scenario.calibration_file.Calibration whose parameters the values hold

    @property
    def name(self) -> str:
        return self.values["meta.name"]

    def __getitem__(self, path: str):
        return self.values[path]

    def uncertain(self, include_unused: bool = False) -> dict[str, Dist]:
        """Uncertain inputs, ``path -> Dist``, sorted; includes uncertain parameters of per-request fields.

        Inputs that the scenario's fidelity does not read are left out unless ``include_unused`` (a grid that
        sweeps the fidelity needs every fidelity's inputs).
        """
        out = {}
        fidelity = self.values["performance.fidelity"]
        for path, v in self.values.items():
            if not include_unused and not read_by(path, fidelity):
                continue
            if not include_unused and path in UNMEASURED_STAND_INS and not reads_stand_in(path, self.values):
                continue
            if isinstance(v, Dist):
                if _is_perreq(path):
                    out.update(v.nested())
                elif not v.is_fixed:
                    out[path] = v
        return dict(sorted(out.items()))

    def variant(self, name: str) -> "Scenario":
        """``factory`` (as written) or ``baseline`` (levers off, then ``[baseline]``)."""
        if name == "factory":
            return self
        if name == "baseline":
            return self.with_values(self.baseline, origin="[baseline]")
        raise ValueError(f"unknown variant {name!r}; expected 'baseline' or 'factory'")

    def with_values(self, flat: dict[str, Any], origin: str = "--set") -> "Scenario":
        """A copy with some dotted paths replaced (values are validated like the file's)."""
        values = dict(self.values)
        if any(f"efficiency.{key}" in flat for key in BASE_KEYS) and "efficiency.base_source" not in flat:
            values["efficiency.base_source"] = "stated"  # a base throughput set (a grid, a variant) is read
        # A new preset replaces every catalog field of its section with the new preset's figures, except those the
        # scenario sets itself: an explicit value (or distribution) means that value on whatever preset, as it
        # does with --set, so it holds at every point of a preset sweep and its draws are what each point uses.
        # Explicit catalog paths in ``flat`` then apply on top.
        for section in ("model", "hardware"):
            if f"{section}.preset" in flat:
                preset = _check_value(SECTIONS[section]["preset"], f"{section}.preset", flat[f"{section}.preset"],
                                      self.source)
                values = {k: v for k, v in values.items() if not k.startswith(f"{section}.")}
                values.update(_catalog_section(section, {}, preset, self.source))
                values.update({path: self.values[path] for path in self.catalog_overrides
                               if path.startswith(f"{section}.")})
                values[f"{section}.preset"] = preset
        for path, raw in flat.items():
            _check_class(path, self.classes, self.source, origin)
            _check_tier_path(path, self.values, self.source, origin)
            values[path] = _validate_path(path, raw, self.source, origin)
        explicit = set(self.catalog_overrides) | {path for path in flat if path.split(".")[0] in ("model", "hardware")
                                                  and path.split(".")[-1] != "preset"}
        scn = replace(self, values=values, catalog_overrides=tuple(sorted(explicit)))
        _cross_checks(scn)  # the same checks as loading a file
        if self.calibration is not None and not origin.startswith(("variant", "calibration")):
            check_regime(self.calibration, regime_of(scn.values), f"{origin} of {self.source}")
        return scn


def _is_perreq(path: str) -> bool:
    spec = field_for(path)
    return spec is not None and spec.kind == "perreq"


def _check_class(path: str, classes, source: str, origin: str):
    """A dotted path into ``workload.classes.<name>`` must name one of the scenario's classes: a misspelt class
    name would otherwise add a class (``--set``) or be ignored (``[baseline]``) without a word."""
    parts = path.split(".")
    if len(parts) == 4 and parts[:2] == ["workload", "classes"] and parts[2] not in classes:
        raise ScenarioError(source, path, f"unknown workload class '{parts[2]}' in {origin}"
                            f"{_nearest(parts[2], classes)}; the classes are " + ", ".join(classes))


def _check_tier_path(path: str, values: dict, source: str, origin: str):
    """A dotted path into ``cache.tiers.<name>`` must name one of the scenario's ``[[cache.tiers]]``, and the short
    form's keys cannot be set on a scenario that has them (the tiers would be given twice)."""
    names = values.get("cache.tiers") or ()
    if names and path in TIER_SHORT_FORM_KEYS:
        raise ScenarioError(source, path, f"{origin} cannot set the short form of the tiers: the scenario has "
                            f"[[cache.tiers]] ({', '.join(names)}); set cache.tiers.<name>.gb instead")
    parts = path.split(".")
    if parts[:2] != ["cache", "tiers"]:
        return
    example = f"cache.tiers.{names[-1] if names else 'dram'}.gb"
    if len(parts) != 4:
        raise ScenarioError(source, path, f"expected one tier's key in {origin}, cache.tiers.<name>.<key> (e.g. "
                            f"{example})")
    if parts[2] not in names:
        known = (f"the tiers are {', '.join(names)}" if names else "the scenario has no [[cache.tiers]]: its tiers "
                 "are the short form's (cache.hbm_gb_per_instance, dram_gb_per_node, nvme_gb_per_node)")
        raise ScenarioError(source, path, f"unknown cache tier '{parts[2]}' in {origin}{_nearest(parts[2], names)}; "
                            + known)
    if parts[3] == "name":
        raise ScenarioError(source, path, "a tier's name is its [[cache.tiers]] table's and cannot be overridden")


def _set_tier(raw: dict, path: str, value, source: str):
    """``--set cache.tiers.<name>.<key>=VALUE``: into the ``[[cache.tiers]]`` table of that name."""
    cache = raw.get("cache") if isinstance(raw.get("cache"), dict) else {}
    tables = cache.get("tiers") if isinstance(cache.get("tiers"), list) else []
    tables = [t for t in tables if isinstance(t, dict)]
    names = tuple(t["name"] for t in tables if isinstance(t.get("name"), str))
    _check_tier_path(path, {"cache.tiers": names}, source, "--set")
    _, _, name, key = path.split(".")
    next(t for t in tables if t.get("name") == name)[key] = value


def _nearest(word: str, options) -> str:
    near = difflib.get_close_matches(word, list(options), n=1, cutoff=0.5)
    return f" (did you mean '{near[0]}'?)" if near else ""


def _support(d: Dist) -> tuple[float, float, bool]:
    """(lowest, highest, whether the lowest is excluded) of the values ``d`` can take."""
    lo, hi = _closed_support(d)
    # lognormal and beta never reach their lower end (ppf maps the open interval (0, 1) inside it)
    return lo, hi, d.kind in ("lognormal", "beta") and lo < hi


def _drawn_support(d: Dist) -> tuple[float, float, bool]:
    """What an uncertain input's draws are held to: its support, with an unbounded end (a lognormal's, a normal's
    without low or high) replaced by its quantile at :data:`~mcsim.scenario.bounds.DRAW_TAIL` from that end (a
    draw beyond it is clipped to the key's range by :func:`draw_uncertain`)."""
    lo, hi, open_lo = _support(d)
    if d.kind == "lognormal" or lo == -math.inf:
        lo, open_lo = float(d.ppf(DRAW_TAIL)), False
    if hi == math.inf:
        hi = float(d.ppf(1.0 - DRAW_TAIL))
    return lo, hi, open_lo


def _closed_support(d: Dist) -> tuple[float, float]:
    p = d.params
    if d.kind == "fixed":
        return p["value"], p["value"]
    if d.kind in ("uniform", "loguniform", "triangular"):
        return p["low"], p["high"]
    if d.kind == "choice":
        return min(p["values"]), max(p["values"])
    if d.kind == "beta":
        return p.get("low", 0.0), p.get("high", 1.0)
    if d.kind == "lognormal":
        return 0.0, math.inf
    if d.kind == "normal":
        lo, hi = p.get("low"), p.get("high")
        return (-math.inf if lo is None else lo), (math.inf if hi is None else hi)
    raise AssertionError(d.kind)


def _check_value(spec: Field, path: str, value, source: str):
    """Validate one raw TOML value against its Field; return the stored value."""

    def fail(msg):
        raise ScenarioError(source, path, msg)

    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            fail(f"expected true or false, got {value!r}")
        return value
    if kind == "str":
        if not isinstance(value, str):
            fail(f"expected a string, got {value!r}")
        return value
    if kind == "choice":
        if value not in spec.choices:
            fail(f"expected {spec.describe()}, got {value!r}{_nearest(str(value), spec.choices)}")
        return value
    if kind == "weights":
        return _check_weights(spec, value, fail)
    # numbers and distributions
    try:
        if kind == "int" and not isinstance(value, dict):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                    or float(value) != int(value):
                fail(f"expected {spec.describe()}, got {value!r}")
            value = int(value)
        d = distributions.parse(value, path, allow_nested=(kind == "perreq"))
    except DistributionError as err:
        raise ScenarioError(source, err.key, err.detail) from None
    tails = False
    if d.nested():
        lo, hi, open_lo = _nested_support(d, source)
    elif kind == "perreq":
        lo, hi, open_lo = _support(d)
    else:
        lo, hi, open_lo = _drawn_support(d)
        tails = (lo, hi) != _closed_support(d)  # an unbounded end judged at its DRAW_TAIL quantile
    if (spec.lo is not None and (lo < spec.lo or (spec.lo_open and lo <= spec.lo and not open_lo))) or (
        spec.hi is not None and hi > spec.hi
    ):
        where = f"range between its {DRAW_TAIL:g} quantiles" if tails else "support"
        shown = f"{lo:g}" if d.is_fixed else f"{d.kind} distribution's {where} [{lo:g}, {hi:g}]"
        fail(f"expected {spec.describe()}, got {shown}")
    if kind == "perreq":
        return d
    if spec.plain and not d.is_fixed:
        fail(f"expected a plain value ({spec.describe()}), got a {d.kind} distribution: this key shapes the run "
             "itself and cannot be uncertain")
    if d.is_fixed:
        v = d.params["value"]
        return int(v) if kind == "int" else float(v)
    return d


def _check_weights(spec: Field, value, fail) -> tuple:
    """A list of relative weights (``[1, 2.5, 1]``) as a tuple of floats; ``fail`` raises the key's error."""
    if not isinstance(value, (list, tuple)):
        fail(f"expected {spec.describe()}, e.g. [1, 2, 1], got {value!r}")
    for i, x in enumerate(value):
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < spec.lo:
            fail(f"expected {spec.describe()}, got {x!r} at position {i + 1}")
    if value and not any(x > 0 for x in value):
        fail(f"expected {spec.describe()}, got only zeros ({len(value)})")
    return tuple(float(x) for x in value)


def _nested_support(d: Dist, source: str) -> tuple[float, float, bool]:
    """Support of a per-request distribution with uncertain parameters, over every value they can draw.

    Each kind's constraints and support ends are monotone in each parameter, so checking the distribution at
    every corner of its parameters' ranges covers all the values a sample can draw. A corner that is invalid
    (e.g. a median range reaching 0) is an error now rather than in the middle of a run.
    """
    nested = {k: _support(v)[:2] for k, v in d.params.items() if isinstance(v, Dist)}
    lo, hi, open_lo = math.inf, -math.inf, True
    names = list(nested)
    for corner in range(2 ** len(names)):
        params = dict(d.params)
        for i, name in enumerate(names):
            params[name] = nested[name][(corner >> i) & 1]
        try:
            c = distributions.make(d.kind, params, d.path)
        except DistributionError as err:
            ranges = ", ".join(f"{d.path}.{k} in [{a:g}, {b:g}]" for k, (a, b) in nested.items())
            raise ScenarioError(source, d.path, f"an uncertain parameter can make this distribution invalid "
                                f"({ranges}): {err.detail}") from None
        c_lo, c_hi, c_open = _support(c)
        if c_lo < lo or (c_lo == lo and not c_open):
            open_lo = c_open
        lo, hi = min(lo, c_lo), max(hi, c_hi)
    return lo, hi, open_lo


def _validate_path(path: str, raw, source: str, origin: str):
    spec = field_for(path)
    if spec is None:
        section = path.split(".")[0]
        options = list(SECTIONS.get(section, {}))
        if section == "model":
            options += list(catalog.MODEL_FIELDS)
        if section == "hardware":
            options += list(catalog.HARDWARE_FIELDS)
        key = path.split(".")[-1]
        if path.startswith("workload.classes.") and len(path.split(".")) == 4:
            options = list(CLASS_FIELDS)
        if path.startswith("cache.tiers.") and len(path.split(".")) == 4:
            options = [k for k in TIER_FIELDS if k != "name"]
        hint = _nearest(key, options) if options else _nearest(section, SECTIONS)
        raise ScenarioError(source, path, f"unknown key in {origin}{hint}")
    return _check_value(spec, path, raw, source)


def _flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    out = {}
    for k, v in table.items():
        path = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and "dist" not in v:
            out.update(_flatten(v, path))
        else:
            out[path] = v
    return out


def parse_override(text: str) -> tuple[str, Any]:
    """``"a.b=1"`` -> ``("a.b", 1)``; the value is read as TOML, or taken as a bare string."""
    if "=" not in text:
        raise ScenarioError("--set", text, "expected PATH=VALUE, e.g. speculative.draft_tokens=2")
    path, value = text.split("=", 1)
    path, value = path.strip(), value.strip()
    if not path or "" in path.split("."):
        raise ScenarioError("--set", text, "expected PATH=VALUE with a dotted PATH, e.g. speculative.draft_tokens=2")
    try:
        parsed = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    except RecursionError:
        raise ScenarioError("--set", path, "the value is nested too deeply") from None
    return path, parsed


def _set_path(raw: dict, path: str, value):
    parts = path.split(".")
    node = raw
    for p in parts[:-1]:
        nxt = node.setdefault(p, {})
        if not isinstance(nxt, dict):
            raise ScenarioError("--set", path, f"'{p}' is a value, not a table")
        node = nxt
    node[parts[-1]] = value


def bundled(name: str):
    """Path of a bundled scenario (``scenarios/<name>.toml``), also in an installed package."""
    path = resources.files("mcsim.scenarios") / f"{name}.toml"
    if not path.is_file():
        names = sorted(p.name.removesuffix(".toml") for p in resources.files("mcsim.scenarios").iterdir()
                       if p.name.endswith(".toml"))
        raise ScenarioError("", name, f"no bundled scenario of that name{_nearest(name, names)}; "
                            f"bundled: {', '.join(names)}")
    return Path(str(path))


def load_scenario(path, overrides=(), text: str | None = None) -> Scenario:
    """Read, override and validate a scenario file.

    Parameters
    ----------
    path : str or Path
        The TOML file (``text`` may supply its content instead, ``path`` then only names it).
    overrides : sequence of str
        ``PATH=VALUE`` strings as given to ``--set``.
    """
    path = Path(path) if path is not None else None
    source = str(path) if path is not None else "<scenario>"
    if text is None:
        kind = readable_kind(path)
        if kind:
            raise ScenarioError(source, "", f"is {kind}, not a scenario file (a regular TOML file)")
        try:
            text = path.read_text(encoding="utf-8")  # TOML is UTF-8 whatever the locale
        except OSError as err:
            raise ScenarioError(source, "", f"cannot read the file ({err.strerror})") from None
        except UnicodeDecodeError as err:
            raise ScenarioError(source, "", f"not valid TOML: not UTF-8 text (byte {err.start})") from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(source, "", f"not valid TOML: {err}") from None
    except RecursionError:
        raise ScenarioError(source, "", "not valid TOML for mcsim: arrays or tables nested too deeply") from None
    # the classes the overrides may refer to (a malformed [workload.classes] is reported by validate)
    file_classes = raw.get("workload", {}).get("classes") if isinstance(raw.get("workload"), dict) else None
    file_classes = tuple(file_classes) if isinstance(file_classes, dict) and file_classes else tuple(DEFAULT_CLASSES)
    # The base throughputs describe the file's hardware, whatever --set later changes.
    file_hardware = raw.get("hardware", {}).get("preset") if isinstance(raw.get("hardware"), dict) else None
    for item in overrides:
        key, value = parse_override(item)
        _check_class(key, file_classes, source, "--set")
        if key.startswith("cache.tiers."):
            _set_tier(raw, key, value, source)
            continue
        _set_path(raw, key, value)
    scn = validate(raw, source=source, text=text, base_dir=path.parent if path else None,
                   overrides=tuple(overrides), file_hardware=file_hardware)
    if scn.values.get("performance.calibration"):
        cal_path = Path(scn.values["performance.calibration"]).expanduser()
        if not cal_path.is_absolute() and path is not None and not any(
                o.split("=", 1)[0].strip() == "performance.calibration" for o in overrides):
            cal_path = path.parent / cal_path  # a file's own key is relative to the file; --set is relative to .
        scn = attach_calibration(scn, cal_path)
    surface = str(scn.values.get("performance.gemm_surface", ""))
    if surface not in ("", "none"):
        surface_path = Path(surface).expanduser()
        if not surface_path.is_absolute() and path is not None and not any(
                o.split("=", 1)[0].strip() == "performance.gemm_surface" for o in overrides):
            surface_path = path.parent / surface_path
        scn = attach_surface(scn, surface_path)
    warn_implausible(scn.values, source)  # a unit slip (a TPOT target of 50 s) runs, and is said
    return scn


def attach_surface(scn: Scenario, path) -> Scenario:
    """The scenario with ``performance.gemm_surface`` set to a calibration file's measured GEMM surface (absolute
    path). The file must be a calibration with a ``[surfaces.gemm]`` table, measured on the scenario's hardware;
    raises :class:`~mcsim.scenario.calibration_file.CalibrationError`."""
    cal = load_calibration(path)
    if "gemm" not in cal.surfaces:
        raise CalibrationError(str(path), "performance.gemm_surface: the calibration has no [surfaces.gemm] table "
                               "(mcsim calibrate writes one from per-GEMM measurements, e.g. Vidur's mlp.csv)",
                               key="performance.gemm_surface")
    hardware = str(scn.values["hardware.preset"])
    if cal.regime["hardware"].casefold() != hardware.casefold():
        raise CalibrationError(str(path), f"performance.gemm_surface: measured on {cal.regime['hardware']!r}, the "
                               f"scenario runs {hardware!r} (hardware.preset); a GEMM surface holds for the GPU it "
                               "was measured on", key="performance.gemm_surface")
    return replace(scn, values=dict(scn.values, **{"performance.gemm_surface": str(Path(path).resolve())}))


def attach_calibration(scn: Scenario, path) -> Scenario:
    """The scenario with a calibration file's parameters as uncertain inputs (:mod:`~mcsim.scenario.calibration_file`).

    The calibration must describe the scenario's regime (hardware preset, matmul format, fidelity), or it is
    refused with a message naming every difference; a parameter the scenario itself makes uncertain is replaced
    all the same (the calibration is the measurement). Raises
    :class:`~mcsim.scenario.calibration_file.CalibrationError`.
    """
    cal = load_calibration(path)
    check_regime(cal, regime_of(scn.values), f"scenario {scn.source}")
    try:
        calibrated = scn.with_values(cal.overrides(), origin=f"calibration {path}")
    except ScenarioError as err:
        raise CalibrationError(str(path), f"does not fit the scenario: {err}") from None
    values = dict(calibrated.values, **{"performance.calibration": str(path)})
    return replace(calibrated, values=values, calibration=cal)


def validate(raw: dict, source: str = "<scenario>", text: str = "", base_dir=None, overrides=(),
             file_hardware: str | None = None) -> Scenario:
    """Validate a parsed TOML document into a :class:`Scenario`."""
    known = set(SECTIONS) | {"baseline", "sweep"}
    for section, body in raw.items():
        if section not in known:
            raise ScenarioError(source, section, f"unknown section{_nearest(section, known)}; expected one of "
                                + ", ".join(sorted(known)))
        if not isinstance(body, dict):
            raise ScenarioError(source, section, "expected a table")

    values: dict[str, Any] = {}
    catalog_overrides: list[str] = []
    for section, fields in SECTIONS.items():
        body = dict(raw.get(section, {}))
        classes_raw = body.pop("classes", None) if section == "workload" else None
        tiers_raw = body.pop("tiers", None) if section == "cache" else None
        given = [path for path in TIER_SHORT_FORM_KEYS
                 if section == "cache" and path.split(".")[1] in body]
        if tiers_raw is not None and given:
            raise ScenarioError(source, given[0], "the short form of the tiers cannot be given with [[cache.tiers]]: "
                                "give each tier's gb (and gb_s, usd_per_gb_month) in its own table")
        for key, spec in fields.items():
            values[f"{section}.{key}"] = _check_value(spec, f"{section}.{key}", body.pop(key, spec.default), source)
        if section in ("model", "hardware"):
            values.update(_catalog_section(section, body, values[f"{section}.preset"], source))
            catalog_overrides += [f"{section}.{key}" for key in body]
            body = {}
        for key in body:
            if f"{section}.{key}" in REMOVED_KEYS:
                raise ScenarioError(source, f"{section}.{key}", REMOVED_KEYS[f"{section}.{key}"])
            raise ScenarioError(source, f"{section}.{key}", f"unknown key{_nearest(key, fields)}")
        if section == "workload":
            classes = _validate_classes(classes_raw, source, values)
        if section == "cache":
            values.update(_validate_tiers(tiers_raw, source))
    if values["efficiency.base_source"] == "auto":  # the file's (or --set's) own base throughputs, else the roofline's
        stated = raw.get("efficiency", {}) if isinstance(raw.get("efficiency"), dict) else {}
        values["efficiency.base_source"] = "stated" if BASE_KEYS & set(stated) else "roofline"
    if not values["efficiency.base_hardware"]:
        # (an invalid file preset was replaced by --set; the --set one is then the reference)
        known = isinstance(file_hardware, str) and file_hardware.lower() in catalog.hardware()
        values["efficiency.base_hardware"] = file_hardware.lower() if known else values["hardware.preset"]
    else:
        try:
            catalog.hardware_preset(values["efficiency.base_hardware"])
        except KeyError as err:
            raise ScenarioError(source, "efficiency.base_hardware", str(err.args[0])) from None
    values["meta.name"] = values["meta.name"] if "name" in raw.get("meta", {}) else (
        Path(source).stem if source and not source.startswith("<") else "scenario")

    baseline = baseline_overrides()
    for path, v in _flatten(raw.get("baseline", {})).items():
        _check_class(path, classes, source, "[baseline]")
        _check_tier_path(path, values, source, "[baseline]")
        _validate_path(path, v, source, "[baseline]")
        check_variant_key(path, source, "[baseline]")
        baseline[path] = v
    scn = Scenario(values=values, classes=classes, baseline=baseline, source=source, text=text,
                   base_dir=base_dir, overrides=tuple(overrides), catalog_overrides=tuple(sorted(catalog_overrides)))
    _cross_checks(scn)
    _check_expert_layout(scn, scn.variant("baseline").values)
    # Both variants use one set of draws (common random numbers), drawn from the scenario's own distributions:
    # a [baseline] distribution that differs from them would be ignored or have no draw at all.
    factory = scn.uncertain()
    for path, d in scn.variant("baseline").uncertain().items():
        if factory.get(path) != d:
            raise ScenarioError(source, path, "[baseline] cannot add or change an uncertain input; the baseline "
                                "and the factory share their draws, so give the distribution in its own section")
    if raw.get("sweep"):
        scn = replace(scn, sweep=tuple(grid.validate_axes(scn, grid.axes_from_table(raw["sweep"], source))))
    return scn


def check_variant_key(path: str, source: str, origin: str) -> None:
    """A variant may not change what the workload stage reads: the variants of a sample share its requests."""
    if workload_reads(path):
        raise ScenarioError(source, path, f"{origin} cannot change the workload: the variants of a sample share "
                            "their requests; sweep it with --grid instead")


def _catalog_section(section: str, body: dict, preset: str, source: str) -> dict:
    lookup = catalog.model_preset if section == "model" else catalog.hardware_preset
    fields = catalog.MODEL_FIELDS if section == "model" else catalog.HARDWARE_FIELDS
    try:
        entry = lookup(preset)
    except KeyError as err:
        raise ScenarioError(source, f"{section}.preset", str(err.args[0]) if err.args else str(err)) from None
    out = {}
    for key, default in entry.items():
        if key in fields:
            out[f"{section}.{key}"] = default
    for key, v in body.items():
        path = f"{section}.{key}"
        out[path] = _validate_path(path, v, source, f"[{section}]")
    return out


def _validate_classes(classes_raw, source: str, values: dict) -> tuple:
    if classes_raw is None:
        classes_raw = DEFAULT_CLASSES
    if not isinstance(classes_raw, dict) or not classes_raw:
        raise ScenarioError(source, "workload.classes", "expected at least one [workload.classes.<name>] table")
    for name, body in classes_raw.items():
        if not isinstance(body, dict):
            raise ScenarioError(source, f"workload.classes.{name}", "expected a table of class settings")
        for key, spec in CLASS_FIELDS.items():
            path = f"workload.classes.{name}.{key}"
            values[path] = _check_value(spec, path, body.get(key, spec.default), source)
        for key in body:
            if key not in CLASS_FIELDS:
                raise ScenarioError(source, f"workload.classes.{name}.{key}",
                                    f"unknown key{_nearest(key, CLASS_FIELDS)}")
    return tuple(classes_raw)


def _validate_tiers(tiers_raw, source: str) -> dict:
    """``[[cache.tiers]]`` as flat values: ``cache.tiers`` (the names, in order; empty for the short form) and
    ``cache.tiers.<name>.<key>`` for every key, the kind's defaults filled in (gb_s 0 = the kind's, resolved per
    sample from the hardware)."""
    if tiers_raw is None:
        return {"cache.tiers": ()}
    if not isinstance(tiers_raw, list) or not all(isinstance(t, dict) for t in tiers_raw):
        raise ScenarioError(source, "cache.tiers", "expected [[cache.tiers]] tables (an array of tables, one per tier, "
                            "first tier first)")
    if not 1 <= len(tiers_raw) <= MAX_TIERS:
        raise ScenarioError(source, "cache.tiers", f"expected 1 to {MAX_TIERS} [[cache.tiers]] tables, got "
                            f"{len(tiers_raw)}")
    out: dict[str, Any] = {}
    names: list[str] = []
    for position, body in enumerate(tiers_raw):
        name = body.get("name")
        if not isinstance(name, str) or not re.fullmatch(TIER_NAME_PATTERN, name):
            shown = "no name" if name is None else f"{name!r}"
            raise ScenarioError(source, f"cache.tiers[{position + 1}].name", "expected a name of up to 32 letters, "
                                f"digits, '_' or '-', starting with a letter, got {shown}")
        if name in names:
            raise ScenarioError(source, f"cache.tiers.{name}", "duplicate tier name: each [[cache.tiers]] table needs "
                                "its own")
        names.append(name)
        prefix = f"cache.tiers.{name}"
        for key in body:
            if key not in TIER_FIELDS:
                raise ScenarioError(source, f"{prefix}.{key}", f"unknown key{_nearest(key, TIER_FIELDS)}; a tier "
                                    f"has {', '.join(TIER_FIELDS)}")
        for key in TIER_REQUIRED:
            if key not in body:
                raise ScenarioError(source, f"{prefix}.{key}", f"missing: a tier needs {', '.join(TIER_REQUIRED)}")
        kind = TIER_KINDS.get(name)
        price = f"{prefix}.usd_per_gb_month"
        out[price] = (_check_value(TIER_FIELDS["usd_per_gb_month"], price, body["usd_per_gb_month"], source)
                      if "usd_per_gb_month" in body else TIER_PRICES.get(name, (0.0, ""))[0])
        for key in ("gb", "scope", "gb_s", "latency_us"):
            spec = TIER_FIELDS[key]
            if key in body:
                out[f"{prefix}.{key}"] = _check_value(spec, f"{prefix}.{key}", body[key], source)
            elif kind is not None or position == 0:  # the first tier restores nothing: no rate to give
                out[f"{prefix}.{key}"] = kind[1] if key == "latency_us" and kind is not None else spec.default
            else:
                raise ScenarioError(source, f"{prefix}.{key}", f"missing: '{name}' is not a kind of tier mcsim knows "
                                    f"({', '.join(TIER_KINDS)}), so give its {key}")
    out["cache.tiers"] = tuple(names)
    return out


def _check_tiers(scn: Scenario, v: dict):
    """The instances' own tiers come before the pooled ones."""
    names = v.get("cache.tiers") or ()
    scopes = [v[f"cache.tiers.{name}.scope"] for name in names]
    for t in range(1, len(names)):
        if scopes[t - 1] == "pooled" and scopes[t] != "pooled":
            raise ScenarioError(scn.source, f"cache.tiers.{names[t]}.scope", f"a private tier ({scopes[t]}) cannot "
                                f"follow the pooled tier {names[t - 1]}: the instances' own tiers come first")


def _cross_checks(scn: Scenario):
    """Checks across keys, run on every scenario however it was made (file, --set, --grid, a variant)."""
    v = scn.values
    shares = [v[f"workload.classes.{c}.share"] for c in scn.classes]
    # the largest share each class can draw: if they can all be 0 together, some sample has no traffic
    highest = [_closed_support(s)[1] if isinstance(s, Dist) else float(s) for s in shares]
    if sum(highest) <= 0:
        raise ScenarioError(scn.source, "workload.classes", "class shares must not all be 0 (a share distribution "
                            "whose support is only 0 counts as 0)")

    _check_expert_layout(scn, v)
    _check_bundled_names(scn, v)
    _check_replicas(scn, v)
    _check_tiers(scn, v)
    _check_rate_profile(scn, v)
    g, tp, pp = v["deployment.gpus_per_instance"], v["deployment.tp"], v["deployment.pp"]
    if all(isinstance(x, int) for x in (g, tp, pp)) and g and g % (tp * pp):
        raise ScenarioError(scn.source, "deployment.tp", f"tp x pp = {tp} x {pp} must divide gpus_per_instance "
                            f"({g}); the remaining factor is attention data parallelism")
    g, tp = v["deployment.prefill_gpus_per_instance"], v["deployment.prefill_tp"]
    if all(isinstance(x, int) for x in (g, tp)) and g and g % tp:
        raise ScenarioError(scn.source, "deployment.prefill_tp", f"must divide prefill_gpus_per_instance ({g})")


#: The hardware keys that name a bundled file (a surface's calibration, DeepEP's export), and where those live.
BUNDLED_NAMES = {**{f"hardware.{k}": ("calibrations", ".toml") for k in
                    ("gemm_surface", "gemm_fp8_surface", "gemm_fp4_surface", "experts_surface", "experts_fp8_surface",
                     "experts_fp4_surface")},
                 "hardware.deepep_table": ("measurements/aiconfigurator", "_deepep.csv.gz")}


def _check_bundled_names(scn: Scenario, v: dict):
    """A hardware key that names a bundled file names one that ships (or, for a surface, a calibration file that
    exists): a misspelt name is refused here, naming the key, not when a step first reads it."""
    data = Path(str(resources.files("mcsim.data")))
    for key, (folder, suffix) in BUNDLED_NAMES.items():
        name = v.get(key, "")
        if not isinstance(name, str) or not name:
            continue
        if suffix == ".toml" and name.endswith(".toml"):
            if not Path(name).is_file():
                raise ScenarioError(scn.source, key, f"{name}: no such calibration file")
            continue
        if not (data / folder / f"{name}{suffix}").is_file():
            known = sorted(p.name[:-len(suffix)] for p in (data / folder).glob(f"*{suffix}"))
            raise ScenarioError(scn.source, key, f"expected a bundled name{_nearest(name, known)} (one of "
                                f"{', '.join(known)}) or \"\" for none, got {name!r}" if suffix != ".toml" else
                                f"expected a bundled calibration{_nearest(name, known)} or a calibration file's path "
                                f"(.toml), or \"\" for none; got {name!r}")


def _check_rate_profile(scn: Scenario, v: dict):
    """A rate profile shapes generated arrivals only, and its start lies within its period (a distribution of
    starts may reach the period's end, the same time of the period as 0)."""
    if v["workload.rate_profile"] and v["workload.trace"]:
        raise ScenarioError(scn.source, "workload.rate_profile", "expected an empty list with workload.trace "
                            f"({v['workload.trace']}): a trace replay brings its own arrival times (replay it "
                            "faster or slower with workload.trace_time_scale)")
    start, period = v["workload.rate_profile_start_s"], v["workload.rate_profile_period_s"]
    highest = _closed_support(start)[1] if isinstance(start, Dist) else start
    reaches_end = isinstance(start, Dist) and start.kind != "choice" and highest == period
    if highest >= period and not reaches_end:
        shown = f"{highest:g}" if not isinstance(start, Dist) else f"a {start.kind} distribution up to {highest:g}"
        raise ScenarioError(scn.source, "workload.rate_profile_start_s", f"expected a time in [0, {period:g}) s, "
                            f"within workload.rate_profile_period_s = {period:g} s, got {shown}")


def _check_replicas(scn: Scenario, v: dict):
    """What deployment.fleet_simulation = 'replicas' simulates (:data:`mcsim.scenario.choices.REPLICA_NEEDS`);
    a value drawn from a distribution is checked when drawn."""
    mode = v.get("deployment.fleet_simulation", "representative")
    if isinstance(mode, Dist):
        return
    message = replica_mismatch({k: v[k] for k in REPLICA_KEYS if k in v and not isinstance(v[k], Dist)})
    if message:
        key = "deployment.fleet_simulation" if mode == "replicas" else "deployment.routing"
        raise ScenarioError(scn.source, key, message)


def _check_expert_layout(scn: Scenario, v: dict):
    """EPLB's layout rules, checked for both variants (the baseline may switch replication off)."""
    experts, redundant = v["model.experts"], v["moe.redundant_experts"]
    ep = v["moe.ep_ranks"] or v["deployment.gpus_per_instance"]
    if ep == 0 and isinstance(v["deployment.tp"], int) and isinstance(v["deployment.pp"], int):
        ep = v["deployment.tp"] * v["deployment.pp"]  # gpus_per_instance 0: tp x pp
    if not all(isinstance(x, int) for x in (experts, redundant, ep)) or experts <= 0:
        return
    active = v["model.active_experts"]
    if isinstance(active, int) and not 1 <= active <= experts:
        raise ScenarioError(scn.source, "model.active_experts", f"expected an integer in [1, {experts}] (a token's "
                            f"routed experts among the model's experts = {experts}), got {active}")
    if redundant > 0 and (experts + redundant) % ep:
        raise ScenarioError(scn.source, "moe.redundant_experts",
                            f"experts + redundant_experts = {experts + redundant} must be divisible by the EP ranks "
                            f"({ep}), so that every rank holds the same number of expert slots")
    if redundant > 0 and experts % v["moe.groups"]:
        raise ScenarioError(scn.source, "moe.groups",
                            f"must divide the model's {experts} experts, got {v['moe.groups']}")
    if redundant > 0 and ep % v["moe.nodes"]:
        raise ScenarioError(scn.source, "moe.nodes", f"must divide the EP ranks ({ep}), got {v['moe.nodes']}")


# -- drawing uncertain inputs ------------------------------------------------------------------------------------

def draw_uncertain(scn: Scenario, samples, seed: int, n_samples: int | None = None,
                   sampling: str | None = None, include_unused: bool = False) -> dict[str, np.ndarray]:
    """Values of every uncertain input for the given sample indices.

    Each input has its own stream keyed by (seed, sample, its path), so a value does not depend on which other
    inputs are uncertain, on chunking or on workers; inputs that name one ``stream`` share it (they move together). With ``sampling='lhs'`` the uniforms of each input are
    stratified over all ``n_samples`` samples (one random permutation per input), so the value of a sample still
    depends only on (seed, path, sample, n_samples).
    """
    samples = np.asarray(samples, dtype=np.int64)
    sampling = sampling or scn["mc.sampling"]
    out = {}
    for path, dist in scn.uncertain(include_unused).items():
        key = _path_key(dist.stream or path)  # inputs of one named stream share their uniforms
        if sampling == "lhs":
            if n_samples is None:
                raise ValueError("Latin hypercube sampling needs the total number of samples")
            perm = rng_for(seed, 0, STREAM_PARAMS, key, 1).permutation(n_samples)
            u = np.array([(perm[s] + rng_for(seed, int(s), STREAM_PARAMS, key).random()) / n_samples
                          for s in samples])
        else:
            u = np.array([rng_for(seed, int(s), STREAM_PARAMS, key).random() for s in samples])
        values = dist.ppf(u)
        spec = field_for(path)
        if spec is not None:  # an unbounded law's tail beyond DRAW_TAIL: rarer than 1e-12, held to the key's range
            lowest = None if spec.lo is None else np.nextafter(spec.lo, np.inf) if spec.lo_open else spec.lo
            if lowest is not None or spec.hi is not None:
                values = np.clip(values, lowest, spec.hi)
        if spec is not None and spec.kind == "int":
            values = np.rint(values)
        out[path] = values
    return out


def resolve(scn: Scenario, draws: dict[str, float]) -> dict[str, Any]:
    """The concrete parameters of one sample: a flat dict where every uncertain value is replaced by its draw
    and per-request distributions have their uncertain parameters resolved."""
    params = {}
    for path, v in scn.values.items():
        if isinstance(v, Dist):
            if _is_perreq(path):
                try:
                    params[path] = v.resolve(draws)
                except DistributionError as err:
                    raise ScenarioError(scn.source, err.key, f"a drawn parameter is invalid: {err.detail}") from None
            elif path in draws:
                x = float(draws[path])
                params[path] = int(x) if field_for(path).kind == "int" else x
            elif not read_by(path, scn.values["performance.fidelity"]) or (
                    path in UNMEASURED_STAND_INS and not reads_stand_in(path, scn.values)):
                params[path] = v  # not read by this fidelity (or on this hardware), so not drawn
            else:
                raise KeyError(f"no draw for the uncertain input {path}")
        else:
            params[path] = v
    return params

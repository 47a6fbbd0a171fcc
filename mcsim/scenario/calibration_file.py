"""Calibration files: fitted step-time parameters with their bootstrap distributions and the regime they hold for.

A scenario reads one (``performance.calibration``) when it loads, so the format lives with the scenario;
:mod:`mcsim.calibration` fits the parameters and :func:`mcsim.calibration.files.build` makes a calibration of the fits.

A calibration is a TOML file written by ``mcsim calibrate`` (or ``mcsim trace --save-calibration``)::

    [calibration]
    format = 2
    source = "mcsim calibrate mlp.csv all_reduce.csv --hardware h100"
    created = "2026-12-01T12:00:00+00:00"
    mcsim_version = "0.1.0"
    replicates = 200                      # bootstrap replicates of every parameter
    seed = 0

    [regime]                              # where the measurements hold
    hardware = "h100"                     # the hardware preset
    dtype = "bf16"                        # the matmul format that was measured
    fidelity = "roofline"
    stack = "vllm"                        # serving stack and version, when given ("" otherwise)
    stack_version = "0.6.3"

    [parameters."performance.flops_fraction"]
    class = "gemm"
    estimate = 0.741                      # the point fit
    low = 0.735                           # 5 % and 95 % of the replicates
    high = 0.748
    replicates = [0.741, 0.739, ...]      # one per bootstrap replicate, in replicate order

    [classes.gemm]                        # the fit of one op class
    rows = 8352
    shapes = 2072
    fit_mape = 0.031
    cv_mape = 0.045
    cv_scheme = "leave one shape out, 40 interleaved groups of the 2072 shapes"
    sources = ["mlp.csv"]

    [classes.gemm.cv_bands]               # held-out error by GEMM rows
    "1-16 rows" = 0.032

    [surfaces.gemm]                       # the measured GEMM surface (mcsim.perf.gemm_surface), flat
    n = [1280.0, ...]                     # each measured GEMM's columns, depth, rows and log(measured / modelled)
    k = [8192.0, ...]
    rows = [1.0, ...]
    log_ratio = [0.013, ...]

Using one
---------
``[performance] calibration = "file.toml"`` in a scenario, or ``--calibration FILE``: every parameter of the file
replaces the scenario's value with a draw per Monte Carlo sample from its replicates. All the file's parameters
draw the *same* replicate in a sample (one random stream, named after the file's digest), so the correlations of
the joint fit are kept; they are recorded in the result as uncertain inputs like any other. A calibrated value
*replaces* the scenario's (it never multiplies it). A file with a ``[surfaces.gemm]`` table also sets
``performance.gemm_surface`` to itself: its measured surface corrects every GEMM by its shape (a fused MoE fit's
``[surfaces.experts]`` sets ``hardware.experts_surface``, ``[surfaces.experts_fp8]`` ``hardware.experts_fp8_surface``
(``experts_fp4`` likewise),
correcting the routed experts by theirs). A calibration whose
regime differs from the scenario's (hardware preset, matmul format, fidelity) is refused with every difference
named.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcsim import __version__
from mcsim.errors import McsimError
from mcsim.fileio import atomic_write, not_a_regular_file, readable_kind
from mcsim.scenario.schema import field_for

FORMAT = 2
#: The scenario keys each op class of a calibration may set (what ``mcsim calibrate`` fits, and what
#: ``mcsim trace --save-calibration`` measures: this machine's peaks and its decoder's shares of them). A file that
#: sets anything else (``deployment.instances``, prices, ``mc.requests``) is refused.
CLASS_KEYS = {
    "gemm": ("performance.flops_fraction", "performance.bandwidth_fraction", "performance.gemm_half_tokens",
             "performance.gemm_floor_s", "performance.gemm_error"),
    "elementwise": ("performance.kernel_floor_s", "performance.elementwise_bandwidth_fraction",
                    "performance.elementwise_error"),
    "allreduce": ("hardware.collective_base_us", "hardware.collective_hop_us", "hardware.allreduce_bus_gb_s",
                  "performance.allreduce_error"),
    "allreduce_nodes": ("hardware.remote_allreduce_base_us", "hardware.remote_allreduce_bus_gb_s",
                        "performance.allreduce_nodes_error"),
    "send": ("hardware.send_base_us", "hardware.send_gb_s", "hardware.remote_send_base_us", "hardware.remote_send_gb_s",
             "performance.send_error"),
    "attention": ("hardware.attention_floor_us", "hardware.attention_bandwidth_fraction", "hardware.attention_unit_ns",
                  "hardware.attention_flops_fraction", "hardware.attention_prefill_bandwidth_fraction",
                  "hardware.attention_half_work", "hardware.attention_head_dim_half", "hardware.attention_half_context",
                  "performance.attention_error"),
    **{cls: (*(f"hardware.{cls}_{k}" for k in ("flops_fraction", "weight_bandwidth_fraction",
                                               "stream_bandwidth_fraction", "half_rows", "floor_us", "tile_ns")),
             f"performance.{cls}_error") for cls in ("experts", "experts_fp8", "experts_fp4")},
    "mla": (*(f"hardware.mla_{k}" for k in ("floor_us", "bandwidth_fraction", "unit_ns", "flops_fraction",
                                            "prefill_bandwidth_fraction", "half_work", "half_context")),
            "performance.mla_error"),
    "step": ("performance.step_overhead_s", "performance.attention_floor_s", "performance.step_error"),
    "peaks": ("hardware.fp32_tflops", "hardware.bf16_tflops", "hardware.hbm_tb_s"),
    "decoder": ("performance.bandwidth_fraction", "performance.flops_fraction"),
}
#: The measured surfaces a calibration may hold (its op classes'), and the scenario key that names the file for each.
SURFACE_KEYS = {"gemm": "performance.gemm_surface", "experts": "hardware.experts_surface",
                "experts_fp8": "hardware.experts_fp8_surface", "experts_fp4": "hardware.experts_fp4_surface"}
REGIME_KEYS = ("hardware", "dtype", "fidelity", "stack", "stack_version")
#: The regime keys a scenario is checked against (the stack is provenance: a scenario does not name one).
CHECKED = ("hardware", "dtype", "fidelity")


class CalibrationError(McsimError, ValueError):
    """A calibration file is invalid, or does not apply to a scenario; ``str(err)`` is ``file: key: what``."""

    def __init__(self, where: str, message: str, key: str | None = None):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.key = key


@dataclass(frozen=True)
class Calibration:
    """A calibration (see the module docstring).

    Attributes
    ----------
    regime : dict
        :data:`REGIME_KEYS` -> str.
    parameters : dict
        Dotted scenario key -> {"class", "estimate", "low", "high", "replicates" (list of float)}.
    classes : dict
        Op class -> {"rows", "shapes", "fit_mape", "cv_mape", "cv_scheme", "sources"} (and anything else
        recorded about the fit).
    source : str
        What was fitted, and how.
    created, mcsim_version : str
    seed : int
    notes : dict
        Other provenance (``mcsim trace``: the decoder shape that ran, the Ollama measurement).
    path : str
        The file it was read from ("" when built in memory).
    surfaces : dict
        Op class -> measured surface as flat lists (``gemm``: ``n``, ``k``, ``rows``, ``log_ratio``; see
        :mod:`mcsim.perf.gemm_surface`).
    """

    regime: dict
    parameters: dict
    classes: dict = field(default_factory=dict)
    source: str = ""
    created: str = ""
    mcsim_version: str = ""
    seed: int = 0
    notes: dict = field(default_factory=dict)
    path: str = ""
    surfaces: dict = field(default_factory=dict)

    @property
    def replicates(self) -> int:
        return len(next(iter(self.parameters.values()))["replicates"]) if self.parameters else 0

    @property
    def digest(self) -> str:
        """A short hash of the parameters' replicates (names the random stream the draws come from)."""
        text = json.dumps({k: v["replicates"] for k, v in sorted(self.parameters.items())})
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def overrides(self) -> dict:
        """Scenario values: every parameter as a choice over its replicates, all drawn from one stream."""
        stream = f"calibration {self.digest}"
        out = {}
        for key, spec in self.parameters.items():
            reps = [float(v) for v in spec["replicates"]]
            # a parameter measured without spread (a machine's peaks) is a plain value
            out[key] = reps[0] if min(reps) == max(reps) else {"dist": "choice", "values": reps, "stream": stream}
        for cls in self.surfaces:
            if self.path:
                out[SURFACE_KEYS[cls]] = str(Path(self.path).resolve())
        return out

    def summary(self) -> dict:
        """A JSON-able description for a result's attributes (no replicates)."""
        return {"path": self.path, "source": self.source, "regime": self.regime, "created": self.created,
                "replicates": self.replicates, "digest": self.digest,
                "parameters": {k: {x: v[x] for x in ("class", "estimate", "low", "high")}
                               for k, v in self.parameters.items()},
                "classes": self.classes, "notes": self.notes,
                "surfaces": {cls: f"{len(table['n'])} points" for cls, table in self.surfaces.items()}}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        value = float(value)
        if not math.isfinite(value):
            return "nan"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a JSON string is a valid TOML basic string
    if isinstance(value, (list, tuple, np.ndarray)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} to TOML")


def _key(key: str) -> str:
    """A TOML key: bare where TOML allows it, else quoted."""
    return key if key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key) else json.dumps(key)


def _table(lines: list, name: str, body: dict) -> None:
    lines.append(f"[{name}]")
    for key, value in body.items():
        if isinstance(value, dict):
            continue
        lines.append(f"{_key(key)} = {_toml_value(value)}")
    lines.append("")
    for key, value in body.items():
        if isinstance(value, dict):
            _table(lines, f"{name}.{_key(key)}", value)


def dumps(cal: Calibration) -> str:
    """The TOML text of a calibration."""
    lines = ["# mcsim calibration: fitted step-time parameters, each with its bootstrap replicates.",
             "# A scenario uses it with `[performance] calibration = \"<this file>\"` or `--calibration <this file>`.",
             ""]
    _table(lines, "calibration", {"format": FORMAT, "source": cal.source, "created": cal.created,
                                  "mcsim_version": cal.mcsim_version, "replicates": cal.replicates,
                                  "seed": cal.seed})
    _table(lines, "regime", {k: cal.regime.get(k, "") for k in REGIME_KEYS})
    for key, spec in cal.parameters.items():
        _table(lines, f"parameters.{json.dumps(key)}", {k: spec[k] for k in
                                                        ("class", "estimate", "low", "high", "replicates")})
    for cls, info in cal.classes.items():
        _table(lines, f"classes.{cls}", info)
    if cal.notes:
        _table(lines, "notes", cal.notes)
    for cls, table in cal.surfaces.items():
        _table(lines, f"surfaces.{cls}", table)
    return "\n".join(lines)


def save(cal: Calibration, path, *, overwrite: bool = False) -> Path:
    """Write ``cal`` to ``path`` atomically; an existing file is replaced only with ``overwrite``."""
    path = Path(path)
    reason = not_a_regular_file(path)
    if reason:
        raise CalibrationError(str(path), reason)
    if path.exists() and not overwrite:
        raise CalibrationError(str(path), "exists; pass --force to replace it")
    try:
        atomic_write(path, dumps(cal), fsync=True, mode=0o644)
    except OSError as err:
        raise CalibrationError(str(path), f"cannot be written: {err.strerror or err}") from None
    return path


def _fail(where, key, message):
    raise CalibrationError(where, f"{key}: {message}" if key else message, key)


def load(path) -> Calibration:
    """Read and check a calibration file; a :class:`CalibrationError` names the file and the key."""
    where = str(path)
    kind = readable_kind(path)
    if kind:
        raise CalibrationError(where, f"is {kind}, not a calibration file (a regular TOML file)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CalibrationError(where, f"cannot be read: {reason}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise CalibrationError(where, f"not valid TOML ({err})") from None
    except RecursionError:
        raise CalibrationError(where, "not valid TOML (nested too deeply)") from None
    head = data.get("calibration")
    if not isinstance(head, dict):
        _fail(where, "calibration", "missing table: is this a calibration written by mcsim calibrate?")
    if head.get("format") != FORMAT:
        _fail(where, "calibration.format", f"{head.get('format')!r} is not supported (expected {FORMAT}; files of "
              "older mcsim versions must be written again with this version)")
    regime = data.get("regime")
    if not isinstance(regime, dict):
        _fail(where, "regime", "missing table")
    for key in REGIME_KEYS:
        if not isinstance(regime.get(key, ""), str):
            _fail(where, f"regime.{key}", f"expected a string, got {regime[key]!r}")
    for key in CHECKED:
        if not regime.get(key):
            _fail(where, f"regime.{key}", "missing")
    unknown = sorted(set(regime) - set(REGIME_KEYS))
    if unknown:
        _fail(where, f"regime.{unknown[0]}", f"unknown key; a regime has {', '.join(REGIME_KEYS)}")
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        _fail(where, "parameters", "missing or empty")
    count = None
    for key, spec in params.items():
        name = f"parameters.{key}"
        if not isinstance(spec, dict):
            _fail(where, name, "expected a table")
        if field_for(key) is None or field_for(key).kind not in ("float", "int"):
            _fail(where, name, "not a numeric scenario key")
        cls = spec.get("class", "")
        if cls not in CLASS_KEYS or key not in CLASS_KEYS[cls]:
            allowed = ", ".join(CLASS_KEYS.get(cls, ())) or f"a class of {', '.join(CLASS_KEYS)}"
            _fail(where, name, f"a calibration sets only what its op class measures (class {cls!r}: {allowed})")
        reps = spec.get("replicates")
        if not isinstance(reps, list) or not reps or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in reps):
            _fail(where, f"{name}.replicates", "expected a non-empty list of finite numbers")
        if count is None:
            count = len(reps)
        elif len(reps) != count:
            _fail(where, f"{name}.replicates", f"has {len(reps)} values, the other parameters {count}: the "
                  "replicates are joint, one per bootstrap resample")
        for part in ("estimate", "low", "high"):
            value = spec.get(part)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                _fail(where, f"{name}.{part}", f"expected a finite number, got {value!r}")
        if not isinstance(spec.get("class", ""), str):
            _fail(where, f"{name}.class", "expected a string")
    classes = data.get("classes", {})
    notes = data.get("notes", {})
    if not isinstance(classes, dict) or not isinstance(notes, dict):
        _fail(where, "classes" if not isinstance(classes, dict) else "notes", "expected a table")
    surfaces = data.get("surfaces", {})
    if not isinstance(surfaces, dict) or set(surfaces) - set(SURFACE_KEYS):
        _fail(where, "surfaces", "expected a table with at most the tables " + ", ".join(SURFACE_KEYS))
    for cls, table in surfaces.items():
        _check_surface(where, f"surfaces.{cls}", table)
    return Calibration(regime={k: regime.get(k, "") for k in REGIME_KEYS},
                       parameters={k: {"class": v.get("class", ""), "estimate": float(v["estimate"]),
                                       "low": float(v["low"]), "high": float(v["high"]),
                                       "replicates": [float(x) for x in v["replicates"]]} for k, v in params.items()},
                       classes=classes, source=str(head.get("source", "")), created=str(head.get("created", "")),
                       mcsim_version=str(head.get("mcsim_version", "")), seed=int(head.get("seed", 0)),
                       notes=notes, path=where, surfaces=surfaces)


#: The widest correction a measured GEMM surface may make: ln 100 (the bundled H100 and A100 surfaces stay within
#: +-0.7, tests/test_gemm_surface.py; 1e6 would make a step take exp(1e6) s, an overflow).
MAX_LOG_RATIO = math.log(100.0)
#: The largest GEMM dimension a surface may hold (rows, columns, depth).
MAX_SURFACE_DIMENSION = 1e9


def _check_surface(where: str, name: str, table) -> None:
    """A measured surface: lists ``n``, ``k``, ``rows`` (positive) and ``log_ratio`` (finite), of one length."""
    if not isinstance(table, dict):
        _fail(where, name, "expected a table")
    length = None
    for key in ("n", "k", "rows", "log_ratio"):
        values = table.get(key)
        if not isinstance(values, list) or not values or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values):
            _fail(where, f"{name}.{key}", "expected a non-empty list of finite numbers")
        if key != "log_ratio" and not 0 < min(values) <= max(values) <= MAX_SURFACE_DIMENSION:
            _fail(where, f"{name}.{key}", f"expected positive numbers of at most {MAX_SURFACE_DIMENSION:g} (a GEMM's "
                  "rows, columns or depth)")
        if key == "log_ratio" and max(abs(v) for v in values) > MAX_LOG_RATIO:
            _fail(where, f"{name}.{key}", f"expected log ratios within +-{MAX_LOG_RATIO:.2f} (a measured GEMM "
                  "at most 100x slower or faster than the roofline's curve)")
        if length is not None and len(values) != length:
            _fail(where, f"{name}.{key}", f"has {len(values)} values, n has {length}: one per measured GEMM")
        length = len(values)
    unknown = sorted(set(table) - {"n", "k", "rows", "log_ratio"})
    if unknown:
        _fail(where, f"{name}.{unknown[0]}", "unknown key; a surface has n, k, rows and log_ratio")


def regime_of(values: dict) -> dict:
    """The regime a scenario's values describe: hardware preset, matmul format, fidelity."""
    return {"hardware": str(values["hardware.preset"]),
            "dtype": str(values.get("precision.linear") or values["precision.compute"]) if values["precision.enabled"]
            else "bf16",  # the linear layers' format: what a GEMM calibration measures
            "fidelity": str(values["performance.fidelity"])}


def check_regime(cal: Calibration, scenario_regime: dict, scenario: str = "the scenario") -> None:
    """Refuse a calibration of another regime, naming every difference and what to do."""
    hints = {"hardware": "hardware.preset", "dtype": "precision.enabled / precision.compute (precision.linear)",
             "fidelity": "performance.fidelity"}
    differences = []
    for key in CHECKED:
        ours, theirs = cal.regime[key], scenario_regime.get(key)
        if theirs is None or str(theirs).strip().casefold() != ours.strip().casefold():
            differences.append(f"{key}: calibrated for {ours!r}, {scenario} has {theirs!r} ({hints[key]})")
    if differences:
        raise CalibrationError(cal.path or "calibration",
                               "measured in another regime, refused: " + "; ".join(differences)
                               + ". A calibration holds only for the hardware, matmul format and fidelity it was "
                               "measured in.", key=differences[0].split(":", 1)[0])


def parameter(cls: str, replicates, estimate: float) -> dict:
    """One parameter of a calibration: its class, point estimate, 5 % / 95 % of its replicates, the replicates."""
    reps = np.asarray(replicates, float)
    return {"class": cls, "estimate": float(estimate), "low": float(np.quantile(reps, 0.05)),
            "high": float(np.quantile(reps, 0.95)), "replicates": [float(v) for v in reps]}


def new_calibration(regime: dict, parameters: dict, classes: dict, *, source: str, seed: int,
                    notes: dict | None = None, surfaces: dict | None = None) -> Calibration:
    """A calibration stamped with this mcsim's version and the time."""
    return Calibration(regime={k: regime.get(k, "") for k in REGIME_KEYS}, parameters=parameters, classes=classes,
                       source=source, created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       mcsim_version=__version__, seed=seed, notes=notes or {}, surfaces=surfaces or {})

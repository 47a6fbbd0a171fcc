"""Calibration anchors: measured-versus-modelled corrections the Monte Carlo engine can load.

A calibration says how far the model's throughput was from a measurement, and for which *regime* that holds:
the compute dtype, the performance backend (``factor`` or ``roofline``), the model and the hardware. A
calibration taken for FP32 on this machine says nothing about FP8 on an H800, so :func:`check_regime` refuses it
there instead of silently transferring the correction.

The correction
--------------
``factor`` is measured throughput / modelled throughput for the same work in the same regime (> 1: the model
was pessimistic). ``memory_bound_score`` s in [0, 1] is the share of the modelled step time that was bound by
memory traffic; the rest, 1 - s, was bound by arithmetic. :func:`apply` splits the factor geometrically between
the two achievable efficiencies of the roofline backend::

    bandwidth_fraction' = min(1, bandwidth_fraction * factor ** s)
    flops_fraction'     = min(1, flops_fraction     * factor ** (1 - s))

so a purely memory-bound measurement (s = 1) corrects only the bandwidth, a purely compute-bound one only the
FLOP/s, and where neither fraction is clipped the two scales multiply back to ``factor``. A fraction that would
exceed 1 (more than the hardware's peak) is clipped to 1. The factor backend's base throughputs
(``efficiency.base_decode_tok_s_per_gpu``, ``efficiency.base_prefill_tok_s_per_gpu``) are multiplied by
``factor``. Keys absent from the parameters are left absent; the backend not in use ignores the other's keys.

File format
-----------
JSON, one object: ``version`` (1), ``regime`` (``dtype``, ``backend``, ``model``, ``hardware``: strings),
``factor`` (> 0), ``memory_bound_score`` (in [0, 1]), ``bottleneck`` (string, e.g. "memory"), ``measured`` and
``estimated`` (objects: the figures the factor came from, for provenance) and ``source`` (string: what was
measured, and how). Written atomically (temporary file in the same folder, then ``os.replace``).

Example
-------
>>> from mcsim.optrace.calibration import Calibration, apply, check_regime, regime_of
>>> cal = Calibration(regime={"dtype": "bf16", "backend": "roofline", "model": "llama-3-70b",
...                           "hardware": "h100"},
...                   factor=0.8, memory_bound_score=1.0, bottleneck="memory",
...                   measured={"decode_tok_s": 80.0}, estimated={"decode_tok_s": 100.0}, source="example")
>>> params = {"precision.enabled": False, "performance.fidelity": "roofline", "model.preset": "llama-3-70b",
...           "hardware.preset": "h100", "performance.bandwidth_fraction": 0.8, "performance.flops_fraction": 0.6}
>>> check_regime(cal, regime_of(params))
>>> round(apply(cal, params)["performance.bandwidth_fraction"], 6)
0.64
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from mcsim.errors import McsimError
from mcsim.fileio import atomic_write

FORMAT_VERSION = 1
REGIME_KEYS = ("dtype", "backend", "model", "hardware")
FIELDS = ("regime", "factor", "memory_bound_score", "bottleneck", "measured", "estimated", "source")

BANDWIDTH_FRACTION = "performance.bandwidth_fraction"
FLOPS_FRACTION = "performance.flops_fraction"
BASE_THROUGHPUTS = ("efficiency.base_decode_tok_s_per_gpu", "efficiency.base_prefill_tok_s_per_gpu")


class CalibrationError(McsimError, ValueError):
    """A calibration file or object is invalid, or does not apply to a scenario.

    ``where`` names the file (or "calibration" for an object built in memory); ``key`` the offending key, if any.
    """

    def __init__(self, where: str, message: str, key: str | None = None):
        super().__init__(f"{where}: {message}")
        self.where = where
        self.key = key
        self.line: int | None = None  # set for invalid JSON


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_fields(data: dict, where: str) -> None:
    """Raise :class:`CalibrationError` naming ``where`` and the key for the first missing or invalid field."""

    def fail(key, message):
        raise CalibrationError(where, f"{key!r}: {message}", key)

    for key in FIELDS:
        if key not in data:
            fail(key, "missing")
    regime = data["regime"]
    if not isinstance(regime, dict):
        fail("regime", f"expected an object with keys {', '.join(REGIME_KEYS)}, got {type(regime).__name__}")
    for key in REGIME_KEYS:
        if key not in regime:
            fail(f"regime.{key}", "missing")
        if not isinstance(regime[key], str) or not regime[key].strip():
            fail(f"regime.{key}", f"expected a non-empty string, got {regime[key]!r}")
    unknown = sorted(set(regime) - set(REGIME_KEYS))
    if unknown:
        fail(f"regime.{unknown[0]}", f"unknown key; a regime has exactly {', '.join(REGIME_KEYS)}")
    if not _is_number(data["factor"]) or data["factor"] <= 0:
        fail("factor", f"expected a finite number > 0, got {data['factor']!r}")
    score = data["memory_bound_score"]
    if not _is_number(score) or not 0.0 <= score <= 1.0:
        fail("memory_bound_score", f"expected a number in [0, 1], got {score!r}")
    for key in ("bottleneck", "source"):
        if not isinstance(data[key], str):
            fail(key, f"expected a string, got {type(data[key]).__name__}")
    for key in ("measured", "estimated"):
        if not isinstance(data[key], dict) or not all(isinstance(k, str) for k in data[key]):
            fail(key, f"expected an object with string keys, got {type(data[key]).__name__}")


@dataclass(frozen=True)
class Calibration:
    """A measured-versus-modelled correction and the regime it is valid for.

    Parameters
    ----------
    regime : dict
        ``dtype``, ``backend``, ``model``, ``hardware`` (strings): where the measurement was taken.
    factor : float
        Measured / modelled throughput, > 0.
    memory_bound_score : float
        Share of the modelled step time bound by memory traffic, in [0, 1].
    bottleneck : str
        The dominant limit found by the measurement, e.g. ``"memory"`` or ``"compute"``.
    measured, estimated : dict
        The figures the factor was computed from (kept for provenance; JSON-serializable values).
    source : str
        What was measured, and how.
    """

    regime: dict = field(hash=False)
    factor: float
    memory_bound_score: float
    bottleneck: str
    measured: dict = field(hash=False)
    estimated: dict = field(hash=False)
    source: str

    def __post_init__(self):
        _check_fields(self.to_dict(), "calibration")

    def to_dict(self) -> dict:
        """The JSON object :func:`save` writes (without the version)."""
        return {key: getattr(self, key) for key in FIELDS}


def save(cal: Calibration, path) -> Path:
    """Write ``cal`` as JSON to ``path`` atomically; an existing file is replaced only once the new one is whole.

    Returns the path. Raises :class:`CalibrationError` when a value cannot be written as JSON (NaN, infinity,
    objects) or the file cannot be written.
    """
    path = Path(path)
    try:
        text = json.dumps({"version": FORMAT_VERSION, **cal.to_dict()}, indent=2, allow_nan=False) + "\n"
    except (TypeError, ValueError) as err:
        raise CalibrationError(str(path), f"cannot be written as JSON: {err}") from None
    try:
        atomic_write(path, text, fsync=True, mode=0o644)  # a calibration is not a secret
    except OSError as err:
        raise CalibrationError(str(path), f"cannot be written: {err.strerror or err}") from None
    return path


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def load(path) -> Calibration:
    """Read a calibration written by :func:`save`.

    Raises :class:`CalibrationError` naming the file: unreadable, invalid JSON (with line and column), a missing
    or invalid key (named), an unknown key or an unsupported version.
    """
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        raise CalibrationError(where, f"cannot be read: {reason}") from None
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as err:
        error = CalibrationError(where, f"invalid JSON at line {err.lineno}, column {err.colno}: {err.msg}")
        error.line = err.lineno
        raise error from None
    except ValueError as err:  # NaN / Infinity
        raise CalibrationError(where, f"invalid JSON: {err}") from None
    if not isinstance(data, dict):
        raise CalibrationError(where, f"expected a JSON object, got {type(data).__name__}")
    version = data.pop("version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise CalibrationError(where, f"'version': {version!r} is not supported (expected {FORMAT_VERSION})",
                               "version")
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        raise CalibrationError(where, f"{unknown[0]!r}: unknown key; expected {', '.join(FIELDS)}", unknown[0])
    _check_fields(data, where)
    return Calibration(**data)


def regime_of(params: dict) -> dict:
    """The regime a scenario's flat parameters describe.

    ``dtype`` is ``precision.compute`` when ``precision.enabled`` is on, else ``"bf16"`` (the unoptimized
    baseline); ``backend`` is ``performance.fidelity``; ``model`` and ``hardware`` are the catalog presets.
    Missing keys take the scenario schema's defaults.
    """
    from mcsim.scenario.schema import SECTIONS

    def get(path):
        if path in params:
            return params[path]
        section, key = path.split(".", 1)
        return SECTIONS[section][key].default

    return {
        "dtype": str(get("precision.compute")) if get("precision.enabled") else "bf16",
        "backend": str(get("performance.fidelity")),
        "model": str(get("model.preset")),
        "hardware": str(get("hardware.preset")),
    }


def check_regime(cal: Calibration, scenario_regime: dict) -> None:
    """Refuse a calibration measured in another regime.

    Values are compared without regard to case or surrounding spaces. Raises :class:`CalibrationError` listing
    every mismatching key with the calibration's and the scenario's value.
    """
    mismatches = []
    for key in REGIME_KEYS:
        ours = cal.regime[key]
        theirs = scenario_regime.get(key)
        if theirs is None or str(theirs).strip().casefold() != ours.strip().casefold():
            shown = "(not given)" if theirs is None else repr(theirs)
            mismatches.append(f"{key}: calibrated for {ours!r}, scenario has {shown}")
    if mismatches:
        raise CalibrationError(
            f"calibration ({cal.source})" if cal.source else "calibration",
            "measured in a different regime, refused: " + "; ".join(mismatches)
            + ". A calibration only applies to the dtype, backend, model and hardware it was measured on.",
            key=mismatches[0].split(":", 1)[0])


def _scaled(params: dict, key: str, scale: float, clip: bool) -> None:
    from mcsim.scenario.schema import read_by

    if key not in params:
        return
    value = params[key]
    fidelity = params.get("performance.fidelity")
    if not _is_number(value) and fidelity and not read_by(key, fidelity):
        return  # an uncertain input this sample's fidelity does not read is never drawn, and nothing reads it
    if not _is_number(value):
        raise CalibrationError("calibration", f"cannot scale {key}={value!r}: apply the calibration to resolved "
                                              f"parameters (numbers, after uncertain inputs are drawn)", key)
    value = value * scale
    params[key] = min(value, 1.0) if clip else value


def apply(cal: Calibration, params: dict) -> dict:
    """A copy of flat scenario parameters with the achievable efficiencies corrected by ``cal``.

    See the module docstring for the rule. ``params`` is not modified; keys other than
    ``performance.bandwidth_fraction``, ``performance.flops_fraction`` and the two
    ``efficiency.base_*_tok_s_per_gpu`` are returned unchanged. Call :func:`check_regime` first.

    Raises :class:`CalibrationError` when one of those keys holds something other than a number (e.g. a
    distribution not yet drawn).
    """
    out = dict(params)
    s = cal.memory_bound_score
    _scaled(out, BANDWIDTH_FRACTION, cal.factor ** s, clip=True)
    _scaled(out, FLOPS_FRACTION, cal.factor ** (1.0 - s), clip=True)
    for key in BASE_THROUGHPUTS:
        _scaled(out, key, cal.factor, clip=False)
    return out

"""A JSON Schema (draft 2020-12) of scenario files, generated from :mod:`mcsim.scenario.schema`.

``mcsim schema --json`` prints it, so that editors and other tools can check and complete scenario files (TOML
read as JSON). It has every section and key with its type, range, choices, default and description; the
distribution tables (:data:`mcsim.scenario.distributions.KINDS`) where a key takes one, with the key's range on
the parameters that bound a distribution's support; ``[baseline]`` (dotted keys of every section but what the
workload reads) and ``[sweep]`` (a list or a ``{start, stop, num, log}`` range per grid axis).

What a schema cannot say is checked when the scenario is loaded: rules across keys (``tp x pp`` divides
``gpus_per_instance``, EPLB's layout, a rate profile's start within its period), the support of a distribution
whose own parameters are uncertain, that a ``[sweep]`` or ``[baseline]`` class name is one of the scenario's
classes, and finite numbers.

Examples
--------
>>> schema = scenario_schema()
>>> schema["properties"]["cache"]["properties"]["block_tokens"]
{'$ref': '#/$defs/key.cache.block_tokens'}
>>> schema["$defs"]["key.cache.block_tokens"]["anyOf"][0]
{'type': 'integer', 'minimum': 1, 'maximum': 1000000}
"""

from __future__ import annotations

import re
from dataclasses import replace

from mcsim import __version__
from mcsim.scenario import catalog
from mcsim.scenario.bounds import SCENARIO_LOWER, SCENARIO_UPPER, TAIL_CHECKED_CATALOG
from mcsim.scenario.distributions import KINDS
from mcsim.scenario.grid import MAX_AXIS_VALUES
from mcsim.scenario.schema import (CLASS_FIELDS, MAX_TIERS, SECTIONS, TIER_FIELDS, TIER_NAME_PATTERN, TIER_REQUIRED,
                                   TIER_SHORT_FORM, TIER_SHORT_FORM_KEYS, Field, field_for,
                                   workload_reads)

DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: Parameters that bound the support of each kind: the key's range applies to them.
SUPPORT_BOUNDS = {"fixed": ("value",), "uniform": ("low", "high"), "loguniform": ("low", "high"),
                  "triangular": ("low", "mode", "high"), "normal": ("low", "high"), "beta": ("low", "high"),
                  "choice": ("values",), "lognormal": ()}

#: Preset keys and the catalog whose names they take (case-insensitive, as the loader reads them).
PRESETS = catalog.PRESET_KEYS

_STREAM = {"type": "string", "pattern": r"\S", "description": "Name of a random stream: uncertain inputs that name "
           "the same stream are drawn from the same uniform in every sample (they move together)."}


def _range(spec: Field, integer: bool = False) -> dict:
    out: dict = {"type": "integer" if integer else "number"}
    if spec.lo is not None:
        out["exclusiveMinimum" if spec.lo_open else "minimum"] = spec.lo
    if spec.hi is not None:
        out["maximum"] = spec.hi
    return out


def _case_insensitive(names) -> str:
    def letters(name):
        return "".join(f"[{c.lower()}{c.upper()}]" if c.lower() != c.upper() else re.escape(c) for c in name)

    return r"^\s*(" + "|".join(letters(n) for n in names) + r")\s*$"


def plain(path: str, spec: Field) -> dict:
    """The schema of a key's plain value (no distribution)."""
    if spec.kind == "bool":
        return {"type": "boolean"}
    if spec.kind == "choice":
        return {"type": "string", "enum": list(spec.choices)}
    if spec.kind == "weights":  # empty, or at least one weight above 0
        return {"type": "array", "items": _range(spec),
                "anyOf": [{"maxItems": 0}, {"contains": {"type": "number", "exclusiveMinimum": 0}}]}
    if spec.kind == "str":
        out: dict = {"type": "string"}
        if path in PRESETS:
            names = list(PRESETS[path]()) + ([] if path.endswith(".preset") else [""])
            out["pattern"] = _case_insensitive(names)
        return out
    return _range(spec, integer=spec.kind == "int")


def _distribution(kind: str, spec: Field | None, nested: bool) -> dict | None:
    """One kind's table; ``spec`` (a key's field) bounds its support, ``nested`` lets parameters be uncertain."""
    required, optional = KINDS[kind]
    lo, hi = (spec.lo, spec.hi) if spec is not None else (None, None)
    if kind == "lognormal" and ((lo is not None and lo > 0) or hi is not None):
        return None  # its support (0, inf) never fits the key's range
    number = {"type": "number"}
    bounded = dict(number)
    if spec is not None:
        bounded = _range(spec)
        if kind == "beta" and spec.lo_open and "exclusiveMinimum" in bounded:
            # a beta never reaches its lower end, so a bound at an open end of the key's range is fine
            bounded["minimum"] = bounded.pop("exclusiveMinimum")
    properties: dict = {"dist": {"const": kind}}
    for name in required + optional:
        if kind == "choice":
            item = bounded if name == "values" else {"type": "number", "minimum": 0}
            properties[name] = {"type": "array", "items": item, "minItems": 1}
            continue
        value = bounded if name in SUPPORT_BOUNDS[kind] else number
        if name in ("sd", "median", "a", "b"):
            value = {"type": "number", "exclusiveMinimum": 0}
        elif name == "sigma":
            value = {"type": "number", "minimum": 0}
        properties[name] = {"anyOf": [value, {"$ref": "#/$defs/distribution"}]} if nested else value
    properties["stream"] = {"$ref": "#/$defs/stream"}
    need = ["dist", *required]
    # unbounded by default: a key with a range needs the bound that its default support would cross
    if kind == "normal":
        need += [n for n, edge in (("low", lo), ("high", hi)) if edge is not None]
    if kind == "beta":
        need += (["low"] if lo is not None and lo > 0 else []) + (["high"] if hi is not None and hi < 1 else [])
    return {"type": "object", "properties": properties, "required": need, "additionalProperties": False}


def _bound(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _distributions_name(spec: Field) -> str:
    """The name in ``$defs`` of the distribution tables a key's range admits (keys of one range share them)."""
    name = "per-request" if spec.kind == "perreq" else "uncertain"
    if spec.lo is not None:
        name += f".{'gt' if spec.lo_open else 'ge'}{_bound(spec.lo)}"
    if spec.hi is not None:
        name += f".le{_bound(spec.hi)}"
    return name


def _laws_range(path: str, spec: Field) -> Field:
    """The range a key's distribution tables are bounded by here: its own, less the physical bounds that the loader
    holds an unbounded law's tails to (:data:`mcsim.scenario.bounds.DRAW_TAIL`), which a JSON Schema cannot
    express; a lognormal price or a normal without ``high`` stays valid, and the loader checks their tails."""
    key = re.sub(r"^(workload\.classes|cache\.tiers)\.[^.]+\.", r"\1.*.", path)
    hi = None if key in SCENARIO_UPPER or key in TAIL_CHECKED_CATALOG else spec.hi
    lo, lo_open = (0, True) if key in SCENARIO_LOWER else (spec.lo, spec.lo_open)
    return replace(spec, lo=lo, hi=hi, lo_open=lo_open)


def value(path: str, spec: Field, description: str, default=None, defs: dict | None = None) -> dict:
    """The schema of a key: its plain value or, where it takes one, a distribution table.

    The distribution tables go to ``defs`` (``$defs`` of the document), shared by every key of the same range.
    """
    out: dict = {}
    if spec.kind in ("float", "int", "perreq") and not spec.plain:
        laws = _laws_range(path, spec)
        name = _distributions_name(laws)
        if defs is not None and name not in defs:
            tables = [d for kind in KINDS if (d := _distribution(kind, laws, nested=spec.kind == "perreq"))]
            defs[name] = {"anyOf": tables}
        out["anyOf"] = [plain(path, spec), {"$ref": f"#/$defs/{name}"}]
    else:
        out.update(plain(path, spec))
    if spec.fidelity:
        description += f" Read by the {spec.fidelity} fidelity only."
    if spec.kind == "perreq":
        description += " Per-request: drawn once per request; its parameters may be uncertain."
    elif spec.kind in ("float", "int") and not spec.plain:
        description += " A distribution makes it uncertain: drawn once per Monte Carlo sample."
    out["description"] = description
    if default is not None:
        out["default"] = list(default) if isinstance(default, tuple) else default
    return out


def axis(path: str, spec: Field) -> dict:
    """The schema of one ``[sweep]`` axis: a list of plain values, or a range for a numeric key."""
    values = {"type": "array", "items": plain(path, spec), "minItems": 1, "maxItems": MAX_AXIS_VALUES,
              "uniqueItems": True}
    if spec.kind not in ("float", "int"):
        return values
    bound = _range(spec)
    span = {"type": "object", "properties": {"start": bound, "stop": bound,
                                             "num": {"type": "integer", "minimum": 1, "maximum": MAX_AXIS_VALUES},
                                             "log": {"type": "boolean"}},
            "required": ["start", "stop", "num"], "additionalProperties": False}
    return {"anyOf": [values, span]}


def _keys(section: str) -> dict[str, tuple[Field, str, object]]:
    """key -> (Field, description, default) of one section, catalog fields included."""
    out = {key: (spec, spec.doc, spec.default) for key, spec in SECTIONS[section].items()}
    docs = {"model": catalog.MODEL_FIELD_DOCS, "hardware": catalog.HARDWARE_FIELD_DOCS}.get(section, {})
    for key, (_, doc) in docs.items():
        out[key] = (field_for(f"{section}.{key}"), f"Catalog field: {doc}. Default: the preset's.", None)
    if section == "meta":
        out["name"] = (out["name"][0], out["name"][1] + " Default: the file's name without .toml.", None)
    return out


def _class_axes(prefix: str) -> dict:
    """Pattern properties for class keys written as one dotted path (``"workload.classes.chat.share"``)."""
    return {f"{prefix}{re.escape(key)}$": {"$ref": f"#/$defs/axis.class.{key}"}
            for key, spec in CLASS_FIELDS.items() if spec.kind != "perreq"}


def _tier_axes(prefix: str) -> dict:
    """Pattern properties for tier keys written as one dotted path (``"cache.tiers.dram.gb"``)."""
    return {f"{prefix}{re.escape(key)}$": {"$ref": f"#/$defs/axis.tier.{key}"} for key in TIER_FIELDS if key != "name"}


def _tier_overrides(prefix: str) -> dict:
    """Pattern properties for tier keys in ``[baseline]`` (``"cache.tiers.dram.gb" = 0``)."""
    return {f"{prefix}{re.escape(key)}$": {"$ref": f"#/$defs/tier.{key}"} for key in TIER_FIELDS if key != "name"}


def scenario_schema() -> dict:
    """The JSON Schema of a scenario file, as a dict (``json.dumps`` it)."""
    defs: dict = {"stream": _STREAM,
                  "distribution": {"anyOf": [_distribution(kind, None, nested=False) for kind in KINDS],
                                   "description": "A distribution table: dist = one of " + ", ".join(KINDS)}}
    properties: dict = {}
    baseline: dict = {}
    sweep: dict = {}
    for key, spec in CLASS_FIELDS.items():
        defs[f"class.{key}"] = value(f"workload.classes.<name>.{key}", spec, spec.doc, spec.default, defs)
        if spec.kind != "perreq":
            defs[f"axis.class.{key}"] = axis(key, spec)
    class_table = {"type": "object", "additionalProperties": False,
                   "properties": {k: {"$ref": f"#/$defs/class.{k}"} for k in CLASS_FIELDS},
                   "description": "One request class: its share of the traffic, lengths, turns and acceptance."}
    class_axis_table = {"type": "object", "additionalProperties": False,
                        "properties": {k: {"$ref": f"#/$defs/axis.class.{k}"} for k, s in CLASS_FIELDS.items()
                                       if s.kind != "perreq"}}
    for key, spec in TIER_FIELDS.items():
        defs[f"tier.{key}"] = value(f"cache.tiers.<name>.{key}", spec, spec.doc, None, defs)
        if key != "name":
            defs[f"axis.tier.{key}"] = axis(key, spec)
    defs["tier.name"]["pattern"] = f"^{TIER_NAME_PATTERN}$"
    tier_table = {"type": "object", "additionalProperties": False, "required": list(TIER_REQUIRED),
                  "properties": {k: {"$ref": f"#/$defs/tier.{k}"} for k in TIER_FIELDS},
                  "description": "One cache tier: name, capacity per unit of its scope, scope, and optionally its "
                                 "read bandwidth and latency (default: its kind's, by name)."}
    tier_fields = [k for k in TIER_FIELDS if k != "name"]
    tier_axis_table = {"type": "object", "additionalProperties": False,
                       "properties": {k: {"$ref": f"#/$defs/axis.tier.{k}"} for k in tier_fields}}
    tier_override_table = {"type": "object", "additionalProperties": False,
                           "properties": {k: {"$ref": f"#/$defs/tier.{k}"} for k in tier_fields}}
    for section in SECTIONS:
        keys = _keys(section)
        body, base_body, sweep_body = {}, {}, {}
        for key, (spec, doc, default) in keys.items():
            path = f"{section}.{key}"
            defs[f"key.{path}"] = value(path, spec, doc, default, defs)
            body[key] = {"$ref": f"#/$defs/key.{path}"}
            if not workload_reads(path):
                base_body[key] = baseline[path] = {"$ref": f"#/$defs/key.{path}"}
            if section != "mc" and spec.kind not in ("perreq", "weights"):
                defs[f"axis.{path}"] = axis(path, spec)
                sweep_body[key] = sweep[path] = {"$ref": f"#/$defs/axis.{path}"}
        table = {"type": "object", "properties": body, "additionalProperties": False}
        if section == "cache":
            table["properties"]["tiers"] = {
                "type": "array", "minItems": 1, "maxItems": MAX_TIERS, "items": tier_table,
                "description": "The cache as an ordered list of exclusive tiers, first (the GPUs' memory) to last, "
                               "one [[cache.tiers]] table each; replaces the short form's keys "
                               "(" + ", ".join(p.split(".")[1] for p in TIER_SHORT_FORM_KEYS)
                               + ")."}
            table["dependentSchemas"] = {"tiers": {"not": {"anyOf": [
                {"required": [p.split(".")[1]]} for p in TIER_SHORT_FORM_KEYS]}}}
            sweep_body["tiers"] = {"type": "object", "additionalProperties": tier_axis_table}
            base_body["tiers"] = {"type": "object", "additionalProperties": tier_override_table}
        if section == "workload":
            table["properties"]["classes"] = {
                "type": "object", "minProperties": 1, "additionalProperties": class_table,
                "description": "Request classes, one [workload.classes.<name>] table each (default: one class, "
                               "chat, with every field's default)."}
            sweep_body["classes"] = {"type": "object", "additionalProperties": class_axis_table}
            # a trace replay brings its own arrival times: no rate profile with it
            table["not"] = {"required": ["trace", "rate_profile"],
                            "properties": {"trace": {"minLength": 1}, "rate_profile": {"minItems": 1}}}
        properties[section] = table
        if base_body:
            baseline[section] = {"type": "object", "properties": base_body, "additionalProperties": False}
            if section == "cache":
                baseline[section]["patternProperties"] = _tier_overrides(r"^tiers\.[^.]+\.")
        if sweep_body:
            nested = {"type": "object", "properties": sweep_body, "additionalProperties": False}
            if section == "workload":
                nested["patternProperties"] = _class_axes(r"^classes\.[^.]+\.")
            if section == "cache":
                nested["patternProperties"] = _tier_axes(r"^tiers\.[^.]+\.")
            sweep[section] = nested
    properties["baseline"] = {
        "type": "object", "properties": baseline, "additionalProperties": False,
        "patternProperties": _tier_overrides(r"^cache\.tiers\.[^.]+\."),
        "description": "What compare's baseline variant changes after switching every lever off: dotted keys "
                       "(or nested tables) of any section but what the workload reads, which both variants share."}
    properties["sweep"] = {
        "type": "object", "properties": sweep, "additionalProperties": False,
        "patternProperties": {**_class_axes(r"^workload\.classes\.[^.]+\."),
                              **_tier_axes(r"^cache\.tiers\.[^.]+\.")},
        "description": "Grid axes: a dotted key (quoted, or as nested tables) and a list of values or a range "
                       "{ start, stop, num, log }. [mc] keys and per-request distributions cannot be axes."}
    return {
        "$schema": DRAFT,
        "title": "mcsim scenario",
        "description": "A scenario file of mcsim (TOML), generated from mcsim/scenario/schema.py by mcsim "
                       f"{__version__}. Rules across keys are checked when the scenario is loaded.",
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
        "$defs": defs,
    }

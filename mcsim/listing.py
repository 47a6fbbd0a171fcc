"""What ``mcsim list`` prints: the catalog presets, the bundled scenarios and every scenario key.

Everything here is read from the schema (:mod:`mcsim.scenario.schema`), the catalogs (``mcsim/data/*.toml``) and
the bundled scenarios, so the listing cannot drift from what the loader accepts.

Examples
--------
>>> [row["preset"] for row in models()][:2]
['deepseek-v3', 'llama-3-70b']
>>> row = next(r for r in keys("cache") if r["key"] == "cache.block_tokens")
>>> row["type"], row["default"], row["allowed"], row["distribution"], row["fidelity"]
('integer', 64, '[1, 1000000]', 'uncertain', 'both')
"""

from __future__ import annotations

import difflib
import tomllib
from importlib import resources

from mcsim.scenario import catalog
from mcsim.scenario.schema import CLASS_FIELDS, SECTIONS, TIER_FIELDS, TIER_REQUIRED, Field, ScenarioError, field_for
from mcsim.tables import table, terminal_width

#: Names of the schema's kinds as ``mcsim list keys`` prints them.
TYPE_NAMES = {"float": "number", "int": "integer", "perreq": "per-request", "bool": "bool", "str": "string",
              "choice": "choice", "weights": "list"}

#: What a preset key accepts, and the catalog each of them names.
PRESET_KEYS = catalog.PRESET_KEYS


# -- presets ----------------------------------------------------------------------------------------------------

def models() -> list[dict]:
    """Every model preset: ``{"preset": name, **catalog entry}``, in catalog order."""
    return [{"preset": name, **entry} for name, entry in catalog.models().items()]


def hardware() -> list[dict]:
    """Every hardware preset: ``{"preset": name, **catalog entry}``, in catalog order."""
    return [{"preset": name, **entry} for name, entry in catalog.hardware().items()]


def scenarios() -> list[dict]:
    """The bundled scenarios (``scenarios/*.toml``): name and ``[meta] description``."""
    folder = resources.files("mcsim.scenarios")
    out = []
    for path in sorted(folder.iterdir(), key=lambda p: p.name):
        if path.name.endswith(".toml"):
            meta = tomllib.loads(path.read_text(encoding="utf-8")).get("meta", {})
            out.append({"scenario": path.name.removesuffix(".toml"), "description": meta.get("description", "")})
    return out


def _experts(m: dict) -> str:
    if not m["experts"]:
        return "dense"
    shared = f"+{m['shared_experts']}" if m["shared_experts"] else ""
    return f"{m['experts']}{shared}, top {m['active_experts']}"


def format_models(width: int | None = None) -> list[str]:
    """The model presets' key facts as table lines."""
    rows = [["model", "params B", "active B", "layers", "attention", "experts", "context"]]
    rows += [[m["preset"], f"{m['total_params_b']:g}", f"{m['active_params_b']:g}", m["layers"],
              m["attention"].upper(), _experts(m), f"{m['max_context'] // 1024}k"] for m in models()]
    return table(rows, width=width)


def format_hardware(width: int | None = None) -> list[str]:
    """The hardware presets' key facts as table lines (datasheet figures; prices are estimates)."""
    rows = [["hardware", "HBM GB", "TB/s", "BF16 TFLOPS", "FP8 TFLOPS", "TDP W", "price USD", "USD/GPU-h"]]
    rows += [[h["preset"], f"{h['hbm_gb']:g}", f"{h['hbm_tb_s']:g}", f"{h['bf16_tflops']:,.0f}",
              f"{h['fp8_tflops']:,.0f}" if h["fp8_tflops"] else "-", f"{h['tdp_w']:,.0f}", f"{h['price_usd']:,.0f}",
              f"{h['rental_usd_per_hour']:g}"] for h in hardware()]
    return table(rows, width=width)


def format_scenarios(width: int | None = None) -> list[str]:
    rows = [["scenario", "description"]] + [[s["scenario"], s["description"]] for s in scenarios()]
    return table(rows, width=width, wrap=True)


# -- keys -------------------------------------------------------------------------------------------------------

def sections() -> list[str]:
    """The sections that have keys of their own, in schema order."""
    return list(SECTIONS)


def _key_fields(section: str) -> list[tuple[str, Field, str]]:
    """(dotted key, Field, description) of every key of a section, catalog fields and class fields included."""
    out = [(f"{section}.{key}", spec, spec.doc) for key, spec in SECTIONS[section].items()]
    docs = {"model": catalog.MODEL_FIELD_DOCS, "hardware": catalog.HARDWARE_FIELD_DOCS}.get(section, {})
    for key, (_, doc) in docs.items():
        path = f"{section}.{key}"
        out.append((path, field_for(path), f"Catalog field ({doc}); default: the preset's."))
    if section == "workload":
        out += [(f"workload.classes.<name>.{key}", spec, spec.doc) for key, spec in CLASS_FIELDS.items()]
    if section == "cache":  # one [[cache.tiers]] table per tier
        out += [(f"cache.tiers.<name>.{key}" if key != "name" else "cache.tiers.name", spec, spec.doc)
                for key, spec in TIER_FIELDS.items()]
    return out


def _tier_default(path: str) -> str | None:
    """What a ``[[cache.tiers]]`` key defaults to, in words (None for other keys)."""
    if not path.startswith("cache.tiers."):
        return None
    return "(required)" if path.rsplit(".", 1)[-1] in TIER_REQUIRED else "(its kind's)"


def _number(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def allowed(path: str, spec: Field) -> str:
    """What a key accepts, in a few words: a range, the choices or the catalog's presets."""
    if spec.kind == "choice":
        return ", ".join(spec.choices)
    if spec.kind == "bool":
        return "true, false"
    if spec.kind == "weights":
        return "each >= 0, one > 0"
    if path in PRESET_KEYS:
        return ", ".join(PRESET_KEYS[path]()) + ("" if path.endswith(".preset") else ' or ""')
    if spec.lo is None and spec.hi is None:
        return ""
    lo = "-inf" if spec.lo is None else _number(spec.lo)
    hi = "inf" if spec.hi is None else _number(spec.hi)
    return f"{'(' if spec.lo_open else '['}{lo}, {hi}{')' if spec.hi is None else ']'}"


def _default_text(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple):
        return "[" + ", ".join(_number(x) for x in value) + "]"
    if isinstance(value, dict):
        params = " ".join(f"{k}={_number(v)}" for k, v in value.items() if k != "dist")
        return f"{value['dist']} {params}"
    if value is None:
        return "(preset)"
    return _number(value)


def keys(section: str | None = None) -> list[dict]:
    """Every scenario key (or those of one section) with its type, default, allowed values, whether it takes a
    distribution and which fidelity reads it.

    Raises
    ------
    ScenarioError
        ``section`` is not a section with keys of its own; the message lists them.
    """
    if section is not None and section not in SECTIONS:
        near = difflib.get_close_matches(section, list(SECTIONS), n=1, cutoff=0.5)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise ScenarioError("", section, f"unknown section{hint}; the sections with keys are "
                            f"{', '.join(SECTIONS)} ([baseline] and [sweep] take their dotted keys)")
    out = []
    for name in [section] if section else list(SECTIONS):
        for path, spec, doc in _key_fields(name):
            out.append({
                "key": path, "section": name, "type": TYPE_NAMES[spec.kind],
                "default": None if _tier_default(path) else spec.default,
                "allowed": allowed(path, spec), "choices": list(spec.choices), "minimum": spec.lo,
                "maximum": spec.hi, "minimum_exclusive": spec.lo_open,
                "distribution": ("per-request" if spec.kind == "perreq" else
                                 "uncertain" if spec.takes_distribution else "no"),
                "fidelity": spec.fidelity or "both", "description": doc,
            })
    return out


def format_keys(rows: list[dict], width: int | None = None, describe: bool = False) -> list[str]:
    """Key rows (from :func:`keys`) as one table per section, or with ``describe`` as a list with descriptions."""
    width = width or terminal_width()
    lines: list[str] = []
    for section in dict.fromkeys(r["section"] for r in rows):
        if lines:
            lines.append("")
        lines.append(f"[{section}]")
        body = [r for r in rows if r["section"] == section]
        if describe:
            for r in body:
                facts = [r["type"], f"default {_tier_default(r['key']) or _default_text(r['default'])}"]
                facts += [f"allowed {r['allowed']}"] if r["allowed"] else []
                facts += {"uncertain": ["may be a distribution"], "per-request": ["a per-request distribution"]}.get(
                    r["distribution"], [])
                facts += [f"{r['fidelity']} fidelity only"] if r["fidelity"] != "both" else []
                lines += table([[r["key"].removeprefix(f"{section}."), "; ".join(facts)]], header=0, width=width,
                               wrap=True)
                lines += ["    " + line for line in table([[r["description"]]], header=0,
                                                           width=width - 4, wrap=True)]
            continue
        rows_ = [["key", "type", "default", "allowed", "dist", "fidelity"]]
        rows_ += [[r["key"].removeprefix(f"{section}."), r["type"],
                   _tier_default(r["key"]) or _default_text(r["default"]), r["allowed"],
                   "no" if r["distribution"] == "no" else "yes", r["fidelity"]] for r in body]
        lines += table(rows_, width=width, wrap=True)
    return lines

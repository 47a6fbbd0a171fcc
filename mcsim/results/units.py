"""Units of result variables as CF wants them: strings that UDUNITS-2 and pint both parse.

A result shows its figures in the units people use (``tokens/s/GPU``, ``USD/Mtok``); those are not units UDUNITS
or pint know (a GPU, a token and a dollar are counts, not units). So every variable carries two attributes:

``units``
    The CF unit of the stored number: ``1/s`` for tokens per second per GPU (tokens and GPUs are counts), ``1``
    for fractions and counts, ``Gbyte``, ``J``, ``h`` ... Money is a count of a currency: ``units = "1"`` (or
    ``1/d`` per day, ``1/h`` per hour) plus ``currency = "USD"``.
``display_units``
    The unit as a person reads it in tables and figures, e.g. ``USD/Mtok``.

The stored numbers are never rescaled: ``cost_usd_per_mtok`` is USD per million output tokens, its CF unit ``1``
(a ratio of two counts) and ``long_name`` say so.
"""

from __future__ import annotations

#: Display unit -> (CF unit, extra attributes).
CF_UNITS: dict[str, tuple[str, dict]] = {
    "1": ("1", {}),
    "s": ("s", {}),
    "tokens/s/GPU": ("1/s", {}),
    "sequences/GPU": ("1", {}),
    "experts": ("1", {}),
    "GB": ("Gbyte", {}),
    "GB/request": ("Gbyte", {}),
    "bytes": ("byte", {}),
    "bytes/token": ("byte", {}),
    "GPUs": ("1", {}),
    "instances": ("1", {}),
    "GPU-hours": ("h", {}),
    "J/token": ("J", {}),
    "USD/Mtok": ("1", {"currency": "USD"}),
    "USD/day": ("1/d", {"currency": "USD"}),
    "months": ("month", {}),
    "requests": ("1", {}),
    "samples": ("1", {}),
    "tokens": ("1", {}),
}

#: Key suffix -> (CF unit, display unit, extra attributes) of scenario inputs, first match wins. Keys without a
#: match are counts, fractions, factors or switches: ``1``.
_SUFFIXES: tuple[tuple[str, str, str, dict], ...] = (
    ("_usd_per_gpu_hour", "1/h", "USD/GPU-hour", {"currency": "USD"}),
    ("_usd_per_hour", "1/h", "USD/GPU-hour", {"currency": "USD"}),
    ("_usd_per_mtok", "1", "USD/Mtok", {"currency": "USD"}),
    ("_usd_per_kwh", "1/(kW*h)", "USD/kWh", {"currency": "USD"}),
    ("price_usd", "1", "USD", {"currency": "USD"}),
    ("_tflops", "1/ps", "TFLOP/s", {}),  # 1 TFLOP/s = 1e12 / s = 1 / ps
    ("_tb_s", "Tbyte/s", "TB/s", {}),
    ("_gb_s", "Gbyte/s", "GB/s", {}),
    ("_gb_s_per_node", "Gbyte/s", "GB/s", {}),
    ("_gb", "Gbyte", "GB", {}),
    ("_gb_per_node", "Gbyte", "GB", {}),
    ("_gb_per_instance", "Gbyte", "GB", {}),
    ("_gb_per_gpu", "Gbyte", "GB", {}),
    ("_us", "us", "us", {}),
    ("_s_per_token", "s", "s/token", {}),
    ("_s", "s", "s", {}),
    ("_rps", "1/s", "requests/s", {}),
    ("_tok_s_per_gpu", "1/s", "tokens/s/GPU", {}),
    ("_w", "W", "W", {}),
    ("_years", "year", "years", {}),
    ("_bytes", "byte", "bytes", {}),
)


def variable_units(display: str) -> dict:
    """``units``, ``display_units`` and any ``currency`` of a registered variable's display unit."""
    cf, extra = CF_UNITS[display]
    return {"units": cf, "display_units": display, **extra}


def input_units(path: str) -> dict:
    """``units``, ``display_units`` (and ``currency``) of a scenario input, from its key's unit suffix."""
    key = path.rsplit(".", 1)[-1]
    for suffix, cf, display, extra in _SUFFIXES:
        if key == suffix.lstrip("_") or key.endswith(suffix):
            return {"units": cf, "display_units": display, **extra}
    return {"units": "1", "display_units": "1"}

"""Values that are allowed but implausible for their unit: a unit slip, said in one line, never refused.

A TPOT target of 50 is a legal number of seconds and almost surely meant as 50 ms; a lifetime of 48 years was
meant as months; electricity at 8 USD/kWh was meant as cents. The ranges below are judgements, not measurements:
wide enough that a deliberate study (a slow CPU host, a night tariff) stays quiet; a value outside them runs
as written, with an :class:`ImplausibleValue` warning that names the key, the value, the usual range and the slip
it looks like. The command line prints each as one ``warning:`` line; Python shows it as a warning.
"""

from __future__ import annotations

import warnings

from mcsim.scenario.distributions import Dist


class ImplausibleValue(UserWarning):
    """A scenario value outside the range usual for its unit (see :data:`USUAL`)."""


#: path -> (low, high, what the key is, the slip a value beyond the range suggests). A value of 0 that means
#: "none" (ttft_target_s, the tiers) is never judged.
USUAL = {
    "deployment.tpot_target_s": (0.001, 10.0, "a time per output token, s",
                                 "milliseconds? 50 ms is 0.05"),
    "deployment.ttft_target_s": (0.01, 300.0, "a time to first token, s", "milliseconds? 500 ms is 0.5"),
    "efficiency.kv_transfer_latency_s": (0.0, 1.0, "a KV transfer's fixed latency, s", "milliseconds? 2 ms is 0.002"),
    "host.request_overhead_s": (0.0, 1.0, "a request's host overhead, s", "milliseconds? 2 ms is 0.002"),
    "performance.step_overhead_s": (0.0, 0.1, "host work per step, s", "milliseconds? 0.2 ms is 0.0002"),
    "performance.launch_overhead_s": (0.0, 0.001, "one kernel launch, s", "microseconds? 10 us is 1e-05"),
    "workload.think_time_s": (0.0, 86_400.0, "the gap between a session's turns, s", "a day or more"),
    "economics.lifetime_years": (1.0, 15.0, "a depreciation period, years", "months? 48 months is 4"),
    "economics.electricity_usd_per_kwh": (0.01, 1.0, "an electricity price, USD/kWh", "cents? 8 cents is 0.08"),
    "economics.pue": (1.0, 3.0, "a data centre's PUE", "a PUE is 1.1-2"),
    "economics.price_output_usd_per_mtok": (0.0, 1000.0, "a price per million output tokens, USD",
                                            "per thousand tokens? multiply by 1000 only once"),
    "economics.price_input_cache_miss_usd_per_mtok": (0.0, 1000.0, "a price per million input tokens, USD",
                                                      "per thousand tokens?"),
    "economics.target_utilization": (0.05, 1.0, "a fleet's target utilization", "a percentage? 70 % is 0.7"),
    "cache.hbm_gb_per_instance": (0.0, 50_000.0, "GPU memory for prefix KV per instance, GB", "MB? 1 GB is 1"),
}


#: Targets a CPU host (``hardware.preset = "cpu-host"``, :mod:`mcsim.optrace`) may set far beyond a GPU's.
LATENCY_TARGETS = ("deployment.tpot_target_s", "deployment.ttft_target_s")


def implausible(values: dict) -> list[str]:
    """One message per value of ``values`` (path -> value or distribution) outside its :data:`USUAL` range: a
    fixed value beyond it, or a distribution whose every value lies beyond it."""
    out = []
    for path, (low, high, what, slip) in USUAL.items():
        value = values.get(path)
        if value is None or isinstance(value, bool):
            continue
        if isinstance(value, Dist):
            lo, hi = _range(value)
            shown = f"a {value.kind} distribution over [{lo:g}, {hi:g}]"
        else:
            lo = hi = float(value)
            shown = f"{lo:g}"
        if hi == 0 and low == 0.0:  # zero: the key is off
            continue
        if path == "deployment.ttft_target_s" and hi == 0:
            continue
        if path in LATENCY_TARGETS and str(values.get("hardware.preset", "")).lower() == "cpu-host":
            continue  # a CPU host is slow: a minute per token is its honest target, not a slip
        if lo > high or hi < low:
            out.append(f"{path} = {shown} is implausible for {what} (usually {low:g} to {high:g}); {slip} "
                       "(it runs as written)")
    return out


def _range(d: Dist) -> tuple[float, float]:
    """The values a distribution spans: its bounds where it has them, else its mean (a law with unbounded tails is
    judged by its centre)."""
    p = d.params
    if d.kind in ("uniform", "loguniform", "triangular"):
        return float(p["low"]), float(p["high"])
    if d.kind == "choice":
        return float(min(p["values"])), float(max(p["values"]))
    if d.kind == "fixed":
        return float(p["value"]), float(p["value"])
    mean = float(d.mean())
    return mean, mean


def warn_implausible(values: dict, source: str, stacklevel: int = 3) -> None:
    """Issue an :class:`ImplausibleValue` warning for each message of :func:`implausible`."""
    for message in implausible(values):
        warnings.warn(f"{source}: {message}", ImplausibleValue, stacklevel=stacklevel)

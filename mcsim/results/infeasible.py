"""Why samples are infeasible: how many samples each reason of ``infeasible_reason`` stopped, and a fix in their
own figures (the memory projection's, the targets they were held to, the fleet the load needs).

Each reason of :data:`~mcsim.results.variables.FEASIBLE_REASONS` has one text here. Over several samples a figure
reads as one value or its range, and a fix is the one that fixes them all: the largest of the smallest fitting
``tp``, the fewest bytes per weight, the most instances needed. A result written before these figures were
registered still gets its counts, without the figures.
"""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from mcsim.results.variables import FEASIBLE_REASONS


def reasons(ds: xr.Dataset) -> list[dict]:
    """The reasons the samples of one run (one variant at one grid point: ``sample`` is its only dim) could not
    run, in the order of :data:`FEASIBLE_REASONS`: ``[{"reason", "samples", "of", "fix"}]``, where ``fix`` is the
    samples' figures and what to change (empty when the result lacks the figures).

    Examples
    --------
    >>> ds = xr.Dataset({"infeasible_reason": ("sample", [1, 1, 0])})  # a result without the figures
    >>> [(r["reason"], r["samples"], r["of"], r["fix"]) for r in reasons(ds)]
    [('weights do not fit in HBM', 2, 3, '')]
    """
    if "infeasible_reason" not in ds:
        return []
    codes = np.asarray(ds["infeasible_reason"].values, dtype=int).ravel()
    out = []
    for code in sorted(set(codes.tolist()) - {0}):
        mask = codes == code
        reason = FEASIBLE_REASONS[code] if code < len(FEASIBLE_REASONS) else f"reason {code}"
        text = _TEXTS.get(reason)
        figures = _Figures(ds, mask)
        out.append({"reason": reason, "samples": int(mask.sum()), "of": int(codes.size),
                    "fix": text(figures) if text and figures.complete(_NEEDS[reason]) else ""})
    return out


def reason_line(entry: dict) -> str:
    """``"weights do not fit in HBM: 4 of 4 samples (weights 141 GB per GPU > ...; try deployment.tp = 4 ...)"``"""
    return f"{entry['reason']}: {entry['samples']} of {entry['of']} samples{_fix(entry)}"


def _fix(entry: dict) -> str:
    return f" ({entry['fix']})" if entry["fix"] else ""


class _Figures:
    """The registered figures of the samples ``mask`` selects, read as one value, a range or their worst case."""

    def __init__(self, ds: xr.Dataset, mask: np.ndarray):
        self.ds, self.mask = ds, mask

    def complete(self, names) -> bool:
        return all(name in self.ds for name in names)

    def values(self, name: str) -> np.ndarray:
        return np.asarray(self.ds[name].values, dtype=float).ravel()[self.mask]

    def span(self, name: str) -> str:
        return _span(self.values(name))

    def most(self, name: str) -> float:
        """The largest value over the samples; NaN when any is NaN (no single value fixes them all)."""
        v = self.values(name)
        return math.nan if v.size == 0 or np.isnan(v).any() else float(v.max())

    def least(self, name: str) -> float:
        v = self.values(name)
        return math.nan if v.size == 0 or np.isnan(v).any() else float(v.min())


def _span(values: np.ndarray) -> str:
    """One value, or the range of the values (NaN left out), as printed."""
    v = values[~np.isnan(values)]
    if v.size == 0:
        return "n/a"
    low, high = _number(float(v.min())), _number(float(v.max()))
    return low if low == high else f"{low}-{high}"


def _size(gb: np.ndarray) -> str:
    """GB as printed: ``"141 GB"``, a range, or MB when under 1 GB."""
    finite = gb[np.isfinite(gb)]
    if finite.size and np.all(np.abs(finite) < 1):
        return f"{_span(gb * 1e3)} MB"
    return f"{_span(gb)} GB"


def _number(x: float) -> str:
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == int(x) and abs(x) < 1e6:
        return f"{int(x):,}"
    return f"{x:.3g}"


def _at_least(x: float) -> str:
    """``x`` rounded up to three significant figures: a bound that still holds once printed."""
    if x <= 0 or not math.isfinite(x):
        return _number(x)
    step = 10.0 ** (math.floor(math.log10(x)) - 2)
    return f"{math.ceil(x / step - 1e-9) * step:.3g}"


def _memory(f: _Figures, prefill: bool, kv: bool) -> str:
    pool = "prefill_" if prefill else ""
    key = "deployment.prefill_tp" if prefill else "deployment.tp"
    more_gpus = "deployment.prefill_gpus_per_instance" if prefill else "deployment.gpus_per_instance, deployment.pp"
    weights, usable = f.values(f"{pool}weights_gb_per_gpu"), f.values(f"{pool}hbm_usable_gb_per_gpu")
    longest = f.least("longest_context_by_memory")
    if kv:
        detail = (f"one sequence's KV {_size(f.values(f'{pool}kv_gb_per_sequence'))} per GPU > "
                  f"{_size(usable - weights)} left after {_size(weights)} of weights of {_size(usable)} usable")
        if longest > 0:
            detail += f"; contexts up to {_number(longest)} tokens fit"
    elif np.all(usable <= 0):
        return (f"no HBM is left for weights: {_size(f.values('hbm_gb_per_gpu'))} per GPU x "
                f"deployment.memory_fraction, less deployment.activation_gb_per_gpu and the prefix cache's first "
                f"tier, is {_size(usable)}; try less HBM set aside for those")
    else:
        detail = (f"weights {_size(weights)} per GPU > {_size(usable)} usable of its "
                  f"{_size(f.values('hbm_gb_per_gpu'))} HBM, after deployment.memory_fraction, activations and "
                  "the prefix cache")
    tp = f.most(f"smallest_fitting_{pool}tp")
    fixes = [f"{key} = {int(tp)}, the smallest that fits" if math.isfinite(tp)
             else f"more GPUs per instance ({more_gpus}: no {key} the instance can take fits)"]
    formats = f.least("kv_bytes_that_fit" if kv else "weight_bytes_that_fit")
    if math.isfinite(formats):
        fixes.append(f"precision.{'kv' if kv else 'weight'}_bytes = {formats:g} with precision.enabled = true")
    if kv and longest > 0:
        fixes.append(f"shorter prompts for a mean context of at most {_number(longest)} tokens (workload.max_context, "
                     "workload.classes.<name>.prompt_tokens)")
    return f"{detail}; try {', or '.join(fixes)}"


def _tpot(f: _Figures) -> str:
    worst = f.most("tpot_at_batch_1_s")
    return (f"TPOT at one sequence per GPU {f.span('tpot_at_batch_1_s')} s > deployment.tpot_target_s = "
            f"{f.span('tpot_target_s')} s; try a looser deployment.tpot_target_s >= {_at_least(worst)}, a larger "
            "deployment.tp (shorter steps), or lower precision (precision.enabled = true, precision.weight_bytes)")


def _slo(f: _Figures) -> str:
    missed, targets = [], []
    for name, target in (("TTFT", "ttft_target_s"), ("TPOT", "tpot_target_s")):
        achieved = f.values(f"{name.lower()}_at_max_instances_s")
        limit = f.values(target)
        if np.any((limit > 0) & (achieved > limit)):  # a TTFT target of 0 is none
            saturates = " (the queue saturates)" if np.isinf(achieved).any() else ""
            missed.append(f"{name} at deployment.slo_quantile {_span(achieved)} s{saturates} > deployment.{target} = "
                          f"{_span(limit)} s")
            if np.isfinite(achieved).all():  # a looser target cannot help a queue that grows without bound
                targets.append(f"deployment.{target} >= {_at_least(float(np.nanmax(achieved)))}")
    needed, cap = f.most("instances_needed"), f.most("max_instances")
    detail = f"at deployment.max_instances = {f.span('max_instances')} per pool: " + (
        "; ".join(missed) or "the SLOs are missed")
    fixes = ["a larger deployment.max_instances"]
    if math.isfinite(needed):
        detail += (f"; the load alone needs {_number(needed)} instance{'s' if needed != 1 else ''} at "
                   "economics.target_utilization")
        if needed > cap:
            fixes = [f"deployment.max_instances >= {_number(needed)}"]
    if targets:
        fixes.append(f"a looser {' and '.join(targets)}")
    return f"{detail}; try {', or '.join(fixes)}"


def _fleet(f: _Figures) -> str:
    needed, cap = f.most("instances_needed"), f.most("max_instances")
    if math.isfinite(needed) and needed > cap:
        return (f"the load needs {_number(needed)} instances in its largest pool at economics.target_utilization > "
                f"deployment.max_instances = {f.span('max_instances')}; try deployment.max_instances >= "
                f"{_number(needed)}, or a higher economics.target_utilization")
    return (f"the fleet's floor (deployment.instances, deployment.prefill_instances) is above "
            f"deployment.max_instances = {f.span('max_instances')}; try a lower floor or a larger "
            "deployment.max_instances")


_MEMORY = ("hbm_gb_per_gpu", "longest_context_by_memory", "weight_bytes_that_fit", "kv_bytes_that_fit")
#: What each reason's text reads.
_NEEDS = {
    "weights do not fit in HBM": _MEMORY + ("weights_gb_per_gpu", "hbm_usable_gb_per_gpu", "smallest_fitting_tp"),
    "KV for one sequence does not fit": _MEMORY + ("weights_gb_per_gpu", "hbm_usable_gb_per_gpu",
                                                   "kv_gb_per_sequence", "smallest_fitting_tp"),
    "prefill pool: weights do not fit in HBM": _MEMORY + ("prefill_weights_gb_per_gpu",
                                                          "prefill_hbm_usable_gb_per_gpu",
                                                          "smallest_fitting_prefill_tp"),
    "prefill pool: KV for one sequence does not fit": _MEMORY + ("prefill_weights_gb_per_gpu",
                                                                 "prefill_hbm_usable_gb_per_gpu",
                                                                 "prefill_kv_gb_per_sequence",
                                                                 "smallest_fitting_prefill_tp"),
    "TPOT target not met at batch 1": ("tpot_at_batch_1_s", "tpot_target_s"),
    "SLO not met": ("ttft_at_max_instances_s", "tpot_at_max_instances_s", "ttft_target_s", "tpot_target_s",
                    "instances_needed", "max_instances"),
    "fleet over max_instances": ("instances_needed", "max_instances"),
}
_TEXTS = {
    "weights do not fit in HBM": lambda f: _memory(f, prefill=False, kv=False),
    "KV for one sequence does not fit": lambda f: _memory(f, prefill=False, kv=True),
    "prefill pool: weights do not fit in HBM": lambda f: _memory(f, prefill=True, kv=False),
    "prefill pool: KV for one sequence does not fit": lambda f: _memory(f, prefill=True, kv=True),
    "TPOT target not met at batch 1": _tpot,
    "SLO not met": _slo,
    "fleet over max_instances": _fleet,
}


def point_notes(by_variant: dict[str, list[dict]]) -> list[str]:
    """Lines of the summary of a run or a comparison: one per variant and reason (``by_variant``: :func:`reasons`
    of every variant of the result), the variant named when there are several."""
    several = len(by_variant) > 1
    return [f"  {f'{variant}, ' if several else ''}{reason_line(entry)}."
            for variant, entries in by_variant.items() for entry in entries]


def grid_notes(points: list[tuple[str, dict[str, list[dict]]]], max_points: int = 5) -> list[str]:
    """Lines of the summary of a sweep (no heading): per variant and reason, the samples it stopped over the grid and, at each
    grid point where it did (the first ``max_points``), their count and fix. ``points`` are ``(label, {variant:
    reasons})`` of every grid point (every variant of the result), the label as ``"axis=value, ..."``."""
    grouped: dict[tuple[str, str], list] = {}
    for label, by_variant in points:
        for variant, entries in by_variant.items():
            for entry in entries:
                grouped.setdefault((variant, entry["reason"]), []).append((label, entry))
    if not grouped:
        return []
    variants = list(dict.fromkeys(v for _, by_variant in points for v in by_variant))
    several = len(variants) > 1
    order = sorted(grouped, key=lambda k: (variants.index(k[0]), _order(k[1])))
    lines = []
    for variant, reason in order:
        items = grouped[(variant, reason)]
        stopped = sum(entry["samples"] for _, entry in items)
        runs = items[0][1]["of"] * len(points)
        where = "; ".join(f"{label}: {entry['samples']} of {entry['of']}{_fix(entry)}"
                          for label, entry in items[:max_points])
        more = f"; and {len(items) - max_points} more grid points" if len(items) > max_points else ""
        lines.append(f"  {f'{variant}, ' if several else ''}{reason}: {stopped} of {runs} samples, at "
                     f"{len(items)} of {len(points)} grid points: {where}{more}.")
    return lines


def _order(reason: str) -> int:
    return FEASIBLE_REASONS.index(reason) if reason in FEASIBLE_REASONS else len(FEASIBLE_REASONS)

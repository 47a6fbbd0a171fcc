"""Per-request latencies into the quantile figures stage 5 reports (:class:`Latencies`), exactly or sketched."""

from __future__ import annotations

import math

import numpy as np

from mcsim.perf.batching import QUANTILES
from mcsim.stages.sketch import QuantileSketch


def finite_quantiles(values) -> np.ndarray:
    """The :data:`~mcsim.perf.batching.QUANTILES` of the finite ``values`` (NaN when none is finite)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return np.quantile(values, QUANTILES) if values.size else np.full(len(QUANTILES), np.nan)


def finite_quantile(values, q: float) -> float:
    """The ``q`` quantile of the finite ``values`` (NaN when none is finite)."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(np.quantile(values, q)) if values.size else math.nan


class Latencies:
    """Per-request latencies of the measured requests, chunk by chunk, into the figures stage 5 reports.

    Exact (``sketch=False``): the chunks are kept and the quantiles are NumPy's. Sketched: each figure goes into a
    :class:`~mcsim.stages.sketch.QuantileSketch` (overall and per class) and the chunks are dropped, so memory does
    not grow with the requests; every quantile is then within the sketch's ``alpha`` (0.5 %) of the exact one of
    the same requests by the rank rule of ``np.quantile(..., method="inverted_cdf")``. Counts (SLO attainment) are
    exact either way.
    """

    NAMES = ("ttft", "tpot", "e2e", "queue")

    def __init__(self, classes: tuple, slo_quantile: float, sketch: bool):
        self.classes, self.slo_quantile, self.sketch = tuple(classes), float(slo_quantile), bool(sketch)
        self.parts: list = []
        k = len(self.classes)
        self.within = np.zeros(k, np.int64)
        self.count = np.zeros(k, np.int64)
        if sketch:
            self.all = {name: QuantileSketch() for name in self.NAMES}
            self.per_class = {name: [QuantileSketch() for _ in range(k)] for name in ("ttft", "tpot")}

    def add(self, ttft, tpot, e2e, queue, within, class_id) -> None:
        class_id = np.asarray(class_id)
        k = len(self.classes)
        self.within += np.bincount(class_id[within], minlength=k)[:k]
        self.count += np.bincount(class_id, minlength=k)[:k]
        if not self.sketch:
            self.parts.append((ttft, tpot, e2e, queue, class_id))
            return
        for name, values in zip(self.NAMES, (ttft, tpot, e2e, queue)):
            self.all[name].add(_finite(values))
        for c in range(k):
            mine = class_id == c
            self.per_class["ttft"][c].add(_finite(ttft), mask=mine)
            self.per_class["tpot"][c].add(_finite(tpot), mask=mine)

    def figures(self) -> dict:
        k = len(self.classes)
        attained = np.where(self.count > 0, self.within / np.maximum(self.count, 1), np.nan)
        total = int(self.count.sum())
        out = {"slo_attainment": float(self.within.sum()) / total if total else math.nan,
               "slo_attainment_by_class": attained}
        slo_q = self.slo_quantile
        if self.sketch:
            for name, key in zip(self.NAMES, ("ttft_s", "tpot_s", "e2e_s", "queue_wait_s")):
                out[key] = self.all[name].quantiles(list(QUANTILES))
            out["ttft_at_slo_quantile_s"] = float(self.all["ttft"].quantiles(slo_q))
            out["tpot_at_slo_quantile_s"] = float(self.all["tpot"].quantiles(slo_q))
            for name in ("ttft", "tpot"):
                out[f"{name}_s_by_class"] = np.array([s.quantiles(list(QUANTILES)) for s in self.per_class[name]])
            return out
        ttft, tpot, e2e, queue, class_id = (np.concatenate(a) for a in zip(*self.parts))
        out.update({"ttft_s": finite_quantiles(ttft), "tpot_s": finite_quantiles(tpot),
                    "e2e_s": finite_quantiles(e2e), "queue_wait_s": finite_quantiles(queue),
                    "ttft_at_slo_quantile_s": finite_quantile(ttft, slo_q),
                    "tpot_at_slo_quantile_s": finite_quantile(tpot, slo_q)})
        ttft_q, tpot_q = np.full((k, len(QUANTILES)), np.nan), np.full((k, len(QUANTILES)), np.nan)
        for c in range(k):
            mine = class_id == c
            if mine.any():
                ttft_q[c], tpot_q[c] = finite_quantiles(ttft[mine]), finite_quantiles(tpot[mine])
        out.update(ttft_s_by_class=ttft_q, tpot_s_by_class=tpot_q)
        return out


def _finite(values) -> np.ndarray:
    """The values with every non-finite one as NaN (what a sketch skips; the exact quantiles drop them too)."""
    values = np.asarray(values, dtype=float)
    return np.where(np.isfinite(values), values, np.nan)

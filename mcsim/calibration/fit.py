"""Fit the roofline's free parameters to measured operation times: point fit, bootstrap, cross-validation.

Each *op class* is a set of measured times, the step model's formula for them (the same function the step model
prices with) and the parameters it frees:

==============  =====================================================  ===============================================
class           measured                                               parameters
==============  =====================================================  ===============================================
gemm            each per-layer GEMM: QKV, O, gate/up, down (Vidur       performance.flops_fraction, bandwidth_fraction,
                mlp.csv)                                               gemm_half_tokens, gemm_floor_s, and the
                                                                       measured surface (below)
elementwise     RMSNorms, RoPE, SwiGLU, residual adds (mlp.csv)        performance.kernel_floor_s,
                                                                       elementwise_bandwidth_fraction
allreduce       NCCL all-reduce inside a node (all_reduce.csv)         hardware.collective_base_us, collective_hop_us,
                                                                       allreduce_bus_gb_s
experts,        one MoE layer's routed experts, one fused MoE kernel   hardware.experts_flops_fraction,
experts_fp8,    (AIConfigurator's MoE tables), BF16, block-scaled      experts_weight_bandwidth_fraction,
experts_fp4     FP8 and NVFP4                                          experts_stream_bandwidth_fraction,
                                                                       experts_half_rows, experts_floor_us,
                                                                       experts_tile_ns (experts_fp8_*: FP8's)
mla             DeepSeek-V3's MLA attention module, decode and prefill  hardware.mla_floor_us, mla_bandwidth_fraction,
                (AIConfigurator's MLA module tables; the projections    mla_unit_ns, mla_flops_fraction,
                held at the step model's GEMM price)                   mla_prefill_bandwidth_fraction, mla_half_work,
                                                                       mla_half_context
attention       GQA attention calls, decode and prefill                 hardware.attention_floor_us,
                (AIConfigurator's attention tables)                    attention_bandwidth_fraction, attention_unit_ns,
                                                                       attention_flops_fraction,
                                                                       attention_prefill_bandwidth_fraction,
                                                                       attention_half_work, attention_head_dim_half,
                                                                       attention_half_context
allreduce_nodes NCCL all-reduce over whole nodes (all_reduce.csv)      hardware.remote_allreduce_base_us,
                                                                       remote_allreduce_bus_gb_s
send            NCCL send/recv (send_recv.csv)                         hardware.send_base_us, send_gb_s (inside a
                                                                       node), remote_send_base_us, remote_send_gb_s
step            whole step times (the plain step CSV, :mod:`.steps`)   performance.step_overhead_s (and
                                                                       attention_floor_s when several models'
                                                                       layer counts tell the two apart)
==============  =====================================================  ===============================================

The fit minimises the squared log ratio of modelled to measured time (relative error, scale-free) with
``scipy.optimize.least_squares`` within physical bounds. Every class also gets a *model error*
(``performance.<class>_error``): the ratio measured / modelled of one measurement drawn at random among those the
replicate's fit has not seen (out of bag), so the spread of the model's *predictions* around the measurements, not
only the uncertainty of its parameters, reaches the bands of a run.

GEMMs by shape: the four parameters give one curve per GPU; the fit's residual ``log(measured / modelled)`` of every
measured GEMM, kept per measured ``(N, K)`` as a curve over rows, is the *surface* (:mod:`mcsim.perf.gemm_surface`)
that corrects each GEMM of the step model by its shape. Its cross-validation rebuilds the surface from the rows each
fold keeps, and its model error is drawn from those held-out predictions (the surface reproduces the rows it was
built on, so an out-of-bag draw would understate it). :data:`ROW_BANDS` report the held-out error by rows.

Uncertainty: a cluster bootstrap over *shapes* (all rows of one measured configuration are drawn together, so
repeated measurements of a shape do not count as independent evidence): ``replicates`` resamples, each refitted,
each with its error draw. The replicates are the calibration's joint distribution (a run draws one replicate per
Monte Carlo sample, all parameters together). Cross-validation: leave one shape out, refit on the rest, predict
the shape left out; its mean absolute percentage error is the figure to trust (the in-sample error is printed
next to it). With more than ``max_folds`` shapes, shapes are left out in ``max_folds`` interleaved groups (each
shape still predicted by a fit that has not seen it).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np
from scipy.optimize import least_squares

from mcsim.perf.collectives import allreduce_auto_seconds
from mcsim.perf.fused_moe import EXPERTS_CLASSES, ExpertFigures, experts_seconds
from mcsim.perf.gemm_surface import GemmSurface
from mcsim.perf.roofline import AttentionFigures, attention_seconds, elementwise_seconds, gemm_seconds

#: Parameters of each class: (key, SI units per key unit, lower, upper, start) in the key's own units.
PARAMETERS = {
    "gemm": (("performance.flops_fraction", 1.0, 0.05, 1.0, 0.7),
             ("performance.bandwidth_fraction", 1.0, 0.05, 1.0, 0.85),
             ("performance.gemm_half_tokens", 1.0, 0.0, 1e4, 100.0),
             ("performance.gemm_floor_s", 1e-6, 0.0, 1e3, 5.0)),  # fitted in us, stored in s
    "elementwise": (("performance.kernel_floor_s", 1e-6, 0.0, 1e3, 3.0),
                    ("performance.elementwise_bandwidth_fraction", 1.0, 0.02, 1.0, 0.6)),
    "allreduce": (("hardware.collective_base_us", 1e-6, 0.0, 1e4, 20.0),
                  ("hardware.collective_hop_us", 1e-6, 0.0, 1e3, 3.0),
                  ("hardware.allreduce_bus_gb_s", 1e9, 1.0, 1e4, 200.0)),
    "allreduce_nodes": (("hardware.remote_allreduce_base_us", 1e-6, 0.0, 1e5, 50.0),
                        ("hardware.remote_allreduce_bus_gb_s", 1e9, 0.1, 1e4, 20.0)),
    "send": (("hardware.send_base_us", 1e-6, 0.0, 1e4, 10.0),
             ("hardware.send_gb_s", 1e9, 0.1, 1e4, 200.0),
             ("hardware.remote_send_base_us", 1e-6, 0.0, 1e4, 20.0),
             ("hardware.remote_send_gb_s", 1e9, 0.1, 1e4, 20.0)),
    "attention": (("hardware.attention_floor_us", 1e-6, 0.0, 1e3, 10.0),
                  ("hardware.attention_bandwidth_fraction", 1.0, 0.01, 1.0, 0.9),
                  ("hardware.attention_unit_ns", 1e-9, 0.0, 1e4, 20.0),
                  ("hardware.attention_flops_fraction", 1.0, 0.01, 1.0, 0.8),
                  ("hardware.attention_prefill_bandwidth_fraction", 1.0, 0.01, 1.0, 0.3),
                  ("hardware.attention_half_work", 1.0, 0.0, 1e8, 1e4),
                  ("hardware.attention_head_dim_half", 1.0, 0.0, 1e4, 64.0),
                  ("hardware.attention_half_context", 1.0, 0.0, 1e6, 100.0)),
    **{cls: ((f"hardware.{cls}_flops_fraction", 1.0, 0.02, 1.0, 0.5),
             (f"hardware.{cls}_weight_bandwidth_fraction", 1.0, 0.05, 1.0, 0.85),
             (f"hardware.{cls}_stream_bandwidth_fraction", 1.0, 0.02, 1.0, 0.5),
             (f"hardware.{cls}_half_rows", 1.0, 0.0, 1e4, 50.0),
             (f"hardware.{cls}_floor_us", 1e-6, 0.0, 1e3, 30.0),
             (f"hardware.{cls}_tile_ns", 1e-9, 0.0, 1e3, 5.0))
       for cls in EXPERTS_CLASSES.values()},
    "mla": (("hardware.mla_floor_us", 1e-6, 0.0, 1e4, 30.0),
            ("hardware.mla_bandwidth_fraction", 1.0, 0.01, 1.0, 0.8),
            ("hardware.mla_unit_ns", 1e-9, 0.0, 1e4, 20.0),
            ("hardware.mla_flops_fraction", 1.0, 0.01, 1.0, 0.6),
            ("hardware.mla_prefill_bandwidth_fraction", 1.0, 0.01, 1.0, 0.3),
            ("hardware.mla_half_work", 1.0, 0.0, 1e8, 1e4),
            ("hardware.mla_half_context", 1.0, 0.0, 1e6, 100.0)),
    "step": (("performance.step_overhead_s", 1e-6, 0.0, 1e6, 200.0),
             ("performance.attention_floor_s", 1e-6, 0.0, 1e4, 10.0)),
}
#: A class's model-error parameter (measured / modelled time of one measurement).
ERROR_KEY = "performance.{cls}_error"


def scenario_scale(key: str) -> float:
    """Factor from a fitted value to the scenario's units: ``performance.*`` keys are SI (their floors are fitted
    in us), ``hardware.*`` keys keep the catalog's units (us, GB/s), in which they are fitted."""
    if not key.startswith("performance."):
        return 1.0
    return next((unit for specs in PARAMETERS.values() for name, unit, *_ in specs if name == key), 1.0)


@dataclass
class Observations:
    """Measured times of one op class and what the class's formula needs to model them.

    Attributes
    ----------
    cls : str
        One of :data:`PARAMETERS`.
    measured_s : float64[n]
    shape : int64[n]
        Shape id of each row; rows of one shape are resampled and left out together.
    data : dict
        Arrays (length n) the class's predictor reads.
    active : tuple of str
        The class's parameters this data can tell apart (others keep their start values and are not written).
    fixed : dict
        Parameter values not fitted (key units), used by the predictor.
    sources : list of str
    """

    cls: str
    measured_s: np.ndarray
    shape: np.ndarray
    data: dict
    active: tuple
    fixed: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)

    def __len__(self):
        return len(self.measured_s)

    def subset(self, rows) -> "Observations":
        rows = np.asarray(rows)
        return Observations(self.cls, self.measured_s[rows], self.shape[rows],
                            {k: v[rows] for k, v in self.data.items()}, self.active, self.fixed, self.sources)


#: Row bands (GEMM rows, i.e. tokens) in which the GEMM fit's held-out error is reported: decode batches, small and
#: large prefill chunks.
ROW_BANDS = ((1, 16), (17, 128), (129, 1024), (1025, None))


def band_label(band) -> str:
    low, high = band
    return f"{low}-{high} rows" if high else f"> {low - 1} rows"


#: The classes whose fit carries a measured surface over (rows, N, K): GEMMs by their shape, and a fused MoE layer's
#: experts by (width on the GPU, hidden) over tokens.
SURFACE_CLASSES = ("gemm", *EXPERTS_CLASSES.values())


def has_surface(obs: Observations) -> bool:
    """Whether the class's fit carries a shape surface (GEMMs whose ``N`` and ``K`` are known)."""
    return obs.cls in SURFACE_CLASSES and "n" in obs.data and "k" in obs.data


def surface_factor(obs: Observations, surface: GemmSurface | None) -> np.ndarray:
    """The surface's correction of each row of a gemm class (ones without a surface)."""
    out = np.ones(len(obs))
    if surface is None or not has_surface(obs):
        return out
    d = obs.data
    for n, k in set(zip(d["n"].tolist(), d["k"].tolist())):
        at = (d["n"] == n) & (d["k"] == k)
        out[at] = surface.factor(d["rows"][at], n, k)
    return out


def surface_of(obs: Observations, values: dict) -> GemmSurface | None:
    """The measured surface of a gemm class: ``log(measured / modelled)`` of every row at ``values``."""
    if not has_surface(obs):
        return None
    ratio = np.log(obs.measured_s / predict(obs, values))
    d = obs.data
    return GemmSurface.from_points(d["n"], d["k"], d["rows"], ratio, source=", ".join(obs.sources))


def band_errors(predicted, measured, rows) -> dict:
    """Mean absolute percentage error in each of :data:`ROW_BANDS` (label -> fraction; bands without rows left
    out)."""
    out = {}
    for low, high in ROW_BANDS:
        at = (rows >= low) & (rows <= (high if high else np.inf))
        if at.any():
            out[band_label((low, high))] = _mape(predicted[at], measured[at])
    return out


def predict(obs: Observations, values: dict, surface: GemmSurface | None = None) -> np.ndarray:
    """Modelled seconds of every row of ``obs`` with parameter ``values`` (key units; missing: fixed or start);
    a gemm class's ``surface`` corrects each GEMM by its shape."""
    if surface is not None:
        return predict(obs, values) * surface_factor(obs, surface)
    spec = {key: (unit, start) for key, unit, _, _, start in PARAMETERS[obs.cls]}

    def si(key):
        unit, start = spec[key]
        return values.get(key, obs.fixed.get(key, start)) * unit

    d = obs.data
    if obs.cls == "gemm":
        return gemm_seconds(d["flops"], d["bytes"], d["peak"] * si("performance.flops_fraction"),
                            d["hbm"] * si("performance.bandwidth_fraction"), kernels=d["kernels"], rows=d["rows"],
                            half_tokens=si("performance.gemm_half_tokens"), floor_s=si("performance.gemm_floor_s"))
    if obs.cls == "elementwise":
        return elementwise_seconds(d["bytes"], d["hbm"] * si("performance.elementwise_bandwidth_fraction"),
                                   kernels=d["kernels"], floor_s=si("performance.kernel_floor_s"))
    if obs.cls == "allreduce":
        return allreduce_auto_seconds(d["bytes"], d["workers"], si("hardware.collective_base_us"),
                                      si("hardware.collective_hop_us"), si("hardware.allreduce_bus_gb_s"))
    if obs.cls == "allreduce_nodes":
        ring = 2.0 * (d["workers"] - 1) / d["workers"] * d["bytes"]
        return si("hardware.remote_allreduce_base_us") + ring / si("hardware.remote_allreduce_bus_gb_s")
    if obs.cls == "send":
        across = d["across"] > 0
        inside = si("hardware.send_base_us") + d["bytes"] / si("hardware.send_gb_s")
        remote = si("hardware.remote_send_base_us") + d["bytes"] / si("hardware.remote_send_gb_s")
        return np.where(across, remote, inside)
    if obs.cls == "attention":
        figures = AttentionFigures(si("hardware.attention_bandwidth_fraction"), si("hardware.attention_unit_ns"),
                                   si("hardware.attention_flops_fraction"),
                                   si("hardware.attention_prefill_bandwidth_fraction"),
                                   si("hardware.attention_half_work"), si("hardware.attention_head_dim_half"),
                                   si("hardware.attention_half_context"))
        return attention_seconds(d["flops"], d["bytes"], decode=d["decode"] > 0, sequences=d["sequences"],
                                 kv_heads=d["kv_heads"], work=d["work"], head_dim=d["head_dim"],
                                 context=d["context"], peak=d["peak"],
                                 hbm=d["hbm"], figures=figures, floor_s=si("hardware.attention_floor_us"))
    if obs.cls == "mla":  # the projections held at the step model's price, the attention call fitted
        figures = AttentionFigures(si("hardware.mla_bandwidth_fraction"), si("hardware.mla_unit_ns"),
                                   si("hardware.mla_flops_fraction"), si("hardware.mla_prefill_bandwidth_fraction"),
                                   si("hardware.mla_half_work"), 0.0, si("hardware.mla_half_context"))
        return d["proj_s"] + attention_seconds(d["flops"], d["bytes"], decode=d["decode"] > 0,
                                               sequences=d["sequences"], kv_heads=d["kv_heads"], work=d["work"],
                                               head_dim=1.0, context=d["context"], peak=d["peak"], hbm=d["hbm"],
                                               figures=figures, floor_s=si("hardware.mla_floor_us"))
    if obs.cls in EXPERTS_CLASSES.values():
        figures = ExpertFigures(*(si(f"hardware.{obs.cls}_{name}") for name in (
            "flops_fraction", "weight_bandwidth_fraction", "stream_bandwidth_fraction", "half_rows", "floor_us",
            "tile_ns")))
        return experts_seconds(d["flops"], d["weight_bytes"], d["stream_bytes"], rows_per_expert=d["per_expert"],
                               tiles=d["tiles"], peak=d["peak"], hbm=d["hbm"], figures=figures)
    if obs.cls == "step":
        return (d["modelled_s"] + si("performance.step_overhead_s")
                + d["attention_calls"] * si("performance.attention_floor_s"))
    raise AssertionError(obs.cls)


def _bounds(obs: Observations):
    spec = {key: (lo, hi, start) for key, _, lo, hi, start in PARAMETERS[obs.cls]}
    lo = np.array([spec[k][0] for k in obs.active])
    hi = np.array([spec[k][1] for k in obs.active])
    start = np.array([obs.fixed.get(k, spec[k][2]) for k in obs.active])
    return lo, hi, np.clip(start, lo, hi)


def fit_point(obs: Observations, start: np.ndarray | None = None) -> np.ndarray:
    """Least-squares fit of the active parameters (key units), minimising the squared log ratio."""
    lo, hi, x0 = _bounds(obs)
    if start is not None:
        x0 = np.clip(start, lo, hi)
    log_measured = np.log(obs.measured_s)

    def residual(x):
        modelled = predict(obs, dict(zip(obs.active, x)))
        return np.log(np.maximum(modelled, 1e-15)) - log_measured

    result = least_squares(residual, x0, bounds=(lo, hi), x_scale="jac", method="trf")
    return result.x


@dataclass
class ClassFit:
    """The fit of one op class.

    Attributes
    ----------
    cls : str
    keys : tuple of str
        Fitted parameters, then the class's error key.
    estimate : dict
        Point fit (key units); the error key's estimate is 1.
    replicates : dict
        Key -> float64[B], the bootstrap replicates (joint: index b of every key is one refit).
    fit_mape, cv_mape : float
        In-sample and cross-validated mean absolute percentage error of the point fit.
    cv_scheme : str
    rows, shapes : int
    sources : list of str
    """

    cls: str
    keys: tuple
    estimate: dict
    replicates: dict
    fit_mape: float
    cv_mape: float
    cv_scheme: str
    rows: int
    shapes: int
    sources: list
    surface: GemmSurface | None = None
    cv_bands: dict = field(default_factory=dict)

    def band(self, obs: Observations, quantiles=(0.05, 0.95)) -> np.ndarray:
        """The bootstrap band of modelled time of every row of ``obs``: one row per quantile (model error
        included)."""
        n = len(next(iter(self.replicates.values())))
        error = self.replicates[ERROR_KEY.format(cls=self.cls)]
        factor = surface_factor(obs, self.surface)
        times = np.array([predict(obs, {k: self.replicates[k][b] for k in self.keys}) * factor * error[b]
                          for b in range(n)])
        return np.quantile(times, quantiles, axis=0)


def _mape(modelled, measured) -> float:
    return float(np.mean(np.abs(modelled - measured) / measured))


def held_out(obs: Observations, start: np.ndarray, max_folds: int = 40) -> tuple[np.ndarray | None, str]:
    """Each row predicted by a fit that has not seen its shape (a gemm class's surface built, too, from the other
    shapes' residuals alone), and the scheme; None with one shape."""
    shapes = np.unique(obs.shape)
    if len(shapes) < 2:
        return None, "not cross-validated (one shape)"
    folds = len(shapes) if len(shapes) <= max_folds else max_folds
    group = {s: i % folds for i, s in enumerate(shapes)}
    fold_of = np.array([group[s] for s in obs.shape])
    predicted = np.empty(len(obs))
    for k in range(folds):
        held = fold_of == k
        train = obs.subset(np.flatnonzero(~held))
        values = dict(zip(obs.active, fit_point(train, start)))
        predicted[held] = predict(obs.subset(np.flatnonzero(held)), values, surface_of(train, values))
    scheme = ("leave one shape out" if folds == len(shapes)
              else f"leave one shape out, {folds} interleaved groups of the {len(shapes)} shapes")
    return predicted, scheme


def cross_validate(obs: Observations, start: np.ndarray, max_folds: int = 40) -> tuple[float, str]:
    """Mean absolute percentage error of predicting each shape from a fit without it."""
    predicted, scheme = held_out(obs, start, max_folds)
    return (float("nan") if predicted is None else _mape(predicted, obs.measured_s)), scheme


def fit_class(obs: Observations, *, replicates: int = 200, seed: int = 0, max_folds: int = 40,
              cross_validation: bool = True) -> ClassFit:
    """Point fit, cluster bootstrap over shapes (with a model-error draw per replicate) and cross-validation."""
    if len(obs) == 0:
        raise ValueError(f"no measurements of class {obs.cls}")
    x = fit_point(obs)
    estimate = dict(zip(obs.active, x))
    surface = surface_of(obs, estimate)
    modelled = predict(obs, estimate, surface)
    # With a surface, the model error is that of held-out rows (the surface reproduces every row it was built on).
    predicted, scheme = held_out(obs, x, max_folds) if cross_validation or surface is not None else (None, "not run")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(zlib.crc32(obs.cls.encode()),)))
    shapes = np.unique(obs.shape)
    rows_of = {s: np.flatnonzero(obs.shape == s) for s in shapes}
    boot = np.empty((replicates, len(obs.active)))
    error = np.empty(replicates)
    for b in range(replicates):
        drawn = rng.choice(shapes, size=len(shapes), replace=True)
        rows = np.concatenate([rows_of[s] for s in drawn])
        boot[b] = fit_point(obs.subset(rows), x)
        if surface is not None and predicted is not None:  # a held-out row's measured / predicted
            j = rng.integers(len(obs))
            error[b] = obs.measured_s[j] / predicted[j]
            continue
        # the model error: a measurement this replicate's fit has not seen (out of bag), else any of them
        unseen = np.flatnonzero(~np.isin(obs.shape, drawn))
        j = rng.choice(unseen) if len(unseen) else rng.choice(rows)
        error[b] = obs.measured_s[j] / predict(obs.subset([j]), dict(zip(obs.active, boot[b])))[0]
    cv = float("nan") if predicted is None or not cross_validation else _mape(predicted, obs.measured_s)
    bands = band_errors(predicted, obs.measured_s, obs.data["rows"]) \
        if cross_validation and predicted is not None and "rows" in obs.data else {}
    error_key = ERROR_KEY.format(cls=obs.cls)
    reps = {key: boot[:, i] for i, key in enumerate(obs.active)}
    reps[error_key] = error
    return ClassFit(obs.cls, (*obs.active, error_key), {**estimate, error_key: 1.0}, reps,
                    _mape(modelled, obs.measured_s), cv, scheme if cross_validation else "not run", len(obs),
                    len(shapes), list(obs.sources), surface, bands)

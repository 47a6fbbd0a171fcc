"""Distributions for uncertain inputs and per-request variability.

A scenario number can be written as a plain value or as a table with a ``dist`` key::

    acceptance = { dist = "beta", a = 17, b = 3 }
    price_usd = { dist = "triangular", low = 25e3, mode = 30e3, high = 40e3 }
    output_tokens = { dist = "lognormal", median = { dist = "uniform", low = 200, high = 400 }, sigma = 1.0 }
    flops_fraction = { dist = "choice", values = [0.71, 0.74, 0.73], stream = "fit" }

Uncertain inputs that name the same ``stream`` are drawn from the same uniform in every sample, so they move
together: choices over equally many values then draw one *row* of a joint table (a calibration's bootstrap
replicates keep the correlation between the parameters fitted together). Every other input has a stream of its
own.

The same :class:`Dist` serves two purposes that the scenario keeps apart:

* on a model input it is *uncertainty*: one value per Monte Carlo sample, drawn by :meth:`Dist.ppf` from a
  uniform (plain random or Latin hypercube) and recorded in the result;
* on a per-request field it is *variability*: :meth:`Dist.sample` draws one value per request. Its own
  parameters may be uncertain (a nested table), resolved once per sample by :meth:`Dist.resolve`.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

import numpy as np

from mcsim.errors import McsimError

#: Parameters of each distribution kind: (required, optional).
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "fixed": (("value",), ()),
    "uniform": (("low", "high"), ()),
    "loguniform": (("low", "high"), ()),
    "normal": (("mean", "sd"), ("low", "high")),
    "lognormal": (("median", "sigma"), ()),
    "beta": (("a", "b"), ("low", "high")),
    "triangular": (("low", "mode", "high"), ()),
    "choice": (("values",), ("weights",)),
}


def _special():
    """``scipy.special``, imported when a lognormal's or a beta's quantiles are first needed."""
    # start-up: most scenarios' uncertain inputs (uniform, triangular, choice) never need scipy.special, and a
    # small run pays its import (tests/test_architecture.py holds that dense-node's does not)
    from scipy import special

    return special


def _truncnorm():
    """``scipy.stats.truncnorm``, imported when a truncated normal first needs it."""
    # memory and start-up: scipy.stats adds 32 MiB and 0.3 s to a run's process (benchmarks/process_floor.py)
    from scipy.stats import truncnorm

    return truncnorm


class DistributionError(McsimError, ValueError):
    """A distribution table is malformed; ``key`` is its dotted path in the scenario."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.detail = message

    def __reduce__(self):  # rebuilt from its parts when it crosses to another process (a Dask worker)
        return type(self), (self.key, self.detail)


@dataclass(frozen=True)
class Dist:
    """A validated distribution.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    params : dict
        Parameter name -> float, list (``choice``) or a nested :class:`Dist` (an uncertain parameter).
    path : str
        Dotted scenario key, for error messages and output names.
    stream : str
        Name of the random stream its per-sample uniform comes from ("": its own, keyed by ``path``).
    """

    kind: str
    params: dict = field(hash=False)
    path: str = ""
    stream: str = ""

    # -- structure -------------------------------------------------------------------------------------------
    def nested(self) -> dict[str, "Dist"]:
        """Uncertain parameters: dotted path -> Dist."""
        return {f"{self.path}.{k}": v for k, v in self.params.items() if isinstance(v, Dist)}

    def resolve(self, values: dict[str, float]) -> "Dist":
        """Replace nested uncertain parameters by the values drawn for one sample."""
        if not self.nested():
            return self
        params = {k: (values[f"{self.path}.{k}"] if isinstance(v, Dist) else v) for k, v in self.params.items()}
        return make(self.kind, params, self.path, self.stream)

    @property
    def is_fixed(self) -> bool:
        return self.kind == "fixed"

    # -- draws -----------------------------------------------------------------------------------------------
    def ppf(self, u):
        """Quantile function: maps uniforms in (0, 1) to values (used for uncertain inputs, so LHS works)."""
        u = np.asarray(u, dtype=float)
        p = self.params
        k = self.kind
        if k == "fixed":
            return np.full(u.shape, p["value"], dtype=float)
        if k == "uniform":
            return p["low"] + u * (p["high"] - p["low"])
        if k == "loguniform":
            lo, hi = math.log(p["low"]), math.log(p["high"])
            return np.exp(lo + u * (hi - lo))
        if k == "normal":
            lo = -np.inf if p.get("low") is None else (p["low"] - p["mean"]) / p["sd"]
            hi = np.inf if p.get("high") is None else (p["high"] - p["mean"]) / p["sd"]
            return p["mean"] + p["sd"] * _truncnorm().ppf(u, lo, hi)
        if k == "lognormal":
            return p["median"] * np.exp(p["sigma"] * _special().ndtri(u))
        if k == "beta":
            x = _special().betaincinv(p["a"], p["b"], u)
            return p.get("low", 0.0) + x * (p.get("high", 1.0) - p.get("low", 0.0))
        if k == "triangular":
            lo, mode, hi = p["low"], p["mode"], p["high"]
            if hi == lo:
                return np.full(u.shape, lo)
            c = (mode - lo) / (hi - lo)
            return np.where(
                u < c,
                lo + np.sqrt(u * (hi - lo) * (mode - lo)),
                hi - np.sqrt((1 - u) * (hi - lo) * (hi - mode)),
            )
        if k == "choice":
            values = np.asarray(p["values"], dtype=float)
            cdf = np.cumsum(_choice_weights(p))
            return values[np.minimum(np.searchsorted(cdf, u, side="right"), len(values) - 1)]
        raise AssertionError(k)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """Draw ``size`` values (per-request variability); nested parameters must be resolved first."""
        if self.nested():
            raise ValueError(f"{self.path}: resolve uncertain parameters before sampling")
        p = self.params
        k = self.kind
        # The generator's own samplers are several times faster than ppf(uniform) for beta and normal.
        if k == "lognormal":
            return p["median"] * np.exp(p["sigma"] * rng.standard_normal(size))
        if k == "beta" and "low" not in p and "high" not in p:
            return rng.beta(p["a"], p["b"], size)
        if k == "normal" and p.get("low") is None and p.get("high") is None:
            return rng.normal(p["mean"], p["sd"], size)
        return self.ppf(rng.random(size))

    def mean(self) -> float:
        """Expected value (nested parameters must be resolved)."""
        p = self.params
        k = self.kind
        if k == "fixed":
            return float(p["value"])
        if k == "uniform":
            return (p["low"] + p["high"]) / 2
        if k == "loguniform":
            if p["high"] == p["low"]:  # degenerate: the closed form below is 0/0
                return float(p["low"])
            return (p["high"] - p["low"]) / math.log(p["high"] / p["low"])
        if k == "normal":
            lo = -np.inf if p.get("low") is None else (p["low"] - p["mean"]) / p["sd"]
            hi = np.inf if p.get("high") is None else (p["high"] - p["mean"]) / p["sd"]
            return float(_truncnorm().mean(lo, hi, loc=p["mean"], scale=p["sd"]))
        if k == "lognormal":
            return p["median"] * math.exp(p["sigma"] ** 2 / 2)
        if k == "beta":
            lo, hi = p.get("low", 0.0), p.get("high", 1.0)
            return lo + (hi - lo) * p["a"] / (p["a"] + p["b"])
        if k == "triangular":
            return (p["low"] + p["mode"] + p["high"]) / 3
        if k == "choice":
            return float(np.dot(np.asarray(p["values"], float), _choice_weights(p)))
        raise AssertionError(k)


def _choice_weights(p) -> np.ndarray:
    w = np.asarray(p.get("weights", [1.0] * len(p["values"])), dtype=float)
    return w / w.sum()


def fixed(value: float, path: str = "") -> Dist:
    return Dist("fixed", {"value": float(value)}, path)


def make(kind: str, params: dict, path: str, stream: str = "") -> Dist:
    """Build a Dist and check its parameters (numbers only; nested Dists are checked on their own)."""
    numbers = {k: v for k, v in params.items() if not isinstance(v, (Dist, list))}

    def need(cond, msg):
        if not cond:
            raise DistributionError(path, msg)

    def check_number(name, v):
        need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
             f"parameter '{name}' must be a finite number, got {v!r}")

    for name, v in numbers.items():
        if v is not None:
            check_number(name, v)
    if kind != "choice":
        for name, v in params.items():
            if isinstance(v, list):
                check_number(name, v)  # only choice takes lists; this raises with the offending value
    n = numbers
    if kind in ("uniform", "loguniform", "triangular") and "low" in n and "high" in n:
        need(n["low"] <= n["high"], f"{kind} needs low <= high, got low={n['low']}, high={n['high']}")
    if kind == "loguniform":
        need(n.get("low", 1) > 0, f"loguniform needs low > 0, got {n.get('low')}")
    if kind == "normal" and "sd" in n:
        need(n["sd"] > 0, f"normal needs sd > 0, got {n['sd']}")
        if n.get("low") is not None and n.get("high") is not None:
            need(n["low"] < n["high"], "normal bounds need low < high")
    if kind == "lognormal":
        if "median" in n:
            need(n["median"] > 0, f"lognormal needs median > 0, got {n['median']}")
        if "sigma" in n:
            need(n["sigma"] >= 0, f"lognormal needs sigma >= 0, got {n['sigma']}")
    if kind == "beta":
        for name in ("a", "b"):
            if name in n:
                need(n[name] > 0, f"beta needs {name} > 0, got {n[name]}")
        if ("low" in n or "high" in n) and not any(isinstance(params.get(x), Dist) for x in ("low", "high")):
            # either bound alone still scales the unit interval, so check it against the other's default
            lo, hi = n.get("low", 0.0), n.get("high", 1.0)
            need(lo < hi, f"beta bounds need low < high, got low={lo}, high={hi}")
    if kind == "triangular" and all(x in n for x in ("low", "mode", "high")):
        need(n["low"] <= n["mode"] <= n["high"],
             f"triangular needs low <= mode <= high, got {n['low']}, {n['mode']}, {n['high']}")
    if kind == "choice":
        values = params.get("values")
        need(isinstance(values, list) and len(values) > 0, "choice needs a non-empty list 'values'")
        for v in values:
            check_number("values", v)
        if "weights" in params:
            w = params["weights"]
            need(isinstance(w, list) and len(w) == len(values),
                 f"choice needs as many weights as values ({len(values)})")
            for v in w:
                check_number("weights", v)
                need(v >= 0, "choice weights must be >= 0")
            need(sum(w) > 0, "choice weights must not all be 0")
    return Dist(kind, dict(params), path, stream)


def parse(value, path: str, *, allow_nested: bool) -> Dist:
    """Parse a scenario value (number or ``{dist = ...}`` table) into a :class:`Dist`.

    Parameters
    ----------
    value : int, float or dict
    path : str
        Dotted key, used in errors.
    allow_nested : bool
        Whether parameters may themselves be distributions (per-request fields only).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float, dict)):
        raise DistributionError(path, f"expected a number or a distribution table, got {value!r}")
    if not isinstance(value, dict):
        if not math.isfinite(value):
            raise DistributionError(path, f"expected a finite number, got {value!r}")
        return fixed(value, path)
    if "dist" not in value:
        raise DistributionError(path, "a distribution table needs a 'dist' key, one of " + ", ".join(KINDS))
    kind = value["dist"]
    if not isinstance(kind, str):
        raise DistributionError(f"{path}.dist", f"expected the name of a distribution (a string, one of "
                                f"{', '.join(KINDS)}), got {kind!r}")
    if kind not in KINDS:
        near = difflib.get_close_matches(str(kind), list(KINDS), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else ""
        raise DistributionError(f"{path}.dist", f"unknown distribution {kind!r}{hint}; expected one of "
                                + ", ".join(KINDS))
    required, optional = KINDS[kind]
    params = {}
    stream = value.get("stream", "")
    if not isinstance(stream, str) or ("stream" in value and not stream.strip()):
        raise DistributionError(f"{path}.stream", f"expected the name of a random stream (a non-empty string), "
                                f"got {stream!r}")
    for key, v in value.items():
        if key in ("dist", "stream"):
            continue
        if key not in required and key not in optional:
            near = difflib.get_close_matches(key, required + optional, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise DistributionError(f"{path}.{key}", f"unknown parameter of a {kind} distribution{hint}; "
                                    f"expected {', '.join(required + optional)}")
        if isinstance(v, dict):
            if not allow_nested:
                raise DistributionError(f"{path}.{key}", "an uncertain distribution parameter is only allowed "
                                        "in per-request fields")
            nested = parse(v, f"{path}.{key}", allow_nested=False)
            params[key] = nested
        else:
            params[key] = v
    missing = [k for k in required if k not in params]
    if missing:
        raise DistributionError(path, f"a {kind} distribution needs {', '.join(missing)}")
    return make(kind, params, path, stream)

"""GEMM efficiency by shape: a measured correction surface over (rows, columns, depth) on top of the roofline.

The roofline prices one GEMM of ``M`` rows (tokens), ``N`` output columns and depth ``K`` with
:func:`mcsim.perf.roofline.gemm_seconds`: a kernel floor plus the larger of its FLOPs at a row-dependent share of
the peak and its bytes at a share of HBM bandwidth. That curve is one per GPU and smooth in ``M``; measured GEMMs
are not. A GPU runs a GEMM as tiles spread over its SMs in waves, and the library picks a kernel (tile shape, split
of ``K``) per shape, so the time of one shape jumps where a wave fills (for Llama-2-70B's FFN on H100, 464 rows run
in one wave and 560 in two) and the efficiency of a 256-1024-row GEMM depends on ``N`` and ``K`` as much as on
``M``: the smooth curve is 1.2-1.4x too slow there and right elsewhere.

A :class:`GemmSurface` is the measured residual of that roofline, ``r = log(measured / modelled)``, kept per
measured ``(N, K)`` as a curve over ``log2 M``. The correction of a GEMM is ``exp(r_hat)``:

* a measured shape (``N`` and ``K`` within ``EXACT`` octaves of a measured one) takes its own curve ``r_s``,
  interpolated linearly in ``log2 M`` and held at its ends;
* any other shape takes the blend of the measured ones near it,

      r_hat(M, N, K) = sum_s w_s r_s(log2 M) / (W0 + sum_s w_s),   w_s = exp(-(d_N^2 + d_K^2) / (2 SIGMA^2)),

  ``d_N`` and ``d_K`` the distances in octaves between the GEMM's ``N`` and ``K`` and the shape's, so that a shape far
  from every measured one (``W0`` outweighs them) keeps the roofline.

``SIGMA`` and ``W0`` were chosen on the bundled data by fitting on TP 1 and 4 and predicting TP 2 and 8, shapes the
fit has not seen; ``mcsim validate`` reports that split, each measured row left out, and each model left out.

A surface belongs to one dtype: the catalog's ``gemm_surface`` is BF16's, and ``gemm_fp8_surface`` (where FP8
GEMMs were measured) FP8's, whose kernels tile and wave differently; a low-precision GEMM on a GPU without its own
surface takes the BF16 one (an assumption). A GPU without measurements of its own uses the surface of one with the
same SMs (the catalog names it), whose residuals then scale that GPU's own roofline.

Surfaces are written by ``mcsim calibrate`` into calibration files (``[surfaces.gemm]``); the catalog's come from
the bundled calibrations in ``mcsim/data/calibrations/``.
"""

from __future__ import annotations

import bisect
import functools
import math
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

#: Width (octaves of N and K) over which measured shapes inform the correction of a shape not measured.
SIGMA = 0.6
#: Within this many octaves of a measured (N, K), a GEMM is that shape.
EXACT = 0.02
#: Weight of the roofline itself (no correction) against the measured shapes.
W0 = 0.05
#: Shapes lighter than this (relative to W0) are left out of a blend.
_NEGLIGIBLE = 1e-4


@dataclass(frozen=True)
class GemmSurface:
    """Measured residuals of the roofline's GEMM time, one curve per measured ``(N, K)`` (module docstring).

    Attributes
    ----------
    n, k : float64[S]
        Columns and depth of each measured shape.
    log2_rows : tuple of float64[:]
        Per shape, increasing ``log2 M`` of its measurements.
    log_ratio : tuple of float64[:]
        Per shape, ``log(measured / modelled)`` at those rows.
    source : str
        Where the surface was read from.
    """

    n: np.ndarray
    k: np.ndarray
    log2_rows: tuple
    log_ratio: tuple
    source: str = ""

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other

    @classmethod
    def from_points(cls, n, k, rows, log_ratio, source: str = "") -> "GemmSurface":
        """A surface from measured points: each GEMM's ``N``, ``K``, rows ``M`` and ``log(measured / modelled)``
        (repeated measurements of one (N, K, M) are averaged)."""
        n, k, rows, ratio = (np.asarray(a, float) for a in (n, k, rows, log_ratio))
        if not (len(n) == len(k) == len(rows) == len(ratio)) or len(n) == 0:
            raise ValueError("a GEMM surface needs the same number (> 0) of n, k, rows and log_ratio values")
        if not (np.all(n > 0) and np.all(k > 0) and np.all(rows > 0) and np.all(np.isfinite(ratio))):
            raise ValueError("a GEMM surface needs positive n, k and rows and finite log ratios")
        shapes = sorted(set(zip(n.tolist(), k.tolist())))
        curves_m, curves_r = [], []
        for sn, sk in shapes:
            at = (n == sn) & (k == sk)
            m, inverse = np.unique(np.log2(rows[at]), return_inverse=True)
            curves_m.append(m)
            curves_r.append(np.bincount(inverse, ratio[at]) / np.bincount(inverse))
        return cls(np.array([s[0] for s in shapes]), np.array([s[1] for s in shapes]), tuple(curves_m),
                   tuple(curves_r), source)

    def points(self) -> dict:
        """The surface as flat lists (``n``, ``k``, ``rows``, ``log_ratio``): what a calibration file stores."""
        out = {"n": [], "k": [], "rows": [], "log_ratio": []}
        for sn, sk, m, r in zip(self.n, self.k, self.log2_rows, self.log_ratio):
            out["n"] += [float(sn)] * len(m)
            out["k"] += [float(sk)] * len(m)
            out["rows"] += [float(round(2.0 ** v, 6)) for v in m]
            out["log_ratio"] += [round(float(v), 6) for v in r]
        return out

    @functools.lru_cache(maxsize=4096)
    def _blend(self, n: float, k: float) -> tuple:
        """The blended curve of the shapes near ``(n, k)``: (log2 rows, weighted residual sum / total weight)."""
        d2 = (np.log2(n) - np.log2(self.n)) ** 2 + (np.log2(k) - np.log2(self.k)) ** 2
        exact = np.flatnonzero(d2 <= EXACT * EXACT)
        if len(exact):  # a measured shape: its own curve
            s = exact[np.argmin(d2[exact])]
            return self.log2_rows[s], self.log_ratio[s]
        w = np.exp(-d2 / (2 * SIGMA * SIGMA))
        near = np.flatnonzero(w > _NEGLIGIBLE * W0)
        if len(near) == 0:
            return np.zeros(1), np.zeros(1)
        grid = np.unique(np.concatenate([self.log2_rows[s] for s in near]))
        total = sum(w[s] * np.interp(grid, self.log2_rows[s], self.log_ratio[s]) for s in near)
        return grid, total / (W0 + w[near].sum())

    @functools.lru_cache(maxsize=4096)
    def _blend_lists(self, n: float, k: float) -> tuple:
        """:meth:`_blend` as Python lists, for one GEMM at a time (NumPy's per-call cost exceeds the work)."""
        grid, curve = self._blend(n, k)
        return [float(v) for v in grid], [float(v) for v in curve]

    def log_factor(self, rows, n: float, k: float):
        """``r_hat``: the log correction of a GEMM of ``rows`` rows (float or array), ``n`` columns, depth ``k``."""
        if not isinstance(rows, np.ndarray):
            return _interp(math.log2(max(float(rows), 1.0)), *self._blend_lists(float(n), float(k)))
        grid, curve = self._blend(float(n), float(k))
        return np.interp(np.log2(np.maximum(rows, 1.0)), grid, curve)

    def factor(self, rows, n: float, k: float):
        """``exp(r_hat)``: the multiplier on the roofline's time of that GEMM."""
        return np.exp(self.log_factor(rows, n, k)) if isinstance(rows, np.ndarray) else \
            math.exp(self.log_factor(rows, n, k))


def _interp(x: float, grid: list, curve: list) -> float:
    """``np.interp(x, grid, curve)`` for one point, in its arithmetic (slope x offset from the left knot): linear
    between the bracketing knots, constant beyond the ends."""
    if x <= grid[0]:
        return curve[0]
    if x >= grid[-1]:
        return curve[-1]
    j = bisect.bisect_right(grid, x)
    x0, x1 = grid[j - 1], grid[j]
    return (curve[j] - curve[j - 1]) / (x1 - x0) * (x - x0) + curve[j - 1]


def read(path, table: str = "gemm") -> GemmSurface | None:
    """The ``[surfaces.<table>]`` table of a calibration file (``gemm``; a fused MoE fit's ``experts`` or
    ``experts_fp8``: the experts' residuals by width on the GPU as ``N``, hidden size as ``K`` and tokens as rows),
    or None when it has none."""
    return _read(str(Path(path).resolve()), table)


@functools.lru_cache(maxsize=16)
def _read(path: str, name: str = "gemm") -> GemmSurface | None:
    with open(path, "rb") as handle:
        raw = handle.read()
    table = _plain_surface(raw, name)
    if table is None:  # not as mcsim writes it: the TOML parser decides
        table = tomllib.loads(raw.decode("utf-8")).get("surfaces", {}).get(name)
    if not table:
        return None
    return GemmSurface.from_points(table["n"], table["k"], table["rows"], table["log_ratio"], source=path)


#: The keys of a surface table, each a list of numbers.
_SURFACE_KEYS = {"n", "k", "rows", "log_ratio"}


def _plain_surface(raw: bytes, name: str = "gemm") -> dict | None:
    """The ``[surfaces.<name>]`` table read straight from a file as :func:`mcsim.scenario.calibration_file.save`
    writes it (the table last, four one-line lists of plain numbers), or None for any other layout, which
    tomllib then reads. A bundled surface holds 43,000 numbers, which tomllib parses token by token; this splits
    four lines and gives the same floats (a test compares them; ``mcsim bench``'s small run times the whole run)."""
    _, found, rest = raw.partition(b"\n[surfaces." + name.encode() + b"]\n")
    if not found:
        return None
    table = {}
    for line in rest.decode("ascii", errors="replace").splitlines():
        if not line.strip():
            continue
        key, equals, value = line.partition(" = ")
        value = value.strip()
        if not equals or key in table or key not in _SURFACE_KEYS or not (value.startswith("[") and
                                                                           value.endswith("]")):
            return None  # another table, a comment, a key of another shape: not the plain layout
        try:
            table[key] = [float(x) for x in value[1:-1].split(",")]
        except ValueError:  # TOML's own number forms (1_000, 0x10) or a trailing comma
            return None
    return table if set(table) == _SURFACE_KEYS else None


def bundled_path(name: str) -> Path:
    """Path of a bundled calibration (``mcsim/data/calibrations/<name>.toml``)."""
    return Path(str(resources.files("mcsim.data") / "calibrations" / f"{name}.toml"))


def for_hardware(name: str, table: str = "gemm") -> GemmSurface | None:
    """The bundled surface a catalog entry names (``gemm_surface``, ``experts_surface``; "" = none), or that of the
    calibration file at a path (a name ending in ``.toml``)."""
    if not name:
        return None
    return read(name if name.endswith(".toml") else bundled_path(name), table)

"""What a search asks and how it decides: objective, constraints, the robust optimum, the racing rule, regret.

Plain NumPy over arrays shaped ``(candidate, sample)``; a sample a candidate has not run is NaN (objective) or
False (constraints met) there, and ``samples_run[c]`` says how many leading samples candidate ``c`` ran (a racing
search always runs a prefix ``0 .. n-1`` of the samples, so every candidate's samples are shared with every
candidate that ran more: common random numbers).

Definitions (the README and :mod:`mcsim.search` say the same):

- a sample *meets the constraints* when the candidate is feasible in it and every constraint holds; an infeasible
  sample (NaN figures) fails every constraint;
- ``P(constraints met)`` of a candidate: the share of its samples that meet the constraints;
- its *objective at the quantile*: the ``quantile`` of the objective over its feasible samples (NumPy's default,
  linear, ``nanquantile``);
- the *robust optimum*: among candidates with ``P(constraints met) >= confidence``, the one whose objective at the
  quantile is best;
- a *tie*: candidates whose objectives at the quantile lie within a relative :data:`TIE_RTOL` (1e-12) of the best
  one's (exact equality when the best is 0). The tolerance only absorbs floating-point rounding: two
  configurations that compute the same figure along different paths can differ in the last bits, never by
  anything a model could mean. Ties are broken by fewer GPUs (``gpus`` at the same quantile over the candidate's
  feasible samples), then higher decode throughput per GPU (``decode_tok_s_per_gpu``, the first headline
  variable, at that quantile), then the first candidate in the space's order, so the pick never needs more GPUs
  than a tied candidate and is always the same (:func:`pick_optimum`, :data:`TIE_RULE`).
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta, binom

from mcsim.errors import McsimError
from mcsim.results.variables import QUANTILES, REGISTRY, REQUEST_QUANTILE


class SearchError(McsimError, ValueError):
    """A search asked in a way it cannot be run (an unknown metric, a constraint that does not parse...)."""


@dataclass(frozen=True)
class Metric:
    """A per-sample scalar of a result: a registered variable, at one per-request quantile for latency variables
    (``ttft_s@0.99``)."""

    name: str
    request_quantile: float | None = None

    @property
    def label(self) -> str:
        return self.name if self.request_quantile is None else f"{self.name}@{self.request_quantile:g}"

    @property
    def units(self) -> str:
        return REGISTRY[self.name].units

    def from_table(self, table: dict) -> np.ndarray:
        """Values of a part's table (``name -> (sample, variant, *dims)``), one per sample (the first variant)."""
        values = np.asarray(table[self.name], dtype=float)[:, 0]
        if self.request_quantile is not None:
            values = values[:, QUANTILES.index(self.request_quantile)]
        return values

    def from_dataset(self, ds) -> np.ndarray:
        """Values of a result Dataset variable, ``request_quantile`` selected."""
        da = ds[self.name]
        if self.request_quantile is not None:
            da = da.sel({REQUEST_QUANTILE: self.request_quantile})
        return np.asarray(da.values, dtype=float)


def parse_metric(text: str, option: str, shown: str | None = None) -> Metric:
    """``NAME`` or ``NAME@Q`` (Q a per-request quantile of a latency variable: 0.5, 0.9 or 0.99); errors quote
    ``shown`` (default: ``text``) after ``option``."""
    name, _, q = text.strip().partition("@")
    text = text if shown is None else shown
    name = name.strip()
    if name not in REGISTRY:
        near = [n for n in REGISTRY if name and n.startswith(name)] or difflib.get_close_matches(name, list(REGISTRY), n=1)
        hint = f" (did you mean {near[0]}?)" if near else " (see the variables in the README)"
        raise SearchError(f"{option} {text!r}: {name!r} is not a result variable{hint}")
    dims = REGISTRY[name].dims
    if dims == (REQUEST_QUANTILE,):
        try:
            quantile = float(q) if q else None
        except ValueError:
            quantile = None
        if quantile is None or not any(math.isclose(quantile, x) for x in QUANTILES):
            raise SearchError(f"{option} {text!r}: {name} is per-request quantiles; name one as {name}@Q with Q in "
                              f"{', '.join(f'{x:g}' for x in QUANTILES)}")
        return Metric(name, next(x for x in QUANTILES if math.isclose(quantile, x)))
    if dims or q:
        raise SearchError(f"{option} {text!r}: expected a per-sample scalar variable "
                          f"(or NAME@Q for {', '.join(n for n, v in REGISTRY.items() if v.dims == (REQUEST_QUANTILE,))})")
    return Metric(name)


_OPS = {">=": np.greater_equal, "<=": np.less_equal, ">": np.greater, "<": np.less}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*(?:@[0-9.]+)?)\s*(>=|<=|>|<)\s*([-+0-9.eEinf]+)\s*$")


@dataclass(frozen=True)
class Constraint:
    """``metric OP threshold`` per sample; NaN (an infeasible sample) never meets it."""

    metric: Metric
    op: str
    threshold: float

    @property
    def text(self) -> str:
        return f"{self.metric.label}{self.op}{self.threshold:g}"

    def holds(self, values: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore"):
            return _OPS[self.op](values, self.threshold) & np.isfinite(values)


def parse_constraint(text: str) -> Constraint:
    """``"slo_attainment>=0.99"``, ``"gross_margin>0"``, ``"ttft_s@0.99<=2"``."""
    match = _CONSTRAINT.match(text)
    if not match:
        raise SearchError(f"--constraint {text!r}: expected NAME>=VALUE, NAME<=VALUE, NAME>VALUE or NAME<VALUE, "
                          "e.g. slo_attainment>=0.99")
    name, op, value = match.groups()
    try:
        threshold = float(value)
    except ValueError:
        raise SearchError(f"--constraint {text!r}: {value!r} is not a number") from None
    if not math.isfinite(threshold):
        raise SearchError(f"--constraint {text!r}: the threshold must be a finite number")
    return Constraint(parse_metric(name, "--constraint", text), op, threshold)


@dataclass(frozen=True)
class Question:
    """What a search optimizes: the objective, its direction and quantile, the constraints and their confidence."""

    objective: Metric
    maximize: bool = False
    quantile: float = 0.5
    constraints: tuple = ()
    confidence: float = 0.9

    def __post_init__(self):
        if not 0.0 <= self.quantile <= 1.0:
            raise SearchError(f"--quantile {self.quantile:g}: expected a quantile in [0, 1]")
        if not 0.0 < self.confidence <= 1.0:
            raise SearchError(f"--confidence {self.confidence:g}: expected a probability in (0, 1]")

    @property
    def direction(self) -> str:
        return "maximize" if self.maximize else "minimize"

    def met(self, feasible: np.ndarray, values: dict) -> np.ndarray:
        """Per sample: feasible and every constraint holds (``values``: metric label -> per-sample values)."""
        ok = np.asarray(feasible, dtype=float) == 1
        for c in self.constraints:
            ok &= c.holds(values[c.metric.label])
        return ok

    def score(self, objective: np.ndarray) -> np.ndarray:
        """The objective as a loss (lower is better), NaN (infeasible, not run) as +inf: what the racing rule and
        the regret compare."""
        loss = -objective if self.maximize else objective
        return np.where(np.isnan(loss), np.inf, loss)


# -- the robust optimum ------------------------------------------------------------------------------------------


def met_probability(met: np.ndarray, samples_run: np.ndarray) -> np.ndarray:
    """Share of each candidate's samples that meet the constraints (NaN for a candidate that ran none)."""
    runs = np.asarray(samples_run, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(runs > 0, met.sum(axis=1) / runs, np.nan)


def objective_at_quantile(objective: np.ndarray, quantile: float) -> np.ndarray:
    """Each candidate's objective at ``quantile`` over its feasible samples (NaN where it has none)."""
    out = np.full(objective.shape[0], np.nan)
    for c, row in enumerate(objective):
        finite = row[np.isfinite(row)]
        if finite.size:
            out[c] = np.quantile(finite, quantile)
    return out


#: Relative tolerance of a tie: values within ``TIE_RTOL * |best|`` of the best are equal. Far above the rounding
#: of a figure computed along two paths (~1e-15), far below any difference a model means.
TIE_RTOL = 1e-12
#: The tie-break keys after the objective: fewer GPUs, then more decode throughput per GPU (result variables, each
#: at the search quantile over the candidate's feasible samples).
TIE_GPUS = Metric("gpus")
TIE_THROUGHPUT = Metric("decode_tok_s_per_gpu")
#: What :attr:`Pick.decided_by` says when no key separated the tied candidates.
BY_ORDER = "candidate order"
#: The tie-break rule, as the search result's ``search_tie_rule`` attribute states it.
TIE_RULE = (
    f"Best objective at the search quantile; values within a relative {TIE_RTOL:g} of the best tie. Ties go to "
    f"fewer GPUs ({TIE_GPUS.name}), then to higher decode throughput per GPU ({TIE_THROUGHPUT.name}), each at the "
    f"search quantile over the candidate's feasible samples and equal within the same tolerance, then to the first "
    f"candidate in the space's order. Only candidates that ran every sample and meet the constraints with the "
    f"confidence asked can tie."
)


@dataclass(frozen=True)
class Pick:
    """The robust optimum, the candidates tied with it on the objective, and which key chose among them.

    ``tied`` holds, per candidate, whether its objective at the quantile ties with the best (the optimum included;
    all False when there is no optimum). ``decided_by`` names the key that left the optimum alone: ``"objective"``
    (no tie), :data:`TIE_GPUS`'s or :data:`TIE_THROUGHPUT`'s name, :data:`BY_ORDER`; ``"none"`` without an
    optimum.
    """

    optimum: int | None
    tied: np.ndarray
    decided_by: str


def _within(values: np.ndarray, best: float) -> np.ndarray:
    """Whether each value ties with ``best`` (within :data:`TIE_RTOL`, relative; infinities equal themselves)."""
    with np.errstate(invalid="ignore"):
        return (values == best) | (np.abs(values - best) <= TIE_RTOL * abs(best))


def pick_optimum(question: Question, objective: np.ndarray, met: np.ndarray, samples_run: np.ndarray, among=None,
                 gpus=None, throughput=None) -> Pick:
    """The robust optimum among ``among`` (default: every candidate) and the candidates tied with it.

    Parameters
    ----------
    question : Question
    objective, met : numpy.ndarray
        ``(candidate, sample)``: the objective (NaN where infeasible or not run), whether the sample meets the
        constraints.
    samples_run : numpy.ndarray
        Samples each candidate ran.
    among : numpy.ndarray of bool, optional
        The candidates to choose from.
    gpus, throughput : numpy.ndarray, optional
        ``(candidate, sample)`` values of :data:`TIE_GPUS` and :data:`TIE_THROUGHPUT`, NaN where infeasible; a key
        not given separates no candidates. A candidate without a finite value ranks last on that key.

    Returns
    -------
    Pick
        ``optimum`` None when no candidate meets the constraints with the confidence asked.

    Examples
    --------
    Two candidates tie on the median cost; the second needs fewer GPUs:

    >>> q = Question(Metric("cost_usd_per_mtok"))
    >>> cost = np.array([[2.0, 4.0], [2.0, 4.0], [5.0, 5.0]])
    >>> met = np.ones((3, 2), dtype=bool)
    >>> pick = pick_optimum(q, cost, met, np.array([2, 2, 2]), gpus=np.array([[16.0, 16], [8, 8], [8, 8]]))
    >>> pick.optimum, pick.tied.tolist(), pick.decided_by
    (1, [True, True, False], 'gpus')
    """
    p = met_probability(met, samples_run)
    value = objective_at_quantile(objective, question.quantile)
    loss = -value if question.maximize else value
    eligible = (p >= question.confidence) & np.isfinite(loss)
    if among is not None:
        eligible &= np.asarray(among, dtype=bool)
    if not eligible.any():
        return Pick(None, np.zeros(loss.size, dtype=bool), "none")
    tied = eligible & _within(loss, float(loss[eligible].min()))
    remaining = np.flatnonzero(tied)
    decided_by = "objective" if remaining.size == 1 else BY_ORDER
    for name, values, sign in ((TIE_GPUS.name, gpus, 1.0), (TIE_THROUGHPUT.name, throughput, -1.0)):
        if remaining.size == 1 or values is None:
            continue
        # lower is better on every key: fewer GPUs, more throughput (negated); no value ranks last
        key = sign * objective_at_quantile(np.asarray(values, dtype=float)[remaining], question.quantile)
        key = np.where(np.isnan(key), np.inf, key)
        keep = _within(key, float(key.min()))
        if not keep.all():
            remaining = remaining[keep]
            decided_by = name
    if remaining.size > 1:
        decided_by = BY_ORDER
    return Pick(int(remaining[0]), tied, decided_by)  # remaining is in candidate order: the first of equal ones


def robust_optimum(question: Question, objective: np.ndarray, met: np.ndarray, samples_run: np.ndarray,
                   among=None, gpus=None, throughput=None) -> int | None:
    """Index of the robust optimum among ``among`` (default: every candidate), ties broken as :func:`pick_optimum`
    does; None when no candidate meets the constraints with the confidence asked."""
    return pick_optimum(question, objective, met, samples_run, among, gpus, throughput).optimum


# -- the racing rule ---------------------------------------------------------------------------------------------


def clopper_pearson_upper(met_count: np.ndarray, runs: np.ndarray, alpha: float) -> np.ndarray:
    """One-sided upper ``1 - alpha`` Clopper-Pearson bound on a success probability from ``met_count`` of
    ``runs`` (1 when every run succeeded)."""
    k = np.asarray(met_count, dtype=float)
    n = np.asarray(runs, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        bound = beta.ppf(1.0 - alpha, k + 1.0, np.maximum(n - k, 1e-300))
    return np.where(k >= n, 1.0, bound)


def sign_test_p(wins: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """P(Binomial(runs, 1/2) >= wins): how often a rival that beats a candidate in half the samples would win
    ``wins`` of ``runs`` or more."""
    return binom.sf(np.asarray(wins) - 1, np.asarray(runs), 0.5)


@dataclass(frozen=True)
class Decision:
    """One application of the racing rule: the leader and, per candidate, whether it is dropped and why."""

    leader: int | None
    infeasible: np.ndarray  # dropped: cannot reach P(constraints met) >= confidence
    dominated: np.ndarray  # dropped: loses to the leader in too many of its samples
    leader_wins: np.ndarray  # samples in which the leader beat the candidate
    differ: np.ndarray  # samples in which the leader and the candidate differ (the sign test's count)
    tied: np.ndarray | None = None  # candidates tied with the leader on the objective (Pick.tied)
    decided_by: str = "none"  # the key that chose the leader among them (Pick.decided_by)

    @property
    def dropped(self) -> np.ndarray:
        return self.infeasible | self.dominated

    @property
    def tie_rule(self) -> str:
        """How the leader was chosen among candidates tied on the objective (:data:`TIE_RULE`)."""
        return TIE_RULE

    @property
    def tie_rtol(self) -> float:
        """The relative tolerance of a tie (:data:`TIE_RTOL`)."""
        return TIE_RTOL


def decide(question: Question, objective: np.ndarray, met: np.ndarray, samples_run: np.ndarray,
           total_samples: int, alpha: float, gpus=None, throughput=None) -> Decision:
    """The racing rule after a round (see :mod:`mcsim.search`): which candidates can no longer be the robust optimum.

    A candidate is dropped when

    1. it cannot reach ``P(constraints met) >= confidence`` at ``total_samples`` even if it met them in every
       remaining sample, or the one-sided upper ``1 - alpha`` Clopper-Pearson bound on its probability of meeting
       them (from its own samples) is below ``confidence``; or
    2. the *leader* -- the robust optimum among the candidates that ran the most samples, on those samples -- is
       better in so many of the candidate's samples that a paired sign test rejects "the candidate is better in at
       least half the samples where they differ" at level ``alpha`` (samples where they tie are left out, so a
       candidate equal to the leader so far stays in the race).

    The leader among candidates tied on the objective is chosen by :func:`pick_optimum`'s rule (``gpus`` and
    ``throughput``: its tie-break keys per candidate and sample).
    """
    runs = np.asarray(samples_run, dtype=np.int64)
    k = met.sum(axis=1)
    reach = (k + (total_samples - runs)) / total_samples
    infeasible = (runs > 0) & ((reach < question.confidence)
                               | (clopper_pearson_upper(k, runs, alpha) < question.confidence))
    most = runs.max() if runs.size else 0
    pick = pick_optimum(question, objective, met, runs, (runs == most) & (most > 0), gpus, throughput)
    leader = pick.optimum
    wins = np.zeros(runs.size, dtype=np.int64)
    differ = np.zeros(runs.size, dtype=np.int64)
    dominated = np.zeros(runs.size, dtype=bool)
    if leader is not None:
        loss = question.score(objective)
        for c in range(runs.size):
            n = runs[c]
            if c == leader or n == 0:
                continue
            mine, theirs = loss[c, :n], loss[leader, :n]
            # a tie says nothing about which is better (the sign test leaves it out): equal candidates stay in
            wins[c] = int(np.sum(theirs < mine))
            differ[c] = wins[c] + int(np.sum(theirs > mine))
        dominated = (differ > 0) & (np.arange(runs.size) != leader) & (sign_test_p(wins, differ) <= alpha)
    return Decision(leader, infeasible, dominated & ~infeasible, wins, differ, pick.tied, pick.decided_by)


def round_schedule(total_samples: int, first: int) -> list[int]:
    """Samples per candidate after each round: ``first``, then doubling, ending at ``total_samples``."""
    counts = [min(first, total_samples)]
    while counts[-1] < total_samples:
        counts.append(min(2 * counts[-1], total_samples))
    return counts


# -- regret ------------------------------------------------------------------------------------------------------


def regret(question: Question, objective: np.ndarray, met: np.ndarray, samples_run: np.ndarray) -> dict:
    """Per candidate: how often it is the best of a sample, and by how much it loses when it is not.

    In each sample the best is the best objective among the candidates that ran the sample and met the
    constraints in it (ties: each of them is the best). A candidate's regret in a sample it ran and met the
    constraints in is its objective's distance from that best (>= 0, in the objective's units). The share is over
    the samples it ran; the regret quantiles (median and 90 %) over those where it met the constraints and was not
    the best (NaN when there are none).

    Returns ``best_share``, ``regret_p50`` and ``regret_p90``, one value per candidate.
    """
    loss = question.score(objective)
    met_loss = np.where(met, loss, np.inf)
    best = met_loss.min(axis=0)  # per sample
    has_best = np.isfinite(best)[None, :]
    is_best = met & (met_loss == best[None, :]) & has_best
    gap = np.where(met & ~is_best & has_best, loss - best[None, :], np.nan)
    runs = np.asarray(samples_run, dtype=np.int64)
    share, p50, p90 = (np.full(runs.size, np.nan) for _ in range(3))
    for c, n in enumerate(runs):
        if n == 0:
            continue
        share[c] = is_best[c, :n].mean()
        gaps = gap[c, :n]
        gaps = gaps[np.isfinite(gaps)]
        if gaps.size:
            p50[c], p90[c] = np.quantile(gaps, [0.5, 0.9])
    return {"best_share": share, "regret_p50": p50, "regret_p90": p90}


# -- what a search result records per candidate -------------------------------------------------------------------


def candidate_figures(question: Question, objective: np.ndarray, met: np.ndarray, samples_run: np.ndarray,
                      decision: Decision, schedule: list[int], total_samples: int, gpus=None,
                      throughput=None) -> dict:
    """The search's own variables of every candidate (:data:`mcsim.results.search_dataset.SEARCH_REGISTRY`), by
    name: samples run, the last round run, the racing rule's outcome and counts, P(constraints met), the objective
    and the tie-break keys (``gpus``, ``throughput``: per candidate and sample, NaN where infeasible) at the
    quantile, whether it ties with the optimum, regret; ``constraints_met`` per sample (-1 where the candidate did
    not run it)."""
    runs = samples_run
    outcome = np.where(decision.infeasible, 1, np.where(decision.dominated, 2, 0)).astype(np.int8)
    p_sign = np.where(decision.differ > 0, sign_test_p(decision.leader_wins, decision.differ), 1.0)
    if decision.leader is not None:
        p_sign[decision.leader] = np.nan
    met_flag = np.where(np.arange(total_samples)[None, :] < runs[:, None], met, -1).astype(np.int8)
    regrets = regret(question, objective, met, runs)
    shape = np.shape(objective)
    tied = np.zeros(len(runs), dtype=bool) if decision.tied is None else decision.tied
    return {
        "samples_run": runs, "survived_round": np.searchsorted(schedule, runs, side="right").astype(np.int64),
        "racing_outcome": outcome, "leader_wins": decision.leader_wins, "leader_differs": decision.differ,
        "sign_test_p": p_sign,
        "constraints_met": met_flag, "constraints_met_probability": met_probability(met, runs),
        "objective_at_quantile": objective_at_quantile(objective, question.quantile),
        "tied_with_best": tied.astype(np.int8),
        "gpus_at_quantile": objective_at_quantile(np.full(shape, np.nan) if gpus is None else gpus,
                                                  question.quantile),
        "decode_tok_s_per_gpu_at_quantile": objective_at_quantile(
            np.full(shape, np.nan) if throughput is None else throughput, question.quantile),
        "best_in_sample_share": regrets["best_share"], "regret_p50": regrets["regret_p50"],
        "regret_p90": regrets["regret_p90"],
    }

"""Stage 1: the requests of one sample, generated or replayed from a real trace.

The generator builds prefix structure that creates real reuse, vectorised over requests:

* a pool of ``workload.system_prompts`` shared system prompts, picked with Zipf popularity;
* multi-turn sessions (geometric number of turns, mean ``turns`` per class) whose turn *t* carries the whole
  earlier conversation (system prompt, earlier user messages and answers) plus a new user message;
* a unique tail (each new user message).

Prompts are cut into ``cache.block_tokens`` blocks; only whole blocks are cacheable. Block identities follow the
chain-hash rule that vLLM, SGLang and Mooncake use: two requests share block *k* if and only if they share the
whole prompt up to the end of block *k*. The generator knows which content each block holds, so it assigns those
identities directly (block *k* of system prompt *j*, or block *k* of session *s*'s conversation) instead of hashing
token ids; a replayed Mooncake trace brings its own chain hashes.

Arrivals form an exact renewal process (Poisson, or gamma with squared coefficient of variation
``burstiness``). With a ``workload.rate_profile`` (:class:`RateProfile`) the rate follows a profile over a period
(a day): the same renewal process runs in operational time, at ``rate_rps``, and each operational time maps to the
wall-clock time at which the cumulative intensity reaches it, so Poisson arrivals make a non-homogeneous Poisson
process and a slice of rate 0 gets no arrival. Sessions start in time, at the same rate as the arrivals (through
the same profile), and their turns follow after exponential think times in wall-clock seconds; the resulting order
decides which request gets which arrival, so every session's turns arrive in order. Sessions also start before the
sample's window (five mean session lengths, :data:`LEAD_IN_SESSION_LENGTHS`), so that its first requests carry
the steady share of later turns rather than a ramp of first turns whose length grows with think time x rate.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcsim.kernels.workload import fill_block_ids
from mcsim.scenario import ScenarioError
from mcsim.scenario.distributions import Dist
from mcsim.scenario.schema import workload_reads as reads  # the keys are declared with the schema
from mcsim.stages import requests_trace as traces


@dataclass(frozen=True)
class Inputs:
    """The parameters the workload stage reads, as ``(path, value)`` pairs in path order.

    Every variant of a sample must have the same :class:`Inputs` (they share their requests).
    """

    values: tuple

    @classmethod
    def from_params(cls, p: dict) -> "Inputs":
        return cls(tuple(sorted((k, v) for k, v in p.items() if reads(k))))

    def first_difference(self, other: "Inputs") -> str | None:
        """The first path whose value differs between two inputs, or None."""
        mine, theirs = dict(self.values), dict(other.values)
        for key in sorted(set(mine) | set(theirs)):
            if mine.get(key) != theirs.get(key):
                return key
        return None


@dataclass(frozen=True, init=False)
class Requests:
    """Struct of arrays, one row per request, sorted by arrival.

    The prompt blocks' ids are given as a CSR array (``block_ids``), or, for the generator's requests, as two runs
    of consecutive ids per request (``block_runs``): then the CSR array is written out only when something reads
    ``block_ids`` (the replicas, prefix-affinity and cache-aware routing), and the cache stage's replay of its own
    per-instance tiers reads the runs (:func:`mcsim.kernels.kv_tiers.lookup_tiers_runs`): 24 bytes per request
    instead of 8 per block.

    Attributes
    ----------
    arrival_s : float64[n]
        Arrival time, seconds from the first request.
    class_id : int32[n]
        Index into ``class_names``.
    prompt_tokens, output_tokens : int64[n]
    acceptance : float64[n]
        Per-request draft acceptance rate (used when speculative decoding is on).
    block_ptr : int64[n+1]
        CSR pointers into ``block_ids``: request ``r`` has ``block_ptr[r + 1] - block_ptr[r]`` whole blocks.
    block_ids : int64[nnz]
        Identity of each whole prompt block (chain-hash semantics), in prompt order.
    block_runs : int64[n, 3] or None
        ``(shared_blocks, shared_base, own_base)`` per request when its ids are two runs: block ``k`` is
        ``shared_base + k`` while ``k < shared_blocks`` (a shared system prompt's), else ``own_base + k`` (its
        conversation's).
    block_tokens : int
        Tokens per block.
    session_id : int64[n]
        Conversation each request belongs to (-1 when unknown, as in traces).
    class_names : tuple of str
    source : str
        ``"generator"`` or the trace file.
    """

    arrival_s: np.ndarray
    class_id: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    acceptance: np.ndarray
    block_ptr: np.ndarray
    block_tokens: int
    session_id: np.ndarray
    class_names: tuple
    source: str
    block_runs: np.ndarray | None
    _block_ids: np.ndarray | None = field(repr=False, compare=False)

    def __init__(self, *, arrival_s, class_id, prompt_tokens, output_tokens, acceptance, block_ptr, block_tokens,
                 session_id, class_names, source: str = "generator", block_ids=None, block_runs=None):
        if block_ids is None and block_runs is None:
            raise ValueError("give the prompt blocks as block_ids or as block_runs (or both, the same ids)")
        values = dict(arrival_s=arrival_s, class_id=class_id, prompt_tokens=prompt_tokens,
                      output_tokens=output_tokens, acceptance=acceptance, block_ptr=block_ptr,
                      block_tokens=block_tokens, session_id=session_id, class_names=class_names, source=source,
                      block_runs=block_runs, _block_ids=block_ids)
        for name, value in values.items():
            object.__setattr__(self, name, value)

    @property
    def n(self) -> int:
        return len(self.prompt_tokens)

    @property
    def block_ids(self) -> np.ndarray:
        """Every request's block ids, in prompt order (written out from ``block_runs`` at the first read)."""
        if self._block_ids is None:
            ids = np.empty(int(self.block_ptr[-1] - self.block_ptr[0]), dtype=np.int64)
            runs = self.block_runs
            fill_block_ids(self.block_ptr - self.block_ptr[0], np.ascontiguousarray(runs[:, 0]),
                           np.ascontiguousarray(runs[:, 1]), np.ascontiguousarray(runs[:, 2]), ids)
            object.__setattr__(self, "_block_ids", ids)
        return self._block_ids

    def tail(self, start: int) -> "Requests":
        """Requests ``start:`` (the ones measured after a warm-up), with block pointers re-based."""
        ptr = self.block_ptr[start:]
        blocks = {"block_runs": None if self.block_runs is None else self.block_runs[start:],
                  "block_ids": None if self._block_ids is None else self._block_ids[ptr[0]:ptr[-1]]}
        return Requests(
            arrival_s=self.arrival_s[start:], class_id=self.class_id[start:],
            prompt_tokens=self.prompt_tokens[start:], output_tokens=self.output_tokens[start:],
            acceptance=self.acceptance[start:], block_ptr=ptr - ptr[0], block_tokens=self.block_tokens,
            session_id=self.session_id[start:], class_names=self.class_names, source=self.source, **blocks,
        )

    @property
    def duration_s(self) -> float:
        """Span of the arrivals plus one mean gap (so a single request has a positive duration)."""
        n = self.n
        span = float(self.arrival_s[-1] - self.arrival_s[0]) if n > 1 else 0.0
        return span * n / (n - 1) if n > 1 and span > 0 else max(span, 1.0)


def _class_values(params: dict, classes, key: str) -> np.ndarray:
    return np.array([params[f"workload.classes.{c}.{key}"] for c in classes], dtype=float)


def _per_class_sample(params, classes, key, class_of, rng) -> np.ndarray:
    """Draw the per-request field ``key`` for rows whose class is ``class_of`` (one vector call per class)."""
    out = np.empty(len(class_of), dtype=float)
    for c, name in enumerate(classes):
        rows = np.flatnonzero(class_of == c)
        dist: Dist = params[f"workload.classes.{name}.{key}"]
        out[rows] = dist.sample(rng, len(rows))
    return out


def _tokens(x) -> np.ndarray:
    return np.maximum(np.rint(x), 1).astype(np.int64)


def renewal_arrivals(n: int, rate_rps: float, arrivals: str, burstiness: float, rng) -> np.ndarray:
    """Arrival times of a renewal process starting at 0: Poisson, or gamma gaps with CV^2 = burstiness."""
    if arrivals == "poisson":
        gaps = rng.exponential(1.0 / rate_rps, n)
    else:
        shape = 1.0 / burstiness
        gaps = rng.gamma(shape, burstiness / rate_rps, n)
    t = np.cumsum(gaps)
    return t - t[0]


@dataclass(frozen=True)
class RateProfile:
    """A piecewise-constant arrival rate repeating every period: ``workload.rate_profile`` and its two keys.

    Time ``t`` counts wall-clock seconds from the sample's start, which lies ``start_s`` into the period. The
    operational time ``Q(t)`` is the integral of the relative rate (mean 1 over a period) from the start to ``t``:
    seconds at the mean rate, so that the cumulative intensity is ``rate_rps x Q(t)``.

    Attributes
    ----------
    rates : float64[m]
        Relative rate of each slice, normalised to mean 1.
    period_s : float
        Length of the period; slice ``i`` covers ``[i, i + 1) x period_s / m`` of it.
    start_s : float
        Where in the period ``t = 0`` falls, in ``[0, period_s)``.
    """

    rates: np.ndarray
    period_s: float
    start_s: float

    @classmethod
    def from_params(cls, p: dict) -> "RateProfile | None":
        """The profile of a sample's parameters, or None for a constant rate (an empty ``workload.rate_profile``)."""
        profile = np.asarray(p["workload.rate_profile"], dtype=float)
        if profile.size == 0:
            return None
        period = float(p["workload.rate_profile_period_s"])
        # a drawn start may reach the period's end, the same time of the period as 0
        return cls(profile / profile.mean(), period, float(p["workload.rate_profile_start_s"]) % period)

    def _edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Slice edges of one period from its start, wall-clock and operational (``m + 1`` each)."""
        m = len(self.rates)
        return (np.linspace(0.0, self.period_s, m + 1),
                np.concatenate([[0.0], np.cumsum(self.rates * (self.period_s / m))]))

    def operational(self, t) -> np.ndarray:
        """``Q(t)``: operational seconds (seconds at the mean rate) from the start to wall-clock ``t`` (any sign)."""
        edges, cum = self._edges()
        x = self.start_s + np.asarray(t, dtype=float)
        periods = np.floor(x / self.period_s)
        at = periods * cum[-1] + np.interp(x - periods * self.period_s, edges, cum)
        return at - np.interp(self.start_s, edges, cum)

    def wall(self, q) -> np.ndarray:
        """The inverse of :meth:`operational`: the wall-clock time at which ``Q`` reaches ``q``.

        Where ``Q`` is flat (slices of rate 0), the end of the flat stretch: a time inside a slice of rate 0 is
        never returned.
        """
        edges, cum = self._edges()
        x = np.interp(self.start_s, edges, cum) + np.asarray(q, dtype=float)
        periods = np.floor(x / cum[-1])
        rest = x - periods * cum[-1]
        wrapped = rest >= cum[-1]  # rounding
        periods, rest = periods + wrapped, np.maximum(np.where(wrapped, rest - cum[-1], rest), 0.0)
        # the last slice whose operational start is at or before rest: the last of equal starts is the one with a
        # positive rate, since rest is below the period's total
        i = np.searchsorted(cum[:-1], rest, side="right") - 1
        within = np.minimum((rest - cum[i]) / self.rates[i], self.period_s / len(self.rates))
        return periods * self.period_s + edges[i] + within - self.start_s


def profiled_arrivals(n: int, rate_rps: float, arrivals: str, burstiness: float, rng,
                      profile: RateProfile | None) -> np.ndarray:
    """Arrival times starting at 0: :func:`renewal_arrivals` in operational time, mapped through ``profile``.

    Without a profile, :func:`renewal_arrivals` itself. The first arrival falls ``profile.start_s`` into the
    period, or at the start of the next slice with traffic if that slice's rate is 0.
    """
    t = renewal_arrivals(n, rate_rps, arrivals, burstiness, rng)
    if profile is None:
        return t
    t = profile.wall(t)
    return t - t[0]


def zipf_probabilities(n: int, exponent: float) -> np.ndarray:
    """P(rank r) proportional to r**-exponent, r = 1..n."""
    w = np.arange(1, n + 1, dtype=float) ** -exponent
    return w / w.sum()


#: Sessions started before a sample's window span this many mean session lengths of its longest class, adding at
#: most :data:`LEAD_IN_MAX_ROWS` (or 4 per requested one, if more) turns; beyond that the window opens on a partial
#: ramp, which the steady-state check reports.
LEAD_IN_SESSION_LENGTHS = 5.0
LEAD_IN_MAX_ROWS = 500_000


def _lead_in_s(think_time_s: float, longest_mean_turns: float, rate_rps: float, n: int,
               profile: RateProfile | None = None) -> float:
    """How long before a window sessions start: five mean session lengths ((turns - 1) x think time) of the class
    with the longest sessions, so that the window's first requests already carry the steady share of later turns;
    0 for single-turn sessions. In operational seconds with a ``profile`` (the traffic of those wall-clock
    seconds before the start, at the mean rate), wall-clock seconds without."""
    span = max(longest_mean_turns - 1.0, 0.0) * max(float(think_time_s), 0.0)
    if span <= 0 or rate_rps <= 0:
        return 0.0
    most = max(LEAD_IN_MAX_ROWS, 4 * n) / rate_rps  # turns arrive at rate_rps once the mix is steady
    lead = LEAD_IN_SESSION_LENGTHS * span
    if profile is not None:
        lead = -float(profile.operational(-lead))
    return float(min(lead, most))


def generate(params: dict, classes: tuple, n: int, rng: np.random.Generator, max_context: int) -> Requests:
    """Generate ``n`` requests for one sample (see module docstring).

    Parameters
    ----------
    params : dict
        Resolved parameters of the sample (:func:`mcsim.scenario.resolve`).
    classes : tuple of str
    n : int
    rng : numpy.random.Generator
        The sample's workload stream.
    max_context : int
        Longest prompt + output, tokens.
    """
    block = int(params["cache.block_tokens"])
    shares = _class_values(params, classes, "share")
    shares = shares / shares.sum()
    mean_turns = _class_values(params, classes, "turns")
    sys_share = _class_values(params, classes, "system_prompt_share")

    # Sessions: enough that their turns cover n requests after a 25 % margin for the window's edge, plus those that
    # started before the window (see "Virtual times" below).
    session_shares = shares / mean_turns
    session_shares /= session_shares.sum()
    mean_turns_all = 1.0 / np.sum(shares / mean_turns)
    session_rate = params["workload.rate_rps"] / mean_turns_all
    profile = RateProfile.from_params(params)
    lead_s = _lead_in_s(params["workload.think_time_s"], float(mean_turns.max()), params["workload.rate_rps"], n,
                        profile)
    n_sessions = int(np.ceil(1.25 * n / mean_turns_all + lead_s * session_rate)) + 16
    session_class = rng.choice(len(classes), size=n_sessions, p=session_shares).astype(np.int32)
    turns = rng.geometric(1.0 / mean_turns[session_class]).astype(np.int64)

    # System prompts: Zipf-popular pool, lengths drawn once per prompt.
    n_prompts = int(params["workload.system_prompts"])
    prompt_len = _tokens(params["workload.system_prompt_tokens"].sample(rng, n_prompts))
    uses_prompt = rng.random(n_sessions) < sys_share[session_class]
    prompt_of_session = rng.choice(n_prompts, size=n_sessions,
                                   p=zipf_probabilities(n_prompts, params["workload.system_prompt_zipf"]))
    sys_len = np.where(uses_prompt, prompt_len[prompt_of_session], 0)

    # Flatten turns: one row per (session, turn).
    rows = int(turns.sum())
    session = np.repeat(np.arange(n_sessions), turns)
    first_row = np.concatenate([[0], np.cumsum(turns)[:-1]])
    turn = np.arange(rows) - np.repeat(first_row, turns)
    cls = session_class[session]
    user = _tokens(_per_class_sample(params, classes, "prompt_tokens", cls, rng))
    output = _tokens(_per_class_sample(params, classes, "output_tokens", cls, rng))
    acceptance = np.clip(_per_class_sample(params, classes, "acceptance", cls, rng), 0.0, 1.0)

    # Context limits: a first turn is clipped to fit; later turns that do not fit end their session.
    output = np.minimum(output, max(max_context // 2, 1))
    user = np.where(turn == 0, np.minimum(user, np.maximum(max_context - output - sys_len[session], 1)), user)
    exchange = user + output
    cum_exchange = np.cumsum(exchange)
    session_start_cum = np.repeat(cum_exchange[first_row] - exchange[first_row], turns)
    before = cum_exchange - exchange - session_start_cum  # tokens of earlier turns in this session
    prompt = sys_len[session] + before + user
    keep = (prompt + output <= max_context) | (turn == 0)
    # Arrays of one row per turn are most of a sample's memory: each goes as soon as it is used.
    del user, exchange, cum_exchange, session_start_cum, before, turn
    # A dropped turn drops every later turn of its session: keep only a leading run per session.
    bad = (~keep).astype(np.int64)
    bad_before = np.cumsum(bad) - np.repeat(np.cumsum(bad)[first_row] - bad[first_row], turns)
    keep = bad_before == 0
    del bad, bad_before

    # Virtual times: sessions start as a Poisson process, turns follow after exponential think times. Sessions
    # start from -lead_s, and the window takes the turns from time 0 on, so it opens on the steady mix of first and
    # later turns instead of a ramp of first turns (a cold cache is still cold: mc.warmup_fraction covers that).
    # With a rate profile the starts (and lead_s) are operational times, mapped to wall-clock times as the arrivals
    # are, and the think times are wall-clock seconds.
    start = np.cumsum(rng.exponential(1.0 / session_rate, n_sessions)) - lead_s
    if profile is not None:
        start = profile.wall(start)
    think = rng.exponential(params["workload.think_time_s"], rows)
    think[first_row] = 0.0
    cum_think = np.cumsum(think)
    t_virtual = start[session] + cum_think - np.repeat(cum_think[first_row], turns)
    del think, cum_think
    if lead_s > 0:
        keep &= t_virtual >= 0.0

    order = np.flatnonzero(keep)
    del keep
    order = order[np.argsort(t_virtual[order], kind="stable")][:n]
    del t_virtual
    if len(order) < n:  # pathological context limits: fewer turns than asked
        n = len(order)
    arrival = profiled_arrivals(n, params["workload.rate_rps"], params["workload.arrivals"],
                                params["workload.burstiness"], rng, profile)

    # Block identities: block k of system prompt j, or block k of session s's conversation.
    prompt_r = prompt[order]
    nblocks = prompt_r // block
    sys_blocks_of_prompt = prompt_len // block
    sys_base = np.concatenate([[0], np.cumsum(sys_blocks_of_prompt)])
    session_r = session[order]
    sys_full = np.where(uses_prompt[session_r], sys_len[session_r] // block, 0)
    max_blocks_session = np.zeros(n_sessions, dtype=np.int64)
    np.maximum.at(max_blocks_session, session_r, nblocks)
    session_base = sys_base[-1] + np.concatenate([[0], np.cumsum(max_blocks_session)[:-1]])
    block_ptr = np.concatenate([[0], np.cumsum(nblocks)]).astype(np.int64)
    runs = np.stack([sys_full, sys_base[prompt_of_session[session_r]], session_base[session_r]], axis=1)

    return Requests(
        arrival_s=arrival,
        class_id=cls[order].astype(np.int32),
        prompt_tokens=prompt_r.astype(np.int64),
        output_tokens=output[order].astype(np.int64),
        acceptance=acceptance[order],
        block_ptr=block_ptr,
        block_runs=runs.astype(np.int64),
        block_tokens=block,
        session_id=session_r.astype(np.int64),
        class_names=tuple(classes),
    )


#: Added to ``Requests.source`` when a replayed trace carries no prefix hashes (Azure, BurstGPT).
NO_PREFIX_NOTE = "(no prefix information: cache figures are not meaningful)"


def trace_window(arrival_s: np.ndarray, n: int, start_s: float = 0.0, time_scale: float = 1.0):
    """Rows and arrival times of a trace replay: ``n`` requests from ``start_s``, at ``time_scale`` x the rate.

    Parameters
    ----------
    arrival_s : float64[m]
        Recorded arrival times, sorted, seconds from the trace's first request.
    n : int
        Requests wanted (all that remain after ``start_s`` if fewer).
    start_s : float
        Skip to the first request at or after this recorded time, s (the trace's own clock, before scaling).
    time_scale : float
        Replay at this multiple of the recorded request rate (> 0): gaps are divided by it.

    Returns
    -------
    first : int
        Index of the first request replayed.
    count : int
        Requests replayed (``first:first + count``).
    arrival : float64[count]
        Replayed arrival times, s, the first at 0.

    Examples
    --------
    >>> trace_window(np.array([0.0, 1.0, 3.0, 7.0]), 2, start_s=0.5, time_scale=2.0)
    (1, 2, array([0., 1.]))
    """
    if not time_scale > 0:
        raise ValueError(f"workload.trace_time_scale must be > 0, got {time_scale!r}")
    if not start_s >= 0:
        raise ValueError(f"workload.trace_start_s must be >= 0, got {start_s!r}")
    first = int(np.searchsorted(arrival_s, start_s, side="left"))
    if first >= len(arrival_s):
        raise ValueError(
            f"workload.trace_start_s = {start_s:g} s is after the trace's last request, which arrives "
            f"{float(arrival_s[-1]):g} s after its first; expected a start in [0, {float(arrival_s[-1]):g}]"
        )
    count = min(int(n), len(arrival_s) - first)
    arrival = (arrival_s[first:first + count] - arrival_s[first]) / float(time_scale)
    return first, count, arrival.astype(np.float64)


def from_trace(trace, params: dict, classes: tuple, n: int, rng: np.random.Generator) -> Requests:
    """Requests from a replayed trace: ``n`` records (all that remain if fewer), windowed and time-scaled.

    ``workload.trace_start_s`` skips to the first record at or after that time of the trace's own clock;
    ``workload.trace_time_scale`` = k replays at k x the recorded rate (arrival gaps divided by k; lengths and
    order unchanged). Classes (for acceptance and expert skew) are assigned at random by their shares, since
    traces do not carry them. A trace without prefix hashes (Azure, BurstGPT) has no cacheable blocks: its
    reuse cannot be known, so its cache hit rate is 0 by construction, and ``source`` says so
    (:data:`NO_PREFIX_NOTE`).
    """
    start_s = float(params["workload.trace_start_s"])
    time_scale = float(params["workload.trace_time_scale"])
    try:
        first, m, arrival = trace_window(trace.arrival_s, n, start_s, time_scale)
    except ValueError as err:
        # The CLI prints a ScenarioError in one line; the trace's name says which replay failed.
        raise ScenarioError(trace.source.split(";")[0], "", str(err)) from None
    shares = _class_values(params, classes, "share")
    cls = rng.choice(len(classes), size=m, p=shares / shares.sum()).astype(np.int32)
    acceptance = np.clip(_per_class_sample(params, classes, "acceptance", cls, rng), 0.0, 1.0)
    ptr = trace.block_ptr[first: first + m + 1].astype(np.int64)
    hashes = trace.block_hashes[ptr[0]: ptr[-1]]
    block_tokens = trace.block_tokens or int(params["cache.block_tokens"])
    prompt = trace.prompt_tokens[first: first + m].astype(np.int64)
    if trace.block_tokens:
        # A trace's last hashed block may be partial; only whole blocks are cacheable.
        whole = prompt // block_tokens
        counts = np.diff(ptr)
        take = np.minimum(counts, whole)
        keep_mask = (np.arange(len(hashes)) - np.repeat(ptr[:-1] - ptr[0], counts)) < np.repeat(take, counts)
        hashes = hashes[keep_mask]
        ptr = np.concatenate([[0], np.cumsum(take)]).astype(np.int64)
    else:
        ptr = ptr - ptr[0]
    source = trace.source
    if first:
        source += f"; from {float(trace.arrival_s[first]):g} s of the trace"
    if time_scale != 1.0:
        source += f"; replayed at {time_scale:g}x the recorded rate"
    if not trace.block_tokens:
        source += f" {NO_PREFIX_NOTE}"
    return Requests(
        arrival_s=arrival,
        class_id=cls,
        prompt_tokens=prompt,
        output_tokens=np.maximum(trace.output_tokens[first: first + m].astype(np.int64), 1),
        acceptance=acceptance,
        block_ptr=ptr,
        block_ids=hashes.astype(np.int64),
        block_tokens=int(block_tokens),
        session_id=np.full(m, -1, dtype=np.int64),
        class_names=tuple(classes),
        source=source,
    )


def resolve_trace_path(value: str, base_dir: Path | None) -> Path:
    """``bundled:NAME`` -> the packaged trace; a relative path -> relative to the scenario file."""
    if value.startswith("bundled:"):
        return traces.bundled_trace_path(value.split(":", 1)[1])
    p = Path(value)
    if not p.is_absolute() and base_dir is not None:
        p = base_dir / p
    return p

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

The generator is a stream (:class:`RequestStream`): a sample's requests come chunk by chunk, with the sessions in
flight and every random stream carried over, and the chunks joined are the sample whatever their sizes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mcsim.kernels.workload import (COL_CLASS, COL_NBLOCKS, COL_OUTPUT, COL_OWN_BASE, COL_PROMPT, COL_SESSION,
                                    COL_SYS_FULL, N_INT_COLUMNS, fill_block_ids, merge_rows, session_rows)
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

    def head(self, stop: int, copy: bool = False) -> "Requests":
        """Requests ``:stop``: views of these arrays, or copies with ``copy`` (which do not keep these alive)."""
        ptr = self.block_ptr[:stop + 1]
        cut = np.copy if copy else (lambda a: a)
        return Requests(
            arrival_s=cut(self.arrival_s[:stop]), class_id=cut(self.class_id[:stop]),
            prompt_tokens=cut(self.prompt_tokens[:stop]), output_tokens=cut(self.output_tokens[:stop]),
            acceptance=cut(self.acceptance[:stop]), block_ptr=cut(ptr), block_tokens=self.block_tokens,
            session_id=cut(self.session_id[:stop]), class_names=self.class_names, source=self.source,
            block_runs=None if self.block_runs is None else cut(self.block_runs[:stop]),
            block_ids=None if self._block_ids is None else cut(self._block_ids[:ptr[-1]]))

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


class Summed:
    """The sum and count of a per-request integer field, read as an array is read for its ``sum()`` and ``mean()``
    (the integer sum over the count: what NumPy gives for integers below 2**53)."""

    def __init__(self, total: int, n: int):
        self.total, self.n = int(total), int(n)

    def sum(self) -> int:
        return self.total

    def mean(self) -> float:
        return self.total / self.n if self.n else math.nan


@dataclass(frozen=True)
class RequestTotals:
    """What the step model and the memory projection read of a sample's measured requests (means and sums of
    their lengths), from the integer sums of a streamed sample instead of its arrays."""

    n: int
    prompt_tokens: Summed
    output_tokens: Summed
    block_tokens: int
    class_names: tuple


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
        with np.errstate(over="ignore"):
            overflows = not np.isfinite(profile.mean())
        if overflows:  # the mean of [1e308, 1e308] overflows: to at most 1 first
            profile = profile / profile.max()
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


def profile_period_s(p: dict) -> float:
    """The period of a sample's rate profile, s, or 0 for a constant rate: what the steady-state checks compare
    like with like over (:func:`mcsim.stages.steady_state.time_windows`)."""
    return float(p["workload.rate_profile_period_s"]) if len(p["workload.rate_profile"]) else 0.0


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
    """Generate ``n`` requests for one sample (see module docstring): the one chunk of a :class:`RequestStream`.

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
    stream = RequestStream(params, classes, n, rng, max_context)
    # Generated a cache-sized piece at a time (several times faster than one pass over n-long arrays), then joined.
    return concat_requests([stream.next_chunk(GENERATE_PIECE) for _ in range(-(-n // GENERATE_PIECE))] or
                           [stream.next_chunk(0)])


#: Requests :func:`generate` draws at a time.
GENERATE_PIECE = 1 << 16


def concat_requests(parts: list) -> "Requests":
    """One :class:`Requests` of consecutive chunks (of one stream: the same classes and blocks)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    counts = np.concatenate([np.diff(q.block_ptr) for q in parts])
    ids = None
    if any(q.block_runs is None for q in parts):
        ids = np.concatenate([q.block_ids for q in parts])
    return Requests(
        arrival_s=np.concatenate([q.arrival_s for q in parts]),
        class_id=np.concatenate([q.class_id for q in parts]),
        prompt_tokens=np.concatenate([q.prompt_tokens for q in parts]),
        output_tokens=np.concatenate([q.output_tokens for q in parts]),
        acceptance=np.concatenate([q.acceptance for q in parts]),
        block_ptr=np.concatenate([[0], np.cumsum(counts)]).astype(np.int64),
        block_tokens=first.block_tokens, session_id=np.concatenate([q.session_id for q in parts]),
        class_names=first.class_names, source=first.source, block_ids=ids,
        block_runs=None if ids is not None else np.concatenate([q.block_runs for q in parts]))


#: The generator's random streams, each consumed in the order of its sessions, turns or requests (and one of each
#: per-class stream per class), so that the requests do not depend on how they are cut into chunks.
STREAMS = ("system_prompt_tokens", "session_class", "turns", "uses_system_prompt", "system_prompt", "session_start",
           "think_time", "arrival")
PER_CLASS_STREAMS = ("prompt_tokens", "output_tokens", "acceptance")

#: Sessions the stream generates at a time (at least; more when a chunk needs them).
SESSION_BLOCK = 4096


class RequestStream:
    """The generator's requests in arrival order, chunk by chunk (see module docstring).

    Sessions are generated in start order, a block at a time; their turns wait in a pending pool until no later
    session can start before them (a session's turns come at or after its start), and leave it in time order. Every
    random stream is drawn in the order of its own sessions, turns or requests (:data:`STREAMS`), block ids are
    given to sessions as they are generated, and sums run in the same order whatever the chunks: the requests of
    ``next_chunk(a)`` then ``next_chunk(b)`` are those of ``next_chunk(a + b)``. The state carried from chunk to
    chunk is the pending turns (sessions in flight), the streams and the running sums of start and arrival times.

    Parameters
    ----------
    params, classes, n, rng, max_context
        As :func:`generate`; ``n`` is the sample's number of requests (it sets the lead-in, see
        :func:`_lead_in_s`), ``rng`` is split into the streams at construction.
    """

    def __init__(self, params: dict, classes: tuple, n: int, rng: np.random.Generator, max_context: int):
        self.params, self.classes, self.n, self.max_context = params, tuple(classes), int(n), int(max_context)
        self.block = int(params["cache.block_tokens"])
        shares = _class_values(params, classes, "share")
        shares = shares / shares.sum()
        self.mean_turns = _class_values(params, classes, "turns")
        self.sys_share = _class_values(params, classes, "system_prompt_share")
        session_shares = shares / self.mean_turns
        self.session_shares = session_shares / session_shares.sum()
        self.mean_turns_all = 1.0 / np.sum(shares / self.mean_turns)
        self.session_rate = params["workload.rate_rps"] / self.mean_turns_all
        self.profile = RateProfile.from_params(params)
        self.lead_s = _lead_in_s(params["workload.think_time_s"], float(self.mean_turns.max()),
                                 params["workload.rate_rps"], n, self.profile)
        streams = rng.spawn(len(STREAMS) + len(PER_CLASS_STREAMS) * len(self.classes))
        self.rng = dict(zip(STREAMS, streams))
        self.class_rng = {key: streams[len(STREAMS) + i * len(self.classes):][:len(self.classes)]
                          for i, key in enumerate(PER_CLASS_STREAMS)}
        # System prompts: a Zipf-popular pool, lengths drawn once per prompt.
        n_prompts = int(params["workload.system_prompts"])
        self.n_prompts = n_prompts
        self.prompt_len = _tokens(params["workload.system_prompt_tokens"].sample(self.rng["system_prompt_tokens"],
                                                                                  n_prompts))
        self.zipf = zipf_probabilities(n_prompts, params["workload.system_prompt_zipf"])
        self.sys_base = np.concatenate([[0], np.cumsum(self.prompt_len // self.block)])
        self.sessions = 0  # generated so far
        self.next_base = int(self.sys_base[-1])  # the next session's first block id
        self.start_sum = 0.0  # running sum of the sessions' start gaps (operational seconds)
        self.horizon = -np.inf  # no turn generated later can come before it
        # Turns generated, not yet handed out (from pending_at on), by time then generation: times, acceptance
        # and the integer columns of kernels.workload (COL_*).
        self.pending_t, self.pending_acceptance = np.zeros(0), np.zeros(0)
        self.pending_int = np.zeros((0, N_INT_COLUMNS), dtype=np.int64)
        self.pending_at = 0
        self.arrival_sum = None  # running sum of the arrival gaps; None before the first arrival
        self.arrival_first = 0.0
        self.emitted = 0

    def _generate_sessions(self, m: int) -> None:
        """Generate the next ``m`` sessions and add their turns to the pending pool.

        The draws come from the streams in their own order (NumPy's samplers); one kernel
        (:func:`mcsim.kernels.workload.session_rows`) turns them into rows, and another merges those, sorted by
        time, into the pool.
        """
        p, classes, rng = self.params, self.classes, self.rng
        session_class = rng["session_class"].choice(len(classes), size=m, p=self.session_shares)
        turns = rng["turns"].geometric(1.0 / self.mean_turns[session_class]).astype(np.int64)
        uses_prompt = rng["uses_system_prompt"].random(m) < self.sys_share[session_class]
        prompt_of_session = rng["system_prompt"].choice(self.n_prompts, size=m, p=self.zipf)
        sys_len = np.where(uses_prompt, self.prompt_len[prompt_of_session], 0).astype(np.int64)
        rows = int(turns.sum())
        # Each class's per-turn fields come from its own streams, in the order of its turns.
        per_class = np.bincount(session_class, weights=turns, minlength=len(classes)).astype(np.int64)
        class_first = np.concatenate([[0], np.cumsum(per_class)[:-1]]).astype(np.int64)
        draws = [self._per_class(key, per_class) for key in PER_CLASS_STREAMS]

        # Virtual times: sessions start as a Poisson process, turns follow after exponential think times. Sessions
        # start from -lead_s, and the window takes the turns from time 0 on, so it opens on the steady mix of first
        # and later turns instead of a ramp of first turns (a cold cache is still cold: mc.warmup_fraction covers
        # that). With a rate profile the starts (and lead_s) are operational times, mapped to wall-clock times as
        # the arrivals are, and the think times are wall-clock seconds.
        gaps = rng["session_start"].exponential(1.0 / self.session_rate, m)
        sums = np.cumsum(np.concatenate([[self.start_sum], gaps]))[1:]  # the running sum, in one order
        self.start_sum = float(sums[-1])
        start = sums - self.lead_s
        if self.profile is not None:
            start = self.profile.wall(start)
        think = rng["think_time"].exponential(p["workload.think_time_s"], rows)

        new_t, new_acceptance = np.empty(rows), np.empty(rows)
        new_int = np.empty((rows, N_INT_COLUMNS), dtype=np.int64)
        kept, self.next_base = session_rows(
            session_class.astype(np.int64), turns, sys_len,
            np.ascontiguousarray(self.sys_base[prompt_of_session], dtype=np.int64), class_first, *draws,
            np.ascontiguousarray(start, dtype=np.float64), think, self.max_context, self.block, self.lead_s > 0,
            self.sessions, self.next_base, new_t, new_acceptance, new_int)
        self.sessions += m
        self.horizon = float(start[-1])
        # Kept in time order (ties in generation order): merged, not sorted again at every chunk.
        order = np.argsort(new_t[:kept], kind="stable")
        total = len(self.pending_t) - self.pending_at + kept
        merged_t, merged_acceptance = np.empty(total), np.empty(total)
        merged_int = np.empty((total, N_INT_COLUMNS), dtype=np.int64)
        merge_rows(self.pending_t, self.pending_acceptance, self.pending_int, self.pending_at, new_t, new_acceptance,
                   new_int, order, merged_t, merged_acceptance, merged_int)
        self.pending_t, self.pending_acceptance, self.pending_int = merged_t, merged_acceptance, merged_int
        self.pending_at = 0

    def _per_class(self, key: str, per_class: np.ndarray) -> np.ndarray:
        """The per-turn field ``key``: for each class, the next ``per_class[c]`` values of its own stream, class
        after class."""
        return np.concatenate([
            np.asarray(self.params[f"workload.classes.{name}.{key}"].sample(self.class_rng[key][c], int(count)),
                       dtype=np.float64)
            for c, (name, count) in enumerate(zip(self.classes, per_class))] + [np.zeros(0)])

    def _ready(self) -> int:
        pending = self.pending_t[self.pending_at:]
        return int(np.searchsorted(pending, self.horizon, side="left"))

    def _arrivals(self, m: int) -> np.ndarray:
        """The next ``m`` arrival times (:func:`profiled_arrivals`, continued)."""
        p = self.params
        rng = self.rng["arrival"]
        rate = p["workload.rate_rps"]
        if p["workload.arrivals"] == "poisson":
            gaps = rng.exponential(1.0 / rate, m)
        else:
            gaps = rng.gamma(1.0 / p["workload.burstiness"], p["workload.burstiness"] / rate, m)
        if self.arrival_sum is None:  # the first arrival is at 0
            self.arrival_first = float(gaps[0])
            sums = np.cumsum(gaps)
        else:
            sums = np.cumsum(np.concatenate([[self.arrival_sum], gaps]))[1:]
        self.arrival_sum = float(sums[-1])
        t = sums - self.arrival_first
        if self.profile is None:
            return t
        return self.profile.wall(t) - self.profile.wall(0.0)

    @property
    def remaining(self) -> int:
        """Requests of the sample not yet handed out."""
        return self.n - self.emitted

    def next_chunk(self, m: int) -> Requests:
        """The next ``min(m, remaining)`` requests, in arrival order, block pointers from 0."""
        m = max(min(int(m), self.remaining), 0)
        while self._ready() < m:
            lead = max(self.lead_s * self.session_rate - self.sessions, 0.0)  # sessions before the window
            self._generate_sessions(max(SESSION_BLOCK, int(1.25 * (m - self._ready()) / self.mean_turns_all + lead)))
        a = self.pending_at
        self.pending_at = a + m
        ints = self.pending_int[a:a + m]
        self.emitted += m
        return Requests(
            arrival_s=self._arrivals(m) if m else np.zeros(0),
            class_id=ints[:, COL_CLASS].astype(np.int32),
            prompt_tokens=ints[:, COL_PROMPT].copy(),
            output_tokens=ints[:, COL_OUTPUT].copy(),
            acceptance=self.pending_acceptance[a:a + m].copy(),
            block_ptr=np.concatenate([[0], np.cumsum(ints[:, COL_NBLOCKS])]).astype(np.int64),
            block_runs=ints[:, COL_SYS_FULL:COL_OWN_BASE + 1].copy(),
            block_tokens=self.block,
            session_id=ints[:, COL_SESSION].copy(),
            class_names=self.classes,
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

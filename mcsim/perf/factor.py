"""Stage 5: one step-time model behind one interface, and the factor fidelity's implementation of it.

A fidelity prices a sample's steps as a :class:`StepModel`: the time of one step of an instance, for any mix of
decode sequences and prefill tokens, with its breakdown; the memory projection of each pool; the tokens a
sequence gains per pass. :mod:`mcsim.perf.fleet` turns that one model into the operating batch, the fleet, the
latencies (through the batching simulator, which interpolates a table of the same step times) and the figures
cost is charged from, so throughput, cost and latency cannot describe different batches.

Factor fidelity: decode throughput per GPU at a batch of ``b`` sequences per GPU follows the weight-streaming
roofline shape

    X(b) = X_sat * b / (b + b_half)

where ``X_sat`` is the saturated (b -> infinity) throughput and ``b_half = weight-read time / per-sequence time``.
``X_sat`` is the BF16, unoptimised ``efficiency.base_decode_tok_s_per_gpu`` times one factor per lever that is on:
low precision, fused kernels, communication overlap, the expert factor (from the drawn rank loads) and, when
prefill and decode share GPUs, the loss to their interference; speculative decoding divides the pass by its cost
and multiplies the tokens per pass by the drawn gain. A factor-mode step is what makes that throughput at that
batch: a step of ``d`` decode sequences and ``q`` prefill tokens on an instance of ``g`` GPUs costs

    t(d, q) = cost x (d / g + b_half) / X_nospec + q / (g x X_prefill)

(the weights are read once, by the decode part, whatever the mix). These factors overlap in reality; the model
multiplies them, which is its central simplification. Both fidelities share one memory projection
(:func:`mcsim.perf.capacity.memory_projection`: sharded weights, paged KV, activations, the prefix cache's HBM) for
both pools.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from mcsim.perf.capacity import memory_projection, tp_degrees
from mcsim.perf.hardware import as_hardware
from mcsim.perf.params import Params
from mcsim.perf.roofline import Parallelism, Precision
from mcsim.scenario import catalog
from mcsim.scenario.choices import instance_gpus
from mcsim.scenario.schema import TIER_SHORT_FORM
from mcsim.stages.kvcache import first_tier_gb_per_instance
from mcsim.stages.speculative import pass_cost

BF16_BYTES = 2.0


def static_slot_utilization(output_tokens: np.ndarray, batch: int) -> float:
    """Useful fraction of decode slots when consecutive groups of ``batch`` requests run until their longest ends.

    Sum of output tokens / sum over batches of (batch size x longest output in the batch).
    """
    batch = max(int(batch), 1)
    n = len(output_tokens)
    if n == 0:
        return 1.0
    full = (n // batch) * batch
    longest = output_tokens[:full].reshape(-1, batch).max(axis=1).sum() * batch if full else 0
    if full < n:
        longest += output_tokens[full:].max() * (n - full)
    return float(output_tokens.sum() / longest)


#: Sections the step model reads whole (the deployment it prices), and the keys of other stages' sections it reads
#: besides: the speculative pass's costs, the experts' ranks and FFN share, the cache's HBM reservation.
STEP_SECTIONS = ("model.", "hardware.", "deployment.", "precision.", "efficiency.", "performance.")
STEP_OTHER_KEYS = ("speculative.enabled", "speculative.draft_tokens", "speculative.draft_cost",
                   "speculative.verify_cost", "moe.ep_ranks", "moe.ffn_time_fraction", "cache.enabled",
                   *TIER_SHORT_FORM)


def step_reads(path: str) -> bool:
    """Whether the step model (either fidelity, with its memory projection) reads the dotted ``path``: its
    declared inputs, :data:`STEP_SECTIONS` and :data:`STEP_OTHER_KEYS`, and the ``[[cache.tiers]]`` keys."""
    return path.startswith(STEP_SECTIONS) or path in STEP_OTHER_KEYS or path.startswith("cache.tiers")


def step_inputs(p) -> Params:
    """The step model's declared inputs (:func:`step_reads`) of a sample's parameters: read-only and hashable
    (a memo key); reading any other key is an error that says so.

    Examples
    --------
    >>> step = step_inputs({"deployment.tp": 8, "economics.gpu_hour_usd": 2.5, "speculative.draft_cost": 0.1})
    >>> sorted(step)
    ['deployment.tp', 'speculative.draft_cost']
    """
    return Params(sorted((k, v) for k, v in p.items() if step_reads(k)), declared_by="mcsim.perf.factor.step_reads")


def expert_factor(expert_efficiency: float, ffn_time_fraction: float) -> float:
    """Decode speed factor when the MoE FFN part of a step waits for the slowest rank (Amdahl)."""
    return 1.0 / ((1.0 - ffn_time_fraction) + ffn_time_fraction / expert_efficiency)


def _model(p: dict) -> dict:
    return {k.split(".", 1)[1]: v for k, v in p.items() if k.startswith("model.")}


def kv_bytes(p: dict) -> float:
    """KV bytes per token of the sample's model at its KV precision."""
    dtype = p["precision.kv_bytes"] if p["precision.enabled"] else BF16_BYTES
    return catalog.kv_bytes_per_token(_model(p), dtype)


def tokens_per_pass(requests, passes) -> float:
    """Raw output tokens per verification pass of the trace (1 without speculation)."""
    return 1.0 if passes is None else float(requests.output_tokens.sum()) / float(passes.sum())


def mean_contexts(requests) -> tuple[float, float]:
    """Mean decode context (prompt + half the output) and mean attended prefix of a prefill token."""
    return (float(requests.prompt_tokens.mean() + requests.output_tokens.mean() / 2.0),
            float(requests.prompt_tokens.mean() / 2.0))


# -- the layout and memory of each pool (shared by both fidelities) ------------------------------------------

def parallelism(p: dict, *, prefill: bool = False):
    """Layout of one instance of a pool: tp x pp x attention-DP GPUs, experts over EP ranks."""
    disagg = p["deployment.disaggregated"]
    gpus = instance_gpus(p, prefill=prefill and disagg)
    tp = p["deployment.prefill_tp"] if (prefill and disagg) else p["deployment.tp"]
    pp = 1 if (prefill and disagg) else p["deployment.pp"]
    if gpus % (tp * pp):
        raise ValueError(f"gpus per instance ({gpus}) must be a multiple of tp x pp ({tp} x {pp})")
    dp = gpus // (tp * pp)
    ep = 1
    if p["model.experts"] > 0:
        ep = tp * dp if (prefill or not p["moe.ep_ranks"]) else p["moe.ep_ranks"]
    return Parallelism(tp=tp, ep=ep, pp=pp, attention_dp=dp)


def precision(p: dict):
    """Number formats of the sample (BF16 everywhere when the low-precision lever is off)."""
    on = p["precision.enabled"]
    return Precision(weight_bytes=p["precision.weight_bytes"] if on else BF16_BYTES,
                     kv_bytes=p["precision.kv_bytes"] if on else BF16_BYTES,
                     compute=p["precision.compute"] if on else "bf16",
                     activation_bytes=p["precision.activation_bytes"],
                     linear=p.get("precision.linear", "") if on else "",
                     experts=p.get("precision.experts", "") if on else "",
                     expert_weight_bytes=p.get("precision.expert_weight_bytes", 0.0) if on else 0.0)


def pool_memory(p: dict, requests, *, prefill: bool = False):
    """HBM projection of one instance of the decode (or colocated) pool, or of the prefill pool.

    The decode pool holds sequences of the mean decode context; the prefill pool holds the prompts it is
    computing (mean prompt length). The prefix cache's HBM counts on the pool that serves prefill: the prefill
    pool when disaggregated, the one pool otherwise.
    """
    disagg = bool(p["deployment.disaggregated"])
    layout = parallelism(p, prefill=prefill)
    decode_context, _ = mean_contexts(requests)
    context = float(requests.prompt_tokens.mean()) if (prefill and disagg) else decode_context
    holds_cache = p["cache.enabled"] and (prefill or not disagg)
    reserved = first_tier_gb_per_instance(p) / layout.gpus if holds_cache else 0.0
    return memory_projection(
        _model(p), as_hardware(p), precision=precision(p), parallel=layout,
        block_tokens=requests.block_tokens, context=context, memory_fraction=p["deployment.memory_fraction"],
        activation_gb=p["deployment.activation_gb_per_gpu"], reserved_gb=reserved,
        include_mtp=bool(p["speculative.enabled"] and p.get("model.mtp_layers", 0)) and not (prefill and disagg))


#: Bytes per weight or KV element a sample could drop to in order to fit (FP8, FP4), besides its own.
LOWER_PRECISION_BYTES = (1.0, 0.5)


def _fits_every_pool(p, requests) -> bool:
    disagg = bool(p["deployment.disaggregated"])
    try:
        return pool_memory(p, requests).fits and (not disagg or pool_memory(p, requests, prefill=True).fits)
    except ValueError:  # a layout the experts' ranks cannot take (mcsim.perf.roofline._check_parallel)
        return False


def smallest_fitting_tp(p, requests, *, prefill: bool = False) -> float:
    """The smallest tensor-parallel degree of a pool at which its weights and one sequence's KV fit, asked of the
    memory projection (:func:`pool_memory`) at every degree the instance can take
    (:func:`mcsim.perf.capacity.tp_degrees`) with the sample's other settings; NaN when none fits.

    ``prefill``: the prefill pool's ``deployment.prefill_tp`` (disaggregated only), else ``deployment.tp``.
    """
    prefill = prefill and bool(p["deployment.disaggregated"])
    key = "deployment.prefill_tp" if prefill else "deployment.tp"
    gpus = p["deployment.prefill_gpus_per_instance"] if prefill else p["deployment.gpus_per_instance"]
    pp = 1 if prefill else p["deployment.pp"]
    for tp in tp_degrees(_model(p), gpus, pp):
        try:
            if pool_memory({**p, key: tp}, requests, prefill=prefill).fits:
                return float(tp)
        except ValueError:  # a layout the experts' ranks cannot take
            continue
    return math.nan


def most_bytes_that_fit(p, requests, *, kv: bool = False) -> float:
    """The most bytes per weight (``kv``: per KV element), of the sample's own and
    :data:`LOWER_PRECISION_BYTES` below it, at which every pool's weights and one sequence's KV fit at the sample's
    layout and its other format; NaN when none does."""
    own = precision(p)
    mine = own.kv_bytes if kv else own.weight_bytes
    for candidate in (mine, *(b for b in LOWER_PRECISION_BYTES if b < mine)):
        formats = {"precision.enabled": True, "precision.weight_bytes": own.weight_bytes,
                   "precision.kv_bytes": own.kv_bytes}
        formats["precision.kv_bytes" if kv else "precision.weight_bytes"] = candidate
        if _fits_every_pool({**p, **formats}, requests):
            return float(candidate)
    return math.nan


def longest_context(memory, block_tokens: int) -> float:
    """Tokens of the longest context (whole blocks) whose one sequence's KV fits the HBM a projection leaves
    after weights; 0 when the weights do not fit."""
    per_block = memory.kv_bytes_per_token_per_gpu * block_tokens
    if memory.free_kv_bytes <= 0:
        return 0.0
    return math.inf if per_block <= 0 else float(math.floor(memory.free_kv_bytes / per_block) * block_tokens)


def memory_figures(p, requests) -> dict:
    """The memory projection of each pool as registered outputs (:mod:`mcsim.results.variables`, GB per GPU), and
    what would make it fit: the smallest tensor-parallel degree of each pool, the most bytes per weight and per
    KV element, the longest context. The prefill pool's figures are NaN when colocated (one pool)."""
    decode = pool_memory(p, requests)
    disagg = bool(p["deployment.disaggregated"])
    prefill = pool_memory(p, requests, prefill=True) if disagg else None
    gb = 1e9
    nan = math.nan
    return {
        "hbm_gb_per_gpu": as_hardware(p).hbm_bytes / gb,
        "weights_gb_per_gpu": decode.weights_per_gpu / gb,
        "hbm_usable_gb_per_gpu": (decode.weights_per_gpu + decode.free_kv_bytes) / gb,
        "kv_gb_per_sequence": decode.kv_bytes_per_sequence / gb,
        "smallest_fitting_tp": smallest_fitting_tp(p, requests),
        "prefill_weights_gb_per_gpu": prefill.weights_per_gpu / gb if disagg else nan,
        "prefill_hbm_usable_gb_per_gpu": (prefill.weights_per_gpu + prefill.free_kv_bytes) / gb if disagg else nan,
        "prefill_kv_gb_per_sequence": prefill.kv_bytes_per_sequence / gb if disagg else nan,
        "smallest_fitting_prefill_tp": smallest_fitting_tp(p, requests, prefill=True) if disagg else nan,
        "longest_context_by_memory": min(longest_context(m, requests.block_tokens)
                                         for m in (decode, prefill) if m is not None),
        "weight_bytes_that_fit": most_bytes_that_fit(p, requests),
        "kv_bytes_that_fit": most_bytes_that_fit(p, requests, kv=True),
    }


# -- the interface -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class StepTime:
    """Seconds of one step of one instance, and where they go.

    Attributes
    ----------
    total_s : float
        The step, s.
    ops : dict
        Name -> ``{"t", "flops", "bytes", "floor", "bound"}`` per GPU for the whole step (``floor``: the kernels'
        fixed time inside ``t``; NaN where the fidelity does not count them; ``bound`` is "compute", "memory", "network", "overhead" or, in factor
        mode, "factor").
    """

    total_s: float
    ops: dict = field(default_factory=dict)

    @property
    def parts(self) -> dict:
        """Name -> seconds of each op; they add up to ``total_s`` (roofline: one entry per op and collective,
        exposed communication only; factor: weight read, decode sequences, prefill tokens)."""
        return {name: op["t"] for name, op in self.ops.items()}


class StepModel:
    """One fidelity's price of one sample's steps (see the module docstring).

    Attributes
    ----------
    fidelity : str
    decode_gpus, prefill_gpus : int
        GPUs of one instance of the decode (or colocated) pool and of the prefill pool (equal when colocated).
    tokens_per_pass : float
        Output tokens a sequence gains per verification pass, as drawn (1 without speculation).
    verify_tokens : int
        Tokens a decoding sequence runs per pass (k + 1 with k drafts).
    hardware : mcsim.perf.hardware.Hardware
        The sample's accelerator.
    decode_memory, prefill_memory : mcsim.perf.roofline.Memory
        HBM projections of one instance of each pool.
    memory_figures : dict
        Those projections and what would make them fit, as registered outputs (:func:`memory_figures`).
    prefill_budget : float
        Prefill tokens of one full prefill step of one prefill instance (every attention-DP group fills its own
        token budget).
    decode_context, prefill_context : float
        The sample's mean decode context and mean attended prefix of a prefill token, tokens.
    """

    fidelity = ""

    def __init__(self, p: dict, requests, passes):
        self.hardware = as_hardware(p)
        self.disaggregated = bool(p["deployment.disaggregated"])
        self.decode_gpus = instance_gpus(p)
        self.prefill_gpus = instance_gpus(p, prefill=True) if self.disaggregated \
            else self.decode_gpus
        self.draft_tokens = int(p["speculative.draft_tokens"]) if passes is not None else 0
        self.verify_tokens = self.draft_tokens + 1
        self.tokens_per_pass = tokens_per_pass(requests, passes)
        self.decode_context, self.prefill_context = mean_contexts(requests)
        self.decode_memory = pool_memory(p, requests)
        self.prefill_memory = pool_memory(p, requests, prefill=True) if self.disaggregated else self.decode_memory
        self.memory_figures = memory_figures(p, requests)
        layout = parallelism(p, prefill=True)
        self.prefill_budget = float(p["performance.token_budget"]) * layout.attention_dp
        self._memo: dict = {}

    # Implementations define _step(decode_seqs, decode_context, prefill_tokens, prefill_context, prefill_pool)
    # returning a StepTime, and _plain(decode_seqs) (a one-token decode step without drafting, s).

    def step_time(self, decode_seqs: float, decode_context_lengths=None, prefill_tokens: float = 0.0,
                  prefill_context: float | None = None, *, pool: str = "decode") -> StepTime:
        """One step of one instance of ``pool`` ("decode": the decode or colocated pool; "prefill").

        Parameters
        ----------
        decode_seqs : float
            Decoding sequences in the step; each runs ``verify_tokens`` tokens (and the draft model its drafts).
        decode_context_lengths : float or array_like, optional
            The KV length of each decoding sequence (an array of ``decode_seqs`` values) or their mean; default
            the sample's mean decode context. Attention cost is linear in the summed lengths.
        prefill_tokens : float
            New prompt tokens computed in the step.
        prefill_context : float, optional
            Mean earlier tokens a prefill token attends to; default the sample's mean.
        """
        if decode_context_lengths is None:
            context = self.decode_context
        else:
            lengths = np.asarray(decode_context_lengths, dtype=float)
            context = float(lengths.mean()) if lengths.size else 0.0
        pctx = self.prefill_context if prefill_context is None else float(prefill_context)
        return self._step(float(decode_seqs), context, float(prefill_tokens), pctx, pool == "prefill")

    def seconds(self, decode_seqs: float, prefill_tokens: float = 0.0, *, pool: str = "decode",
                decode_context: float | None = None) -> float:
        """:meth:`step_time` at the sample's mean contexts (or a given decode context), memoised: what tables
        and solvers call."""
        context = self.decode_context if decode_context is None else float(decode_context)
        key = (round(float(decode_seqs), 6), round(float(prefill_tokens), 6), pool, round(context, 6))
        if key not in self._memo:
            if decode_seqs <= 0 and prefill_tokens <= 0:
                self._memo[key] = 0.0
            else:
                self._memo[key] = self.step_time(decode_seqs, context, prefill_tokens, None, pool=pool).total_s
        return self._memo[key]

    def kv_slope(self, decode_seqs: float, *, pool: str = "decode") -> float:
        """Seconds one more KV token of one decoding sequence adds to a step of ``decode_seqs`` sequences: the
        secant of the step time between half and twice the mean decode context (0 when context costs nothing,
        as in the factor fidelity)."""
        if decode_seqs <= 0:
            return 0.0
        c = self.decode_context
        rise = self.seconds(decode_seqs, pool=pool, decode_context=2.0 * c) \
            - self.seconds(decode_seqs, pool=pool, decode_context=0.5 * c)
        return max(rise, 0.0) / (decode_seqs * 1.5 * c) if c > 0 else 0.0

    def pass_s(self, batch_per_gpu: float) -> float:
        """One verification pass of a decode instance at ``batch_per_gpu`` sequences per GPU, s."""
        return self.seconds(max(batch_per_gpu, 1e-9) * self.decode_gpus)

    def plain_pass_s(self, batch_per_gpu: float) -> float:
        """A one-token decode step without drafting at the same batch (the denominator of the realized gain)."""
        return self._plain(max(batch_per_gpu, 1e-9) * self.decode_gpus)

    def pass_overhead(self, batch_per_gpu: float) -> float:
        """A pass over a plain one-token decode step at the same batch: the cost of drafting and of verifying
        k+1 tokens (exactly 1 without speculation)."""
        if self.draft_tokens == 0:
            return 1.0
        return self.pass_s(batch_per_gpu) / self.plain_pass_s(batch_per_gpu)

    def prefill_tok_s_per_gpu(self) -> float:
        """Uncached prompt tokens per second per prefill GPU at full prefill steps."""
        return self.prefill_budget / self.seconds(0.0, self.prefill_budget, pool="prefill") / self.prefill_gpus

    def saturated_tok_s_per_gpu(self) -> float:
        """Decode tokens/s per GPU as the batch grows without bound (the denominator of ``batch_efficiency``)."""
        big = 4096.0
        return self.tokens_per_pass * big / self.pass_s(big)


class FactorStepModel(StepModel):
    """Factor fidelity: ``t(d, q) = cost x (d / g + b_half) / X_nospec + q / (g x X_prefill)``."""

    fidelity = "factor"

    def __init__(self, p: dict, requests, passes, expert_efficiency: float, bases: tuple):
        """``bases``: the (decode, prefill) base throughputs per GPU on the sample's hardware, BF16 with no lever on
        (:func:`mcsim.perf.roofline_model.factor_bases`: the stated ones carried from ``efficiency.base_hardware``,
        or the roofline's)."""
        super().__init__(p, requests, passes)
        decode_base, prefill_base = bases
        x = decode_base
        if p["precision.enabled"]:
            x *= p["precision.decode_gain"]
        if p["efficiency.fused_kernels"]:
            x *= p["efficiency.fused_kernel_gain"]
        if p["efficiency.comm_overlap"]:
            x *= p["efficiency.comm_overlap_gain"]
        if p["model.experts"] > 0:
            x *= expert_factor(expert_efficiency, p["moe.ffn_time_fraction"])
        if not self.disaggregated:
            x *= 1.0 - p["efficiency.colocated_interference"]
        self.x_nospec = x
        self.cost = pass_cost(self.draft_tokens, p["speculative.draft_cost"], p["speculative.verify_cost"])
        self.b_half = p["efficiency.batch_half_saturation"]
        self.x_prefill = prefill_base * (p["precision.prefill_gain"] if p["precision.enabled"] else 1.0)

    def _step(self, decode_seqs, decode_context, prefill_tokens, prefill_context, prefill_pool) -> StepTime:
        parts = {}
        gpus = self.prefill_gpus if prefill_pool else self.decode_gpus
        if decode_seqs > 0:
            parts["weights"] = self.cost * self.b_half / self.x_nospec
            parts["decode"] = self.cost * decode_seqs / gpus / self.x_nospec
        if prefill_tokens > 0:
            parts["prefill"] = prefill_tokens / (gpus * self.x_prefill)
        nan = float("nan")
        ops = {name: {"t": t, "flops": nan, "bytes": nan, "floor": nan, "bound": "factor"}
               for name, t in parts.items()}
        return StepTime(sum(parts.values()), ops)

    def _plain(self, decode_seqs) -> float:
        return (decode_seqs / self.decode_gpus + self.b_half) / self.x_nospec

    def pass_overhead(self, batch_per_gpu: float) -> float:
        return self.cost


def infeasible_reason(model: StepModel) -> str:
    """Why a sample cannot run at all ("ok" when it can): either pool's memory."""
    if not model.decode_memory.fits:
        return model.decode_memory.reason
    if not model.prefill_memory.fits:
        return "prefill pool: " + model.prefill_memory.reason
    return "ok"


def batch_limit_by_memory(memory, gpus_per_instance: int) -> float:
    """Sequences per decode GPU whose KV fits (0 when none does), from an instance's memory projection."""
    return memory.max_sequences / gpus_per_instance if memory.fits else 0.0

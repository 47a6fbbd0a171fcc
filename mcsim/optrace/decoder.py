"""Op-level trace of a real decoder forward pass, run in NumPy and recorded op by op.

A catalog model's shape (:func:`mcsim.scenario.catalog.model_preset`) is scaled down to fit a workstation
(:func:`scaled_shape`), filled with seeded random weights and run for real: a prefill pass over the
prompt, then one decode step per generated token against a KV cache. Every op (embedding lookup,
RMSNorm, Q/K/V projections with grouped-query attention, RoPE, KV-cache append, attention scores,
softmax, weighted sum, output projection, residual adds, SwiGLU FFN, final norm, LM head, sampling)
is executed and recorded as an :class:`OpRecord`.

Two kinds of figure live in a record and must not be confused:

- ``flops``, ``bytes_read`` and ``bytes_written`` come from exact formulas for the shapes actually
  run (a matmul of ``(m, k) @ (k, n)`` is ``2*m*k*n`` FLOPs and reads both operands once); they are
  *counted*, not measured, and do not depend on the machine;
- ``wall_s`` is *measured* with ``time.perf_counter`` around the op on this machine, after one
  warm-up pass (so page faults and BLAS thread start-up are not in it).

:mod:`mcsim.optrace.profiles` prices the counted figures on hardware profiles (roofline) without running
anything again; :mod:`mcsim.optrace.report` writes the trace and its estimates out.

Examples
--------
>>> trace = run_trace("llama-3.1-8b", prompt_tokens=8, decode_tokens=2, max_params=2e5)
>>> sorted({r.phase for r in trace.records})
['decode', 'prefill']
>>> len(trace.generated)
3
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from mcsim.optrace.profiles import runtime_environment
from mcsim.scenario import catalog

__all__ = ["LANES", "PHASES", "Decoder", "OpRecord", "Trace", "build_decoder", "decoder_param_count",
           "run_trace", "sample_cost", "scaled_shape"]

PHASES = ("prefill", "decode")
LANES = ("matmul", "attention", "vector", "memory", "sampling")
DTYPES = {"float32": np.float32, "float16": np.float16}
TOKEN_ID_BYTES = 8  # token ids are int64
RMS_EPS = 1e-5
ROPE_THETA = 500_000.0  # Llama-3's rotary base; any base exercises the same op


@dataclasses.dataclass(frozen=True)
class OpRecord:
    """One executed op.

    ``name`` is the op (``"q_proj"``, ``"attn_softmax"``, ...; the same in every layer); ``layer`` is
    0-based, -1 outside the layers (embedding, final norm, head, sampling); ``phase`` is ``"prefill"``
    or ``"decode"``; ``lane`` is ``"matmul"`` (weight GEMM/GEMV), ``"attention"`` (scores, softmax,
    weighted sum), ``"vector"`` (element-wise, norms), ``"memory"`` (look-ups, cache writes) or
    ``"sampling"``. ``flops`` (FLOP), ``bytes_read`` and ``bytes_written`` (bytes; each operand once)
    are counted from the shapes; ``wall_s`` (seconds) is measured on this machine. ``step`` is 0 for
    the prefill pass and ``i`` for the ``i``-th decode step.
    """

    name: str
    layer: int
    phase: str
    lane: str
    flops: float
    bytes_read: float
    bytes_written: float
    wall_s: float
    step: int = 0

    @property
    def bytes_total(self) -> float:
        """``bytes_read + bytes_written``, bytes."""
        return self.bytes_read + self.bytes_written

    def counted(self) -> tuple:
        """Every field except the measured ``wall_s`` (what two runs with one seed must share)."""
        return (self.name, self.layer, self.phase, self.lane, self.flops, self.bytes_read,
                self.bytes_written, self.step)


@dataclasses.dataclass
class Trace:
    """A recorded generation: the op records plus what is needed to read them.

    ``prefill_wall_s`` and ``decode_step_wall_s`` are measured end to end around the prefill pass and
    each decode step (op times plus the little Python between ops).
    """

    model_name: str
    shape: dict
    dtype: str
    seed: int
    temperature: float
    prompt: list[int]
    generated: list[int]
    records: list[OpRecord]
    prefill_wall_s: float
    decode_step_wall_s: list[float]
    environment: dict = dataclasses.field(default_factory=dict)

    prompt_tokens = property(lambda self: len(self.prompt), doc="Prompt length, tokens.")
    decode_tokens = property(lambda self: len(self.decode_step_wall_s), doc="Decode steps run.")
    decode_wall_s = property(lambda self: float(sum(self.decode_step_wall_s)), doc="Measured, s.")

    @property
    def measured_decode_tok_s(self) -> float:
        """Decode tokens per second of the NumPy decoder, measured on this machine."""
        return self.decode_tokens / self.decode_wall_s if self.decode_wall_s > 0 else float("nan")

    @property
    def measured_prefill_tok_s(self) -> float:
        """Prompt tokens per second of the prefill pass, measured on this machine."""
        return self.prompt_tokens / self.prefill_wall_s if self.prefill_wall_s > 0 else float("nan")


# --------------------------------------------------------------------------------------------------
# Shapes


def _source_shape(model: dict) -> tuple[dict, list[str]]:
    """The dense GQA decoder that stands in for a catalog model, and what that approximates."""
    notes = []
    layers = model["layers"]
    if model.get("attention", "gqa") == "mla":
        notes.append("MLA attention run as GQA with the config's kv_heads and head_dim (no latent KV)")
    if model.get("dense_layers", layers) < layers or model.get("dense_ffn", 0) == 0:
        width = (model["active_experts"] + model["shared_experts"]) * model["expert_ffn"]
        notes.append("MoE FFN run as one dense SwiGLU of the active width "
                     "((active + shared experts) x expert_ffn); no router")
    else:
        width = model["dense_ffn"]
    heads, kv_heads = model["attention_heads"], model["kv_heads"]
    if heads % kv_heads:
        raise ValueError(f"attention_heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    shape = {"layers": layers, "hidden_size": model["hidden_size"], "attention_heads": heads,
                 "kv_heads": kv_heads, "head_dim": model["head_dim"], "ffn": width, "vocab": model["vocab"]}
    return shape, notes


def decoder_param_count(shape: dict) -> int:
    """Weights of the decoder that :class:`Decoder` builds for ``shape`` (embedding and head untied)."""
    hidden, head_dim = shape["hidden_size"], shape["head_dim"]
    q_width = shape["attention_heads"] * head_dim
    kv_width = shape["kv_heads"] * head_dim
    per_layer = 2 * hidden + 2 * hidden * q_width + 2 * hidden * kv_width + 3 * hidden * shape["ffn"]
    return shape["layers"] * per_layer + 2 * shape["vocab"] * hidden + hidden


def _round_to(value: float, multiple: int, floor: int) -> int:
    return max(floor, multiple * round(value / multiple))


def _shape_at(src: dict, factor: float) -> dict:
    """``src`` shrunk by ``factor``: widths by ``factor``, layers by ``factor``, vocab by ``factor**2``.

    Per-layer weights then scale as ``factor**2`` and the layer count as ``factor``; the vocabulary
    scales as ``factor**2`` so that embedding and head (``vocab * hidden``) keep their share of the
    weights and FLOPs. Heads and head_dim each take ``sqrt(factor)``, so the query width keeps its
    ratio to hidden; the heads/kv_heads group and ffn/hidden stay as in the source.
    """
    root = math.sqrt(factor)
    group = src["attention_heads"] // src["kv_heads"]
    kv_heads = max(1, round(src["kv_heads"] * root))
    hidden = _round_to(src["hidden_size"] * factor, 16, 16)
    # head_dim a multiple of 8: even for RoPE's pairs, and SIMD-friendly.
    return {"layers": max(1, round(src["layers"] * factor)), "hidden_size": hidden,
                "attention_heads": kv_heads * group, "kv_heads": kv_heads,
                "head_dim": _round_to(src["head_dim"] * root, 8, 8),
                "ffn": _round_to(hidden * src["ffn"] / src["hidden_size"], 16, 16),
                "vocab": max(256, round(src["vocab"] * factor * factor))}


def scaled_shape(model: dict, max_params: float = 2e8) -> dict:
    """A decoder shape like ``model``'s that has at most ``max_params`` weights.

    Parameters
    ----------
    model : dict
        A catalog model entry (:func:`mcsim.scenario.catalog.model_preset`).
    max_params : float
        Weight budget, parameters. 2e8 (800 MB in float32) runs a 64-token prompt plus 16 decode
        steps in a few seconds on a 2-core machine.

    Returns
    -------
    dict
        ``layers, hidden_size, attention_heads, kv_heads, head_dim, ffn, vocab`` of the scaled decoder;
        ``params`` (its weight count), ``scale`` (the width factor used, 1.0 if nothing was shrunk),
        ``source`` (the unscaled stand-in shape) and ``approximations`` (how a MoE or MLA model was
        turned into a dense GQA decoder). If even the smallest shape exceeds the budget it is returned.

    Examples
    --------
    >>> s = scaled_shape(catalog.model_preset("llama-3.1-8b"), 2e8)
    >>> s["attention_heads"] // s["kv_heads"], s["params"] <= 2e8
    (4, True)
    """
    src, notes = _source_shape(model)
    factor = 1.0
    shape = dict(src)
    # Rounding makes the count step-wise in the factor, so walk a fine geometric grid down from 1.
    while decoder_param_count(shape) > max_params and factor > 1e-4:
        factor *= 0.98
        shape = _shape_at(src, factor)
    shape.update(params=decoder_param_count(shape), scale=factor, source=src, approximations=notes)
    return shape


# --------------------------------------------------------------------------------------------------
# Ops: each is a plain function; its cost formula sits next to its call in Decoder.forward.


def _rmsnorm(x, weight):
    mean_square = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(mean_square + RMS_EPS)) * weight


def _rope(q, k, cos, sin):
    """Rotate the two halves of each head (the rotate-half convention of Llama in transformers)."""
    def rotate(x):
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        c, s = cos[:, None, :], sin[:, None, :]
        return np.concatenate([x1 * c - x2 * s, x1 * s + x2 * c], axis=-1)
    return rotate(q), rotate(k)


def _kv_append(k_cache, v_cache, k, v, start):
    tokens = k.shape[0]
    k_cache[:, start:start + tokens] = k.transpose(1, 0, 2)
    v_cache[:, start:start + tokens] = v.transpose(1, 0, 2)


def _scores(q, k_cache, keys, scale):
    """Grouped queries against the cached keys: ``(kv_heads, group*tokens, keys)``; no K repeat."""
    tokens, heads, head_dim = q.shape
    kv_heads = k_cache.shape[0]
    grouped = q.reshape(tokens, kv_heads, heads // kv_heads, head_dim).transpose(1, 2, 0, 3)
    grouped = grouped.reshape(kv_heads, -1, head_dim)
    return (grouped @ k_cache[:, :keys].transpose(0, 2, 1)) * scale


def _softmax(scores, tokens, start):
    kv_heads, rows, keys = scores.shape
    s = scores.reshape(kv_heads, rows // tokens, tokens, keys)
    if tokens > 1:  # causal: query at position start+t sees keys 0..start+t
        allowed = np.arange(keys)[None, :] <= (start + np.arange(tokens))[:, None]
        s = np.where(allowed, s, -np.inf)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).reshape(kv_heads, rows, keys)


def _weighted_sum(probs, v_cache, tokens):
    kv_heads, rows, keys = probs.shape
    out = probs @ v_cache[:, :keys]  # (kv_heads, group*tokens, head_dim)
    head_dim = out.shape[-1]
    out = out.reshape(kv_heads, rows // tokens, tokens, head_dim).transpose(2, 0, 1, 3)
    return out.reshape(tokens, -1)


def _swiglu(gate, up):
    return gate / (1.0 + np.exp(-gate)) * up  # silu(gate) * up


def _sample(logits, temperature, rng):
    """One token id from the last row of ``logits``: argmax at temperature 0, else a softmax draw.

    Computed in float64 so that the cumulative distribution is exact enough whatever the dtype.
    """
    row = logits[-1].astype(np.float64)
    if temperature <= 0:
        return int(np.argmax(row))
    z = row / temperature
    weights = np.exp(z - z.max())
    cumulative = np.cumsum(weights)
    index = np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right")
    return int(min(index, row.size - 1))


class _Recorder:
    """Times ops and appends their records (or only runs them, when ``records`` is None)."""

    def __init__(self, records: list | None, phase: str, step: int):
        self.records, self.phase, self.step = records, phase, step

    def __call__(self, name, layer, lane, flops, bytes_read, bytes_written, fn, *args):
        start = time.perf_counter()
        out = fn(*args)
        wall = time.perf_counter() - start
        if self.records is not None:
            self.records.append(OpRecord(name, layer, self.phase, lane, float(flops),
                                         float(bytes_read), float(bytes_written), wall, self.step))
        return out


class Decoder:
    """A Llama-style decoder (RMSNorm, GQA with RoPE, SwiGLU) with seeded random weights.

    Parameters
    ----------
    shape : dict
        ``layers, hidden_size, attention_heads, kv_heads, head_dim, ffn, vocab`` (see :func:`scaled_shape`).
    dtype : str
        ``"float32"`` or ``"float16"``: storage and NumPy compute dtype (float16 matmuls do not use BLAS
        and are much slower).
    rng : numpy.random.Generator
        Source of the weights: normal, scaled by ``1/sqrt(fan_in)``; norm weights near 1.
    """

    def __init__(self, shape: dict, dtype: str, rng: np.random.Generator):
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.shape, self.dtype = dict(shape), np.dtype(DTYPES[dtype])
        hidden, head_dim, ffn = shape["hidden_size"], shape["head_dim"], shape["ffn"]
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        q_width, kv_width = shape["attention_heads"] * head_dim, shape["kv_heads"] * head_dim

        def matrix(rows, cols):
            w = rng.standard_normal((rows, cols), dtype=np.float32)
            w *= 1.0 / math.sqrt(rows)
            return w.astype(self.dtype, copy=False)

        def norm_weight():
            return (1.0 + 0.1 * rng.standard_normal(hidden, dtype=np.float32)).astype(self.dtype)

        self.embedding = rng.standard_normal((shape["vocab"], hidden), dtype=np.float32).astype(self.dtype)
        self.layers = [
            {"attn_norm": norm_weight(), "wq": matrix(hidden, q_width), "wk": matrix(hidden, kv_width),
                 "wv": matrix(hidden, kv_width), "wo": matrix(q_width, hidden), "ffn_norm": norm_weight(),
                 "w_gate": matrix(hidden, ffn), "w_up": matrix(hidden, ffn), "w_down": matrix(ffn, hidden)}
            for _ in range(shape["layers"])
        ]
        self.final_norm = norm_weight()
        self.lm_head = matrix(hidden, shape["vocab"])

    def rope_tables(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of ``positions * theta**(-2i/head_dim)``, shape ``(len(positions), head_dim/2)``."""
        half = self.shape["head_dim"] // 2
        inv_freq = ROPE_THETA ** (-np.arange(half, dtype=np.float64) / half)
        angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
        return np.cos(angles).astype(self.dtype), np.sin(angles).astype(self.dtype)

    def new_cache(self, max_tokens: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Empty (K, V) cache per layer, each ``(kv_heads, max_tokens, head_dim)``."""
        dims = (self.shape["kv_heads"], max_tokens, self.shape["head_dim"])
        return [(np.zeros(dims, self.dtype), np.zeros(dims, self.dtype)) for _ in self.layers]

    def forward(self, ids, cache, start: int, *, record: _Recorder | None = None,
                all_logits: bool = False) -> np.ndarray:
        """Run ``ids`` (tokens at positions ``start, start+1, ...``) through the decoder.

        Appends their K and V to ``cache`` and attends over the cache (causally within ``ids``).
        Returns the logits of the last token, ``(1, vocab)``, or of every token with ``all_logits``
        (a server computes the head on the last prompt token only, and so does the recorded prefill).
        """
        run = record or _Recorder(None, "prefill", 0)
        s, b = self.shape, self.dtype.itemsize
        ids = np.asarray(ids, dtype=np.int64)
        tokens, hidden, ffn = ids.size, s["hidden_size"], s["ffn"]
        heads, kv_heads, head_dim = s["attention_heads"], s["kv_heads"], s["head_dim"]
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        keys = start + tokens
        th = tokens * hidden
        cos, sin = self.rope_tables(np.arange(start, keys))

        def matmul(name, layer, x, w):
            m, k = x.shape
            n = w.shape[1]
            return run(name, layer, "matmul", 2 * m * k * n, (m * k + k * n) * b, m * n * b, np.matmul, x, w)

        def norm(name, layer, x, w):
            rows = x.shape[0]
            # square, sum, scale by 1/rms, scale by weight: 4 per element (the per-row root is not counted)
            return run(name, layer, "vector", 4 * rows * hidden, (rows * hidden + hidden) * b,
                       rows * hidden * b, _rmsnorm, x, w)

        x = run("embedding", -1, "memory", 0, tokens * TOKEN_ID_BYTES + th * b, th * b,
                np.take, self.embedding, ids, 0)
        for i, (w, (k_cache, v_cache)) in enumerate(zip(self.layers, cache)):
            h = norm("attn_norm", i, x, w["attn_norm"])
            q = matmul("q_proj", i, h, w["wq"]).reshape(tokens, heads, head_dim)
            k = matmul("k_proj", i, h, w["wk"]).reshape(tokens, kv_heads, head_dim)
            v = matmul("v_proj", i, h, w["wv"]).reshape(tokens, kv_heads, head_dim)
            rotated = tokens * (q_width + kv_width)
            # 6 FLOPs per rotated pair = 3 per element; reads q, k and the cos/sin rows.
            q, k = run("rope", i, "vector", 3 * rotated, (rotated + tokens * head_dim) * b, rotated * b,
                       _rope, q, k, cos, sin)
            run("kv_append", i, "memory", 0, 2 * tokens * kv_width * b, 2 * tokens * kv_width * b,
                _kv_append, k_cache, v_cache, k, v, start)
            n_scores = heads * tokens * keys
            scores = run("attn_scores", i, "attention", 2 * n_scores * head_dim + n_scores,
                         (tokens * q_width + keys * kv_width) * b, n_scores * b,
                         _scores, q, k_cache, keys, 1.0 / math.sqrt(head_dim))
            # max, subtract, exp, sum, divide: 5 per score, +1 for the causal select when masked.
            masked = tokens > 1
            probs = run("attn_softmax", i, "attention", (6 if masked else 5) * n_scores,
                        n_scores * b + (tokens * keys if masked else 0), n_scores * b,
                        _softmax, scores, tokens, start)
            attn = run("attn_weighted_sum", i, "attention", 2 * n_scores * head_dim,
                       (n_scores + keys * kv_width) * b, tokens * q_width * b,
                       _weighted_sum, probs, v_cache, tokens)
            o = matmul("o_proj", i, attn, w["wo"])
            x = run("attn_residual", i, "vector", th, 2 * th * b, th * b, np.add, x, o)
            h = norm("ffn_norm", i, x, w["ffn_norm"])
            gate = matmul("ffn_gate", i, h, w["w_gate"])
            up = matmul("ffn_up", i, h, w["w_up"])
            # silu(g) * u = g / (1 + exp(-g)) * u: negate, exp, add, divide, multiply.
            act = run("ffn_act", i, "vector", 5 * tokens * ffn, 2 * tokens * ffn * b, tokens * ffn * b,
                      _swiglu, gate, up)
            down = matmul("ffn_down", i, act, w["w_down"])
            x = run("ffn_residual", i, "vector", th, 2 * th * b, th * b, np.add, x, down)
        last = x if all_logits else x[-1:]
        last = norm("final_norm", -1, last, self.final_norm)
        return matmul("lm_head", -1, last, self.lm_head)


def sample_cost(vocab: int, dtype_bytes: int, temperature: float) -> tuple[int, int, int]:
    """(flops, bytes_read, bytes_written) of sampling one token from ``vocab`` logits.

    Temperature sampling: divide, max, subtract, exp, cumulative sum = 5 per logit (the draw's
    binary search is not counted); argmax: 1 comparison per logit. Reads the logits row, writes one id.
    """
    flops = 5 * vocab if temperature > 0 else vocab
    return flops, vocab * dtype_bytes, TOKEN_ID_BYTES


def _generate(decoder, prompt, decode_tokens, temperature, rng, records):
    """Prefill ``prompt`` then run ``decode_tokens`` decode steps; returns (tokens, prefill s, step s)."""
    vocab, b = decoder.shape["vocab"], decoder.dtype.itemsize
    cost = sample_cost(vocab, b, temperature)
    cache = decoder.new_cache(len(prompt) + decode_tokens)
    record = _Recorder(records, "prefill", 0)
    start = time.perf_counter()
    logits = decoder.forward(prompt, cache, 0, record=record)
    token = record("sampling", -1, "sampling", *cost, _sample, logits, temperature, rng)
    prefill_wall = time.perf_counter() - start
    generated, steps = [token], []
    for step in range(1, decode_tokens + 1):
        record = _Recorder(records, "decode", step)
        start = time.perf_counter()
        logits = decoder.forward([token], cache, len(prompt) + step - 1, record=record)
        token = record("sampling", -1, "sampling", *cost, _sample, logits, temperature, rng)
        steps.append(time.perf_counter() - start)
        generated.append(token)
    return generated, prefill_wall, steps


def _streams(seed: int) -> list[np.random.SeedSequence]:
    """Independent seed streams: weights, prompt, sampling draws."""
    return np.random.SeedSequence(seed).spawn(3)


def build_decoder(shape: dict, seed: int = 0, dtype: str = "float32") -> Decoder:
    """The decoder (weights included) that :func:`run_trace` runs for ``shape`` and ``seed``."""
    return Decoder(shape, dtype, np.random.default_rng(_streams(seed)[0]))


def run_trace(model_name: str = "llama-3.1-8b", prompt_tokens: int = 64, decode_tokens: int = 16,
              max_params: float = 2e8, seed: int = 0, dtype: str = "float32", *,
              temperature: float = 1.0, shape: dict | None = None) -> Trace:
    """Run a scaled catalog model for real and record every op.

    Parameters
    ----------
    model_name : str
        Catalog preset (:func:`mcsim.scenario.catalog.model_preset`).
    prompt_tokens : int
        Prompt length; the prompt is seeded random token ids.
    decode_tokens : int
        Decode steps after the prefill pass, one token each.
    max_params : float
        Weight budget of the scaled decoder (:func:`scaled_shape`).
    seed : int
        Root seed of weights, prompt and sampling draws (three independent streams).
    dtype : str
        ``"float32"`` or ``"float16"``.
    temperature : float
        Sampling temperature; 0 takes the argmax.
    shape : dict, optional
        Use this decoder shape instead of scaling the preset (tests use tiny hand-made shapes).

    Returns
    -------
    Trace
        Records of the prefill pass (step 0, ending with the first sampled token) and of each decode
        step; ``generated`` has ``decode_tokens + 1`` ids. A shortened warm-up pass (up to 8 prompt
        tokens and one decode step) runs first and is not recorded.
    """
    if prompt_tokens < 1 or decode_tokens < 0:
        raise ValueError("prompt_tokens must be >= 1 and decode_tokens >= 0")

    if shape is None:
        shape = scaled_shape(catalog.model_preset(model_name), max_params)
    _, prompt_seq, sample_seq = _streams(seed)
    decoder = build_decoder(shape, seed, dtype)
    prompt = np.random.default_rng(prompt_seq).integers(0, shape["vocab"], prompt_tokens).tolist()
    # Warm-up touches every weight and starts BLAS threads; its own generator keeps the draws intact.
    _generate(decoder, prompt[:8], min(decode_tokens, 1), temperature, np.random.default_rng(seed), None)
    records: list[OpRecord] = []
    generated, prefill_wall, steps = _generate(decoder, prompt, decode_tokens, temperature,
                                               np.random.default_rng(sample_seq), records)
    return Trace(model_name=model_name, shape=dict(shape), dtype=dtype, seed=seed, temperature=temperature,
                 prompt=prompt, generated=generated, records=records, prefill_wall_s=prefill_wall,
                 decode_step_wall_s=steps, environment=runtime_environment())

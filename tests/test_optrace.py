"""Tests of the NumPy decoder trace (mcsim.optrace.decoder) and its outputs (mcsim.optrace.report).

The decoder is checked against a separate, deliberately plain implementation written here (one head
at a time, RoPE through complex numbers, the whole sequence recomputed without a cache); the counted
FLOPs and bytes against arithmetic written out by hand for a tiny shape.
"""

import json
import math

import numpy as np
import pytest

from mcsim.optrace.decoder import (
    Decoder,
    build_decoder,
    decoder_param_count,
    run_trace,
    sample_cost,
    scaled_shape,
)
from mcsim.optrace.profiles import Profile, default_profiles, price
from mcsim.optrace.report import (
    aggregate_ops,
    calibration,
    summarize,
    write_trace_outputs,
)
from mcsim.scenario import catalog

TINY = {"layers": 2, "hidden_size": 16, "attention_heads": 4, "kv_heads": 2, "head_dim": 8, "ffn": 32, "vocab": 64}
LAYER_OPS = ["attn_norm", "q_proj", "k_proj", "v_proj", "rope", "kv_append", "attn_scores", "attn_softmax",
             "attn_weighted_sum", "o_proj", "attn_residual", "ffn_norm", "ffn_gate", "ffn_up", "ffn_act",
             "ffn_down", "ffn_residual"]


def reference_logits(decoder: Decoder, tokens) -> np.ndarray:
    """Logits at every position, recomputing the whole sequence: no cache, one head at a time."""
    s = decoder.shape
    heads, kv_heads, head_dim = s["attention_heads"], s["kv_heads"], s["head_dim"]
    group, half = heads // kv_heads, head_dim // 2
    n = len(tokens)
    x = decoder.embedding[np.asarray(tokens)].astype(np.float64)

    def rms(v, w):
        return v / np.sqrt((v * v).mean(axis=-1, keepdims=True) + 1e-5) * w

    def rope(v, pos):  # v: (head_dim,), pairs (i, i + half) rotated by pos * theta**(-i/half)
        angle = pos * 500_000.0 ** (-np.arange(half) / half)
        z = (v[:half] + 1j * v[half:]) * np.exp(1j * angle)
        return np.concatenate([z.real, z.imag])

    for w in decoder.layers:
        h = rms(x, w["attn_norm"])
        q = (h @ w["wq"]).reshape(n, heads, head_dim)
        k = (h @ w["wk"]).reshape(n, kv_heads, head_dim)
        v = (h @ w["wv"]).reshape(n, kv_heads, head_dim)
        out = np.zeros((n, heads, head_dim))
        for head in range(heads):
            kv = head // group  # query head h shares KV head h // group
            qs = np.array([rope(q[t, head], t) for t in range(n)])
            ks = np.array([rope(k[t, kv], t) for t in range(n)])
            scores = qs @ ks.T / math.sqrt(head_dim)
            scores[np.triu_indices(n, 1)] = -np.inf  # position t sees 0..t
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + out.reshape(n, heads * head_dim) @ w["wo"]
        h = rms(x, w["ffn_norm"])
        gate, up = h @ w["w_gate"], h @ w["w_up"]
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w["w_down"]
    return rms(x, decoder.final_norm) @ decoder.lm_head


# --------------------------------------------------------------------------------------------------
# Correctness of the decoder


def test_full_sequence_matches_reference():
    decoder = build_decoder(TINY, seed=3)
    tokens = np.random.default_rng(1).integers(0, TINY["vocab"], 9)
    logits = decoder.forward(tokens, decoder.new_cache(9), 0, all_logits=True)
    np.testing.assert_allclose(logits, reference_logits(decoder, tokens), rtol=1e-4, atol=1e-4)


def test_kv_cache_decoding_matches_recomputing_without_cache():
    decoder = build_decoder(TINY, seed=5)
    tokens = np.random.default_rng(2).integers(0, TINY["vocab"], 10)
    expected = reference_logits(decoder, tokens)
    cache = decoder.new_cache(10)
    got = [decoder.forward(tokens[:6], cache, 0)[0]]  # prefill: logits of the last prompt token
    for position in range(6, 10):
        got.append(decoder.forward(tokens[position:position + 1], cache, position)[0])
    np.testing.assert_allclose(np.array(got), expected[5:], rtol=1e-4, atol=1e-4)


def test_greedy_generation_is_the_argmax_of_the_reference():
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=4, seed=7, temperature=0)
    decoder = build_decoder(TINY, seed=7)
    sequence = trace.prompt + trace.generated[:-1]
    expected = np.argmax(reference_logits(decoder, sequence)[len(trace.prompt) - 1:], axis=1)
    assert trace.generated == expected.tolist()


def test_float16_decoder_agrees_with_float32():
    tokens = np.arange(6) * 7 % TINY["vocab"]
    d32, d16 = build_decoder(TINY, 1, "float32"), build_decoder(TINY, 1, "float16")
    l32 = d32.forward(tokens, d32.new_cache(6), 0, all_logits=True)
    l16 = d16.forward(tokens, d16.new_cache(6), 0, all_logits=True)
    assert l16.dtype == np.float16
    np.testing.assert_allclose(l16.astype(np.float32), l32, atol=0.05 * np.abs(l32).max())


# --------------------------------------------------------------------------------------------------
# Counted FLOPs and bytes


def _by(trace, phase, step, layer):
    return {r.name: r for r in trace.records if r.phase == phase and r.step == step and r.layer == layer}


def test_prefill_costs_match_hand_formulas():
    # T = 5 prompt tokens, H = 16, 4 query heads and 2 KV heads of 8, F = 32, V = 64, 4-byte floats.
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=2, temperature=0)
    layer0, outside = _by(trace, "prefill", 0, 0), _by(trace, "prefill", 0, -1)
    assert list(layer0) == LAYER_OPS
    expected = {  # name: (flops, bytes_read, bytes_written)
        "attn_norm": (4 * 5 * 16, (5 * 16 + 16) * 4, 5 * 16 * 4),
        "q_proj": (2 * 5 * 16 * 32, (5 * 16 + 16 * 32) * 4, 5 * 32 * 4),
        "k_proj": (2 * 5 * 16 * 16, (5 * 16 + 16 * 16) * 4, 5 * 16 * 4),
        "rope": (3 * 5 * (32 + 16), (5 * 48 + 5 * 8) * 4, 5 * 48 * 4),  # 6 FLOPs per rotated pair
        "kv_append": (0, 2 * 5 * 16 * 4, 2 * 5 * 16 * 4),
        # 4 heads x 5 queries x 5 keys = 100 scores: 2*8 FLOPs each plus the scaling.
        "attn_scores": (2 * 100 * 8 + 100, (5 * 32 + 5 * 16) * 4, 100 * 4),
        "attn_softmax": (6 * 100, 100 * 4 + 5 * 5, 100 * 4),  # causal mask: 25 one-byte flags
        "attn_weighted_sum": (2 * 100 * 8, (100 + 5 * 16) * 4, 5 * 32 * 4),
        "o_proj": (2 * 5 * 32 * 16, (5 * 32 + 32 * 16) * 4, 5 * 16 * 4),
        "attn_residual": (5 * 16, 2 * 5 * 16 * 4, 5 * 16 * 4),
        "ffn_gate": (2 * 5 * 16 * 32, (5 * 16 + 16 * 32) * 4, 5 * 32 * 4),
        "ffn_act": (5 * 5 * 32, 2 * 5 * 32 * 4, 5 * 32 * 4),
        "ffn_down": (2 * 5 * 32 * 16, (5 * 32 + 32 * 16) * 4, 5 * 16 * 4),
    }
    for name, counted in expected.items():
        r = layer0[name]
        assert (r.flops, r.bytes_read, r.bytes_written) == counted, name
    assert (outside["embedding"].bytes_read, outside["embedding"].bytes_written) == (5 * 8 + 5 * 16 * 4, 320)
    # The head runs on the last prompt token only: (1, 16) @ (16, 64).
    assert (outside["lm_head"].flops, outside["lm_head"].bytes_read) == (2 * 16 * 64, (16 + 16 * 64) * 4)
    assert (outside["sampling"].flops, outside["sampling"].bytes_written) == (64, 8)  # argmax


def test_decode_costs_match_hand_formulas():
    # Decode step 2 after a 5-token prompt: 1 query at position 6, 7 cached keys.
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=2, temperature=1.0)
    step2 = _by(trace, "decode", 2, 1)
    assert (step2["q_proj"].flops, step2["q_proj"].bytes_read) == (2 * 16 * 32, (16 + 16 * 32) * 4)
    assert (step2["attn_scores"].flops, step2["attn_scores"].bytes_read) == (2 * 28 * 8 + 28, (32 + 7 * 16) * 4)
    assert (step2["attn_softmax"].flops, step2["attn_softmax"].bytes_read) == (5 * 28, 28 * 4)  # no mask
    assert (step2["attn_weighted_sum"].flops, step2["attn_weighted_sum"].bytes_read) == (2 * 28 * 8, (28 + 7 * 16) * 4)
    assert _by(trace, "decode", 2, -1)["sampling"].flops == 5 * 64  # temperature softmax + draw
    assert sample_cost(64, 4, 1.0) == (5 * 64, 64 * 4, 8)
    # Per step: embedding, 2 layers x 17 ops, final norm, head, sampling.
    assert sum(r.step == 1 for r in trace.records) == 1 + 2 * len(LAYER_OPS) + 3


def test_float16_halves_the_bytes():
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=1, dtype="float16", temperature=0)
    q = _by(trace, "decode", 1, 0)["q_proj"]
    assert (q.flops, q.bytes_read, q.bytes_written) == (2 * 16 * 32, (16 + 16 * 32) * 2, 32 * 2)


# --------------------------------------------------------------------------------------------------
# Shapes and determinism


def test_param_count_matches_the_built_weights():
    decoder = build_decoder(TINY)
    arrays = [decoder.embedding, decoder.final_norm, decoder.lm_head, *(a for w in decoder.layers for a in w.values())]
    assert sum(a.size for a in arrays) == decoder_param_count(TINY)


@pytest.mark.parametrize("preset", sorted(catalog.models()))
def test_scaled_shape_keeps_ratios_and_budget(preset):
    model = catalog.model_preset(preset)
    shape = scaled_shape(model, 2e8)
    src = shape["source"]
    assert shape["params"] == decoder_param_count(shape) <= 2e8
    assert shape["attention_heads"] // shape["kv_heads"] == src["attention_heads"] // src["kv_heads"]
    assert shape["attention_heads"] % shape["kv_heads"] == 0 and shape["head_dim"] % 2 == 0
    # ffn is rounded to a multiple of 16, so the ratio holds to within 8 / hidden.
    assert abs(shape["ffn"] / shape["hidden_size"] - src["ffn"] / src["hidden_size"]) <= 8 / shape["hidden_size"] + 1e-12
    assert shape["layers"] <= src["layers"] and shape["vocab"] <= src["vocab"]
    assert (model["attention"] == "mla" or model["experts"] > 0) == bool(shape["approximations"])


def test_scaled_shape_leaves_a_small_enough_model_alone():
    shape = scaled_shape(catalog.model_preset("llama-3.1-8b"), 1e12)
    assert shape["scale"] == 1.0 and shape["hidden_size"] == 4096 and shape["vocab"] == 128256


def test_trace_is_deterministic_apart_from_wall_times():
    a = run_trace(shape=TINY, prompt_tokens=6, decode_tokens=5, seed=11)
    b = run_trace(shape=TINY, prompt_tokens=6, decode_tokens=5, seed=11)
    assert [r.counted() for r in a.records] == [r.counted() for r in b.records]
    assert a.prompt == b.prompt and a.generated == b.generated
    c = run_trace(shape=TINY, prompt_tokens=6, decode_tokens=5, seed=12)
    assert (c.prompt, c.generated) != (a.prompt, a.generated)
    assert all(r.wall_s >= 0 for r in a.records) and a.measured_decode_tok_s > 0


def test_catalog_preset_runs_scaled():
    trace = run_trace("llama-3.1-8b", prompt_tokens=4, decode_tokens=2, max_params=3e5)
    assert trace.shape["params"] <= 3e5 and len(trace.generated) == 3
    assert {r.lane for r in trace.records} == {"matmul", "attention", "vector", "memory", "sampling"}


# --------------------------------------------------------------------------------------------------
# Pricing a trace, calibration and outputs


FAKE_MACHINE = Profile("this machine", 50e9, 10e9, "measured", "fixed figures for the tests")


def test_same_trace_priced_on_every_profile_without_rerunning():
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=3)
    before = [r.counted() + (r.wall_s,) for r in trace.records]
    profiles = default_profiles(FAKE_MACHINE)
    summary = summarize(trace, profiles)
    assert [r.counted() + (r.wall_s,) for r in trace.records] == before
    for p in profiles:
        decode = sum(price(r, p)["t_estimate"] for r in trace.records if r.phase == "decode")
        assert summary["profiles"][p.name]["estimated_decode_s"] == pytest.approx(decode)
        assert summary["profiles"][p.name]["estimated_decode_tok_s"] == pytest.approx(3 / decode)


def test_calibration_against_hand_computed_estimate():
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=3)
    decode = [r for r in trace.records if r.phase == "decode"]
    est_s = sum(max(r.flops / 50e9, (r.bytes_read + r.bytes_written) / 10e9) for r in decode)
    memory_s = sum(max(r.flops / 50e9, (r.bytes_read + r.bytes_written) / 10e9) for r in decode
                   if r.flops / (r.bytes_read + r.bytes_written) < 5.0)  # ridge = 50e9 / 10e9
    result = calibration(trace, FAKE_MACHINE)
    measured = 3 / sum(trace.decode_step_wall_s)
    assert result["measured_decode_tok_s"] == pytest.approx(measured)
    assert result["estimated_decode_tok_s"] == pytest.approx(3 / est_s)
    assert result["calibration_factor"] == pytest.approx(measured * est_s / 3)
    assert result["memory_bound_score"] == pytest.approx(memory_s / est_s)
    assert result["bottleneck"] == ("memory" if memory_s / est_s >= 0.5 else "compute")
    assert result["measured"]["peak_flops"] == 50e9 and result["estimated"]["decode_s"] == pytest.approx(est_s)
    regime = result["regime"]
    assert regime["dtype"] == "float32" and regime["kernel_backend"].startswith("numpy")
    assert regime["scaled_shape"]["hidden_size"] == 16 and regime["hardware"]["cpu_count"] >= 1
    assert "load_average_1min" in trace.environment


def test_aggregated_ops_sum_the_records():
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=3)
    rows = {(o["name"], o["phase"]): o for o in aggregate_ops(trace, [FAKE_MACHINE])}
    q = [r for r in trace.records if r.name == "q_proj" and r.phase == "decode"]
    assert rows["q_proj", "decode"]["calls"] == 2 * 3
    assert rows["q_proj", "decode"]["flops"] == sum(r.flops for r in q)


def test_outputs_are_written_and_labelled(tmp_path):
    trace = run_trace(shape=TINY, prompt_tokens=5, decode_tokens=3)
    profiles = default_profiles(FAKE_MACHINE)
    paths = write_trace_outputs(trace, profiles, tmp_path / "out")
    lines = paths["trace_jsonl"].read_text().splitlines()
    assert len(lines) == len(trace.records)
    first = json.loads(lines[0])
    assert set(first["estimated_s"]) == {p.name for p in profiles} and "wall_s_measured" in first
    summary = json.loads(paths["summary_json"].read_text())
    assert summary["calibration"]["regime"]["dtype"] == "float32"
    assert set(summary["totals"]) == {"prefill", "decode"}
    assert summary["measured"]["decode_tok_s"] == pytest.approx(trace.measured_decode_tok_s)
    report = paths["report_md"].read_text()
    assert "synthetic estimate" in report.lower() and "measured" in report.lower()
    assert all(p.name in report for p in profiles) and "ffn_gate" in report
    with pytest.raises(FileExistsError):
        write_trace_outputs(trace, profiles, tmp_path / "out")
    write_trace_outputs(trace, profiles, tmp_path / "out", overwrite=True)

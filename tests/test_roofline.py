"""Roofline step cost, collectives, memory projection and operating point against hand-computed values."""

import itertools
import math

import numpy as np
import pytest

from mcsim.perf.capacity import memory_projection, operating_point
from mcsim.perf.collectives import allreduce_time, alltoall_time, expected_other_nodes
from mcsim.perf.roofline import (
    Achievable,
    Collectives,
    Parallelism,
    Precision,
    step_cost,
)
from mcsim.scenario import catalog
from helpers import DENSE_NODE

# A dense GQA model small enough to cost by hand.
TINY = {
    "name": "tiny", "source": "test", "layers": 2, "hidden_size": 64, "attention_heads": 4, "kv_heads": 2,
    "head_dim": 16, "attention": "gqa", "kv_lora_rank": 0, "qk_rope_head_dim": 0, "q_lora_rank": 0,
    "qk_nope_head_dim": 0, "v_head_dim": 0, "dense_layers": 2, "experts": 0, "active_experts": 0,
    "shared_experts": 0, "expert_ffn": 0, "dense_ffn": 128, "vocab": 100, "max_context": 1024,
    "total_params_b": 0.0, "active_params_b": 0.0, "mtp_layers": 0,
}
# Round numbers: 1 TFLOP/s BF16 and 1 TB/s HBM; at 50 % achievable both are 5e11 per second, so an op takes
# max(flops, bytes) / 5e11 s.
TINY_HW = {
    "bf16_tflops": 1.0, "fp8_tflops": 2.0, "fp4_tflops": 0.0, "hbm_gb": 1.0, "hbm_tb_s": 1.0,
    "scale_up_gb_s": 100.0, "scale_out_gb_s": 10.0, "host_link_gb_s": 10.0, "gpus_per_node": 8,
}
HALF = Achievable(flops_fraction=0.5, bandwidth_fraction=0.5, network_fraction=1.0, launch_overhead_s=0.0,
                  step_overhead_s=0.0, fused=False, elementwise_bandwidth_fraction=0.5)
RATE = 0.5e12


def roof(flops, nbytes):
    return max(flops, nbytes) / RATE


def check_op(cost, op, flops, nbytes):
    assert cost.breakdown[op]["flops"] == pytest.approx(flops, rel=1e-12)
    assert cost.breakdown[op]["bytes"] == pytest.approx(nbytes, rel=1e-12)
    assert cost.breakdown[op]["t"] == pytest.approx(roof(flops, nbytes), rel=1e-12)


def test_tiny_decode_tp1_by_hand():
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, achievable=HALF)
    n, layers = 3, 2  # 3 decode tokens, 2 layers
    # attention_proj per layer: q 64x(4*16), k and v 64x(2*16) each, o (4*16)x64; 2 RMSNorms of 64 (bytes only)
    attn_params = 64 * 64 + 2 * 64 * 32 + 64 * 64  # 12288
    attn_flops = 2 * n * attn_params  # 73728
    attn_weights = (attn_params + 2 * 64) * 2  # 24832
    # activations per token: qkv in 64 + out 64+32+32, o in 64 + out 64 = 320; the unfused element-wise kernels
    # move norm 2*64, residual 3*64, rope 2*(64+32) = 512 of their own
    attn_act = n * 320 * 2
    check_op(cost, "attention_proj", layers * attn_flops, layers * (attn_weights + attn_act))
    # attention_core: 4 * heads * head_dim * context per token; KV 2 * 2 heads * 16 * 2 B = 128 B per token
    core_flops = 4 * 4 * 16 * 10 * n  # 7680
    kv = (3 * 10 + 3) * 128  # read 3 contexts of 10, write 3 new tokens
    core_act = n * 2 * 64 * 2  # q in, o out
    check_op(cost, "attention_core", layers * core_flops, layers * (kv + core_act))
    # dense FFN: 3 * 64 * 128 weights; act per token 64 + 2*128 (gate/up) + 128 + 64 (down) = 512,
    # unfused norm 128 + residual 192 + SwiGLU 3*128 = 704
    ffn_params = 3 * 64 * 128
    check_op(cost, "dense_ffn", layers * 2 * n * ffn_params, layers * (ffn_params * 2 + n * 512 * 2))
    elementwise = n * (512 + 704) * 2  # per layer: RMSNorm, RoPE, add; RMSNorm, SwiGLU, add (no kernel floor here)
    check_op(cost, "elementwise", 0.0, layers * elementwise)
    # output head: 100 x 64, one row per decode token
    check_op(cost, "lm_head", 2 * n * 100 * 64, 100 * 64 * 2 + n * (64 + 100) * 2)
    for op in ("moe_ffn", "shared_expert", "router", "tp_allreduce", "ep_alltoall", "pp_send"):
        assert cost.breakdown[op]["t"] == 0.0
    expected = (layers * (roof(attn_flops, attn_weights + attn_act) + roof(core_flops, kv + core_act)
                          + roof(2 * n * ffn_params, ffn_params * 2 + n * 512 * 2) + roof(0, elementwise))
                + roof(2 * n * 6400, 12800 + n * 164 * 2))
    assert cost.t_step == pytest.approx(expected, rel=1e-12)
    assert cost.kv_bytes == pytest.approx(layers * kv)
    assert cost.t_comm == 0.0


def test_tiny_decode_tp2_by_hand():
    latency = 1e-6
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, achievable=HALF,
                     parallel=Parallelism(tp=2), collectives=Collectives(allreduce="ring", latency_s=latency))
    n, layers = 3, 2
    # per GPU: 2 query heads (32 wide), 1 KV head (16 wide)
    attn_params = 64 * 32 + 2 * 64 * 16 + 32 * 64  # 6144
    attn_act = n * ((64 + 32 + 32) + (32 + 64)) * 2
    check_op(cost, "attention_proj", layers * 2 * n * attn_params, layers * ((attn_params + 128) * 2 + attn_act))
    core_flops = 4 * 2 * 16 * 10 * n
    kv = (3 * 10 + 3) * (2 * 1 * 16 * 2)
    check_op(cost, "attention_core", layers * core_flops, layers * (kv + n * 2 * 32 * 2))
    ffn_params = 3 * 64 * 64  # 128 columns split over 2 GPUs
    check_op(cost, "dense_ffn", layers * 2 * n * ffn_params,
             layers * (ffn_params * 2 + n * (2 * 64 + 3 * 64) * 2))
    check_op(cost, "elementwise", 0.0, layers * n * (5 * 64 + 2 * (32 + 16) + 5 * 64 + 3 * 64) * 2)
    check_op(cost, "lm_head", 2 * n * 50 * 64, 50 * 64 * 2 + n * (64 + 50) * 2)
    # 2 ring all-reduces per layer of 3 tokens x 64 x 2 B = 384 B: 2*(2-1)/2 * 384 B at 100 GB/s + 2 hops
    one = 2 * 1 / 2 * 384 / 100e9 + 2 * 1 * latency
    assert cost.breakdown["tp_allreduce"]["t"] == pytest.approx(2 * layers * one, rel=1e-12)
    assert cost.comm_bytes == pytest.approx(2 * layers * 384)
    compute = sum(cost.breakdown[op]["t"] for op in ("attention_proj", "attention_core", "dense_ffn", "lm_head",
                                                     "elementwise"))
    assert cost.t_step == pytest.approx(compute + 2 * layers * one, rel=1e-12)


def test_tiny_prefill_by_hand():
    cost = step_cost(TINY, TINY_HW, decode_seqs=0, decode_context=0, prefill_tokens=8, prefill_context=6,
                     achievable=HALF)
    n, layers = 8, 2
    attn_params = 12288
    check_op(cost, "attention_proj", layers * 2 * n * attn_params,
             layers * ((attn_params + 128) * 2 + n * 320 * 2))
    # 8 tokens attending to 6 earlier tokens on average; the chunk reads 6 tokens of KV and writes 8
    check_op(cost, "attention_core", layers * 4 * 4 * 16 * 6 * n, layers * ((6 + 8) * 128 + n * 128 * 2))
    check_op(cost, "dense_ffn", layers * 2 * n * 24576, layers * (24576 * 2 + n * 512 * 2))
    check_op(cost, "elementwise", 0.0, layers * n * (512 + 704) * 2)
    # only the prompt's last token needs logits
    check_op(cost, "lm_head", 2 * 1 * 100 * 64, 12800 + 1 * 164 * 2)


def test_tiny_fused_graphs_and_overheads():
    achievable = Achievable(flops_fraction=0.5, bandwidth_fraction=0.5, launch_overhead_s=1e-5,
                            kernels_per_layer=12, cudagraph_mode="none", fused=True, step_overhead_s=2e-4)
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, achievable=achievable)
    # fused: no element-wise round trips; half of 12 kernels x 2 layers: each costs the GPU a tenth of a launch,
    # and the host's eager launches run ahead of the GPU's work, exposed only beyond it
    check_op(cost, "attention_proj", 2 * 2 * 3 * 12288, 2 * ((12288 + 128) * 2 + 3 * 320 * 2))
    busy = sum(op["t"] for name, op in cost.breakdown.items() if name != "overhead")
    assert busy < 12 * 1e-5  # a tiny step: launch-bound
    assert cost.t_overhead == pytest.approx(12 * 1e-6 + (12 * 1e-5 - busy) + 2e-4)
    graphs = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10,
                       achievable=Achievable(launch_overhead_s=1e-5, kernels_per_layer=12, cudagraph_mode="full",
                                             fused=False, step_overhead_s=0.0))
    assert graphs.t_overhead == pytest.approx(12 * 2 * 1e-5 * 0.1)


def test_fp8_compute_uses_fp8_peak_and_falls_back():
    fp8 = Precision(weight_bytes=1.0, compute="fp8")
    # large prefill: compute-bound; FP8 peak is 2 TFLOP/s for the matmuls, attention core stays at BF16
    cost = step_cost(TINY, TINY_HW, decode_seqs=0, decode_context=0, prefill_tokens=4096, achievable=HALF,
                     precision=fp8)
    flops = 2 * 2 * 4096 * 24576
    assert cost.breakdown["dense_ffn"]["t"] == pytest.approx(flops / (2e12 * 0.5))
    no_fp8 = dict(TINY_HW, fp8_tflops=0.0)
    cost = step_cost(TINY, no_fp8, decode_seqs=0, decode_context=0, prefill_tokens=4096, achievable=HALF,
                     precision=fp8)
    assert cost.breakdown["dense_ffn"]["t"] == pytest.approx(flops / (1e12 * 0.5))


TINY_MOE = dict(TINY, layers=1, dense_layers=0, experts=4, active_experts=2, shared_experts=1, expert_ffn=32)


def test_tiny_moe_by_hand():
    latency = 1e-6
    hot = 1.5
    cost = step_cost(TINY_MOE, TINY_HW, decode_seqs=3, decode_context=10, achievable=HALF, hot_rank_factor=hot,
                     parallel=Parallelism(tp=1, attention_dp=2, ep=2), collectives=Collectives(latency_s=latency))
    # 3 tokens x 2 experts over 2 ranks: mean 3 pairs per rank, the hot rank 1.5x that
    pairs = hot * 3 * 2 / 2
    # expected distinct experts of 3 tokens, top-2 of 4: 4 * (1 - (1 - 2/4)^3) = 3.5, half of them per rank
    distinct_per_rank = 4 * (1 - 0.5 ** 3) / 2
    expert = 3 * 64 * 32
    check_op(cost, "moe_ffn", 2 * pairs * expert, distinct_per_rank * expert * 2 + pairs * (2 * 64 + 3 * 32) * 2)
    # shared expert and router for each attention-DP group's 1.5 tokens
    n = 3 / 2
    check_op(cost, "shared_expert", 2 * n * expert, expert * 2 + n * (2 * 64 + 3 * 32) * 2)
    check_op(cost, "router", 2 * n * 4 * 64, 4 * 64 * 2 + n * (64 + 4) * 2)
    # element-wise kernels: attention RMSNorm + RoPE (2 x (64 + 32)) + add, FFN RMSNorm + add, SwiGLU of the shared
    # expert (its 1.5 tokens) and of the hot rank's routed pairs
    check_op(cost, "elementwise", 0.0, (n * (5 * 64 + 2 * (64 + 32)) + n * 5 * 64 + n * 3 * 32 + pairs * 3 * 32) * 2)
    # dispatch + combine: each GPU sends hot * 1.5 tokens x 2 copies x 128 B; half of it leaves the GPU
    data = hot * 1.5 * 2 * 64 * 2
    one = (2 - 1) / 2 * data / 100e9 + latency
    assert cost.breakdown["ep_alltoall"]["t"] == pytest.approx(2 * one, rel=1e-12)
    fixed = step_cost(TINY_MOE, TINY_HW, decode_seqs=3, decode_context=10, achievable=HALF, distinct_experts=4,
                      parallel=Parallelism(tp=1, attention_dp=2, ep=2))
    assert fixed.breakdown["moe_ffn"]["bytes"] == pytest.approx(2 * expert * 2 + 3 * (2 * 64 + 3 * 32) * 2)
    # the expert stage's count of 3 distinct experts holds at 8 tokens a step; a step of 3 tokens reads the
    # experts uniform routing's ratio says it touches, 3 x (4 (1 - 0.5^3)) / (4 (1 - 0.5^8)) = 3 x 3.5 / 3.984375
    # of the 4, half of them on each of the 2 EP ranks; a step of 8 tokens reads the stage's 3
    scaled = step_cost(TINY_MOE, TINY_HW, decode_seqs=3, decode_context=10, achievable=HALF, distinct_experts=3,
                       distinct_tokens=8, parallel=Parallelism(tp=1, attention_dp=2, ep=2))
    touched = 3 * (4 * (1 - 0.5 ** 3)) / (4 * (1 - 0.5 ** 8)) / 2
    assert scaled.breakdown["moe_ffn"]["bytes"] == pytest.approx(touched * expert * 2 + 3 * (2 * 64 + 3 * 32) * 2)
    at_its_tokens = step_cost(TINY_MOE, TINY_HW, decode_seqs=8, decode_context=10, achievable=HALF,
                              distinct_experts=3, distinct_tokens=8, parallel=Parallelism(tp=1, attention_dp=2, ep=2))
    assert at_its_tokens.breakdown["moe_ffn"]["bytes"] == pytest.approx(1.5 * expert * 2 + 8 * (2 * 64 + 3 * 32) * 2)


def test_kv_bytes_per_token_published():
    h100 = catalog.hardware_preset("h100")
    assert memory_projection(catalog.model_preset("llama-3-70b"), h100).kv_bytes_per_token_per_gpu == 327_680
    assert memory_projection(catalog.model_preset("deepseek-v3"), h100).kv_bytes_per_token_per_gpu == 70_272
    # GQA heads split over TP (8 KV heads / 8 GPUs: one each), replicated beyond; the MLA latent is replicated
    llama = catalog.model_preset("llama-3-70b")
    for tp in (8, 16):
        assert memory_projection(llama, h100, parallel=Parallelism(tp=tp)).kv_bytes_per_token_per_gpu \
            == 80 * 1 * 128 * 2 * 2
    assert memory_projection(catalog.model_preset("deepseek-v3"), h100,
                             parallel=Parallelism(tp=8, ep=8)).kv_bytes_per_token_per_gpu == 70_272


def test_decode_batch1_is_memory_bound():
    model, hw = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")
    achievable = Achievable()
    cost = step_cost(model, hw, decode_seqs=1, decode_context=512, achievable=achievable)
    # every weight but the input embedding (a lookup) is streamed once: 8.03e9 params less 128256 x 4096
    streamed = (catalog.param_counts(model)[0] - 128256 * 4096) * 2
    expected = streamed / (3.35e12 * 0.8)
    assert cost.t_step - cost.t_overhead == pytest.approx(expected, rel=0.03)
    assert cost.t_memory > 50 * cost.t_compute


def test_long_prefill_is_compute_bound():
    model, hw = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")
    tokens = 8192
    cost = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=tokens, prefill_context=0)
    # matmul weights per layer: q and o 4096 x 4096, k and v 4096 x 1024, SwiGLU 3 x 4096 x 14336
    params = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336)
    expected = 2 * params * tokens / (989.4e12 * 0.6)
    # the unfused element-wise kernels stream their activations on their own: per token and layer 2 RMSNorms
    # (2 x 2h), RoPE (2 x (4096 + 1024)), 2 residual adds (2 x 3h) and SwiGLU (3 x 14336), 2 bytes each
    elementwise = 32 * tokens * (10 * 4096 + 2 * (4096 + 1024) + 3 * 14336) * 2 / (3.35e12 * 0.8)
    assert cost.breakdown["elementwise"]["t"] == pytest.approx(elementwise, rel=1e-9)
    assert cost.t_step - cost.t_overhead - elementwise == pytest.approx(expected, rel=0.02)
    assert cost.t_compute > 3 * cost.t_memory
    # attention core: 4 x 32 heads x 128 x context FLOPs per token and layer, now compute-bound
    with_context = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=tokens,
                             prefill_context=4096)
    core = 32 * 4 * 32 * 128 * 4096 * tokens / (989.4e12 * 0.6)
    assert with_context.breakdown["attention_core"]["t"] == pytest.approx(core, rel=1e-9)
    assert with_context.t_step - with_context.t_overhead == pytest.approx(expected + core + elementwise, rel=0.02)


def test_ring_allreduce_formula():
    hw = {"scale_up_gb_s": 450.0, "scale_out_gb_s": 50.0, "gpus_per_node": 8}
    nbytes, latency = 2e6, 5e-6
    for p in (2, 4, 8):
        t, sent = allreduce_time(nbytes, p, hw, algorithm="ring", latency_s=latency, network_fraction=0.7)
        assert t == pytest.approx(2 * (p - 1) / p * nbytes / (450e9 * 0.7) + 2 * (p - 1) * latency)
        assert sent == pytest.approx(2 * (p - 1) / p * nbytes)
    # 16 GPUs span two nodes: the ring runs at the network's speed
    t, _ = allreduce_time(nbytes, 16, hw, algorithm="ring", latency_s=latency)
    assert t == pytest.approx(2 * 15 / 16 * nbytes / 50e9 + 30 * latency)
    t, _ = allreduce_time(nbytes, 8, hw, algorithm="one-shot", latency_s=latency)
    assert t == pytest.approx(7 * nbytes / 450e9 + latency)
    t, _ = allreduce_time(nbytes, 8, hw, algorithm="two-shot", latency_s=latency)
    assert t == pytest.approx(2 * 7 / 8 * nbytes / 450e9 + 2 * latency)
    # hierarchical over 2 nodes of 8: reduce-scatter + all-gather in the node, ring over nodes on 1/8 shards
    t, _ = allreduce_time(nbytes, 16, hw, algorithm="hierarchical", latency_s=latency)
    assert t == pytest.approx(2 * 7 / 8 * nbytes / 450e9 + 2 * 1 / 2 * nbytes / 8 / 50e9 + (14 + 2) * latency)
    assert allreduce_time(nbytes, 1, hw) == (0.0, 0.0)


def test_alltoall_formulas():
    hw = {"scale_up_gb_s": 450.0, "scale_out_gb_s": 50.0, "gpus_per_node": 8}
    latency = 5e-6
    tokens, k, token_bytes = 100, 8, 7168 * 2
    data = tokens * k * token_bytes
    t, sent = alltoall_time(tokens, k, token_bytes, 8, hw, latency_s=latency)
    assert t == pytest.approx(7 / 8 * data / 450e9 + latency)
    assert sent == pytest.approx(7 / 8 * data)
    # 32 GPUs on 4 nodes: 7/32 of the data to the own node's peers, 24/32 over the network, concurrently
    t, _ = alltoall_time(tokens, k, token_bytes, 32, hw, latency_s=latency)
    assert t == pytest.approx(max(7 / 32 * data / 450e9, 24 / 32 * data / 50e9) + latency)
    # hierarchical: once per other destination node over the network
    t, _ = alltoall_time(tokens, k, token_bytes, 32, hw, algorithm="hierarchical", latency_s=latency, experts=256)
    nodes_hit = 3 * (1 - math.comb(256 - 64, 8) / math.comb(256, 8))
    assert t == pytest.approx(max(tokens * token_bytes * nodes_hit / 50e9, 7 / 8 * data / 450e9) + 2 * latency)


def test_expected_other_nodes_by_enumeration():
    experts, k, nodes = 8, 3, 4  # 2 experts per node
    home = 0
    hits = [len({e // 2 for e in combo} - {home}) for combo in itertools.combinations(range(experts), k)]
    assert expected_other_nodes(experts, k, nodes) == pytest.approx(np.mean(hits))


@pytest.mark.parametrize("model_name", ["llama-3.1-8b", "deepseek-v3"])
def test_monotone_in_batch_context_and_verify(model_name):
    model, hw = catalog.model_preset(model_name), catalog.hardware_preset("h200")
    parallel = Parallelism(tp=8, ep=8) if model["experts"] else Parallelism()
    base = {"decode_seqs": 16, "decode_context": 2000, "verify_tokens": 1, "parallel": parallel}

    def t(**changes):
        return step_cost(model, hw, **dict(base, **changes)).t_step

    assert t(decode_seqs=8) < t() < t(decode_seqs=32) < t(decode_seqs=256)
    assert t(decode_context=500) < t() < t(decode_context=8000)
    assert t() < t(verify_tokens=2) < t(verify_tokens=4)


def test_sliding_window_caps_attention():
    model, hw = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")

    def core(context, window):
        cost = step_cost(model, hw, decode_seqs=32, decode_context=context, attention_window=window)
        return cost.breakdown["attention_core"]["t"]

    assert core(4096, 1024) == pytest.approx(core(1024, 0))
    assert core(32768, 1024) == core(4096, 1024)
    assert core(4096, 0) > 3 * core(4096, 1024)
    # sparse attention: the core is capped, the indexer still scans the whole context
    sparse = step_cost(model, hw, decode_seqs=32, decode_context=32768, sparse_topk=2048)
    capped = step_cost(model, hw, decode_seqs=32, decode_context=2048)
    dense = step_cost(model, hw, decode_seqs=32, decode_context=32768)
    assert capped.breakdown["attention_core"]["t"] < sparse.breakdown["attention_core"]["t"] \
        < dense.breakdown["attention_core"]["t"]


def test_memory_projection_llama_70b():
    model, h100 = catalog.model_preset("llama-3.1-70b"), catalog.hardware_preset("h100")
    one = memory_projection(model, h100)
    assert not one.fits and one.reason == "weights do not fit in HBM" and one.max_sequences == 0
    assert one.weights_per_gpu == pytest.approx(70.55e9 * 2, rel=0.01)  # ~70.6B parameters in BF16
    eight = memory_projection(model, h100, parallel=Parallelism(tp=8), context=4096, activation_gb=4.0)
    assert eight.fits and eight.reason == "ok"
    # everything splits over the 8 GPUs but the RMSNorm weights (2 per layer and a final one), replicated
    norms = 80 * 2 * 8192 + 8192
    weights = (catalog.weight_bytes(model, 2) - norms * 2) / 8 + norms * 2
    assert eight.weights_per_gpu == pytest.approx(weights, rel=1e-9)
    free = 80e9 * 0.9 - weights - 4e9
    assert eight.free_kv_bytes == pytest.approx(free)
    per_sequence = 4096 * 80 * 1 * 128 * 2 * 2
    assert eight.max_sequences == math.floor(free / per_sequence)


def test_paged_rounding_and_kv_limit():
    model, h100 = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")
    mem = memory_projection(model, h100, context=17, block_tokens=16)
    assert mem.kv_bytes_per_sequence == 32 * 131_072
    assert memory_projection(model, h100, context=16, block_tokens=16).kv_bytes_per_sequence == 16 * 131_072
    # a context whose KV exceeds what is left after the weights
    huge = memory_projection(model, h100, context=500_000, activation_gb=4.0)
    assert not huge.fits and huge.reason == "KV for one sequence does not fit"
    # attention-DP groups each hold their own sequences
    dp = memory_projection(model, h100, context=4096, parallel=Parallelism(attention_dp=4))
    single = memory_projection(model, h100, context=4096)
    assert dp.max_sequences == 4 * single.max_sequences


def test_operating_point_loose_and_tight():
    model, h100 = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")
    mem = memory_projection(model, h100, context=2048)
    loose = operating_point(model, h100, context=2048, tpot_target_s=10.0, memory=mem)
    assert loose.feasible and loose.batch == mem.max_sequences and loose.limited_by == "memory"
    target, tpp = 0.01, 1.6
    tight = operating_point(model, h100, context=2048, tpot_target_s=target, verify_tokens=2, tokens_per_pass=tpp,
                            memory=mem)
    assert tight.feasible and 1 < tight.batch < mem.max_sequences and tight.limited_by == "tpot"
    at = step_cost(model, h100, decode_seqs=tight.batch, decode_context=2048, verify_tokens=2).t_step
    above = step_cost(model, h100, decode_seqs=tight.batch + 1, decode_context=2048, verify_tokens=2).t_step
    assert tight.step_time_s == pytest.approx(at)
    assert at / tpp <= target < above / tpp
    assert tight.tpot_s == pytest.approx(at / tpp)
    assert tight.decode_tok_s_per_gpu == pytest.approx(tight.batch * tpp / at)
    capped = operating_point(model, h100, context=2048, tpot_target_s=10.0, max_batch=7, memory=mem)
    assert capped.batch == 7 and capped.limited_by == "max_batch"
    never = operating_point(model, h100, context=2048, tpot_target_s=1e-4, memory=mem)
    assert not never.feasible and never.reason == "TPOT target not met at batch 1"
    no_room = operating_point(model, h100, context=2048, tpot_target_s=1.0,
                              memory=memory_projection(catalog.model_preset("llama-3.1-70b"), h100))
    assert not no_room.feasible and no_room.batch == 0 and no_room.reason == "weights do not fit in HBM"


def test_pipeline_stages_run_as_micro_batches():
    # two pipeline stages: two micro-batches, each sequence crosses both stages
    from mcsim.perf.capacity import _instance_step_time

    model, hw = catalog.model_preset("llama-3.1-8b"), catalog.hardware_preset("h100")
    kwargs = {"parallel": Parallelism(pp=2), "decode_context": 1000, "prefill_context": 0}
    half = step_cost(model, hw, decode_seqs=32, decode_context=1000, parallel=Parallelism(pp=2)).t_step
    assert _instance_step_time(model, hw, 64, 0, kwargs) == pytest.approx(2 * half)


def test_rejects_bad_layouts():
    model, hw = catalog.model_preset("mixtral-8x7b"), catalog.hardware_preset("h100")
    with pytest.raises(ValueError, match="ep"):
        step_cost(model, hw, decode_seqs=1, decode_context=1, parallel=Parallelism(tp=4, ep=3))
    with pytest.raises(ValueError, match="all-reduce"):
        step_cost(model, hw, decode_seqs=1, decode_context=1, parallel=Parallelism(tp=2),
                  collectives=Collectives(allreduce="butterfly"))
    with pytest.raises(ValueError, match="compute"):
        step_cost(model, hw, decode_seqs=1, decode_context=1, precision=Precision(compute="int8"))


def test_verify_tokens_share_the_kv_read():
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, verify_tokens=2, achievable=HALF)
    n = 3 * 2  # 3 sequences verifying 2 tokens each
    # each sequence reads its 10 tokens of context once for both tokens; 6 new tokens write KV
    check_op(cost, "attention_core", 2 * 4 * 4 * 16 * 10 * n, 2 * ((3 * 10 + 6) * 128 + n * 2 * 64 * 2))
    check_op(cost, "lm_head", 2 * n * 100 * 64, 100 * 64 * 2 + n * (64 + 100) * 2)


def test_mla_attention_core_by_hand():
    model, hw = catalog.model_preset("deepseek-v3"), catalog.hardware_preset("h800")
    decode = step_cost(model, hw, decode_seqs=1, decode_context=1000)
    # absorbed MLA: per head, scores over the 512 latent + 64 RoPE dims, values over the 512 latent
    flops = 61 * 2 * 128 * (2 * 512 + 64) * 1000
    kv = 61 * (1000 + 1) * (512 + 64) * 2
    act = 61 * 128 * (2 * 512 + 64) * 2
    assert decode.breakdown["attention_core"]["flops"] == pytest.approx(flops)
    assert decode.breakdown["attention_core"]["bytes"] == pytest.approx(kv + act)
    assert decode.kv_bytes == pytest.approx(kv)
    prefill = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=1024, prefill_context=3000)
    # MHA form: q.k over 128 + 64 dims and p.v over 128 per head, plus up-projecting 3000 prefix latents
    # into 128 heads x (128 key + 128 value) once
    flops = 61 * (2 * 128 * (128 + 64 + 128) * 1024 * 3000 + 2 * 3000 * 512 * 128 * (128 + 128))
    assert prefill.breakdown["attention_core"]["flops"] == pytest.approx(flops)
    # TP splits the heads but every GPU reads the whole latent
    tp8 = step_cost(model, hw, decode_seqs=1, decode_context=1000, parallel=Parallelism(tp=8, ep=8))
    assert tp8.breakdown["attention_core"]["flops"] == pytest.approx(decode.breakdown["attention_core"]["flops"] / 8)
    assert tp8.kv_bytes == pytest.approx(decode.kv_bytes)


def test_hardware_is_a_typed_object():
    import doctest

    from mcsim.perf import hardware
    from mcsim.perf.hardware import Hardware, as_hardware

    assert doctest.testmod(hardware).failed == 0
    entry = catalog.hardware_preset("h100")
    hw = as_hardware(entry)
    assert isinstance(hw, Hardware) and hw.hbm_bytes == entry["hbm_gb"] * 1e9
    assert hw.peak_flops("bf16") == entry["bf16_tflops"] * 1e12
    # no FP4 on H100: the next wider format's peak
    assert hw.peak_flops("fp4") == entry["fp8_tflops"] * 1e12
    # a sample's flat parameters describe the same accelerator
    assert as_hardware({f"hardware.{k}": v for k, v in entry.items()} | {"model.layers": 80}).tflops == hw.tflops
    model = catalog.model_preset("llama-3.1-8b")
    a = step_cost(model, entry, decode_seqs=32, decode_context=1000).t_step
    assert step_cost(model, hw, decode_seqs=32, decode_context=1000).t_step == a


def test_prefill_steps_use_their_own_allreduce_algorithm():
    model, hw = catalog.model_preset("llama-3.1-70b"), catalog.hardware_preset("h100")
    collectives = Collectives(allreduce="one-shot", prefill_allreduce="ring", allreduce_impl="nccl")
    base, hop, bus = hw["collective_base_us"] * 1e-6, hw["collective_hop_us"] * 1e-6, hw["allreduce_bus_gb_s"] * 1e9
    p = 8
    # the closed forms inside a node with the measured fixed cost, hop latency and bus bandwidth
    closed = {"one-shot": lambda s: base + (p - 1) * s / bus + hop,
              "ring": lambda s: base + 2 * (p - 1) / p * s / bus + 2 * (p - 1) * hop}
    for decode, prefill, algorithm in ((8, 0, "one-shot"), (0, 2048, "ring"), (8, 512, "ring")):
        cost = step_cost(model, hw, decode_seqs=decode, decode_context=100, prefill_tokens=prefill,
                         parallel=Parallelism(tp=p), collectives=collectives)
        message = (decode + prefill) * model["hidden_size"] * 2.0  # BF16 activations of the step's tokens
        assert cost.breakdown["tp_allreduce"]["t"] == pytest.approx(2 * model["layers"] * closed[algorithm](message),
                                                                   rel=1e-12)


def test_fused_kernels_keep_the_elementwise_bytes_and_drop_the_floors():
    floor = 3e-6
    unfused = dict(HALF.__dict__, kernel_floor_s=floor)
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, achievable=Achievable(**unfused))
    fused = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10,
                      achievable=Achievable(**dict(unfused, fused=True)))
    n, layers = 3, 2
    moved = layers * n * (512 + 704) * 2  # the bytes of test_tiny_decode_tp1_by_hand
    kernels = layers * 6  # two RMSNorms, RoPE, SwiGLU and two residual adds per layer
    assert cost.breakdown["elementwise"]["t"] == pytest.approx(moved / RATE + kernels * floor, rel=1e-12)
    assert fused.breakdown["elementwise"]["bytes"] == pytest.approx(moved, rel=1e-12)
    assert fused.breakdown["elementwise"]["t"] == pytest.approx(moved / RATE, rel=1e-12)
    assert fused.breakdown["elementwise"]["floor"] == 0.0


def test_the_engines_own_allreduce_inside_a_node_and_nccl_beyond():
    from mcsim.perf.collectives import tp_allreduce

    model, hw = catalog.model_preset("llama-3.1-70b"), catalog.hardware_preset("h100")
    hop, bw = hw["custom_allreduce_hop_us"] * 1e-6, hw["custom_allreduce_gb_s"] * 1e9
    h = model["hidden_size"]
    # vLLM's rule at TP 8: one stage below 256 KiB (reading 7 peers' buffers), two stages up to 8 MiB, then NCCL
    for tokens, ran, closed in ((8, "custom one-shot", lambda s: hop + 7 * s / bw),
                                (64, "custom two-shot", lambda s: 2 * hop + 2 * 7 / 8 * s / bw),
                                (1024, "nccl", None)):
        cost = step_cost(model, hw, decode_seqs=tokens, decode_context=100, parallel=Parallelism(tp=8))
        op = cost.breakdown["tp_allreduce"]
        assert op["impl"].startswith(ran)
        message = tokens * h * 2.0
        if closed is not None:  # two per layer, none of it hidden in a plain forward pass
            assert op["t"] == pytest.approx(2 * model["layers"] * closed(message), rel=1e-12)
        else:  # 16 MiB: NCCL's two-shot with the measured fixed cost, hop latency and bus bandwidth
            base, nccl_hop = hw["collective_base_us"] * 1e-6, hw["collective_hop_us"] * 1e-6
            two_shot = base + 2 * 7 / 8 * message / (hw["allreduce_bus_gb_s"] * 1e9) + 2 * nccl_hop
            assert op["impl"] == "nccl two-shot"
            assert op["t"] == pytest.approx(2 * model["layers"] * two_shot, rel=1e-12)
    # at TP 4 one stage up to 512 KiB; across nodes (TP 16) NCCL; impl="nccl" never the engine's kernels
    assert tp_allreduce(400 * 1024, 4, hw)[2] == "custom one-shot"
    assert tp_allreduce(400 * 1024, 8, hw)[2] == "custom two-shot"
    assert tp_allreduce(4096, 16, hw)[2].startswith("nccl")
    assert tp_allreduce(4096, 8, hw, impl="nccl")[2].startswith("nccl")
    assert tp_allreduce(32 << 20, 8, hw, impl="custom")[2] == "custom two-shot"
    # auto takes the faster, and the kernels never at 8 MiB or more: on eight GPUs the kernels win at 4 MiB, NCCL
    # runs at 8 MiB even where the kernels would be faster
    nccl_t = tp_allreduce(4 << 20, 8, hw, impl="nccl")[0]
    t, _, ran = tp_allreduce(4 << 20, 8, hw)
    assert ran == "custom two-shot" and t < nccl_t
    assert tp_allreduce(8 << 20, 8, hw)[2].startswith("nccl")
    # a fused GEMM + all-reduce hides what allreduce_overlap says, and the all-to-all overlap does not touch it
    plain = step_cost(model, hw, decode_seqs=8, decode_context=100, parallel=Parallelism(tp=8))
    fused = step_cost(model, hw, decode_seqs=8, decode_context=100, parallel=Parallelism(tp=8),
                      collectives=Collectives(allreduce_overlap=0.25, overlap=0.9))
    assert fused.breakdown["tp_allreduce"]["t"] == pytest.approx(0.75 * plain.breakdown["tp_allreduce"]["t"])
    with pytest.raises(ValueError, match="implementation"):
        tp_allreduce(4096, 8, hw, impl="mpi")


def test_the_custom_allreduce_against_the_measured_h100_times():
    """vLLM 0.24.0's custom all-reduce timed on H100 under CUDA graphs (AIConfigurator's table, tests/data; TP 2/4/8,
    256 B to 8 MiB), what the catalog's figures are fitted to: within 5 % on average and 20 % at worst. SGLang's
    published eager-mode unit test (github.com/sgl-project/sglang/pull/2904), which the figures were fitted to
    before, is 1.3-2.3x slower from 256 KiB up: an eager kernel launch is not what a served decode step pays."""
    from pathlib import Path

    from mcsim.calibration import aiconfigurator
    from mcsim.perf.collectives import custom_allreduce

    table = aiconfigurator.read_table(Path(__file__).parent / "data" / "aiconfigurator"
                                      / "h100_vllm_0.24.0_custom_allreduce.csv", aiconfigurator.ALLREDUCE_COLUMNS,
                                      "a custom all-reduce table")
    hw = catalog.hardware_preset("h100")
    errors = []
    for p, elements, ms, backend in zip(table["num_gpus"], table["message_size"], table["latency"], table["backend"]):
        nbytes = 2.0 * elements
        if backend == "vllm_graph" and nbytes < 8 << 20:
            errors.append(custom_allreduce(nbytes, int(p), hw)[0] / (ms * 1e-3) - 1)
    assert len(errors) == 45 and np.mean(np.abs(errors)) < 0.05 and max(np.abs(errors)) < 0.20
    sglang = {(8, 262144): 16.7, (8, 524288): 22.1, (8, 1048576): 33.8, (4, 1048576): 31.1}  # us, eager
    for (p, nbytes), us in sglang.items():
        assert 1.3 < us / (custom_allreduce(nbytes, p, hw)[0] * 1e6) < 2.5


def test_measured_gemm_shapes_are_priced_at_their_measured_times():
    # Llama-3.1-70B has Llama-2-70B's layer shapes: at a token count Vidur measured on H100, the step model with
    # Vidur's fit prices one layer's QKV + O and gate/up + down projections at the measured medians (the
    # surface's residuals; rows read here from the CSVs themselves), within their spread where a shape was measured
    # more than once.
    import csv
    from importlib import resources

    from mcsim.perf import gemm_surface

    folder = resources.files("mcsim.data") / "measurements/vidur/compute/h100"
    with (folder / "Llama-2-70b-hf/mlp.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    with (folder / "CodeLlama-34b-Instruct-hf/mlp.csv").open() as handle:  # the same attention shapes
        codellama = list(csv.DictReader(handle))
    from mcsim.calibration.files import load

    # Vidur's H100 fit and surface (the bundled second source; the catalog's H100 GEMMs are vLLM 0.24.0's)
    hw = catalog.hardware_preset("h100")
    vidur = {key: spec["estimate"] for key, spec in load(gemm_surface.bundled_path("h100")).parameters.items()}
    achievable = Achievable(flops_fraction=vidur["performance.flops_fraction"],
                            bandwidth_fraction=vidur["performance.bandwidth_fraction"],
                            gemm_half_tokens=vidur["performance.gemm_half_tokens"],
                            gemm_floor_s=vidur["performance.gemm_floor_s"],
                            gemm_surface=gemm_surface.for_hardware("h100"))
    model = dict(catalog.model_preset("llama-3.1-70b"), layers=1, dense_layers=1)
    measured = {}
    for row in rows + codellama:
        tokens, tp = int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])
        times = [float(row[f"time_stats.{name}.median"]) for name in
                 ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")]
        ffn = times[2] + times[3] if row in rows else None  # CodeLlama's FFN is another shape
        if tokens in (1, 8, 64, 512, 2048):
            measured.setdefault((tokens, tp), []).append((times[0] + times[1], ffn))
    checked = 0
    for (tokens, tp), repeats in measured.items():
        cost = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=tokens,
                         parallel=Parallelism(tp=tp), achievable=achievable)
        for name, j in (("attention_proj", 0), ("dense_ffn", 1)):
            modelled = cost.breakdown[name]["t"] * 1e3
            times = [r[j] for r in repeats if r[j] is not None]
            if len(times) == 1:
                assert modelled == pytest.approx(times[0], rel=2e-3)
            else:  # a shape measured more than once (two models, or twice): between them
                assert min(times) * 0.999 <= modelled <= max(times) * 1.001
        checked += 1
    assert checked >= 16
    # without the surface the same 512-token FFN at TP 1 is the one-curve roofline's (too slow by ~1.3x)
    plain = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=464, parallel=Parallelism(tp=1),
                      achievable=Achievable(**{**achievable.__dict__, "gemm_surface": None}))
    measured = next(float(r["time_stats.mlp_up_proj.median"]) + float(r["time_stats.mlp_down_proj.median"])
                    for r in rows if r["num_tokens"] == "464" and r["num_tensor_parallel_workers"] == "1")
    assert plain.breakdown["dense_ffn"]["t"] * 1e3 > 1.2 * measured


def test_an_unmeasured_accelerator_draws_its_gemm_efficiency_a_measured_one_keeps_its_fit():
    """MI300X has no measured GEMMs: its roofline efficiencies are uncertain inputs drawn per sample
    (recorded in the result), the figures each sample's step model uses; H100 keeps its fitted figures and draws
    nothing, and a scenario that states the fraction draws nothing either."""
    import mcsim
    from mcsim.perf.hardware import performance_defaults
    from mcsim.scenario import draw_uncertain, load_scenario, resolve
    from mcsim.scenario.schema import UNMEASURED_FLOPS_FRACTION

    def params(preset, *extra):
        scn = load_scenario(DENSE_NODE, overrides=[
            'performance.fidelity="roofline"', f'hardware.preset="{preset}"', *extra])
        draws = draw_uncertain(scn, np.arange(64), 7)
        return scn, draws, [performance_defaults(resolve(scn, {k: v[i] for k, v in draws.items()}))
                            for i in range(64)]

    scn, draws, ps = params("mi300x")
    flops = draws["performance.unmeasured_flops_fraction"]
    assert [p["performance.flops_fraction"] for p in ps] == list(flops)
    assert [p["performance.bandwidth_fraction"] for p in ps] == list(draws["performance.unmeasured_bandwidth_fraction"])
    law = UNMEASURED_FLOPS_FRACTION
    assert law["low"] <= flops.min() and flops.max() <= law["high"] and np.ptp(flops) > 0.1  # spread over samples
    # the triangular law's median (its mode lies below the middle): low + sqrt((high - low)(mode - low) / 2)
    median = law["low"] + np.sqrt(0.5 * (law["high"] - law["low"]) * (law["mode"] - law["low"]))
    assert abs(np.median(flops) - median) < 0.03

    scn, draws, ps = params("h100")
    assert not any("unmeasured" in k for k in draws)
    assert {p["performance.flops_fraction"] for p in ps} == {catalog.hardware_preset("h100")["gemm_flops_fraction"]}
    scn, draws, ps = params("mi300x", "performance.flops_fraction=0.5")
    assert "performance.unmeasured_flops_fraction" not in draws and "performance.unmeasured_bandwidth_fraction" in draws
    assert {p["performance.flops_fraction"] for p in ps} == {0.5}

    # A sweep over the accelerator draws the stand-ins for every point; the H100 point reads none of them, so its
    # figures are those of the H100 run alone (each input has its own stream).
    swept = mcsim.sweep(DENSE_NODE, ["hardware.preset=h100,mi300x"], samples=2, requests=1500,
                        overrides=['performance.fidelity="roofline"'])
    alone = mcsim.run(DENSE_NODE, samples=2, requests=1500, overrides=['performance.fidelity="roofline"'])
    assert "performance_unmeasured_flops_fraction" in swept and "performance_unmeasured_flops_fraction" not in alone
    np.testing.assert_array_equal(swept["decode_tok_s_per_gpu"].sel(hardware_preset="h100").values,
                                  alone["decode_tok_s_per_gpu"].values)


@pytest.mark.parametrize("overlap", [0.0, 0.4, 0.7, 0.9, 1.0])
def test_communication_hides_behind_no_more_than_the_steps_compute(overlap):
    """A DeepSeek-V3 prefill step on 32 GPUs (EP32, as a disaggregated prefill instance runs it) whose all-to-all
    outweighs its compute: two micro-batches hide at most what the step computes, so the step is never shorter
    than its communication, and below the cap the share hidden is the overlap's."""
    model, hw = catalog.model_preset("deepseek-v3"), catalog.hardware_preset("h800")
    parallel = Parallelism(tp=1, attention_dp=32, ep=32)
    common = dict(prefill_tokens=16384, prefill_context=4000, decode_seqs=0, decode_context=0, parallel=parallel,
                  achievable=Achievable(step_overhead_s=0.0, launch_overhead_s=0.0))
    plain = step_cost(model, hw, collectives=Collectives(overlap=0.0), **common)
    cost = step_cost(model, hw, collectives=Collectives(overlap=overlap), **common)
    alltoall = plain.breakdown["ep_alltoall"]["t"]
    compute = plain.t_step - plain.t_comm_exposed
    assert alltoall > compute > 0  # the case where an unbounded overlap made the step shorter than its all-to-all
    hidden = min(overlap * alltoall, compute)  # closed form
    assert cost.breakdown["ep_alltoall"]["hidden"] == pytest.approx(hidden, rel=1e-12)
    assert cost.breakdown["ep_alltoall"]["t"] == pytest.approx(alltoall - hidden, rel=1e-12)
    assert cost.t_step == pytest.approx(compute + alltoall - hidden, rel=1e-12)
    assert cost.t_step >= alltoall * (1 - 1e-12) and cost.t_step >= compute
    if overlap == 1.0:
        assert cost.t_step == pytest.approx(max(alltoall, compute), rel=1e-12)


@pytest.mark.parametrize("decodes, prefill", [(27, 512), (8, 2048), (64, 256), (200, 1000)])
def test_a_mixed_step_is_one_gemm_of_all_its_rows_plus_each_sequences_attention(decodes, prefill):
    """One step, one price: a step of d decodes and p prefill tokens costs a prefill step of d + p tokens (every
    GEMM once at M = d + p rows, on the measured H100 surface) plus the decodes' own attention over their context,
    within 1 %, the rest being the prefill attention of d more tokens."""
    from mcsim.perf import gemm_surface
    from mcsim.perf.hardware import as_hardware, gemm_figures

    model, hw = catalog.model_preset("llama-3.1-70b"), catalog.hardware_preset("h100")
    fig = gemm_figures(as_hardware(hw))
    achievable = Achievable(flops_fraction=fig["performance.flops_fraction"],
                            bandwidth_fraction=fig["performance.bandwidth_fraction"],
                            gemm_half_tokens=fig["performance.gemm_half_tokens"],
                            gemm_floor_s=fig["performance.gemm_floor_s"],
                            gemm_surface=gemm_surface.for_hardware(as_hardware(hw).gemm_surface))
    common = dict(achievable=achievable, parallel=Parallelism(tp=4), prefill_context=500)
    mixed = step_cost(model, hw, decode_seqs=decodes, decode_context=2000, prefill_tokens=prefill, **common)
    as_prefill = step_cost(model, hw, decode_seqs=0, decode_context=0, prefill_tokens=decodes + prefill, **common)
    decode = step_cost(model, hw, decode_seqs=decodes, decode_context=2000, **common)
    for op in ("attention_proj", "dense_ffn", "tp_allreduce", "elementwise"):  # the same rows, the same price
        assert mixed.breakdown[op]["t"] == pytest.approx(as_prefill.breakdown[op]["t"], rel=1e-12), op
    expected = as_prefill.t_step + decode.breakdown["attention_core"]["t"]
    assert mixed.t_step == pytest.approx(expected, rel=0.01)


def test_fp8_gemms_are_priced_from_measured_fp8_gemms_not_the_bf16_curve():
    """Llama-3-70B at TP8 in FP8 on H100: each measured FFN and output-projection GEMM (AIConfigurator's vLLM 0.24.0
    table, tests/data/aiconfigurator) is priced by the step model within a few per cent of its measured time,
    where the BF16 curve at the FP8 peak (what FP8 GEMMs were priced by before) is far faster than measured."""
    from pathlib import Path

    from dataclasses import replace

    from mcsim.calibration import aiconfigurator
    from mcsim.perf.hardware import as_hardware
    from mcsim.perf.roofline import gemm_seconds
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    table = aiconfigurator.read_table(Path(__file__).parent / "data" / "aiconfigurator"
                                      / "h100_vllm_0.24.0_llama70b_tp8_gemms.csv")
    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"'])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    linear = opts["achievable"].linear
    assert linear is not None and linear.flops_fraction == catalog.hardware_preset("h100")["gemm_fp8_flops_fraction"]
    hw = as_hardware(p)
    fp8 = table["gemm_dtype"] == "fp8"
    modelled_new, modelled_old = [], []
    for m, n, k in zip(table["m"][fp8], table["n"][fp8], table["k"][fp8]):
        nbytes = n * k * 1.0 + m * (n + k) * 2.0
        modelled_new.append(gemm_seconds(2 * m * n * k, nbytes, hw.peak_flops("fp8") * linear.flops_fraction,
                                         hw.hbm_bytes_s * linear.bandwidth_fraction, rows=m,
                                         half_tokens=linear.gemm_half_tokens, floor_s=linear.gemm_floor_s,
                                         factor=linear.gemm_surface.factor(m, n, k)))
        bf16 = opts["achievable"]
        modelled_old.append(gemm_seconds(2 * m * n * k, nbytes, hw.peak_flops("fp8") * bf16.flops_fraction,
                                         hw.hbm_bytes_s * bf16.bandwidth_fraction, rows=m,
                                         half_tokens=bf16.gemm_half_tokens, floor_s=bf16.gemm_floor_s,
                                         factor=bf16.gemm_surface.factor(m, n, k)))
    measured = table["latency"][fp8] * 1e-3
    new, old = np.array(modelled_new) / measured, np.array(modelled_old) / measured
    assert np.mean(np.abs(new - 1)) < 0.05  # within the surface's cross-validated error
    # the BF16 curve at the FP8 peak: 1.2x too fast at the median, over 1.5x where the GEMMs are compute-bound
    assert np.median(old) < 0.85 and old.min() < 1 / 1.5

    # and a whole FP8 prefill step costs more than it did on the BF16 curve, by its GEMMs
    model = catalog.model_preset("llama-3.1-70b")
    plain = dict(opts, achievable=replace(opts["achievable"], linear=None))
    step_new = step_cost(model, catalog.hardware_preset("h100"), decode_seqs=0, decode_context=0,
                         prefill_tokens=4096, prefill_context=2000, **opts)
    step_old = step_cost(model, catalog.hardware_preset("h100"), decode_seqs=0, decode_context=0,
                         prefill_tokens=4096, prefill_context=2000, **plain)
    assert step_new.breakdown["dense_ffn"]["t"] > 1.2 * step_old.breakdown["dense_ffn"]["t"]
    assert step_new.breakdown["attention_core"]["t"] == step_old.breakdown["attention_core"]["t"]  # BF16 attention


def test_each_phase_hides_its_own_share_of_the_alltoall():
    """decode_comm_overlap prices steps without prefill tokens, prefill_comm_overlap steps with them; each hides
    min(share x all-to-all, compute) of its own step (closed form), and the scenario key they replace is refused
    in one line that names them."""
    from mcsim.scenario import ScenarioError, load_scenario

    model, hw = catalog.model_preset("deepseek-v3"), catalog.hardware_preset("h800")
    parallel = Parallelism(tp=1, attention_dp=32, ep=32)
    both = Collectives(overlap=0.2, prefill_overlap=0.9)
    for step in (dict(prefill_tokens=4096, prefill_context=2000, decode_seqs=0, decode_context=0),
                 dict(prefill_tokens=0, decode_seqs=256, decode_context=2000)):
        plain = step_cost(model, hw, parallel=parallel, collectives=Collectives(), **step)
        cost = step_cost(model, hw, parallel=parallel, collectives=both, **step)
        share = 0.9 if step["prefill_tokens"] else 0.2
        alltoall, compute = plain.breakdown["ep_alltoall"]["t"], plain.t_step - plain.t_comm_exposed - plain.t_overhead
        assert cost.breakdown["ep_alltoall"]["hidden"] == pytest.approx(min(share * alltoall, compute), rel=1e-12)
    with pytest.raises(ScenarioError, match="decode_comm_overlap and performance.prefill_comm_overlap"):
        load_scenario(DENSE_NODE, overrides=["performance.overlap_fraction=0.5"])


def test_measured_attention_figures_price_the_tiny_model_by_hand():
    """With measured attention figures, a mixed step's attention core is the decode call (KV stream at its own
    bandwidth share, or its FLOPs at the FLOP share where they take longer, plus a cost per sequence and KV head)
    plus the prefill call (FLOPs at the prefill share, which
    grows with head width, query-head tokens and context), plus one floor a layer; FLOPs and bytes are counted as
    before."""
    from dataclasses import replace

    from mcsim.perf.roofline import AttentionFigures

    figures = AttentionFigures(bandwidth_fraction=0.8, unit_s=1e-6, flops_fraction=0.5, prefill_bandwidth_fraction=0.25,
                               half_work=32.0, head_dim_half=16.0, half_context=2.0)
    measured = replace(HALF, attention=figures, attention_floor_s=2e-6)
    cost = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, prefill_tokens=8, prefill_context=6,
                     achievable=measured)
    plain = step_cost(TINY, TINY_HW, decode_seqs=3, decode_context=10, prefill_tokens=8, prefill_context=6,
                      achievable=replace(HALF, attention_floor_s=2e-6))
    layers, kv_token, heads, width = 2, 2 * 2 * 16 * 2, 4, 16  # 2 KV heads of 16 at 2 B, twice (K and V)
    decode_bytes = (3 * 10 + 3) * kv_token + 3 * 2 * heads * width * 2
    decode_flops = 4 * heads * width * 3 * 10  # 2 query heads a KV head: here the FLOPs outrun the stream
    decode = max(decode_bytes / (1e12 * 0.8), decode_flops / (1e12 * 0.5)) + 3 * 2 * 1e-6
    prefill_flops = 4 * heads * width * 8 * 6
    work = 8 * heads  # query-head tokens
    rate = 1e12 * 0.5 * width / (width + 16.0) * work / (work + 32.0) * 6 / (6 + 2.0)  # 6 tokens of context
    prefill_bytes = (6 + 8) * kv_token + 8 * 2 * heads * width * 2
    prefill = max(prefill_flops / rate, prefill_bytes / (1e12 * 0.25))
    assert cost.breakdown["attention_core"]["t"] == pytest.approx(layers * (decode + prefill + 2e-6), rel=1e-12)
    for key in ("flops", "bytes"):
        assert cost.breakdown["attention_core"][key] == pytest.approx(plain.breakdown["attention_core"][key])
    others = [op for op in cost.breakdown if op != "attention_core"]
    assert all(cost.breakdown[op]["t"] == plain.breakdown[op]["t"] for op in others)


def test_attention_is_priced_from_the_measured_kernels_of_its_gpu():
    """Llama-3.1-70B at TP8 on H100 (8 query heads, 1 KV head of 128 on each GPU): the step model's attention call
    against vLLM 0.24.0's measured FlashAttention-3 calls (the bundled rows), decode at 32-256 sequences of 1-8 k
    cached tokens and prefill of 1-4 prompts of 1-8 k tokens, within the fit's error; the GEMM figures, which price
    attention where its kernels were not measured, are far faster than measured on prefill."""
    from dataclasses import replace

    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    table = aic.read_table(aic.bundled("h100", "attention"), aic.ATTENTION_COLUMNS)
    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', 'precision.enabled=false'])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    assert opts["achievable"].attention is not None and opts["parallel"].tp == 8
    model = catalog.model_preset("llama-3.1-70b")
    rows = ((table["num_heads"] == 8) & (table["num_key_value_heads"] == 1) & (table["head_dim"] == 128)
            & (table["kv_cache_dtype"] == "bfloat16") & (table["window_size"] == 0)
            & (table["kernel_source"] == "vllm_flash_attn_fa3"))
    decode = rows & (table["op_name"] == "generation_attention") & (table["batch_size"] >= 32) \
        & (table["batch_size"] <= 256) & (table["step"] >= 1023) & (table["step"] <= 8191)
    prefill = rows & (table["op_name"] == "context_attention") & (table["batch_size"] <= 4) \
        & (table["isl"] >= 1024) & (table["isl"] <= 8192)
    assert decode.sum() >= 10 and prefill.sum() >= 10
    errors = {}
    for label, achievable in (("measured", opts["achievable"]), ("gemm figures", replace(opts["achievable"],
                                                                                       attention=None))):
        common = {**opts, "achievable": achievable}
        for phase, sel in (("decode", decode), ("prefill", prefill)):
            modelled = []
            for b, s, isl in zip(table["batch_size"][sel], table["step"][sel], table["isl"][sel]):
                if phase == "decode":
                    cost = step_cost(model, p, decode_seqs=b, decode_context=s, **common)
                else:
                    cost = step_cost(model, p, decode_seqs=0, decode_context=0, prefill_tokens=b * isl,
                                     prefill_context=isl / 2, **common)
                modelled.append(cost.breakdown["attention_core"]["t"] / model["layers"])  # one layer's call
            errors[label, phase] = np.asarray(modelled) / (table["latency"][sel] * 1e-3) - 1.0
    assert np.mean(np.abs(errors["measured", "decode"])) < 0.10
    assert np.mean(np.abs(errors["measured", "prefill"])) < 0.20
    assert np.median(errors["gemm figures", "prefill"]) < -0.2


def test_h200_over_h100_decode_is_the_ratio_of_their_measured_kernels():
    """Llama-3.1-70B at TP8 in BF16, decode of 64, 128 and 256 sequences over 2,048 tokens: H100's time over H200's for
    one layer's GEMMs, attention call and two all-reduces is, in the step model, the ratio of the same kernels
    timed on the two GPUs under vLLM 0.24.0 (the bundled rows: 1.23, 1.20 and 1.16; the QKV projection's 1,280
    columns between the measured 1,024 and 1,536), within 3 %: H200 is faster by its bandwidth where a step streams
    and by little where it computes, not by its 43 % more bandwidth nor by nothing."""
    from mcsim.calibration.aiconfigurator import layer_kernels
    from mcsim.validate import layer_error

    for batch, quoted in ((64, 1.23), (128, 1.20), (256, 1.16)):
        measured = layer_kernels("h100", batch) / layer_kernels("h200", batch)
        assert measured == pytest.approx(quoted, abs=0.005)
        # modelled / measured on each GPU, so the modelled ratio over the measured one is their quotient
        modelled_over_measured = (1 + layer_error("h100", "bfloat16", batch)) / (1 + layer_error("h200", "bfloat16",
                                                                                                batch))
        assert modelled_over_measured == pytest.approx(1.0, rel=0.03), batch


def test_precision_axes_price_each_op_in_its_own_format_by_hand():
    """The tiny MoE model with 4-bit expert weights computed in FP8 beside BF16 linear layers, unfused: the routed
    experts stream half a byte a weight, read their inputs at one byte, run at the FP8 peak and pay a cast kernel
    per input (read at two bytes, written at one); the shared expert and the router stay BF16, uncast."""
    from dataclasses import replace

    hw = dict(TINY_HW, fp8_tflops=2.0)
    mixed = Precision(weight_bytes=2.0, compute="bf16", experts="fp8", expert_weight_bytes=0.5)
    args = dict(decode_seqs=3, decode_context=10, parallel=Parallelism(tp=1, attention_dp=2, ep=2))
    cost = step_cost(TINY_MOE, hw, precision=mixed, achievable=HALF, **args)
    plain = step_cost(TINY_MOE, hw, achievable=HALF, **args)
    pairs, distinct_per_rank, expert = 3 * 2 / 2, 4 * (1 - 0.5 ** 3) / 2, 3 * 64 * 32
    flops = 2 * pairs * expert
    nbytes = distinct_per_rank * expert * 0.5 + pairs * ((2 * 32 * 2 + 64 * 1) + (64 * 2 + 32 * 1))
    assert cost.breakdown["moe_ffn"]["flops"] == pytest.approx(flops, rel=1e-12)
    assert cost.breakdown["moe_ffn"]["bytes"] == pytest.approx(nbytes, rel=1e-12)
    assert cost.breakdown["moe_ffn"]["t"] == pytest.approx(max(flops / (2e12 * 0.5), nbytes / 0.5e12), rel=1e-12)
    for op in ("shared_expert", "router", "attention_proj"):
        assert cost.breakdown[op]["t"] == plain.breakdown[op]["t"], op
    casts = pairs * (64 + 32) * (2 + 1)  # the gate/up input (64) and the down input (32), per routed pair
    assert cost.breakdown["elementwise"]["bytes"] == pytest.approx(plain.breakdown["elementwise"]["bytes"] + casts)
    fused = step_cost(TINY_MOE, hw, precision=mixed, achievable=replace(HALF, fused=True), **args)
    assert fused.breakdown["elementwise"]["bytes"] == pytest.approx(plain.breakdown["elementwise"]["bytes"])
    # the memory projection holds the routed experts at half a byte, everything else at two
    full = memory_projection(TINY_MOE, hw, precision=Precision(weight_bytes=2.0, expert_weight_bytes=0.5))
    bf16 = memory_projection(TINY_MOE, hw, precision=Precision(weight_bytes=2.0))
    assert bf16.weights_per_gpu - full.weights_per_gpu == pytest.approx(4 * expert * (2.0 - 0.5))


def test_a_4_bit_stored_8_bit_computed_linear_is_priced_by_the_8_bit_table():
    """Llama-3.1-70B's FFN at TP8 on H100 with 4-bit weights computed in FP8 (as W4A8 kernels run them): compute-bound
    (4,096 tokens), its two GEMMs cost what vLLM 0.24.0's FP8 GEMMs of those shapes measured (the bundled rows),
    within the FP8 fit's error; memory-bound (8 tokens), the same GEMMs at 8-bit weights cost the measured FP8 time
    and at 4-bit weights less, by the weight bytes they do not stream (the surface scales both alike)."""
    from dataclasses import replace

    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', "precision.weight_bytes=0.5",
                                               'precision.linear="fp8"', "efficiency.fused_kernels=true"])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    assert opts["precision"].linear_compute == "fp8" and opts["precision"].weight_bytes == 0.5
    assert opts["achievable"].linear.flops_fraction == catalog.hardware_preset("h100")["gemm_fp8_flops_fraction"]
    table = aic.read_table(aic.bundled("h100"))
    model = dict(catalog.model_preset("llama-3.1-70b"), layers=1, dense_layers=1)

    def measured(m):
        rows = (table["gemm_dtype"] == "fp8") & (table["m"] == m)
        return sum(table["latency"][rows & (table["n"] == n) & (table["k"] == k)].mean() * 1e-3
                   for n, k in ((7168, 8192), (8192, 3584)))

    big = step_cost(model, p, decode_seqs=0, decode_context=0, prefill_tokens=4096, prefill_context=2048, **opts)
    assert big.breakdown["dense_ffn"]["t"] == pytest.approx(measured(4096), rel=0.08)
    small = step_cost(model, p, decode_seqs=8, decode_context=2048, **opts)
    eight_bit = step_cost(model, p, decode_seqs=8, decode_context=2048,
                          **{**opts, "precision": replace(opts["precision"], weight_bytes=1.0)})
    assert eight_bit.breakdown["dense_ffn"]["t"] == pytest.approx(measured(8), rel=0.08)
    saved = (7168 * 8192 + 8192 * 3584) * 0.5 / (3.35e12 * opts["achievable"].linear.bandwidth_fraction)
    assert small.breakdown["dense_ffn"]["t"] < eight_bit.breakdown["dense_ffn"]["t"] - 0.5 * saved


def test_fp4_gemms_on_b200_are_priced_from_its_measured_nvfp4_gemms():
    """B200 computing the linear layers in FP4 takes its NVFP4 figures and surface (vLLM 0.24.0's table):
    Llama-3.1-70B's FFN at TP8 over 4,096 tokens costs the measured NVFP4 GEMMs within the fit's error, where the
    BF16 figures at the FP4 peak would be far faster; H100, without FP4 tensor cores or an FP4 table, falls back to
    FP8's."""
    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    def sample(preset):
        scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', 'precision.compute="fp4"',
                                                   "precision.weight_bytes=0.5", f'hardware.preset="{preset}"'])
        p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
        return p, options(p)

    p, opts = sample("b200")
    b200 = catalog.hardware_preset("b200")
    assert opts["achievable"].linear.flops_fraction == b200["gemm_fp4_flops_fraction"]
    table = aic.read_table(aic.bundled("b200"))
    rows = (table["gemm_dtype"] == "nvfp4") & (table["m"] == 4096)
    measured = sum(table["latency"][rows & (table["n"] == n) & (table["k"] == k)].mean() * 1e-3
                   for n, k in ((7168, 8192), (8192, 3584)))
    model = dict(catalog.model_preset("llama-3.1-70b"), layers=1, dense_layers=1)
    cost = step_cost(model, p, decode_seqs=0, decode_context=0, prefill_tokens=4096, prefill_context=2048, **opts)
    assert cost.breakdown["dense_ffn"]["t"] == pytest.approx(measured, rel=0.08)
    from dataclasses import replace

    bf16_curve = step_cost(model, p, decode_seqs=0, decode_context=0, prefill_tokens=4096, prefill_context=2048,
                           **{**opts, "achievable": replace(opts["achievable"], linear=None)})
    assert bf16_curve.breakdown["dense_ffn"]["t"] < 0.8 * measured
    _, h100 = sample("h100")
    assert h100["achievable"].linear is None  # no FP4 figures: the BF16 ones at the widest peak it has (FP8)


@pytest.mark.parametrize("mode, decode, mixed", [("none", "none", "none"), ("full", "full", "full"),
                                                 ("full_decode_only", "full", "none"),
                                                 ("full_and_piecewise", "full", "piecewise")])
def test_cudagraph_modes_launch_decode_and_mixed_steps_as_the_engines_do(mode, decode, mixed):
    """The tiny model's 2 layers of 12 kernels: each costs the GPU 1 us between kernels; the host launches all 24
    eagerly at 10 us (none), each layer's attention call (2 kernels) and the 3 graphs between them (piecewise), or
    nothing a step does not hide (full), and only what it takes beyond the GPU's work is exposed. A decode-only step
    runs the mode's decode form, a step with prefill tokens its mixed form."""
    from dataclasses import replace

    base = Achievable(launch_overhead_s=1e-5, kernels_per_layer=12, step_overhead_s=0.0, fused=False,
                      flops_fraction=0.5, bandwidth_fraction=0.5, network_fraction=1.0)
    host = {"none": 24 * 1e-5, "full": 0.0, "piecewise": (4 + 3) * 1e-5}  # what the host launches
    args = dict(decode_seqs=3, decode_context=10)
    achievable = replace(base, cudagraph_mode=mode)
    for form, extra in ((decode, {}), (mixed, dict(prefill_tokens=8, prefill_context=4))):
        cost = step_cost(TINY, TINY_HW, achievable=achievable, **args, **extra)
        busy = sum(op["t"] for name, op in cost.breakdown.items() if name != "overhead")
        assert cost.t_overhead == pytest.approx(24 * 1e-6 + max(0.0, host[form] - busy), rel=1e-12)
    # a long step hides every eager launch: only the GPU's gaps between kernels remain
    long = step_cost(TINY, TINY_HW, achievable=achievable, decode_seqs=0, decode_context=0, prefill_tokens=4e6,
                     prefill_context=4)
    assert long.t_overhead == pytest.approx(24 * 1e-6, rel=1e-12)


def test_the_old_cuda_graphs_key_names_its_replacement(tmp_path):
    from mcsim.scenario import load_scenario
    from mcsim.scenario.loading import ScenarioError

    with pytest.raises(ScenarioError, match="performance.cudagraph_mode"):
        load_scenario(DENSE_NODE, overrides=["performance.cuda_graphs=false"])


def test_measured_fused_moe_prices_the_hot_ranks_experts_by_hand():
    """The tiny MoE model at EP 2 with a hot rank, its routed experts one fused MoE kernel at known figures: the
    hot rank's 4.5 pairs over its 1.75 expected experts, FP8 compute with 4-bit weights, priced by the formula
    written out here (fixed time; weights and activations at their own bandwidth shares, or FLOPs at a share that
    grows with pairs per expert; a cost per 64 x 128 output tile). No SwiGLU or cast kernel is added (the fused
    kernel holds them); the experts' error class multiplies them, the GEMM class does not."""
    import math
    from dataclasses import replace

    from mcsim.perf.fused_moe import ExpertFigures

    figures = ExpertFigures(0.4, 0.9, 0.6, 20.0, 3e-6, 5e-9)
    hot, args = 1.5, dict(decode_seqs=3, decode_context=10, parallel=Parallelism(tp=1, attention_dp=2, ep=2))
    fp8 = Precision(weight_bytes=2.0, compute="bf16", experts="fp8", expert_weight_bytes=0.5)
    measured = replace(HALF, moe=figures)
    cost = step_cost(TINY_MOE, TINY_HW, precision=fp8, achievable=measured, hot_rank_factor=hot, **args)
    plain = step_cost(TINY_MOE, TINY_HW, precision=fp8, achievable=HALF, hot_rank_factor=hot, **args)
    pairs, experts, h, w = hot * 3 * 2 / 2, 4 * (1 - 0.5 ** 3) / 2, 64, 32
    tokens = pairs / 2
    weights = experts * 3 * h * w * 0.5
    stream = (pairs * (h * 1 + 2 * w * 2) + pairs * 3 * w * 2 + pairs * (w * 1 + h * 2) + pairs * h * 2
              + tokens * h * 2 + tokens * h * (2 + 1) + pairs * w * (2 + 1))
    flops = 6 * pairs * h * w
    per_expert = pairs / experts
    tiles = (pairs / 64 + experts) * (math.ceil(2 * w / 128) + math.ceil(h / 128))
    expected = 3e-6 + max(flops / (2e12 * 0.4) * (per_expert + 20) / per_expert,
                          weights / (1e12 * 0.9) + stream / (1e12 * 0.6)) + tiles * 5e-9
    op = cost.breakdown["moe_ffn"]
    assert op["t"] == pytest.approx(expected, rel=1e-12)
    assert op["flops"] == pytest.approx(flops) and op["bytes"] == pytest.approx(weights + stream)
    swiglu_and_casts = pairs * 3 * w * 2 + pairs * (h + w) * (2 + 1)
    assert cost.breakdown["elementwise"]["bytes"] == pytest.approx(plain.breakdown["elementwise"]["bytes"]
                                                                   - swiglu_and_casts)
    errors = {"experts_fp8": 1.3, "experts": 1.7, "gemm": 1.9}  # only FP8 experts' error reaches moe_ffn
    erred = step_cost(TINY_MOE, TINY_HW, precision=fp8, hot_rank_factor=hot,
                      achievable=replace(measured, errors=errors), **args)
    assert erred.breakdown["moe_ffn"]["t"] == pytest.approx(1.3 * expected, rel=1e-12)
    assert erred.breakdown["router"]["t"] == pytest.approx(1.9 * cost.breakdown["router"]["t"], rel=1e-12)


@pytest.mark.parametrize("gpu, compute", [("h100", "bf16"), ("h100", "fp8"), ("b200", "fp4")])
def test_mixtral_experts_are_priced_by_the_measured_fused_moe_kernel(gpu, compute):
    """Mixtral-8x7B's experts at TP2 (4,096 x 14,336, top 2 of 8, each expert split over 2 GPUs) on H100 in BF16 and
    block-scaled FP8, and on B200 in NVFP4 (4-bit weights): the step model's routed experts under the roofline
    defaults against vLLM 0.24.0's fused MoE kernel on balanced routing (the bundled rows), 1-16,384 tokens, within
    3 % (a measured shape: the fit and its surface). Priced as grouped GEMMs at the GEMM tables' figures, as before
    the fused kernels were measured, the same layers come out 15 % or more fast somewhere."""
    from dataclasses import replace

    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    table = aic.read_table(aic.bundled(gpu, "moe"), aic.MOE_COLUMNS)
    rows = ((table["moe_dtype"] == aic.MOE_DTYPES[compute][0]) & (table["hidden_size"] == 4096)
            & (table["inter_size"] == 14336) & (table["num_experts"] == 8) & (table["topk"] == 2)
            & (table["moe_tp_size"] == 2))
    assert rows.sum() >= 20
    weight_bytes = {"bf16": 2, "fp8": 1, "fp4": 0.5}[compute]
    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', "deployment.tp=2",
                                               "deployment.gpus_per_instance=2", f'hardware.preset="{gpu}"',
                                               f"precision.enabled={str(compute != 'bf16').lower()}",
                                               f'precision.compute="{compute if compute != "bf16" else "fp8"}"',
                                               f"precision.weight_bytes={weight_bytes}"])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    assert opts["parallel"].gpus == 2 and opts["parallel"].ep == 1
    prefix = {"bf16": "experts_", "fp8": "experts_fp8_", "fp4": "experts_fp4_"}[compute]
    assert opts["achievable"].moe.flops_fraction == catalog.hardware_preset(gpu)[prefix + "flops_fraction"]
    mixtral = dict(catalog.model_preset("mixtral-8x7b"), layers=1, dense_layers=0)
    worst_before = 0.0
    for tokens, latency in zip(table["num_tokens"][rows], table["latency"][rows]):
        at = {**opts, "distinct_experts": min(8, 2 * tokens)}  # balanced routing
        cost = step_cost(mixtral, p, decode_seqs=tokens, decode_context=1, **at)
        ratio = cost.breakdown["moe_ffn"]["t"] / (latency * 1e-3)
        assert 0.97 <= ratio <= 1.03, (tokens, ratio)
        before = step_cost(mixtral, p, decode_seqs=tokens, decode_context=1,
                           **{**at, "achievable": replace(opts["achievable"], moe=None)})
        worst_before = min(worst_before, before.breakdown["moe_ffn"]["t"] / (latency * 1e-3) - 1)
    assert worst_before < -0.15


def test_a_factor_scenario_without_base_throughputs_takes_the_roofline_of_its_own_hardware(tmp_path):
    """dense-model.toml without its two base throughputs (and their base_hardware): the factor fidelity's base decode
    and prefill rates are the roofline's on the scenario's own model, parallelism and hardware (BF16, no lever), so a
    file written for another GPU gets that GPU's figures, in the order the GPUs' measured kernels put them; stating
    a base throughput (in the file, or by a grid) makes them the scenario's again."""
    import re

    from mcsim.perf.roofline_model import factor_bases, options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve
    from helpers import ROOT

    text = (ROOT / "scenarios" / "dense-model.toml").read_text()
    bare = re.sub(r"(?m)^base_(decode_tok_s_per_gpu|prefill_tok_s_per_gpu|hardware) = .*$", "", text)
    path = tmp_path / "bare.toml"
    path.write_text(bare)

    def sample(scn):
        return resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})

    plain = ['performance.fidelity="roofline"', "precision.enabled=false", "efficiency.fused_kernels=false",
             "efficiency.comm_overlap=false"]
    bases = {}
    for preset in ("a100", "h100", "h200", "b200"):
        scn = load_scenario(path, overrides=[f'hardware.preset="{preset}"'])
        assert scn["efficiency.base_source"] == "roofline"
        p = sample(scn)
        bases[preset] = factor_bases(p)
        # the same scenario at the roofline with no lever on: one decode step of the largest batch over 2,048
        # tokens, one prefill step of 8,192; the factor model's decode X b / (b + b_half) meets the first
        q = sample(load_scenario(path, overrides=[f'hardware.preset="{preset}"', *plain]))
        opts = options(q)
        gpus, per_gpu = opts["parallel"].gpus, q["deployment.max_batch_per_gpu"]
        model = catalog.model_preset(q["model.preset"])
        decode = step_cost(model, q, decode_seqs=per_gpu * gpus, decode_context=2048, **opts)
        prefill = step_cost(model, q, decode_seqs=0, decode_context=0, prefill_tokens=8192, prefill_context=4096,
                            **opts)
        half = p["efficiency.batch_half_saturation"]  # the factor sample's draw
        assert bases[preset][0] * per_gpu / (per_gpu + half) == pytest.approx(per_gpu / decode.t_step, rel=1e-9)
        assert bases[preset][1] == pytest.approx(8192 / prefill.t_step / gpus, rel=1e-9)
    assert bases["a100"][0] < bases["h100"][0] < bases["h200"][0] < bases["b200"][0]
    assert bases["a100"][1] < bases["h100"][1] < bases["b200"][1]
    stated = load_scenario(path, overrides=["efficiency.base_decode_tok_s_per_gpu=700"])
    assert stated["efficiency.base_source"] == "stated" and factor_bases(sample(stated))[0] == pytest.approx(700)
    gridded = load_scenario(path).with_values({"efficiency.base_prefill_tok_s_per_gpu": 2500.0})
    assert gridded["efficiency.base_source"] == "stated"
    assert load_scenario(ROOT / "scenarios" / "dense-model.toml")["efficiency.base_source"] == "stated"


def test_an_fp8_kv_cache_takes_its_own_measured_decode_figures():
    """Llama-3.1-70B at TP8 on H100 with an FP8 KV cache: a decode attention call is priced by the FP8 cache's
    decode figures (dequantizing costs more than the bytes save), against vLLM 0.24.0's FP8-KV calls at 32-256
    sequences of 1-8 k tokens within the fit's error, where the BF16 cache's figures at one byte are faster than
    measured; refitting the bundled calls gives the catalog's figures."""
    from dataclasses import replace

    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    h100 = catalog.hardware_preset("h100")
    refit = aic.fit_fp8_kv("h100")
    assert refit["attention_fp8_kv_bandwidth_fraction"] == pytest.approx(h100["attention_fp8_kv_bandwidth_fraction"],
                                                                        abs=1e-3)
    assert refit["mape"] < refit["mape_held"]
    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"'])  # FP8 weights and KV cache
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    assert opts["precision"].kv_bytes == 1.0
    table = aic.read_table(aic.bundled("h100", "attention"), aic.ATTENTION_COLUMNS)
    rows = ((table["op_name"] == "generation_attention") & (table["kv_cache_dtype"] == "fp8")
            & (table["num_heads"] == 8) & (table["num_key_value_heads"] == 1) & (table["head_dim"] == 128)
            & (table["window_size"] == 0) & (table["batch_size"] >= 32) & (table["batch_size"] <= 256)
            & (table["step"] >= 1023) & (table["step"] <= 8191) & (table["kernel_source"] == "vllm_flash_attn_fa3"))
    assert rows.sum() >= 10
    model = catalog.model_preset("llama-3.1-70b")
    ratios = {}
    for label, figures in (("fp8", opts["achievable"].attention),
                           ("bf16 at one byte", replace(opts["achievable"].attention, fp8_kv_bandwidth_fraction=0.0))):
        achievable = replace(opts["achievable"], attention=figures)
        ratios[label] = np.array([
            step_cost(model, p, decode_seqs=b, decode_context=s, **{**opts, "achievable": achievable})
            .breakdown["attention_core"]["t"] / model["layers"] / (ms * 1e-3)
            for b, s, ms in zip(table["batch_size"][rows], table["step"][rows], table["latency"][rows])])
    assert np.mean(np.abs(ratios["fp8"] - 1)) < 0.12
    one_byte = np.median(ratios["bf16 at one byte"])
    assert one_byte < np.median(ratios["fp8"]) and one_byte < 0.9


def test_mla_attention_is_priced_by_its_measured_kernels_as_the_fit_prices_them():
    """DeepSeek-V3's MLA attention on H100 under the roofline defaults: the step's attention call is the measured MLA
    figures' call (the absorbed decode form over every sequence's latent cache, its stream or its FLOPs; the MHA form
    for a prefill chunk), written out here from the formula, plus the measured module floor, over an FP8 cache the
    FP8 cache's own floor and decode figures; and the step model's projections and attention
    come within 15 % of vLLM 0.24.0's measured modules (the bundled rows) at 128 and 16 heads, where the roofline
    alone was about half of them."""
    from dataclasses import replace

    from mcsim.calibration import aiconfigurator as aic
    from mcsim.perf.roofline_model import options
    from mcsim.scenario import draw_uncertain, load_scenario, resolve

    scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', 'model.preset="deepseek-v3"',
                                               "precision.enabled=false", "deployment.tp=1",
                                               "deployment.gpus_per_instance=1", "efficiency.fused_kernels=true"])
    p = resolve(scn, {k: v[0] for k, v in draw_uncertain(scn, [0], 1).items()})
    opts = options(p)
    hw = catalog.hardware_preset("h100")
    mla = opts["achievable"].mla
    assert mla.bandwidth_fraction == hw["mla_bandwidth_fraction"] and mla.unit_s == hw["mla_unit_ns"] * 1e-9
    assert opts["achievable"].attention_floor_s == pytest.approx(hw["mla_floor_us"] * 1e-6)
    model = dict(catalog.model_preset("deepseek-v3"), layers=1, dense_layers=1)
    kv_lora, rope, nope, v = 512, 64, 128, 128
    peak, hbm = hw["bf16_tflops"] * 1e12, hw["hbm_tb_s"] * 1e12
    for batch, context in ((1, 2048), (64, 4096), (512, 1024)):
        cost = step_cost(model, p, decode_seqs=batch, decode_context=context, **opts)
        nbytes = (batch * context + batch) * (kv_lora + rope) * 2 + batch * 128 * (2 * kv_lora + rope) * 2
        call = max(nbytes / (hbm * mla.bandwidth_fraction),
                   2 * 128 * (2 * kv_lora + rope) * batch * context / (peak * mla.flops_fraction)) \
            + batch * 128 * mla.unit_s
        assert cost.breakdown["attention_core"]["t"] == pytest.approx(call + hw["mla_floor_us"] * 1e-6, rel=1e-9)
    prefill = step_cost(model, p, decode_seqs=0, decode_context=0, prefill_tokens=4096, prefill_context=2048,
                        **opts)
    flops = 2 * 128 * (nope + rope + v) * 4096 * 2048 + 2 * 2048 * kv_lora * 128 * (nope + v)
    nbytes = (2048 + 4096) * (kv_lora + rope) * 2 + 4096 * 128 * (nope + rope + v) * 2
    work = 4096 * 128
    rate = peak * mla.flops_fraction * work / (work + mla.half_work) * 2048 / (2048 + mla.half_context)
    expected = max(flops / rate, nbytes / (hbm * mla.prefill_bandwidth_fraction)) + hw["mla_floor_us"] * 1e-6
    assert prefill.breakdown["attention_core"]["t"] == pytest.approx(expected, rel=1e-9)
    # over an FP8 cache: the module floor and the decode call's stream and unit of the FP8 cache's own figures
    fp8_scn = load_scenario(DENSE_NODE, overrides=['performance.fidelity="roofline"', 'model.preset="deepseek-v3"',
                                                   "precision.enabled=true", "precision.kv_bytes=1",
                                                   "precision.weight_bytes=2", 'precision.compute="bf16"',
                                                   "deployment.tp=1", "deployment.gpus_per_instance=1",
                                                   "efficiency.fused_kernels=true"])
    q = resolve(fp8_scn, {k: v[0] for k, v in draw_uncertain(fp8_scn, [0], 1).items()})
    fp8_opts = options(q)
    assert fp8_opts["achievable"].attention_floor_s == pytest.approx(hw["mla_fp8_kv_floor_us"] * 1e-6)
    cost = step_cost(model, q, decode_seqs=64, decode_context=4096, **fp8_opts)
    nbytes = (64 * 4096 + 64) * (kv_lora + rope) * 1 + 64 * 128 * (2 * kv_lora + rope) * 2
    call = max(nbytes / (hbm * hw["mla_fp8_kv_bandwidth_fraction"]),
               2 * 128 * (2 * kv_lora + rope) * 64 * 4096 / (peak * mla.flops_fraction)) \
        + 64 * 128 * hw["mla_fp8_kv_unit_ns"] * 1e-9
    assert cost.breakdown["attention_core"]["t"] == pytest.approx(call + hw["mla_fp8_kv_floor_us"] * 1e-6, rel=1e-9)
    # against the measured modules: decode, BF16 projections and cache, 128 heads (TP1) and 16 (TP8)
    table = aic.read_table(aic.bundled("h100", "mla"), aic.MLA_COLUMNS)
    rows = np.flatnonzero((table["op_name"] == "mla_generation_module") & (table["gemm_type"] == "bfloat16")
                          & (table["kv_cache_dtype"] == "bfloat16") & np.isin(table["num_heads"], (16, 128))
                          & np.isin(table["batch_size"], (1, 16, 128, 512)) & np.isin(table["step"], (1024, 8192)))
    assert rows.size >= 12
    for i in rows:
        tp = int(128 // table["num_heads"][i])
        at = {**opts, "parallel": replace(opts["parallel"], tp=tp)}
        cost = step_cost(model, p, decode_seqs=table["batch_size"][i], decode_context=table["step"][i], **at)
        modelled = cost.breakdown["attention_proj"]["t"] + cost.breakdown["attention_core"]["t"]
        assert modelled / (table["latency"][i] * 1e-3) == pytest.approx(1.0, abs=0.15), (tp, table["batch_size"][i])

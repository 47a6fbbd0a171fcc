"""Model and hardware catalogs: schema, published facts, and sizes derived from a model's shape."""

import pytest

from mcsim.scenario import catalog

MODEL_NAMES = sorted(catalog.models())
HARDWARE_NAMES = sorted(catalog.hardware())


# --- schema ---------------------------------------------------------------------------------------------


def test_required_presets_are_present():
    assert {"deepseek-v3", "llama-3-70b", "llama-3.1-70b", "llama-3.1-8b"} <= set(MODEL_NAMES)
    assert {"a100", "h100", "h800", "h200", "b200", "mi300x"} <= set(HARDWARE_NAMES)


@pytest.mark.parametrize(
    ("table", "fields"),
    [(catalog.models, catalog.MODEL_FIELDS), (catalog.hardware, catalog.HARDWARE_FIELDS)],
    ids=["models", "hardware"],
)
def test_every_entry_has_every_field_with_its_declared_type(table, fields):
    for preset, entry in table().items():
        assert set(entry) == set(fields), preset
        for key, kind in fields.items():
            # exact type: a bool is an int subclass, and an int where a float is declared is a typo in TOML
            assert type(entry[key]) is kind, (preset, key, entry[key])


@pytest.mark.parametrize(
    ("table", "fields"),
    [(catalog.models, catalog.MODEL_FIELDS), (catalog.hardware, catalog.HARDWARE_FIELDS)],
    ids=["models", "hardware"],
)
def test_field_types_are_the_scalars_the_validator_accepts(table, fields):
    assert set(fields.values()) <= {int, float, str}
    assert {"name", "source"} <= set(fields)


@pytest.mark.parametrize("table", [catalog.models, catalog.hardware], ids=["models", "hardware"])
def test_every_entry_cites_a_source_and_has_a_lowercase_key(table):
    for preset, entry in table().items():
        assert preset == preset.lower()
        assert entry["source"].strip(), preset
        if preset == "cpu-host":  # a stand-in whose peaks are measured by `mcsim trace`, not published
            assert "measured" in entry["source"] and "NOT measured" in entry["source"]
            continue
        assert "http" in entry["source"] or "arXiv" in entry["source"], preset
        assert entry["name"].strip(), preset


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_model_fields_are_consistent(name):
    m = catalog.model_preset(name)
    assert m["attention"] in ("gqa", "mla")
    assert 0 <= m["dense_layers"] <= m["layers"]
    if m["dense_layers"] < m["layers"]:
        assert 0 < m["active_experts"] <= m["experts"] and m["expert_ffn"] > 0
    else:
        assert m["experts"] == m["active_experts"] == m["shared_experts"] == m["expert_ffn"] == 0
    if m["attention"] == "gqa":
        assert m["attention_heads"] % m["kv_heads"] == 0
        assert m["kv_lora_rank"] == m["qk_rope_head_dim"] == m["qk_nope_head_dim"] == m["v_head_dim"] == 0
    else:
        assert m["head_dim"] == m["qk_nope_head_dim"] + m["qk_rope_head_dim"]
    assert m["active_params_b"] <= m["total_params_b"]


@pytest.mark.parametrize("name", HARDWARE_NAMES)
def test_hardware_figures_are_plausible(name):
    h = catalog.hardware_preset(name)
    assert h["bf16_tflops"] > 0 and h["hbm_gb"] > 0 and h["hbm_tb_s"] > 0
    # a lower precision is never slower than a higher one where it exists
    if h["fp8_tflops"]:
        assert h["fp8_tflops"] >= h["bf16_tflops"]
    if h["fp4_tflops"]:
        assert h["fp4_tflops"] >= h["fp8_tflops"] > 0
    assert 0 < h["idle_w"] < h["tdp_w"]
    assert h["scale_up_gb_s"] > h["scale_out_gb_s"] > 0
    assert h["price_usd"] > 0 and h["rental_usd_per_hour"] > 0
    assert h["gpus_per_node"] == (1 if name == "cpu-host" else 8)
    # tensor cores: BF16 is faster than plain FP32 on every accelerator
    assert h["bf16_tflops"] >= h["fp32_tflops"] > 0


# --- published facts ------------------------------------------------------------------------------------


def test_deepseek_v3_shape_matches_the_published_config():
    m = catalog.model_preset("deepseek-v3")
    assert (m["layers"], m["hidden_size"], m["attention_heads"]) == (61, 7168, 128)
    assert m["attention"] == "mla"
    assert (m["kv_lora_rank"], m["qk_rope_head_dim"]) == (512, 64)
    assert (m["q_lora_rank"], m["qk_nope_head_dim"], m["v_head_dim"]) == (1536, 128, 128)
    assert m["dense_layers"] == 3
    assert (m["experts"], m["shared_experts"], m["active_experts"]) == (256, 1, 8)
    assert (m["expert_ffn"], m["dense_ffn"]) == (2048, 18432)
    assert m["vocab"] == 129_280
    assert m["mtp_layers"] == 1


def test_h800_has_h100_compute_but_less_scale_up_bandwidth():
    h100, h800 = catalog.hardware_preset("h100"), catalog.hardware_preset("h800")
    for key in ("bf16_tflops", "fp8_tflops", "fp4_tflops", "hbm_gb", "hbm_tb_s"):
        assert h800[key] == h100[key], key
    assert h800["scale_up_gb_s"] < h100["scale_up_gb_s"]
    assert h800["scale_up_gb_s"] == 200.0  # 400 GB/s bidirectional NVLink
    assert h100["scale_up_gb_s"] == 450.0  # 900 GB/s bidirectional NVLink
    assert h800["rental_usd_per_hour"] == 2.0  # DeepSeek's published assumption


def test_hopper_datasheet_peaks_are_dense_not_sparse():
    # H100 SXM: BF16 989.4 dense (1,979 with 2:4 sparsity); FP8 1,978.9 dense (3,958 sparse)
    h100 = catalog.hardware_preset("h100")
    assert h100["bf16_tflops"] == pytest.approx(989.4)
    assert h100["fp8_tflops"] == pytest.approx(2 * 989.4, rel=1e-3)
    assert catalog.hardware_preset("a100")["bf16_tflops"] == 312.0


# --- KV bytes per token (closed forms) ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kv_dtype_bytes", "expected"),
    [
        ("llama-3-70b", 2, 327_680),  # 80 layers x 8 KV heads x 128 x 2 (K and V) x 2 bytes
        ("llama-3.1-70b", 2, 327_680),
        ("llama-3-70b", 1, 163_840),
        ("llama-3.1-8b", 2, 131_072),  # 32 x 8 x 128 x 2 x 2
        ("deepseek-v3", 2, 70_272),  # (512 + 64) x 61 x 2
        ("deepseek-v3", 1, 35_136),
    ],
)
def test_kv_bytes_per_token(name, kv_dtype_bytes, expected):
    assert catalog.kv_bytes_per_token(catalog.model_preset(name), kv_dtype_bytes) == expected


def test_kv_bytes_per_token_follows_overrides():
    m = catalog.model_preset("llama-3-70b")
    m["kv_heads"] = 1  # multi-query attention
    assert catalog.kv_bytes_per_token(m, 2) == 327_680 / 8


def test_kv_bytes_rejects_an_unknown_attention_kind():
    m = catalog.model_preset("llama-3.1-8b")
    m["attention"] = "linear"
    with pytest.raises(ValueError, match="attention"):
        catalog.kv_bytes_per_token(m, 2)


# --- parameter counts -----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_param_counts_match_the_published_figures(name):
    m = catalog.model_preset(name)
    total, active = catalog.param_counts(m)
    # published headline figures are rounded (671B, 37B, 12.9B); 2 % covers the rounding
    assert total / 1e9 == pytest.approx(m["total_params_b"], rel=0.02)
    assert active / 1e9 == pytest.approx(m["active_params_b"], rel=0.02)


@pytest.mark.parametrize(
    ("name", "safetensors_total"),
    [
        # Hugging Face model API `safetensors.total`: parameters stored in the released checkpoint
        ("llama-3.1-8b", 8_030_261_248),
        ("llama-3.1-70b", 70_553_706_496),
        ("llama-3-70b", 70_553_706_496),
        ("mixtral-8x7b", 46_702_792_704),
    ],
)
def test_param_counts_equal_the_checkpoint_parameter_count_exactly(name, safetensors_total):
    total, _ = catalog.param_counts(catalog.model_preset(name))
    assert total == safetensors_total


def test_deepseek_v3_counts_match_the_weight_documentation():
    m = catalog.model_preset("deepseek-v3")
    total, active = catalog.param_counts(m)
    embedding = m["vocab"] * m["hidden_size"]
    # README_WEIGHTS: "0.9B" each for the embedding and the output head
    assert embedding / 1e9 == pytest.approx(0.93, abs=0.01)
    assert total / 1e9 == pytest.approx(671.0, rel=0.002)
    # README_WEIGHTS: 36.6B activated, including the output head but not the input embedding
    assert (active - embedding) / 1e9 == pytest.approx(36.6, rel=0.005)
    # the MTP module: 11.5B unique parameters (it shares the embedding and the head)
    total_mtp, active_mtp = catalog.param_counts(m, include_mtp=True)
    assert (total_mtp - total) / 1e9 == pytest.approx(11.5, rel=0.02)
    assert active_mtp > active


def test_param_counts_of_a_small_dense_gqa_model_by_hand():
    toy = dict(
        catalog.model_preset("llama-3.1-8b"),
        layers=2, hidden_size=4, attention_heads=2, kv_heads=1, head_dim=2,
        dense_layers=2, dense_ffn=8, vocab=10,
    )
    # embedding 10*4 + head 10*4 + final norm 4 = 84
    # per layer: q 4*4 + k 4*2 + v 4*2 + o 4*4 = 48; norms 2*4 = 8; SwiGLU 3*4*8 = 96 -> 152
    assert catalog.param_counts(toy) == (84 + 2 * 152, 84 + 2 * 152)


def test_param_counts_of_a_small_moe_mla_model_by_hand():
    toy = dict(
        catalog.model_preset("deepseek-v3"),
        layers=3, dense_layers=1, hidden_size=4, attention_heads=2, vocab=10,
        q_lora_rank=3, kv_lora_rank=2, qk_nope_head_dim=2, qk_rope_head_dim=1, v_head_dim=2, head_dim=3,
        experts=4, active_experts=2, shared_experts=1, expert_ffn=2, dense_ffn=5, mtp_layers=1,
    )
    # attention: q_a 4*3 + q norm 3 + q_b 3*(2*(2+1)) = 33; kv_a 4*(2+1) + kv norm 2 = 14;
    #            kv_b 2*(2*(2+2)) = 16; o (2*2)*4 = 16  -> 79; plus two layer norms 8 -> 87
    # dense layer: 87 + 3*4*5 = 147
    # MoE layer: 87 + router 4*4 + (4 + 1) experts * 3*4*2 = 87 + 16 + 120 = 223; active 87 + 16 + 3*24 = 175
    # embedding + head + final norm: 84
    total, active = catalog.param_counts(toy)
    assert (total, active) == (84 + 147 + 2 * 223, 84 + 147 + 2 * 175)
    # MTP module: enorm + hnorm 8, eh_proj 8*4 = 32, final norm 4, one MoE layer
    total_mtp, active_mtp = catalog.param_counts(toy, include_mtp=True)
    assert (total_mtp - total, active_mtp - active) == (44 + 223, 44 + 175)


def test_param_counts_reject_moe_layers_without_experts():
    m = catalog.model_preset("llama-3.1-8b")
    m["dense_layers"] = 30
    with pytest.raises(ValueError, match="experts"):
        catalog.param_counts(m)


def test_weight_bytes():
    m = catalog.model_preset("deepseek-v3")
    total, _ = catalog.param_counts(m)
    assert catalog.weight_bytes(m, 1) == total  # FP8: one byte per parameter, ~671 GB
    assert catalog.weight_bytes(m, 0.5) == total / 2
    assert catalog.weight_bytes(m, 1, include_mtp=True) > total
    llama = catalog.model_preset("llama-3.1-70b")
    assert catalog.weight_bytes(llama, 2) == 2 * 70_553_706_496


# --- presets and errors ---------------------------------------------------------------------------------


def test_presets_are_copies():
    m = catalog.model_preset("deepseek-v3")
    m["layers"] = 1
    assert catalog.model_preset("deepseek-v3")["layers"] == 61
    h = catalog.hardware_preset("H100")  # case-insensitive
    h["hbm_gb"] = 96.0
    assert catalog.hardware()["h100"]["hbm_gb"] == 80.0


def test_unknown_model_name_suggests_the_nearest_and_lists_all():
    with pytest.raises(KeyError) as info:
        catalog.model_preset("deepseek-v4")
    message = str(info.value)
    assert "Did you mean 'deepseek-v3'?" in message
    for name in MODEL_NAMES:
        assert name in message
    assert not message.startswith("'")  # readable, not a quoted repr


def test_unknown_hardware_name_suggests_the_nearest():
    with pytest.raises(KeyError, match="Did you mean 'mi300x'") as info:
        catalog.hardware_preset("mi300")
    assert isinstance(info.value, catalog.UnknownPresetError)
    assert "b200" in str(info.value)

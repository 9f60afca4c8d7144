"""ModelSpec of the Qwen hybrids from the published configs (values of MODELS.md §3, written here), their state and
KV sizes against the hand-computed figures of MODELS.md §7 / the issue, layer_types against transformers' own
config classes, and the StateStore of their state buffers (zero, image, restore)."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from ignisd.buffers import DTYPE_BYTES, BufferSpec, total_bytes
from ignisd.cache.kv_format import KV_FORMATS, get_kv_format
from ignisd.cache.state_store import StateStore
from ignisd.model.spec import KV_FORMAT_ACT_BYTES, ModelSpec

MIB = 1 << 20

# Qwen/Qwen3.5-27B config.json (Qwen3_5ForConditionalGeneration), text part as published; vision part abridged.
QWEN3_5_27B = {
    "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
    "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
    "vision_end_token_id": 248054, "tie_word_embeddings": False, "eos_token_id": 248046,
    "text_config": {
        "model_type": "qwen3_5_text", "vocab_size": 248320, "hidden_size": 5120, "intermediate_size": 17408,
        "num_hidden_layers": 64, "full_attention_interval": 4, "num_attention_heads": 24, "num_key_value_heads": 4,
        "head_dim": 256, "linear_num_key_heads": 16, "linear_num_value_heads": 48, "linear_key_head_dim": 128,
        "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "max_position_embeddings": 262144,
        "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False, "attention_bias": False,
        "attn_output_gate": True, "mamba_ssm_dtype": "float32", "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False, "eos_token_id": 248044, "pad_token_id": 248044, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_section": [11, 11, 10], "mrope_interleaved": True},
    },
    "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152, "out_hidden_size": 5120},
}

# Qwen/Qwen3-Next-80B-A3B-Instruct config.json (legacy top-level rope keys).
QWEN3_NEXT_80B = {
    "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "vocab_size": 151936,
    "hidden_size": 2048, "intermediate_size": 5120, "num_hidden_layers": 48, "full_attention_interval": 4,
    "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "rope_theta": 10000000, "partial_rotary_factor": 0.25,
    "max_position_embeddings": 262144, "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": False,
    "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
    "shared_expert_intermediate_size": 512, "norm_topk_prob": True, "decoder_sparse_step": 1, "mlp_only_layers": [],
    "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "bfloat16",
}


def test_qwen3_5_27b_sizes():
    s = ModelSpec.from_hf_config(QWEN3_5_27B, "Qwen3.5-27B")
    assert s.arch == "qwen3_5" and s.is_hybrid
    assert (s.num_layers, s.n_gdn_layers, s.n_attention_layers) == (64, 48, 16)
    assert s.layer_types[:4] == ("linear_attention",) * 3 + ("full_attention",)
    assert s.layer_types[-1] == "full_attention"
    assert (s.vocab_size, s.hidden_size, s.head_dim, s.rotary_dim, s.conv_dim) == (248320, 5120, 256, 64, 10240)
    assert s.rope_theta == 1e7 and s.rope_scaling is None and s.context_tokens == 262144
    assert s.eos_token_ids == (248046, 248044) and not s.tie_word_embeddings and s.moe_layers == ()
    assert get_kv_format("bf16").bytes_per_token(s) == 16 * 4 * 256 * 2 * 2 == 65536
    assert s.recurrent_state_bytes == 48 * 48 * 128 * 128 * 4 == 144 * MIB
    assert s.conv_state_bytes(2) == 48 * 10240 * 3 * 2          # 2.8125 MiB
    assert s.state_bytes("bf16") == 144 * MIB + 48 * 10240 * 3 * 2
    assert round(s.state_bytes("bf16") / MIB, 1) == 146.8
    assert s.state_bytes("fp32") == 144 * MIB + 48 * 10240 * 3 * 4


def test_qwen3_next_80b_sizes():
    s = ModelSpec.from_hf_config(QWEN3_NEXT_80B, "Qwen3-Next-80B-A3B")
    assert s.arch == "qwen3_next"
    assert (s.num_layers, s.n_gdn_layers, s.n_attention_layers) == (48, 36, 12)
    assert (s.rotary_dim, s.conv_dim, s.partial_rotary_factor, s.rope_theta) == (64, 8192, 0.25, 1e7)
    assert (s.num_experts, s.num_experts_per_tok, s.moe_intermediate_size, s.shared_expert_intermediate_size) == \
        (512, 10, 512, 512)
    assert s.norm_topk_prob and s.moe_layers == tuple(range(48))
    assert (s.bos_token_id, s.eos_token_ids) == (151643, (151645,))
    assert get_kv_format("bf16").bytes_per_token(s) == 12 * 2 * 256 * 2 * 2 == 24576
    assert s.recurrent_state_bytes == 72 * MIB
    assert s.state_bytes("bf16") == 72 * MIB + 36 * 8192 * 3 * 2
    assert round(s.state_bytes("bf16") / MIB, 1) == 73.7


def test_text_only_config_and_sparse_step():
    """The flat qwen3_5_text config gives the same spec as the multimodal one; decoder_sparse_step and
    mlp_only_layers pick the MoE layers as Qwen3NextDecoderLayer does."""
    text = dict(QWEN3_5_27B["text_config"], architectures=["Qwen3_5ForCausalLM"])
    a = ModelSpec.from_hf_config(QWEN3_5_27B, "x")
    b = ModelSpec.from_hf_config(text, "x")
    assert a.structural_hash() == b.structural_hash() and b.eos_token_ids == (248044,)
    c = ModelSpec.from_hf_config(dict(QWEN3_NEXT_80B, decoder_sparse_step=2, mlp_only_layers=[5]), "x")
    assert c.moe_layers == tuple(i for i in range(48) if (i + 1) % 2 == 0 and i != 5)


@pytest.mark.parametrize("n_layers,interval", [(4, 4), (10, 3), (7, 1), (5, 8)])
def test_layer_types_from_interval_match_transformers(n_layers, interval):
    from transformers import Qwen3_5TextConfig, Qwen3NextConfig
    cfg = dict(QWEN3_NEXT_80B, num_hidden_layers=n_layers, full_attention_interval=interval)
    ours = ModelSpec.from_hf_config(cfg, "x").layer_types
    ref = Qwen3NextConfig(num_hidden_layers=n_layers, full_attention_interval=interval).layer_types
    ref35 = Qwen3_5TextConfig(num_hidden_layers=n_layers, full_attention_interval=interval).layer_types
    assert list(ours) == list(ref) == list(ref35)
    explicit = dict(cfg, layer_types=["full_attention"] * n_layers)
    assert ModelSpec.from_hf_config(explicit, "x").layer_types == ("full_attention",) * n_layers


def test_structural_hash_covers_hybrid_fields():
    s = ModelSpec.from_hf_config(QWEN3_NEXT_80B, "a")
    h = s.structural_hash()
    assert dataclasses.replace(s, name="b", eos_token_ids=(1,)).structural_hash() == h
    for field, value in [("linear_num_value_heads", 16), ("linear_conv_kernel_dim", 3), ("partial_rotary_factor", 0.5),
                         ("num_experts_per_tok", 8), ("moe_layers", (0,)), ("norm_topk_prob", False),
                         ("layer_types", ("linear_attention",) * 47 + ("full_attention",))]:
        assert dataclasses.replace(s, **{field: value}).structural_hash() != h, field


def test_spec_rejects_inconsistent_hybrids():
    with pytest.raises(ValueError, match="multiple"):
        ModelSpec.from_hf_config(dict(QWEN3_NEXT_80B, linear_num_value_heads=24, linear_num_key_heads=16,
                                      num_hidden_layers=4), "x")
    with pytest.raises(ValueError, match="layer_types"):
        ModelSpec.from_hf_config(dict(QWEN3_NEXT_80B, layer_types=["full_attention"] * 3), "x")


def test_state_buffers_are_what_state_bytes_counts():
    s = ModelSpec.from_hf_config(QWEN3_5_27B, "Qwen3.5-27B")
    assert s.state_buffers() == [BufferSpec("recurrent", (48, 48, 128, 128), "float32"),
                                 BufferSpec("conv", (48, 10240, 3), "float32")]
    assert s.state_buffers("bfloat16")[1] == BufferSpec("conv", (48, 10240, 3), "bfloat16")
    assert total_bytes(s.state_buffers()) == s.state_bytes("fp32")
    assert total_bytes(s.state_buffers("bfloat16")) == s.state_bytes("bf16") == s.state_bytes("fp32", act_bytes=2)
    assert dataclasses.replace(s, layer_types=("full_attention",) * 64).state_buffers() == []
    with pytest.raises(ValueError, match="dtype"):
        s.state_buffers("float64")


def test_state_bytes_formats_are_the_kv_formats():
    """spec.py names the KV formats without importing cache/: its list must stay the cache's, with each format's
    activation size equal to its dense storage element size."""
    assert set(KV_FORMAT_ACT_BYTES) == set(KV_FORMATS)
    for name, fmt in KV_FORMATS.items():
        assert KV_FORMAT_ACT_BYTES[name] == DTYPE_BYTES[fmt.dtype]
    spec = ModelSpec.from_hf_config(QWEN3_NEXT_80B, "x")
    assert spec.state_bytes("hq-e8-2b") == spec.state_bytes("fp32")      # the window is the format's, not here
    with pytest.raises(ValueError, match="allowed"):
        spec.state_bytes("q4_0")


def _tiny_spec() -> ModelSpec:
    cfg = dict(QWEN3_NEXT_80B, num_hidden_layers=4, hidden_size=64, linear_num_key_heads=2,
               linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=4, num_experts=4,
               num_experts_per_tok=2)
    return ModelSpec.from_hf_config(cfg, "tiny")


def test_state_store_zero_image_restore():
    spec = _tiny_spec()
    st = StateStore(spec.state_buffers(), 3)
    rec, conv = st.buffer("recurrent"), st.buffer("conv")
    assert rec.shape == (3, 3, 4, 8, 4) and rec.dtype == torch.float32
    assert conv.shape == (3, 3, spec.conv_dim, 3) and spec.conv_dim == 2 * 2 * 8 + 4 * 4
    assert st.slot_bytes == spec.state_bytes("fp32") == 3 * (4 * 8 * 4 + 48 * 3) * 4
    assert st.nbytes == 3 * st.slot_bytes
    g = torch.Generator().manual_seed(0)
    rec.copy_(torch.randn(rec.shape, generator=g))
    conv.copy_(torch.randn(conv.shape, generator=g))
    image = st.image(0)
    assert [n for n, _ in image] == ["recurrent", "conv"]
    other = rec[1].clone()
    st.zero(0)
    assert not rec[0].any() and not conv[0].any() and torch.equal(rec[1], other)
    assert image[0][1].abs().sum() > 0              # the image is a copy, not a view
    st.restore(2, image)
    assert torch.equal(rec[2], image[0][1]) and torch.equal(conv[2], image[1][1])
    with pytest.raises(ValueError, match="buffers"):
        st.restore(1, image[:1])
    with pytest.raises(ValueError, match="conv"):
        st.restore(1, [image[0], ("conv", image[1][1].to(torch.bfloat16))])
    with pytest.raises(IndexError):
        st.zero(3)
    st.copy_slot(2, 1)
    assert torch.equal(rec[1], image[0][1])


def test_state_store_on_all_attention_model():
    spec = dataclasses.replace(_tiny_spec(), layer_types=("full_attention",) * 4)
    st = StateStore(spec.state_buffers(), 2)
    assert st.nbytes == 0 and st.slot_bytes == 0 == spec.state_bytes("bf16") and st.image(1) == []
    st.restore(0, [])

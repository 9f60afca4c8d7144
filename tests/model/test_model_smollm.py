"""SmolLM2-135M-Instruct (built-in GGUF, Q4_1/Q8_0/F32) through ignis's paged forward against transformers loading
the same GGUF (its own dequantisation and Q/K un-permutation) — DESIGN §7's forward-pass oracle."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from model_helpers import run_chunked, shuffled_pages

pytestmark = pytest.mark.smollm
N_DECODE = 4
POOL_PAGES = 24


@pytest.mark.parametrize("chunk", [None, 64, 100])
@pytest.mark.parametrize("prompt", ["short", "code", "prose"])
def test_fp32_logits_match_transformers(smollm_ours, prompt_ids, hf_smollm_logits, prompt, chunk):
    ids = prompt_ids[prompt]
    kv = KVStore(get_kv_format("fp32"), smollm_ours.spec, POOL_PAGES, page_tokens=64)
    pages = shuffled_pages(-(-len(ids) // 64), POOL_PAGES, seed=len(ids) + (chunk or 0))
    ours = run_chunked(smollm_ours.model, kv, ids, chunk, N_DECODE, pages)
    ref = hf_smollm_logits[prompt]
    assert ours.shape == ref.shape == (len(ids), 49152)
    err = (ours - ref).abs().max().item()
    print(f"fp32 {prompt} ({len(ids)} tokens) chunk={chunk}: max |dlogit| = {err:.3g}")
    assert err <= 1e-3


@pytest.mark.parametrize("prompt", ["short", "code", "prose"])
def test_bf16_kv_top1_and_logprobs(smollm_ours, prompt_ids, hf_smollm_logits, prompt):
    """bf16 KV pages: argmax equal at every position; mean |delta log p| of the prompt's own next tokens (what
    prompt_logprobs reports) <= 0.02. The mean over the whole vocabulary, dominated by the far tail
    (log p ~ -30), is held to 0.05."""
    ids = prompt_ids[prompt]
    kv = KVStore(get_kv_format("bf16"), smollm_ours.spec, POOL_PAGES, page_tokens=64)
    pages = shuffled_pages(-(-len(ids) // 64), POOL_PAGES, seed=7)
    ours = run_chunked(smollm_ours.model, kv, ids, 64, N_DECODE, pages)
    ref = hf_smollm_logits[prompt]
    lp_ours, lp_ref = torch.log_softmax(ours, -1), torch.log_softmax(ref, -1)
    top1 = (ours.argmax(-1) == ref.argmax(-1)).float().mean().item()
    mean_all = (lp_ours - lp_ref).abs().mean().item()
    nxt = torch.tensor(ids[1:])
    rows = torch.arange(len(ids) - 1)
    mean_next = (lp_ours[rows, nxt] - lp_ref[rows, nxt]).abs().mean().item()
    print(f"bf16 {prompt}: top1 {top1:.4f}, mean |dlogprob| all-vocab {mean_all:.4g}, next-token {mean_next:.4g}")
    assert top1 == 1.0
    assert mean_next <= 0.02
    assert mean_all <= 0.05


def test_qk_rows_unpermuted_like_transformers(smollm_ours, hf_smollm, smollm_reader):
    """Our fused Q/K rows equal transformers' q_proj/k_proj exactly, and differ from the GGUF's raw row order
    (so the un-permutation is real, and the logits oracle above is what proves its direction)."""
    spec = smollm_ours.spec
    w_qkv = smollm_ours.model.layers[0].mixer.qkv.weight()
    qd, kd = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    hf_attn = hf_smollm.model.layers[0].self_attn
    assert torch.equal(w_qkv[:qd], hf_attn.q_proj.weight.detach())
    assert torch.equal(w_qkv[qd:qd + kd], hf_attn.k_proj.weight.detach())
    assert torch.equal(w_qkv[qd + kd:], hf_attn.v_proj.weight.detach())
    t = next(t for t in smollm_reader.tensors if t.name == "blk.0.attn_q.weight")
    raw = torch.from_numpy(np.asarray(gguf.quants.dequantize(t.data, t.tensor_type)).copy())
    assert not torch.equal(raw, w_qkv[:qd])
    assert torch.equal(raw.sort(0).values, w_qkv[:qd].sort(0).values)  # same rows, other order


def test_tied_embeddings_and_weight_bytes(smollm_ours):
    m, s = smollm_ours.model, smollm_ours.spec
    assert s.tie_word_embeddings and m.lm_head is m.embed
    h, i, d = 576, 1536, 64
    per_layer = h * 9 * d + 2 * h * 3 * d + 9 * d * h + 3 * h * i + 2 * h
    assert smollm_ours.weight_bytes == 4 * (49152 * h + 30 * per_layer + h) == 538060032
    assert smollm_ours.kind == "gguf" and smollm_ours.source == smollm_ours.source.resolve()

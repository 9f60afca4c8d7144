"""The Qwen hybrids (Qwen3.5 dense, Qwen3-Next MoE) through ignis against transformers, on tiny random checkpoints
written by transformers itself (tools/make_tiny_checkpoint.py, MODELS.md §6), fp32 weights and fp32 KV:

- full-vocabulary logits of a 120-token sequence agree with transformers' within 1e-3 max-abs;
- prefill in chunks of 1, 7, 64 and 100 tokens, prefill then token-by-token decode, and 4 lanes of different
  lengths batched (prefill chunks and decode tokens mixed in one forward) each agree with one prefill within 1e-4;
- a state image taken after a prefill and restored into another slot (with a copy of the KV pages) continues to
  bit-identical logits;
- loader: Qwen3-Next's fused in_proj_qkvz / in_proj_ba split equals transformers' own re-ordering; a sharded
  multimodal-layout checkpoint (model.language_model.*, model.visual.*, mtp.*) loads to the same logits.
"""
from __future__ import annotations

import json
import logging
import shutil

import pytest
import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.model.loader import load_model
from model_helpers import shuffled_pages

KINDS = ("qwen3_5", "qwen3_next")
PT = 16            # page tokens in these tests (several pages per sequence)
POOL = 64          # pages


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    """{kind: directory} of the tiny checkpoints (vocab 1024, hidden 128), built once for this module."""
    from make_tiny_checkpoint import make_tiny_qwen3_5, make_tiny_qwen3_next
    return {"qwen3_5": make_tiny_qwen3_5(tmp_path_factory.mktemp("q35"), seed=0),
            "qwen3_next": make_tiny_qwen3_next(tmp_path_factory.mktemp("q3n"), seed=1)}


@pytest.fixture(scope="module")
def ours(hybrid_dir):
    return {k: load_model(d) for k, d in hybrid_dir.items()}


@pytest.fixture(scope="module")
def hf(hybrid_dir):
    from transformers import AutoModelForCausalLM
    return {k: AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval() for k, d in hybrid_dir.items()}


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 1024, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


IDS = _ids(120, 7)


def _pools(spec, slots: int = 8):
    return KVStore(get_kv_format("fp32"), spec, POOL, page_tokens=PT), StateStore(spec.state_buffers(), slots)


def _run_chunked(model, kv, states, slot, ids, pages, chunk):
    """One sequence: zero its slot, feed ids in chunks of `chunk` tokens (1: decode steps), logits of every token."""
    states.zero(slot)
    out = []
    for s in range(0, len(ids), chunk):
        part = ids[s:s + chunk]
        b = ForwardBatch.build([SeqChunk(part, s, pages, "all" if len(part) > 1 else "last", state_slot=slot)], PT)
        out.append(model.forward(b, kv, states))
    return torch.cat(out)


@pytest.fixture(scope="module")
def one_prefill(ours):
    """{kind: ignis logits [120, vocab] of IDS in one prefill} (the reference of the self-consistency tests)."""
    res = {}
    for k, lm in ours.items():
        kv, st = _pools(lm.spec)
        res[k] = _run_chunked(lm.model, kv, st, 5, IDS, shuffled_pages(8, POOL, seed=1), len(IDS))
    return res


@pytest.mark.parametrize("kind", KINDS)
def test_logits_match_transformers(kind, hf, one_prefill):
    with torch.inference_mode():
        ref = hf[kind](torch.tensor([IDS])).logits[0].float()
    err = (one_prefill[kind] - ref).abs().max().item()
    print(f"{kind}: max |dlogit| vs transformers over {len(IDS)} tokens = {err:.3g} (logit std {ref.std():.3g})")
    assert ref.std() > 0.5          # the random weights make real logits, not a constant
    assert err <= 1e-3


@pytest.mark.parametrize("chunk", [1, 7, 64, 100])
@pytest.mark.parametrize("kind", KINDS)
def test_chunked_prefill_equals_one_prefill(kind, chunk, ours, one_prefill):
    lm = ours[kind]
    kv, st = _pools(lm.spec)
    got = _run_chunked(lm.model, kv, st, 2, IDS, shuffled_pages(8, POOL, seed=chunk), chunk)
    err = (got - one_prefill[kind]).abs().max().item()
    print(f"{kind} chunks of {chunk}: max |dlogit| vs one prefill = {err:.3g}")
    assert err <= 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_prefill_then_decode_equals_one_prefill(kind, ours, one_prefill):
    lm = ours[kind]
    kv, st = _pools(lm.spec)
    pages = shuffled_pages(8, POOL, seed=4)
    st.zero(0)
    out = [lm.model.forward(ForwardBatch.build([SeqChunk(IDS[:80], 0, pages, "all", state_slot=0)], PT), kv, st)]
    for p in range(80, len(IDS)):
        out.append(lm.model.forward(ForwardBatch.build([SeqChunk([IDS[p]], p, pages, "last", state_slot=0)], PT),
                                    kv, st))
    err = (torch.cat(out) - one_prefill[kind]).abs().max().item()
    print(f"{kind} prefill 80 + 40 decode steps: max |dlogit| vs one prefill = {err:.3g}")
    assert err <= 1e-4


# 4 lanes of different lengths; each round is one forward mixing prefill chunks and decode tokens
ROUNDS = [
    {"a": 40, "b": 23},
    {"a": 40, "b": 1, "c": 17, "d": 1},
    {"a": 1, "b": 1, "c": 33, "d": 1},
    {"a": 1, "b": 1, "c": 1, "d": 1},
    {"a": 1, "b": 30, "c": 1, "d": 7},
    {"a": 1, "b": 1, "c": 1, "d": 1},
]
LANE_SLOT = {"a": 3, "b": 0, "c": 6, "d": 1}


@pytest.mark.parametrize("kind", KINDS)
def test_batched_lanes_equal_one_prefill(kind, ours):
    lm = ours[kind]
    lengths: dict[str, int] = {}
    for r in ROUNDS:
        for k, n in r.items():
            lengths[k] = lengths.get(k, 0) + n
    seqs = {k: _ids(n, 100 + i) for i, (k, n) in enumerate(sorted(lengths.items()))}
    kv, st = _pools(lm.spec)
    perm = shuffled_pages(POOL, POOL, seed=9)
    pages = {k: perm[i::4][:12] for i, k in enumerate(sorted(seqs))}
    pos = {k: 0 for k in seqs}
    out = {k: [] for k in seqs}
    for r in ROUNDS:
        chunks, owners = [], []
        for k, n in r.items():
            if pos[k] == 0:
                st.zero(LANE_SLOT[k])
            chunks.append(SeqChunk(seqs[k][pos[k]:pos[k] + n], pos[k], pages[k], "all" if n > 1 else "last",
                                   state_slot=LANE_SLOT[k]))
            owners.append(k)
            pos[k] += n
        b = ForwardBatch.build(chunks, PT)
        logits = lm.model.forward(b, kv, st)
        for k, (row, cnt, _) in zip(owners, b.logits_owner):
            out[k].append(logits[row:row + cnt])
    for k, ids in seqs.items():
        kv1, st1 = _pools(lm.spec)
        ref = _run_chunked(lm.model, kv1, st1, 0, ids, list(range(12)), len(ids))
        err = (torch.cat(out[k]) - ref).abs().max().item()
        print(f"{kind} lane {k} ({len(ids)} tokens) batched vs one prefill: {err:.3g}")
        assert err <= 1e-4


@pytest.mark.parametrize("kind", KINDS)
def test_image_restored_into_another_slot_continues_bit_identical(kind, ours):
    lm = ours[kind]
    kv, st = _pools(lm.spec)
    ids = IDS[:70]
    src_pages, dst_pages = [10, 3, 7, 12, 20, 22], [30, 31, 40, 41, 50, 44]
    st.zero(2)
    lm.model.forward(ForwardBatch.build([SeqChunk(ids, 0, src_pages, "last", state_slot=2)], PT), kv, st)
    image = st.image(2)
    assert [n for n, _ in image] == ["recurrent", "conv"]
    used = -(-len(ids) // PT)
    kv.copy_pages(src_pages[:used], dst_pages[:used])
    cont = _ids(12, 55)

    def continue_from(slot, pages):
        out = []
        for j, tok in enumerate(cont):
            b = ForwardBatch.build([SeqChunk([tok], len(ids) + j, pages, "last", state_slot=slot)], PT)
            out.append(lm.model.forward(b, kv, st))
        return torch.cat(out)

    first = continue_from(2, src_pages)          # moves slot 2 on: the image must be an independent copy
    st.restore(6, image)
    assert torch.equal(st.buffer("recurrent")[6], image[0][1]) and torch.equal(st.buffer("conv")[6], image[1][1])
    second = continue_from(6, dst_pages)
    assert torch.equal(first, second)


def test_fused_gdn_split_equals_transformers_reordering(hybrid_dir, hf):
    """split_fused_gdn's in_proj_qkv/z/b/a produce exactly transformers' q, k, v, z, b, a of the fused tensors."""
    from safetensors.torch import load_file

    from ignisd.model.hybrid_weights import split_fused_gdn

    d = hybrid_dir["qwen3_next"]
    spec = load_model(d).spec
    w = {k: v for k, v in load_file(str(d / "model.safetensors")).items() if "layers.0.linear_attn.in_proj" in k}
    fused = dict(w)
    assert split_fused_gdn(w, spec) == 1 and set(w) == {f"model.layers.0.linear_attn.in_proj_{n}.weight"
                                                        for n in ("qkv", "z", "b", "a")}
    x = torch.randn(1, 5, spec.hidden_size, generator=torch.Generator().manual_seed(0))
    layer = hf["qwen3_next"].model.layers[0].linear_attn
    q, k, v, z, b, a = layer.fix_query_key_value_ordering(x @ fused["model.layers.0.linear_attn.in_proj_qkvz.weight"].T,
                                                          x @ fused["model.layers.0.linear_attn.in_proj_ba.weight"].T)
    qkv = x @ w["model.layers.0.linear_attn.in_proj_qkv.weight"].T
    ref_qkv = torch.cat((q.reshape(1, 5, -1), k.reshape(1, 5, -1), v.reshape(1, 5, -1)), dim=-1)
    for got, ref in ((qkv, ref_qkv), (x @ w["model.layers.0.linear_attn.in_proj_z.weight"].T, z.reshape(1, 5, -1)),
                     (x @ w["model.layers.0.linear_attn.in_proj_b.weight"].T, b),
                     (x @ w["model.layers.0.linear_attn.in_proj_a.weight"].T, a)):
        assert got.shape == ref.shape and (got - ref).abs().max() <= 1e-6


def test_sharded_multimodal_layout_loads_same_logits(hybrid_dir, ours, one_prefill, tmp_path, caplog):
    """The Qwen3.5 release layout: config with text_config, model.language_model.* tensors in several shards
    listed by model.safetensors.index.json, plus model.visual.* and mtp.* tensors that must be skipped and logged."""
    from safetensors.torch import load_file, save_file

    src = hybrid_dir["qwen3_5"]
    text_cfg = json.loads((src / "config.json").read_text())
    tensors = load_file(str(src / "model.safetensors"))
    renamed = {("lm_head.weight" if k == "lm_head.weight" else "model.language_model." + k[len("model."):]): v
               for k, v in tensors.items()}
    renamed["model.visual.patch_embed.proj.weight"] = torch.randn(8, 3, 2, 2, 2)
    renamed["model.visual.blocks.0.attn.qkv.weight"] = torch.randn(24, 8)
    renamed["mtp.fc.weight"] = torch.randn(128, 256)
    renamed["mtp.layers.0.self_attn.q_proj.weight"] = torch.randn(256, 128)
    names = sorted(renamed)
    shards = [names[0::3], names[1::3], names[2::3]]
    weight_map = {}
    for i, part in enumerate(shards):
        fname = f"model-0000{i + 1}-of-00003.safetensors"
        save_file({k: renamed[k].contiguous() for k in part}, str(tmp_path / fname))
        weight_map.update({k: fname for k in part})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    text_cfg["model_type"] = "qwen3_5_text"
    cfg = {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "text_config": text_cfg,
           "vision_config": {"model_type": "qwen3_5_vision", "depth": 1}, "eos_token_id": 17,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with caplog.at_level(logging.INFO):
        lm = load_model(tmp_path)
    skipped = [r for r in caplog.records if r.getMessage() == "skipped_tensors"]
    assert skipped and skipped[0].ignis_fields["groups"] == "model.visual:2,mtp:2"
    assert lm.spec.arch == "qwen3_5" and lm.spec.eos_token_ids == (17,)
    assert lm.spec.structural_hash() == ours["qwen3_5"].spec.structural_hash()
    kv, st = _pools(lm.spec)
    got = _run_chunked(lm.model, kv, st, 5, IDS, shuffled_pages(8, POOL, seed=1), len(IDS))
    assert torch.equal(got, one_prefill["qwen3_5"])


def test_forward_needs_states_and_slots(ours):
    lm = ours["qwen3_5"]
    kv, st = _pools(lm.spec)
    b = ForwardBatch.build([SeqChunk(IDS[:5], 0, [0], "last", state_slot=0)], PT)
    with pytest.raises(ValueError, match="StateStore"):
        lm.model.forward(b, kv)
    with pytest.raises(ValueError, match="state_slot"):
        lm.model.forward(ForwardBatch.build([SeqChunk(IDS[:5], 0, [0], "last")], PT), kv, st)
    with pytest.raises(ValueError, match="two chunks"):
        ForwardBatch.build([SeqChunk(IDS[:5], 0, [0], state_slot=1), SeqChunk(IDS[:3], 0, [1], state_slot=1)], PT)


def test_weight_bytes_counts_every_parameter(ours, hf):
    """Resident weights = transformers' parameter count x 4 bytes (fp32), both families, plus the q/k norm
    multipliers that ignis keeps expanded per head ([H + Hkv, hd] instead of two [hd] vectors)."""
    for k, lm in ours.items():
        s = lm.spec
        n = sum(p.numel() for p in hf[k].parameters())
        n += s.n_attention_layers * (s.num_heads + s.num_kv_heads - 2) * s.head_dim
        assert lm.weight_bytes == 4 * n, (k, lm.weight_bytes, 4 * n)


def test_builder_copies_nothing_unexpected(hybrid_dir, tmp_path):
    """make_tiny_qwen3_5 writes a directory transformers and ignis both read (config + weights only)."""
    names = sorted(p.name for p in hybrid_dir["qwen3_5"].iterdir())
    assert "config.json" in names and "model.safetensors" in names
    shutil.copytree(hybrid_dir["qwen3_5"], tmp_path / "copy")
    assert load_model(tmp_path / "copy").spec.n_gdn_layers == 3


def test_real_vocabulary_checkpoint(tmp_path):
    """make_tiny_qwen3_5(real_tokenizer=True): Qwen3.5's 248,320-token vocabulary with the real tokenizer and chat
    template; ignis's Tokenizer reads it (eos <|im_end|>), and the logits of a rendered chat match transformers'."""
    from make_tiny_checkpoint import make_tiny_qwen3_5
    from transformers import AutoModelForCausalLM

    from ignisd.text.chat_template import ChatTemplate
    from ignisd.text.tokenizer import Tokenizer

    d = make_tiny_qwen3_5(tmp_path / "real", seed=3, hidden=32, real_tokenizer=True)
    tok = Tokenizer.from_dir(d)
    assert tok.eos_token == "<|im_end|>" and {248046, 248044} <= tok.stop_token_ids
    text = ChatTemplate(tok.chat_template, tok.bos_token, tok.eos_token).render(
        [{"role": "user", "content": "Name three prime numbers."}])
    assert text.endswith("<|im_start|>assistant\n<think>\n")
    ids = tok.encode(text)
    lm = load_model(d)
    assert lm.spec.vocab_size == 248320 and lm.spec.eos_token_ids == (248046, 248044)
    kv, st = _pools(lm.spec)
    got = _run_chunked(lm.model, kv, st, 0, ids, list(range(4)), len(ids))
    with torch.inference_mode():
        ref = AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32).eval()(torch.tensor([ids])).logits[0]
    assert (got - ref).abs().max() <= 1e-3

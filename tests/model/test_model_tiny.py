"""The tiny random Llama (HF directory written by transformers) through ignis against transformers, and the
batching oracle: several sequences mixing prefill chunks and decode tokens in one forward equal each run alone."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.model.loader import load_model
from model_helpers import run_chunked, shuffled_pages


def _hf_logits(hf, ids):
    with torch.inference_mode():
        return hf(torch.tensor([ids])).logits[0].float()


@pytest.mark.parametrize("kv_format", ["fp32", "bf16"])
@pytest.mark.parametrize("chunk", [None, 64, 100])
@pytest.mark.parametrize("prompt", ["short", "code", "prose"])
def test_tiny_logits_match_transformers(tiny_ours, tiny_hf, prompt_ids, prompt, chunk, kv_format):
    ids = prompt_ids[prompt]
    kv = KVStore(get_kv_format(kv_format), tiny_ours.spec, 16, page_tokens=64)
    ours = run_chunked(tiny_ours.model, kv, ids, chunk, 3, shuffled_pages(-(-len(ids) // 64), 16, seed=3))
    ref = _hf_logits(tiny_hf, ids)
    err = (ours - ref).abs().max().item()
    print(f"tiny {kv_format} {prompt} chunk={chunk}: max |dlogit| = {err:.3g} (logit scale {ref.abs().max():.3g})")
    assert err <= (1e-4 if kv_format == "fp32" else 2e-2)


def test_tiny_spec_from_config(tiny_ours, tiny_llama_dir):
    cfg = json.loads((tiny_llama_dir / "config.json").read_text())
    s = tiny_ours.spec
    assert (s.arch, s.vocab_size, s.hidden_size, s.intermediate_size) == ("llama", cfg["vocab_size"],
                                                                          cfg["hidden_size"], cfg["intermediate_size"])
    assert (s.num_layers, s.num_heads, s.num_kv_heads, s.head_dim) == (
        cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"])
    assert s.tie_word_embeddings is False and tiny_ours.kind == "hf"
    assert get_kv_format("fp32").bytes_per_token(s) == \
        2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 4


def test_sharded_safetensors_load_equal(tiny_hf, tiny_llama_dir, tiny_ours, prompt_ids, tmp_path):
    """A sharded checkpoint (model.safetensors.index.json) loads to the same logits as the single file."""
    tiny_hf.save_pretrained(str(tmp_path), max_shard_size="8MB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    shutil.copy(tiny_llama_dir / "tokenizer.json", tmp_path)
    sharded = load_model(tmp_path)
    ids = prompt_ids["short"]
    outs = []
    for lm in (tiny_ours, sharded):
        kv = KVStore(get_kv_format("fp32"), lm.spec, 4)
        outs.append(run_chunked(lm.model, kv, ids, None, 0, [2]))
    assert torch.equal(outs[0], outs[1])


# ------------------------------------------------------------------ batching oracle
def _schedule(lengths, rounds):
    """Validate a schedule: rounds of {seq: n_new_tokens}; every sequence consumed exactly."""
    used = {k: 0 for k in lengths}
    for r in rounds:
        for k, n in r.items():
            used[k] += n
    assert used == lengths, used


def _run(model, spec, seqs, rounds, batched, kv_format):
    """Run `rounds` either all sequences of a round in one forward (batched) or each chunk alone.
    Returns {seq: logits [len, vocab]} ("all" logits for prefill chunks, "last" for 1-token decode)."""
    names = sorted(seqs)
    pool = 4 * len(names) * 8
    kv = KVStore(get_kv_format(kv_format), spec, pool, page_tokens=16)
    pages = {k: shuffled_pages(pool, pool, seed=11)[i::len(names)][:8 * 4] for i, k in enumerate(names)}
    pos = {k: 0 for k in names}
    out = {k: [] for k in names}
    for r in rounds:
        chunks, owners = [], []
        for k, n in r.items():
            ids = seqs[k][pos[k]:pos[k] + n]
            chunks.append(SeqChunk(ids, pos[k], pages[k], "last" if n == 1 else "all"))
            owners.append(k)
            pos[k] += n
        groups = [list(range(len(chunks)))] if batched else [[i] for i in range(len(chunks))]
        for g in groups:
            b = ForwardBatch.build([chunks[i] for i in g], kv.page_tokens)
            logits = model.forward(b, kv)
            for i, (row, cnt, _) in zip(g, b.logits_owner):
                out[owners[i]].append(logits[row:row + cnt])
    return {k: torch.cat(v) for k, v in out.items()}


ROUNDS = [
    {"a": 40, "b": 23},
    {"a": 40, "b": 1, "c": 17, "d": 1},
    {"a": 1, "b": 1, "c": 33, "d": 1},
    {"a": 1, "b": 1, "c": 1, "d": 1},
    {"a": 1, "b": 30, "c": 1},
    {"a": 1, "b": 1, "c": 1, "d": 1},
]


def _seq_lengths():
    lengths = {}
    for r in ROUNDS:
        for k, n in r.items():
            lengths[k] = lengths.get(k, 0) + n
    return lengths


@pytest.mark.parametrize("kv_format", ["fp32", "bf16"])
def test_batched_forward_equals_each_alone_tiny(tiny_ours, prompt_ids, kv_format):
    lengths = _seq_lengths()
    src = prompt_ids["prose"]
    seqs = {k: src[i * 7:i * 7 + n] for i, (k, n) in enumerate(sorted(lengths.items()))}
    _schedule({k: len(v) for k, v in seqs.items()}, ROUNDS)
    # "d" starts with decode-sized steps right away: its first chunk is 1 token (a 1-token prompt)
    batched = _run(tiny_ours.model, tiny_ours.spec, seqs, ROUNDS, True, kv_format)
    alone = _run(tiny_ours.model, tiny_ours.spec, seqs, ROUNDS, False, kv_format)
    for k in seqs:
        err = (batched[k] - alone[k]).abs().max().item()
        print(f"tiny batched vs alone {kv_format} seq {k}: {err:.3g}")
        assert err <= 1e-5


@pytest.mark.smollm
def test_batched_forward_equals_each_alone_smollm(smollm_ours, prompt_ids):
    lengths = _seq_lengths()
    src = prompt_ids["prose"]
    seqs = {k: src[i * 5:i * 5 + n] for i, (k, n) in enumerate(sorted(lengths.items()))}
    batched = _run(smollm_ours.model, smollm_ours.spec, seqs, ROUNDS, True, "fp32")
    alone = _run(smollm_ours.model, smollm_ours.spec, seqs, ROUNDS, False, "fp32")
    for k in seqs:
        err = (batched[k] - alone[k]).abs().max().item()
        print(f"smollm batched vs alone seq {k}: {err:.3g}")
        assert err <= 2e-4                     # logits up to ~40: 5e-6 relative (1.1e-4 on an AVX-512/AMX Xeon)
        assert torch.equal(batched[k].argmax(-1), alone[k].argmax(-1))


@pytest.mark.smollm
def test_batch_invariant_mode_is_bitwise(smollm_ours, prompt_ids):
    """With batch_invariant on, a sequence's logits do not depend on its batch-mates at all (bitwise)."""
    lengths = _seq_lengths()
    src = prompt_ids["code"]
    seqs = {k: src[i * 5:i * 5 + n] for i, (k, n) in enumerate(sorted(lengths.items()))}
    smollm_ours.model.batch_invariant = True
    try:
        batched = _run(smollm_ours.model, smollm_ours.spec, seqs, ROUNDS, True, "bf16")
        alone = _run(smollm_ours.model, smollm_ours.spec, seqs, ROUNDS, False, "bf16")
    finally:
        smollm_ours.model.batch_invariant = False
    for k in seqs:
        assert torch.equal(batched[k], alone[k]), (k, (batched[k] - alone[k]).abs().max().item())


def test_rotary_tables_grow_and_match_transformers(tiny_ours, tiny_hf):
    """cos/sin tables: a small table grown on demand equals transformers' rotary embedding at those positions."""
    from ignisd.model.layers import Rotary
    rot = Rotary(tiny_ours.spec, initial=16)
    pos = torch.tensor([0, 5, 15, 16, 100, 1999])
    cos, sin = rot.tables(pos, 1999)
    ref_cos, ref_sin = tiny_hf.model.rotary_emb(torch.zeros(1, 1, 16), pos[None])
    h = ref_sin.shape[-1] // 2                  # our sine table carries rotate_half's sign on its first half
    assert torch.equal(cos[:, 0], ref_cos[0])
    assert torch.equal(sin[:, 0], torch.cat((-ref_sin[0, :, :h], ref_sin[0, :, h:]), -1))


def test_no_logits_and_mixed_modes(tiny_ours, prompt_ids):
    ids = prompt_ids["code"][:40]
    kv = KVStore(get_kv_format("fp32"), tiny_ours.spec, 4, page_tokens=16)
    out = tiny_ours.model.forward(ForwardBatch.build([SeqChunk(ids[:30], 0, [0, 1], "none")], 16), kv)
    assert out.shape == (0, tiny_ours.spec.vocab_size)
    b = ForwardBatch.build([SeqChunk(ids[30:35], 30, [0, 1, 2], "last"), SeqChunk(ids[:3], 0, [3], "all")], 16)
    out = tiny_ours.model.forward(b, kv)
    assert out.shape == (4, tiny_ours.spec.vocab_size) and out.dtype == torch.float32
    kv2 = KVStore(get_kv_format("fp32"), tiny_ours.spec, 4, page_tokens=16)
    ref = run_chunked(tiny_ours.model, kv2, ids[:35], None, 0, [0, 1, 2])
    assert (out[0] - ref[34]).abs().max() < 1e-5

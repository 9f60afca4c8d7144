"""The fused CPU decode step (ignis_kernels.decode.llama_cpu via ignisd.model.fused_decode): a tiny random llama with
Q4_1 weights decodes through it, and its logits and written K/V are checked against two other routes: the same
weights dequantized to fp32 through the torch path (the reference), and the per-operator C path; then which models
and batches take it, and the switch."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from ignisd.cache.kv_format import HQFormat, get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.model.hybrid import Decoder
from ignisd.model.layers import rope_stable_dims
from ignisd.model.loader import _read_hf_weights, open_model
from ignisd.model.quant import GroupQuant

torch.set_num_threads(1)
PT = 64


def _q4_1(w: torch.Tensor) -> GroupQuant:
    """w [N, K] fp32 as Q4_1 blocks of 32 (min / 15-step range per block, d and m rounded to fp16 as GGUF holds
    them)."""
    n, k = w.shape
    g = w.view(n, k // 32, 32)
    lo, hi = g.amin(-1), g.amax(-1)
    d = ((hi - lo) / 15).clamp_min(1e-8).half().float()
    m = lo.half().float()
    q = ((g - m[..., None]) / d[..., None]).round().clamp(0, 15).to(torch.uint8).view(n, k)
    return GroupQuant("Q4_1", q, d, m)


@pytest.fixture(scope="module")
def models(tiny_llama_dir):
    """(spec, fused native decoder, the same with the fused step off, the dequantized weights as an fp32 decoder)."""
    src = open_model(tiny_llama_dir)

    def weights(quant: bool) -> dict:
        w = _read_hf_weights(src.source, src.spec, lambda items, total=None, desc="": items)
        return {name: (_q4_1(t) if quant else _q4_1(t).dequantize()) if name.endswith("proj.weight") else t
                for name, t in w.items()}

    fused = Decoder(src.spec, weights(True), weight_format="native")
    ops = Decoder(src.spec, weights(True), weight_format="native")
    ops._fused = None
    ref = Decoder(src.spec, weights(False), weight_format="fp32")
    assert fused._fused is not None and ref._fused is None
    assert ref.decode_step("fp32") == "per operator (weights other than 4-bit ones the int4 kernel takes)"
    assert fused.decode_step("fp32") == "cpu (fused C layers, 1 to 8 lanes)"
    assert fused.decode_step("bf16").startswith("per operator (the fused step reads fp32 or hq-e8-2b pages")
    return src.spec, fused, ops, ref


# three sequences: their lengths, and page tables that interleave in the pool (not consecutive runs)
LENS = (5, 70, 130)
TABLES = ([9, 4, 1], [0, 7, 3], [2, 8, 5, 6])


def _run(model, spec, steps: int, lanes: tuple[int, ...]):
    """Prefill the sequences of `lanes`, then `steps` decode steps of all of them at once: (per step the logits
    [len(lanes), vocab], the K pages of layer 0 after the last step)."""
    kv = KVStore(get_kv_format("fp32"), spec, 10)
    g = torch.Generator().manual_seed(11)
    seqs = {i: torch.randint(3, 1000, (LENS[i],), generator=g).tolist() for i in lanes}
    for i in lanes:
        model.forward(ForwardBatch.build([SeqChunk(seqs[i], 0, TABLES[i], "last")], PT), kv)
    out = []
    for s in range(steps):
        chunks = [SeqChunk([(7 * s + 13 * i) % 900 + 5], LENS[i] + s, TABLES[i], "last") for i in lanes]
        out.append(model.forward(ForwardBatch.build(chunks, PT), kv))
    return out, kv.buffer("k")[0].clone(), kv.buffer("v")[-1].clone()


@pytest.mark.parametrize("lanes", [(0,), (1,), (0, 1, 2)])
def test_fused_decode_matches_the_fp32_reference_and_the_operator_path(models, lanes):
    spec, fused, ops, ref = models
    got, k_got, v_got = _run(fused, spec, 6, lanes)
    same, k_ops, v_ops = _run(ops, spec, 6, lanes)
    want, k_ref, v_ref = _run(ref, spec, 6, lanes)
    for a, b, c in zip(got, same, want):
        scale = c.abs().max()
        assert (a - c).abs().max() <= 1e-4 * scale      # the fp32 reference: exact products, fp32 rounding only
        assert (a - b).abs().max() <= 2e-5 * scale      # the operator path: the same products and sums
        assert torch.equal(a.argmax(-1), c.argmax(-1))
    torch.testing.assert_close(k_got, k_ref, rtol=1e-5, atol=1e-6)   # the keys written (RoPE'd) and values
    torch.testing.assert_close(v_got, v_ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(k_got, k_ops, rtol=1e-6, atol=1e-7)
    assert v_got.abs().sum() > 0


def test_which_forwards_take_it(models, monkeypatch):
    spec, fused, _, ref = models
    calls = []
    real = fused._fused.run
    monkeypatch.setattr(fused._fused, "run", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    kv = KVStore(get_kv_format("fp32"), spec, 10)
    fused.forward(ForwardBatch.build([SeqChunk(list(range(5, 25)), 0, [0], "last")], PT), kv)
    assert calls == []                                                  # prefill: the operator path
    fused.forward(ForwardBatch.build([SeqChunk([7], 20, [0], "last")], PT), kv)
    assert calls == [1]                                                 # a decode step
    mixed = [SeqChunk([8], 21, [0], "last"), SeqChunk([5, 6, 7], 0, [1], "last")]
    fused.forward(ForwardBatch.build(mixed, PT), kv)
    assert calls == [1]                                                 # decode beside a prefill chunk
    many = [SeqChunk([9], 22 if i == 0 else 0, [i], "last") for i in range(9)]
    fused.forward(ForwardBatch.build(many, PT), kv)
    assert calls == [1]                                                 # 9 rows: more than the C product takes
    fused.batch_invariant = True
    try:
        fused.forward(ForwardBatch.build([SeqChunk([7], 23, [0], "last")], PT), kv)
    finally:
        fused.batch_invariant = False
    assert calls == [1]                                                 # batch_invariant: padded rows, torch path
    bf16 = KVStore(get_kv_format("bf16"), spec, 2)
    fused.forward(ForwardBatch.build([SeqChunk([5, 6], 0, [0], "last")], PT), bf16)
    fused.forward(ForwardBatch.build([SeqChunk([7], 2, [0], "last")], PT), bf16)
    assert calls == [1]                                                 # bf16 pages
    assert ref._fused is None                                           # fp32 weights: never


def test_the_switch_turns_it_off():
    code = "from ignis_kernels.decode import llama_cpu; print(llama_cpu.available(), llama_cpu.error())"
    env = {**os.environ, "IGNIS_FUSED_DECODE_KERNEL": "0"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False disabled by IGNIS_FUSED_DECODE_KERNEL=0"
    env = {**os.environ, "IGNIS_DENSE_CPU_KERNEL": "0"}                 # a kernel it is made of, off: off too
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False disabled by IGNIS_DENSE_CPU_KERNEL=0"


# hq-e8-2b: 16-token pages, a 32-token window (Wp 2, the ring 48 tokens), 4 sinks; the lanes' decode steps cross
# sink writes (lane 0 at positions 2, 3), the centre fixed and page 0 encoded (lane 1 at 48) and page 2 leaving the
# window (lane 2 at 80); their state slots are not their row order
HQ_PT, HQ_LENS, HQ_SLOTS = 16, (2, 45, 78), (2, 0, 1)
HQ_TABLES = ([10], [3, 0, 8, 5], [1, 7, 2, 9, 4, 6])


def _hq_run(model, spec, steps: int, lanes: tuple[int, ...], **fmt_args):
    """_run over hq-e8-2b pages and their exact windows: (per step the logits, the state store, the KV store).
    fmt_args: HQFormat fields other than this test's defaults (a 32-token window, 4 sinks, the format's centering)."""
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", page_tokens=HQ_PT,
                   **{"exact_window": 32, "exact_sinks": 4, **fmt_args})
    stable = rope_stable_dims(spec)
    kv = KVStore(fmt, spec, 11, page_tokens=HQ_PT, center_dims=stable, page_center_dims=1 - stable)
    st = StateStore(fmt.seq_state_buffers(spec), 3)
    g = torch.Generator().manual_seed(5)
    seqs = {i: torch.randint(3, 1000, (HQ_LENS[i],), generator=g).tolist() for i in lanes}
    for i in lanes:
        model.forward(ForwardBatch.build([SeqChunk(seqs[i], 0, HQ_TABLES[i], "last", HQ_SLOTS[i])], HQ_PT), kv, st)
    out = []
    for s in range(steps):
        chunks = [SeqChunk([(7 * s + 13 * i) % 900 + 5], HQ_LENS[i] + s, HQ_TABLES[i], "last", HQ_SLOTS[i])
                  for i in lanes]
        out.append(model.forward(ForwardBatch.build(chunks, HQ_PT), kv, st))
    return out, st, kv


@pytest.mark.parametrize("lanes", [(0,), (1,), (2,), (0, 1, 2)])
def test_fused_decode_over_hq_pages_matches_the_operator_paths(models, lanes, monkeypatch):
    spec, fused, ops, _ = models
    calls = []
    real = fused._fused.run
    monkeypatch.setattr(fused._fused, "run", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    got, st_got, kv_got = _hq_run(fused, spec, 8, lanes)
    assert calls == [len(lanes)] * 8                                    # every decode step fused
    same, st_ops, kv_ops = _hq_run(ops, spec, 8, lanes)                 # the C attention and window kernels
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    want, st_ref, _ = _hq_run(ops, spec, 8, lanes)                      # the torch attention (hq_decode.py)
    for a, b, c in zip(got, same, want):
        scale = c.abs().max()
        assert (a - b).abs().max() <= 2e-5 * scale
        assert (a - c).abs().max() <= 1e-4 * scale
        assert torch.equal(a.argmax(-1), c.argmax(-1))
    for name in ("kv_window", "kv_sinks", "kv_center"):                 # the exact tokens and centres written
        torch.testing.assert_close(st_got.buffer(name), st_ref.buffer(name), rtol=1e-5, atol=1e-6)
        assert st_got.buffer(name).abs().sum() > 0 or name == "kv_center" and lanes == (0,)
    codes, want_codes = kv_got.buffer("codes"), kv_ops.buffer("codes")
    assert (codes != want_codes).float().mean() <= 1e-3                 # the pages encoded (a rounding tie may flip)
    assert (codes != 0).any() == (lanes != (0,))


@pytest.mark.parametrize("fmt_args", [{"exact_sinks": 0, "centering": ""}, {"exact_window": 16, "centering": "k"}])
def test_fused_decode_over_hq_pages_without_sinks_or_centre_or_with_a_one_page_window(models, fmt_args):
    """No sink buffer and no centre (the kernel's NULL paths); a one-page window (Wp 1: pages leave at 32, 48, ...)
    under key centering (keys centred, no μ_V added back)."""
    spec, fused, ops, _ = models
    got, st_got, _ = _hq_run(fused, spec, 8, (0, 1, 2), **fmt_args)
    want, st_ops, _ = _hq_run(ops, spec, 8, (0, 1, 2), **fmt_args)
    for a, b in zip(got, want):
        assert (a - b).abs().max() <= 2e-5 * b.abs().max()
        assert torch.equal(a.argmax(-1), b.argmax(-1))
    torch.testing.assert_close(st_got.buffer("kv_window"), st_ops.buffer("kv_window"), rtol=1e-5, atol=1e-6)


def test_hq_pages_under_another_attention_backend_take_the_operator_path(models, monkeypatch):
    spec, fused, _, _ = models
    assert fused.decode_step("hq-e8-2b") == "cpu (fused C layers, 1 to 8 lanes)"
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    assert fused.decode_step("hq-e8-2b") == "per operator (IGNIS_HQ_ATTENTION picks another hq-e8-2b backend)"
    calls = []
    monkeypatch.setattr(fused._fused, "run", lambda *a: calls.append(1))
    _hq_run(fused, spec, 1, (1,))
    assert calls == []

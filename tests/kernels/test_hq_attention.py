"""Attention over hq-e8-2b pages (ignis_kernels.attention, tag "hq-e8-2b") with the exact window and sinks of
KVStore.write_exact, against a float64 oracle of HQ_E8_2B.md §4 in the original domain (hq_support.oracle): exact
keys inside the window rule, decoded keys with the logit-variance correction outside it. Awkward cases: chunks that
start mid-page and cross several pages (so early queries read keys that later queries read compressed), a chunk
longer than the ring, single decode steps over the window/compressed seam and page starts, GQA fan-out, sinks,
batched decode of sequences of different lengths on scrambled page tables; chunking invariance of the bytes."""
from __future__ import annotations

import pytest
import torch

import ignis_kernels.attention as kattn
from hq_support import attend, decoded, hq_pool, oracle, run_pieces, write_chunks, write_pieces

torch.set_num_threads(1)


@pytest.fixture(params=["cpu", "reference"])
def decode_backend(request, monkeypatch):
    """Decode attention on the CPU by the fused C kernel (hq_cpu.py) and by the torch path (hq_decode.py)."""
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", request.param)
    assert kattn.hq_backend(torch.device("cpu")) == request.param
    return request.param


def rel(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("hq, hkv, d, window, sinks, pieces, vc", [
    (6, 2, 16, 8, 2, [13, 1, 1, 20, 1, 7, 1, 1, 1], None),  # GQA 3, Wp 1, two sinks, mid-page chunks
    (4, 4, 8, 0, 0, [5, 1, 30, 1, 1], 1.0),                 # MHA, Wp 0 (only the current page exact), no sinks
    (2, 1, 32, 16, 1, [40, 1, 9, 1], 0.0),                  # MQA, Wp 2; a 40-token chunk is longer than the ring
    (6, 2, 16, 16, 1, [25, 3, 1, 4, 2, 9], 0.3),            # chunks whose every compressed page precedes the window
])
def test_prefill_and_decode_match_the_oracle(hq, hkv, d, window, sinks, pieces, vc, decode_backend):
    """vc: the variance correction's strength (None: the shipped default; 1: HQ_E8_2B.md §4.1's; 0: none)."""
    kv, st, fmt = hq_pool(hkv=hkv, d=d, window=window, sinks=sinks, vc=vc)
    pt, wp = kv.page_tokens, fmt.exact_window_pages
    g = torch.Generator().manual_seed(hq * 100 + d)
    ctx = sum(pieces)
    xk, xv = torch.randn(ctx, hkv, d, generator=g), torch.randn(ctx, hkv, d, generator=g)
    q = torch.randn(ctx, hq, d, generator=g) * 2
    pages = torch.randperm(kv.num_pages, generator=g)[:-(-ctx // pt)].tolist()
    for start, end, got, kh, vh, rk in run_pieces(kv, st, xk, xv, q, pages, pieces):
        n_enc = fmt.encoded_pages(end) * pt
        assert not kh[n_enc:].any()                       # nothing past the window's start is encoded yet
        want = oracle(q[start:end], xk[:end], xv[:end], kh, vh, rk, start, wp, pt, sinks, fmt.variance_correction)
        assert rel(got, want) < 2e-5, (start, end)


def test_batched_decode_of_three_sequences(decode_backend):
    kv, st, fmt = hq_pool(hkv=2, d=16, window=8, sinks=1, vc=0.7)
    pt, wp = kv.page_tokens, fmt.exact_window_pages
    g = torch.Generator().manual_seed(4)
    lens = [3, 17, 31]
    seqs, pool = [], torch.randperm(kv.num_pages, generator=g).tolist()
    for i, n in enumerate(lens):
        total = n + 2
        pages = [pool.pop() for _ in range(-(-total // pt))]
        seqs.append((torch.randn(total, 2, 16, generator=g), torch.randn(total, 2, 16, generator=g), pages, i))
        st.zero(i)
        k, v, _, _ = seqs[-1]
        write_chunks(kv, st, 0, [(k[:n], v[:n], 0, pages, i)])
    for step in range(2):                              # two decode steps of all three at once
        chunk = [(k[n + step:n + step + 1], v[n + step:n + step + 1], n + step, pages, slot)
                 for (k, v, pages, slot), n in zip(seqs, lens)]
        plan, spans, ring = write_chunks(kv, st, 0, chunk)
        assert not spans and ring is not None and ring.k.shape[:2] == (3, (wp + 1) * pt)
        q = torch.randn(3, 4, 16, generator=g)
        got = attend(q, kv, 0, plan, spans, ring)
        for b, ((k, v, pages, _), n) in enumerate(zip(seqs, lens)):
            end = n + step + 1
            kh, vh, rk = decoded(kv, 0, pages, end)
            want = oracle(q[b:b + 1], k[:end], v[:end], kh, vh, rk, end - 1, wp, pt, 1, 0.7)
            assert rel(got[b:b + 1], want) < 2e-5, (b, step)


def _write_all(pieces, seed=9):
    kv, st, fmt = hq_pool(hkv=2, d=16, window=8, sinks=2)
    g = torch.Generator().manual_seed(seed)
    ctx = sum(pieces)
    xk, xv = torch.randn(ctx, 2, 16, generator=g), torch.randn(ctx, 2, 16, generator=g)
    write_pieces(kv, st, xk, xv, pieces)
    return kv, st


def test_encoded_bytes_and_window_do_not_depend_on_the_chunking():
    a_kv, a_st = _write_all([50])
    b_kv, b_st = _write_all([3, 1, 1, 20, 17, 1, 1, 6])
    c_kv, c_st = _write_all([1] * 50)
    for name in a_kv.buffer_names:
        assert torch.equal(a_kv.buffer(name), b_kv.buffer(name)) and torch.equal(a_kv.buffer(name),
                                                                                  c_kv.buffer(name)), name
    for name in ("kv_window", "kv_sinks"):
        assert torch.equal(a_st.buffer(name), b_st.buffer(name)) and torch.equal(a_st.buffer(name),
                                                                                  c_st.buffer(name)), name


def test_dispatcher_checks_the_exact_part():
    kv, st, _ = hq_pool()
    view = kv.view(0)
    q = torch.zeros(3, 4, 16)
    with pytest.raises(ValueError, match="ExactSpan"):
        kattn.paged_attention(q, view, torch.tensor([0]), 0)
    span = kattn.ExactSpan(torch.zeros(2, 2, 16), torch.zeros(2, 2, 16), 0, torch.zeros(0, 2, 16),
                           torch.zeros(0, 2, 16), 0, 1)
    with pytest.raises(ValueError, match="does not cover"):
        kattn.paged_attention(q, view, torch.tensor([0]), 0, exact=span)
    with pytest.raises(ValueError, match="ExactRing"):
        kattn.paged_decode_attention(q[:1], view, torch.zeros(1, 1, dtype=torch.long), torch.tensor([1]),
                                     exact=span)
    with pytest.raises(ValueError, match="no exact window"):
        from ignisd.cache.kv_format import get_kv_format
        from ignisd.cache.kv_store import KVStore
        KVStore(get_kv_format("fp32"), kv.geometry, 2).write_exact(0, q, q, None, st)


@pytest.mark.parametrize("blocks", [1, 2])
def test_small_page_blocks_match_the_oracle(monkeypatch, blocks):
    """The online softmax across several compressed blocks (prefill's block loop, which a chunk too large for one
    masked flash call takes, and the torch decode path), against the same oracle."""
    from ignis_kernels.attention import hq_decode, hq_reference
    monkeypatch.setattr(hq_reference, "BLOCK_PAGES", blocks)
    monkeypatch.setattr(hq_reference, "FLASH_MASK_ELEMENTS", 0)   # the block loop, not the one masked flash call
    monkeypatch.setattr(hq_decode, "DECODE_BLOCK_PAGES", blocks)
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    test_prefill_and_decode_match_the_oracle(6, 2, 16, 8, 2, [13, 1, 1, 20, 1, 7, 1, 1, 1], 0.5, "reference")
    test_batched_decode_of_three_sequences("reference")
    test_one_sequence_on_a_page_run_reads_the_pool_in_place(3, "reference")


@pytest.mark.parametrize("sinks", [0, 3])
def test_one_sequence_on_a_page_run_reads_the_pool_in_place(sinks, decode_backend):
    """A lone decode row whose pages are a consecutive run (AttentionPlan.decode_single: the CPU path slices the
    pool and masks its ring by position) at every context from 1 to 60: before the first page is encoded, while
    the position is still among the sinks, and across page starts, against the oracle; and hq_reference's decode
    (the specification, the CPU path of "hq-sim") on the same steps."""
    from ignis_kernels.attention import hq_reference
    kv, st, fmt = hq_pool(hkv=2, d=16, window=8, sinks=sinks)
    pt, wp = kv.page_tokens, fmt.exact_window_pages
    g = torch.Generator().manual_seed(11 + sinks)
    ctx = 60
    xk, xv = torch.randn(ctx, 2, 16, generator=g), torch.randn(ctx, 2, 16, generator=g)
    q = torch.randn(ctx, 6, 16, generator=g) * 2
    pages = list(range(5, 5 + -(-ctx // pt)))
    st.zero(2)
    for p in range(ctx):
        plan, _, ring = write_chunks(kv, st, 0, [(xk[p:p + 1], xv[p:p + 1], p, pages, 2)])
        assert plan.decode_single == (p + 1, 5)
        got = kattn.paged_decode_attention(q[p:p + 1], kv.view(0), plan.decode_pages, plan.decode_lens, exact=ring,
                                           single=plan.decode_single)
        kh, vh, rk = decoded(kv, 0, pages, p + 1)
        want = oracle(q[p:p + 1], xk[:p + 1], xv[:p + 1], kh, vh, rk, p, wp, pt, sinks, fmt.variance_correction)
        assert rel(got, want) < 2e-5, p
        spec = hq_reference.hq_paged_decode_attention(q[p:p + 1], kv.view(0), plan.decode_pages, plan.decode_lens,
                                                      ring)                 # the specification's decode (hq-sim's)
        assert rel(spec, want) < 2e-5, p


def test_the_word_table_is_four_times_every_codeword():
    """hq_decode's packed int8 table against the spec's full decode table (HQ_E8_2B.md §1.1, its conformance hash is
    test_kvq_codec's): every one of the 65,536 codes, indexed as the int16 code the pool stores."""
    from ignis_kernels.attention.hq_decode import decode_words
    from ignis_kernels.kvq.codebook import decode_table
    codes = torch.arange(65536).reshape(-1, 1)
    signed = torch.where(codes >= 1 << 15, codes - (1 << 16), codes).to(torch.int16)
    assert torch.equal(decode_words(signed) * 0.25, decode_table("cpu")[codes[:, 0]])

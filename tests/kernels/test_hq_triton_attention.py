"""The Triton attention over hq-e8-2b pages (kernels/attention/hq_triton.py) against the torch reference, on the
CPU under TRITON_INTERPRET=1, through the dispatcher (IGNIS_HQ_ATTENTION=triton): prefill chunks that start
mid-page and cross the window/compressed seam, a chunk longer than the ring, batched decode of sequences of
different lengths on scrambled page tables, GQA fan-out and sinks, pages of 8 tokens (a few pages each: the
interpreter runs a program as numpy). Skipped where Triton is not installed."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import ignis_kernels.attention as kattn  # noqa: E402
from hq_support import attend, hq_pool, write_chunks  # noqa: E402

torch.set_num_threads(1)


def both(monkeypatch, q, kv, plan, spans, ring):
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    ref = attend(q, kv, 0, plan, spans, ring)
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "triton")
    assert kattn.hq_backend(q.device) == "triton"
    got = attend(q, kv, 0, plan, spans, ring)
    return float((got - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("hq, hkv, d, window, sinks, pieces", [
    (6, 2, 16, 8, 2, [13, 1, 20, 1]),
    (2, 1, 32, 16, 0, [30, 1, 1]),
])
def test_triton_prefill_and_decode_match_the_reference(monkeypatch, hq, hkv, d, window, sinks, pieces):
    kv, st, _ = hq_pool(hkv=hkv, d=d, window=window, sinks=sinks)
    g = torch.Generator().manual_seed(d)
    ctx = sum(pieces)
    xk, xv = torch.randn(ctx, hkv, d, generator=g), torch.randn(ctx, hkv, d, generator=g)
    q = torch.randn(ctx, hq, d, generator=g)
    pages = torch.randperm(kv.num_pages, generator=g)[:-(-ctx // kv.page_tokens)].tolist()
    st.zero(0)
    start = 0
    for n in pieces:
        plan, spans, ring = write_chunks(kv, st, 0, [(xk[start:start + n], xv[start:start + n], start, pages, 0)])
        assert both(monkeypatch, q[start:start + n], kv, plan, spans, ring) < 1e-5, (start, n)
        start += n


def test_triton_batched_decode_matches_the_reference(monkeypatch):
    kv, st, _ = hq_pool(hkv=2, d=16, window=8, sinks=1)
    g = torch.Generator().manual_seed(3)
    pool = torch.randperm(kv.num_pages, generator=g).tolist()
    chunk = []
    for slot, n in enumerate((2, 17, 33)):
        pages = [pool.pop() for _ in range(-(-(n + 1) // kv.page_tokens))]
        k, v = torch.randn(n + 1, 2, 16, generator=g), torch.randn(n + 1, 2, 16, generator=g)
        st.zero(slot)
        write_chunks(kv, st, 0, [(k[:n], v[:n], 0, pages, slot)])
        chunk.append((k[n:], v[n:], n, pages, slot))
    plan, spans, ring = write_chunks(kv, st, 0, chunk)
    q = torch.randn(3, 4, 16, generator=g)
    assert both(monkeypatch, q, kv, plan, spans, ring) < 1e-5

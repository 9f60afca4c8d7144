"""The Triton attention over hq-e8-2b pages (kernels/attention/hq_triton.py) against the torch reference, on the
CPU under TRITON_INTERPRET=1, through the dispatcher (IGNIS_HQ_ATTENTION=triton): prefill chunks that start
mid-page and cross the window/compressed seam, a chunk longer than the ring, batched decode of sequences of
different lengths on scrambled page tables, GQA fan-out and sinks, pages of 8 and 16 tokens (a few pages each: the
interpreter runs a program as numpy), the page key centre (kvq/page_center.py) in each of its storage dtypes
(float32, float16, float8 e4m3) and shown to count (keys with mean 1.5). Skipped where Triton is not installed."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import ignis_kernels.attention as kattn  # noqa: E402
from hq_support import attend, hq_pool, write_chunks  # noqa: E402
from ignis_kernels.kvq import page_center  # noqa: E402

torch.set_num_threads(1)


def rel(got, ref):
    return float((got - ref).abs().max() / ref.abs().max())


def both(monkeypatch, q, kv, plan, spans, ring):
    """(Triton's error against the reference, how far Triton's output moves when the pool's page key centres are
    zeroed: 0 unless some query reads compressed keys)."""
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    ref = attend(q, kv, 0, plan, spans, ring)
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "triton")
    assert kattn.hq_backend(q.device) == "triton"
    got = attend(q, kv, 0, plan, spans, ring)
    center = kv.buffer("center")[0]
    saved = center.clone()
    center.zero_()
    try:
        bare = attend(q, kv, 0, plan, spans, ring)
    finally:
        center.copy_(saved)
    return rel(got, ref), rel(bare, got)


def centre_rms(kv, pages, d):
    """RMS over the dims of each encoded page's stored key centre (rotated; keys of mean 1.5 give about 1.5)."""
    return page_center.unpack(kv.view(0).buffers["center"][pages], d).pow(2).mean(-1).sqrt()


@pytest.mark.parametrize("hq, hkv, d, pt, window, sinks, pieces, vc", [
    (6, 2, 16, 8, 8, 2, [13, 1, 20, 1], None),       # centre float16 (d <= 2·pt); the default correction
    (2, 1, 32, 8, 16, 0, [30, 1, 1], 1.0),           # centre float8 e4m3 (d <= 4·pt); the spec's full correction
    (2, 1, 16, 16, 16, 1, [40, 1], 0.0),             # centre float32 (d <= pt); no correction
])
def test_triton_prefill_and_decode_match_the_reference(monkeypatch, hq, hkv, d, pt, window, sinks, pieces, vc):
    kv, st, fmt = hq_pool(hkv=hkv, d=d, pt=pt, window=window, sinks=sinks, vc=vc)
    g = torch.Generator().manual_seed(d)
    ctx = sum(pieces)
    xk, xv = torch.randn(ctx, hkv, d, generator=g) + 1.5, torch.randn(ctx, hkv, d, generator=g)
    q = torch.randn(ctx, hq, d, generator=g)
    pages = torch.randperm(kv.num_pages, generator=g)[:-(-ctx // kv.page_tokens)].tolist()
    st.zero(0)
    start = 0
    moved = []
    for n in pieces:
        plan, spans, ring = write_chunks(kv, st, 0, [(xk[start:start + n], xv[start:start + n], start, pages, 0)])
        err, bare = both(monkeypatch, q[start:start + n], kv, plan, spans, ring)
        assert err < 1e-5, (start, n)
        moved.append(bare)
        start += n
    n_enc = (ctx - 1) // pt - fmt.exact_window_pages
    assert n_enc >= 1 and ((centre_rms(kv, pages[:n_enc], d) - 1.5).abs() < 0.4).all()
    assert moved[-1] > 1e-2, moved                 # the last query reads compressed keys: the centre counts


def test_triton_batched_decode_matches_the_reference(monkeypatch):
    kv, st, _ = hq_pool(hkv=2, d=16, window=8, sinks=1)
    g = torch.Generator().manual_seed(3)
    pool = torch.randperm(kv.num_pages, generator=g).tolist()
    chunk = []
    for slot, n in enumerate((2, 17, 33)):
        pages = [pool.pop() for _ in range(-(-(n + 1) // kv.page_tokens))]
        k, v = torch.randn(n + 1, 2, 16, generator=g) + 1.5, torch.randn(n + 1, 2, 16, generator=g)
        st.zero(slot)
        write_chunks(kv, st, 0, [(k[:n], v[:n], 0, pages, slot)])
        chunk.append((k[n:], v[n:], n, pages, slot))
    plan, spans, ring = write_chunks(kv, st, 0, chunk)
    q = torch.randn(3, 4, 16, generator=g)
    err, bare = both(monkeypatch, q, kv, plan, spans, ring)
    assert err < 1e-5 and bare > 1e-2, (err, bare)

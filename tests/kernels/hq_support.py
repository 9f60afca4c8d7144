"""Helpers for the hq-e8-2b attention tests: a small hq pool and state store, sequences written through the real
KVStore.write_exact, and a float64 oracle of HQ_E8_2B.md §4 written in the original (unrotated) domain."""
from __future__ import annotations

import math

import torch

import ignis_kernels.attention as kattn
from ignisd.cache.kv_format import HQFormat, KVGeometry
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.model.attention import AttentionPlan
from ignisd.model.batch import ForwardBatch, SeqChunk


def hq_pool(layers=1, hkv=2, d=16, pt=8, window=8, sinks=2, pages=40, slots=4, centering="", vc=None):
    """(KVStore, StateStore, HQFormat) of a small geometry: pt-token pages, Wp = ceil(window / pt); uncentred unless
    `centering` (the oracle here reads the stored keys as they are; test_hq_centering.py covers the centre); vc the
    variance correction's strength (None: the format's default)."""
    kw = {} if vc is None else {"variance_correction": vc}
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=window, exact_sinks=sinks, page_tokens=pt,
                   centering=centering, **kw)
    geom = KVGeometry(layers, hkv, d)
    return KVStore(fmt, geom, pages, page_tokens=pt), StateStore(fmt.seq_state_buffers(geom), slots), fmt


def write_chunks(kv, st, layer, chunks):
    """Write one forward's chunks: [(k [n, Hkv, d], v, start, page_ids, slot)] -> (plan, spans, ring)."""
    sc = [SeqChunk([0] * k.shape[0], start, pages, "none", slot) for k, _, start, pages, slot in chunks]
    batch = ForwardBatch.build(sc, kv.page_tokens)
    plan = AttentionPlan.from_batch(batch)
    k = torch.cat([c[0] for c in chunks])
    v = torch.cat([c[1] for c in chunks])
    spans, ring = kv.write_exact(layer, k, v, plan, st)
    return plan, spans, ring


def attend(q, kv, layer, plan, spans, ring):
    """Attention of the batch's queries q [T, Hq, d] through the dispatcher (prefill per chunk, decode batched)."""
    view = kv.view(layer)
    out = torch.zeros(q.shape)
    for (row, n, start, pages, _), span in zip(plan.prefill, spans):
        out[row:row + n] = kattn.paged_attention(q[row:row + n], view, pages, start, exact=span)
    if plan.decode_rows is not None:
        od = kattn.paged_decode_attention(q[plan.decode_rows], view, plan.decode_pages, plan.decode_lens,
                                          exact=ring)
        out[plan.decode_rows] = od
    return out


def oracle(q, xk, xv, khat, vhat, resid_k, start, wp, pt, sinks, vc, scale=None):
    """float64 §4 in the original domain for one sequence: q [n, Hq, d] at positions start.., xk/xv [ctx, Hkv, d]
    exact, khat/vhat the decoded copies, resid_k [ctx, Hkv] the keys' stored resid, vc the strength α of the
    variance correction (z −= α·½τ²‖q‖²resid²/d). Returns [n, Hq, d]."""
    n, hq, d = q.shape
    hkv = xk.shape[1]
    g = hq // hkv
    tau = 1 / math.sqrt(d) if scale is None else scale
    out = torch.zeros(n, hq, d, dtype=torch.float64)
    for i in range(n):
        p = start + i
        j = torch.arange(p + 1)
        exact = (j < sinks) | (j // pt >= p // pt - wp)
        for h in range(hq):
            kh = h // g
            qq = q[i, h].double()
            keys = torch.where(exact[:, None], xk[:p + 1, kh].double(), khat[:p + 1, kh].double())
            vals = torch.where(exact[:, None], xv[:p + 1, kh].double(), vhat[:p + 1, kh].double())
            z = tau * keys @ qq
            corr = vc * 0.5 * tau * tau * (qq @ qq) * resid_k[:p + 1, kh].double() ** 2 / d
            z = z - torch.where(exact, torch.zeros_like(corr), corr)
            out[i, h] = torch.softmax(z, 0) @ vals
    return out


def decoded(kv, layer, page_ids, ctx):
    """The pool's decoded keys/values and key resid for positions 0..ctx-1 of a sequence on page_ids (zeros where a
    page is not encoded yet)."""
    pt = kv.page_tokens
    slots = torch.tensor([page_ids[p // pt] * pt + p % pt for p in range(ctx)])
    kh, vh = kv.decode(layer, slots)
    rk = kv.buffer("resid")[layer].index_select(0, slots)[:, 0].float()
    return kh, vh, rk


def run_pieces(kv, st, xk, xv, q, pages, pieces, slot=1):
    """Write one sequence's keys/values xk, xv [ctx, Hkv, d] in chunks of `pieces` tokens on `pages` (state slot
    `slot`, zeroed first) and attend each chunk's queries q [ctx, Hq, d]; yields (start, end, output [n, Hq, d],
    decoded keys, decoded values, keys' resid) after each chunk (decoded(...) at context end)."""
    st.zero(slot)
    start = 0
    for n in pieces:
        end = start + n
        plan, spans, ring = write_chunks(kv, st, 0, [(xk[start:end], xv[start:end], start, pages, slot)])
        got = attend(q[start:end], kv, 0, plan, spans, ring)
        yield (start, end, got, *decoded(kv, 0, pages, end))
        start = end


def write_pieces(kv, st, xk, xv, pieces, slot=0):
    """Write one sequence of sum(pieces) tokens (xk, xv [ctx, Hkv, d]) in chunks of `pieces` on pages 0, 1, ..."""
    pages = list(range(-(-sum(pieces) // kv.page_tokens)))
    st.zero(slot)
    start = 0
    for n in pieces:
        write_chunks(kv, st, 0, [(xk[start:start + n], xv[start:start + n], start, pages, slot)])
        start += n
    return pages

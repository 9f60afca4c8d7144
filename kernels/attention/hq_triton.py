"""Attention over hq-e8-2b pages as a Triton kernel (HQ_E8_2B.md §4), the same maths and signatures as
hq_reference.py: the query rotated once (in torch, one FWHT per head), keys decoded tile by tile inside the kernel
straight from the int16 codes through the 65,536 × 8 decode table and dotted in the rotated domain with the
logit-variance correction (of strength α: the kernel is given α‖q‖², hq_reference.corrected_qn2) and the page
key centre's q̃·μ_K (kvq/page_center.py; every page's μ_K decoded once a call
in torch, [P, Hkv, d] float32, and read as a [BT, d] tile a key block), values accumulated rotated with an online
softmax, the output un-rotated once (torch).

One program per (query row, query head); the exact part is either a ring of R slots per row (decode: slot r holds
the position ≡ r mod R) or one linear span shared by the rows of a prefill chunk, plus the sinks. This is the
straightforward SIMT form (no GQA tile sharing, no tensor-core MMA, §4.2's fast paths): it exists so that the
Triton path is behind the same interface and tested (tests/kernels/test_hq_triton_attention.py, TRITON_INTERPRET=1
on the CPU); it has not been measured on a GPU. AVAILABLE: whether Triton imports.
"""
from __future__ import annotations

import math

import torch

from ignis_kernels.attention.exact import ExactRing, ExactSpan
from ignis_kernels.attention.hq_reference import corrected_qn2, rotate_queries, unrotate_output
from ignis_kernels.kvq import page_center
from ignis_kernels.kvq.codebook import decode_table

try:
    import triton
    import triton.language as tl
    AVAILABLE = True
except ImportError:
    triton = tl = None
    AVAILABLE = False

_NEG = -1.0e30

if AVAILABLE:
    @triton.jit
    def _online(z, m, lsum):
        """One online-softmax step: the new max, the rescale of the old sums and the tile's weights."""
        m_new = tl.maximum(m, tl.max(z, axis=0))
        alpha = tl.exp(m - m_new)
        p = tl.exp(z - m_new)
        return m_new, alpha, p, lsum * alpha + tl.sum(p, axis=0)

    @triton.jit
    def _hq_attn_kernel(qt_ptr, qn2_ptr, pos_ptr, trow_ptr, table_ptr, codes_ptr, scale_ptr, resid_ptr, mu_ptr,
                        dec_ptr, ek_ptr, ev_ptr, sk_ptr, sv_ptr, out_ptr,
                        W, s_pg, s_tk, s_kd, s_hd, m_pg, m_tk, m_kd, m_hd, e_row, n_exact, first, s_row, n_sinks,
                        tau, PT: tl.constexpr, WP: tl.constexpr, HQ: tl.constexpr, G: tl.constexpr,
                        HKV: tl.constexpr, D: tl.constexpr, BT: tl.constexpr, RING: tl.constexpr):
        row = tl.program_id(0)
        h = tl.program_id(1)
        kh = h // G
        dd = tl.arange(0, D)
        q = tl.load(qt_ptr + (row * HQ + h) * D + dd)
        qn2 = tl.load(qn2_ptr + row * HQ + h)
        p = tl.load(pos_ptr + row)
        trow = tl.load(trow_ptr + row)
        wlo = tl.maximum(p // PT - WP, 0) * PT
        m = tl.full((), _NEG, tl.float32)
        lsum = tl.zeros((), tl.float32)
        acc = tl.zeros((D,), tl.float32)
        tt = tl.arange(0, BT)
        for t0 in range(0, wlo, BT):                                       # compressed keys [0, wlo)
            tok = t0 + tt
            page = tl.load(table_ptr + trow * W + tok // PT)
            base = page * s_pg + (tok % PT) * s_tk + kh * s_hd
            mbase = page * m_pg + (tok % PT) * m_tk + kh * m_hd
            ck = tl.load(codes_ptr + base[:, None] + (dd // 8)[None, :]).to(tl.int32) & 0xFFFF
            kv = tl.load(dec_ptr + ck * 8 + (dd % 8)[None, :])             # [BT, D] codewords
            sk = tl.load(scale_ptr + mbase)
            rk = tl.load(resid_ptr + mbase).to(tl.float32)
            mu = tl.load(mu_ptr + (page * HKV + kh)[:, None] * D + dd[None, :])   # [BT, D] page key centres
            z = (tau * sk * tl.sum(kv * q[None, :], axis=1) + tau * tl.sum(mu * q[None, :], axis=1)
                 - 0.5 * tau * tau * qn2 * rk * rk / D)
            z = tl.where((tok < wlo) & (tok >= n_sinks), z, float("-inf"))
            m, alpha, w, lsum = _online(z, m, lsum)
            cv = tl.load(codes_ptr + base[:, None] + s_kd + (dd // 8)[None, :]).to(tl.int32) & 0xFFFF
            vv = tl.load(dec_ptr + cv * 8 + (dd % 8)[None, :])
            sv = tl.load(scale_ptr + mbase + m_kd)
            acc = acc * alpha + tl.sum((w * sv)[:, None] * vv, axis=0)
        for e0 in range(0, n_exact, BT):                                   # the exact window
            idx = e0 + tt
            if RING:
                jpos = p - ((p - idx) % n_exact)
            else:
                jpos = first + idx
            ok = (idx < n_exact) & (jpos <= p) & (jpos >= wlo) & (jpos >= n_sinks) & (jpos >= 0)
            off = row * e_row + idx * (HKV * D) + kh * D
            k = tl.load(ek_ptr + off[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
            z = tl.where(ok, tau * tl.sum(k * q[None, :], axis=1), float("-inf"))
            m, alpha, w, lsum = _online(z, m, lsum)
            v = tl.load(ev_ptr + off[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
            acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        for s0 in range(0, n_sinks, BT):                                   # the sinks
            idx = s0 + tt
            ok = (idx < n_sinks) & (idx <= p)
            off = row * s_row + idx * (HKV * D) + kh * D
            k = tl.load(sk_ptr + off[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
            z = tl.where(ok, tau * tl.sum(k * q[None, :], axis=1), float("-inf"))
            m, alpha, w, lsum = _online(z, m, lsum)
            v = tl.load(sv_ptr + off[:, None] + dd[None, :], mask=ok[:, None], other=0.0)
            acc = acc * alpha + tl.sum(w[:, None] * v, axis=0)
        tl.store(out_ptr + (row * HQ + h) * D + dd, acc / lsum)


def _run(q, view, table, trow, pos, ek, ev, e_row, n_exact, first, sk, sv, s_row, n_sinks, wp, ring, scale):
    if not AVAILABLE:
        raise RuntimeError("Triton is not installed: the hq-e8-2b Triton attention is unavailable")
    signs = view.params["signs"]
    hkv, d = signs.shape[1], signs.shape[2]
    n, hq = q.shape[0], q.shape[1]
    g = hq // hkv
    qt = rotate_queries(q, signs[0]).reshape(n, hq, d).contiguous()
    qn2 = corrected_qn2(q, view).contiguous()                          # α‖q‖² [n, Hq]
    codes, sc, rs = view.buffers["codes"], view.buffers["scale"], view.buffers["resid"]
    mu = page_center.unpack(view.buffers["center"], d).contiguous()      # [P, Hkv, d] float32 page key centres
    out = torch.empty(n, hq, d, dtype=torch.float32, device=q.device)
    pt = view.page_tokens
    _hq_attn_kernel[(n, hq)](
        qt, qn2, pos.contiguous(), trow.contiguous(), table.contiguous(), codes, sc, rs, mu, decode_table(q.device),
        ek, ev, sk, sv, out, table.shape[1], codes.stride(0), codes.stride(1), codes.stride(2), codes.stride(3),
        sc.stride(0), sc.stride(1), sc.stride(2), sc.stride(3), e_row, n_exact, first, s_row, n_sinks,
        1.0 / math.sqrt(d) if scale is None else scale, PT=pt, WP=wp, HQ=hq, G=g, HKV=hkv, D=d,
        BT=min(16, pt), RING=ring)
    return unrotate_output(out.view(n, hkv, g, d), signs[1])


def hq_paged_attention(q: torch.Tensor, view, page_table: torch.Tensor, start: int, exact: ExactSpan,
                       scale: float | None = None) -> torch.Tensor:
    """As hq_reference.hq_paged_attention: q [n, Hq, d] at positions start.. -> float32 [n, Hq, d]."""
    n, dev = q.shape[0], q.device
    pos = torch.arange(start, start + n, device=dev)
    table = page_table.view(1, -1)
    trow = torch.zeros(n, dtype=torch.long, device=dev)
    ek, ev = exact.k.float().contiguous(), exact.v.float().contiguous()
    sk, sv = exact.sink_k.float().contiguous(), exact.sink_v.float().contiguous()
    if sk.shape[0] == 0:
        sk = sv = torch.zeros(1, *ek.shape[1:], device=dev)
    return _run(q, view, table, trow, pos, ek, ev, 0, ek.shape[0], exact.first, sk, sv, 0,
                exact.sink_k.shape[0], exact.window_pages, False, scale)


def hq_paged_decode_attention(q: torch.Tensor, view, page_table: torch.Tensor, context_lens: torch.Tensor,
                              exact: ExactRing, scale: float | None = None) -> torch.Tensor:
    """As hq_reference.hq_paged_decode_attention: q [B, Hq, d] -> float32 [B, Hq, d]."""
    b, dev = q.shape[0], q.device
    ek, ev = exact.k.float().contiguous(), exact.v.float().contiguous()
    sk, sv = exact.sink_k.float().contiguous(), exact.sink_v.float().contiguous()
    n_sinks = sk.shape[1]
    if n_sinks == 0:
        sk = sv = torch.zeros(b, 1, *ek.shape[2:], device=dev)
    r = ek.shape[1]
    hkv, d = ek.shape[2], ek.shape[3]
    return _run(q, view, page_table, torch.arange(b, device=dev), context_lens - 1, ek, ev, r * hkv * d, r, 0,
                sk, sv, sk.shape[1] * hkv * d, n_sinks, exact.window_pages, True, scale)

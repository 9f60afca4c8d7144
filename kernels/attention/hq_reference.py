"""Attention over hq-e8-2b pages in pure torch (HQ_E8_2B.md §4): the specification and the CPU path.

Page buffers of an "hq-e8-2b" PagedView (one attention layer; [P, pt, 2, Hkv, ...], index 0 keys, 1 values):
codes int16 [.., d/8], scale float32, resid float16, and center uint8 [P, pt, Hkv, 4] (each page's key centre μ_p,
kvq/page_center.py); params["signs"]: float32 [2, Hkv, d] (±1, the
rotation of §2.1). A research view ("hq-sim", tools/bench_kvformat.py) has uhat float32 [.., d] (the decoded rotated
vector of any quantizer) and resid float32 instead of codes and scale.

Everything happens in the rotated domain (§4.1-§4.2), query head h reading KV head h // g (GQA):
    q̃ = H·(s_K ⊙ q)/√d                                   rotate each query once
    z_t = τ·q̃·(μ_p + ŝ_t·c_t) − α·½·τ²·‖q‖²·resid_t²/d    compressed key t on page p (logit-variance correction,
                                                          §4.1, of strength α = variance_correction(view); μ_p the
                                                          page key centre, kvq/page_center.py)
    z_t = τ·(q̃·u_t)                                       exact key t (window or sink, rotated)
    õ = Σ_t p_t·(ŝ_t c_t or u_t);  o = s_V ⊙ H·õ/√d       values accumulated rotated, un-rotated once (§4.2)
with p = softmax(z) over the causal context and the window rule of exact.py choosing, per (query, key), the exact
or the compressed copy. τ = the softmax scale (default 1/√d). The compressed context is read page block by page
block (online softmax, Milakov & Gimelshein 2018), each block's exact parts folded into its update. A prefill
chunk's keys that all its queries read compressed (the pages before its first query's window) are decoded at once
(4·(2d + 3) bytes a head-token on the CPU) and go through torch's fused CPU flash attention with the variance
correction as an extra dimension (_flash_common); decode blocks are 64 pages, prefill blocks 16. The CPU cost is
the number of torch ops, so codewords are gathered head-major for both kinds in one call from 24 KB of tables.
The dispatcher's CPU decode of "hq-e8-2b" is the leaner hq_decode.py (same formulas; hq_paged_decode_attention here
is the specification it is tested beside, and the decode of "hq-sim").
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from ignis_kernels.attention.exact import ExactRing, ExactSpan, encoded_pages, window_start
from ignis_kernels.kvq import page_center
from ignis_kernels.kvq.reference import codewords
from ignis_kernels.kvq.rotation import fwht

_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
"""torch's CPU flash attention returning each row's log-sum-exp (None where this build lacks it)."""
FLASH_MASK_ELEMENTS = 8 << 20
"""Largest additive mask (query rows × keys, float32: 32 MiB) of a prefill chunk's one masked flash-attention call
on the CPU (_flash_masked); a larger chunk reads its masked pages BLOCK_PAGES at a time instead."""
BLOCK_PAGES = 16
"""Compressed pages decoded per step of a prefill chunk (1,024 tokens at 64 a page)."""
DECODE_BLOCK_PAGES = 64
"""Compressed pages decoded per step of a decode batch (4,096 tokens: one step up to a 4K context)."""


@lru_cache(maxsize=None)
def _hadamard(d: int, device: str) -> torch.Tensor:
    """H_d/√d as a float32 [d, d] matrix (symmetric, orthonormal), built with the FWHT so its entries are exactly
    ±1/√d."""
    return fwht(torch.eye(d, device=device)) * (1.0 / math.sqrt(d))


def rotate_queries(q: torch.Tensor, signs_k: torch.Tensor) -> torch.Tensor:
    """q̃ = H·(s_K ⊙ q)/√d of queries q [..., Hq, d] with the key signs [Hkv, d] of their KV heads (head h: KV head
    h // g), as one matmul by H/√d (the queries are never stored, so the rounding of a matmul is fine; the stored
    keys and values use the batch-independent FWHT of kvq.rotation). Returns float32 [..., Hkv, g, d]."""
    hkv, d = signs_k.shape
    qg = q.float().reshape(*q.shape[:-2], hkv, q.shape[-2] // hkv, d)
    return (qg * signs_k[:, None, :]) @ _hadamard(d, str(q.device))


def unrotate_output(o: torch.Tensor, signs_v: torch.Tensor) -> torch.Tensor:
    """o = s_V ⊙ H·õ/√d for õ [..., Hkv, g, d] (rotated V domain; one matmul) -> float32 [..., Hkv·g, d]."""
    d = o.shape[-1]
    out = (o @ _hadamard(d, str(o.device))) * signs_v[:, None, :]
    return out.reshape(*o.shape[:-3], o.shape[-3] * o.shape[-2], d)


def add_center(o: torch.Tensor, center_v: torch.Tensor | None, signs_v: torch.Tensor) -> torch.Tensor:
    """Key/value centering (HQ_E8_2B.md §4.3): o + s_V ⊙ H·μ_V/√d, the values' centre added back to an attention
    output computed over centred values (Σ_t p_t = 1). o: float32 [..., Hq, d]; center_v: rotated μ_V [..., Hkv, d]
    (broadcast over query heads h → KV head h // g) or None (returns o); signs_v: [Hkv, d]."""
    if center_v is None:
        return o
    hkv, d = signs_v.shape
    mu = (center_v.float() @ _hadamard(d, str(center_v.device))) * signs_v       # [..., Hkv, d] original domain
    return o + mu.repeat_interleave(o.shape[-2] // hkv, dim=-2)


def decode_pages(view, pages: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The keys and values of `pages` (LongTensor [..., n]) of an hq view, rotated, head-major: (ck, sk, rk, cv, sv)
    with ck float32 [..., Hkv, n·pt, d] the keys μ_page + ŝc (ignis_kernels.kvq.page_center; uhat for "hq-sim"), sk
    float32 [..., Hkv, n·pt] their scale, 1 (already applied), rk float32 [..., Hkv, n·pt] the keys' resid, cv the
    values' codewords (not yet scaled; uhat for "hq-sim") and sv their scale (1 for "hq-sim"). The int16 codes are
    permuted to head-major before the one codeword gather of both kinds, so the floats are written in place."""
    b = view.buffers
    lead = pages.shape
    flat = pages.reshape(-1)

    def take(name):                                           # -> [..., 2, Hkv, n·pt, ...]
        t = b[name].index_select(0, flat)                     # [N, pt, 2, Hkv, ...]
        t = t.reshape(*lead[:-1], lead[-1] * t.shape[1], *t.shape[2:])
        return t.movedim(len(lead) - 1, len(lead) + 1).contiguous()

    resid = take("resid").float()
    if "uhat" in b:
        u = take("uhat").float()
        ones = torch.ones_like(resid[..., 0, :, :])
        return u[..., 0, :, :, :], ones, resid[..., 0, :, :], u[..., 1, :, :, :], ones
    c, scale = codewords(take("codes")), take("scale").float()           # one gather for keys and values
    d, pt = c.shape[-1], view.page_tokens
    mu = page_center.unpack(b["center"].index_select(0, flat), d)         # [N, Hkv, d]
    mu = mu.reshape(*lead, *mu.shape[1:]).movedim(len(lead) - 1, len(lead))              # [..., Hkv, n, d]
    ck = c[..., 0, :, :, :].mul_(scale[..., 0, :, :, None])
    ck = ck.view(*ck.shape[:-2], lead[-1], pt, d).add_(mu.unsqueeze(-2)).view(*ck.shape)
    return ck, torch.ones_like(scale[..., 0, :, :]), resid[..., 0, :, :], c[..., 1, :, :, :], scale[..., 1, :, :]


class _Online:
    """Running softmax state over key groups: max m, denominator l [*, n], rotated accumulator acc [*, n, d]."""

    def __init__(self, shape: tuple[int, ...], d: int, device) -> None:
        self.m = torch.full(shape, -math.inf, device=device)
        self.l = torch.zeros(shape, device=device)
        self.acc = torch.zeros(*shape, d, device=device)

    def add(self, parts) -> None:
        """One update over several key groups at once: parts = [(z, weighted_values)], z: masked scores [*, m_i]
        (−inf: not read); weighted_values(p) -> Σ_t p_t·value_t [*, d]."""
        m_new = self.m
        for z, _ in parts:
            m_new = torch.maximum(m_new, z.amax(-1))
        safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = torch.exp(self.m - safe)
        self.l = self.l * alpha
        self.acc = self.acc * alpha[..., None]
        for z, weighted_values in parts:
            p = torch.exp(z - safe[..., None])
            self.l = self.l + p.sum(-1)
            self.acc = self.acc + weighted_values(p)
        self.m = m_new

    def merge(self, o: torch.Tensor, lse: torch.Tensor) -> None:
        """Fold in a normalised partial result o [*, d] over other keys with its log-sum-exp lse [*] (finite)."""
        m_new = torch.maximum(self.m, lse)
        alpha, beta = torch.exp(self.m - m_new), torch.exp(lse - m_new)
        self.l = self.l * alpha + beta
        self.acc = self.acc * alpha[..., None] + o * beta[..., None]
        self.m = m_new

    def result(self) -> torch.Tensor:
        return self.acc / self.l[..., None]


def variance_correction(view) -> float:
    """α, the strength of the logit-variance correction of a view's compressed keys (view.params
    "variance_correction", ignisd.cache.kv_format.HQFormat.variance_correction; 1, HQ_E8_2B.md §4.1's, where
    absent). Every path folds it into ‖q‖² (its only use): z_t = τŝ_t(q̃·c_t) − ½τ²·(α‖q‖²)·resid_t²/d."""
    return float(view.params.get("variance_correction", 1.0))


def corrected_qn2(q: torch.Tensor, view) -> torch.Tensor:
    """α‖q‖², the query's factor of the variance correction (variance_correction), float32 [..., Hq] for queries q
    [..., Hq, d]: what every torch-side path multiplies by ½τ²·resid_t²/d (the C kernel takes α and forms it)."""
    return (q.float() ** 2).sum(-1).mul_(variance_correction(view))


def _view_parts(view, q: torch.Tensor) -> tuple[int, int, int, torch.Tensor]:
    signs = view.params["signs"]
    hkv, d = signs.shape[1], signs.shape[2]
    return hkv, q.shape[-2] // hkv, d, signs


def _compressed_scores(qt, qn2, ck, sk, rk, tau: float, d: int) -> torch.Tensor:
    """z = τ·ŝ·(q̃·c) − ½τ²‖q‖²·resid²/d (§4.1) of query rows qt [..., Hkv, R, d] (qn2 [..., Hkv, R]) against the
    head-major codewords ck [..., Hkv, m, d] with scale sk and resid rk [..., Hkv, m]: [..., Hkv, R, m]."""
    dots = qt @ ck.transpose(-1, -2)
    return dots * (tau * sk).unsqueeze(-2) - (0.5 * tau * tau / d) * qn2.unsqueeze(-1) * (rk * rk).unsqueeze(-2)


def _weighted(p, c, s=None):
    """Σ_t p_t·(s_t)·c_t: p [..., Hkv, R, m], c [..., Hkv, m, d] head-major, s [..., Hkv, m] or None ->
    [..., Hkv, R, d]."""
    return (p if s is None else p * s.unsqueeze(-2)) @ c


def hq_paged_attention(q: torch.Tensor, view, page_table: torch.Tensor, start: int, exact: ExactSpan,
                       scale: float | None = None) -> torch.Tensor:
    """Causal attention of one sequence's n new queries over its hq-e8-2b context.

    q: [n, Hq, d] (positions start .. start+n−1). view: the layer's hq PagedView, holding every page encoded at
    context start+n (pages [0, encoded_pages(start+n))). page_table: LongTensor [>= encoded pages]. exact: the
    chunk's ExactSpan (positions [exact.first, start+n) and the sinks). Returns float32 [n, Hq, d]. The compressed
    pages are read BLOCK_PAGES at a time; the exact span and sinks join the last block's softmax update."""
    n = q.shape[0]
    hkv, g, d, signs = _view_parts(view, q)
    tau = 1.0 / math.sqrt(d) if scale is None else scale
    wp, pt, sinks = exact.window_pages, view.page_tokens, exact.sinks
    ctx = start + n
    dev = q.device
    qt = rotate_queries(q, signs[0]).permute(1, 2, 0, 3).reshape(hkv, g * n, d)     # rows (g, n)
    qn2 = corrected_qn2(q, view).view(n, hkv, g).permute(1, 2, 0).reshape(hkv, g * n)
    ppos = torch.arange(start, ctx, device=dev)
    wlo = torch.clamp(ppos // pt - wp, min=0) * pt                  # [n] first exact position per query

    def rows(z, keep):                                              # [Hkv, g·n, m] -> masked [Hkv, g, n, m]
        return z.view(hkv, g, n, -1).masked_fill(~keep, -math.inf)

    def flat(fn):                                                   # weighted sum over [Hkv, g, n, m] weights
        return lambda p: fn(p.reshape(hkv, g * n, -1)).view(hkv, g, n, d)

    st = _Online((hkv, g, n), d, dev)
    n_enc = encoded_pages(ctx, wp, pt)
    common = min(n_enc, window_start(start, wp, pt) // pt)           # pages every query reads compressed
    flash = _FLASH_LSE is not None and dev.type == "cpu"
    if common * pt > sinks and flash:
        _flash_common(st, qt, qn2, view, page_table[:common], sinks, tau)
    else:
        common = 0
    rest = (n_enc - common) * pt + exact.k.shape[0] + exact.sink_k.shape[0]
    if flash and g * n * rest <= FLASH_MASK_ELEMENTS:
        _flash_masked(st, qt, qn2, view, page_table[common:n_enc], common * pt, exact, ppos, wlo, tau)
        return unrotate_output(st.result().permute(2, 0, 1, 3), signs[1])
    jpos = exact.first + torch.arange(exact.k.shape[0], device=dev)
    keep = (jpos[None, :] <= ppos[:, None]) & (jpos[None, :] >= sinks) & (jpos[None, :] >= wlo[:, None])
    ek, ev = exact.k.float().transpose(0, 1), exact.v.float().transpose(0, 1)    # [Hkv, m, d]
    last = [(rows(tau * (qt @ ek.transpose(-1, -2)), keep), flat(lambda p: p @ ev))]
    if exact.sink_k.shape[0]:
        jpos = torch.arange(exact.sink_k.shape[0], device=dev)
        sk_, sv_ = exact.sink_k.float().transpose(0, 1), exact.sink_v.float().transpose(0, 1)
        last.append((rows(tau * (qt @ sk_.transpose(-1, -2)), jpos[None, :] <= ppos[:, None]),
                     flat(lambda p: p @ sv_)))
    for p0 in range(common, n_enc, BLOCK_PAGES):
        p1 = min(n_enc, p0 + BLOCK_PAGES)
        ck, sk, rk, cv, sv = decode_pages(view, page_table[p0:p1])  # [Hkv, m, d], [Hkv, m]
        jpos = p0 * pt + torch.arange(ck.shape[1], device=dev)
        keep = (jpos[None, :] <= ppos[:, None]) & (jpos[None, :] >= sinks) & (jpos[None, :] < wlo[:, None])
        part = [(rows(_compressed_scores(qt, qn2, ck, sk, rk, tau, d), keep),
                 flat(lambda p, cv=cv, sv=sv: _weighted(p, cv, sv)))]
        st.add(part + last if p1 == n_enc else part)
    if common == n_enc:                                              # no masked block: the exact parts alone
        st.add(last)
    o = st.result().permute(2, 0, 1, 3)                              # [n, Hkv, g, d]
    return unrotate_output(o, signs[1])


def _flash_masked(st: _Online, qt, qn2, view, pages, p0: int, exact: ExactSpan, ppos, wlo, tau: float) -> None:
    """Everything a prefill chunk's queries read besides the common compressed pages, in one masked flash-attention
    call merged into st by its log-sum-exp: the compressed pages some queries read (`pages`, positions from p0;
    keys [ŝc, resid²] as in _flash_common), the exact span and the sinks (keys [u, 0]), the window rule as an
    additive mask (0 read, −inf not). Every query reads at least its own exact key, so no row is empty.
    qt [Hkv, g·n, d] (rows (g, n)), qn2 [Hkv, g·n], ppos / wlo [n] each query's position and first exact position."""
    hkv, rows, d = qt.shape
    dev = qt.device
    ks, vs, keeps = [], [], []
    if pages.numel():
        kc, vc = _flash_pages(view, pages, 0)
        ks.append(kc)
        vs.append(vc)
        jpos = p0 + torch.arange(kc.shape[1], device=dev)
        keeps.append((jpos[None, :] <= ppos[:, None]) & (jpos[None, :] >= exact.sinks) & (jpos[None, :] < wlo[:, None]))
    jpos = exact.first + torch.arange(exact.k.shape[0], device=dev)
    ks.append(torch.nn.functional.pad(exact.k.float().transpose(0, 1), (0, 1)))
    vs.append(exact.v.float().transpose(0, 1))
    keeps.append((jpos[None, :] <= ppos[:, None]) & (jpos[None, :] >= exact.sinks) & (jpos[None, :] >= wlo[:, None]))
    if exact.sink_k.shape[0]:
        jpos = torch.arange(exact.sink_k.shape[0], device=dev)
        ks.append(torch.nn.functional.pad(exact.sink_k.float().transpose(0, 1), (0, 1)))
        vs.append(exact.sink_v.float().transpose(0, 1))
        keeps.append(jpos[None, :] <= ppos[:, None])
    kk = torch.cat(ks, 1)
    vv = torch.nn.functional.pad(torch.cat(vs, 1), (0, 1))
    keep = torch.cat(keeps, 1)                                        # [n, S]
    mask = torch.zeros(keep.shape, device=dev).masked_fill_(~keep, -math.inf).repeat(rows // keep.shape[0], 1)
    o, lse = _FLASH_LSE(_flash_queries(qt, qn2, tau)[None], kk[None], vv[None], attn_mask=mask, scale=tau)
    st.merge(o[0, ..., :d].reshape(st.acc.shape), lse[0].reshape(st.m.shape))


def _flash_common(st: _Online, qt, qn2, view, pages, sinks: int, tau: float) -> None:
    """The compressed keys every query of a prefill chunk reads (positions [sinks, len(pages)·pt)): no mask, so one
    fused flash-attention call with the variance correction folded into an extra dimension,
    τ·[q̃, −½τ‖q‖²/d]·[ŝc, resid²] = τŝ(q̃·c) − ½τ²‖q‖²resid²/d, values ŝc (padded to d + 1). Seeds the online state
    st ([Hkv, g, n]) with the result: m = the rows' log-sum-exp, l = 1, acc = the normalised output.
    qt [Hkv, g·n, d], qn2 [Hkv, g·n]."""
    kk, vv = _flash_pages(view, pages, sinks)
    d = vv.shape[-1]
    o, lse = _FLASH_LSE(_flash_queries(qt, qn2, tau)[None], kk[None],
                        torch.nn.functional.pad(vv, (0, 1))[None], scale=tau)
    st.merge(o[0, ..., :d].reshape(st.acc.shape), lse[0].reshape(st.m.shape))   # st is fresh: m = lse, acc = o


def _flash_pages(view, pages, cut: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The compressed keys and values of `pages` from position `cut` on, in the flash layout of the variance
    correction: keys [ŝc, resid²] float32 [Hkv, m, d + 1], values ŝc [Hkv, m, d] (unpadded)."""
    ck, sk, rk, cv, sv = decode_pages(view, pages)                    # [Hkv, m, d], [Hkv, m]
    ck, sk, rk, cv, sv = ck[:, cut:], sk[:, cut:], rk[:, cut:], cv[:, cut:], sv[:, cut:]
    return torch.cat((ck * sk[..., None], (rk * rk)[..., None]), -1), cv * sv[..., None]


def _flash_queries(qt: torch.Tensor, qn2: torch.Tensor, tau: float) -> torch.Tensor:
    """Query rows qt [Hkv, R, d] with the correction column −½τ‖q‖²/d (qn2 [Hkv, R]): [Hkv, R, d + 1], so that
    τ·[q̃, −½τ‖q‖²/d]·[ŝc, resid²] = τŝ(q̃·c) − ½τ²‖q‖²resid²/d."""
    return torch.cat((qt, (-0.5 * tau / qt.shape[-1]) * qn2[..., None]), -1)


def hq_paged_decode_attention(q: torch.Tensor, view, page_table: torch.Tensor, context_lens: torch.Tensor,
                              exact: ExactRing, scale: float | None = None) -> torch.Tensor:
    """One new query per sequence for B sequences over hq-e8-2b pages.

    q: [B, Hq, d], row b at position context_lens[b] − 1. page_table: LongTensor [B, W] (padding: any valid page).
    exact: the batch's ExactRing (rings and sinks after this step's write). Returns float32 [B, Hq, d]. The
    compressed pages are read DECODE_BLOCK_PAGES at a time; the ring and sinks join the last block's update."""
    b = q.shape[0]
    hkv, g, d, signs = _view_parts(view, q)
    tau = 1.0 / math.sqrt(d) if scale is None else scale
    wp, pt = exact.window_pages, view.page_tokens
    sinks = exact.sink_k.shape[1]
    dev = q.device
    pos = context_lens - 1                                            # [B]
    wlo = torch.clamp(pos // pt - wp, min=0) * pt                     # [B]
    n_enc = torch.clamp(pos // pt - wp, min=0)                        # encoded pages per row
    qt = rotate_queries(q, signs[0])                                  # [B, Hkv, g, d]: g query rows per KV head
    qn2 = corrected_qn2(q, view).view(b, hkv, g)
    ring = exact.k.shape[1]
    r = torch.arange(ring, device=dev)
    rpos = pos[:, None] - torch.remainder(pos[:, None] - r[None, :], ring)   # [B, R] position held by slot r
    keep = (rpos >= wlo[:, None]) & (rpos >= sinks) & (rpos >= 0)
    ek, ev = exact.k.float().transpose(1, 2), exact.v.float().transpose(1, 2)     # [B, Hkv, R, d]
    z = tau * (qt @ ek.transpose(-1, -2))                              # [B, Hkv, g, R]
    last = [(z.masked_fill(~keep[:, None, None, :], -math.inf), lambda p: p @ ev)]
    if sinks:
        keep = torch.arange(sinks, device=dev)[None, :] <= pos[:, None]
        sk_, sv_ = exact.sink_k.float().transpose(1, 2), exact.sink_v.float().transpose(1, 2)
        z = tau * (qt @ sk_.transpose(-1, -2))
        last.append((z.masked_fill(~keep[:, None, None, :], -math.inf), lambda p: p @ sv_))
    most = int(n_enc.max()) if b else 0
    if most <= DECODE_BLOCK_PAGES:                                    # one block: one plain softmax over all parts
        parts = last
        if most:
            parts = [_decode_block(qt, qn2, view, page_table[:, :most], 0, sinks, wlo, pt, tau, d)] + last
        z = torch.cat([z for z, _ in parts], -1).softmax(-1)
        o, at = None, 0
        for zp, fn in parts:
            w = fn(z[..., at:at + zp.shape[-1]])
            o, at = w if o is None else o + w, at + zp.shape[-1]
        return unrotate_output(o, signs[1])
    st = _Online((b, hkv, g), d, dev)
    for p0 in range(0, most, DECODE_BLOCK_PAGES):
        p1 = min(most, p0 + DECODE_BLOCK_PAGES)
        part = [_decode_block(qt, qn2, view, page_table[:, p0:p1], p0, sinks, wlo, pt, tau, d)]
        st.add(part + last if p1 == most else part)
    return unrotate_output(st.result(), signs[1])


def _decode_block(qt, qn2, view, pages, p0: int, sinks: int, wlo, pt: int, tau: float, d: int):
    """(masked scores [B, Hkv, g, m], weighted-values fn) of one block of compressed pages (LongTensor [B, n],
    the first at page index p0) for the decode rows qt [B, Hkv, g, d]. With one row every position of the block
    below wlo is read except the sinks, so those columns are sliced off instead of masked."""
    ck, sk, rk, cv, sv = decode_pages(view, pages)                    # [B, Hkv, m, d], [B, Hkv, m]
    if qt.shape[0] == 1:
        cut = max(0, sinks - p0 * pt)
        ck, sk, rk, cv, sv = ck[:, :, cut:], sk[:, :, cut:], rk[:, :, cut:], cv[:, :, cut:], sv[:, :, cut:]
        z = _compressed_scores(qt, qn2, ck, sk, rk, tau, d)
    else:
        jpos = p0 * pt + torch.arange(ck.shape[2], device=qt.device)
        keep = (jpos[None, :] >= sinks) & (jpos[None, :] < wlo[:, None])
        z = _compressed_scores(qt, qn2, ck, sk, rk, tau, d).masked_fill(~keep[:, None, None, :], -math.inf)
    return z, lambda p: _weighted(p, cv, sv)

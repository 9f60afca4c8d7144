"""Decode attention over hq-e8-2b pages on the CPU, lean (HQ_E8_2B.md §4.1-§4.2): the CPU path of
paged_decode_attention for tag "hq-e8-2b".

The same formulas as hq_reference.hq_paged_decode_attention (the specification, which still serves "hq-sim"):
    q_s = τ·H·(s_K ⊙ q)/√d                                 the query rotated (and scaled by τ) once
    z_t = ŝ_t·(q_s·c_t) + q_s·μ_p − α·½·τ²·‖q‖²·resid_t²/d compressed key t on page p, codeword c_t (§4.1), page
                                                           key centre μ_p (kvq/page_center.py), α the
                                                           correction's strength (hq_reference.corrected_qn2)
    z_t = q_s·u_t                                          exact key t (ring slot or sink)
    o = s_V ⊙ H·(Σ_t p_t·(ŝ_t c_t or u_t))/√d              p = softmax(z) under the window rule (exact.py)
but with fewer and cheaper torch operations, since on the CPU a decode step costs its operator count plus the bytes
its codeword decode writes:
- a codeword is one gather of an 8-byte word: every E8P coordinate is a multiple of 1/4 with |c_i| <= 2.75 (§1.1),
  so 4·c fits int8 and the 8 coordinates of a code are one int64 of a 512 KB table (`word_table`, indexed by the
  int16 code + 32768, cache-resident); the ¼ goes into the per-token scales;
- the codes are put in (kind, row, KV head, token) order before the gather, so the decoded keys and values come out
  as the [rows·Hkv, tokens, d] matrices the batched matmuls read, with no copy after;
- one sequence (B = 1, the single-lane case) whose pages are a consecutive run (the dispatcher's `single` hint)
  reads them as a slice of the pool, with no page gather, and masks its ring and sinks by slicing at Python-int
  positions; several sequences gather their pages and mask per row;
- τ is folded into the rotated query once; the parts (compressed blocks, ring, sinks) share one softmax up to
  DECODE_BLOCK_PAGES pages, an online softmax across blocks beyond. (One flash-attention call over a [Hkv, tokens,
  d + 1] copy of every key read, the variance correction as the extra dimension, measured slower here: the copy
  costs more than the small matmuls it saves.)
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from ignis_kernels.attention.hq_reference import _Online, corrected_qn2, rotate_queries, unrotate_output
from ignis_kernels.kvq import page_center
from ignis_kernels.kvq.codebook import decode_table

DECODE_BLOCK_PAGES = 64
"""Compressed pages decoded per step (4,096 tokens at 64 a page: one step, one plain softmax, up to a 4K context)."""


@lru_cache(maxsize=None)
def word_table(device: str) -> torch.Tensor:
    """int64 [65536]: word i packs the 8 coordinates of codeword (i − 32768) mod 2¹⁶ (the int16 code + 32768) as
    int8 values 4·c_j, coordinate j in byte j of the word's native byte order (a view as int8 gives them back in
    order). Exact: codewords are multiples of 1/4 with |c_j| <= 2.75 (HQ_E8_2B.md §1.1)."""
    tab = decode_table(device)                                            # [65536, 8], row = unsigned code
    rows = (torch.arange(65536, device=device) - 32768) & 0xFFFF
    return (tab[rows] * 4).round().to(torch.int8).contiguous().view(torch.int64).reshape(-1)


def words(codes: torch.Tensor) -> torch.Tensor:
    """4·c of codes int16 [..., d/8] (any strides) as int8 [..., d], contiguous in the codes' logical order: the
    codes + 32768 into an int32 index, one gather of 8-byte words."""
    idx = torch.empty(codes.shape, dtype=torch.int32, device=codes.device)
    idx.copy_(codes)                                   # (an int16 + int32 add into an int32 out is a scalar loop)
    idx += 32768
    w = word_table(str(codes.device)).index_select(0, idx.view(-1))
    return w.view(torch.int8).view(*codes.shape[:-1], codes.shape[-1] * 8)


def decode_words(codes: torch.Tensor) -> torch.Tensor:
    """4·c of codes int16 [..., d/8] (any strides) -> float32 [..., d], contiguous (`words`, then one conversion)."""
    return words(codes).float()


def _fields(view, pages, run: int | None, n: int, b: int):
    """codes int16 [b, n·pt, 2, Hkv, d/8], scale float32 [b, n·pt, 2, Hkv], resid float16 [b, n·pt, 2, Hkv] and the
    page key centres μ float32 [b, n, Hkv, d] (kvq/page_center.py) of the first n pages of each row: a slice of the
    pool from page `run` (b = 1, consecutive pages), else gathered by `pages` (LongTensor [b, n])."""
    def take(name):                                                       # [b·n, pt, ...]
        t = view.buffers[name]
        return t[run:run + n] if run is not None else t.index_select(0, pages.reshape(-1))

    out = [t.reshape(b, n * t.shape[1], *t.shape[2:]) for t in map(take, ("codes", "scale", "resid"))]
    d = out[0].shape[-1] * 8
    return [*out, page_center.unpack(take("center"), d).view(b, n, -1, d)]


def _center_scores(qs, mu, pt: int, cut: int = 0):
    """The page centres' share of the compressed scores, q_s·μ_p for every token of page p: qs [B, Hkv, g, d], mu
    [B, n, Hkv, d] -> [B, Hkv, g, n·pt − cut] (the first `cut` token columns dropped)."""
    zc = torch.matmul(qs, mu.permute(0, 2, 3, 1))                         # [B, Hkv, g, n]
    return zc.repeat_interleave(pt, dim=-1)[..., cut:]


def _compressed(qs, cq, codes, scale, resid, zc):
    """(scores [B, Hkv, g, m], weighted-values fn) of m compressed tokens for the rows qs [B, Hkv, g, d] (τ-scaled,
    rotated), cq [B, Hkv, g] = α·½τ²‖q‖²/d; codes [B, m, 2, Hkv, d/8], scale / resid [B, m, 2, Hkv]; zc [B, Hkv, g, m]
    the page centres' share (_center_scores)."""
    bsz, hkv, g, d = qs.shape
    m = codes.shape[1]
    x = decode_words(codes.permute(2, 0, 3, 1, 4))                        # [2, B, Hkv, m, d] = 4c
    s4 = scale.permute(2, 0, 3, 1) * 0.25                                 # [2, B, Hkv, m]: ŝ/4
    r2 = resid[:, :, 0].float().pow_(2).transpose(1, 2)                   # [B, Hkv, m]
    z = torch.bmm(qs.reshape(bsz * hkv, g, d), x[0].view(bsz * hkv, m, d).transpose(1, 2)).view(bsz, hkv, g, m)
    z.mul_(s4[0].unsqueeze(2))
    z.sub_(cq.unsqueeze(-1) * r2.unsqueeze(2))
    z.add_(zc)
    vf, sv = x[1].view(bsz * hkv, m, d), s4[1].unsqueeze(2)

    def values(p):
        return torch.bmm((p * sv).reshape(bsz * hkv, g, m), vf).view(bsz, hkv, g, d)
    return z, values


def _exact_part(qs, k, v):
    """(scores [B, Hkv, g, m], weighted-values fn) of exact keys k / values v [B, m, Hkv, d] (ring or sinks)."""
    z = torch.matmul(qs, k.permute(0, 2, 3, 1))
    vt = v.transpose(1, 2)
    return z, lambda p: torch.matmul(p, vt)


def hq_decode_attention(q: torch.Tensor, view, page_table: torch.Tensor, context_lens: torch.Tensor, exact,
                        scale: float | None = None, single: tuple[int, int | None] | None = None) -> torch.Tensor:
    """One new query per sequence for B sequences over an "hq-e8-2b" view (HQ_E8_2B.md §4; the arguments of
    hq_reference.hq_paged_decode_attention). q: [B, Hq, d], row b at position context_lens[b] − 1; page_table:
    LongTensor [B, W]; exact: the batch's ExactRing (rings and sinks after this step's write). single: B = 1's
    (context length, first page of a consecutive run of its pages or None), as the dispatcher passes it (None:
    read from context_lens). Returns float32 [B, Hq, d]."""
    bsz = q.shape[0]
    signs = view.params["signs"]
    hkv, d = signs.shape[1], signs.shape[2]
    g = q.shape[1] // hkv
    tau = 1.0 / math.sqrt(d) if scale is None else scale
    wp, pt = exact.window_pages, view.page_tokens
    n_s, ring = exact.sink_k.shape[1], exact.k.shape[1]
    qs = rotate_queries(q, signs[0]).mul_(tau)                            # [B, Hkv, g, d]
    cq = corrected_qn2(q, view).view(bsz, hkv, g).mul_(0.5 * tau * tau / d)              # [B, Hkv, g]
    zr, fr = _exact_part(qs, exact.k, exact.v)                            # ring [B, Hkv, g, R]
    zs, fs = _exact_part(qs, exact.sink_k, exact.sink_v) if n_s else (None, None)
    if bsz == 1:
        ctx, run = single if single is not None else (int(context_lens[0]), None)
        pos = ctx - 1
        n_enc = max(0, pos // pt - wp)
        lo = max(n_enc * pt, n_s)                                         # ring positions read: [lo, ctx)
        skip = lo - (ctx - ring)                                          # the ring's oldest slots not read
        if skip > 0:
            s0 = ctx % ring
            zr[..., s0:min(ring, s0 + skip)] = -math.inf
            zr[..., :max(0, s0 + skip - ring)] = -math.inf
        if zs is not None and pos + 1 < n_s:
            zs[..., pos + 1:] = -math.inf
        blocks = _blocks_one(qs, cq, view, page_table, run, n_enc, n_s, pt)
    else:
        blocks = _blocks_many(qs, cq, view, page_table, context_lens, zr, zs, n_s, wp, pt, ring)
    last = [(zr, fr)] + ([(zs, fs)] if zs is not None else [])
    if len(blocks) <= 1:                                                  # one plain softmax over every part
        parts = blocks + last
        p = torch.cat([z for z, _ in parts], -1).softmax(-1)
        o, at = None, 0
        for z, fn in parts:
            w = fn(p[..., at:at + z.shape[-1]])
            o, at = w if o is None else o.add_(w), at + z.shape[-1]
    else:
        st = _Online((bsz, hkv, g), d, q.device)
        for i, part in enumerate(blocks):
            st.add([part] + last if i == len(blocks) - 1 else [part])
        o = st.result()
    return unrotate_output(o, signs[1])


def _blocks_one(qs, cq, view, page_table, run, n_enc: int, n_s: int, pt: int) -> list:
    """The compressed parts of one row: pages [0, n_enc), positions from n_s on, DECODE_BLOCK_PAGES at a time."""
    out = []
    for p0 in range(0, n_enc, DECODE_BLOCK_PAGES):
        p1 = min(n_enc, p0 + DECODE_BLOCK_PAGES)
        cut = max(0, n_s - p0 * pt)
        if cut >= (p1 - p0) * pt:
            continue
        codes, scale, resid, mu = _fields(view, page_table[:, p0:p1], None if run is None else run + p0, p1 - p0, 1)
        out.append(_compressed(qs, cq, codes[:, cut:], scale[:, cut:], resid[:, cut:],
                               _center_scores(qs, mu, pt, cut)))
    return out


def _blocks_many(qs, cq, view, page_table, context_lens, zr, zs, n_s: int, wp: int, pt: int,
                 ring: int) -> list:
    """B > 1 rows: mask the ring zr and sinks zs per row (in place) and return the compressed parts, each block's
    positions outside [n_s, window start of the row) masked."""
    dev = qs.device
    pos = context_lens - 1
    wlo = torch.clamp(pos // pt - wp, min=0) * pt                         # [B] first exact position
    r = torch.arange(ring, device=dev)
    rpos = pos[:, None] - torch.remainder(pos[:, None] - r[None, :], ring)   # [B, R] position held by slot r
    keep = (rpos >= wlo[:, None]) & (rpos >= n_s) & (rpos >= 0)
    zr.masked_fill_(~keep[:, None, None, :], -math.inf)
    if zs is not None:
        keep = torch.arange(n_s, device=dev)[None, :] <= pos[:, None]
        zs.masked_fill_(~keep[:, None, None, :], -math.inf)
    most = int(torch.clamp(pos // pt - wp, min=0).max())
    out = []
    for p0 in range(0, most, DECODE_BLOCK_PAGES):
        p1 = min(most, p0 + DECODE_BLOCK_PAGES)
        codes, scale, resid, mu = _fields(view, page_table[:, p0:p1], None, p1 - p0, qs.shape[0])
        z, fn = _compressed(qs, cq, codes, scale, resid, _center_scores(qs, mu, pt))
        jpos = p0 * pt + torch.arange(z.shape[-1], device=dev)
        keep = (jpos[None, :] >= n_s) & (jpos[None, :] < wlo[:, None])
        out.append((z.masked_fill_(~keep[:, None, None, :], -math.inf), fn))
    return out


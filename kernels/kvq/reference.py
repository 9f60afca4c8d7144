"""hq-e8-2b codec in pure torch (HQ_E8_2B.md §2): the specification and the CPU path of ignis_kernels.kvq.

A head-token record codes one d-dim vector (d a power of two >= 8; 256 on the target, 64 on SmolLM2) as d/8 16-bit
E8P codewords plus an 8-byte metadata row: f32 `scale` ŝ (unbiased fit), f16 `resid` ‖x̂ − x‖₂, f16 `norm` ‖x‖₂.

Encode (rotated domain; rotation in rotation.py, §2.1):
    n2 = ‖u‖²; n2 == 0 → codes 0, scale = resid = norm = 0                              (§2.2)
    z = γ·u with γ = 1.04 / sqrt(n2 / d)                                                 (§2.2)
    code[j] = NN(z[8j .. 8j+7]): exact abs-row scan, 2 shifts × 256 rows                  (§2.3)
    c = decode(code); uc = ⟨u, c⟩; ŝ = n2 / uc (unbiased; uc <= 0 → ŝ = 1/γ)             (§2.6)
    resid = ‖u − ŝ·c‖, norm = sqrt(n2), both rounded to f16 (+inf above 65504)           (§2.7)
    NaN / Inf input → scale = NaN (surfaces the bug)                                     (§5.1.6)
Decode (§2.5): û = ŝ · c in the rotated domain (what attention reads, §4).

Vectorised over every chunk at once (no Python loop over blocks). The nearest-codeword distances are computed in
float64, where every term is exact for f32 input, so the result of a row does not depend on the batch it is encoded
in and near-ties resolve as in exact arithmetic (the spec's f32 reference may resolve a true near-tie differently:
the conformance check compares distances, §2.3 "Numerics"). Ties: lowest shift bit, then lowest row, then the flip
of the lowest coordinate (§2.3).
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from ignis_kernels.kvq.codebook import CHUNK, abs_table, decode_table, odd_rows, split_tables

GAIN = 1.04
"""E8P's input gain for unit-variance coordinates (§2.2)."""
_BLOCK = 8192
"""Chunks per vectorised step of the nearest-codeword search (bounds the [N, 512] float64 temporaries to 32 MiB)."""


def _row_level_masks(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per G row, the bitmask (bit i = coordinate i) of the coordinates at each level 1/2, 3/2, 5/2: 3 × int64 [256];
    and the float64 table G [256, 8] and its squared norms [256]."""
    g = abs_table(device).double()
    w = 1 << torch.arange(CHUNK, device=device)
    masks = torch.stack([((g == lv).long() * w).sum(1) for lv in (0.5, 1.5, 2.5)])
    return masks, g, (g * g).sum(1)


def _subset_min(a: torch.Tensor) -> torch.Tensor:
    """min over every subset of the 8 coordinates: [N, 256], column m = min_{i in m} a_i (bit i = coordinate i;
    +inf for the empty set). a: [N, 8] float64 >= 0. Built by doubling (8 elementwise steps, exact)."""
    sm = torch.full((a.shape[0], 1), math.inf, dtype=a.dtype, device=a.device)
    for i in range(CHUNK):
        sm = torch.cat((sm, torch.minimum(sm, a[:, i:i + 1])), dim=1)
    return sm


def exhaustive_codes(z: torch.Tensor) -> torch.Tensor:
    """§2.3 literally, on one block of chunks: both shifts × all 256 rows with the parity flip, in float64.
    z: [N, 8] float32. Returns int64 [N] unsigned codes. The certified fast path (_nearest_block) falls back to it."""
    dev = z.device
    masks, g, gn = _row_level_masks(dev)
    odd = odd_rows(dev)
    dists, negs, avals = [], [], []
    for shift in (0.25, -0.25):                        # tbit 0 (+1/4) first, then tbit 1 (−1/4)
        y = z.double() - shift
        a, neg = y.abs(), y < 0                        # sign(0) counts as +
        par = neg.sum(1) & 1
        s = (a * a).sum(1)
        dot = a @ g.t()                                 # [N, 256], exact: products of f32 and k/2 in float64
        sm = _subset_min(a)
        flip = torch.minimum(torch.minimum(0.5 * sm[:, masks[0]], 1.5 * sm[:, masks[1]]), 2.5 * sm[:, masks[2]])
        wrong = par[:, None] != odd[None, :]
        dists.append(s[:, None] - 2 * dot + gn[None, :] + torch.where(wrong, 4 * flip, torch.zeros_like(flip)))
        negs.append(neg)
        avals.append(a)
    best = torch.cat(dists, dim=1).argmin(dim=1)       # first minimum: lowest tbit, then lowest row
    tbit, row = best // 256, best % 256
    pick = tbit.bool()[:, None]
    neg = torch.where(pick, negs[1], negs[0])
    a = torch.where(pick, avals[1], avals[0])
    wrong = (neg.sum(1) & 1) != odd[row]
    istar = (a * g[row]).argmin(dim=1)                 # cheapest coordinate to flip, lowest i on ties
    toggle = torch.zeros_like(neg)
    toggle[torch.arange(neg.shape[0], device=dev), istar] = True
    neg = neg ^ (toggle & wrong[:, None])
    low = (neg[:, :7].long() << torch.arange(7, device=dev)).sum(1)
    return (row << 8) | (tbit << 7) | low


@lru_cache(maxsize=None)
def _bound_weights(device: str) -> torch.Tensor:
    """W [12, 256] with [a (8), 1, amin·[P = 0], amin·[P = 1], S] @ W = S − 2⟨a, G[r]⟩ + ‖G[r]‖² + 2·amin·[P ≠ odd(r)]:
    the exact distance of every matched-parity row and a lower bound for the others (a flip costs 4·a_i·G[r][i]
    >= 4 · amin · 1/2)."""
    g = abs_table(device)
    odd = odd_rows(device).float()
    return torch.cat((-2 * g.t(), (g * g).sum(1)[None], 2 * odd[None], 2 * (1 - odd)[None],
                      torch.ones(1, 256, device=device)), 0)


def _nearest_block(z: torch.Tensor) -> torch.Tensor:
    """§2.3 on one block of chunks, certified: the float32 bound of every (shift, row) picks a candidate, whose exact
    distance D is computed in float64; the candidate is the answer when it is the only (shift, row) whose bound lies
    below D + ε (ε covers float32 rounding), i.e. the optimum is unique and found. Every other chunk (about 0.1 %
    on Gaussian input: near-ties) goes through exhaustive_codes. So the result is exhaustive_codes' for every
    chunk, whatever the batch. z: [N, 8] float32. Returns int64 [N] unsigned codes."""
    n, dev = z.shape[0], z.device
    g, odd = abs_table(dev).double(), odd_rows(dev)
    y = torch.stack((z - 0.25, z + 0.25), 1)                     # [N, 2, 8]: tbit 0 (+1/4 shift), tbit 1 (−1/4)
    a, neg = y.abs(), y < 0
    par = (neg.sum(-1) & 1).float()
    s = (a * a).sum(-1)
    amin = a.amin(-1)
    feats = torch.cat((a, torch.ones_like(s)[..., None], (amin * (1 - par))[..., None], (amin * par)[..., None],
                       s[..., None]), -1)
    bound = (feats.view(2 * n, 12) @ _bound_weights(str(dev))).view(n, 512)
    cand = bound.argmin(1)
    tbit, row = cand // 256, cand % 256
    ar = torch.arange(n, device=dev)
    ac, nc = a.double()[ar, tbit], neg[ar, tbit]
    prod = ac * g[row]
    wrong = (nc.sum(-1) & 1) != odd[row]
    flip = prod.argmin(1)
    dist = (ac * ac).sum(-1) - 2 * prod.sum(-1) + (g[row] ** 2).sum(-1) + \
        torch.where(wrong, 4 * prod.gather(1, flip[:, None])[:, 0], torch.zeros_like(ac[:, 0]))
    eps = 1e-5 * (s.amax(1).double() + 40.0)
    unique = (bound < (dist + eps).float()[:, None]).sum(1) == 1
    toggle = torch.zeros_like(nc)
    toggle[ar, flip] = True
    nc = nc ^ (toggle & wrong[:, None])
    low = (nc[:, :7].long() << torch.arange(7, device=dev)).sum(1)
    out = (row << 8) | (tbit << 7) | low
    bad = (~unique).nonzero()[:, 0]
    if bad.numel():
        out[bad] = exhaustive_codes(z[bad])
    return out


def nearest_codes(z: torch.Tensor, fused: bool = True) -> torch.Tensor:
    """Nearest E8P codeword of each 8-dim chunk (§2.3). z: float [..., 8] (the gained rotated coordinates).
    Returns int64 [...] unsigned codes in [0, 65536). Any number of chunks. On the CPU the search runs in the C
    kernel of e8p_cpu.py when it builds here (the same codes, ~25x faster; fused=False keeps the torch form),
    else in blocks of _BLOCK through _nearest_block."""
    if z.shape[-1] != CHUNK:
        raise ValueError(f"nearest_codes: chunks of {CHUNK} coordinates, got shape {tuple(z.shape)}")
    flat = z.reshape(-1, CHUNK).float()
    if fused and flat.device.type == "cpu" and flat.shape[0]:
        from ignis_kernels.kvq import e8p_cpu
        if e8p_cpu.available():
            return e8p_cpu.nearest_codes(flat).view(z.shape[:-1])
    out = torch.empty(flat.shape[0], dtype=torch.int64, device=z.device)
    for i in range(0, flat.shape[0], _BLOCK):
        out[i:i + _BLOCK] = _nearest_block(flat[i:i + _BLOCK])
    return out.view(z.shape[:-1])


def chunk_distance(z: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """Squared distance ‖z − decode(code)‖² per chunk, float64 [...]. z: [..., 8]; codes: [...] (any int dtype)."""
    c = decode_table(z.device)[codes.long() & 0xFFFF]
    return ((z.double() - c.double()) ** 2).sum(-1)


def psum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (a power of two) by pairwise halving: a fixed order, so batch-independent. [..., d] ->
    [...]."""
    while x.shape[-1] > 1:
        h = x.shape[-1] // 2
        x = x[..., :h] + x[..., h:]
    return x[..., 0]


def _check(u: torch.Tensor) -> int:
    d = u.shape[-1]
    if d < CHUNK or d & (d - 1):
        raise ValueError(f"hq-e8-2b needs a power-of-two head_dim >= {CHUNK}, got shape {tuple(u.shape)}")
    return d


def encode_rotated(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode rotated vectors (§2.2-§2.7). u: float [..., d] (d a power of two >= 8).

    Returns (codes int16 [..., d/8] (u16 bit patterns), scale float32 [...], resid float16 [...], norm float16
    [...]). Raises ValueError for another d."""
    d = _check(u)
    u = u.float()
    n2 = psum(u * u)
    finite = torch.isfinite(n2)
    zero = n2 == 0
    safe = torch.where(finite & ~zero, n2, torch.ones_like(n2))
    gain = GAIN / torch.sqrt(safe / d)
    uz = torch.where(finite[..., None], u, torch.zeros_like(u))
    codes = nearest_codes((uz * gain[..., None]).reshape(*u.shape[:-1], d // CHUNK, CHUNK))
    c = decode_table(u.device)[codes].reshape(u.shape)
    uc = psum(u * c)
    scale = torch.where(uc > 0, n2 / torch.where(uc > 0, uc, torch.ones_like(uc)), 1.0 / gain)
    resid = torch.sqrt(psum((u - scale[..., None] * c) ** 2))
    scale = torch.where(zero, torch.zeros_like(scale), scale)
    resid = torch.where(zero, torch.zeros_like(resid), resid)
    codes = torch.where(zero[..., None], torch.zeros_like(codes), codes)
    scale = torch.where(finite, scale, torch.full_like(scale, math.nan))
    return _to_i16(codes), scale, resid.half(), torch.sqrt(n2).half()


def _to_i16(codes: torch.Tensor) -> torch.Tensor:
    """Unsigned 16-bit codes (int64) as their int16 bit pattern."""
    return torch.where(codes >= 1 << 15, codes - (1 << 16), codes).to(torch.int16)


def codewords(codes: torch.Tensor) -> torch.Tensor:
    """The decoded codewords c of records: codes int16/int64 [..., d/8] -> float32 [..., d] (§2.5), through the
    cache-resident split tables (codebook.split_tables: c = G[a] ⊙ signs[r] + shift[r], equal to decode_table's
    rows bit for bit); a 2 MB table gather misses the cache once a model's weights have streamed past it."""
    g, odd, signs, shift = split_tables(codes.device)
    idx = codes.reshape(-1).to(torch.int32) & 0xFFFF          # int32 index_select: ~2x faster than [] on long
    a = idx >> 8
    r = (idx & 0xFF) | (odd.index_select(0, a) << 8)
    c = torch.addcmul(shift.index_select(0, r)[:, None], g.index_select(0, a), signs.index_select(0, r))
    return c.reshape(*codes.shape[:-1], codes.shape[-1] * CHUNK)


def decode_rotated(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """û = ŝ · c (§2.5): codes [..., d/8], scale float32 [...] -> float32 [..., d] in the rotated domain."""
    return codewords(codes) * scale.float()[..., None]


def ls_scale(scale: torch.Tensor, resid: torch.Tensor, norm: torch.Tensor) -> torch.Tensor:
    """The least-squares reading ŝ_LS = ŝ · N²/(N² + R²) from the stored fields (§2.6, O(1) per token); float32.
    Where N is 0 or a field is +inf ("unknown") the stored scale is returned."""
    n2, r2 = norm.float() ** 2, resid.float() ** 2
    ok = torch.isfinite(n2) & torch.isfinite(r2) & (n2 > 0)
    return torch.where(ok, scale * n2 / torch.where(ok, n2 + r2, torch.ones_like(n2)), scale)

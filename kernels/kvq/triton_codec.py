"""hq-e8-2b encoder as a Triton kernel (HQ_E8_2B.md §2.2-§2.7): one program per head vector, one row of the
program's tile per 8-dim chunk (lane j ↔ codeword j, §2.3 "GPU mapping"), every chunk scanning the 256 abs-table
rows for both shifts in the same order, so the reads of the table are broadcasts.

Per program (a rotated vector u of d = 8·J coordinates):
    n2 = ‖u‖², γ = 1.04 / sqrt(n2 / d), z = γ·u                                         (§2.2)
    per chunk, for tbit in (0, 1), r in 0..255: dist = S − 2⟨a, G[r]⟩ + ‖G[r]‖² (+ 4·min_i a_i G[r][i] when the
    sign parity is wrong); strict < keeps the lowest (tbit, r)                            (§2.3)
    code = (r << 8) | (tbit << 7) | n0..n6 after the cheapest flip (lowest i on ties)
    c = decode(code), ŝ = n2 / ⟨u, c⟩ (uc <= 0 → 1/γ), resid = ‖u − ŝ·c‖, norm = sqrt(n2) (§2.6-§2.7)
Distances are float32, as in the spec's reference; the torch reference resolves them in float64, so the two agree
code for code except at float32 near-ties (tests/kernels/test_kvq_triton.py proves those are ties).
Same signature as reference.encode_rotated. AVAILABLE: whether Triton imports.
"""
from __future__ import annotations

import torch

from ignis_kernels.kvq.codebook import CHUNK, abs_table, odd_rows

try:
    import triton
    import triton.language as tl
    AVAILABLE = True
except ImportError:  # the CPU path needs no Triton
    triton = tl = None
    AVAILABLE = False

if AVAILABLE:
    @triton.jit
    def _encode_kernel(u_ptr, g_ptr, gn_ptr, odd_ptr, code_ptr, scale_ptr, resid_ptr, norm_ptr,
                       D: tl.constexpr, J: tl.constexpr, RT: tl.constexpr):
        row = tl.program_id(0)
        jj = tl.arange(0, J)[:, None]
        ii = tl.arange(0, 8)[None, :]
        u = tl.load(u_ptr + row * D + jj * 8 + ii)                       # [J, 8]
        n2 = tl.sum(tl.sum(u * u, axis=1), axis=0)
        ok = n2 > 0
        gain = tl.where(ok, 1.04 / tl.sqrt(tl.where(ok, n2, 1.0) / D), 0.0)
        z = u * gain
        best = tl.full((J,), float("inf"), tl.float32)
        best_r = tl.zeros((J,), tl.int32)
        best_t = tl.zeros((J,), tl.int32)
        rr = tl.arange(0, RT)
        for t in range(2):
            shift = 0.25 - 0.5 * t
            y = z - shift
            a = tl.abs(y)
            par = tl.sum((y < 0).to(tl.int32), axis=1) & 1
            s = tl.sum(a * a, axis=1)
            for r0 in range(0, 256, RT):                                  # RT rows at a time, in row order
                g = tl.load(g_ptr + (r0 + rr)[:, None] * 8 + ii)          # [RT, 8], the same rows for every chunk
                prod = a[:, None, :] * g[None, :, :]                      # [J, RT, 8]
                dist = s[:, None] - 2.0 * tl.sum(prod, axis=2) + tl.load(gn_ptr + r0 + rr)[None, :]
                wrong = par[:, None] != tl.load(odd_ptr + r0 + rr)[None, :]
                dist = dist + tl.where(wrong, 4.0 * tl.min(prod, axis=2), 0.0)
                tile_min = tl.min(dist, axis=1)
                tile_arg = tl.min(tl.where(dist == tile_min[:, None], rr[None, :], RT), axis=1)   # lowest row
                better = tile_min < best                                  # strict: earlier (tbit, row) wins ties
                best = tl.where(better, tile_min, best)
                best_r = tl.where(better, r0 + tile_arg, best_r)
                best_t = tl.where(better, t, best_t)
        shift = 0.25 - 0.5 * best_t.to(tl.float32)[:, None]
        y = z - shift
        a = tl.abs(y)
        neg = (y < 0).to(tl.int32)
        g = tl.load(g_ptr + best_r[:, None] * 8 + ii)                     # [J, 8]
        prod = a * g
        m = tl.min(prod, axis=1)
        istar = tl.min(tl.where(prod == m[:, None], ii, 8), axis=1)
        wrong = (tl.sum(neg, axis=1) & 1) != tl.load(odd_ptr + best_r)
        flip = (ii == istar[:, None]) & wrong[:, None]
        neg = tl.where(flip, 1 - neg, neg)
        low = tl.sum(tl.where(ii < 7, neg << ii, 0), axis=1)
        code = (best_r << 8) | (best_t << 7) | low
        code = tl.where(ok, code, 0)
        c = tl.where(neg == 1, -g, g) + shift                               # decoded codeword [J, 8]
        uc = tl.sum(tl.sum(u * c, axis=1), axis=0)
        sc = tl.where(uc > 0, n2 / tl.where(uc > 0, uc, 1.0), tl.where(ok, 1.0 / tl.where(ok, gain, 1.0), 0.0))
        e = u - sc * c
        res = tl.sqrt(tl.sum(tl.sum(e * e, axis=1), axis=0))
        tl.store(code_ptr + row * J + tl.arange(0, J), code)
        tl.store(scale_ptr + row, tl.where(ok, sc, 0.0))
        tl.store(resid_ptr + row, tl.where(ok, res, 0.0))
        tl.store(norm_ptr + row, tl.sqrt(n2))


def _interpreted() -> bool:
    """Under TRITON_INTERPRET=1 (the CPU tests) one program scans all 256 rows as one tile (numpy-fast); a GPU
    scans 16-row tiles (the [J, 16, 8] product stays in registers)."""
    import os
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def encode_rotated(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """As reference.encode_rotated (u float [..., d], d a power of two >= 8): (codes int16 [..., d/8], scale f32,
    resid f16, norm f16). NaN / Inf input: scale NaN. Raises RuntimeError when Triton is not installed."""
    if not AVAILABLE:
        raise RuntimeError("Triton is not installed: the hq-e8-2b Triton encoder is unavailable")
    d = u.shape[-1]
    lead = u.shape[:-1]
    flat = u.reshape(-1, d).float().contiguous()
    finite = torch.isfinite(flat).all(1)
    flat = torch.where(finite[:, None], flat, torch.zeros_like(flat))
    n = flat.shape[0]
    dev = flat.device
    codes = torch.empty(n, d // CHUNK, dtype=torch.int32, device=dev)
    scale = torch.empty(n, dtype=torch.float32, device=dev)
    resid = torch.empty(n, dtype=torch.float32, device=dev)
    norm = torch.empty(n, dtype=torch.float32, device=dev)
    if n:
        g = abs_table(dev).contiguous()
        _encode_kernel[(n,)](flat, g, (g * g).sum(1).contiguous(), odd_rows(dev).to(torch.int32).contiguous(),
                             codes, scale, resid, norm, D=d, J=d // CHUNK, RT=256 if _interpreted() else 16)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    i16 = torch.where(codes >= 1 << 15, codes - (1 << 16), codes).to(torch.int16)
    return (i16.view(*lead, d // CHUNK), scale.view(lead), resid.half().view(lead), norm.half().view(lead))

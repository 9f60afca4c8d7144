"""The page key centre of hq-e8-2b: each encoded page stores the mean of its rotated keys, and its keys are encoded
relative to it (an ignis extension of HQ_E8_2B.md §4.3 "Key centering", per page instead of per sequence).

Why: a post-RoPE key's mean turns with the position, so one centre for the whole sequence (§4.3) is kept only on
the dims RoPE barely turns (ignisd.model.layers.rope_stable_dims); on the others a page's 64 keys still share a local
mean. Encoding k − μ_page leaves a smaller vector, hence a smaller E8P error for the same 2 bits a dimension. The
daemon keeps the page centre on exactly those other dims (KVStore.page_center_dims = 1 − rope_stable_dims). Measured
on SmolLM2 (passkey, 20 trials, needle at 90 % / 50 % depth of 4K tokens, the centre emulated through hq-sim): the
sequence centre alone 16 / 19 retrieved (fp32: 20 / 20); with the page centre on the fast dims 19 / 20 (the answer
token's probability 0.39-0.62 at 90 % against 0.25-0.42); with the page centre on every dim 20 / 0 (probability
0.11-0.22 at 50 %: a page mean on the RoPE-stable dims, on top of the sequence centre, broke retrieval there).

Where it lives: in the record's "norm" bytes. The spec's record (§1.2) stores norm = ‖u‖ in 2 bytes a head-token,
but nothing reads it, and it follows from the other fields (§2.6-§2.7: N² = ŝ²‖c‖² − R²), so those bytes (4 a head
and token: the key's and the value's) carry the page's key centre instead: page buffer "center" uint8 [Hkv, 4] per
token, the 4·pt bytes of head h in a page (token-major: token t holds bytes 4t .. 4t + 3) are μ_K[h] as d values of
`center_dtype(d, pt)`: float32 when d <= pt, float16 when d <= 2·pt, float8 e4m3 (saturated at ±448) when
d <= 4·pt (SmolLM2: d 64, pt 64, float32; Qwen3.5 and Qwen3-Next: d 256, float8), the rest zero. Page bytes are
unchanged (HQ_E8_2B.md §0: 9,216 B a token on Qwen3.5-27B).

Reading: a compressed key is k̂_t = μ_page(t) + ŝ_t·c_t, so a score gains q̃·μ_page, one dot per query and page; the
variance correction and the values are unchanged. The sinks' positions are left out of page 0's mean (they are
read exact, and a sink key is often an outlier).
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
"""Largest finite float8 e4m3 (e4m3fn) magnitude: the page centre is saturated there before rounding."""


def center_dtype(d: int, pt: int) -> torch.dtype:
    """The dtype μ_K is stored in for head_dim d and pt-token pages: float32 (d <= pt), float16 (d <= 2·pt),
    float8_e4m3fn (d <= 4·pt). Raises ValueError when 4·pt bytes cannot hold d values (d > 4·pt)."""
    if d <= pt:
        return torch.float32
    if d <= 2 * pt:
        return torch.float16
    if d <= 4 * pt:
        return torch.float8_e4m3fn
    raise ValueError(f"hq-e8-2b: head_dim {d} needs pages of at least {-(-d // 4)} tokens for the page key centre, "
                     f"got {pt}")


def round_center(mu: torch.Tensor, pt: int) -> torch.Tensor:
    """μ [..., d] float32 rounded to its storage dtype and back (what readers will see) -> float32 [..., d]."""
    dt = center_dtype(mu.shape[-1], pt)
    if dt == torch.float32:
        return mu.float()
    lim = FP8_MAX if dt == torch.float8_e4m3fn else 65504.0
    return mu.float().clamp(-lim, lim).to(dt).float()


def pack(mu: torch.Tensor, pt: int) -> torch.Tensor:
    """The "center" bytes of n pages: μ [n, Hkv, d] float32 (already rounded by `round_center`, or rounded here)
    -> uint8 [n, pt, Hkv, 4] (token-major, as the page buffer stores them)."""
    n, hkv, d = mu.shape
    dt = center_dtype(d, pt)
    raw = round_center(mu, pt).to(dt).contiguous().view(torch.uint8).reshape(n, hkv, -1)   # [n, Hkv, d·size]
    out = torch.zeros(n, hkv, 4 * pt, dtype=torch.uint8, device=mu.device)
    out[..., :raw.shape[-1]] = raw
    return out.view(n, hkv, pt, 4).transpose(1, 2).contiguous()


def unpack(block: torch.Tensor, d: int) -> torch.Tensor:
    """μ_K of pages from their "center" bytes: block uint8 [..., pt, Hkv, 4] -> float32 [..., Hkv, d]."""
    pt = block.shape[-3]
    dt = center_dtype(d, pt)
    size = torch.empty((), dtype=dt).element_size()
    raw = block.transpose(-3, -2).contiguous().reshape(*block.shape[:-3], block.shape[-2], 4 * pt)[..., :d * size]
    return raw.contiguous().view(dt).float()


def page_means(u: torch.Tensor, pt: int, first: torch.Tensor | None, n_sinks: int) -> torch.Tensor:
    """The key centre of n whole pages: u [n·pt, 2, Hkv, d] their rotated keys and values (kind 0 keys), first
    BoolTensor [n] (None: none) marking a sequence's page 0, whose positions [0, n_sinks) are left out (all of page
    0 counts when n_sinks >= pt) -> float32 [n, Hkv, d] (round it with `round_center` before storing)."""
    k = u[:, 0].float().reshape(-1, pt, *u.shape[2:])                                  # [n, pt, Hkv, d]
    mu = k.mean(1)
    if first is not None and 0 < n_sinks < pt and bool(first.any()):
        mu = torch.where(first[:, None, None], k[:, n_sinks:].mean(1), mu)
    return mu

"""The "hq" of hq-e8-2b (HQ_E8_2B.md §2.1): a fixed randomized Hadamard rotation per (layer, KV head, kind).

    u = (1/√d) · H_d · (s ⊙ x)          ‖u‖ = ‖x‖
    x = s ⊙ ((1/√d) · H_d · u)          (inverse: H is symmetric and H·H = d·I)

H_d is the Sylvester (natural-order) Walsh–Hadamard matrix, H[i][j] = (−1)^popcount(i & j), applied as the fast
transform (log2 d butterfly stages (a, b) → (a + b, a − b) at distances 1, 2, 4, ..., d/2). For d = 256 the factor
is 1/16 as in the spec; for SmolLM2's d = 64 it is 1/8 (§5.4: "the codec uses 8 codewords per head and H₆₄").
s ∈ {±1}^d is the sign vector of (absolute attention-layer index ℓ, KV head h, kind κ ∈ {K = 0, V = 1}): splitmix64
from seed FORMAT_SEED XOR ((ℓ << 16) | (h << 8) | κ), s_j = −1 iff bit 63 of the j-th output is 1 (j < d).
Every op here is elementwise in a fixed order, so a row's result never depends on the batch it is in.
"""
from __future__ import annotations

import math
from functools import lru_cache

import torch

from ignis_kernels import hq_seed
_M64 = (1 << 64) - 1
KIND_K, KIND_V = 0, 1


def splitmix64_signs(seed: int, n: int) -> list[int]:
    """n signs (+1 / −1) from splitmix64 with state `seed` (§2.1; all arithmetic mod 2⁶⁴)."""
    s = seed & _M64
    out = []
    for _ in range(n):
        s = (s + 0x9E3779B97F4A7C15) & _M64
        z = s
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
        z ^= z >> 31
        out.append(-1 if z >> 63 else 1)
    return out


def sign_seed(layer: int, head: int, kind: int) -> int:
    """The splitmix64 seed of (layer ℓ, KV head h, kind κ): FORMAT_SEED XOR ((ℓ << 16) | (h << 8) | κ), with the
    seed in effect read from ignis_kernels.hq_seed at each call."""
    return hq_seed.FORMAT_SEED ^ ((layer << 16) | (head << 8) | kind)


def sign_vector(layer: int, head: int, kind: int, dim: int) -> torch.Tensor:
    """s for (layer, head, kind): float32 [dim] of ±1 (the first `dim` splitmix64 outputs)."""
    return torch.tensor(splitmix64_signs(sign_seed(layer, head, kind), dim), dtype=torch.float32)


def layer_signs(layer: int, num_kv_heads: int, dim: int) -> torch.Tensor:
    """Sign vectors of one attention layer: float32 [2, Hkv, dim], [0] for keys (κ = 0), [1] for values (κ = 1)."""
    return torch.stack([torch.stack([sign_vector(layer, h, kind, dim) for h in range(num_kv_heads)])
                        for kind in (KIND_K, KIND_V)])


def _check_dim(d: int) -> None:
    if d < 8 or d & (d - 1):
        raise ValueError(f"hq-e8-2b needs a power-of-two head_dim >= 8, got {d}")


@lru_cache(maxsize=None)
def _plus_minus(dtype: torch.dtype, device: str) -> torch.Tensor:
    """[[+1], [−1]]: one butterfly stage as addcmul(a, b, ±1) = (a + b, a − b)."""
    return torch.tensor([[1.0], [-1.0]], dtype=dtype, device=device)


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalised Sylvester Walsh–Hadamard transform over the last dim (a power of two): H_d · x.
    x: [..., d] float. Returns a new tensor of x's shape and dtype. One op a stage: addcmul(a, b, [+1, −1]) gives
    (a + b, a − b) with the same rounding as the sum and the difference (b·(±1) is exact)."""
    d = x.shape[-1]
    _check_dim(d)
    lead = x.shape[:-1]
    pm = _plus_minus(x.dtype, str(x.device))
    y = x.reshape(-1, d)
    h = 1
    while h < d:
        y = y.view(-1, d // (2 * h), 2, h)
        y = torch.addcmul(y[:, :, :1], y[:, :, 1:], pm)
        h *= 2
    return y.reshape(*lead, d)


def rotate(x: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """u = H·(s ⊙ x)/√d. x: [..., d] float32; signs: ±1 broadcastable to x (e.g. [Hkv, d] against [T, Hkv, d]).
    Returns float32 [..., d]."""
    return fwht(x.float() * signs) * (1.0 / math.sqrt(x.shape[-1]))


def unrotate(u: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
    """x = s ⊙ (H·u/√d), the inverse of `rotate`. u: [..., d] float32; signs broadcastable. Returns float32."""
    return fwht(u.float()) * (1.0 / math.sqrt(u.shape[-1])) * signs

"""Paged attention dispatcher (DESIGN §3 kernels/): checks arguments, then runs the implementation for the
device. Only the pure-torch reference exists so far (it runs on CPU and, through torch SDPA, on CUDA); Triton /
hq-e8-2b kernels plug in here later.
"""
from __future__ import annotations

import torch

from ignis_kernels.attention import reference

__all__ = ["paged_attention", "paged_decode_attention", "causal_mask"]

causal_mask = reference.causal_mask


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    start: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention of n new queries of one sequence over its paged context; see reference.paged_attention.

    q: [n, Hq, d]; k_cache, v_cache: [S, Hkv, d]; slots: LongTensor [start + n]. Returns [n, Hq, d] (q's dtype).
    Raises ValueError on inconsistent shapes (heads not a multiple, head_dim mismatch, slots != start + n).
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(f"paged_attention: bad shapes q {tuple(q.shape)} k {tuple(k_cache.shape)} "
                         f"v {tuple(v_cache.shape)}")
    if q.shape[1] % k_cache.shape[1] or q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"paged_attention: q heads/dim {tuple(q.shape[1:])} vs kv {tuple(k_cache.shape[1:])}")
    if slots.dim() != 1 or slots.shape[0] != start + q.shape[0] or start < 0:
        raise ValueError(f"paged_attention: {slots.shape[0]} slots for start {start} + {q.shape[0]} queries")
    return reference.paged_attention(q, k_cache, v_cache, slots, start, scale)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Batched single-query attention of B sequences; see reference.paged_decode_attention.

    q: [B, Hq, d]; slot_table: LongTensor [B, L]; context_lens: LongTensor [B], 1 <= context_lens <= L.
    Returns [B, Hq, d]. Raises ValueError on inconsistent shapes.
    """
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.shape != k_cache.shape:
        raise ValueError(f"paged_decode_attention: bad shapes q {tuple(q.shape)} k {tuple(k_cache.shape)}")
    if q.shape[1] % k_cache.shape[1] or q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"paged_decode_attention: q heads/dim {tuple(q.shape[1:])} vs kv {tuple(k_cache.shape[1:])}")
    if slot_table.dim() != 2 or slot_table.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise ValueError("paged_decode_attention: slot_table [B, L] and context_lens [B] must match q's B")
    return reference.paged_decode_attention(q, k_cache, v_cache, slot_table, context_lens, scale)

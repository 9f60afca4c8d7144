"""Paged attention dispatcher (DESIGN §3 kernels/): checks arguments, then runs the implementation for the
device. Only the pure-torch reference exists so far (it runs on CPU and, through torch SDPA, on CUDA); Triton /
hq-e8-2b kernels plug in here later.

Pages: k_pages / v_pages are [P, page_tokens, Hkv, d] (DevicePages.pages(layer)); a page table lists one
sequence's pages in position order.
"""
from __future__ import annotations

import torch

from ignis_kernels.attention import reference

__all__ = ["paged_attention", "paged_decode_attention", "causal_mask", "gather_pages"]

causal_mask = reference.causal_mask
gather_pages = reference.gather_pages


def _check_pages(name: str, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> None:
    if q.dim() != 3 or k_pages.dim() != 4 or v_pages.shape != k_pages.shape:
        raise ValueError(f"{name}: bad shapes q {tuple(q.shape)} k {tuple(k_pages.shape)} v {tuple(v_pages.shape)}")
    if q.shape[1] % k_pages.shape[2] or q.shape[2] != k_pages.shape[3]:
        raise ValueError(f"{name}: q heads/dim {tuple(q.shape[1:])} vs kv heads/dim {tuple(k_pages.shape[2:])}")


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                    start: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention of n new queries of one sequence over its paged context; see reference.paged_attention.

    q: [n, Hq, d] at positions start .. start+n-1; k_pages, v_pages: [P, page_tokens, Hkv, d];
    page_table: LongTensor [>= ceil((start+n)/page_tokens)]. Returns [n, Hq, d] (q's dtype).
    Raises ValueError on inconsistent shapes (heads not a multiple, head_dim mismatch, too few pages).
    """
    _check_pages("paged_attention", q, k_pages, v_pages)
    if page_table.dim() != 1 or page_table.shape[0] * k_pages.shape[1] < start + q.shape[0] or start < 0:
        raise ValueError(f"paged_attention: {page_table.shape[0]} pages for start {start} + {q.shape[0]} queries")
    return reference.paged_attention(q, k_pages, v_pages, page_table, start, scale)


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           page_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Batched single-query attention of B sequences; see reference.paged_decode_attention.

    q: [B, Hq, d]; page_table: LongTensor [B, W] (padded with any valid page); context_lens: LongTensor [B],
    1 <= context_lens <= W * page_tokens. Returns [B, Hq, d]. Raises ValueError on inconsistent shapes.
    """
    _check_pages("paged_decode_attention", q, k_pages, v_pages)
    if page_table.dim() != 2 or page_table.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise ValueError("paged_decode_attention: page_table [B, W] and context_lens [B] must match q's B")
    return reference.paged_decode_attention(q, k_pages, v_pages, page_table, context_lens, scale)

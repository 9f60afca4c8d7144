"""Paged attention dispatcher (DESIGN §3 kernels/): checks arguments, then runs the implementation for the KV
format and device. Only the pure-torch reference of the dense format exists so far (it runs on CPU and, through
torch SDPA, on CUDA); Triton and hq-e8-2b kernels plug in here later under their own view tags.

The protocol between a KV store and the attention layers is defined here, on the model/kernel side, so that the
storage (ignisd.cache.kv_store) and the layers (ignisd.model) never import each other:
- `PagedView`: one attention layer's pages, tagged with the format's dispatch tag ("dense": buffers "k" and "v",
  each [P, page_tokens, Hkv, d] in the storage dtype, fp32 or bf16);
- `PagedKV`: what an attention layer may call on a KV store (write its new keys/values, get its layer's view).
A page table lists one sequence's pages in position order (position p: page_table[p // page_tokens], offset
p % page_tokens).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from ignis_kernels.attention import reference

__all__ = ["PagedView", "PagedKV", "VIEW_TAGS", "paged_attention", "paged_decode_attention", "causal_mask",
           "gather_pages"]

causal_mask = reference.causal_mask
gather_pages = reference.gather_pages

VIEW_TAGS = ("dense",)
"""The view tags this build has kernels for."""


@dataclass(frozen=True)
class PagedView:
    """One attention layer's KV pages as the kernels read them.

    tag: the KV format's dispatch tag (one of VIEW_TAGS to be readable here). buffers: the format's page buffers
    by name, each [P, page_tokens, *per-token shape] in its storage dtype; "dense": "k" and "v", each
    [P, page_tokens, Hkv, d] (fp32 or bf16, upcast on read). page_tokens: tokens per page.
    """

    tag: str
    buffers: dict[str, torch.Tensor]
    page_tokens: int


class PagedKV(Protocol):
    """What the attention layers of a model may call on a KV store (ignisd.cache.kv_store.KVStore is one).

    n_attention_layers: layers the store holds (the decoder checks it against its spec).
    """

    n_attention_layers: int

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the keys/values of T tokens of attention layer `layer` (index among the attention layers) at
        slot_mapping (LongTensor [T], slot = page * page_tokens + offset); k, v: [T, Hkv, d], any float dtype."""
        ...

    def view(self, layer: int) -> PagedView:
        """Attention layer `layer`'s pages (a view of the storage, not a copy)."""
        ...


def _dense(name: str, q: torch.Tensor, view: PagedView) -> tuple[torch.Tensor, torch.Tensor]:
    """The k, v pages of a dense view, checked against q [*, Hq, d]. Raises ValueError on an unknown tag or
    inconsistent shapes."""
    if view.tag != "dense":
        raise ValueError(f"{name}: no kernel for KV view tag {view.tag!r}; known: {', '.join(VIEW_TAGS)}")
    k_pages, v_pages = view.buffers["k"], view.buffers["v"]
    if q.dim() != 3 or k_pages.dim() != 4 or v_pages.shape != k_pages.shape or k_pages.shape[1] != view.page_tokens:
        raise ValueError(f"{name}: bad shapes q {tuple(q.shape)} k {tuple(k_pages.shape)} v {tuple(v_pages.shape)} "
                         f"(page_tokens {view.page_tokens})")
    if q.shape[1] % k_pages.shape[2] or q.shape[2] != k_pages.shape[3]:
        raise ValueError(f"{name}: q heads/dim {tuple(q.shape[1:])} vs kv heads/dim {tuple(k_pages.shape[2:])}")
    return k_pages, v_pages


def paged_attention(q: torch.Tensor, view: PagedView, page_table: torch.Tensor, start: int,
                    scale: float | None = None) -> torch.Tensor:
    """Causal attention of n new queries of one sequence over its paged context; see reference.paged_attention.

    q: [n, Hq, d] at positions start .. start+n-1; view: the layer's PagedView (the n new keys/values already
    written); page_table: LongTensor [>= ceil((start+n)/page_tokens)]. scale: default 1/sqrt(d).
    Returns [n, Hq, d] (q's dtype). Raises ValueError for a view tag without a kernel or inconsistent shapes
    (heads not a multiple, head_dim mismatch, too few pages).
    """
    k_pages, v_pages = _dense("paged_attention", q, view)
    if page_table.dim() != 1 or page_table.shape[0] * view.page_tokens < start + q.shape[0] or start < 0:
        raise ValueError(f"paged_attention: {page_table.shape[0]} pages for start {start} + {q.shape[0]} queries")
    return reference.paged_attention(q, k_pages, v_pages, page_table, start, scale)


def paged_decode_attention(q: torch.Tensor, view: PagedView, page_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """Batched single-query attention of B sequences; see reference.paged_decode_attention.

    q: [B, Hq, d]; view: the layer's PagedView; page_table: LongTensor [B, W] (padded with any valid page);
    context_lens: LongTensor [B], 1 <= context_lens <= W * page_tokens. Returns [B, Hq, d].
    Raises ValueError for a view tag without a kernel or inconsistent shapes.
    """
    k_pages, v_pages = _dense("paged_decode_attention", q, view)
    if page_table.dim() != 2 or page_table.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise ValueError("paged_decode_attention: page_table [B, W] and context_lens [B] must match q's B")
    return reference.paged_decode_attention(q, k_pages, v_pages, page_table, context_lens, scale)

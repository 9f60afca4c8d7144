"""Pure-torch paged attention: the specification and the CPU path of ignis_kernels.attention.

Keys/values live in a slot-addressed cache [S, Hkv, d] (slot = page * page_tokens + offset, see
ignisd/model/batch.py); a sequence's context is the list of its slots in position order. Queries at positions
start .. start+n-1 attend causally over context positions 0 .. start+n-1 (query i sees keys j <= start + i).
GQA: query head h uses kv head h // (Hq // Hkv) (HF's repeat_kv / SDPA enable_gqa convention).
Scores are softmax(q k^T * scale) with scale = 1/sqrt(d) by default (Vaswani et al. 2017); computed in q's dtype
(fp32) with stored keys/values upcast on read.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def causal_mask(n: int, start: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool mask [n, start+n]: True where query i (position start+i) may attend key j (j <= start+i)."""
    ctx = start + n
    return torch.arange(ctx, device=device)[None, :] <= (start + torch.arange(n, device=device))[:, None]


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor,
                    start: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention of one sequence's n new queries over its cached context.

    q: [n, Hq, d] float (fp32), positions start .. start+n-1.
    k_cache, v_cache: [S, Hkv, d] in the storage dtype (fp32 / bf16), already holding the n new keys/values.
    slots: LongTensor [start + n], the cache slots of positions 0 .. start+n-1.
    Returns [n, Hq, d] in q's dtype (a view; may be non-contiguous).
    """
    n, hq, _ = q.shape
    hkv = k_cache.shape[1]
    k = k_cache.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)   # [1, Hkv, ctx, d]
    v = v_cache.index_select(0, slots).to(q.dtype).transpose(0, 1).unsqueeze(0)
    qh = q.transpose(0, 1).unsqueeze(0)                                              # [1, Hq, n, d]
    gqa = hq != hkv
    if n == 1:
        out = F.scaled_dot_product_attention(qh, k, v, scale=scale, enable_gqa=gqa)
    elif start == 0:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        mask = causal_mask(n, start, q.device)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           slot_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None) -> torch.Tensor:
    """One new query per sequence for B sequences at once (batched decode).

    q: [B, Hq, d] float, the query of each sequence at position context_lens[b] - 1.
    k_cache, v_cache: [S, Hkv, d] storage dtype, holding each sequence's new key/value.
    slot_table: LongTensor [B, L] with L >= max(context_lens): row b's first context_lens[b] entries are the slots
        of positions 0 .. context_lens[b]-1; the rest is padding (any valid slot; masked out).
    context_lens: LongTensor [B] (>= 1).
    Returns [B, Hq, d] in q's dtype.
    """
    b, hq, _ = q.shape
    hkv = k_cache.shape[1]
    length = slot_table.shape[1]
    k = k_cache[slot_table].to(q.dtype).transpose(1, 2)      # [B, Hkv, L, d]
    v = v_cache[slot_table].to(q.dtype).transpose(1, 2)
    mask = None
    if bool((context_lens != length).any()):
        mask = (torch.arange(length, device=q.device)[None, :] < context_lens[:, None])[:, None, None, :]
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k, v, attn_mask=mask, scale=scale, enable_gqa=hq != hkv)
    return out[:, :, 0, :]

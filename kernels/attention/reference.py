"""Pure-torch paged attention: the specification and the CPU path of ignis_kernels.attention.

Keys/values live in pages [P, page_tokens, Hkv, d] (the "k" and "v" buffers of a dense PagedView; slot =
page * page_tokens + offset); a sequence's context is its page table (pages in position order). Queries at positions
start .. start+n-1 attend causally over context positions 0 .. start+n-1 (query i sees keys j <= start + i).
GQA: query head h uses kv head h // (Hq // Hkv) (HF's repeat_kv / SDPA enable_gqa convention).
Scores are softmax(q k^T * scale) with scale = 1/sqrt(d) by default (Vaswani et al. 2017); computed in q's dtype
(fp32) with stored keys/values upcast on read.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# torch's CPU flash-attention op, which also returns the log-sum-exp of each query row: lets a chunk's attention be
# split into an unmasked part over the earlier context and a causal part over the chunk, merged exactly
# (Milakov & Gimelshein 2018, online softmax). Absent -> the masked single call is used instead.
_FLASH_LSE = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


def causal_mask(n: int, start: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Bool mask [n, start+n]: True where query i (position start+i) may attend key j (j <= start+i)."""
    ctx = start + n
    return torch.arange(ctx, device=device)[None, :] <= (start + torch.arange(n, device=device))[:, None]


def gather_pages(cache: torch.Tensor, page_table: torch.Tensor) -> torch.Tensor:
    """Copy whole pages: cache [P, page_tokens, Hkv, d], page_table LongTensor [..., n_pages]
    -> [..., n_pages * page_tokens, Hkv, d] (storage dtype)."""
    p, pt, hkv, d = cache.shape
    flat = cache.view(p, pt * hkv * d).index_select(0, page_table.reshape(-1))
    return flat.view(*page_table.shape[:-1], page_table.shape[-1] * pt, hkv, d)


def paged_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                    start: int, scale: float | None = None) -> torch.Tensor:
    """Causal attention of one sequence's n new queries over its paged context.

    q: [n, Hq, d] float (fp32), positions start .. start+n-1.
    k_pages, v_pages: [P, page_tokens, Hkv, d] in the storage dtype (fp32 / bf16), already holding the n new
        keys/values.
    page_table: LongTensor [>= ceil((start+n) / page_tokens)]: the sequence's pages in position order
        (position p lives at page_table[p // page_tokens], offset p % page_tokens).
    Returns [n, Hq, d] in q's dtype (a view; may be non-contiguous).
    """
    n, hq, _ = q.shape
    hkv = k_pages.shape[2]
    ctx = start + n
    used = page_table[:-(-ctx // k_pages.shape[1])]
    k = gather_pages(k_pages, used)[:ctx].to(q.dtype).transpose(0, 1).unsqueeze(0)   # [1, Hkv, ctx, d]
    v = gather_pages(v_pages, used)[:ctx].to(q.dtype).transpose(0, 1).unsqueeze(0)
    qh = q.transpose(0, 1).unsqueeze(0)                                                # [1, Hq, n, d]
    gqa = hq != hkv
    if n == 1:
        out = F.scaled_dot_product_attention(qh, k, v, scale=scale, enable_gqa=gqa)
    elif start == 0:
        out = F.scaled_dot_product_attention(qh, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    elif _FLASH_LSE is not None and q.device.type == "cpu" and q.dtype == torch.float32:
        out = _split_attention(q, k, v, start, scale)
    else:
        mask = causal_mask(n, start, q.device)
        out = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return out[0].transpose(0, 1)


def _split_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int,
                     scale: float | None) -> torch.Tensor:
    """Chunk attention as (all queries x keys [0, start), no mask) + (causal within the chunk), merged by the
    rows' log-sum-exp: out = (o1 e^(l1-m) + o2 e^(l2-m)) / (e^(l1-m) + e^(l2-m)), m = max(l1, l2).

    q: [n, Hq, d]; k, v: [1, Hkv, start + n, d]. Returns [1, Hq, n, d]. The unmasked part runs the g = Hq/Hkv
    query heads of a kv head as g*n rows of that head (no K/V copies; ~25% faster than one masked call at 8k)."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    g = hq // hkv
    qg = q.view(n, hkv, g, d).permute(1, 2, 0, 3).reshape(1, hkv, g * n, d)
    o1, l1 = _FLASH_LSE(qg, k[:, :, :start], v[:, :, :start], scale=scale)
    o1, l1 = o1.reshape(1, hq, n, d), l1.reshape(1, hq, n)
    kc, vc = k[:, :, start:], v[:, :, start:]
    if g > 1:
        kc, vc = kc.repeat_interleave(g, dim=1), vc.repeat_interleave(g, dim=1)
    o2, l2 = _FLASH_LSE(q.transpose(0, 1).unsqueeze(0), kc, vc, is_causal=True, scale=scale)
    m = torch.maximum(l1, l2)
    w1, w2 = torch.exp(l1 - m).unsqueeze(-1), torch.exp(l2 - m).unsqueeze(-1)
    return (o1 * w1 + o2 * w2) / (w1 + w2)


def paged_decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                           page_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, single: tuple[int, int | None] | None = None) -> torch.Tensor:
    """One new query per sequence for B sequences at once (batched decode).

    q: [B, Hq, d] float, the query of sequence b at position context_lens[b] - 1.
    k_pages, v_pages: [P, page_tokens, Hkv, d] storage dtype, holding each sequence's new key/value.
    page_table: LongTensor [B, W]: row b lists sequence b's pages in position order, padded to W with any valid
        page id (masked out). context_lens: LongTensor [B], 1 <= context_lens[b] <= W * page_tokens.
    single: for B == 1 only, (context length, first page or None) as Python ints, known to the caller without a
        device sync: the keys are cut to the context length, so no mask is built; with a first page (the page
        table is the consecutive run first, first+1, ...) the pages are read in place, with no gather copy.
    Returns [B, Hq, d] in q's dtype.
    """
    b, hq, d = q.shape
    hkv = k_pages.shape[2]
    if single is not None and b == 1:
        return _single_decode(q, k_pages, v_pages, page_table, *single, scale)
    length = page_table.shape[1] * k_pages.shape[1]
    k = gather_pages(k_pages, page_table).to(q.dtype).transpose(1, 2)     # [B, Hkv, L, d]
    v = gather_pages(v_pages, page_table).to(q.dtype).transpose(1, 2)
    # always masked (no data-dependent branch): padding keys past context_lens[b] get no weight
    mask = (torch.arange(length, device=q.device)[None, :] < context_lens[:, None])[:, None, None, :]
    # grouped query layout: the g = Hq/Hkv query heads sharing kv head h become g query rows of head h
    qg = q.view(b, hkv, hq // hkv, d)
    out = F.scaled_dot_product_attention(qg, k, v, attn_mask=mask, scale=scale)   # [B, Hkv, g, d]
    return out.reshape(b, hq, d)


def _single_decode(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                   ctx: int, first: int | None, scale: float | None) -> torch.Tensor:
    """paged_decode_attention of one sequence of context `ctx` (its docstring says what `single` vouches for):
    q [1, Hq, d]; first: the first page of a consecutive run, or None to gather the page table's pages."""
    _, hq, d = q.shape
    p, pt, hkv, _ = k_pages.shape
    if first is not None:                                       # a consecutive run: a view of the pool
        k = k_pages.view(p * pt, hkv, d)[first * pt:first * pt + ctx]
        v = v_pages.view(p * pt, hkv, d)[first * pt:first * pt + ctx]
    else:
        n = -(-ctx // pt)
        k = gather_pages(k_pages, page_table[0, :n])[:ctx]
        v = gather_pages(v_pages, page_table[0, :n])[:ctx]
    if k.dtype != q.dtype:
        k, v = k.to(q.dtype), v.to(q.dtype)
    # [1, Hkv, g, d] queries against [1, Hkv, ctx, d] keys: the g = Hq/Hkv heads of a kv head are its query rows
    # (4-D: torch's CPU flash kernel; a 3-D call takes the math path, slower)
    out = F.scaled_dot_product_attention(q.view(1, hkv, hq // hkv, d), k.transpose(0, 1).unsqueeze(0),
                                         v.transpose(0, 1).unsqueeze(0), scale=scale)
    return out.view(1, hq, d)

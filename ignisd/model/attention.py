"""Full-attention layer over paged KV: fused QKV projection, rotary, KV write, paged attention, output projection.

The n new tokens of every sequence in a ForwardBatch share one QKV and one output matmul; attention itself runs
per sequence through ignis_kernels.attention (decode tokens of several sequences together in one padded call).
Keys/values are written to the pool first and attention reads them back from it, so a token sees exactly the
stored (possibly bf16-rounded) values whatever the chunking. The pool is reached only through the PagedKV protocol
of ignis_kernels.attention (write, view): the layers never see the store's class.

A format with an exact window (hq-e8-2b, kv.exact_window_pages not None) is written through `write_exact` instead,
with the forward's state store (ForwardContext.states: the window lives in each sequence's state slot), and its
attention reads the returned ExactSpan / ExactRing beside the compressed pages (store_and_attend).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import ignis_kernels.attention as kattn
from ignis_kernels.attention import PagedKV
from ignisd.model.batch import ForwardBatch, ForwardContext
from ignisd.model.layers import apply_rope


@dataclass
class AttentionPlan:
    """How one ForwardBatch's attention is split, computed once per forward and shared by all layers.

    prefill: per multi-token chunk (first row in T, n, start, page table, state slot or None).
    decode_rows: LongTensor [B] rows of the single-token chunks; decode_pages: LongTensor [B, W] page tables
    padded with each row's first page (masked by decode_lens); decode_lens: LongTensor [B] context lengths;
    decode_slots: LongTensor [B] their state slots (None when the chunks carry none).
    whole: the batch is one chunk or only decode tokens (attention output needs no scatter).
    decode_single: with exactly one decode row, (its context length, its first page when its pages are the
    consecutive run first, first+1, ... else None): the dense kernel's no-mask, no-copy shortcut; else None.
    """

    prefill: list[tuple[int, int, int, torch.Tensor, int | None]]
    decode_rows: torch.Tensor | None
    decode_pages: torch.Tensor | None
    decode_lens: torch.Tensor | None
    whole: bool
    decode_slots: torch.Tensor | None = None
    decode_single: tuple[int, int | None] | None = None

    @classmethod
    def from_batch(cls, batch: ForwardBatch, single: bool = True) -> "AttentionPlan":
        """Split `batch` into per-sequence prefill calls and one batched decode call. single: allow the one-row
        decode shortcut (decode_single); False keeps a row's arithmetic the same alone and batched (the
        decoder's batch_invariant mode)."""
        prefill, rows, tables, lens, slots = [], [], [], [], []
        row = 0
        states = batch.state_slots or [None] * len(batch.seq_lens)
        for n, start, ctx, pages, slot in zip(batch.seq_lens, batch.starts, batch.context_lens, batch.page_tables,
                                              states):
            if n == 1:
                rows.append(row)
                tables.append(pages)
                lens.append(ctx)
                slots.append(slot)
            else:
                prefill.append((row, n, start, pages, slot))
            row += n
        d_rows = d_pages = d_lens = d_slots = None
        if rows:
            width = max(t.shape[0] for t in tables)
            table = torch.empty(len(rows), width, dtype=torch.long)
            for i, t in enumerate(tables):
                table[i, :t.shape[0]] = t
                table[i, t.shape[0]:] = t[0]
            dev = batch.input_ids.device
            d_rows = torch.tensor(rows, dtype=torch.long, device=dev)
            d_pages = table.to(dev)
            d_lens = torch.tensor(lens, dtype=torch.long, device=dev)
            if all(s is not None for s in slots):
                d_slots = torch.tensor(slots, dtype=torch.long, device=dev)
        whole = len(batch.seq_lens) == 1 or not prefill
        hint = None
        if single and len(rows) == 1:
            t = tables[0].tolist()
            hint = (lens[0], t[0] if t == list(range(t[0], t[0] + len(t))) else None)
        return cls(prefill, d_rows, d_pages, d_lens, whole, d_slots, hint)


def paged_attend(q: torch.Tensor, kv: PagedKV, kv_layer: int, plan: AttentionPlan, t_all: int,
                 spans: list | None = None, ring=None) -> torch.Tensor:
    """Attention of the batch's T queries over their sequences' paged context (K/V already written to `kv`).

    q: [T, Hq, d]. kv_layer: the layer's index among the attention layers. spans, ring: what write_exact returned
    (an ExactSpan per prefill chunk, the decode rows' ExactRing) for a format with an exact window; None for dense.
    Returns [t_all, Hq, d] in q's dtype (rows past T, padding, are zero)."""
    t = q.shape[0]
    view = kv.view(kv_layer)
    spans = spans or [None] * len(plan.prefill)
    if plan.whole and t_all == t:
        if plan.prefill:
            _, _, start, pages, _ = plan.prefill[0]
            return kattn.paged_attention(q, view, pages, start, exact=spans[0]).to(q.dtype)
        return kattn.paged_decode_attention(q, view, plan.decode_pages, plan.decode_lens, exact=ring,
                                            single=plan.decode_single).to(q.dtype)
    alloc = torch.empty if t_all == t else torch.zeros
    out = alloc(t_all, q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
    for (row, n, start, pages, _), span in zip(plan.prefill, spans):
        out[row:row + n] = kattn.paged_attention(q[row:row + n], view, pages, start, exact=span)
    if plan.decode_rows is not None:
        qd = q.index_select(0, plan.decode_rows)
        od = kattn.paged_decode_attention(qd, view, plan.decode_pages, plan.decode_lens, exact=ring,
                                          single=plan.decode_single)
        out.index_copy_(0, plan.decode_rows, od.to(q.dtype))
    return out


def store_and_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: ForwardContext, kv_layer: int,
                     t_all: int) -> torch.Tensor:
    """Write the batch's keys/values of attention layer `kv_layer` and attend: q [T, Hq, d], k, v [T, Hkv, d].

    Dense pool: kv.write at batch.slot_mapping, then paged_attend (unchanged arithmetic). A pool with an exact window
    (hq-e8-2b): kv.write_exact with ctx.states (the window is per sequence), then paged_attend over the compressed
    pages and the returned exact parts. Returns [t_all, Hq, d]."""
    kv = ctx.kv
    if getattr(kv, "exact_window_pages", None) is None:
        kv.write(kv_layer, ctx.batch.slot_mapping, k, v)
        return paged_attend(q, kv, kv_layer, ctx.attn, t_all)
    spans, ring = kv.write_exact(kv_layer, k, v, ctx.attn, ctx.states)
    return paged_attend(q, kv, kv_layer, ctx.attn, t_all, spans, ring)


class Attention:
    """One llama self-attention layer.

    qkv: the fused projection [(Hq + 2 Hkv) * d, H] (q rows, k rows, v rows in HF rotate-half order), o: [H, Hq * d];
    each a linear layer of ignisd.model.linear (dense, bf16 or quantized, biases inside), see hybrid._llama_attention.
    num_heads, num_kv_heads, head_dim: counts. kv_layer: this layer's index among the attention layers (its layer in
    the KV store). Scale 1/sqrt(head_dim).
    """

    def __init__(self, qkv, o, num_heads: int, num_kv_heads: int, head_dim: int, kv_layer: int) -> None:
        self.qkv, self.o = qkv, o
        self.hq, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.kv_layer = kv_layer
        self.q_dim, self.kv_dim = num_heads * head_dim, num_kv_heads * head_dim

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident weight tensors (for weight_bytes; None for an absent bias)."""
        return [*self.qkv.tensors, *self.o.tensors]

    def __call__(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [T', H] normed hidden states (T' >= T = ctx.batch.num_tokens: rows past T are padding whose output is
        zero); ctx.cos, ctx.sin: [T', 1, d] rotary tables of the positions. Writes this layer's K/V of the T tokens
        to ctx.kv (store_and_attend) and returns the attention output [T', H] (fp32, or bf16 out of a bf16 /
        quantized o projection)."""
        t_all = x.shape[0]
        batch, cos, sin = ctx.batch, ctx.cos, ctx.sin
        t = batch.num_tokens
        qkv = self.qkv(x)
        if t != t_all:                                  # padding rows (batch_invariant): no K/V, no attention
            qkv, cos, sin = qkv[:t], cos[:t], sin[:t]
        qk = qkv[:, :self.q_dim + self.kv_dim].view(t, self.hq + self.hkv, self.d)
        qk = apply_rope(qk, cos, sin)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, self.q_dim + self.kv_dim:].view(t, self.hkv, self.d)
        out = store_and_attend(q, k, v, ctx, self.kv_layer, t_all)
        return self.o(out.reshape(t_all, self.q_dim))

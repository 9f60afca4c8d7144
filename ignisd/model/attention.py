"""Full-attention layer over paged KV: fused QKV projection, rotary, KV write, paged attention, output projection.

The n new tokens of every sequence in a ForwardBatch share one QKV and one output matmul; attention itself runs
per sequence through ignis_kernels.attention (decode tokens of several sequences together in one padded call).
Keys/values are written to the pool first and attention reads them back from it, so a token sees exactly the
stored (possibly bf16-rounded) values whatever the chunking. The pool is reached only through the PagedKV protocol
of ignis_kernels.attention (write, view): the layers never see the store's class.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import ignis_kernels.attention as kattn
from ignis_kernels.attention import PagedKV
from ignisd.model.batch import ForwardBatch, ForwardContext
from ignisd.model.layers import apply_rope, linear_t


@dataclass
class AttentionPlan:
    """How one ForwardBatch's attention is split, computed once per forward and shared by all layers.

    prefill: per multi-token chunk (first row in T, n, start, page table).
    decode_rows: LongTensor [B] rows of the single-token chunks; decode_pages: LongTensor [B, W] page tables
    padded with each row's first page (masked by decode_lens); decode_lens: LongTensor [B] context lengths.
    whole: the batch is one chunk or only decode tokens (attention output needs no scatter).
    """

    prefill: list[tuple[int, int, int, torch.Tensor]]
    decode_rows: torch.Tensor | None
    decode_pages: torch.Tensor | None
    decode_lens: torch.Tensor | None
    whole: bool

    @classmethod
    def from_batch(cls, batch: ForwardBatch) -> "AttentionPlan":
        """Split `batch` into per-sequence prefill calls and one batched decode call."""
        prefill, rows, tables, lens = [], [], [], []
        row = 0
        for n, start, ctx, pages in zip(batch.seq_lens, batch.starts, batch.context_lens, batch.page_tables):
            if n == 1:
                rows.append(row)
                tables.append(pages)
                lens.append(ctx)
            else:
                prefill.append((row, n, start, pages))
            row += n
        d_rows = d_pages = d_lens = None
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
        whole = len(batch.seq_lens) == 1 or not prefill
        return cls(prefill, d_rows, d_pages, d_lens, whole)


def paged_attend(q: torch.Tensor, kv: PagedKV, kv_layer: int, plan: AttentionPlan, t_all: int) -> torch.Tensor:
    """Attention of the batch's T queries over their sequences' paged context (K/V already written to `kv`).

    q: [T, Hq, d]. kv_layer: the layer's index among the attention layers. Returns [t_all, Hq, d] (rows past T,
    padding, are zero)."""
    t = q.shape[0]
    view = kv.view(kv_layer)
    if plan.whole and t_all == t:
        if plan.prefill:
            _, _, start, pages = plan.prefill[0]
            return kattn.paged_attention(q, view, pages, start)
        return kattn.paged_decode_attention(q, view, plan.decode_pages, plan.decode_lens)
    alloc = torch.empty if t_all == t else torch.zeros
    out = alloc(t_all, q.shape[1], q.shape[2], dtype=q.dtype, device=q.device)
    for row, n, start, pages in plan.prefill:
        out[row:row + n] = kattn.paged_attention(q[row:row + n], view, pages, start)
    if plan.decode_rows is not None:
        qd = q.index_select(0, plan.decode_rows)
        od = kattn.paged_decode_attention(qd, view, plan.decode_pages, plan.decode_lens)
        out.index_copy_(0, plan.decode_rows, od)
    return out


class Attention:
    """One llama self-attention layer.

    w_qkv: [(Hq + 2 Hkv) * d, H] (q rows, k rows, v rows in HF rotate-half order); w_o: [H, Hq * d];
    optional biases b_qkv, b_o (weights stored transposed, see linear_t). num_heads, num_kv_heads, head_dim:
    counts. kv_layer: this layer's index among the attention layers (its layer in the KV store). Scale
    1/sqrt(head_dim).
    """

    def __init__(self, w_qkv: torch.Tensor, w_o: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 kv_layer: int, b_qkv: torch.Tensor | None = None, b_o: torch.Tensor | None = None) -> None:
        self.w_qkv_t, self.w_o_t = w_qkv.t().contiguous(), w_o.t().contiguous()
        self.b_qkv, self.b_o = b_qkv, b_o
        self.hq, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.kv_layer = kv_layer
        self.q_dim, self.kv_dim = num_heads * head_dim, num_kv_heads * head_dim

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident weight tensors (for weight_bytes; None for an absent bias)."""
        return [self.w_qkv_t, self.w_o_t, self.b_qkv, self.b_o]

    def __call__(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [T', H] normed hidden states (T' >= T = ctx.batch.num_tokens: rows past T are padding whose output is
        zero); ctx.cos, ctx.sin: [T', 1, d] rotary tables of the positions. Writes this layer's K/V of the T tokens
        to ctx.kv at batch.slot_mapping and returns the attention output [T', H]."""
        t_all = x.shape[0]
        batch, cos, sin, kv = ctx.batch, ctx.cos, ctx.sin, ctx.kv
        t = batch.num_tokens
        qkv = linear_t(x, self.w_qkv_t, self.b_qkv)[:t]
        qk = qkv[:, :self.q_dim + self.kv_dim].view(t, self.hq + self.hkv, self.d)
        qk = apply_rope(qk, cos[:t], sin[:t])
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = qkv[:, self.q_dim + self.kv_dim:].view(t, self.hkv, self.d)
        kv.write(self.kv_layer, batch.slot_mapping, k, v)
        out = paged_attend(q, kv, self.kv_layer, ctx.attn, t_all)
        return linear_t(out.reshape(t_all, self.q_dim), self.w_o_t, self.b_o)

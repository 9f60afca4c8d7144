"""Gated DeltaNet (GDN) linear-attention layer of the Qwen hybrids (`linear_attn`, MODELS.md §2.3).

    qkv|z|b|a = x @ [in_proj_qkv | in_proj_z | in_proj_b | in_proj_a]ᵀ      (one fused matmul)
    q|k|v     = silu(causal depthwise conv_K(qkv))                           (conv over q, k, v only)
    β = sigmoid(b);  g = −exp(A_log) · softplus(a + dt_bias)                 (fp32, per value head)
    o = gated delta rule(l2norm(q)·dk^-½, l2norm(k), v, g, β)                 (fp32 state [Hv, dk, dv])
    out = (RMSNorm(o) · w · silu(z)) @ out_projᵀ                              (gated RMSNorm, plain weight w)

The conv and the recurrence go through ignis_kernels.gdn. Each sequence carries its state in a state-store slot:
a prefill chunk (n > 1 tokens) runs the chunked kernels from the slot's conv + recurrent state and writes the
final state back; all single-token chunks of a batch run as one batched decode step (the kernels' `slots`
argument), updating their slots in place. Qwen3-Next's fused in_proj_qkvz / in_proj_ba are converted to this split
layout at load (ignisd.model.hybrid_weights.split_fused_gdn).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F

import ignis_kernels.gdn as kgdn
from ignisd.model.batch import ForwardBatch, ForwardContext
from ignisd.model.layers import linear_t


class SlotStates(Protocol):
    """What the GDN layers call on the per-slot state store (cache/state_store.py's StateStore is one)."""

    def buffer(self, name: str) -> torch.Tensor:
        """Buffer `name` of every slot, [num_slots, *shape], the storage itself: "recurrent" fp32
        [num_slots, n_gdn, Hv, dk, dv] and "conv" [num_slots, n_gdn, conv_dim, K−1] (ModelSpec.state_buffers)."""
        ...


@dataclass
class GDNPlan:
    """How one ForwardBatch's GDN layers split it, computed once per forward and shared by every GDN layer.

    prefill: per multi-token chunk (first row in T, n, state slot).
    decode_rows: LongTensor [B] rows of the single-token chunks; decode_slots: LongTensor [B] their state slots.
    all_decode: every row of the batch is a decode token, in row order (no gather/scatter needed).
    """

    prefill: list[tuple[int, int, int]]
    decode_rows: torch.Tensor | None
    decode_slots: torch.Tensor | None
    all_decode: bool

    @classmethod
    def from_batch(cls, batch: ForwardBatch) -> "GDNPlan":
        """Split `batch` by chunk size. Raises ValueError when a chunk has no state slot."""
        slots = batch.state_slots or [None] * len(batch.seq_lens)
        prefill, rows, dslots = [], [], []
        row = 0
        for i, (n, slot) in enumerate(zip(batch.seq_lens, slots)):
            if slot is None:
                raise ValueError(f"chunk {i} has no state_slot: a hybrid model needs one per sequence")
            if n == 1:
                rows.append(row)
                dslots.append(slot)
            else:
                prefill.append((row, n, slot))
            row += n
        dev = batch.input_ids.device
        d_rows = torch.tensor(rows, dtype=torch.long, device=dev) if rows else None
        d_slots = torch.tensor(dslots, dtype=torch.long, device=dev) if rows else None
        return cls(prefill, d_rows, d_slots, not prefill)


class GatedDeltaNet:
    """One GDN layer.

    w_qkv: [conv_dim, H] (channels [q all heads | k all heads | v all heads]); w_z: [Hv·dv, H]; w_b, w_a: [Hv, H];
    conv_w: [conv_dim, 1, K]; dt_bias, a_log: [Hv]; norm_w: [dv] (plain weight, ≈ 1); w_out: [H, Hv·dv].
    heads: (Hk, Hv, dk, dv). gdn_layer: this layer's index among the GDN layers (second dim of the state buffers).
    eps: RMSNorm ε.
    Projections are stored fused and transposed (see layers.linear_t).
    """

    def __init__(self, w_qkv: torch.Tensor, w_z: torch.Tensor, w_b: torch.Tensor, w_a: torch.Tensor,
                 conv_w: torch.Tensor, dt_bias: torch.Tensor, a_log: torch.Tensor, norm_w: torch.Tensor,
                 w_out: torch.Tensor, heads: tuple[int, int, int, int], gdn_layer: int, eps: float) -> None:
        self.hk, self.hv, self.dk, self.dv = heads
        self.key_dim, self.value_dim = self.hk * self.dk, self.hv * self.dv
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.w_in_t = torch.cat((w_qkv, w_z, w_b, w_a), dim=0).t().contiguous()
        self.conv_w = conv_w.reshape(self.conv_dim, -1).contiguous()
        self.dt_bias = dt_bias.float()
        self.neg_a = -a_log.float().exp()           # g = −exp(A_log)·softplus(a + dt_bias), MODELS.md §2.3
        self.norm_w = norm_w
        self.w_out_t = w_out.t().contiguous()
        self.gdn_layer = gdn_layer
        self.eps = eps

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The resident weight tensors (for weight_bytes)."""
        return [self.w_in_t, self.conv_w, self.dt_bias, self.neg_a, self.norm_w, self.w_out_t]

    def _split_heads(self, y: torch.Tensor, lead: tuple[int, ...]):
        kd = self.key_dim
        q = y[..., :kd].reshape(*lead, self.hk, self.dk)
        k = y[..., kd:2 * kd].reshape(*lead, self.hk, self.dk)
        v = y[..., 2 * kd:].reshape(*lead, self.hv, self.dv)
        return q, k, v

    def __call__(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [T', H] normed hidden states (T' >= T = ctx.batch.num_tokens; rows past T are padding whose output is
        zero). ctx.states (SlotStates): each sequence's slot (ctx.gdn plan) is read and updated. Returns [T', H]."""
        plan, states = ctx.gdn, ctx.states
        t_all, t = x.shape[0], ctx.batch.num_tokens
        c, vd, hv = self.conv_dim, self.value_dim, self.hv
        proj = linear_t(x, self.w_in_t)[:t]
        qkv, z = proj[:, :c], proj[:, c:c + vd]
        b, a = proj[:, c + vd:c + vd + hv], proj[:, c + vd + hv:]
        beta = torch.sigmoid(b)
        g = self.neg_a * F.softplus(a.float() + self.dt_bias)
        rec, conv = states.buffer("recurrent")[:, self.gdn_layer], states.buffer("conv")[:, self.gdn_layer]
        core = None if plan.all_decode else torch.empty(t, hv, self.dv, dtype=x.dtype, device=x.device)
        for row, n, slot in plan.prefill:
            xs = qkv[row:row + n].t().unsqueeze(0)                          # [1, C, n]
            y, new_conv = kgdn.causal_conv1d_prefill(xs, self.conv_w, conv[slot:slot + 1])
            conv[slot].copy_(new_conv[0])
            q, k, v = self._split_heads(y[0].t(), (1, n))
            o, final = kgdn.chunk_gated_delta_rule(q, k, v, g[None, row:row + n], beta[None, row:row + n],
                                                   initial_state=rec[slot:slot + 1])
            rec[slot].copy_(final[0])
            core[row:row + n] = o[0]
        if plan.decode_rows is not None:
            rows, slots = plan.decode_rows, plan.decode_slots
            xd, gd, bd = (qkv, g, beta) if plan.all_decode else (
                qkv.index_select(0, rows), g.index_select(0, rows), beta.index_select(0, rows))
            y = kgdn.causal_conv1d_step(xd, self.conv_w, conv, slots)            # [B, C]
            q, k, v = self._split_heads(y, (y.shape[0],))
            o = kgdn.recurrent_gated_delta_rule_step(q, k, v, gd, bd, rec, slots)  # [B, Hv, dv]
            if plan.all_decode:
                core = o
            else:
                core.index_copy_(0, rows, o)
        # gated RMSNorm over dv, shared across heads: normalise in fp32, × w, × silu(z) (Qwen3_5RMSNormGated)
        zf = z.reshape(t, hv, self.dv)
        cf = core.float()
        normed = (cf * torch.rsqrt(cf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)
        out = (self.norm_w * normed * F.silu(zf.float())).to(x.dtype)
        out = linear_t(out.reshape(t, vd), self.w_out_t)
        if t_all != t:
            out = F.pad(out, (0, 0, 0, t_all - t))
        return out

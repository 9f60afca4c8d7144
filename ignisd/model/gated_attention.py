"""Gated full attention of the Qwen hybrids (`self_attn`, MODELS.md §2.4), over the paged KV pool.

    q|gate = x @ q_projᵀ viewed [T, H, 2·hd]   (rows PER-HEAD INTERLEAVED: head h's q rows, then its gate rows)
    q = RMSNorm1p(q, q_norm);  k = RMSNorm1p(x @ k_projᵀ, k_norm)          (zero-centred: ·(1 + w), over hd)
    q, k = RoPE on the first rotary_dim = hd·partial_rotary_factor dims (rotate-half; the rest passes through)
    o = softmax(q kᵀ / √hd + causal) v         (GQA: head h reads kv head h // (H/Hkv))
    out = (o · sigmoid(gate)) @ o_projᵀ

The q_proj rows are de-interleaved once at load and fused with k, v and the gate into one matmul. The KV pool
stores k after its norm and RoPE, and v raw, exactly as transformers' cache does. Attention runs per sequence
through ignis_kernels.attention (decode tokens of several sequences in one call), planned by AttentionPlan.
"""
from __future__ import annotations

import torch

from ignisd.model.attention import store_and_attend
from ignisd.model.batch import ForwardContext
from ignisd.model.layers import apply_rope, linear_t, zero_centred_norm_weight


class GatedAttention:
    """One gated full-attention layer.

    w_q: [2·H·hd, Hd] (per-head interleaved q / gate rows, the checkpoint layout); w_k, w_v: [Hkv·hd, Hd];
    w_o: [Hd, H·hd]; q_norm, k_norm: [hd] zero-centred weights. num_heads H, num_kv_heads Hkv, head_dim hd,
    rotary_dim: counts; kv_layer: this layer's index among the attention layers (its layer in the KV store);
    eps: RMSNorm ε. Scale 1/√hd.
    """

    def __init__(self, w_q: torch.Tensor, w_k: torch.Tensor, w_v: torch.Tensor, w_o: torch.Tensor,
                 q_norm: torch.Tensor, k_norm: torch.Tensor, num_heads: int, num_kv_heads: int, head_dim: int,
                 rotary_dim: int, kv_layer: int, eps: float) -> None:
        h, hkv, d = num_heads, num_kv_heads, head_dim
        qg = w_q.reshape(h, 2, d, w_q.shape[-1])
        self.q_dim, self.kv_dim = h * d, hkv * d
        # fused [q (all heads) | k | v | gate (all heads)] rows, stored transposed
        self.w_t = torch.cat((qg[:, 0].reshape(h * d, -1), w_k, w_v, qg[:, 1].reshape(h * d, -1)), dim=0) \
            .t().contiguous()
        self.w_o_t = w_o.t().contiguous()
        # per-head norm multipliers for the q and k heads together: [H + Hkv, hd]
        self.qk_norm = torch.cat((zero_centred_norm_weight(q_norm).expand(h, d),
                                  zero_centred_norm_weight(k_norm).expand(hkv, d)), dim=0).contiguous()
        self.hq, self.hkv, self.d, self.rot = h, hkv, d, rotary_dim
        self.kv_layer, self.eps = kv_layer, eps

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The resident weight tensors (for weight_bytes)."""
        return [self.w_t, self.w_o_t, self.qk_norm]

    def __call__(self, x: torch.Tensor, ctx: ForwardContext) -> torch.Tensor:
        """x: [T', Hd] normed hidden states (T' >= T = ctx.batch.num_tokens; rows past T are padding, output zero);
        ctx.cos, ctx.sin: [T', 1, rotary_dim] rotary tables of the positions. Writes this layer's K/V of the T
        tokens to ctx.kv (store_and_attend) and returns [T', Hd]."""
        batch, cos, sin = ctx.batch, ctx.cos, ctx.sin
        t_all, t = x.shape[0], batch.num_tokens
        qd, kd = self.q_dim, self.kv_dim
        p = linear_t(x, self.w_t)[:t]
        qk = p[:, :qd + kd].reshape(t, self.hq + self.hkv, self.d).float()
        qk = qk * torch.rsqrt(qk.pow(2).mean(-1, keepdim=True) + self.eps) * self.qk_norm   # fp32
        r = self.rot
        if r == self.d:
            qk = apply_rope(qk, cos[:t], sin[:t])
        else:
            qk = torch.cat((apply_rope(qk[..., :r], cos[:t], sin[:t]), qk[..., r:]), dim=-1)
        qk = qk.to(x.dtype)
        q, k = qk[:, :self.hq], qk[:, self.hq:]
        v = p[:, qd + kd:qd + 2 * kd].reshape(t, self.hkv, self.d)
        gate = p[:, qd + 2 * kd:]
        out = store_and_attend(q, k, v, ctx, self.kv_layer, t_all).reshape(t_all, qd)
        if t_all == t:
            out = out * torch.sigmoid(gate)
        else:
            out = torch.cat((out[:t] * torch.sigmoid(gate), out[t:]), dim=0)
        return linear_t(out, self.w_o_t)

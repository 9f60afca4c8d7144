"""The torch definition of the fused llama decode step (llama_cpu.c's llama_decode), built from the other kernels'
references: norm/reference.rms_norm, linear/reference.int4_mm, attention/reference.paged_decode_attention, the
rotate-half RoPE of transformers' LlamaForCausalLM (apply_rotary_pos_emb) and SwiGLU (Shazeer 2020). The kernel is
tested against it (tests/kernels/test_llama_decode_cpu.py)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ignis_kernels.attention import reference as attention
from ignis_kernels.linear import reference as linear
from ignis_kernels.norm import reference as norm


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE: x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x2, x1). x [T, heads, d]; cos, sin [T, d]
    (the plain sin, not layers.Rotary's signed sin_rot)."""
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat((-x2, x1), dim=-1) * sin[:, None]


def llama_decode(layers: list[dict], x: torch.Tensor, geometry: tuple[int, int, int, int, float], cos: torch.Tensor,
                 sin: torch.Tensor, slots: torch.Tensor, ctx: torch.Tensor, pages: torch.Tensor,
                 page_tokens: int) -> torch.Tensor:
    """The residual stream after `layers` for T decode rows x fp32 [T, H]; writes each layer's new keys (after RoPE)
    and values into its pages at `slots`, as the kernel does.

    layers: per layer the operands llama_cpu.layer_table takes (w_in, w_post fp32 [H]; qkv, o, gate_up, down int4
    codes with their *_dm scales; k_pages, v_pages fp32 [slots, Hkv, d]). geometry: (Hq, Hkv, d, intermediate, eps).
    cos, sin: fp32 [T, d] of the rows' positions. slots: int64 [T]; ctx: int64 [T] context lengths including the
    new token; pages: int64 [T, W] page tables. Returns a new fp32 [T, H]."""
    hq, hkv, d, inter, eps = geometry
    t = x.shape[0]
    for w in layers:
        qkv = linear.int4_mm(norm.rms_norm(x, w["w_in"], eps), w["qkv"], w["qkv_dm"])
        q = rope(qkv[:, :hq * d].reshape(t, hq, d), cos, sin)
        k = rope(qkv[:, hq * d:(hq + hkv) * d].reshape(t, hkv, d), cos, sin)
        w["k_pages"][slots] = k
        w["v_pages"][slots] = qkv[:, (hq + hkv) * d:].reshape(t, hkv, d)
        kp, vp = (w[n].view(-1, page_tokens, hkv, d) for n in ("k_pages", "v_pages"))
        att = attention.paged_decode_attention(q, kp, vp, pages, ctx)
        x = x + linear.int4_mm(att.reshape(t, hq * d), w["o"], w["o_dm"])
        gu = linear.int4_mm(norm.rms_norm(x, w["w_post"], eps), w["gate_up"], w["gate_up_dm"])
        x = x + linear.int4_mm(F.silu(gu[:, :inter]) * gu[:, inter:], w["down"], w["down_dm"])
    return x

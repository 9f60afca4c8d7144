"""The fused CPU decode step of a llama model (ignis_kernels.decode.llama_cpu): which models and batches it serves,
and the operand tables it reads.

A Decoder whose every layer is llama attention + SwiGLU MLP with 4-bit weights the int4 C kernel takes (Int4Linear
with its kernel scales, no biases), plain RMSNorms and full rotary, runs a batch of only decode rows (at most
llama_cpu.MAX_ROWS, no padding rows) over dense fp32 KV pages in one C call for all its layers; every other forward
(prefill, the hybrids, bf16 or hq-e8-2b pages, bf16 / fp32 weights, batch_invariant) takes the per-operator path.
The two paths compute the same products and sums; RoPE and SiLU may round differently in the last bit.
"""
from __future__ import annotations

import torch

from ignis_kernels.decode import llama_cpu
from ignisd.model.attention import Attention
from ignisd.model.linear import Int4Linear


def _int4(lin) -> bool:
    """Whether a linear layer is a bias-free Int4Linear with the C kernel's scales, in whole blocks of 32."""
    return (isinstance(lin, Int4Linear) and lin.b is None and lin.dm is not None
            and lin.out_features % 32 == 0 and lin.in_features % 32 == 0)


class FusedDecode:
    """The fused step's per-model state: the layers' weight operands, and the C layer table per KV store.

    decoder: a hybrid.Decoder for which `why_not` returns ''. Attributes: geometry (Hq, Hkv, d, intermediate, eps).
    """

    def __init__(self, decoder) -> None:
        s = decoder.spec
        self.geometry = (s.num_heads, s.num_kv_heads, s.head_dim, s.intermediate_size, s.rms_norm_eps)
        self._weights = []
        for layer in decoder.layers:
            a, m = layer.mixer, layer.mlp
            self._weights.append({"w_in": layer.in_norm.weight, "w_post": layer.post_norm.weight,
                                  "qkv": a.qkv.packed, "qkv_dm": a.qkv.dm, "o": a.o.packed, "o_dm": a.o.dm,
                                  "gate_up": m.gate_up.packed, "gate_up_dm": m.gate_up.dm,
                                  "down": m.down.packed, "down_dm": m.down.dm})
        self._table = None           # (the KV buffers' addresses, the layer table over them)

    @staticmethod
    def why_not(decoder) -> str:
        """'' when `decoder` can take the fused step (module docstring) on this machine (the kernels built), else
        why not, in a few words."""
        s = decoder.spec
        if decoder.device.type != "cpu":
            return "not on the CPU"
        if s.is_hybrid:
            return "a hybrid model"
        if s.rotary_dim != s.head_dim or s.head_dim % 8 or s.head_dim > 256 or s.num_heads % s.num_kv_heads \
                or s.num_heads // s.num_kv_heads > 16 or decoder.dtype != torch.float32:
            return "a geometry outside the kernel"
        for layer in decoder.layers:
            a, m = layer.mixer, layer.mlp
            if type(a) is not Attention or not all(_int4(lin) for lin in (a.qkv, a.o, m.gate_up, m.down)):
                return "weights other than 4-bit ones the int4 kernel takes"
            if layer.in_norm.zero_centred or layer.post_norm.zero_centred or any(
                    w.dtype != torch.float32 or not w.is_contiguous()
                    for w in (layer.in_norm.weight, layer.post_norm.weight)):
                return "norms other than plain fp32 RMSNorm"
        return "" if llama_cpu.available() else llama_cpu.error() or "the kernel is off"

    def describe(self, kv_format: str, batch_invariant: bool) -> str:
        """The vram_plan's decode_step value when the step is fused for this model: which decode steps take it."""
        if kv_format != "fp32":
            return f"per operator (the fused step reads fp32 pages, not {kv_format})"
        if batch_invariant:
            return "per operator (batch_invariant pads the rows)"
        return f"cpu (fused C layers, 1 to {llama_cpu.MAX_ROWS} lanes)"

    @staticmethod
    def serves(batch, plan, kv) -> bool:
        """Whether this forward can take the fused step: only decode rows (plan: the AttentionPlan), at most
        llama_cpu.MAX_ROWS, dense fp32 pages (the fp32 format keeps no exact window)."""
        return (not plan.prefill and plan.decode_rows is not None and batch.num_tokens <= llama_cpu.MAX_ROWS
                and getattr(kv, "kv_format", "") == "fp32")

    def _layer_table(self, kv):
        """The C layer table over `kv`'s page buffers (rebuilt when the store's buffers are other tensors)."""
        k, v = kv.buffer("k"), kv.buffer("v")
        key = (k.data_ptr(), v.data_ptr(), k.shape, v.shape)
        if self._table is None or self._table[0] != key:
            if k.dtype != torch.float32 or not (k.is_contiguous() and v.is_contiguous()):
                raise ValueError("fused decode: the KV pages must be contiguous fp32")
            self._table = (key, llama_cpu.layer_table([{**w, "k_pages": k[i], "v_pages": v[i]}
                                                       for i, w in enumerate(self._weights)]), (k, v))
        return self._table[1]

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch, plan, kv) -> torch.Tensor:
        """Every layer over x [T, H] fp32 (the embedded rows) for the decode batch; returns the residual stream
        after the last layer (x itself, updated in place). cos, sin: the rotary tables [T, 1, d]; plan: the batch's
        AttentionPlan; kv: its KV store (the new keys and values are written into its pages)."""
        x = x.contiguous()
        llama_cpu.decode(self._layer_table(kv), x, self.geometry, cos.reshape(x.shape[0], -1).contiguous(),
                         sin.reshape(x.shape[0], -1).contiguous(), batch.slot_mapping.contiguous(),
                         plan.decode_lens.contiguous(), plan.decode_pages.contiguous(), kv.page_tokens)
        return x

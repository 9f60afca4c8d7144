"""Model: the straight-line decoder (embed -> layers -> norm -> lm_head) over a paged KV pool (DESIGN §3).

Only full-attention (llama) layers exist so far; GDN / MoE layers of the hybrids plug into the same loop later.
Weights are given with Hugging Face LlamaForCausalLM names (model.layers.{i}.self_attn.q_proj.weight, ...);
the loader produces them from GGUF or safetensors, Q/K rows already in HF rotate-half order.
"""
from __future__ import annotations

import torch

from ignisd.cache.device_pages import DevicePages
from ignisd.model.attention import Attention, AttentionPlan
from ignisd.model.batch import ForwardBatch, batch_logits, embed_rows
from ignisd.model.layers import MLP, Rotary, distinct_bytes, rms_norm, take_weight
from ignisd.model.spec import ModelSpec


class _Layer:
    """One decoder layer: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, attn: Attention, mlp: MLP, in_norm: torch.Tensor, post_norm: torch.Tensor, eps: float):
        self.attn, self.mlp, self.in_norm, self.post_norm, self.eps = attn, mlp, in_norm, post_norm, eps


def _cat(ws: list[torch.Tensor | None]) -> torch.Tensor | None:
    return None if ws[0] is None else torch.cat(ws, dim=0).contiguous()


class Model:
    """The decoder.

    spec: ModelSpec. weights: dict HF name -> tensor (consumed: entries are popped so fused copies replace them).
    Required per layer i (prefix `model.layers.{i}.`): input_layernorm.weight, post_attention_layernorm.weight,
    self_attn.{q,k,v,o}_proj.weight, mlp.{gate,up,down}_proj.weight (+ .bias when spec.attention_bias /
    spec.mlp_bias); plus model.embed_tokens.weight, model.norm.weight and lm_head.weight unless
    spec.tie_word_embeddings. Raises KeyError naming a missing tensor, ValueError on a shape mismatch.
    Computes in the weights' dtype (fp32 on CPU).

    batch_invariant: when True, every row's logits are bitwise independent of what else is in the batch (on CPU
    with MKL): a forward of fewer than 12 tokens is padded to a multiple of 4 rows, because MKL's sgemm takes a
    different (differently rounded) path for 1-3 rows, and for 5-11 rows at some thread counts, while every other
    row count gives identical rows. Costs ~2x the matmul time of a single-lane decode step; off by default
    (batched and alone then agree to ~1e-4 in the logits).
    """

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], batch_invariant: bool = False) -> None:
        self.spec = spec
        self.batch_invariant = batch_invariant
        w = weights

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return take_weight(w, name, shape)

        def maybe(name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
            return take(name, shape) if present else None

        s = spec
        h, d, inter = s.hidden_size, s.head_dim, s.intermediate_size
        qd, kd = s.num_heads * d, s.num_kv_heads * d
        self.embed = take("model.embed_tokens.weight", (s.vocab_size, h))
        self.norm = take("model.norm.weight", (h,))
        if s.tie_word_embeddings:
            w.pop("lm_head.weight", None)
            self.lm_head = self.embed
        else:
            self.lm_head = take("lm_head.weight", (s.vocab_size, h))
        self.layers: list[_Layer] = []
        kv_index = s.attention_layer_index
        for i in range(s.num_layers):
            p = f"model.layers.{i}."
            ab, mb = s.attention_bias, s.mlp_bias
            w_qkv = _cat([take(p + "self_attn.q_proj.weight", (qd, h)), take(p + "self_attn.k_proj.weight", (kd, h)),
                          take(p + "self_attn.v_proj.weight", (kd, h))])
            b_qkv = _cat([maybe(p + "self_attn.q_proj.bias", (qd,), ab), maybe(p + "self_attn.k_proj.bias", (kd,), ab),
                          maybe(p + "self_attn.v_proj.bias", (kd,), ab)])
            attn = Attention(w_qkv, take(p + "self_attn.o_proj.weight", (h, qd)), s.num_heads, s.num_kv_heads, d,
                             kv_index[i], b_qkv, maybe(p + "self_attn.o_proj.bias", (h,), ab))
            w_gu = _cat([take(p + "mlp.gate_proj.weight", (inter, h)), take(p + "mlp.up_proj.weight", (inter, h))])
            b_gu = _cat([maybe(p + "mlp.gate_proj.bias", (inter,), mb), maybe(p + "mlp.up_proj.bias", (inter,), mb)])
            mlp = MLP(w_gu, take(p + "mlp.down_proj.weight", (h, inter)), b_gu,
                      maybe(p + "mlp.down_proj.bias", (h,), mb))
            self.layers.append(_Layer(attn, mlp, take(p + "input_layernorm.weight", (h,)),
                                      take(p + "post_attention_layernorm.weight", (h,)), s.rms_norm_eps))
        self.rotary = Rotary(spec, device=self.embed.device)
        self.device = self.embed.device
        self.dtype = self.embed.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of all distinct weight tensors (the tied head counted once)."""
        ts = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            a, m = layer.attn, layer.mlp
            ts += [a.w_qkv_t, a.w_o_t, a.b_qkv, a.b_o, m.w_gate_up_t, m.w_down_t, m.b_gate_up, m.b_down,
                   layer.in_norm, layer.post_norm]
        return distinct_bytes(ts)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: DevicePages, states=None) -> torch.Tensor:
        """Run every token of `batch` through the model, writing its K/V into `kv`.

        states: unused (an all-attention model keeps no per-sequence state; accepted so every model class takes
        the same call as qwen_hybrid.HybridModel.forward).

        batch: ForwardBatch (T tokens of one or more sequences, prefill chunks and decode tokens mixed); the slots of
        batch.slot_mapping must belong to the sequences (the caller's page allocation).
        kv: DevicePages for this spec (fp32 or bf16 storage; attention upcasts to fp32).
        Returns float32 logits [N, vocab] for the rows batch.logits_index, in chunk order (N may be 0).
        """
        if kv.spec.n_attention_layers != self.spec.n_attention_layers:
            raise ValueError("DevicePages was built for a different model")
        plan = AttentionPlan.from_batch(batch)
        x, positions = embed_rows(batch, self.embed, self.batch_invariant)
        max_pos = max(c - 1 for c in batch.context_lens)
        cos, sin = self.rotary.tables(positions, max_pos)
        for layer in self.layers:
            x = x + layer.attn(rms_norm(x, layer.in_norm, layer.eps), cos, sin, batch, plan, kv)
            x = x + layer.mlp(rms_norm(x, layer.post_norm, layer.eps))
        return batch_logits(x, batch, lambda h: rms_norm(h, self.norm, self.spec.rms_norm_eps), self.lm_head,
                            self.batch_invariant)

    __call__ = forward

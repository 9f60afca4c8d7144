"""HybridModel: the straight-line decoder of the Qwen hybrids, Qwen3.5 and Qwen3-Next (MODELS.md §2.2):

    h = embed_tokens[ids]
    for each layer i:
        h = h + (GatedDeltaNet if layer_types[i] == "linear_attention" else GatedAttention)(RMSNorm1p(h))
        h = h + (SparseMoE if i in moe_layers else SwiGLU MLP)(RMSNorm1p(h))
    logits = RMSNorm1p(h) @ lm_headᵀ

RMSNorm1p is the zero-centred norm x/√(mean(x²)+ε)·(1 + w). Attention layers keep K/V in the paged pool
(DevicePages); GDN layers keep their recurrent + conv state in a DeviceStates slot per sequence (SeqChunk.state_slot).
Weights are given with transformers' Qwen3_5ForCausalLM / Qwen3NextForCausalLM names, GDN projections already split
(hybrid_weights.split_fused_gdn) and the `model.language_model.` prefix already removed (the loader does both).
"""
from __future__ import annotations

import dataclasses

import torch

from ignisd.cache.device_pages import DevicePages
from ignisd.model.attention import AttentionPlan
from ignisd.model.batch import ForwardBatch, batch_logits, embed_rows
from ignisd.model.gated_attention import GatedAttention, rms_norm_1p, zero_centred_norm_weight
from ignisd.model.gdn import GatedDeltaNet, GDNPlan
from ignisd.model.hybrid_weights import expert_tensors
from ignisd.model.layers import MLP, Rotary, distinct_bytes, take_weight
from ignisd.model.moe import SparseMoE, module_tensors
from ignisd.model.spec import ModelSpec


class _Layer:
    """One decoder layer: mixer (GatedDeltaNet | GatedAttention), mlp (MLP | SparseMoE), norm multipliers 1 + w."""

    def __init__(self, mixer, mlp, in_norm: torch.Tensor, post_norm: torch.Tensor) -> None:
        self.mixer, self.mlp, self.in_norm, self.post_norm = mixer, mlp, in_norm, post_norm
        self.is_gdn = isinstance(mixer, GatedDeltaNet)


class HybridModel:
    """The Qwen3.5 / Qwen3-Next decoder.

    spec: ModelSpec with spec.is_hybrid. weights: dict name -> tensor (consumed). Required, prefix
    `model.layers.{i}.`: input_layernorm.weight, post_attention_layernorm.weight; GDN layers
    linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj}.weight, linear_attn.conv1d.weight,
    linear_attn.{dt_bias, A_log}, linear_attn.norm.weight; attention layers self_attn.{q,k,v,o}_proj.weight,
    self_attn.{q,k}_norm.weight; dense layers mlp.{gate,up,down}_proj.weight; MoE layers mlp.gate.weight, the experts
    (hybrid_weights.expert_tensors), mlp.shared_expert.{gate,up,down}_proj.weight, mlp.shared_expert_gate.weight;
    plus model.embed_tokens.weight, model.norm.weight and lm_head.weight unless tied.
    Raises KeyError naming a missing tensor, ValueError on a shape mismatch or attention biases (not in either
    family). Computes in the weights' dtype (fp32 on CPU); the delta-rule state is always fp32.

    batch_invariant: pads short batches to a multiple of 4 rows in the matmuls as ignisd.model.hybrid.Model does
    (padding rows go through no conv, recurrence or attention). Bitwise batch independence is NOT established for
    the hybrids: measured batched-vs-alone differences stay ~2e-6 in the logits with it on (MoE experts see a
    batch-dependent number of rows, and prefill row counts differ), so treat it as a no-op here.
    """

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], batch_invariant: bool = False) -> None:
        if not spec.is_hybrid:
            raise ValueError(f"HybridModel runs the Qwen hybrids, not {spec.arch!r}")
        if spec.attention_bias:
            raise ValueError("attention biases are not supported for the Qwen hybrids")
        self.spec = spec
        self.batch_invariant = batch_invariant
        w = weights

        def take(name: str, shape: tuple[int, ...]) -> torch.Tensor:
            return take_weight(w, name, shape)

        s = spec
        h, d, eps = s.hidden_size, s.head_dim, s.rms_norm_eps
        qd, kd = s.num_heads * d, s.num_kv_heads * d
        hk, hv, dk, dv = s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, \
            s.linear_value_head_dim
        cd, vd, kk = s.conv_dim, hv * dv, s.linear_conv_kernel_dim
        self.embed = take("model.embed_tokens.weight", (s.vocab_size, h))
        self.norm = zero_centred_norm_weight(take("model.norm.weight", (h,)))
        if s.tie_word_embeddings:
            w.pop("lm_head.weight", None)
            self.lm_head = self.embed
        else:
            self.lm_head = take("lm_head.weight", (s.vocab_size, h))
        kv_index, gdn_index = s.attention_layer_index, s.gdn_layer_index
        moe = set(s.moe_layers)
        self.layers: list[_Layer] = []
        for i, kind in enumerate(s.layer_types):
            p = f"model.layers.{i}."
            if kind == "linear_attention":
                a = p + "linear_attn."
                mixer = GatedDeltaNet(
                    take(a + "in_proj_qkv.weight", (cd, h)), take(a + "in_proj_z.weight", (vd, h)),
                    take(a + "in_proj_b.weight", (hv, h)), take(a + "in_proj_a.weight", (hv, h)),
                    take(a + "conv1d.weight", (cd, 1, kk)), take(a + "dt_bias", (hv,)), take(a + "A_log", (hv,)),
                    take(a + "norm.weight", (dv,)), take(a + "out_proj.weight", (h, vd)),
                    (hk, hv, dk, dv), gdn_index[i], eps)
            else:
                a = p + "self_attn."
                mixer = GatedAttention(
                    take(a + "q_proj.weight", (2 * qd, h)), take(a + "k_proj.weight", (kd, h)),
                    take(a + "v_proj.weight", (kd, h)), take(a + "o_proj.weight", (h, qd)),
                    take(a + "q_norm.weight", (d,)), take(a + "k_norm.weight", (d,)),
                    s.num_heads, s.num_kv_heads, d, s.rotary_dim, kv_index[i], eps)
            m = p + "mlp."
            if i in moe:
                e, mi, si = s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
                gate_up, down = expert_tensors(w, m, e)
                if tuple(gate_up.shape) != (e, 2 * mi, h) or tuple(down.shape) != (e, h, mi):
                    raise ValueError(f"{m}experts: gate_up {tuple(gate_up.shape)} / down {tuple(down.shape)}, "
                                     f"expected {(e, 2 * mi, h)} / {(e, h, mi)}")
                sh = m + "shared_expert."
                shared = MLP(torch.cat((take(sh + "gate_proj.weight", (si, h)), take(sh + "up_proj.weight", (si, h)))),
                             take(sh + "down_proj.weight", (h, si)))
                mlp = SparseMoE(take(m + "gate.weight", (e, h)), gate_up, down, shared,
                                take(m + "shared_expert_gate.weight", (1, h)), s.num_experts_per_tok,
                                s.norm_topk_prob)
            else:
                inter = s.intermediate_size
                mlp = MLP(torch.cat((take(m + "gate_proj.weight", (inter, h)), take(m + "up_proj.weight", (inter, h)))),
                          take(m + "down_proj.weight", (h, inter)))
            self.layers.append(_Layer(mixer, mlp, zero_centred_norm_weight(take(p + "input_layernorm.weight", (h,))),
                                      zero_centred_norm_weight(take(p + "post_attention_layernorm.weight", (h,)))))
        # rotary tables over the rotated dims only (inv_freq = θ^(−2i/rotary_dim), transformers' partial rotary)
        self.rotary = Rotary(dataclasses.replace(spec, head_dim=spec.rotary_dim, partial_rotary_factor=1.0),
                             device=self.embed.device)
        self.device = self.embed.device
        self.dtype = self.embed.dtype

    @property
    def weight_bytes(self) -> int:
        """Bytes of all distinct weight tensors (the tied head counted once)."""
        ts = [self.embed, self.norm, self.lm_head]
        for layer in self.layers:
            mlp = layer.mlp
            ts += [*layer.mixer.tensors, *(mlp.tensors if isinstance(mlp, SparseMoE) else module_tensors(mlp)),
                   layer.in_norm, layer.post_norm]
        return distinct_bytes(ts)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: DevicePages, states=None) -> torch.Tensor:
        """Run every token of `batch` through the model, writing K/V into `kv` and GDN state into `states`.

        batch: ForwardBatch (prefill chunks and decode tokens of several sequences mixed; each chunk carries its
        sequence's state_slot, distinct within the batch). kv: DevicePages for this spec. states: DeviceStates for
        this spec (required when the model has GDN layers): each sequence's slot holds its state at position
        `start` on entry (zeros at start 0 — the caller zeroes; forward never does) and at start + n on return.
        Returns float32 logits [N, vocab] for the rows batch.logits_index, in chunk order (N may be 0).
        Raises ValueError for pools of another model or a chunk without a state slot.
        """
        if kv.spec.n_attention_layers != self.spec.n_attention_layers:
            raise ValueError("DevicePages was built for a different model")
        gplan = None
        if self.spec.n_gdn_layers:
            if states is None or states.spec.n_gdn_layers != self.spec.n_gdn_layers or \
                    states.recurrent.shape[2:] != (self.spec.linear_num_value_heads, self.spec.linear_key_head_dim,
                                                   self.spec.linear_value_head_dim):
                raise ValueError("a hybrid model's forward needs the DeviceStates of this model")
            gplan = GDNPlan.from_batch(batch)
        plan = AttentionPlan.from_batch(batch)
        x, positions = embed_rows(batch, self.embed, self.batch_invariant)
        max_pos = max(c - 1 for c in batch.context_lens)
        cos, sin = self.rotary.tables(positions, max_pos)
        eps = self.spec.rms_norm_eps
        for layer in self.layers:
            hn = rms_norm_1p(x, layer.in_norm, eps)
            if layer.is_gdn:
                x = x + layer.mixer(hn, batch, gplan, states)
            else:
                x = x + layer.mixer(hn, cos, sin, batch, plan, kv)
            x = x + layer.mlp(rms_norm_1p(x, layer.post_norm, eps))
        return batch_logits(x, batch, lambda h: rms_norm_1p(h, self.norm, eps), self.lm_head,
                            self.batch_invariant)

    __call__ = forward

"""Decoder: the straight-line model (embed → layers → norm → lm_head) of every family this build runs (DESIGN §3),
Llama and the Qwen hybrids Qwen3.5 (dense MLP) and Qwen3-Next (MoE) (MODELS.md §2.2):

    h = embed_tokens[ids]
    for each layer i:
        h = h + mixer_i(norm(h))       mixer: Attention (llama) | GatedAttention | GatedDeltaNet (layer_types[i])
        h = h + mlp_i(norm(h))         mlp: SwiGLU MLP | SparseMoE (i in moe_layers)
    logits = norm(h) @ lm_headᵀ

norm is plain RMSNorm on llama and the zero-centred x/√(mean(x²)+ε)·(1 + w) on the hybrids (layers.RMSNorm).
Attention layers keep K/V in the paged KV store (the PagedKV protocol of ignis_kernels.attention); GDN layers keep
their recurrent + conv state in a state-store slot per sequence (SeqChunk.state_slot; gdn.SlotStates).
Weights are given with transformers' names (LlamaForCausalLM, Qwen3_5ForCausalLM / Qwen3NextForCausalLM): the loader
maps GGUF names, un-permutes GGUF Q/K rows, strips Qwen3.5's `model.language_model.` prefix and splits Qwen3-Next's
fused GDN projections (hybrid_weights.split_fused_gdn) before this class sees them.
"""
from __future__ import annotations

import torch

from ignis_kernels.attention import PagedKV
from ignisd.model.attention import Attention, AttentionPlan
from ignisd.model.batch import ForwardBatch, ForwardContext, batch_logits, embed_rows
from ignisd.model.fused_decode import FusedDecode
from ignisd.model.gated_attention import GatedAttention
from ignisd.model.gdn import GatedDeltaNet, GDNPlan, SlotStates
from ignisd.model.hybrid_weights import expert_tensors
from ignisd.model.layers import MLP, RMSNorm, Rotary, distinct_bytes, take_weight
from ignisd.model.linear import make_linear
from ignisd.model.lm_head import DenseTable, QuantTable
from ignisd.model.moe import SparseMoE
from ignisd.model.quant import GroupQuant, cat_rows
from ignisd.model.spec import ModelSpec


class _Layer:
    """One decoder layer: x + mixer(in_norm(x)), then x + mlp(post_norm(x))."""

    def __init__(self, mixer, mlp, in_norm: RMSNorm, post_norm: RMSNorm) -> None:
        self.mixer, self.mlp, self.in_norm, self.post_norm = mixer, mlp, in_norm, post_norm


def _cat(ws: list) -> torch.Tensor | GroupQuant | None:
    """Concatenate weights (dense tensors or GroupQuants) along the output rows; None for absent biases."""
    if ws[0] is None:
        return None
    if isinstance(ws[0], GroupQuant):
        return cat_rows(ws)
    return torch.cat(ws, dim=0).contiguous()


class _Weights:
    """The checkpoint tensors of one model, taken (popped) by name with their expected shapes; `linear` builds a
    projection in the model's weight format (linear.make_linear)."""

    def __init__(self, weights: dict, weight_format: str = "fp32") -> None:
        self.w, self.weight_format = weights, weight_format

    def linear(self, w, b=None):
        return make_linear(w, b, self.weight_format)

    def take(self, name: str, shape: tuple[int, ...]) -> torch.Tensor:
        return take_weight(self.w, name, shape)

    def maybe(self, name: str, shape: tuple[int, ...], present: bool) -> torch.Tensor | None:
        return self.take(name, shape) if present else None


def _llama_attention(w: _Weights, p: str, s: ModelSpec, kv_layer: int) -> Attention:
    """Llama self_attn: q, k, v fused into one projection, optional biases."""
    h, d, ab = s.hidden_size, s.head_dim, s.attention_bias
    qd, kd = s.num_heads * d, s.num_kv_heads * d
    a = p + "self_attn."
    w_qkv = _cat([w.take(a + "q_proj.weight", (qd, h)), w.take(a + "k_proj.weight", (kd, h)),
                  w.take(a + "v_proj.weight", (kd, h))])
    b_qkv = _cat([w.maybe(a + "q_proj.bias", (qd,), ab), w.maybe(a + "k_proj.bias", (kd,), ab),
                  w.maybe(a + "v_proj.bias", (kd,), ab)])
    o = w.linear(w.take(a + "o_proj.weight", (h, qd)), w.maybe(a + "o_proj.bias", (h,), ab))
    return Attention(w.linear(w_qkv, b_qkv), o, s.num_heads, s.num_kv_heads, d, kv_layer)


def _gated_attention(w: _Weights, p: str, s: ModelSpec, kv_layer: int) -> GatedAttention:
    """A hybrid's gated self_attn (q_proj carries the gate, per-head q/k norms, partial rotary)."""
    h, d = s.hidden_size, s.head_dim
    qd, kd = s.num_heads * d, s.num_kv_heads * d
    a = p + "self_attn."
    return GatedAttention(
        w.take(a + "q_proj.weight", (2 * qd, h)), w.take(a + "k_proj.weight", (kd, h)),
        w.take(a + "v_proj.weight", (kd, h)), w.take(a + "o_proj.weight", (h, qd)),
        w.take(a + "q_norm.weight", (d,)), w.take(a + "k_norm.weight", (d,)),
        s.num_heads, s.num_kv_heads, d, s.rotary_dim, kv_layer, s.rms_norm_eps)


def _gdn(w: _Weights, p: str, s: ModelSpec, gdn_layer: int) -> GatedDeltaNet:
    """A hybrid's linear_attn (Gated DeltaNet), projections already split."""
    h = s.hidden_size
    hk, hv, dk, dv = s.linear_num_key_heads, s.linear_num_value_heads, s.linear_key_head_dim, s.linear_value_head_dim
    cd, vd, kk = s.conv_dim, hv * dv, s.linear_conv_kernel_dim
    a = p + "linear_attn."
    return GatedDeltaNet(
        w.take(a + "in_proj_qkv.weight", (cd, h)), w.take(a + "in_proj_z.weight", (vd, h)),
        w.take(a + "in_proj_b.weight", (hv, h)), w.take(a + "in_proj_a.weight", (hv, h)),
        w.take(a + "conv1d.weight", (cd, 1, kk)), w.take(a + "dt_bias", (hv,)), w.take(a + "A_log", (hv,)),
        w.take(a + "norm.weight", (dv,)), w.take(a + "out_proj.weight", (h, vd)), (hk, hv, dk, dv), gdn_layer,
        s.rms_norm_eps)


def _mlp(w: _Weights, p: str, s: ModelSpec) -> MLP:
    """The dense SwiGLU mlp (gate and up fused), optional biases (llama's mlp_bias)."""
    h, inter, mb = s.hidden_size, s.intermediate_size, s.mlp_bias
    m = p + "mlp."
    w_gu = _cat([w.take(m + "gate_proj.weight", (inter, h)), w.take(m + "up_proj.weight", (inter, h))])
    b_gu = _cat([w.maybe(m + "gate_proj.bias", (inter,), mb), w.maybe(m + "up_proj.bias", (inter,), mb)])
    return MLP(w.linear(w_gu, b_gu), w.linear(w.take(m + "down_proj.weight", (h, inter)),
                                            w.maybe(m + "down_proj.bias", (h,), mb)))


def _moe(w: _Weights, p: str, s: ModelSpec) -> SparseMoE:
    """Qwen3-Next's sparse MoE block: router, experts (hybrid_weights.expert_tensors), gated shared expert."""
    h, e, mi, si = s.hidden_size, s.num_experts, s.moe_intermediate_size, s.shared_expert_intermediate_size
    m = p + "mlp."
    gate_up, down = expert_tensors(w.w, m, e)
    if tuple(gate_up.shape) != (e, 2 * mi, h) or tuple(down.shape) != (e, h, mi):
        raise ValueError(f"{m}experts: gate_up {tuple(gate_up.shape)} / down {tuple(down.shape)}, "
                         f"expected {(e, 2 * mi, h)} / {(e, h, mi)}")
    sh = m + "shared_expert."
    shared = MLP(torch.cat((w.take(sh + "gate_proj.weight", (si, h)), w.take(sh + "up_proj.weight", (si, h)))),
                 w.take(sh + "down_proj.weight", (h, si)))
    return SparseMoE(w.take(m + "gate.weight", (e, h)), gate_up, down, shared,
                     w.take(m + "shared_expert_gate.weight", (1, h)), s.num_experts_per_tok, s.norm_topk_prob)


def _fits(states: SlotStates | None, shapes: dict[str, tuple[int, ...]]) -> bool:
    """Whether `states` holds a buffer of each name with that per-slot shape."""
    if states is None:
        return False
    try:
        return all(tuple(states.buffer(name).shape[1:]) == shape for name, shape in shapes.items())
    except KeyError:
        return False


def _has(states, name: str) -> bool:
    """Whether `states` (a state store or None) holds buffer `name`."""
    if states is None:
        return False
    try:
        states.buffer(name)
    except KeyError:
        return False
    return True


def _table(w, weight_format: str):
    """The token table (embedding / LM head) of weight `w` [V, H] (tensor or GroupQuant) in `weight_format`:
    native keeps a GroupQuant quantized (lm_head.QuantTable), bf16 a bf16 dense copy, fp32 the fp32 table."""
    if isinstance(w, GroupQuant):
        if weight_format == "native":
            return QuantTable(w)
        w = w.dequantize()
    return DenseTable(w.to(torch.bfloat16) if weight_format == "bf16" else w)


class Decoder:
    """The decoder of every supported family (spec.arch: llama, qwen3_5, qwen3_next).

    spec: ModelSpec. weights: dict HF name -> tensor (consumed: entries are popped so fused copies replace them).
    Required, prefix `model.layers.{i}.`: input_layernorm.weight, post_attention_layernorm.weight, and
    - llama attention layers: self_attn.{q,k,v,o}_proj.weight (+ .bias when spec.attention_bias); hybrid attention
      layers: self_attn.{q,k,v,o}_proj.weight, self_attn.{q,k}_norm.weight; GDN layers:
      linear_attn.{in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj}.weight, linear_attn.conv1d.weight,
      linear_attn.{dt_bias, A_log}, linear_attn.norm.weight;
    - dense layers: mlp.{gate,up,down}_proj.weight (+ .bias when spec.mlp_bias); MoE layers (spec.moe_layers):
      mlp.gate.weight, the experts (hybrid_weights.expert_tensors), mlp.shared_expert.{gate,up,down}_proj.weight,
      mlp.shared_expert_gate.weight;
    plus model.embed_tokens.weight, model.norm.weight and lm_head.weight unless spec.tie_word_embeddings.
    Raises KeyError naming a missing tensor, ValueError on a shape mismatch or attention biases on a hybrid.
    weight_format: "fp32" (every matmul an fp32 DenseLinear: the oracle reference), "native" (GroupQuant weights of
    a GGUF run by the int4 kernels, ignisd.model.linear, and a quantized token table, lm_head.QuantTable; dense
    tensors as given) or "bf16" (llama's projections, dense MLPs and the token table in bf16; the hybrids' GDN, gated
    attention and MoE experts stay fp32). The residual stream, norms, rotary and
    attention are fp32 in every format; the delta-rule state is always fp32. Weights may be GroupQuant only on llama
    layers (attention q/k/v/o, mlp gate/up/down) and the token table.

    batch_invariant: when True, a forward of fewer than 16 tokens is padded to 16 rows in the matmuls
    (batch.matmul_rows), because MKL's sgemm takes differently rounded paths by row count (1-3 rows on AVX2 CPUs,
    1 and 2-15 on AVX-512 ones). On llama every row's logits are then bitwise independent of what else is in the
    batch (on CPU with MKL, at one thread; at two, some shapes change path again between 57 and 128 rows on an
    AVX-512 Xeon), at ~3x the matmul time of a single-lane decode step. Off by default (batched and alone then agree
    to ~1e-4 in the logits). Bitwise batch independence is NOT established for the hybrids (padding rows go through
    no conv, recurrence or attention, but MoE experts see a batch-dependent number of rows and prefill row counts
    differ: batched-vs-alone stays ~2e-6 in the logits with it on), so treat it as a no-op there.
    Attributes: spec, layers (mixer, mlp, in_norm, post_norm each), embed, norm, lm_head, rotary, device, dtype.
    """

    def __init__(self, spec: ModelSpec, weights: dict, batch_invariant: bool = False,
                 weight_format: str = "fp32") -> None:
        if spec.is_hybrid and spec.attention_bias:
            raise ValueError("attention biases are not supported for the Qwen hybrids")
        self.spec = spec
        self.batch_invariant = batch_invariant
        self.weight_format = weight_format
        s, w = spec, _Weights(weights, weight_format)
        h, eps, zc = s.hidden_size, s.rms_norm_eps, s.is_hybrid
        self.embed = _table(w.take("model.embed_tokens.weight", (s.vocab_size, h)), weight_format)
        self.norm = RMSNorm(w.take("model.norm.weight", (h,)), eps, zc)
        if s.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
            self.lm_head = self.embed
        else:
            self.lm_head = _table(w.take("lm_head.weight", (s.vocab_size, h)), weight_format)
        kv_index, gdn_index, moe = s.attention_layer_index, s.gdn_layer_index, set(s.moe_layers)
        self.layers: list[_Layer] = []
        for i, kind in enumerate(s.layer_types):
            p = f"model.layers.{i}."
            if kind == "linear_attention":
                mixer = _gdn(w, p, s, gdn_index[i])
            elif s.is_hybrid:
                mixer = _gated_attention(w, p, s, kv_index[i])
            else:
                mixer = _llama_attention(w, p, s, kv_index[i])
            mlp = _moe(w, p, s) if i in moe else _mlp(w, p, s)
            self.layers.append(_Layer(mixer, mlp, RMSNorm(w.take(p + "input_layernorm.weight", (h,)), eps, zc),
                                      RMSNorm(w.take(p + "post_attention_layernorm.weight", (h,)), eps, zc)))
        self.device = self.norm.weight.device
        self.dtype = self.norm.weight.dtype if weight_format == "fp32" else torch.float32   # the residual stream's
        self.rotary = Rotary(spec, device=self.device)    # over the rotated dims only (spec.rotary_dim)
        self._state_shapes = {b.name: b.shape for b in spec.state_buffers()}
        self._fused_why = FusedDecode.why_not(self)
        self._fused = None if self._fused_why else FusedDecode(self)    # the CPU decode step in one C call

    def decode_step(self, kv_format: str) -> str:
        """What runs a decode step's layers, for the vram_plan line: "cpu (fused C layers, ...)" (FusedDecode) or
        "per operator (why not fused)". kv_format: the KV pool's format name."""
        if self._fused is None:
            return f"per operator ({self._fused_why})"
        return self._fused.describe(kv_format, self.batch_invariant)

    @property
    def weight_bytes(self) -> int:
        """Bytes of all distinct weight tensors (the tied head counted once; the hybrids' norm multipliers 1 + w
        and per-head q/k norms as held)."""
        ts = [*self.embed.tensors, self.norm.weight, *self.lm_head.tensors]
        for layer in self.layers:
            ts += [*layer.mixer.tensors, *layer.mlp.tensors, layer.in_norm.weight, layer.post_norm.weight]
        return distinct_bytes(ts)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: PagedKV, states: SlotStates | None = None) -> torch.Tensor:
        """Run every token of `batch` through the model, writing K/V into `kv` and GDN state into `states`.

        batch: ForwardBatch (prefill chunks and decode tokens of several sequences mixed); the slots of
        batch.slot_mapping must belong to the sequences (the caller's page allocation); on a model with GDN layers
        each chunk carries its sequence's state_slot, distinct within the batch.
        kv: the KV store of this model's geometry (PagedKV; fp32 or bf16 dense pages, attention upcasts to fp32;
        or hq-e8-2b pages, whose exact window lives in the state store).
        states: the state store (required when the model has GDN layers — its "recurrent" and "conv" buffers as
        spec.state_buffers() lists them — or the KV format keeps an exact window — "kv_window", "kv_sinks"): each
        sequence's slot holds its state at position `start` on entry (zeros at start 0 — the caller zeroes; forward
        never does) and at start + n on return. Unused otherwise.
        Returns float32 logits [N, vocab] for the rows batch.logits_index, in chunk order (N may be 0).
        Raises ValueError for a KV or state store of another model, or a chunk without a state slot.
        """
        s = self.spec
        if kv.n_attention_layers != s.n_attention_layers:
            raise ValueError(f"the KV store holds {kv.n_attention_layers} attention layers, the model has "
                             f"{s.n_attention_layers}: built for a different model")
        gplan = None
        if s.n_gdn_layers:
            if not _fits(states, self._state_shapes):
                raise ValueError("a hybrid model's forward needs the state store (StateStore) of this model's "
                                 "state_buffers()")
            gplan = GDNPlan.from_batch(batch)
        if getattr(kv, "exact_window_pages", None) is not None and not _has(states, "kv_window"):
            raise ValueError(f"KV format {getattr(kv, 'kv_format', '?')!r} keeps an exact window: the forward needs "
                             f"the state store holding its \"kv_window\" buffer")
        x, positions = embed_rows(batch, self.embed, self.batch_invariant)
        cos, sin = self.rotary.tables(positions, max(c - 1 for c in batch.context_lens))
        aplan = AttentionPlan.from_batch(batch, single=not self.batch_invariant)
        if self._fused is not None and not self.batch_invariant and FusedDecode.serves(batch, aplan, kv):
            x = self._fused.run(x, cos, sin, batch, aplan, kv, states)
            return batch_logits(x, batch, self.norm, self.lm_head, self.batch_invariant)
        ctx = ForwardContext(batch, cos, sin, aplan, gplan, kv, states)
        for layer in self.layers:
            x = x + layer.mixer(layer.in_norm(x), ctx)
            x = x + layer.mlp(layer.post_norm(x))
        return batch_logits(x, batch, self.norm, self.lm_head, self.batch_invariant)

    __call__ = forward

"""The fused CPU decode step of a llama model (ignis_kernels.decode.llama_cpu): which models and batches it serves,
and the operand tables it reads.

A Decoder whose every layer is llama attention + SwiGLU MLP with 4-bit weights the int4 C kernel takes (Int4Linear
with its kernel scales, no biases), plain RMSNorms and full rotary, runs a batch of only decode rows (at most
llama_cpu.MAX_ROWS, no padding rows) in one C call for all its layers, over dense fp32 KV pages or over hq-e8-2b
pages with an fp32 exact window (whose events, a page leaving the window or a centre fixed, run first: the store's
prepare_decode); every other forward (prefill, the hybrids, bf16 pages, bf16 / fp32 weights, batch_invariant,
hq-e8-2b under IGNIS_HQ_ATTENTION other than the C kernel) takes the per-operator path. The two paths compute the
same products and sums; RoPE and SiLU may round differently in the last bit.
"""
from __future__ import annotations

import ctypes
import math

import torch

from ignis_kernels.attention import hq_backend, hq_cpu
from ignis_kernels.attention.hq_decode import word_table
from ignis_kernels.attention.hq_reference import variance_correction
from ignis_kernels.decode import llama_cpu
from ignisd.model.attention import Attention
from ignisd.model.linear import Int4Linear

FORMATS = ("fp32", "hq-e8-2b")
"""The KV formats whose pages the fused step reads."""


def _int4(lin) -> bool:
    """Whether a linear layer is a bias-free Int4Linear with the C kernel's scales, in whole blocks of 32."""
    return (isinstance(lin, Int4Linear) and lin.b is None and lin.dm is not None
            and lin.out_features % 32 == 0 and lin.in_features % 32 == 0)


def _format_why_not(kv_format: str) -> str:
    """'' when the fused step can read `kv_format` pages here, else why not."""
    if kv_format not in FORMATS:
        return f"the fused step reads fp32 or hq-e8-2b pages, not {kv_format}"
    why = llama_cpu.error(kv_format)
    if why:
        return why
    if kv_format == "hq-e8-2b" and hq_backend(torch.device("cpu")) != "cpu":
        return "IGNIS_HQ_ATTENTION picks another hq-e8-2b backend"
    return ""


def _window_strides(t: torch.Tensor, name: str) -> tuple[int, int, int, int]:
    """(slot, kind, position, head) strides in floats of a state buffer's layer view [slots, 2, n, Hkv, d] fp32 with
    unit stride in d. Raises ValueError otherwise."""
    if t.dtype != torch.float32 or t.stride(-1) != 1:
        raise ValueError(f"fused decode: the state buffer {name} must be fp32 with unit stride in head_dim")
    return t.stride(0), t.stride(1), t.stride(2), t.stride(3)


class FusedDecode:
    """The fused step's per-model state: the layers' weight operands, and the C tables per KV / state store.

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
        self._layers = llama_cpu.layer_table(self._weights)
        self._tables: dict = {}      # format -> (the buffers' addresses, the KV table, what keeps it valid)

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
        why = _format_why_not(kv_format)
        if why:
            return f"per operator ({why})"
        if batch_invariant:
            return "per operator (batch_invariant pads the rows)"
        return f"cpu (fused C layers, 1 to {llama_cpu.MAX_ROWS} lanes)"

    @staticmethod
    def serves(batch, plan, kv) -> bool:
        """Whether this forward can take the fused step: only decode rows (plan: the AttentionPlan), at most
        llama_cpu.MAX_ROWS, dense fp32 pages or hq-e8-2b pages with an fp32 window and the rows' state slots."""
        if plan.prefill or plan.decode_rows is None or batch.num_tokens > llama_cpu.MAX_ROWS:
            return False
        fmt = getattr(kv, "kv_format", "")
        if fmt == "hq-e8-2b" and (plan.decode_slots is None or kv.format.exact_dtype != "float32"):
            return False
        return not _format_why_not(fmt)

    def _dense_table(self, kv):
        """The C table of the layers' fp32 pages in `kv` (rebuilt when the store's buffers are other tensors)."""
        k, v = kv.buffer("k"), kv.buffer("v")
        key = (k.data_ptr(), v.data_ptr(), k.shape, v.shape)
        if self._tables.get("fp32", (None,))[0] != key:
            if k.dtype != torch.float32 or not (k.is_contiguous() and v.is_contiguous()):
                raise ValueError("fused decode: the KV pages must be contiguous fp32")
            self._tables["fp32"] = (key, llama_cpu.dense_table(list(zip(k, v))), (k, v))
        return self._tables["fp32"][1]

    def _hq_context(self, kv, states) -> llama_cpu.HQContext:
        """The C context of the layers' hq-e8-2b pages in `kv` and window buffers in `states` (rebuilt when either
        holds other tensors or the format differs: its window, sinks, centering and α are constants of the context).
        Raises ValueError for buffers of other dtypes or layouts."""
        fmt, d = kv.format, self.geometry[2]
        names = ["kv_window"] + (["kv_sinks"] if fmt.exact_sinks else []) + (["kv_center"] if fmt.centering else [])
        state = {n: states.buffer(n) for n in names}
        pool = [kv.buffer(n) for n in ("codes", "scale", "resid", "center")]
        key = (fmt, kv.page_tokens, *((t.data_ptr(), t.shape) for t in (*pool, *state.values())))
        if self._tables.get("hq", (None,))[0] != key:
            if not all(t.is_contiguous() for t in pool) or [t.dtype for t in pool] != [
                    torch.int16, torch.float32, torch.float16, torch.uint8]:
                raise ValueError("fused decode: the hq-e8-2b page buffers must be contiguous int16 / fp32 / fp16 / "
                                 "uint8")
            win = state["kv_window"]
            sinks, mu = state.get("kv_sinks"), state.get("kv_center")
            rows = []
            for i in range(kv.n_attention_layers):
                view = kv.view(i).buffers
                rows.append({"codes": view["codes"], "scale": view["scale"], "resid": view["resid"],
                             "center": view["center"], "signs": kv.signs[i], "win": win[:, i],
                             "sinks": sinks[:, i] if sinks is not None else None,
                             "mu": mu[:, i] if mu is not None else None})
            table = llama_cpu.hq_table(rows)
            ws = _window_strides(win[:, 0], "kv_window")
            ss = _window_strides(sinks[:, 0], "kv_sinks") if sinks is not None else (0, 0, 0, 0)
            if mu is not None and (mu.dtype != torch.float32 or not mu[0, 0].is_contiguous()):
                raise ValueError("fused decode: the state buffer kv_center must be fp32, contiguous per slot")
            words = word_table("cpu")
            ctx = llama_cpu.HQContext(
                1.0 / math.sqrt(d), variance_correction(kv.view(0)) if kv.n_attention_layers else 1.0,
                fmt.exact_window_pages, fmt.ring_tokens, fmt.exact_sinks, (fmt.exact_window_pages + 1) * kv.page_tokens,
                hq_cpu.center_size(d, kv.page_tokens), int(fmt.centers_values), words.data_ptr(), *ws, *ss,
                mu.stride(0) if mu is not None else 0, None, ctypes.addressof(table))
            self._tables["hq"] = (key, ctx, (table, rows, words, pool, state))
        return self._tables["hq"][1]

    def run(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch, plan, kv,
            states=None) -> torch.Tensor:
        """Every layer over x [T, H] fp32 (the embedded rows) for the decode batch; returns the residual stream
        after the last layer (x itself, updated in place). cos, sin: the rotary tables [T, 1, d]; plan: the batch's
        AttentionPlan; kv: its KV store (the new keys and values are written into its pages, or under hq-e8-2b into
        the rows' exact windows in `states`, the state store, after the step's window events)."""
        x = x.contiguous()
        t = x.shape[0]
        args = (x, self.geometry, cos.reshape(t, -1).contiguous(), sin.reshape(t, -1).contiguous())
        ctx, pages = plan.decode_lens.contiguous(), plan.decode_pages.contiguous()
        if kv.kv_format == "fp32":
            llama_cpu.decode(self._layers, self._dense_table(kv), *args, batch.slot_mapping.contiguous(), ctx, pages,
                             kv.page_tokens)
            return x
        kv.prepare_decode(plan, states)
        hctx = self._hq_context(kv, states)
        slots = plan.decode_slots.contiguous()
        hctx.state_slots = slots.data_ptr()
        llama_cpu.decode_hq(self._layers, hctx, *args, ctx, pages, kv.page_tokens)
        return x

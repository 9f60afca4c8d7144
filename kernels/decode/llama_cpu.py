"""One C call for all the layers of a llama decode step, built on first use and called through ctypes: over dense
fp32 KV pages (llama_cpu.c) or over hq-e8-2b pages and their exact window (llama_hq_cpu.c); llama_layers.h is the
layer loop both share.

It serves the CPU decode steps the per-operator path would run through the C kernels anyway: 4-bit weights with the
int4 kernel's scales (model.weight_format native), plain RMSNorms, full rotary, fp32 or hq-e8-2b pages (an fp32
exact window), and up to MAX_ROWS decode rows. Measured on this project's 2-core EPYC (SmolLM2, one lane, 128 tokens
of context, fp32 pages): the whole step (head included) takes 7.3 ms against 13.0 ms through the per-operator path,
whose ~13 torch operators and 6 ctypes calls a layer cost about as much as the products. IGNIS_FUSED_DECODE_KERNEL=0
(or IGNIS_CPU_KERNELS=0) disables both; each is also off whenever a kernel it is made of is (each switch keeps its
meaning). reference.py is the dense step's torch definition.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.attention import dense_cpu, hq_cpu
from ignis_kernels.cbuild import Kernel
from ignis_kernels.kvq import window_cpu
from ignis_kernels.linear import MAX_KERNEL_ROWS, int4_cpu
from ignis_kernels.norm import rms_cpu

_P, _I, _L, _F = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_float
MAX_ROWS = MAX_KERNEL_ROWS
"""The most decode rows a fused step takes: as many as the int4 kernel's few-row product."""


class Layer(ctypes.Structure):
    """llama_layers.h's layer_t: one layer's weight operands (norm weights, int4 codes and scales)."""
    _fields_ = [(n, _P) for n in ("w_in", "w_post", "qkv", "o", "gate_up", "down", "qkv_dm", "o_dm", "gate_up_dm",
                                  "down_dm")]


class Step(ctypes.Structure):
    """llama_layers.h's step_t: the step's geometry and rows."""
    _fields_ = [("T", _I), ("H", _I), ("hq", _I), ("hkv", _I), ("d", _I), ("inter", _I), ("eps", _F),
                ("cos", _P), ("sin_rot", _P), ("ctx", _P), ("pages", _P), ("page_stride", _L), ("pt", _I)]


class DenseLayer(ctypes.Structure):
    """llama_cpu.c's dense_layer_t: one layer's fp32 pages."""
    _fields_ = [("k_pages", _P), ("v_pages", _P)]


class HQLayer(ctypes.Structure):
    """llama_hq_cpu.c's hq_layer_t: one layer's pool buffers, rotation signs and state buffers."""
    _fields_ = [(n, _P) for n in ("codes", "scale", "resid", "center", "signs", "win", "sinks", "mu")]


class HQContext(ctypes.Structure):
    """llama_hq_cpu.c's hq_ctx_t: the format's constants and the state store's strides (in floats)."""
    _fields_ = [("tau", _F), ("vc", _F), *((n, _I) for n in ("wp", "ring", "n_sinks", "c0", "center_size",
                                                              "center_values")),
                ("words", _P), *((n, _L) for n in ("w_slot", "w_kind", "w_r", "w_h", "s_slot", "s_kind", "s_s", "s_h",
                                                   "m_slot")),
                ("state_slots", _P), ("layers", _P)]


_STEP = ctypes.POINTER(Step)
KERNEL = Kernel(Path(__file__).with_name("llama_cpu.c"), "the fused llama CPU decode kernel",
                {"llama_decode": ([_P, _P, _I, _P, _STEP, _P], _I)}, "IGNIS_FUSED_DECODE_KERNEL")
HQ_KERNEL = Kernel(Path(__file__).with_name("llama_hq_cpu.c"), "the fused llama CPU decode kernel over hq-e8-2b pages",
                   {"llama_hq_decode": ([_P, _I, _P, _STEP, ctypes.POINTER(HQContext)], _I)},
                   "IGNIS_FUSED_DECODE_KERNEL")


def available(kv_format: str = "fp32") -> bool:
    """Whether the fused step over `kv_format` pages ("fp32" or "hq-e8-2b") can serve here: its library builds and
    the kernels it is made of are on (int4_cpu, whose check probes torch's int4 layout; rms_cpu; dense_cpu, or
    hq_cpu and window_cpu)."""
    return error(kv_format) is None


def error(kv_format: str = "fp32") -> str | None:
    """Why the fused step over `kv_format` pages does not serve, or None."""
    parts = (dense_cpu.KERNEL, KERNEL) if kv_format == "fp32" else (hq_cpu.KERNEL, window_cpu.KERNEL, HQ_KERNEL)
    for k in (int4_cpu.KERNEL, rms_cpu.KERNEL, *parts):
        if not k.available():
            return k.error()
    return None


def _table(struct, rows: list[dict]) -> ctypes.Array:
    """A C array of `struct` with each row's fields set to the addresses of its tensors (None: NULL)."""
    table = (struct * len(rows))()
    for row, ops in zip(table, rows):
        for name, t in ops.items():
            setattr(row, name, None if t is None else t.data_ptr())
    return table


def layer_table(layers: list[dict]) -> ctypes.Array:
    """The C array of layer_t for `layers`: per layer a dict of the Layer field names to tensors (CPU, contiguous;
    norms fp32 [H], codes uint8 and scales fp16 as int4_cpu takes them). The tensors must outlive the table (it holds
    their addresses only)."""
    return _table(Layer, layers)


def dense_table(pages: list[tuple[torch.Tensor, torch.Tensor]]) -> ctypes.Array:
    """The C array of dense_layer_t: per layer its (K pages, V pages), fp32 [slots, Hkv, d] contiguous."""
    return _table(DenseLayer, [{"k_pages": k, "v_pages": v} for k, v in pages])


def hq_table(layers: list[dict]) -> ctypes.Array:
    """The C array of hq_layer_t: per layer a dict of the HQLayer field names to tensors (the pool's "codes" int16,
    "scale" fp32, "resid" fp16, "center" uint8 page buffers, contiguous; "signs" fp32 [2, Hkv, d]; "win", "sinks",
    "mu" the layer's views of the state store's kv_window / kv_sinks / kv_center, fp32, every slot; None for absent
    sinks or centre)."""
    return _table(HQLayer, layers)


def _step(x: torch.Tensor, geometry: tuple, cos: torch.Tensor, sin_rot: torch.Tensor, ctx: torch.Tensor,
          pages: torch.Tensor, page_tokens: int) -> Step:
    hq, hkv, d, inter, eps = geometry
    t, h = x.shape
    return Step(t, h, hq, hkv, d, inter, float(eps), cos.data_ptr(), sin_rot.data_ptr(), ctx.data_ptr(),
                pages.data_ptr(), pages.shape[1], page_tokens)


def _check(rc: int, x: torch.Tensor, geometry: tuple) -> None:
    if rc != 0:
        hq, hkv, d, inter, _ = geometry
        raise RuntimeError(f"llama_cpu: the fused decode step refused its operands (rows {x.shape[0]}, hidden "
                           f"{x.shape[1]}, heads {hq}/{hkv}, head dim {d}, intermediate {inter})")


def decode(table: ctypes.Array, pages_table: ctypes.Array, x: torch.Tensor, geometry: tuple[int, int, int, int, float],
           cos: torch.Tensor, sin_rot: torch.Tensor, slots: torch.Tensor, ctx: torch.Tensor, pages: torch.Tensor,
           page_tokens: int) -> None:
    """Run the table's layers over x in place, over dense fp32 pages (llama_cpu.c's llama_decode).

    table: layer_table; pages_table: dense_table of the same layers. x: float32 [T, H] contiguous, T <= MAX_ROWS
    decode rows (the residual stream after the embedding; on return, after the last layer). geometry: (Hq, Hkv, d,
    intermediate size, RMSNorm eps). cos, sin_rot: float32 [T, d] (layers.Rotary.tables, contiguous). slots: int64
    [T] pool slots of the rows' new tokens; ctx: int64 [T] context lengths including them; pages: int64 [T, W] page
    tables. Raises RuntimeError when the kernel refuses the geometry."""
    step = _step(x, geometry, cos, sin_rot, ctx, pages, page_tokens)
    _check(KERNEL.library().llama_decode(ctypes.addressof(table), ctypes.addressof(pages_table), len(table),
                                         x.data_ptr(), ctypes.byref(step), slots.data_ptr()), x, geometry)


def decode_hq(table: ctypes.Array, context: HQContext, x: torch.Tensor, geometry: tuple[int, int, int, int, float],
              cos: torch.Tensor, sin_rot: torch.Tensor, ctx: torch.Tensor, pages: torch.Tensor,
              page_tokens: int) -> None:
    """`decode` over hq-e8-2b pages (llama_hq_cpu.c's llama_hq_decode): each row's new key and value written into
    its exact window (and sinks) at its state slot, attention over its compressed pages and window. context: the
    HQContext (context.layers an hq_table of the same layers, context.state_slots int64 [T]). The caller has run the
    step's window events (ignisd.cache.exact_window.prepare_decode). Raises RuntimeError as `decode`."""
    step = _step(x, geometry, cos, sin_rot, ctx, pages, page_tokens)
    _check(HQ_KERNEL.library().llama_hq_decode(ctypes.addressof(table), len(table), x.data_ptr(), ctypes.byref(step),
                                               ctypes.byref(context)), x, geometry)

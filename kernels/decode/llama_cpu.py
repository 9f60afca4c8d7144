"""One C call for all the layers of a llama decode step (llama_cpu.c), built on first use and called through ctypes.

It serves the CPU decode steps the per-operator path would run through the C kernels anyway: 4-bit weights with the
int4 kernel's scales (model.weight_format native), plain RMSNorms, full rotary, fp32 KV pages, and up to MAX_ROWS
decode rows. Measured on this project's 2-core EPYC (SmolLM2, one lane, 128 tokens of context): the whole step (head
included) takes 7.3 ms against 13.0 ms through the per-operator path, whose ~13 torch operators and 6 ctypes calls a
layer cost about as much as the products. IGNIS_FUSED_DECODE_KERNEL=0 (or IGNIS_CPU_KERNELS=0) disables it; it is
also off whenever the int4, dense attention or RMSNorm kernel is (each switch keeps its meaning). reference.py is its
torch definition.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.attention import dense_cpu
from ignis_kernels.cbuild import Kernel
from ignis_kernels.linear import MAX_KERNEL_ROWS, int4_cpu
from ignis_kernels.norm import rms_cpu

_P = ctypes.c_void_p
_I = ctypes.c_int
MAX_ROWS = MAX_KERNEL_ROWS
"""The most decode rows a fused step takes: as many as the int4 kernel's few-row product."""


class Layer(ctypes.Structure):
    """llama_cpu.c's layer_t: one layer's operand pointers (norm weights, int4 codes and scales, the layer's pages)."""
    _fields_ = [(n, _P) for n in ("w_in", "w_post", "qkv", "o", "gate_up", "down", "qkv_dm", "o_dm", "gate_up_dm",
                                  "down_dm", "k_pages", "v_pages")]


KERNEL = Kernel(Path(__file__).with_name("llama_cpu.c"), "the fused llama CPU decode kernel",
                {"llama_decode": ([_P, _I, _P, _I, _I, _I, _I, _I, _I, ctypes.c_float, _P, _P, _P, _P, _P,
                                   ctypes.c_int64, _I], _I)}, "IGNIS_FUSED_DECODE_KERNEL")


def available() -> bool:
    """Whether the fused step can serve here: its library builds and the kernels it is made of are on (int4_cpu,
    whose check probes torch's int4 layout; dense_cpu; rms_cpu)."""
    return int4_cpu.available() and dense_cpu.available() and rms_cpu.available() and KERNEL.available()


def error() -> str | None:
    """Why the fused step does not serve, or None."""
    for k in (int4_cpu.KERNEL, dense_cpu.KERNEL, rms_cpu.KERNEL, KERNEL):
        if not k.available():
            return k.error()
    return None


def layer_table(layers: list[dict]) -> ctypes.Array:
    """The C array of layer_t for `layers`: per layer a dict of the Layer field names to tensors (CPU, contiguous;
    norms fp32 [H], codes uint8 and scales fp16 as int4_cpu takes them, pages fp32 [slots, Hkv, d]). The tensors
    must outlive the table (it holds their addresses only)."""
    table = (Layer * len(layers))()
    for row, ops in zip(table, layers):
        for name, t in ops.items():
            setattr(row, name, t.data_ptr())
    return table


def decode(table: ctypes.Array, x: torch.Tensor, geometry: tuple[int, int, int, int, float], cos: torch.Tensor,
           sin_rot: torch.Tensor, slots: torch.Tensor, ctx: torch.Tensor, pages: torch.Tensor,
           page_tokens: int) -> None:
    """Run the table's layers over x in place (llama_cpu.c's llama_decode).

    x: float32 [T, H] contiguous, T <= MAX_ROWS decode rows (the residual stream after the embedding; on return,
    after the last layer). geometry: (Hq, Hkv, d, intermediate size, RMSNorm eps). cos, sin_rot: float32 [T, d]
    (layers.Rotary.tables, contiguous). slots: int64 [T] pool slots of the rows' new tokens; ctx: int64 [T] context
    lengths including them; pages: int64 [T, W] page tables. Raises RuntimeError when the kernel refuses the
    geometry."""
    hq, hkv, d, inter, eps = geometry
    t, h = x.shape
    rc = KERNEL.library().llama_decode(ctypes.addressof(table), len(table), x.data_ptr(), t, h, hq, hkv, d, inter,
                                       float(eps), cos.data_ptr(), sin_rot.data_ptr(), slots.data_ptr(),
                                       ctx.data_ptr(), pages.data_ptr(), pages.shape[1], page_tokens)
    if rc != 0:
        raise RuntimeError(f"llama_cpu: the fused decode step refused its operands (rows {t}, hidden {h}, heads "
                           f"{hq}/{hkv}, head dim {d}, intermediate {inter})")

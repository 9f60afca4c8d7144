"""The fused CPU decode kernel over hq-e8-2b pages (hq_cpu.c), built on first use and called through ctypes.

hq_cpu.c computes what hq_decode.hq_decode_attention computes (HQ_E8_2B.md §4.1-§4.3: the query rotated once, the
compressed keys scored in the rotated domain with the variance correction and the page key centre's q̃·μ_K (one dot
a page, kvq/page_center.py), the exact ring and sinks, one softmax, the values un-rotated once) in one call per layer
instead of about 45 torch operators: on the CPU a decode step's attention costs its operator count more than its
bytes. Each row is computed alone, so a row's output does not
depend on the batch it is in, nor on the thread count (split-K partials merged in a fixed order).

Built on first use by ignis_kernels.cbuild (the system C compiler, the kernel cache, OpenMP on the libgomp torch
already loaded); where it cannot be built, `available()` is False and the dispatcher keeps the torch path
(hq_decode.py), logging why once. IGNIS_HQ_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0) disables it.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.attention.hq_decode import word_table
from ignis_kernels.attention.hq_reference import variance_correction
from ignis_kernels.cbuild import Kernel
from ignis_kernels.kvq.page_center import center_dtype

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
_ARGTYPES = [_P, _P, ctypes.c_float, ctypes.c_float, _I, _I, _I, _I, _I, _I, _I, _I, _P, _P, _L, _P, _P, _P, _P, _I, _P,
             _P, _P, _L, _L, _L, _P, _P, _L, _L, _L, _P, _P]
KERNEL = Kernel(Path(__file__).with_name("hq_cpu.c"), "the fused hq-e8-2b CPU decode kernel",
                {"hq_decode": (_ARGTYPES, ctypes.c_int)}, "IGNIS_HQ_CPU_KERNEL")
library, available, error = KERNEL.library, KERNEL.available, KERNEL.error


def _f32(t: torch.Tensor) -> bool:
    return t.dtype == torch.float32 and t.stride(-1) == 1


def center_size(d: int, pt: int) -> int:
    """Bytes of one value of the page key centre (page_center.center_dtype): 4, 2 or 1."""
    return torch.finfo(center_dtype(d, pt)).bits // 8


def supports(q: torch.Tensor, view, exact) -> bool:
    """Whether hq_decode_attention can take these arguments as they are (CPU tensors, contiguous pool buffers of the
    expected dtypes, the page key centre uint8 "center", float32 exact parts with unit stride in d, a geometry
    within the C limits)."""
    b = view.buffers
    codes, scale, resid, center = b["codes"], b["scale"], b["resid"], b.get("center")
    d = q.shape[-1]
    return (q.device.type == "cpu" and codes.dtype == torch.int16 and scale.dtype == torch.float32
            and resid.dtype == torch.float16 and codes.is_contiguous() and scale.is_contiguous()
            and resid.is_contiguous() and center is not None and center.dtype == torch.uint8
            and center.is_contiguous() and d <= 4 * view.page_tokens
            and _f32(exact.k) and _f32(exact.v) and exact.k.stride() == exact.v.stride()
            and _f32(exact.sink_k) and _f32(exact.sink_v) and exact.sink_k.stride() == exact.sink_v.stride()
            and 8 <= d <= 256 and d & (d - 1) == 0 and q.shape[1] // view.params["signs"].shape[1] <= 16)


def hq_decode_attention(q: torch.Tensor, view, page_table: torch.Tensor, context_lens: torch.Tensor, exact,
                        scale: float | None = None) -> torch.Tensor:
    """hq_decode.hq_decode_attention's result through the fused kernel (the same arguments: q [B, Hq, d] at
    positions context_lens − 1, page_table LongTensor [B, W], exact the batch's ExactRing) -> float32 [B, Hq, d],
    with exact.center_v (the rotated μ_V of value centering, HQ_E8_2B.md §4.3) already added back: the kernel adds
    L·μ_V to the un-normalised rotated output before its one un-rotation (o/L + μ_V), where the torch paths leave it
    to hq_reference.add_center (two more torch operators per layer and step). The caller checks `supports` first.
    Raises RuntimeError when the kernel is unavailable or refuses the geometry."""
    lib = library()
    if lib is None:
        raise RuntimeError(error() or "hq_cpu: kernel unavailable")
    bsz, hq, d = q.shape
    signs = view.params["signs"].float().contiguous()
    hkv = signs.shape[1]
    b = view.buffers
    pt = view.page_tokens
    qc = q.float().contiguous()
    pages = page_table.to(torch.int64).contiguous()
    ctx = context_lens.to(torch.int64).contiguous()
    out = torch.empty(bsz, hq, d, dtype=torch.float32)
    tau = 1.0 / d ** 0.5 if scale is None else float(scale)
    rk, sk = exact.k, exact.sink_k
    n_s = sk.shape[1]
    sink_k = sk if n_s else rk                               # any valid pointer when there are no sinks
    sink_v = exact.sink_v if n_s else exact.v
    words = word_table("cpu")
    cv = exact.center_v
    if cv is not None:                                       # [B or 1, Hkv, d] rotated μ_V, one row per batch row
        cv = cv.float().expand(bsz, hkv, d).contiguous()
    rc = lib.hq_decode(
        qc.data_ptr(), signs.data_ptr(), tau, variance_correction(view), bsz, hq, hkv, d, pt, exact.window_pages,
        rk.shape[1], n_s, ctx.data_ptr(), pages.data_ptr(), pages.shape[1], b["codes"].data_ptr(),
        b["scale"].data_ptr(), b["resid"].data_ptr(), b["center"].data_ptr(), center_size(d, pt), words.data_ptr(),
        rk.data_ptr(), exact.v.data_ptr(), rk.stride(0), rk.stride(1), rk.stride(2), sink_k.data_ptr(),
        sink_v.data_ptr(), sink_k.stride(0), sink_k.stride(1) if n_s else 0, sink_k.stride(2),
        cv.data_ptr() if cv is not None else None,
        out.data_ptr())
    if rc != 0:
        raise RuntimeError(f"hq_cpu: geometry outside the kernel's limits (Hq {hq}, Hkv {hkv}, d {d})")
    return out

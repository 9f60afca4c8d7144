"""Decode attention over dense (fp32 / bf16) KV pages in one C call per layer (dense_cpu.c), built on first use and
called through ctypes: what reference.paged_decode_attention computes, with the pages read in place through the page
table (torch's SDPA needs them gathered, or a consecutive run, and upcast). Measured on this project's 2-core EPYC,
SmolLM2's geometry (9 query heads on 3 KV heads, d 64, fp32 pages; tools/bench_weights.py --attention), µs a layer
at 128 / 1K / 4K / 8K tokens of context: one row 27 / 88 / 241 / 498 against torch's 57 / 221 / 818 / 1,153; eight
rows 71 / 478 / 3,132 / 7,324 against 238 / 1,391 / 12,933 / 74,337 (the gather copies).

`available()` checks the kernel against the reference once. IGNIS_DENSE_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0)
disables it; the torch reference then serves.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.attention import reference
from ignis_kernels.cbuild import Kernel

_P = ctypes.c_void_p
_I = ctypes.c_int
_L = ctypes.c_int64
MAX_G, MAX_D = 16, 256


def _run(lib, q, k_pages, v_pages, page_table, context_lens, scale) -> torch.Tensor | None:
    b, hq, d = q.shape
    _, pt, hkv, _ = k_pages.shape
    out = torch.empty(b, hq, d, dtype=torch.float32)
    pages = page_table.to(torch.int64).contiguous()
    ctx = context_lens.to(torch.int64).contiguous()
    tau = 1.0 / d ** 0.5 if scale is None else float(scale)
    rc = lib.dense_decode(q.data_ptr(), tau, b, hq, hkv, d, pt, ctx.data_ptr(), pages.data_ptr(), pages.shape[1],
                          k_pages.data_ptr(), v_pages.data_ptr(), int(k_pages.dtype == torch.bfloat16),
                          out.data_ptr())
    return out if rc == 0 else None


def _check(lib) -> str:
    """'' when the kernel reproduces reference.paged_decode_attention (fp32 and bf16 pages, shuffled page tables,
    contexts of 1 to 3 pages) to 1e-5, else why not (cbuild.Kernel's check)."""
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.bfloat16):
        k = torch.randn(6, 16, 2, 8, generator=g).to(dtype)
        v = torch.randn(6, 16, 2, 8, generator=g).to(dtype)
        q = torch.randn(3, 4, 8, generator=g)
        table = torch.tensor([[5, 0, 3], [1, 1, 1], [2, 4, 0]])
        lens = torch.tensor([40, 1, 33])
        got = _run(lib, q, k, v, table, lens, None)
        if got is None or not torch.allclose(got, reference.paged_decode_attention(q, k, v, table, lens),
                                             rtol=1e-5, atol=1e-5):
            return f"the kernel differs from the reference on {dtype} pages"
    return ""


KERNEL = Kernel(Path(__file__).with_name("dense_cpu.c"), "the dense CPU decode attention kernel",
                {"dense_decode": ([_P, ctypes.c_float, _I, _I, _I, _I, _I, _P, _P, _L, _P, _P, _I, _P], _I)},
                "IGNIS_DENSE_CPU_KERNEL", check=_check)
available, error = KERNEL.available, KERNEL.error


def supports(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor) -> bool:
    """Whether decode_attention takes these operands: CPU, q float32 [B, Hq, d] contiguous, pages [P, pt, Hkv, d]
    contiguous in fp32 or bf16 (both alike), Hq a multiple of Hkv with at most MAX_G query heads a KV head, d a
    multiple of 8 up to MAX_D, and the kernel available."""
    return (q.device.type == "cpu" and q.dtype == torch.float32 and q.dim() == 3 and q.is_contiguous()
            and k_pages.dim() == 4 and k_pages.dtype in (torch.float32, torch.bfloat16)
            and v_pages.dtype == k_pages.dtype and v_pages.shape == k_pages.shape
            and k_pages.is_contiguous() and v_pages.is_contiguous() and k_pages.device.type == "cpu"
            and q.shape[2] == k_pages.shape[3] and q.shape[2] % 8 == 0 and q.shape[2] <= MAX_D
            and q.shape[1] % k_pages.shape[2] == 0 and q.shape[1] // k_pages.shape[2] <= MAX_G and available())


def decode_attention(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, page_table: torch.Tensor,
                     context_lens: torch.Tensor, scale: float | None = None) -> torch.Tensor:
    """reference.paged_decode_attention's result by the kernel: q [B, Hq, d] float32, pages [P, pt, Hkv, d],
    page_table LongTensor [B, W], context_lens LongTensor [B] (1 <= len <= W·pt). Returns float32 [B, Hq, d]. The
    caller checks `supports` first. Raises RuntimeError when the kernel refuses the geometry or lengths."""
    out = _run(KERNEL.library(), q, k_pages, v_pages, page_table, context_lens, scale)
    if out is None:
        raise RuntimeError(f"dense_cpu: geometry or context lengths outside the kernel (q {tuple(q.shape)}, pages "
                           f"{tuple(k_pages.shape)}, lengths {context_lens.tolist()})")
    return out

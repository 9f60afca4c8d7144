"""The few-row int4 matmul of int4_cpu.c, built on first use and called through ctypes: the decode step's
projections of a 4-bit GGUF weight, its codes read from the same packed bytes torch's ``_weight_int4pack_mm_for_cpu``
reads (no second copy of the codes; the file's fp16 d and m beside them, 4 B a group of 32), with fp32 activations and
output: the file's weights exactly (torch's kernel rounds activations, scales and output to bf16).

Measured on this project's 2-core AMD EPYC (Zen 3), SmolLM2-135M shapes, one row: 2.0x torch's kernel (576→960
24 µs against 48 µs; the 120 projections of a decode step 5.1 ms against 9.9 ms), 1.1 to 1.5x at 2 to 8 rows.

Before first use `available()` also probes the layout: torch's own packer packs random codes, and reference.unpack_codes
must read them back and the kernel must match reference.int4_mm, else the kernel stays off (logged once) and torch's
kernel serves. IGNIS_INT4_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0) disables it.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.cbuild import Kernel
from ignis_kernels.linear import reference

_P = ctypes.c_void_p
_I = ctypes.c_int


def _run(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor, lib=None) -> torch.Tensor | None:
    lib = lib or KERNEL.library()
    t, k = x.shape
    n = dm.shape[2]
    y = torch.empty(t, n, dtype=torch.float32)
    rc = lib.int4_mm(x.data_ptr(), packed.data_ptr(), dm.data_ptr(), y.data_ptr(), t, n, k)
    return y if rc == 0 else None


def _check_layout(lib) -> str:
    """'' when torch's packer writes the layout reference.py describes and the kernel reproduces reference.int4_mm on
    it (to 1e-5 relative), else why not (cbuild.Kernel's check)."""
    pack = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
    if pack is None:
        return "this torch has no CPU int4 packer"
    g = torch.Generator().manual_seed(7)
    n, k = 64, 96
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=g)
    packed = pack(codes, 1)
    try:
        if not torch.equal(reference.unpack_codes(packed, n, k).int(), codes):
            return "torch's int4 packer writes a layout this kernel does not read"
    except ValueError as e:
        return f"torch's int4 packer: {e}"
    dm = reference.group_scales(torch.rand(n, k // 32, generator=g) * 0.1, torch.randn(n, k // 32, generator=g))
    x = torch.randn(3, k, generator=g)
    y = _run(x, packed, dm, lib)
    if y is None:
        return "the kernel has no path for this CPU (it needs AVX2)"
    ref = reference.int4_mm(x, packed, dm)
    if not torch.allclose(y, ref, rtol=1e-5, atol=1e-5):
        return "the kernel's product differs from the reference"
    w_t = torch.empty(k, n - 32)
    if lib.int4_dequant_t(packed.data_ptr(), dm.data_ptr(), w_t.data_ptr(), n, k, 32, n) != 0 or \
            not torch.equal(w_t, reference.dequantize(packed, dm, n, k)[32:].t()):
        return "the kernel's dequantized weight differs from the reference"
    return ""


KERNEL = Kernel(Path(__file__).with_name("int4_cpu.c"), "the CPU int4 matmul kernels",
                {"int4_mm": ([_P, _P, _P, _P, _I, _I, _I], ctypes.c_int),
                 "int4_dequant_t": ([_P, _P, _P, _I, _I, _I, _I], ctypes.c_int)}, "IGNIS_INT4_CPU_KERNEL",
                check=_check_layout)
available, error = KERNEL.available, KERNEL.error


def takes(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor) -> bool:
    """Whether the kernels take these operands: x float32 [T, K] contiguous; packed uint8 [N, K/2] contiguous
    (reference.py's layout); dm fp16 [K/32, 2, N] contiguous (reference.group_scales); N and K multiples of 32; and
    available()."""
    return (x.dtype == torch.float32 and x.is_contiguous() and x.dim() == 2 and dm.dtype == torch.float16
            and dm.is_contiguous() and dm.dim() == 3 and dm.shape[0] * 32 == x.shape[1] and dm.shape[1] == 2
            and dm.shape[2] % 32 == 0 and packed.dtype == torch.uint8 and packed.is_contiguous()
            and packed.numel() * 2 == dm.shape[2] * x.shape[1] and available())


def int4_mm(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor) -> torch.Tensor | None:
    """fp32 [T, N] = x [T, K] @ the weight's transpose by the few-row C product, or None when the kernel does not
    take these operands (`takes`; then the caller runs torch's kernel). Any T >= 1 (its cost grows with T: the
    dispatcher sends many rows to dequant_t and a GEMM instead)."""
    if not takes(x, packed, dm):
        return None
    return _run(x, packed, dm)


def dequant_t(packed: torch.Tensor, dm: torch.Tensor, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
    """The transposed fp32 weight of output rows [n0, n1) (int4_cpu.c's int4_dequant_t: d·c + m rounded once, equal to
    reference.dequantize), written into `out` (float32 contiguous, at least K·(n1 − n0) values) and returned as a
    [K, n1 − n0] view of it. The caller has checked `takes` on packed and dm. Raises ValueError for n0, n1 that are
    not multiples of 32 within [0, N] or an `out` too small."""
    n, k = dm.shape[2], dm.shape[0] * 32
    if n0 % 32 or n1 % 32 or not 0 <= n0 < n1 <= n:
        raise ValueError(f"dequant_t: rows [{n0}, {n1}) of {n} (multiples of 32 within the weight)")
    if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() < k * (n1 - n0):
        raise ValueError(f"dequant_t: out must be float32 contiguous with at least {k * (n1 - n0)} values")
    w_t = out[:k * (n1 - n0)].view(k, n1 - n0)
    if KERNEL.library().int4_dequant_t(packed.data_ptr(), dm.data_ptr(), w_t.data_ptr(), n, k, n0, n1) != 0:
        raise RuntimeError("dequant_t: the kernel has no path for this CPU")
    return w_t

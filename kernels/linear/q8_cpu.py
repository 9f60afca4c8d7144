"""The Q8_0 table products of q8_cpu.c (the LM head of a GGUF whose token table is Q8_0, as the built-in model's),
built on first use and called through ctypes: exact in fp32 from the table's own int8 codes and fp32 d (the tensors the
embedding rows are read from: nothing else is held for the head). IGNIS_Q8_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0)
disables it; `available()` also checks the product against reference.q8_mm once.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.cbuild import Kernel
from ignis_kernels.linear import reference

_P = ctypes.c_void_p
_I = ctypes.c_int


def _check(lib) -> str:
    """'' when the kernels reproduce the reference on a small table, else why not (cbuild.Kernel's check)."""
    g = torch.Generator().manual_seed(8)
    q = torch.randint(-128, 128, (40, 64), dtype=torch.int8, generator=g)
    d = torch.rand(40, 2, generator=g) * 0.01
    x = torch.randn(3, 64, generator=g)
    y = torch.empty(3, 40)
    if lib.q8_mm(x.data_ptr(), q.data_ptr(), d.data_ptr(), y.data_ptr(), 3, 40, 64) != 0:
        return "the kernel has no path for this CPU (it needs AVX2)"
    if not torch.allclose(y, reference.q8_mm(x, q, d), rtol=1e-5, atol=1e-5):
        return "the kernel's product differs from the reference"
    w = torch.empty(30, 64)
    if lib.q8_dequant(q.data_ptr(), d.data_ptr(), w.data_ptr(), 40, 64, 10, 40) != 0 or \
            not torch.equal(w, reference.q8_dequantize(q, d)[10:]):
        return "the kernel's dequantized rows differ from the reference"
    return ""


KERNEL = Kernel(Path(__file__).with_name("q8_cpu.c"), "the CPU Q8_0 table kernels",
                {"q8_mm": ([_P, _P, _P, _P, _I, _I, _I], ctypes.c_int),
                 "q8_dequant": ([_P, _P, _P, _I, _I, _I, _I], ctypes.c_int)}, "IGNIS_Q8_CPU_KERNEL", check=_check)
available, error = KERNEL.available, KERNEL.error


def takes(q: torch.Tensor, d: torch.Tensor) -> bool:
    """Whether the kernels take this table: q int8 [N, K] contiguous, K a multiple of 32, d float32 [N, K/32]
    contiguous, and available()."""
    return (q.dtype == torch.int8 and q.dim() == 2 and q.is_contiguous() and q.shape[1] % 32 == 0
            and d.dtype == torch.float32 and d.is_contiguous() and tuple(d.shape) == (q.shape[0], q.shape[1] // 32)
            and available())


def q8_mm(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """fp32 [T, N] = x [T, K] (float32 contiguous) @ (d·q)ᵀ by the few-row product. The caller has checked `takes`.
    Raises ValueError when x does not match the table."""
    t, k = x.shape
    if x.dtype != torch.float32 or not x.is_contiguous() or k != q.shape[1]:
        raise ValueError(f"q8_mm: x {tuple(x.shape)} {x.dtype} against a table of {q.shape[1]} columns")
    y = torch.empty(t, q.shape[0], dtype=torch.float32)
    if KERNEL.library().q8_mm(x.data_ptr(), q.data_ptr(), d.data_ptr(), y.data_ptr(), t, q.shape[0], k) != 0:
        raise RuntimeError("q8_mm: the kernel has no path for this CPU")
    return y


def dequant(q: torch.Tensor, d: torch.Tensor, n0: int, n1: int, out: torch.Tensor) -> torch.Tensor:
    """Rows [n0, n1) of d·q (exact, equal to reference.q8_dequantize) written into `out` (float32 contiguous, at
    least (n1 − n0)·K values), returned as an [n1 − n0, K] view of it. The caller has checked `takes`. Raises
    ValueError for rows outside the table or an `out` too small."""
    n, k = q.shape
    if not 0 <= n0 < n1 <= n:
        raise ValueError(f"dequant: rows [{n0}, {n1}) of {n}")
    if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() < k * (n1 - n0):
        raise ValueError(f"dequant: out must be float32 contiguous with at least {k * (n1 - n0)} values")
    w = out[:k * (n1 - n0)].view(n1 - n0, k)
    if KERNEL.library().q8_dequant(q.data_ptr(), d.data_ptr(), w.data_ptr(), n, k, n0, n1) != 0:
        raise RuntimeError("dequant: the kernel has no path for this CPU")
    return w

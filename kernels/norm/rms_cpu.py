"""The one-call RMSNorm of rms_cpu.c, built on first use and called through ctypes (a decode step's norms: torch's
rms_norm costs ~40 µs of operator overhead a call on a 576-value row, this ~4 µs). IGNIS_RMS_CPU_KERNEL=0 (or
IGNIS_CPU_KERNELS=0) disables it; `available()` also checks it against reference.rms_norm once.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.cbuild import Kernel
from ignis_kernels.norm import reference

_P = ctypes.c_void_p
_I = ctypes.c_int


def _check(lib) -> str:
    """'' when the kernel reproduces reference.rms_norm on a few rows (to 1e-5 relative), else why not."""
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(3, 70, generator=g) * 5, torch.randn(70, generator=g)
    y = torch.empty(3, 70)
    if lib.rms_norm(x.data_ptr(), w.data_ptr(), y.data_ptr(), 3, 70, 1e-5) != 0 or \
            not torch.allclose(y, reference.rms_norm(x, w, 1e-5), rtol=1e-5, atol=1e-6):
        return "the kernel differs from the reference"
    return ""


KERNEL = Kernel(Path(__file__).with_name("rms_cpu.c"), "the CPU RMSNorm kernel",
                {"rms_norm": ([_P, _P, _P, _I, _I, ctypes.c_float], ctypes.c_int)}, "IGNIS_RMS_CPU_KERNEL",
                check=_check)
available, error = KERNEL.available, KERNEL.error


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor | None:
    """fp32 RMSNorm of x [..., H] (float32 contiguous, CPU) with weight float32 [H] contiguous, or None when the
    kernel does not take these operands (another dtype or layout, kernels off)."""
    if (x.dtype != torch.float32 or weight.dtype != torch.float32 or x.device.type != "cpu"
            or not x.is_contiguous() or not weight.is_contiguous() or x.dim() == 0
            or weight.shape != (x.shape[-1],) or x.numel() == 0 or not available()):
        return None
    y = torch.empty_like(x)
    h = x.shape[-1]
    KERNEL.library().rms_norm(x.data_ptr(), weight.data_ptr(), y.data_ptr(), x.numel() // h, h, float(eps))
    return y

"""RMSNorm (DESIGN §3 kernels/): reference.py, transformers' LlamaRMSNorm in torch; rms_cpu.py, one C call per norm
on the CPU. `rms_norm` takes the kernel where it serves (fp32 contiguous CPU rows) and torch's F.rms_norm elsewhere.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ignis_kernels.norm import reference, rms_cpu

__all__ = ["rms_norm", "norm_kernel", "reference", "rms_cpu"]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight · x / sqrt(mean(x²) + eps) over the last dim (Zhang & Sennrich 2019). x: [..., H]; weight: [H].
    Returns x's shape and dtype: the C kernel for fp32 CPU rows, F.rms_norm otherwise."""
    y = rms_cpu.rms_norm(x, weight, eps)
    return y if y is not None else F.rms_norm(x, (x.shape[-1],), weight, eps)


def norm_kernel() -> str:
    """What runs RMSNorm here, for the vram_plan line: "cpu (C kernel)", else "torch (<why not the kernel>)". Builds
    the kernel when it is not built yet."""
    return "cpu (C kernel)" if rms_cpu.available() else f"torch ({rms_cpu.error()})"

"""RMSNorm (Zhang & Sennrich 2019, arXiv 1910.07467) as transformers' LlamaRMSNorm computes it, in torch: the
definition rms_cpu.c is tested against."""
from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight · x / sqrt(mean(x²) + eps) over the last dim, in fp32. x: [..., H]; weight: [H]. Returns fp32."""
    x = x.float()
    return weight.float() * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

"""One decode row's write into its exact window on the CPU as one C call (window_cpu.c), built on first use
(ignis_kernels.cbuild).

A decode step writes one token per attention layer: rotate its key and value (rotation.rotate, HQ_E8_2B.md §2.1),
subtract the sequence's centre once it is centred (§4.3), and store the result in the ring slot pos % R (and the
sink row when pos < S). In torch that is about a dozen operators a layer, most of a decode step's write time on the
CPU; window_cpu.c does it in one call with the same float32 results bit for bit (the same butterfly order, the same
separate roundings). Where the kernel cannot be built, `available()` is False and exact_window.write_exact keeps its
torch path, logging why once. IGNIS_WINDOW_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0) disables it.
"""
from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch

from ignis_kernels.cbuild import Kernel

_P, _I, _L = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64
KERNEL = Kernel(Path(__file__).with_name("window_cpu.c"), "the exact-window decode write CPU kernel",
                {"window_write_row": ([_P, _P, _P, _I, _I, ctypes.c_float, _P, _P, _L, _L, _P, _L, _L], _I)},
                "IGNIS_WINDOW_CPU_KERNEL")
library, available, error = KERNEL.library, KERNEL.available, KERNEL.error


def supports(k: torch.Tensor, v: torch.Tensor, signs: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether `write_row` takes these as they are: CPU float32 k, v [1, Hkv, d] and signs [2, Hkv, d] contiguous,
    a float32 destination (the window buffer) with unit stride in d, d a power of two in [8, 1024]."""
    d = k.shape[-1]
    return (k.device.type == "cpu" and k.dtype == torch.float32 and v.dtype == torch.float32
            and k.is_contiguous() and v.is_contiguous() and k.shape == v.shape and k.shape[0] == 1
            and signs.dtype == torch.float32 and signs.is_contiguous() and dst.dtype == torch.float32
            and dst.device.type == "cpu" and dst.stride(-1) == 1 and 8 <= d <= 1024 and d & (d - 1) == 0)


def write_row(k: torch.Tensor, v: torch.Tensor, signs: torch.Tensor, mu: torch.Tensor | None, ring: torch.Tensor,
              sinks: torch.Tensor | None) -> None:
    """ring[κ, h] ← rotate(x_κ[h], signs[κ, h]) − mu[κ, h] for κ in (keys k, values v), and the same into `sinks`
    when given: what exact_window.write_exact stores for one decode row, bit-identical to rotation.rotate and
    exact_window._recenter in float32.

    k, v: float32 [1, Hkv, d] (post-RoPE key, value). signs: float32 [2, Hkv, d] (the layer's ±1 sign vectors).
    mu: float32 [2, Hkv, d] with unit stride in d and heads d apart (the sequence's centre), or None (not centred).
    ring, sinks: float32 [2, Hkv, d] views of the window buffer (the row's ring slot, its sink row). The caller
    checks `supports` first. Raises RuntimeError when the kernel is unavailable or refuses d."""
    lib = library()
    if lib is None:
        raise RuntimeError(error() or "window_cpu: kernel unavailable")
    hkv, d = k.shape[1], k.shape[2]
    if mu is not None and (mu.dtype != torch.float32 or mu.stride(-1) != 1 or mu.stride(-2) != d
                           or mu.stride(0) != hkv * d):
        mu = mu.float().contiguous()
    rc = lib.window_write_row(k.data_ptr(), v.data_ptr(), signs.data_ptr(), hkv, d, 1.0 / math.sqrt(d),
                              mu.data_ptr() if mu is not None else None, ring.data_ptr(), ring.stride(0),
                              ring.stride(1), sinks.data_ptr() if sinks is not None else None,
                              sinks.stride(0) if sinks is not None else 0, sinks.stride(1) if sinks is not None else 0)
    if rc != 0:
        raise RuntimeError(f"window_cpu: head_dim {d} outside the kernel's limits")

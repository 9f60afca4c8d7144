"""The nearest-E8P-codeword search on the CPU as one C call (e8p_cpu.c), built on first use (ignis_kernels.cbuild).

e8p_cpu.c runs reference._nearest_block's certified search chunk by chunk (the float32 bound of all 2 × 256
(shift, row) pairs, the candidate's exact float64 distance, the uniqueness check) and reference.exhaustive_codes'
float64 scan where the check fails, so its codes are reference.nearest_codes' (HQ_E8_2B.md §2.3), without the
[N, 512] float32 and bool temporaries that made the torch search most of an hq-e8-2b prefill's time. Where the kernel
cannot be built, `available()` is False and reference.nearest_codes keeps its torch path, logging why once.
IGNIS_KVQ_CPU_KERNEL=0 (or IGNIS_CPU_KERNELS=0) disables it.
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ignis_kernels.cbuild import Kernel
from ignis_kernels.kvq.codebook import CHUNK, abs_table, odd_rows

_P = ctypes.c_void_p
KERNEL = Kernel(Path(__file__).with_name("e8p_cpu.c"), "the E8P nearest-codeword CPU kernel",
                {"e8p_nearest": ([_P, ctypes.c_int64, _P, _P, _P], None)}, "IGNIS_KVQ_CPU_KERNEL")
library, available, error = KERNEL.library, KERNEL.available, KERNEL.error


def nearest_codes(z: torch.Tensor) -> torch.Tensor:
    """Unsigned codes int64 [N] of the chunks z float32 [N, 8] (CPU), the same as reference.nearest_codes'. Raises
    RuntimeError when the kernel is unavailable, ValueError for another shape or device."""
    lib = library()
    if lib is None:
        raise RuntimeError(error() or "e8p_cpu: kernel unavailable")
    if z.dim() != 2 or z.shape[1] != CHUNK or z.device.type != "cpu":
        raise ValueError(f"e8p_cpu.nearest_codes: CPU chunks [N, {CHUNK}], got {tuple(z.shape)} on {z.device}")
    zc = z.float().contiguous()
    out = torch.empty(zc.shape[0], dtype=torch.int64)
    g, odd = abs_table("cpu").contiguous(), odd_rows("cpu").contiguous()
    lib.e8p_nearest(zc.data_ptr(), zc.shape[0], g.data_ptr(), odd.data_ptr(), out.data_ptr())
    return out

"""hq-e8-2b codec dispatcher (DESIGN §3 kernels/kvq/, HQ_E8_2B.md §2): checks arguments, then runs the encoder for
the device — the Triton kernel (triton_codec.py) on CUDA when Triton imports, or anywhere with IGNIS_KVQ=triton
(e.g. the CPU under TRITON_INTERPRET=1 in the tests); the vectorised torch reference (reference.py) otherwise, whose
nearest-codeword search runs in the C kernel of e8p_cpu.py on the CPU when it builds there (the same codes).
Both have one signature and agree code for code except at distance ties (tests/kernels/test_kvq_triton.py).

    encode_rotated(u [..., d] float) -> (codes int16 [..., d/8], scale f32 [...], resid f16 [...], norm f16 [...])
    decode_rotated(codes [..., d/8], scale [...]) -> û f32 [..., d]             (rotated domain, §2.5)
    codewords(codes [..., d/8]) -> c f32 [..., d]
    rotate(x, signs) / unrotate(u, signs): the fixed randomized Hadamard rotation (§2.1)
d: a power of two >= 8 (256 on the target, 64 on SmolLM2).
"""
from __future__ import annotations

import os

import torch

from ignis_kernels.kvq import reference
from ignis_kernels.kvq.rotation import layer_signs, rotate, sign_vector, unrotate

__all__ = ["encode_rotated", "decode_rotated", "codewords", "rotate", "unrotate", "sign_vector", "layer_signs",
           "backend", "encode_kernel", "window_kernel"]

decode_rotated = reference.decode_rotated
codewords = reference.codewords


def backend(device: torch.device) -> str:
    """"triton" or "reference": IGNIS_KVQ when set to one of them, else triton on CUDA (if it imports)."""
    want = os.environ.get("IGNIS_KVQ", "")
    if want in ("reference", "triton"):
        return want
    if device.type == "cuda":
        from ignis_kernels.kvq import triton_codec
        return "triton" if triton_codec.AVAILABLE else "reference"
    return "reference"


def encode_kernel(device: torch.device) -> str:
    """What encodes pages on `device`, for the vram_plan line: "triton", "cpu (C nearest-codeword kernel)" or
    "reference (torch; <why the C kernel is not used>)". Builds the C kernel when it is not built yet."""
    if backend(device) == "triton":
        return "triton"
    if device.type != "cpu":
        return "reference"
    from ignis_kernels.kvq import e8p_cpu
    return "cpu (C nearest-codeword kernel)" if e8p_cpu.available() else f"reference (torch; {e8p_cpu.error()})"


def window_kernel(device: torch.device) -> str:
    """What writes a lone decode row into the exact window on `device`, for the vram_plan line: "cpu (C decode-row
    kernel)" (window_cpu.c) or "torch" (with why the C kernel is not used, on the CPU). Builds the C kernel when it is
    not built yet."""
    if device.type != "cpu":
        return "torch"
    from ignis_kernels.kvq import window_cpu
    return "cpu (C decode-row kernel)" if window_cpu.available() else f"torch ({window_cpu.error()})"


def encode_rotated(u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Encode rotated vectors u [..., d] (see reference.encode_rotated for the fields and formulas). Raises
    ValueError unless d is a power of two >= 8 and u is floating point."""
    if not u.is_floating_point() or u.dim() < 1:
        raise ValueError(f"encode_rotated: a float tensor [..., d], got {u.dtype} {tuple(u.shape)}")
    d = u.shape[-1]
    if d < 8 or d & (d - 1):
        raise ValueError(f"encode_rotated: head_dim must be a power of two >= 8, got {d}")
    if u.numel() and backend(u.device) == "triton":
        from ignis_kernels.kvq import triton_codec
        return triton_codec.encode_rotated(u)
    return reference.encode_rotated(u)

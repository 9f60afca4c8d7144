"""Matmuls against GGUF block-quantized weights (DESIGN §3 kernels/), exact in fp32: reference.py, the torch definition
of the operands (4-bit codes in torch's CPU int4 layout with the file's fp16 d and m; a Q8_0 table's int8 codes and
d); int4_cpu.py and q8_cpu.py, the C kernels. `int4_mm` (the layers' 4-bit weights) and `q8_mm` (a Q8_0 token table
as the LM head) serve every row count: up to MAX_KERNEL_ROWS rows (decode) by a C product, more (prefill) by an fp32
GEMM (torch.mm, MKL) over the weight dequantized by the C kernel a tile of output rows at a time into a reused buffer.
They return None where the kernels do not serve (no AVX2, another geometry, kernels off), and the caller runs torch's
kernels.

Why both: on this project's AVX2-only EPYC (tools/bench_weights.py --micro, 2 threads) the C product at one row takes
half the time of torch's int4 kernel, and at 256 rows an fp32 GEMM takes a third of it (576->3072: 6.9 ms against
19.4 ms) even with the dequantization added; torch's int4 kernel also rounds activations, scales and output to bf16.
"""
from __future__ import annotations

import threading

import torch

from ignis_kernels.linear import int4_cpu, q8_cpu, reference

__all__ = ["int4_mm", "kernel_scales", "q8_mm", "q8_serves", "weight_kernel", "reference", "int4_cpu", "q8_cpu",
           "MAX_KERNEL_ROWS"]

MAX_KERNEL_ROWS = 8
"""The most activation rows the C product takes (decode of up to 8 lanes); more run as a dequantized fp32 GEMM."""
TILE_VALUES = 1 << 21
"""fp32 values (8 MiB) of one dequantized weight tile: whole output-row blocks of 32 with K·rows <= TILE_VALUES (at
least one block), so a tile stays in the last-level cache between its dequantization and its GEMM."""
_scratch = threading.local()


def _tile_buffer(values: int) -> torch.Tensor:
    """This thread's reused float32 buffer of at least `values` values (grown on demand)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < values:
        buf = _scratch.buf = torch.empty(values, dtype=torch.float32)
    return buf


def _by_tiles(n: int, k: int, rows: int, product) -> torch.Tensor:
    """A many-row product over output rows [0, n) in tiles of `rows` (K = k values a row), each dequantized into this
    thread's reused buffer: product(n0, n1, buf) -> fp32 [T, n1 − n0]; the tiles' results joined along the columns
    (one tile: returned as is)."""
    buf = _tile_buffer(k * min(rows, n))
    if rows >= n:
        return product(0, n, buf)
    return torch.cat([product(n0, min(n, n0 + rows), buf) for n0 in range(0, n, rows)], dim=1)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor) -> torch.Tensor | None:
    """fp32 [T, N] = x [T, K] @ w [N, K]ᵀ, w = d·c + m (module docstring), or None where the kernels do not serve.
    x: float32 [T, K] contiguous on the CPU; packed: uint8 [N, K/2] codes as _convert_weight_to_int4pack_for_cpu
    writes them; dm: fp16 [K/32, 2, N] (reference.group_scales)."""
    if x.device.type != "cpu" or x.dim() != 2:
        return None
    if x.shape[0] <= MAX_KERNEL_ROWS:
        return int4_cpu.int4_mm(x, packed, dm)
    if not int4_cpu.takes(x, packed, dm):
        return None
    n, k = dm.shape[2], x.shape[1]
    return _by_tiles(n, k, max(32, TILE_VALUES // k // 32 * 32),
                     lambda n0, n1, buf: torch.mm(x, int4_cpu.dequant_t(packed, dm, n0, n1, buf)))


def kernel_scales(d: torch.Tensor, m: torch.Tensor) -> torch.Tensor | None:
    """The C kernel's scales of a weight d·c + m (reference.group_scales: fp16 [K/32, 2, N], 4 B a group of 32), or
    None where the kernel does not serve here (then nothing is held for it). d, m: [N, K/32]."""
    if d.shape[0] % 32 or not int4_cpu.available():
        return None
    return reference.group_scales(d, m)


def q8_serves(q: torch.Tensor, d: torch.Tensor) -> bool:
    """Whether q8_mm serves this Q8_0 table (q8_cpu.takes: int8 codes [N, K] and fp32 d [N, K/32], the kernels
    built here)."""
    return q8_cpu.takes(q, d)


def q8_mm(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor | None:
    """fp32 [T, N] = x [T, K] @ (d·q)ᵀ of a Q8_0 table (q int8 [N, K], d fp32 [N, K/32]: GroupQuant's q and d), exact
    in fp32, or None where the kernels do not serve (q8_serves) or x is not a CPU [T, K] float tensor."""
    if x.device.type != "cpu" or x.dim() != 2 or not x.is_floating_point() or not q8_serves(q, d):
        return None
    x = x.float().contiguous()
    if x.shape[0] <= MAX_KERNEL_ROWS:
        return q8_cpu.q8_mm(x, q, d)
    n, k = q.shape
    return _by_tiles(n, k, max(1, TILE_VALUES // k),
                     lambda n0, n1, buf: torch.nn.functional.linear(x, q8_cpu.dequant(q, d, n0, n1, buf)))


def weight_kernel() -> str:
    """What runs a GGUF's quantized weights here, for the vram_plan line: "cpu (C kernels, exact fp32)" where both
    kernel libraries serve; else which part runs in torch and why, e.g. "int4 torch bf16 (<why>), q8_0 head cpu".
    Builds them when not built yet (about a second each, once per machine)."""
    int4, q8 = int4_cpu.available(), q8_cpu.available()
    if int4 and q8:
        return "cpu (C kernels, exact fp32)"
    return (f"int4 {'cpu' if int4 else f'torch bf16 ({int4_cpu.error()})'}, "
            f"q8_0 head {'cpu' if q8 else f'int8 candidates ({q8_cpu.error()})'}")

"""The torch reference of the C int4 kernel's operands (int4_cpu.c): a 4-bit GGUF weight w = d·c + m per group of 32
(ignisd.model.quant.GroupQuant's form), its codes c read from torch's CPU int4 layout
(``_convert_weight_to_int4pack_for_cpu``) and its d, m from `group_scales`, applied in fp32: the definition the kernel
is tested against, and the form the layout probe checks torch's packer with.

Codes (as torch 2.13's CPU packer writes them, innerKTiles 1; `unpack_codes` is checked against the packer itself):
packed uint8 [N, K/2] holds N/32 blocks of [K][16] bytes; byte j of (block nb, column k) has code c[32·nb + j][k] in
its low nibble and c[32·nb + j + 16][k] in its high nibble. Scales: dm fp16 [K/32, 2, N], per group the N d's then
the N m's (GGUF stores both in fp16, so they are the file's values exactly).
"""
from __future__ import annotations

import torch

GROUP = 32
BLOCK_N = 32


def unpack_codes(packed: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """uint8 [n, k] codes 0..15 of a packed [n, k/2] uint8 weight (module layout). Raises ValueError when n is not a
    multiple of 32 or the byte count is not n·k/2."""
    if n % BLOCK_N or packed.numel() != n * k // 2:
        raise ValueError(f"unpack_codes: {packed.numel()} bytes for a [{n}, {k}] weight in blocks of {BLOCK_N} rows")
    b = packed.reshape(n // BLOCK_N, k, BLOCK_N // 2)
    lo, hi = b & 0x0F, b >> 4                                   # [nb, k, 16] each: rows j and j + 16 of the block
    rows = torch.cat((lo, hi), dim=2)                           # [nb, k, 32]
    return rows.permute(0, 2, 1).reshape(n, k)


def group_scales(d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """The kernel's scales of w = d·c + m: fp16 [K/32, 2, N] from d, m [N, K/32] (any float dtype; exact for the
    fp16 values a GGUF block holds, and for Q4_0's m = −8d)."""
    return torch.stack((d.t(), m.t()), dim=1).to(torch.float16).contiguous()


def dequantize(packed: torch.Tensor, dm: torch.Tensor, n: int, k: int) -> torch.Tensor:
    """fp32 [n, k] weight d·c + m of packed codes [n, k/2] and their scales dm [k/32, 2, n] (group_scales)."""
    c = unpack_codes(packed, n, k).float().view(n, k // GROUP, GROUP)
    s = dm.float()
    d, m = s[:, 0].t()[:, :, None], s[:, 1].t()[:, :, None]                # [n, k/32, 1]
    return (c * d + m).view(n, k)


def int4_mm(x: torch.Tensor, packed: torch.Tensor, dm: torch.Tensor) -> torch.Tensor:
    """fp32 [T, N] = x [T, K] (any float dtype, computed in fp32) @ the weight's transpose (N = dm.shape[2])."""
    n, k = dm.shape[2], x.shape[1]
    return x.float() @ dequantize(packed, dm, n, k).t()


def q8_dequantize(q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """fp32 [N, K] weight d·q of a Q8_0 table: q int8 [N, K], d fp32 [N, K/32] (exact: d·q needs at most 19 bits)."""
    n, k = q.shape
    return (q.float().view(n, k // GROUP, GROUP) * d[:, :, None]).view(n, k)


def q8_mm(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """fp32 [T, N] = x [T, K] (computed in fp32) @ the Q8_0 table's transpose."""
    return x.float() @ q8_dequantize(q, d).t()

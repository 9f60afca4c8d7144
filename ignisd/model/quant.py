"""GGUF block-quantized weights kept quantized: the codes and scales of a Q4_0 / Q4_1 / Q8_0 tensor, unpacked from the
file's blocks into torch tensors the linear kernels (ignisd.model.linear) repack.

Block layouts (ggml's ggml-common.h, the GGUF spec's "quantization types"; 32 weights a block, d and m IEEE fp16):
- Q4_0 (18 B): d, qs[16]; weight j = d·(qs[j] & 0xF − 8), weight j+16 = d·(qs[j] >> 4 − 8).
- Q4_1 (20 B): d, m, qs[16]; weight j = d·(qs[j] & 0xF) + m, weight j+16 = d·(qs[j] >> 4) + m.
- Q8_0 (34 B): d, qs[32] int8; weight j = d·qs[j].
All three are ``w = d·q + m`` per block with q an integer code (m = −8d for Q4_0, m = 0 for Q8_0): that is the one
form held here. d·q is exact in fp32 (11-bit × ≤ 8-bit significands), so ``dequantize`` equals gguf's own
``gguf.quants.dequantize`` bit for bit on Q4_0 / Q8_0, and to fp32 rounding of the one addition on Q4_1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32
"""Weights per GGUF block (QK4_0 = QK4_1 = QK8_0 = 32)."""

# type name -> (block bytes, code bits)
_LAYOUT = {"Q4_0": (18, 4), "Q4_1": (20, 4), "Q8_0": (34, 8)}
QUANT_TYPES = tuple(_LAYOUT)
"""The GGUF types kept quantized (others are dequantized by the gguf package)."""


@dataclass
class GroupQuant:
    """A [N, K] weight as integer codes and per-32 scales: ``w[n, k] = d[n, k // 32] · q[n, k] + m[n, k // 32]``.

    kind: the GGUF type it came from ("Q4_0", "Q4_1", "Q8_0"). q: [N, K] codes, uint8 0..15 for the 4-bit kinds,
    int8 −128..127 for Q8_0. d, m: float32 [N, K / 32] (m all zero for Q8_0; −8d for Q4_0).
    K must be a multiple of 32 (it is, in every GGUF row of these types).
    """

    kind: str
    q: torch.Tensor
    d: torch.Tensor
    m: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        """(N, K): output rows, input columns (HF's [out, in] weight shape)."""
        return tuple(self.q.shape)

    @property
    def bits(self) -> int:
        """Code width: 4 or 8."""
        return _LAYOUT[self.kind][1]

    def take_rows(self, index: torch.Tensor) -> "GroupQuant":
        """The rows `index` (LongTensor) in that order: a row permutation (GGUF's Q/K un-permute) or a gather."""
        return GroupQuant(self.kind, self.q[index], self.d[index], self.m[index])

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The dense [N, K] weight d·q + m, computed in fp32 and cast to `dtype`."""
        n, k = self.shape
        w = self.q.float().view(n, k // GROUP, GROUP) * self.d[:, :, None] + self.m[:, :, None]
        return w.view(n, k).to(dtype)

    def dequantize_rows(self, index: torch.Tensor) -> torch.Tensor:
        """fp32 [len(index), K]: rows `index` (LongTensor [R]) of ``dequantize()``, equal to it bit for bit, without
        building the sub-GroupQuant (the embedding lookup and the LM head's exact rescoring run this every step)."""
        k = self.q.shape[1]
        w = self.q.index_select(0, index).float().view(-1, k // GROUP, GROUP)
        w.mul_(self.d.index_select(0, index).unsqueeze(-1))
        if self.kind != "Q8_0":                   # m is zero for Q8_0: adding it changes nothing
            w.add_(self.m.index_select(0, index).unsqueeze(-1))
        return w.view(-1, k)

    @property
    def nbytes(self) -> int:
        """Bytes held here (codes at one byte each, scales at fp32)."""
        return self.q.numel() * self.q.element_size() + 4 * (self.d.numel() + self.m.numel())


def cat_rows(parts: list["GroupQuant"]) -> "GroupQuant":
    """Concatenate along the output rows (a fused QKV or gate+up projection). Raises ValueError on mixed kinds or
    inner sizes."""
    kinds = {p.kind for p in parts}
    if len(kinds) != 1 or len({p.shape[1] for p in parts}) != 1:
        raise ValueError(f"cat_rows: parts of kinds {sorted(kinds)} and shapes {[p.shape for p in parts]}")
    return GroupQuant(parts[0].kind, torch.cat([p.q for p in parts]), torch.cat([p.d for p in parts]),
                      torch.cat([p.m for p in parts]))


def from_gguf_blocks(kind: str, raw: np.ndarray, shape: tuple[int, int]) -> GroupQuant:
    """Unpack the blocks of one GGUF tensor.

    kind: "Q4_0" | "Q4_1" | "Q8_0". raw: its bytes as gguf.GGUFReader gives them (uint8, any shape, N·K/32 blocks in
    row-major order). shape: (N, K) in HF order (ggml lists dims fastest first: reverse them). Returns a GroupQuant
    owning its memory. Raises ValueError for another kind, K not a multiple of 32, or a byte count that does not
    match.
    """
    if kind not in _LAYOUT:
        raise ValueError(f"no block layout for GGUF type {kind}; known: {', '.join(QUANT_TYPES)}")
    n, k = shape
    block_bytes, _ = _LAYOUT[kind]
    if k % GROUP or raw.size != n * k // GROUP * block_bytes:
        raise ValueError(f"{kind} tensor {shape}: {raw.size} bytes, expected {n * k // GROUP * block_bytes}")
    blocks = np.ascontiguousarray(raw, dtype=np.uint8).reshape(n, k // GROUP, block_bytes)
    d = blocks[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if kind == "Q8_0":
        q = blocks[..., 2:].copy().view(np.int8).reshape(n, k)
        m = np.zeros_like(d)
    else:
        qs = blocks[..., 4:] if kind == "Q4_1" else blocks[..., 2:]
        q = np.concatenate((qs & 0x0F, qs >> 4), axis=-1).reshape(n, k)      # low nibbles: j, high: j + 16
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if kind == "Q4_1" else -8.0 * d
    return GroupQuant(kind, torch.from_numpy(np.ascontiguousarray(q)), torch.from_numpy(d), torch.from_numpy(m))

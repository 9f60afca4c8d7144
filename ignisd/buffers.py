"""BufferSpec: one named, fixed-shape tensor buffer, as listed by a model spec (per-sequence state) or a KV format
(page buffers, per-sequence state). †: imports no torch.

A buffer is described by plain data so that the control plane (cache/, the scheduler) can size and account for
storage without importing torch or the model: the storage classes (cache/kv_store.py, cache/state_store.py) turn a
list of BufferSpecs into tensors.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1, "int16": 2, "int32": 4, "int64": 8}
"""Bytes per element of every storage dtype a buffer may have (torch dtype names)."""


@dataclass(frozen=True)
class BufferSpec:
    """One buffer: `name` (unique in its list), `shape` (elements; per slot for state, per token for a page buffer),
    `dtype` (a key of DTYPE_BYTES). Raises ValueError for an unknown dtype or a negative dimension."""

    name: str
    shape: tuple[int, ...]
    dtype: str

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"buffer {self.name}: dtype {self.dtype!r} not one of {sorted(DTYPE_BYTES)}")
        if any(d < 0 for d in self.shape):
            raise ValueError(f"buffer {self.name}: negative dimension in {self.shape}")

    @property
    def numel(self) -> int:
        """Elements in one instance (product of shape; 1 for shape ())."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of one instance: numel × element size."""
        return self.numel * DTYPE_BYTES[self.dtype]


def total_bytes(buffers: list[BufferSpec] | tuple[BufferSpec, ...]) -> int:
    """Bytes of one instance of every buffer in `buffers` together."""
    return sum(b.nbytes for b in buffers)

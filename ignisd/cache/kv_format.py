"""KV formats (DESIGN §4.6): a format is the list of page buffers it stores per token and attention layer, plus the
per-sequence state it needs beside the pages. †: imports no torch.

A format is sized against a KV geometry: the number of full-attention layers, KV heads and head dim. `KVGeometry`
holds those three numbers; a ModelSpec has attributes of the same names and may be passed wherever a geometry is
read (duck-typed: cache/ never imports model/).

The dense formats (fp32, bf16) store K and V as they are: page buffers "k" and "v", each [Hkv, d] per token and
layer in the format's dtype, and no per-sequence state. hq-e8-2b (HQ_E8_2B.md) will add code and metadata page
buffers, and an exact window (plus exact sinks) as per-sequence state.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ignisd.buffers import BufferSpec, total_bytes


class Geometry(Protocol):
    """Anything with the three KV-geometry attributes (a KVGeometry, a ModelSpec)."""

    n_attention_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVGeometry:
    """The shape of a model's KV cache: n_attention_layers (layers that keep K/V), num_kv_heads (Hkv), head_dim (d).
    Raises ValueError for a negative layer count or a head count / dim below 1."""

    n_attention_layers: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if self.n_attention_layers < 0 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ValueError(f"KV geometry needs n_attention_layers >= 0, num_kv_heads >= 1 and head_dim >= 1, got "
                             f"{self.n_attention_layers}, {self.num_kv_heads}, {self.head_dim}")

    @classmethod
    def of(cls, geom: Geometry) -> "KVGeometry":
        """The geometry of `geom` (a KVGeometry or anything with the same attributes, e.g. a ModelSpec)."""
        return cls(int(geom.n_attention_layers), int(geom.num_kv_heads), int(geom.head_dim))


@dataclass(frozen=True)
class KVFormat:
    """One KV storage format.

    name: the config / wire literal ("fp32", "bf16"). tag: the attention dispatch tag of its pages
    (ignis_kernels.attention.PagedView.tag; "dense" for fp32 and bf16). dtype: the storage dtype of the dense K and
    V buffers (a torch dtype name: "float32", "bfloat16").
    """

    name: str
    tag: str
    dtype: str

    def page_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """The buffers of one token of one attention layer in a page: dense [BufferSpec("k", (Hkv, d), dtype),
        BufferSpec("v", (Hkv, d), dtype)]. A page of one layer holds page_tokens of each."""
        shape = (int(geom.num_kv_heads), int(geom.head_dim))
        return [BufferSpec("k", shape, self.dtype), BufferSpec("v", shape, self.dtype)]

    def seq_state_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """The per-sequence state this format keeps beside the pages (one instance per state slot): [] for the dense
        formats (hq-e8-2b: its exact window and sinks)."""
        return []

    def bytes_per_token(self, geom: Geometry) -> int:
        """Bytes one token occupies in the pages across all attention layers: n_attention_layers × Σ page buffer
        bytes (dense: 2 · L · Hkv · d · element size)."""
        return int(geom.n_attention_layers) * total_bytes(self.page_buffers(geom))

    def page_bytes(self, geom: Geometry, page_tokens: int) -> int:
        """Bytes of one page of `page_tokens` tokens across all attention layers."""
        return page_tokens * self.bytes_per_token(geom)


KV_FORMATS: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", "dense", "float32"),
    "bf16": KVFormat("bf16", "dense", "bfloat16"),
}
"""The formats this build stores, by name (hq-e8-2b arrives with its kernels)."""


def get_kv_format(name: str) -> KVFormat:
    """Return the KVFormat called `name`. Raises ValueError naming the allowed formats when `name` is unknown."""
    try:
        return KV_FORMATS[name]
    except KeyError:
        raise ValueError(f"kv_format {name!r} is not supported; allowed: {', '.join(KV_FORMATS)}") from None

"""DevicePages: the KV pool's storage on the compute device (DESIGN §4.1, §4.6).

One K and one V tensor of shape [n_attention_layers, num_pages * page_tokens, num_kv_heads, head_dim] in the KV
format's dtype (fp32 or bf16). A slot is page * page_tokens + offset. Which pages belong to whom is the page
pool's business (cache/page_pool.py); this class only stores bytes.
"""
from __future__ import annotations

import torch

from ignisd.cache.kv_format import get_kv_format
from ignisd.model.spec import ModelSpec


class DevicePages:
    """K/V page storage.

    spec: the model (n_attention_layers, num_kv_heads, head_dim). num_pages: pages in the pool (>= 1).
    kv_format: "fp32" | "bf16" (ValueError otherwise). page_tokens: tokens per page (64). device: torch device.
    Attributes k, v: Tensor [n_attention_layers, num_pages * page_tokens, num_kv_heads, head_dim], storage dtype,
    zero-initialised.
    """

    def __init__(self, spec: ModelSpec, num_pages: int, kv_format: str, page_tokens: int = 64,
                 device: str | torch.device = "cpu") -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"DevicePages needs num_pages >= 1 and page_tokens >= 1, got {num_pages}, {page_tokens}")
        self.spec = spec
        self.format = get_kv_format(kv_format)
        self.kv_format = kv_format
        self.dtype = getattr(torch, self.format.torch_dtype)
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self.device = torch.device(device)
        shape = (spec.n_attention_layers, num_pages * page_tokens, spec.num_kv_heads, spec.head_dim)
        self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)

    @property
    def num_slots(self) -> int:
        """Token slots in the pool (num_pages * page_tokens)."""
        return self.num_pages * self.page_tokens

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across all attention layers, K and V
        (= page_tokens * spec.kv_bytes_per_token(kv_format))."""
        return self.page_tokens * self.spec.kv_bytes_per_token(self.kv_format)

    @property
    def nbytes(self) -> int:
        """Bytes held by the K and V tensors."""
        return self.k.numel() * self.k.element_size() + self.v.numel() * self.v.element_size()

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values of T tokens of attention layer `layer` (index among attention layers).

        slot_mapping: LongTensor [T]; k, v: [T, num_kv_heads, head_dim], any float dtype (cast to the storage dtype,
        round-to-nearest for bf16).
        """
        self.k[layer].index_copy_(0, slot_mapping, k.to(self.dtype))
        self.v[layer].index_copy_(0, slot_mapping, v.to(self.dtype))

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Read K and V of `slots` (LongTensor [S]) of attention layer `layer`.

        Returns (k, v), each float32 [S, num_kv_heads, head_dim] (bf16 storage is upcast exactly).
        """
        k = self.k[layer].index_select(0, slots)
        v = self.v[layer].index_select(0, slots)
        return k.float(), v.float()

    def pages(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views of attention layer `layer`'s K and V as pages: each [num_pages, page_tokens, num_kv_heads, head_dim]
        in the storage dtype (what ignis_kernels.attention reads)."""
        shape = (self.num_pages, self.page_tokens, self.spec.num_kv_heads, self.spec.head_dim)
        return self.k[layer].view(shape), self.v[layer].view(shape)

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy whole pages src[i] -> dst[i] in every attention layer (copy-on-write of a partial last page)."""
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        pt = self.page_tokens
        offs = torch.arange(pt, device=self.device)
        s = (torch.tensor(src, device=self.device)[:, None] * pt + offs).reshape(-1)
        d = (torch.tensor(dst, device=self.device)[:, None] * pt + offs).reshape(-1)
        self.k.index_copy_(1, d, self.k.index_select(1, s))
        self.v.index_copy_(1, d, self.v.index_select(1, s))

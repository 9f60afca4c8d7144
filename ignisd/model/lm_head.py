"""The token table: embedding rows in, logits out, over one [V, H] weight (tied on SmolLM2) in a weight format.

- ``DenseTable``: a dense [V, H] tensor (fp32: the exact reference; bf16): F.embedding rows, F.linear logits.
- ``QuantTable``: a GroupQuant table (the built-in model's Q8_0 token_embd). Rows are dequantized exactly (d·c in
  fp32, as gguf's dequantize). Logits run through a fast head (``head``: the Q8_0 weight as two int4 layouts,
  linear.Int8x2Linear, or bf16) whose products come back rounded to bf16 — up to 2^-9 relative, 0.06 on a logit of
  20 — so the ``rescore`` largest logits of each row are then recomputed exactly in fp32 from the dequantized rows:
  the tokens that carry the probability get fp32 logits (argmax and sampling match the fp32 route), the tail keeps
  the fast ones.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ignisd.model.linear import INT4_AVAILABLE, Bf16Linear, Int8x2Linear
from ignisd.model.quant import GroupQuant

RESCORE = 64
"""Logits per row recomputed exactly in fp32 by QuantTable (measured on 20 real prompts in tools/bench_weights.py)."""


class DenseTable:
    """Embedding and LM head over a dense table w [V, H] (any float dtype). Attributes w, shape."""

    def __init__(self, w: torch.Tensor) -> None:
        self.w = w
        self.shape = tuple(w.shape)

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The resident tensors (for weight_bytes)."""
        return [self.w]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """LongTensor [T] -> fp32 [T, H]."""
        return F.embedding(ids, self.w).float()

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> fp32 [N, V] = x · wᵀ (x cast to w's dtype)."""
        return F.linear(x.to(self.w.dtype), self.w).float()


class QuantTable:
    """Embedding and LM head over a GroupQuant table (module docstring).

    w: GroupQuant [V, H]. head: "int8x2" (Q8_0 only, needs the int4 kernels) or "bf16" (a bf16 copy of the
    dequantized table). rescore: logits per row recomputed exactly (0: none). Raises ValueError for another head or
    int8x2 on a kind other than Q8_0.
    """

    def __init__(self, w: GroupQuant, head: str = "int8x2", rescore: int = RESCORE) -> None:
        self.table, self.shape, self.rescore = w, w.shape, rescore
        if head == "int8x2" and INT4_AVAILABLE and w.kind == "Q8_0":
            self.head = Int8x2Linear(w)
        elif head in ("bf16", "int8x2"):
            self.head = Bf16Linear(w.dequantize())
        else:
            raise ValueError(f"QuantTable: head {head!r}; known: int8x2, bf16")

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        return [self.table.q, self.table.d, self.table.m, *self.head.tensors]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """LongTensor [T] -> fp32 [T, H], the file's weights exactly."""
        return self.table.dequantize_rows(ids)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> fp32 [N, V]: the fast head, then the `rescore` largest of each row recomputed in fp32."""
        out = self.head(x).float()
        k = min(self.rescore, out.shape[1])
        if k:
            top = out.topk(k, dim=1, sorted=False).indices                       # [N, k]
            w = self.rows(top.reshape(-1)).view(*top.shape, -1)                 # [N, k, H]
            exact = (w * x.float().unsqueeze(1)).sum(-1)      # [N, k] (MKL's bmm takes 6x longer on these shapes)
            out.scatter_(1, top, exact)
        return out

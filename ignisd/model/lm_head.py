"""The token table: embedding rows in, logits out, over one [V, H] weight (tied on SmolLM2) in a weight format.

- ``DenseTable``: a dense [V, H] tensor (fp32: the exact reference; bf16): F.embedding rows, F.linear logits (a
  bf16 table's top logits rescored in fp32 as below: on the 20-prompt check mean KL 9.6e-4 -> 5.4e-4 and greedy
  identity 12/20 -> 17/20).
- ``QuantTable``: a GroupQuant table (the built-in model's Q8_0 token_embd). Rows are dequantized exactly (d·c in
  fp32, as gguf's dequantize). A Q8_0 table's logits are exact fp32 products where ignis_kernels.linear's Q8_0
  kernels serve (an AVX2 CPU: q8_mm over the table's own codes and d, nothing else held; on the built-in model one
  row's logits in about half the time of the int8 head below plus its rescoring). Elsewhere logits run through a fast
  candidate head, then the ``rescore`` largest logits of each
  row are recomputed exactly in fp32 from the dequantized rows: the tokens that carry the probability get the fp32
  route's logits (argmax and sampling among them match it), the tail keeps the fast ones. Heads (``head``):
  "int8" (default: the table requantized to int8 with a scale per row, torch's _weight_int8pack_mm, 28 MB; the
  fastest at 1 and 8 rows in tools/bench_weights.py), "int8x2" (the Q8_0 codes exactly as two int4 layouts,
  linear.Int8x2Linear, 35 MB, ~1.5x slower) or "bf16" (57 MB). Every head's products come back rounded to bf16
  (up to 2^-9 relative: 0.06 on a logit of 20), which is why the top is rescored.
  On the 20-prompt check (tests/model/weight_quality.py) native's mean KL against fp32 is 7.2e-4 with int8x2 and
  rescore 64, 8.6e-4 with int8 and 64, 7.9e-4 with int8 and 128 (the default), 1.6e-3 with no rescoring.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import ignis_kernels.linear as klinear
from ignisd.model.linear import INT4_AVAILABLE, Bf16Linear, Int8RowLinear, Int8x2Linear
from ignisd.model.quant import GroupQuant

RESCORE = 128
"""Logits per row recomputed exactly in fp32 by QuantTable (module docstring for the measured choice)."""


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
        """x [N, H] -> fp32 [N, V] = x · wᵀ (x cast to w's dtype). Under a bf16 table the products come back
        rounded to bf16, so the RESCORE largest of each row are recomputed in fp32 (rescore_top)."""
        out = F.linear(x.to(self.w.dtype), self.w).float()
        if self.w.dtype != torch.float32:
            rescore_top(out, x, self.rows, RESCORE)
        return out


class QuantTable:
    """Embedding and LM head over a GroupQuant table (module docstring).

    w: GroupQuant [V, H]. head: "exact" (the default: a Q8_0 table's exact products by klinear.q8_mm where they serve,
    else "int8") | "int8" | "int8x2" (Q8_0 with the int4 kernels; else bf16) | "bf16". rescore: logits per row
    recomputed exactly by a candidate head (0: none). Attribute head: the candidate head, None under "exact" served.
    Raises ValueError for another head.
    """

    def __init__(self, w: GroupQuant, head: str = "exact", rescore: int = RESCORE) -> None:
        self.table, self.shape, self.rescore = w, w.shape, rescore
        self.head = None
        if head == "exact":
            if w.kind == "Q8_0" and klinear.q8_serves(w.q, w.d):
                return
            head = "int8"
        if head == "int8x2" and INT4_AVAILABLE and w.kind == "Q8_0":
            self.head = Int8x2Linear(w)
        elif head == "int8":
            self.head = Int8RowLinear(w)
        elif head in ("bf16", "int8x2"):
            self.head = Bf16Linear(w.dequantize())
        else:
            raise ValueError(f"QuantTable: head {head!r}; known: exact, int8, int8x2, bf16")

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident tensors (for weight_bytes; None for an absent bias)."""
        return [self.table.q, self.table.d, self.table.m, *(self.head.tensors if self.head is not None else [])]

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """LongTensor [T] -> fp32 [T, H], the file's weights exactly."""
        return self.table.dequantize_rows(ids)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x [N, H] -> fp32 [N, V]: exact (klinear.q8_mm) without a candidate head; else the candidate head, then the
        `rescore` largest of each row recomputed in fp32."""
        if self.head is None:
            out = klinear.q8_mm(x, self.table.q, self.table.d)
            return out if out is not None else F.linear(x.float(), self.table.dequantize())   # not a CPU float x
        out = self.head(x).float()
        rescore_top(out, x, self.rows, self.rescore)
        return out


def rescore_top(out: torch.Tensor, x: torch.Tensor, rows, k: int) -> None:
    """Recompute in place the k largest logits of each row of out [N, V] as fp32 dot products of x [N, H] with the
    table rows ``rows(ids) -> fp32 [len(ids), H]``. k = 0: nothing."""
    k = min(k, out.shape[1])
    if k:
        top = out.topk(k, dim=1, sorted=False).indices                           # [N, k]
        w = rows(top.reshape(-1)).view(*top.shape, -1)                          # [N, k, H]
        out.scatter_(1, top, (w * x.float().unsqueeze(1)).sum(-1))   # (MKL's bmm takes 6x longer on these shapes)

"""The exact recent window and sinks of a compressed KV format (HQ_E8_2B.md §4.3), as attention reads them.

Window rule (page-granular; Wp = window_pages, pt = page_tokens, page(j) = j // pt): a query at position p reads key
j exact when j < S (a sink) or page(j) >= page(p) − Wp (the current page and the Wp pages before it), and from the
compressed pages otherwise. So a page is encoded exactly when the first token of the page Wp + 1 after it is
written, and at context c (positions 0 .. c−1 written) the encoded pages are [0, encoded_pages(c)). The rule
depends only on (p, j): a prefill chunk and a decode step read the same representation of every key, whatever the
chunking.

Exact keys/values are held in the rotated domain (u = H·(s ⊙ x)/√d, §4.2), float32 on read:
- `ExactSpan` (one prefill chunk): the exact keys/values of positions [first, ctx) in position order, and the sinks;
- `ExactRing` (a batch of decode steps): each sequence's ring of R = (Wp + 1)·pt slots (slot = position % R) and
  its sinks.
Under key/value centering (HQ_E8_2B.md §4.3) every stored key and value of a centred sequence is x − μ, exact ones
included, and `center_v` carries the rotated μ_V the attention output gets back (o += s_V ⊙ H·μ_V/√d); keys need
nothing back, since q·μ_K shifts all of a query's scores alike.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


def encoded_pages(ctx: int, window_pages: int, page_tokens: int) -> int:
    """Pages [0, n) encoded once positions 0 .. ctx−1 are written: max(0, (ctx − 1) // pt − Wp) (0 for ctx 0)."""
    if ctx <= 0:
        return 0
    return max(0, (ctx - 1) // page_tokens - window_pages)


def window_start(pos: int, window_pages: int, page_tokens: int) -> int:
    """First position a query at `pos` reads exact (besides the sinks): pt · max(0, page(pos) − Wp)."""
    return page_tokens * max(0, pos // page_tokens - window_pages)


@dataclass(frozen=True)
class ExactSpan:
    """Exact keys/values one prefill chunk reads.

    k, v: float32 [m, Hkv, d], rotated, of positions first .. first+m−1 (= the chunk's context end − 1).
    sink_k, sink_v: float32 [s, Hkv, d] rotated, positions 0 .. s−1 (s = min(sinks, ctx); s may be 0).
    sinks: S, the format's sink count (keys j < S are read from sink_k/sink_v). window_pages: Wp.
    center_v: float32 [Hkv, d], the rotated μ_V added back to the output when the sequence is centred; else None.
    """

    k: torch.Tensor
    v: torch.Tensor
    first: int
    sink_k: torch.Tensor
    sink_v: torch.Tensor
    sinks: int
    window_pages: int
    center_v: torch.Tensor | None = None


@dataclass(frozen=True)
class ExactRing:
    """Exact keys/values a batch of B decode steps reads (each sequence's new token already written).

    k, v: float32 [B, R, Hkv, d] rotated; slot r of row b holds the position ≡ r (mod R) in [ctx_b − R, ctx_b).
    sink_k, sink_v: float32 [B, S, Hkv, d] rotated (S may be 0). window_pages: Wp; R = (Wp + 1) · page_tokens.
    center_v: float32 [B, Hkv, d], each row's rotated μ_V (zero for a row not centred yet), or None (no centering).
    """

    k: torch.Tensor
    v: torch.Tensor
    sink_k: torch.Tensor
    sink_v: torch.Tensor
    window_pages: int
    center_v: torch.Tensor | None = None

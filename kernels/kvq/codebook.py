"""The E8P codebook of hq-e8-2b (HQ_E8_2B.md §1.1, §2.4): the 256-row abs table G, the parity bits, and the full
decode table of the 65,536 16-bit codewords. Pure torch, built once on first use (cached per device).

Codeword bit layout (§1.1): bits 15..8 `a` (row of G), bit 7 `t` (shift: 0 → +1/4, 1 → −1/4), bits 6..0 the negate
flags n0..n6 of coordinates 0..6; n7 = odd(a) XOR (popcount(bits 6..0) mod 2), odd(a) = (Σ_i G[a][i]) mod 2.
Decoded coordinate i: c_i = (n_i ? −G[a][i] : +G[a][i]) + (t ? −1/4 : +1/4). Codes are stored as int16 (the u16 bit
pattern); `code & 0xFFFF` recovers the unsigned value.

Conformance (§2.4, measured): sha256 of G as f32 LE = ABS_TABLE_SHA256; of decode(0..65535) as f32 LE =
DECODE_TABLE_SHA256.
"""
from __future__ import annotations

import itertools
from functools import lru_cache

import torch

ABS_TABLE_SHA256 = "9a9f4c1f78508987cdf33e9b8e79b12fedbae2b8a5024718a47e4050c1761574"
DECODE_TABLE_SHA256 = "575424b0a3819458e87db8850996f6df7d17b691d687b029cc8e617fceffd5ca"
N_CODES = 1 << 16
CHUNK = 8
"""Coordinates per codeword (one 8-dim E8P chunk)."""

# §2.4 rows 227..255: positions of the three 1/2 entries (the other five are 3/2), QuIP#'s current list, in order
_NORM12_HALVES = ((1, 2, 3), (0, 2, 3), (0, 1, 3), (0, 1, 2), (3, 6, 7), (3, 5, 7), (3, 4, 7), (3, 5, 6), (3, 4, 6),
                  (3, 4, 5), (2, 6, 7), (2, 5, 7), (2, 4, 7), (2, 5, 6), (2, 4, 6), (2, 4, 5), (1, 6, 7), (1, 5, 7),
                  (1, 4, 7), (1, 5, 6), (1, 4, 6), (0, 4, 5), (0, 6, 7), (0, 5, 7), (0, 4, 7), (0, 5, 6), (0, 4, 6),
                  (0, 1, 4), (2, 3, 7))


def abs_rows() -> list[tuple[float, ...]]:
    """The 256 rows of G in normative order (§2.4): rows 0..226 are every 8-vector over {1/2, 3/2, 5/2, 7/2} with
    Σg² ≤ 10 in itertools.product order; rows 227..255 the 29 norm²-12 rows of _NORM12_HALVES."""
    rows = [g for g in itertools.product((0.5, 1.5, 2.5, 3.5), repeat=CHUNK) if sum(x * x for x in g) <= 10]
    for halves in _NORM12_HALVES:
        rows.append(tuple(0.5 if i in halves else 1.5 for i in range(CHUNK)))
    return rows


@lru_cache(maxsize=None)
def _tables_cpu() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.tensor(abs_rows(), dtype=torch.float32)                       # [256, 8]
    odd = (g.sum(1).round().to(torch.int64) % 2)                            # [256] 0/1
    codes = torch.arange(N_CODES, dtype=torch.int64)
    a, t, low = codes >> 8, (codes >> 7) & 1, codes & 0x7F
    bits = (low[:, None] >> torch.arange(7)) & 1                            # [65536, 7]
    n7 = odd[a] ^ (bits.sum(1) % 2)
    neg = torch.cat((bits, n7[:, None]), dim=1).bool()                      # [65536, 8]
    rows = g[a]
    dec = torch.where(neg, -rows, rows) + torch.where(t.bool(), -0.25, 0.25)[:, None]
    return g, odd, dec.contiguous()


@lru_cache(maxsize=None)
def _tables_on(device: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(x.to(device) for x in _tables_cpu())   # type: ignore[return-value]


def abs_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """G: float32 [256, 8], entries in {1/2, 3/2, 5/2} (§2.4)."""
    return _tables_on(str(torch.device(device)))[0]


def odd_rows(device: torch.device | str = "cpu") -> torch.Tensor:
    """odd(a) = (Σ_i G[a][i]) mod 2 per row: int64 [256] of 0/1 (149 rows are odd)."""
    return _tables_on(str(torch.device(device)))[1]


def decode_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """Every codeword decoded (§2.5): float32 [65536, 8], row = the unsigned 16-bit code. Values are multiples of
    1/4 with |c_i| <= 2.75, exact in f16/bf16."""
    return _tables_on(str(torch.device(device)))[2]


@lru_cache(maxsize=None)
def _split_cpu() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, odd, _ = _tables_cpu()
    r = torch.arange(512)
    low, t, par_a = r & 0x7F, (r >> 7) & 1, r >> 8
    bits = (low[:, None] >> torch.arange(7)) & 1                            # n0..n6
    n7 = par_a ^ (bits.sum(1) % 2)
    neg = torch.cat((bits, n7[:, None]), dim=1).bool()
    signs = torch.where(neg, -1.0, 1.0)                                     # [512, 8]
    shift = torch.where(t.bool(), -0.25, 0.25)                              # [512]
    return odd.to(torch.int32), signs.contiguous(), shift


@lru_cache(maxsize=None)
def _split_on(device: str) -> tuple[torch.Tensor, ...]:
    return tuple(x.to(device) for x in _split_cpu())


def split_tables(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The codeword decode of §1.1 split into cache-resident tables (24 KB in all, against the 2 MB decode table):
    (G float32 [256, 8], odd int32 [256], signs float32 [512, 8] of ±1, shift float32 [512]); the sign row of a
    code is r = (code & 0xFF) | odd(code >> 8) << 8 (low byte: t and n0..n6; n7 from the parity), and
    decode(code) = G[code >> 8] ⊙ signs[r] + shift[r], exactly (every value is a multiple of 1/4)."""
    dev = str(torch.device(device))
    return (abs_table(dev), *_split_on(dev))


def gpu_row_words() -> torch.Tensor:
    """The GPU table form (§2.4): int64 [256], bits 2i+1:2i = level(g_i) = g_i − 1/2 ∈ {0,1,2}, bit 16 = odd(a)."""
    g, odd, _ = _tables_cpu()
    lv = (g - 0.5).round().to(torch.int64)
    return (lv << (2 * torch.arange(CHUNK))).sum(1) | (odd << 16)

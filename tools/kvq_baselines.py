"""Research KV quantizers to compare hq-e8-2b against (HQ_E8_2B.md §3, §5.4), run through the very same paged
attention, exact window, sinks and logit-variance correction as the real format (view tag "hq-sim").

A baseline is a `SimFormat` (page buffers: the decoded rotated vector "uhat" and its residual norm "resid",
float32, per kind and KV head) plus a quantizer (u [N, 2, Hkv, d] rotated, signs [2, Hkv, d]) -> {"uhat", "resid"}
given to KVStore(quantizer=...). Bytes per token are those of the simulation store, not of the baseline's own
packing; `BITS` gives each baseline's real bits per coordinate for the reports.

- lloyd2: Lloyd-Max 2-bit scalar on the rotated coordinates (levels ±0.4528σ, ±1.510σ, thresholds 0, ±0.9814σ;
  §3), per-vector scale with the unbiased fit ŝ = ‖u‖²/⟨u, q⟩ and resid = ‖ŝq − u‖ (so the variance correction
  applies: row 23 of §5.4);
- q4_0, q8_0: llama.cpp's block formats on the original (unrotated) vector: blocks of 32, one f16 scale each;
  q8_0: d = max|x|/127, q = round(x/d); q4_0: d = m/−8 with m the entry of largest magnitude, q = clamp(round(x/d) +
  8, 0, 15), x̂ = (q − 8)·d. Read plainly (resid 0: no correction), as llama.cpp does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ignis_kernels.kvq.rotation import rotate, unrotate
from ignisd.buffers import BufferSpec
from ignisd.cache.kv_format import HQFormat

BITS = {"hq-e8-2b": 2.25, "lloyd2": 2.125, "q4_0": 4.5, "q8_0": 8.5, "fp32": 32.0}
"""Bits per coordinate of each format's own packing at head_dim 64 (lloyd2: 2 bits + an f32 scale per 64)."""


@dataclass(frozen=True)
class SimFormat(HQFormat):
    """A research baseline under hq-e8-2b's window rule: page buffers uhat float32 [2, Hkv, d], resid float32
    [2, Hkv]."""

    def page_buffers(self, geom) -> list[BufferSpec]:
        h, d = int(geom.num_kv_heads), int(geom.head_dim)
        return [BufferSpec("uhat", (2, h, d), "float32"), BufferSpec("resid", (2, h), "float32")]


def sim_format(name: str, exact_window: int, exact_sinks: int, centering: str | bool | None = None,
               variance_correction: float | None = None) -> SimFormat:
    """The SimFormat of baseline `name` (a key of QUANTIZERS) with hq-e8-2b's window, sink, centering and
    variance-correction parameters (None: hq-e8-2b's defaults, so a baseline runs under the shipped policy)."""
    kw = {} if centering is None else {"centering": centering}
    if variance_correction is not None:
        kw["variance_correction"] = variance_correction
    return SimFormat(name, "hq-sim", "float32", exact_window=exact_window, exact_sinks=exact_sinks, **kw)


def lloyd2(u: torch.Tensor, signs: torch.Tensor) -> dict[str, torch.Tensor]:
    """Lloyd-Max 2-bit, rotated, unbiased per-vector scale (see the module docstring)."""
    sigma = u.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-30)
    y = u / sigma
    q = torch.where(y.abs() < 0.9814, 0.4528, 1.510) * torch.where(y < 0, -1.0, 1.0)
    uq = (u * q).sum(-1, keepdim=True)
    s = torch.where(uq > 0, (u * u).sum(-1, keepdim=True) / uq.clamp_min(1e-30), torch.zeros_like(uq))
    uhat = q * s
    return {"uhat": uhat, "resid": (uhat - u).norm(dim=-1)}


def _blocks(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // 32, 32)


def q8_0(u: torch.Tensor, signs: torch.Tensor) -> dict[str, torch.Tensor]:
    """llama.cpp q8_0 on the unrotated vector (see the module docstring)."""
    x = _blocks(unrotate(u, signs))
    d = (x.abs().amax(-1, keepdim=True) / 127).half().float()
    q = torch.round(x / torch.where(d > 0, d, torch.ones_like(d))).clamp(-127, 127)
    xh = (q * d).reshape(u.shape)
    return {"uhat": rotate(xh, signs), "resid": torch.zeros(u.shape[:-1])}


def q4_0(u: torch.Tensor, signs: torch.Tensor) -> dict[str, torch.Tensor]:
    """llama.cpp q4_0 on the unrotated vector (see the module docstring)."""
    x = _blocks(unrotate(u, signs))
    idx = x.abs().argmax(-1, keepdim=True)
    m = x.gather(-1, idx)
    d = (m / -8).half().float()
    q = torch.clamp(torch.round(x / torch.where(d != 0, d, torch.ones_like(d))) + 8, 0, 15)
    xh = ((q - 8) * d).reshape(u.shape)
    return {"uhat": rotate(xh, signs), "resid": torch.zeros(u.shape[:-1])}


QUANTIZERS = {"lloyd2": lloyd2, "q4_0": q4_0, "q8_0": q8_0}

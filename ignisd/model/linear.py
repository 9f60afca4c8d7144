"""Linear layers in the weight formats of ``model.weight_format`` (DESIGN §6): one class per storage form, each
called as ``y = lin(x)`` with x [T, in] and y [T, out].

- ``DenseLinear``: an fp32 (or any float) weight stored transposed [in, out], ``torch.mm`` / ``addmm``: the exact
  reference (``fp32``) and the form of every tensor without a kernel.
- ``Bf16Linear``: a bf16 weight [out, in], bf16 activations, fp32 accumulation (oneDNN, avx512_bf16): ``bf16``.
- ``Int4Linear``: a 4-bit GGUF weight (Q4_0 / Q4_1) in torch's CPU int4 layout (``_convert_weight_to_int4pack_for_cpu``
  / ``_weight_int4pack_mm_for_cpu``, group size 32). That kernel dequantizes ``w = (c − 8)·scale + zero`` per group;
  a GGUF block ``w = d·c + m`` is therefore scale = d, zero = m + 8d, exactly the file's weights (up to the kernel's
  scale dtype). Used for ``native``.
- ``Int8x2Linear``: a Q8_0 weight as two int4 layouts: c = 16·hi + lo with lo = c & 15 in 0..15 and hi = c >> 4 in
  −8..7, so d·c = (hi + 8 − 8)·16d + (lo − 8)·d + 8d: two int4 matmuls summed, the file's weights exactly. Used for
  ``native`` Q8_0 matrices (none in the built-in model's layers; its Q8_0 embedding has its own head, lm_head.py).

Int4Linear and Int8x2Linear run in the kernels of ignis_kernels.linear where they serve (an AVX2 CPU; the packed
codes read in place, the file's fp16 d and m held beside them at 4 B a group): fp32 in and out, the file's weights
exactly; a few rows (decode) by a C product, about 2x faster than torch's int4 kernel at one row, more rows (prefill)
by an fp32 GEMM over the weight dequantized a tile at a time, about 2.5x faster than it at 256 rows on this project's
AVX2-only CPU. Elsewhere torch's int4 kernel serves, in bf16 (fp32 activations take a scalar path ~50x slower,
measured in tools/bench_weights.py): activations are rounded to bf16 on the way in, the product comes back in bf16
(rounded once from the kernel's fp32 accumulators) and is returned as is; callers add it into their fp32 residual
stream.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

import ignis_kernels.linear as klinear
from ignisd.model.quant import GROUP, GroupQuant

_INT4_PACK = getattr(torch.ops.aten, "_convert_weight_to_int4pack_for_cpu", None)
_INT4_MM = getattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu", None)
INT4_AVAILABLE = _INT4_PACK is not None and _INT4_MM is not None
"""Whether this torch has the CPU int4 weight-only kernels (torch >= 2.5)."""


class DenseLinear:
    """y = x @ wᵀ (+ b) with w [out, in] held transposed as w_t [in, out] contiguous (MKL's plain NN sgemm: on this
    project's CPU it measured faster than F.linear's NT form for one-token decode and ~5% for 256-token chunks).

    x: [T, in] in w's dtype. Returns [T, out] in that dtype. Attribute w_t, b.
    """

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None) -> None:
        self.w_t, self.b = w.t().contiguous(), b
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident tensors (for weight_bytes)."""
        return [self.w_t, self.b]

    def weight(self) -> torch.Tensor:
        """The dense [out, in] weight (a view)."""
        return self.w_t.t()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.mm(x, self.w_t) if self.b is None else torch.addmm(self.b, x, self.w_t)


class Bf16Linear:
    """y = bf16(x) @ bf16(w)ᵀ (+ b) accumulated in fp32 by oneDNN, returned in bf16.

    w: [out, in] any float dtype (rounded to bf16 once); b: optional [out] (kept fp32, added after).
    x: [T, in] any float dtype. Returns [T, out] bf16 (fp32 when a bias is added).
    """

    def __init__(self, w: torch.Tensor, b: torch.Tensor | None = None) -> None:
        self.w = w.to(torch.bfloat16).contiguous()
        self.b = None if b is None else b.float()
        self.in_features, self.out_features = w.shape[1], w.shape[0]

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident tensors (for weight_bytes; None for an absent bias)."""
        return [self.w, self.b]

    def weight(self) -> torch.Tensor:
        """The [out, in] weight as held (bf16-rounded), in fp32."""
        return self.w.float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x.to(torch.bfloat16), self.w)
        return y if self.b is None else y + self.b


def pack_int4(codes: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
              dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """torch's CPU int4 layout of ``w[n, k] = d[n, k/32]·codes[n, k] + m[n, k/32]``.

    codes: integer [N, K], values 0..15 (K a multiple of 32, N a multiple of 8 — the kernel's tile); d, m: float
    [N, K/32]. dtype: of the scales (bf16: the fast kernel; fp32: the exact slow path the tests use).
    Returns (packed uint8 [N, K/2], scales_and_zeros [K/32, N, 2] with scale = d and zero = m + 8d, since the kernel
    computes (c − 8)·scale + zero, dm): dm, the C decode kernel's fp16 d and m (ignis_kernels.linear.kernel_scales,
    4 B a group) with bf16 scales where that kernel serves, else None. Raises RuntimeError when this torch lacks the
    kernels.
    """
    if not INT4_AVAILABLE:
        raise RuntimeError("this torch has no CPU int4 weight kernels (_weight_int4pack_mm_for_cpu)")
    # in row blocks (the layout is row-blocked: packing blocks and concatenating is the same bytes), so the int32
    # copy the packer wants never exists for the whole matrix at once
    packed = torch.cat([_INT4_PACK(codes[i:i + _PACK_ROWS].to(torch.int32).contiguous(), 1)
                        for i in range(0, codes.shape[0], _PACK_ROWS)])
    sz = torch.stack((d.t(), (m + 8.0 * d).t()), dim=-1).to(dtype).contiguous()
    return packed, sz, klinear.kernel_scales(d, m) if dtype == torch.bfloat16 else None


def int4_mm(x: torch.Tensor, packed: torch.Tensor, sz: torch.Tensor, dm: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, K] @ the int4 weight's transpose -> [T, N] (packed, sz, dm: pack_int4's): fp32 from the kernels of
    ignis_kernels.linear when dm is given and x is fp32 (klinear.int4_mm: the file's weights and fp32 activations
    exactly), else torch's int4 kernel in sz's dtype (x cast to it; the cast and copy skipped when x already is in that
    dtype and contiguous)."""
    if dm is not None and x.dtype == torch.float32:
        y = klinear.int4_mm(x.contiguous(), packed, dm)
        if y is not None:
            return y
    if x.dtype != sz.dtype:
        x = x.to(sz.dtype)
    if not x.is_contiguous():
        x = x.contiguous()
    return _INT4_MM(x, packed, GROUP, sz)


class Int4Linear:
    """A 4-bit GGUF weight (GroupQuant kind Q4_0 / Q4_1) in torch's CPU int4 layout (pack_int4).

    w: GroupQuant [out, in]; b: optional [out] fp32 bias. scale_dtype: bf16 (default; the fast kernel, scales d and
    m + 8d rounded to bf16) or fp32 (exact scales, slow scalar kernel: the repack tests). x: [T, in]; returns
    [T, out] in scale_dtype, or fp32 when a bias is added or int4_mm's C kernel serves (fp32 x of at most 8 rows).
    Raises ValueError for a kind other than the 4-bit ones.
    """

    def __init__(self, w: GroupQuant, b: torch.Tensor | None = None, scale_dtype: torch.dtype = torch.bfloat16):
        if w.bits != 4:
            raise ValueError(f"Int4Linear: {w.kind} is not a 4-bit kind")
        self.packed, self.sz, self.dm = pack_int4(w.q, w.d, w.m, scale_dtype)
        self.b = None if b is None else b.float()
        self.out_features, self.in_features = w.shape

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident tensors (for weight_bytes; None for an absent bias)."""
        return [self.packed, self.sz, self.dm, self.b]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_mm(x, self.packed, self.sz, self.dm)
        return y if self.b is None else y + self.b


class Int8x2Linear:
    """A Q8_0 weight ``w = d·c`` (c int8) as two int4 layouts (module docstring): y = x·Whiᵀ + x·Wloᵀ with
    Whi = (c >> 4)·16d (scale 16d, zero 0) and Wlo = (c & 15)·d (scale d, zero 8d).

    w: GroupQuant kind Q8_0 [out, in]; b, scale_dtype, call: as Int4Linear. Raises ValueError for another kind.
    """

    def __init__(self, w: GroupQuant, b: torch.Tensor | None = None, scale_dtype: torch.dtype = torch.bfloat16):
        if w.kind != "Q8_0":
            raise ValueError(f"Int8x2Linear: {w.kind} is not Q8_0")
        c = w.q
        zero = torch.zeros_like(w.d)
        self.hi = pack_int4((c >> 4) + 8, 16.0 * w.d, zero - 8.0 * 16.0 * w.d, scale_dtype)   # int8: -8..7 -> 0..15
        self.lo = pack_int4(c & 15, w.d, zero, scale_dtype)
        self.b = None if b is None else b.float()
        self.out_features, self.in_features = w.shape

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident tensors (for weight_bytes; None for an absent bias)."""
        return [*self.hi, *self.lo, self.b]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = int4_mm(x, *self.hi) + int4_mm(x, *self.lo)
        return y if self.b is None else y + self.b


class Int8RowLinear:
    """A weight requantized to int8 with one scale per output row (torch's ``_weight_int8pack_mm``, bf16):
    s = max|w_row| / 127, c = round(w / s). Not the file's weights (a Q8_0 row has a scale per 32): the LM head uses
    it only to find the candidates it then rescores exactly (lm_head.QuantTable).

    w: dense [out, in] float, or a GroupQuant (dequantized a block of rows at a time: no fp32 copy of the whole
    table ever exists). x: [T, in]; returns [T, out] bf16.
    """

    def __init__(self, w: torch.Tensor | GroupQuant) -> None:
        n, k = w.shape
        self.q = torch.empty(n, k, dtype=torch.int8)
        s = torch.empty(n)
        for i in range(0, n, _PACK_ROWS):
            rows = torch.arange(i, min(n, i + _PACK_ROWS))
            wb = w.dequantize_rows(rows) if isinstance(w, GroupQuant) else w[i:i + _PACK_ROWS].float()
            s[i:i + len(rows)] = wb.abs().amax(dim=1).clamp_min(1e-30) / 127.0
            self.q[i:i + len(rows)] = torch.round(wb / s[i:i + len(rows), None]).clamp_(-127, 127).to(torch.int8)
        self.s = s.to(torch.bfloat16)
        self.out_features, self.in_features = n, k

    @property
    def tensors(self) -> list[torch.Tensor]:
        """The resident tensors (for weight_bytes; None for an absent bias)."""
        return [self.q, self.s]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16).contiguous(), self.q, self.s)


WEIGHT_FORMATS = ("native", "bf16", "fp32")
_PACK_ROWS = 4096


def make_linear(w: torch.Tensor | GroupQuant, b: torch.Tensor | None, weight_format: str):
    """The linear layer for weight `w` ([out, in]: a dense tensor or a GroupQuant) under `weight_format`.

    native: GroupQuant Q4_0 / Q4_1 -> Int4Linear, Q8_0 -> Int8x2Linear (out a multiple of 8, int4 kernels present;
    else dequantized to DenseLinear fp32); a dense tensor -> DenseLinear in its dtype (the checkpoint's own form).
    bf16: Bf16Linear of the dense (or dequantized) weight. fp32: DenseLinear of the fp32 (dequantized) weight.
    Raises ValueError for another format.
    """
    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight format {weight_format!r}; known: {', '.join(WEIGHT_FORMATS)}")
    if isinstance(w, GroupQuant):
        if weight_format == "native" and INT4_AVAILABLE and w.shape[0] % 8 == 0:
            return Int4Linear(w, b) if w.bits == 4 else Int8x2Linear(w, b)
        w = w.dequantize()
    if weight_format == "bf16":
        return Bf16Linear(w, b)
    if weight_format == "fp32":
        w = w.float()
        b = None if b is None else b.float()
    return DenseLinear(w, b)

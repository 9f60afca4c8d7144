"""Building blocks of the decoder: RMSNorm (plain and zero-centred), rotary position embedding tables, the SwiGLU
MLP, weight bookkeeping.

Conventions follow Hugging Face transformers' LlamaForCausalLM (models/llama/modeling_llama.py): rotate-half
rotary with cos/sin = cos/sin(cat(freqs, freqs)), freqs = position * inv_freq computed in fp32, and
inv_freq from transformers' modeling_rope_utils (default / linear / llama3).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

import ignis_kernels.norm as knorm
from ignisd.model.spec import ModelSpec


class LazyWeight:
    """A weight read only when taken: shape (its [out, in] shape, checked before reading) and make() -> the weight
    (a tensor or a quant.GroupQuant). The GGUF loader hands the decoder its quantized tensors this way."""

    def __init__(self, shape: tuple[int, ...], make) -> None:
        self.shape, self.make = tuple(shape), make


def take_weight(weights: dict, name: str, shape: tuple[int, ...]):
    """Remove and return weight `name` from `weights` (a tensor or a quant.GroupQuant; a LazyWeight is made here),
    checking its shape.

    Raises KeyError when it is missing and ValueError when its shape is not `shape`.
    """
    if name not in weights:
        raise KeyError(f"missing tensor {name}")
    t = weights.pop(name)
    if tuple(t.shape) != shape:
        raise ValueError(f"tensor {name} has shape {tuple(t.shape)}, expected {shape}")
    return t.make() if isinstance(t, LazyWeight) else t


def distinct_bytes(tensors) -> int:
    """Bytes of the distinct tensors among `tensors` (None entries skipped; a tensor shared twice, such as a tied
    embedding and head, counted once by storage pointer)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None:
            seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def linear_t(x: torch.Tensor, w_t: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ w_t (+ b): a linear layer whose weight is stored transposed, w_t [in, out] contiguous.

    x: [T, in]. Returns [T, out]. With the [in, out] layout MKL runs a plain NN sgemm; on this project's CPU
    (AMD EPYC, AVX2) it measured faster than F.linear's NT form for one-token decode (up to 1.6x on the 3072x576
    gate/up projection) and ~5% for 256-token prefill chunks, about equal at 4-8 rows.
    """
    return torch.mm(x, w_t) if b is None else torch.addmm(b, x, w_t)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm (Zhang & Sennrich 2019): weight * x / sqrt(mean(x^2) + eps) over the last dim.

    x: [..., H] fp32; weight: [H]. Returns x's shape and dtype. One C call for fp32 CPU rows (ignis_kernels.norm:
    torch's rms_norm spends ~40 µs of operator overhead a call on a decode step's row), F.rms_norm otherwise.
    """
    return knorm.rms_norm(x, weight, eps)


def zero_centred_norm_weight(w: torch.Tensor) -> torch.Tensor:
    """The multiplier of a zero-centred RMSNorm (Qwen3_5RMSNorm / Qwen3NextRMSNorm): 1 + w in fp32 (the norm runs
    in fp32 whatever the activation dtype). Stored weights are centred on 0 (MODELS.md §2.1)."""
    return 1.0 + w.float()


def rms_norm_1p(x: torch.Tensor, w1p: torch.Tensor, eps: float) -> torch.Tensor:
    """Zero-centred RMSNorm over the last dim: x / sqrt(mean(x²) + eps) · w1p computed in fp32, cast back to x's
    dtype. x: [..., D]; w1p: fp32 [D] from zero_centred_norm_weight."""
    return knorm.rms_norm(x.float(), w1p, eps).to(x.dtype)


class RMSNorm:
    """One RMSNorm over the last dim, in a family's style.

    weight: [H] as stored in the checkpoint. zero_centred: False (llama): weight · x / sqrt(mean(x²) + eps) in x's
    dtype (rms_norm); True (the Qwen hybrids): the stored weight is centred on 0 and the multiplier is 1 + w, in fp32
    (rms_norm_1p). Attribute weight: the multiplier applied (the stored tensor, or 1 + w in fp32).
    """

    def __init__(self, weight: torch.Tensor, eps: float, zero_centred: bool = False) -> None:
        self.weight = zero_centred_norm_weight(weight) if zero_centred else weight
        self.eps, self.zero_centred = eps, zero_centred

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [..., H] -> same shape and dtype."""
        if self.zero_centred:
            return rms_norm_1p(x, self.weight, self.eps)
        return rms_norm(x, self.weight, self.eps)


def rope_inv_freq(spec: ModelSpec) -> torch.Tensor:
    """Inverse rotary frequencies over the rotated dims, fp32 [rotary_dim // 2] (rotary_dim = head_dim, except on
    the Qwen hybrids' partial rotary: transformers' inv_freq = θ^(−2i/rotary_dim)).

    Default: 1 / theta^(2i/d), d = rotary_dim (Su et al. 2021, RoFormer). linear: divided by factor. llama3:
    transformers' _compute_llama3_parameters (wavelength-dependent division with a smooth interpolation band).
    Raises ValueError for another rope_type.
    """
    d = spec.rotary_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    sc = spec.rope_scaling
    if sc is None:
        return inv
    kind = sc["rope_type"]
    if kind == "linear":
        return inv / sc["factor"]
    if kind == "llama3":
        factor, lo, hi = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        lo_wavelen, hi_wavelen = old / lo, old / hi
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > lo_wavelen, inv / factor, inv)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < hi_wavelen) * ~(wavelen > lo_wavelen)
        return torch.where(medium, smoothed, inv_l)
    raise ValueError(f"rope type {kind!r} is not supported")


def rope_stable_dims(spec: ModelSpec, span: int | None = None) -> torch.Tensor:
    """The head dims where a key centre fixed at the start of a sequence stays valid (hq-e8-2b key centering,
    HQFormat.centering): float32 [head_dim], 1.0 for a dim whose rotary angle over `span` positions (default
    spec.context_tokens) is at most π/3, and for the dims RoPE leaves alone (partial rotary: dims >= rotary_dim);
    0.0 for the others. Rotate-half layout: dims i and i + rotary_dim/2 turn at inv_freq[i] (rope_inv_freq).

    Why π/3: post-RoPE, the local mean of a dim pair turning at ω rad/token has turned by φ = ωΔ after Δ positions,
    so subtracting the centre measured at the start leaves an offset of |μ|·|1 − e^{iφ}| = 2|μ|·sin(φ/2), less than
    the |μ| it removes only while φ < π/3. Raises ValueError for a span below 1 (and as rope_inv_freq)."""
    span = spec.context_tokens if span is None else span
    if span < 1:
        raise ValueError(f"rope_stable_dims: span must be >= 1 token, got {span}")
    half = spec.rotary_dim // 2
    omega = torch.zeros(spec.head_dim)
    inv = rope_inv_freq(spec)
    omega[:half], omega[half:2 * half] = inv, inv
    return (omega * span <= math.pi / 3).float()


class Rotary:
    """Precomputed rotary tables, fp32 [n_positions, rotary_dim], grown (doubling) on demand: cos, and sin signed
    for rotate-half (sin_rot = cat(−sin(f), sin(f)), the sign of rotate_half's first half folded in; apply_rope).

    spec: the model (rotary_dim, rope_theta, rope_scaling). initial: positions computed up front
    (min(spec.context_tokens, 8192) by default).
    """

    def __init__(self, spec: ModelSpec, device: torch.device | str = "cpu", initial: int | None = None) -> None:
        self.inv_freq = rope_inv_freq(spec).to(device)
        self.device = torch.device(device)
        self.cos = torch.empty(0, spec.rotary_dim, device=device)
        self.sin = torch.empty(0, spec.rotary_dim, device=device)
        self._grow(initial or min(spec.context_tokens, 8192))

    def _grow(self, n: int) -> None:
        pos = torch.arange(n, device=self.device, dtype=torch.int64).float()
        freqs = pos[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        sin = emb.sin()
        sin[:, :freqs.shape[1]].neg_()
        self.cos, self.sin = emb.cos(), sin

    def tables(self, positions: torch.Tensor, max_position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin_rot (class docstring) for `positions` (LongTensor [T]), each fp32 [T, 1, rotary_dim] (broadcast
        over heads).

        max_position: the largest value in positions (the caller knows it; avoids a device sync).
        """
        if max_position >= self.cos.shape[0]:
            n = self.cos.shape[0]
            while n <= max_position:
                n *= 2
            self._grow(n)
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin_rot: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary embedding (HF apply_rotary_pos_emb: x·cos + cat(−x2, x1)·sin) as x·cos + cat(x2, x1)·sin_rot,
    with sin_rot = cat(−sin1, sin2) from Rotary.tables: the same products (a negation is exact), in 4 operators
    instead of 8 (the halves swapped by one roll).

    x: [T, H, d]; cos, sin_rot: [T, 1, d]. Returns a new [T, H, d] tensor.
    """
    return x * cos + x.roll(x.shape[-1] // 2, -1) * sin_rot


class MLP:
    """SwiGLU feed-forward: down(silu(gate(x)) * up(x)) (Shazeer 2020), gate and up fused in one matmul.

    gate_up: the fused [2I, H] projection (gate rows then up rows, HF layout), down: [H, I]; each a dense tensor
    (wrapped in linear.DenseLinear, stored transposed, with the optional biases b_gate_up [2I], b_down [H]) or a
    linear layer of ignisd.model.linear (biases then inside it). In a bf16 weight format the hidden activations stay
    bf16 between the two matmuls (the down projection rounds its input to bf16 anyway).
    """

    def __init__(self, gate_up, down, b_gate_up: torch.Tensor | None = None,
                 b_down: torch.Tensor | None = None) -> None:
        from ignisd.model.linear import DenseLinear
        self.gate_up = DenseLinear(gate_up, b_gate_up) if isinstance(gate_up, torch.Tensor) else gate_up
        self.down = DenseLinear(down, b_down) if isinstance(down, torch.Tensor) else down
        self.inter = self.down.in_features

    @property
    def tensors(self) -> list[torch.Tensor | None]:
        """The resident weight tensors (for weight_bytes; None for an absent bias)."""
        return [*self.gate_up.tensors, *self.down.tensors]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, H] -> [T, H] (fp32 in the fp32 format; bf16 out of a quantized / bf16 down projection)."""
        gu = self.gate_up(x)
        return self.down(F.silu(gu[:, :self.inter]) * gu[:, self.inter:])

"""Pure-torch short causal depthwise conv1d (+ SiLU) of the GDN layer: the specification and the CPU path.

MODELS.md §2.3 "Short causal conv": over the pre-conv q|k|v channels x (conv_dim = C channels), weight [C, 1, K]
(or [C, K]), no bias, left context K−1, then SiLU:
    out[c, t] = silu( Σ_{j=0..K-1} w[c, j] · x[c, t−K+1+j] )
where x at positions before the sequence start is 0.

The conv state of a sequence is its last K−1 input columns, [C, K−1] (DESIGN §4.2; zeros at sequence start).
transformers keeps K columns in its cache; only the last K−1 ever reach an output, so both layouts give the same
results, and its causal_conv1d_update accepts a K−1-column state unchanged.

Arithmetic is fp32 whatever the input dtype; outputs come back in x's dtype and states in the state's dtype
(x's dtype for a fresh state).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

_ACTIVATIONS = (None, "silu", "swish")


def _weight_2d(weight: torch.Tensor) -> torch.Tensor:
    return weight.reshape(weight.shape[0], weight.shape[-1])


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    if activation not in _ACTIVATIONS:
        raise ValueError(f"causal conv: unsupported activation {activation!r}")
    return y if activation is None else F.silu(y)


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor | None = None,
                          activation: str | None = "silu") -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv over T new tokens of B sequences, continuing from their conv states.

    x: [B, C, T] (channels-major, as transformers feeds its conv); weight: [C, 1, K] or [C, K].
    conv_state: [B, C, K−1], the K−1 input columns before x (zeros / None at sequence start). Not written.
    Returns (out [B, C, T] in x's dtype, new_state [B, C, K−1], a new tensor: the last K−1 columns of
    cat(conv_state, x), so T < K−1 keeps part of the old state).
    """
    bsz, ch, t = x.shape
    w = _weight_2d(weight).float()
    kk = w.shape[-1]
    if conv_state is None:
        conv_state = x.new_zeros(bsz, ch, kk - 1)
    full = torch.cat((conv_state.to(x.dtype), x), dim=-1)              # [B, C, K−1+T]
    new_state = full[..., full.shape[-1] - (kk - 1):].to(conv_state.dtype).clone()
    if t == 0:
        return x.new_zeros(bsz, ch, 0), new_state
    y = F.conv1d(full.float(), w.unsqueeze(1), groups=ch)               # valid conv: exactly T outputs
    return _activate(y, activation).to(x.dtype), new_state


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                       slots: torch.Tensor | None = None, activation: str | None = "silu") -> torch.Tensor:
    """One new token for each of B lanes (batched decode); shifts the lanes' conv states IN PLACE.

    x: [B, C]; weight: [C, 1, K] or [C, K].
    conv_state: [N, C, K−1]. Without `slots`, N == B and lane b owns conv_state[b]; with `slots` (LongTensor [B],
        distinct indices into N) lane b owns conv_state[slots[b]] and other rows are untouched.
    Returns out [B, C] in x's dtype.
    """
    w = _weight_2d(weight).float()
    kk = w.shape[-1]
    st = conv_state if slots is None else conv_state.index_select(0, slots)
    window = torch.cat((st.to(x.dtype), x.unsqueeze(-1)), dim=-1)       # [B, C, K]
    y = (window.float() * w).sum(-1)
    new = window[..., 1:].to(conv_state.dtype)
    if kk > 1:
        if slots is None:
            conv_state.copy_(new)
        else:
            conv_state.index_copy_(0, slots, new)
    return _activate(y, activation).to(x.dtype)

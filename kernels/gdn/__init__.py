"""Gated DeltaNet dispatcher (DESIGN §3 kernels/gdn/): chunked prefill, recurrent decode step, causal conv.

Each entry point checks its arguments (ValueError naming the shapes on any inconsistency), then runs the
implementation for the device. Only the pure-torch references exist so far (reference.py for the delta rule,
conv.py for the short conv); they run on CPU and, unchanged, on CUDA. Triton kernels plug in here later and are
tested against those references.

Shapes (MODELS.md §2.3; Hv a multiple of Hk, value head j reads key head j // (Hv/Hk)):
  chunk_gated_delta_rule(q, k [B,T,Hk,dk], v [B,T,Hv,dv], g, beta [B,T,Hv], initial_state [B,Hv,dk,dv] | None)
      -> (o [B,T,Hv,dv], final_state [B,Hv,dk,dv] fp32, new)
  recurrent_gated_delta_rule_step(q, k [B,Hk,dk], v [B,Hv,dv], g, beta [B,Hv], state fp32 [N,Hv,dk,dv], slots)
      -> o [B,Hv,dv]; state rows updated in place
  causal_conv1d_prefill(x [B,C,T], weight [C,1,K] | [C,K], conv_state [B,C,K-1] | None)
      -> (out [B,C,T], new_state [B,C,K-1], new)
  causal_conv1d_step(x [B,C], weight, conv_state [N,C,K-1], slots) -> out [B,C]; conv_state rows shifted in place
"""
from __future__ import annotations

import torch

from ignis_kernels.gdn import conv, reference

__all__ = ["chunk_gated_delta_rule", "recurrent_gated_delta_rule_step", "causal_conv1d_prefill",
           "causal_conv1d_step", "l2norm"]

l2norm = reference.l2norm


def _shapes(**tensors: torch.Tensor | None) -> str:
    return " ".join(f"{n} {tuple(t.shape) if t is not None else None}" for n, t in tensors.items())


def _check_heads(name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, lead: int) -> None:
    """q, k [*lead, Hk, dk]; v [*lead, Hv, dv]; g, beta [*lead, Hv]; Hv % Hk == 0."""
    ok = (q.dim() == k.dim() == v.dim() == lead + 2 and g.dim() == beta.dim() == lead + 1
          and q.shape == k.shape and v.shape[:lead] == k.shape[:lead]
          and g.shape == beta.shape == v.shape[:lead + 1]
          and k.shape[-2] > 0 and v.shape[-2] % k.shape[-2] == 0)
    if not ok:
        raise ValueError(f"{name}: bad shapes " + _shapes(q=q, k=k, v=v, g=g, beta=beta))


def _check_slots(name: str, slots: torch.Tensor | None, lanes: int, rows: int) -> None:
    if slots is None:
        if rows != lanes:
            raise ValueError(f"{name}: state has {rows} rows for {lanes} lanes and no slots")
        return
    if slots.dim() != 1 or slots.shape[0] != lanes or slots.dtype != torch.long:
        raise ValueError(f"{name}: slots must be a LongTensor [{lanes}], got {slots.dtype} {tuple(slots.shape)}")


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor | None = None, chunk_size: int = 64,
                           use_qk_l2norm: bool = True, scale: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked gated-delta-rule prefill; see reference.chunk_gated_delta_rule.

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv]; g, beta: [B, T, Hv]; initial_state: [B, Hv, dk, dv] or None (zeros).
    use_qk_l2norm (default True, as both model families use it) L2-normalises q and k; q is then scaled by
    `scale` (default dk^-0.5). Returns (o [B, T, Hv, dv] in q's dtype, final_state [B, Hv, dk, dv] fp32).
    """
    _check_heads("chunk_gated_delta_rule", q, k, v, g, beta, lead=2)
    b, _, _, dk = k.shape
    hv, dv = v.shape[-2:]
    if initial_state is not None and tuple(initial_state.shape) != (b, hv, dk, dv):
        raise ValueError(f"chunk_gated_delta_rule: initial_state {tuple(initial_state.shape)} != "
                         f"{(b, hv, dk, dv)}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_gated_delta_rule: chunk_size {chunk_size} < 1")
    return reference.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, int(chunk_size), use_qk_l2norm, scale)


def recurrent_gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                    beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor | None = None,
                                    use_qk_l2norm: bool = True, scale: float | None = None) -> torch.Tensor:
    """One decode token for B lanes; updates `state` in place; see reference.recurrent_gated_delta_rule_step.

    q, k: [B, Hk, dk]; v: [B, Hv, dv]; g, beta: [B, Hv]; state: fp32 [N, Hv, dk, dv] (N == B without slots);
    slots: LongTensor [B] of distinct rows of state, or None. Returns o [B, Hv, dv] in q's dtype.
    """
    name = "recurrent_gated_delta_rule_step"
    _check_heads(name, q, k, v, g, beta, lead=1)
    dk = k.shape[-1]
    hv, dv = v.shape[-2:]
    if state.dim() != 4 or tuple(state.shape[1:]) != (hv, dk, dv) or state.dtype != torch.float32:
        raise ValueError(f"{name}: state must be fp32 [N, {hv}, {dk}, {dv}], got {state.dtype} "
                         f"{tuple(state.shape)}")
    _check_slots(name, slots, k.shape[0], state.shape[0])
    return reference.recurrent_gated_delta_rule_step(q, k, v, g, beta, state, slots, use_qk_l2norm, scale)


def _check_weight(name: str, weight: torch.Tensor, channels: int) -> int:
    if not (weight.dim() == 2 or (weight.dim() == 3 and weight.shape[1] == 1)) or weight.shape[0] != channels:
        raise ValueError(f"{name}: weight must be [{channels}, 1, K] or [{channels}, K], got {tuple(weight.shape)}")
    return weight.shape[-1]


def causal_conv1d_prefill(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor | None = None,
                          activation: str | None = "silu") -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv (+ SiLU) over T tokens from a conv state; see conv.causal_conv1d_prefill.

    x: [B, C, T]; weight: [C, 1, K] or [C, K]; conv_state: [B, C, K-1] or None (zeros).
    Returns (out [B, C, T] in x's dtype, new_state [B, C, K-1]).
    """
    name = "causal_conv1d_prefill"
    if x.dim() != 3:
        raise ValueError(f"{name}: x must be [B, C, T], got {tuple(x.shape)}")
    kk = _check_weight(name, weight, x.shape[1])
    if conv_state is not None and tuple(conv_state.shape) != (x.shape[0], x.shape[1], kk - 1):
        raise ValueError(f"{name}: conv_state {tuple(conv_state.shape)} != {(x.shape[0], x.shape[1], kk - 1)}")
    return conv.causal_conv1d_prefill(x, weight, conv_state, activation)


def causal_conv1d_step(x: torch.Tensor, weight: torch.Tensor, conv_state: torch.Tensor,
                       slots: torch.Tensor | None = None, activation: str | None = "silu") -> torch.Tensor:
    """One decode token of the causal conv for B lanes; shifts conv_state in place; see conv.causal_conv1d_step.

    x: [B, C]; weight: [C, 1, K] or [C, K]; conv_state: [N, C, K-1] (N == B without slots);
    slots: LongTensor [B] of distinct rows, or None. Returns out [B, C] in x's dtype.
    """
    name = "causal_conv1d_step"
    if x.dim() != 2:
        raise ValueError(f"{name}: x must be [B, C], got {tuple(x.shape)}")
    kk = _check_weight(name, weight, x.shape[1])
    if conv_state.dim() != 3 or tuple(conv_state.shape[1:]) != (x.shape[1], kk - 1):
        raise ValueError(f"{name}: conv_state must be [N, {x.shape[1]}, {kk - 1}], got {tuple(conv_state.shape)}")
    _check_slots(name, slots, x.shape[0], conv_state.shape[0])
    return conv.causal_conv1d_step(x, weight, conv_state, slots, activation)

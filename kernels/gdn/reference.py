"""Pure-torch Gated DeltaNet (gated delta rule): the specification and the CPU path of ignis_kernels.gdn.

The math is MODELS.md §2.3 (what transformers' qwen3_next / qwen3_5 torch fallbacks compute). Per value head,
with a key-major state S ∈ R^{dk×dv}:

    S   ← exp(g_t) · S                      decay first (g_t ≤ 0 is a log-decay)
    δ_t = β_t · (v_t − Sᵀ k_t)              delta rule: write only what S does not already predict
    S   ← S + k_t ⊗ δ_t                     i.e. S_t = e^{g_t}(I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ
    o_t = Sᵀ q_t

Conventions (the same as transformers' torch_chunk_gated_delta_rule with use_qk_l2norm_in_kernel=True):
- q, k arrive per key head [.., Hk, dk]; value head j reads key head j // (Hv // Hk) (GVA: repeat_interleave).
- with use_qk_l2norm, q and k are L2-normalised over dk in fp32 (x * rsqrt(Σx² + 1e-6)); then q is always scaled
  by `scale` (default dk^-0.5), after the norm.
- everything is computed in fp32; outputs come back in q's dtype; states are fp32 [.., Hv, dk, dv].

Layouts: prefill takes [B, T, H, d] (token-major, as the model produces them); the decode step takes [B, H, d]
(one token per lane).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

L2NORM_EPS = 1e-6


def l2norm(x: torch.Tensor, eps: float = L2NORM_EPS) -> torch.Tensor:
    """x * rsqrt(Σx² + eps) over the last dim (FLA's / transformers' convention: eps inside the root, unsquared)."""
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare_qk(q: torch.Tensor, k: torch.Tensor, hv: int, use_qk_l2norm: bool,
                scale: float | None, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 q, k with heads expanded to the Hv value heads (head axis = -2), normalised and q scaled."""
    q = q.float()
    k = k.float()
    if use_qk_l2norm:          # per key head, before the repeat: the same numbers, Hv/Hk times less work
        q = l2norm(q)
        k = l2norm(k)
    q = q * (head_dim ** -0.5 if scale is None else scale)
    r = hv // k.shape[-2]
    if r != 1:
        q = q.repeat_interleave(r, dim=-2)
        k = k.repeat_interleave(r, dim=-2)
    return q, k


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                           beta: torch.Tensor, initial_state: torch.Tensor | None = None, chunk_size: int = 64,
                           use_qk_l2norm: bool = True, scale: float | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Chunked prefill of the gated delta rule over T tokens of B sequences, starting from `initial_state`.

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv] with Hv a multiple of Hk; g (log-decay, ≤ 0), beta: [B, T, Hv].
    initial_state: [B, Hv, dk, dv] (read, never written; any float dtype, used in fp32) or None for zeros.
    chunk_size: tokens per chunk (C). T need not be a multiple of C; the result does not depend on C beyond
        fp32 rounding.
    Returns (o [B, T, Hv, dv] in q's dtype, final_state [B, Hv, dk, dv] fp32, a new tensor).

    Method (MODELS.md §2.3, "chunked form"): within a chunk, with γ the cumulative log-decay from the chunk start,
    the C sequential rank-1 updates collapse into one unit-lower-triangular solve
        (I + A) [U | W] = [β⊙V | β⊙e^γ⊙K],   A_ij = β_i (k_i·k_j) e^{γ_i−γ_j} for i > j,
    after which each chunk is a few matmuls against the carried state S:
        V' = U − W S;  O = (Q⊙e^γ) S + [(Q Kᵀ) ⊙ D] V';  S ← e^{γ_C} S + (K ⊙ e^{γ_C−γ})ᵀ V'
    (D_ij = e^{γ_i−γ_j} for i ≥ j, else 0). The tail is zero-padded to a whole chunk: a padded token has k = 0,
    β = 0 and g = 0, so it neither decays nor writes the state, and its outputs are dropped.
    """
    b, t, _, dk = k.shape
    hv, dv = v.shape[-2:]
    out_dtype = q.dtype
    qf, kf = _prepare_qk(q, k, hv, use_qk_l2norm, scale, dk)
    # [B, H, T, ·] fp32
    qf, kf, vf = (x.transpose(1, 2).contiguous() for x in (qf, kf, v.float()))
    gf, bf = (x.float().transpose(1, 2).contiguous() for x in (g, beta))
    if initial_state is None:
        state = torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=v.device)
    else:
        state = initial_state.to(dtype=torch.float32, copy=True)
    if t == 0:
        return v.new_zeros(b, 0, hv, dv, dtype=out_dtype), state

    c = int(chunk_size)
    n = -(-t // c)
    pad = n * c - t
    if pad:
        qf, kf, vf = (F.pad(x, (0, 0, 0, pad)) for x in (qf, kf, vf))
        gf, bf = (F.pad(x, (0, pad)) for x in (gf, bf))
    qf, kf, vf = (x.view(b, hv, n, c, x.shape[-1]) for x in (qf, kf, vf))
    gf, bf = gf.view(b, hv, n, c), bf.view(b, hv, n, c)

    gam = gf.cumsum(-1)                                             # γ: [B, H, n, C]
    idx = torch.arange(c, device=v.device)
    lower_incl = idx[:, None] >= idx[None, :]                      # i ≥ j
    strict = idx[:, None] > idx[None, :]                           # i > j
    # seg_ij = γ_i − γ_j = Σ_{j<m≤i} g_m, summed directly rather than subtracted: under fast decay |γ| reaches
    # thousands within a chunk and γ_i − γ_j would lose ~|γ|·2^-24 absolute (1e-5 relative error in e^{g_i} for
    # adjacent tokens). Every sum here has terms of one sign, so its relative error stays ≤ C·2^-24.
    seg = gf[..., :, None].expand(*gf.shape, c).masked_fill(~strict, 0.0).cumsum(-2)
    # D_ij = e^{γ_i − γ_j} on and below the diagonal; above it −inf → 0
    decay_ij = seg.masked_fill(~lower_incl, float("-inf")).exp()

    # Intra-chunk system, all chunks at once. A's diagonal is dropped: the solve is unit-triangular.
    a_mat = (kf @ kf.transpose(-1, -2)) * decay_ij * bf[..., :, None]
    a_mat = a_mat.masked_fill(~strict, 0.0)
    eye = torch.eye(c, dtype=torch.float32, device=v.device)
    rhs = torch.cat((vf * bf[..., None], kf * (bf * gam.exp())[..., None]), dim=-1)
    uw = torch.linalg.solve_triangular(a_mat + eye, rhs, upper=False, unitriangular=True)
    u, w = uw[..., :dv], uw[..., dv:]                               # [B, H, n, C, dv], [B, H, n, C, dk]

    attn = (qf @ kf.transpose(-1, -2)) * decay_ij                   # causal intra-chunk scores incl. decay
    q_dec = qf * gam.exp()[..., None]                               # reads the state carried into the chunk
    k_dec = kf * seg[..., -1, :].exp()[..., None]                   # writes, decayed to the chunk end: e^{γ_C−γ_j}
    chunk_decay = gam[..., -1:].exp()[..., None]                    # e^{γ_C}: [B, H, n, 1, 1]

    out = torch.empty(b, hv, n, c, dv, dtype=torch.float32, device=v.device)
    for i in range(n):
        v_new = u[:, :, i] - w[:, :, i] @ state
        out[:, :, i] = q_dec[:, :, i] @ state + attn[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k_dec[:, :, i].transpose(-1, -2) @ v_new

    o = out.view(b, hv, n * c, dv)[:, :, :t].transpose(1, 2).to(out_dtype).contiguous()
    return o, state


def recurrent_gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                                    beta: torch.Tensor, state: torch.Tensor, slots: torch.Tensor | None = None,
                                    use_qk_l2norm: bool = True, scale: float | None = None) -> torch.Tensor:
    """One token for each of B lanes (batched decode); updates the lanes' states IN PLACE and returns the output.

    q, k: [B, Hk, dk]; v: [B, Hv, dv]; g (log-decay, ≤ 0), beta: [B, Hv].
    state: fp32 [N, Hv, dk, dv]. Without `slots`, N == B and lane b owns state[b]. With `slots` (LongTensor [B] of
        distinct indices into N, e.g. a pool of state slots), lane b owns state[slots[b]]; other rows are untouched.
    Returns o [B, Hv, dv] in q's dtype.
    """
    bsz, _, dk = k.shape
    hv = v.shape[-2]
    qf, kf = _prepare_qk(q, k, hv, use_qk_l2norm, scale, dk)          # [B, Hv, dk]
    s = state if slots is None else state.index_select(0, slots)
    s = s * g.float().exp()[..., None, None]                          # decay first
    pred = (kf.unsqueeze(-2) @ s).squeeze(-2)                         # Sᵀk: [B, Hv, dv]
    delta = (v.float() - pred) * beta.float()[..., None]
    s = s + kf.unsqueeze(-1) * delta.unsqueeze(-2)                    # rank-1 write k ⊗ δ
    o = (qf.unsqueeze(-2) @ s).squeeze(-2)                            # Sᵀq
    if slots is None:
        state.copy_(s)
    else:
        state.index_copy_(0, slots, s)
    return o.to(q.dtype)


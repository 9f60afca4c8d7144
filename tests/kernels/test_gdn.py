"""ignis_kernels.gdn delta rule (chunked prefill, recurrent decode step) against independent routes.

Routes: (1) a naive per-token loop written here from MODELS.md §2.3 in float64, with the GVA head mapping
j // r done by indexing; (2) transformers' own torch fallbacks torch_chunk_gated_delta_rule and
torch_recurrent_gated_delta_rule; (3) self-consistency: splitting a prefill into chunks, prefill then decode.
Errors are max-abs divided by the reference's max-abs (the output scale); the bound is 1e-5, and 2e-6 against the
float64 loop. transformers' chunk form computes e^{γ_i−γ_j} by subtracting cumulative sums, which loses up to ~1e-5
relative under fast decay (|γ| in the thousands); ours sums each segment directly (measured ≤ 4e-7 against float64),
so the comparison with its chunk form carries transformers' own error (8.5e-6 on the "mixed" gates).
"""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from ignis_kernels import gdn

torch.set_num_threads(1)
TOL = 1e-5
TOL_F64 = 2e-6


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape, (tuple(got.shape), tuple(ref.shape))
    ref = ref.double()
    return ((got.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-12)).item()


def make_inputs(b, t, hk, hv, dk, dv, regime="model", init=True, seed=0, dtype=torch.float32):
    """Random q, k, v, gates as the model produces them: g = -exp(A_log)·softplus(a + dt_bias), β = sigmoid(b).

    regime "model": A_log ~ U(0, 2.7) as in the tiny checkpoints (fast decay); "slow": g ∈ [-0.05, 0] (long
    memory, the hard case for the chunked solve); "mixed": per-head mix including g ≈ −60 (underflowing decay).
    """
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, hk, dk, generator=gen)
    k = torch.randn(b, t, hk, dk, generator=gen)
    v = torch.randn(b, t, hv, dv, generator=gen)
    beta = torch.sigmoid(torch.randn(b, t, hv, generator=gen) * 2)
    if regime == "model":
        a_log = torch.rand(hv, generator=gen) * 2.7
        dt_bias = torch.randn(hv, generator=gen) * 0.5
        g = -a_log.exp() * F.softplus(torch.randn(b, t, hv, generator=gen) + dt_bias)
    elif regime == "slow":
        g = -torch.rand(b, t, hv, generator=gen) * 0.05
    else:
        g = -torch.rand(b, t, hv, generator=gen) * torch.tensor([0.01, 1.0, 60.0] * hv)[:hv]
    s0 = torch.randn(b, hv, dk, dv, generator=gen) if init else None
    return [x.to(dtype) for x in (q, k, v, g, beta)] + [s0]


def naive(q, k, v, g, beta, s0=None, use_qk_l2norm=True, scale=None):
    """Token loop of MODELS.md §2.3 in float64: S ← e^g S; δ = β(v − Sᵀk); S ← S + k⊗δ; o = Sᵀq."""
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    b, t, hk, dk = k.shape
    hv, dv = v.shape[-2:]
    if use_qk_l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    q = q * (1 / math.sqrt(dk) if scale is None else scale)
    head = torch.arange(hv) // (hv // hk)                  # value head j reads key head j // r
    q, k = q[:, :, head], k[:, :, head]
    s = torch.zeros(b, hv, dk, dv, dtype=torch.float64) if s0 is None else s0.double().clone()
    out = torch.empty(b, t, hv, dv, dtype=torch.float64)
    for i in range(t):
        s = s * g[:, i].exp()[..., None, None]
        delta = beta[:, i, :, None] * (v[:, i] - torch.einsum("bhkv,bhk->bhv", s, k[:, i]))
        s = s + torch.einsum("bhk,bhv->bhkv", k[:, i], delta)
        out[:, i] = torch.einsum("bhkv,bhk->bhv", s, q[:, i])
    return out, s


@pytest.fixture(scope="module")
def hf():
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    return mod.torch_chunk_gated_delta_rule, mod.torch_recurrent_gated_delta_rule


CASES = [  # b, t, hk, hv, dk, dv, chunk, init
    (2, 1, 3, 3, 16, 8, 64, True),
    (1, 130, 3, 6, 8, 12, 64, True),
    (2, 130, 3, 3, 16, 8, 64, False),
    (1, 64, 2, 4, 16, 16, 64, True),
    (2, 100, 1, 3, 12, 20, 16, True),
    (1, 5, 2, 2, 4, 4, 64, True),
]


@pytest.mark.parametrize("regime", ["model", "slow", "mixed"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}t{}hk{}hv{}dk{}dv{}c{}{}".format(*c[:7], "s" if c[7] else ""))
def test_chunk_matches_naive_and_transformers(case, regime, hf):
    b, t, hk, hv, dk, dv, chunk, init = case
    q, k, v, g, beta, s0 = make_inputs(b, t, hk, hv, dk, dv, regime, init, seed=t + hv)
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk)
    assert o.shape == (b, t, hv, dv) and o.dtype == torch.float32
    assert s.shape == (b, hv, dk, dv) and s.dtype == torch.float32
    o_ref, s_ref = naive(q, k, v, g, beta, s0)
    assert rel_err(o, o_ref) <= TOL_F64
    assert rel_err(s, s_ref) <= TOL_F64
    hf_chunk, hf_rec = hf
    for fn, kw in ((hf_chunk, {"chunk_size": chunk}), (hf_rec, {})):
        o_hf, s_hf = fn(q, k, v, g, beta, initial_state=s0, output_final_state=True,
                        use_qk_l2norm_in_kernel=True, **kw)
        assert rel_err(o, o_hf) <= TOL
        assert rel_err(s, s_hf) <= TOL
    if s0 is not None:
        assert not s.data_ptr() == s0.data_ptr()


def test_without_l2norm_and_explicit_scale(hf):
    q, k, v, g, beta, s0 = make_inputs(2, 77, 2, 4, 8, 8, "slow", True, seed=3)
    k = k / k.norm(dim=-1, keepdim=True)                   # the caller normalised keys itself
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=32, use_qk_l2norm=False, scale=0.2)
    o_ref, s_ref = naive(q, k, v, g, beta, s0, use_qk_l2norm=False, scale=0.2)
    assert rel_err(o, o_ref) <= TOL and rel_err(s, s_ref) <= TOL
    st = s0.clone()
    o1 = gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], st,
                                             use_qk_l2norm=False, scale=0.2)
    o1_ref, s1_ref = naive(q[:, :1], k[:, :1], v[:, :1], g[:, :1], beta[:, :1], s0, use_qk_l2norm=False, scale=0.2)
    assert rel_err(o1, o1_ref[:, 0]) <= TOL and rel_err(st, s1_ref) <= TOL


@pytest.mark.parametrize("chunk", [1, 3, 8, 64, 128])
def test_chunk_size_does_not_change_result(chunk):
    q, k, v, g, beta, s0 = make_inputs(1, 70, 2, 4, 8, 8, "slow", True, seed=11)
    o_ref, s_ref = naive(q, k, v, g, beta, s0)
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0, chunk_size=chunk)
    assert rel_err(o, o_ref) <= TOL_F64 and rel_err(s, s_ref) <= TOL_F64


@pytest.mark.parametrize("piece", [1, 7, 64, 100, "mixed"])
def test_split_prefill_equals_one_prefill(piece):
    t = 230
    q, k, v, g, beta, s0 = make_inputs(2, t, 2, 4, 16, 8, "slow", True, seed=5)
    o_full, s_full = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    sizes = [1, 7, 64, 100, 58] if piece == "mixed" else [piece] * (t // piece) + ([t % piece] if t % piece else [])
    assert sum(sizes) == t
    state, outs, a = s0, [], 0
    for n in sizes:
        o, state = gdn.chunk_gated_delta_rule(q[:, a:a + n], k[:, a:a + n], v[:, a:a + n], g[:, a:a + n],
                                              beta[:, a:a + n], state)
        outs.append(o)
        a += n
    assert rel_err(torch.cat(outs, 1), o_full) <= TOL
    assert rel_err(state, s_full) <= TOL


@pytest.mark.parametrize("prefill_len", [0, 1, 100])
def test_prefill_then_decode_equals_one_prefill(prefill_len, hf):
    t = 140
    q, k, v, g, beta, s0 = make_inputs(2, t, 3, 6, 8, 16, "model", True, seed=prefill_len)
    o_full, s_full = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    p = prefill_len
    o_pre, state = gdn.chunk_gated_delta_rule(q[:, :p], k[:, :p], v[:, :p], g[:, :p], beta[:, :p], s0)
    state_hf = state.clone()
    outs = [o_pre]
    for i in range(p, t):
        o = gdn.recurrent_gated_delta_rule_step(q[:, i], k[:, i], v[:, i], g[:, i], beta[:, i], state)
        assert o.shape == (2, 6, 16)
        outs.append(o[:, None])
        if i < p + 3:  # the decode step against transformers' recurrent path (what its model uses at seq_len 1)
            o_hf, state_hf = hf[1](q[:, i:i + 1], k[:, i:i + 1], v[:, i:i + 1], g[:, i:i + 1], beta[:, i:i + 1],
                                   initial_state=state_hf, output_final_state=True, use_qk_l2norm_in_kernel=True)
            assert rel_err(o, o_hf[:, 0]) <= TOL and rel_err(state, state_hf) <= TOL
    assert rel_err(torch.cat(outs, 1), o_full) <= TOL
    assert rel_err(state, s_full) <= TOL


def test_decode_step_with_slots_batches_lanes_of_different_lengths():
    """Four lanes with different prompt lengths decode together from a pool of 6 state slots."""
    hk, hv, dk, dv, steps = 2, 4, 8, 8, 5
    lens = [3, 70, 1, 20]
    slots = torch.tensor([4, 0, 5, 2])
    seqs = [make_inputs(1, n + steps, hk, hv, dk, dv, "model", False, seed=n) for n in lens]
    pool = torch.randn(6, hv, dk, dv)
    untouched = pool[[1, 3]].clone()
    for (q, k, v, g, beta, _), n, sl in zip(seqs, lens, slots.tolist()):
        _, pool[sl] = gdn.chunk_gated_delta_rule(q[:, :n], k[:, :n], v[:, :n], g[:, :n], beta[:, :n])
    for j in range(steps):
        cols = [[x[0, n + j] for x in s[:5]] for s, n in zip(seqs, lens)]
        q, k, v, g, beta = (torch.stack(c) for c in zip(*cols))
        o = gdn.recurrent_gated_delta_rule_step(q, k, v, g, beta, pool, slots=slots)
        for lane, ((qs, ks, vs, gs, bs, _), n) in enumerate(zip(seqs, lens)):
            o_full, s_full = gdn.chunk_gated_delta_rule(qs[:, :n + j + 1], ks[:, :n + j + 1], vs[:, :n + j + 1],
                                                        gs[:, :n + j + 1], bs[:, :n + j + 1])
            assert rel_err(o[lane], o_full[0, -1]) <= TOL
            assert rel_err(pool[slots[lane]], s_full[0]) <= TOL
    assert torch.equal(pool[[1, 3]], untouched)


def test_bf16_inputs_keep_fp32_state():
    q, k, v, g, beta, s0 = make_inputs(1, 40, 2, 2, 8, 8, "model", True, seed=1, dtype=torch.bfloat16)
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert o.dtype == torch.bfloat16 and s.dtype == torch.float32
    o_ref, s_ref = naive(q, k, v, g, beta, s0)
    assert rel_err(o, o_ref) <= 1e-2 and rel_err(s, s_ref) <= 1e-5


def test_empty_prefill_returns_initial_state():
    q, k, v, g, beta, s0 = make_inputs(2, 0, 1, 2, 4, 4, "model", True)
    o, s = gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0)
    assert o.shape == (2, 0, 2, 4) and torch.equal(s, s0)


def test_dispatcher_rejects_bad_shapes():
    q, k, v, g, beta, s0 = make_inputs(1, 4, 2, 3, 4, 4, "model", True)   # Hv=3 not a multiple of Hk=2
    with pytest.raises(ValueError):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta)
    q, k, v, g, beta, s0 = make_inputs(1, 4, 2, 4, 4, 4, "model", True)
    with pytest.raises(ValueError):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, s0[:, :2])
    with pytest.raises(ValueError):
        gdn.chunk_gated_delta_rule(q, k, v, g[..., :2], beta)
    with pytest.raises(ValueError):
        gdn.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=0)
    with pytest.raises(ValueError):   # the decode state must be fp32 (it is updated in place)
        gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s0.double())
    with pytest.raises(ValueError):   # two rows for one lane and no slots
        gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s0.repeat(2, 1, 1, 1))
    with pytest.raises(ValueError):
        gdn.recurrent_gated_delta_rule_step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], s0,
                                            slots=torch.tensor([0, 1]))

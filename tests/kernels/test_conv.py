"""ignis_kernels.gdn causal conv (prefill from a conv state, one-step decode) against independent routes.

Routes: torch.nn.functional.conv1d over the whole zero-padded sequence (MODELS.md §2.3: depthwise, no bias, left
context K−1, then SiLU), transformers' causal_conv1d_fn / causal_conv1d_update, and self-consistency (split
prefill, prefill then decode, slot pools).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ignis_kernels import gdn

torch.set_num_threads(1)
TOL = 1e-6


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert got.shape == ref.shape, (tuple(got.shape), tuple(ref.shape))
    return ((got.double() - ref.double()).abs().max() / ref.double().abs().max().clamp_min(1e-12)).item()


def make(b, c, t, k, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, t, generator=gen), torch.randn(c, 1, k, generator=gen) * 0.3


def whole(x, w, activation=True):
    """The conv of the whole sequence with zeros before it: F.conv1d with K−1 left padding."""
    k = w.shape[-1]
    y = F.conv1d(F.pad(x, (k - 1, 0)), w, groups=x.shape[1])
    return F.silu(y) if activation else y


@pytest.fixture(scope="module")
def hf():
    mod = pytest.importorskip("transformers.models.qwen3_next.modeling_qwen3_next")
    return mod.causal_conv1d_fn, mod.causal_conv1d_update


@pytest.mark.parametrize("k", [4, 2, 1])
@pytest.mark.parametrize("t", [1, 2, 5, 64, 130])
def test_prefill_from_zero_state(t, k, hf):
    x, w = make(2, 24, t, k, seed=t * 10 + k)
    ref = whole(x, w)
    for state in (None, torch.zeros(2, 24, k - 1)):
        out, new_state = gdn.causal_conv1d_prefill(x, w, state)
        assert out.shape == x.shape and new_state.shape == (2, 24, k - 1)
        assert rel_err(out, ref) <= TOL
        assert torch.equal(new_state, F.pad(x, (k - 1, 0))[..., x.shape[-1]:])   # the last K−1 input columns
    assert rel_err(out, hf[0](x, w.squeeze(1), None, activation="silu")) <= TOL
    assert rel_err(gdn.causal_conv1d_prefill(x, w.squeeze(1))[0], ref) <= TOL          # weight [C, K]
    assert rel_err(gdn.causal_conv1d_prefill(x, w, activation=None)[0], whole(x, w, False)) <= TOL


@pytest.mark.parametrize("piece", [1, 2, 7, 64, 100, "mixed"])
def test_split_prefill_equals_whole_sequence(piece):
    t = 230
    x, w = make(3, 40, t, 4, seed=1)
    ref = whole(x, w)
    sizes = [1, 2, 7, 64, 100, 56] if piece == "mixed" else [piece] * (t // piece) + ([t % piece] if t % piece else [])
    state, outs, a = None, [], 0
    for n in sizes:
        out, state = gdn.causal_conv1d_prefill(x[..., a:a + n], w, state)
        outs.append(out)
        a += n
    assert a == t
    assert rel_err(torch.cat(outs, -1), ref) <= TOL
    assert torch.equal(state, x[..., -3:])


@pytest.mark.parametrize("prefill_len", [0, 1, 2, 50])
def test_prefill_then_decode_steps(prefill_len, hf):
    t, k = 60, 4
    x, w = make(2, 16, t, k, seed=prefill_len)
    ref = whole(x, w)
    p = prefill_len
    out, state = gdn.causal_conv1d_prefill(x[..., :p], w, None)
    hf_state = torch.cat((torch.zeros(2, 16, 1), state), -1)   # transformers' K-column cache layout
    outs = [out]
    for i in range(p, t):
        o = gdn.causal_conv1d_step(x[..., i], w, state)
        assert o.shape == (2, 16)
        o_hf = hf[1](x[..., i:i + 1], hf_state, w.squeeze(1), None, "silu")
        assert rel_err(o, o_hf[..., 0]) <= TOL
        assert torch.equal(state, hf_state[..., 1:])
        outs.append(o[..., None])
    assert rel_err(torch.cat(outs, -1), ref) <= TOL
    assert torch.equal(state, x[..., -(k - 1):])


def test_decode_step_with_slots():
    """Three lanes decode from a pool of 5 conv-state rows; the other rows are untouched."""
    c, k = 12, 4
    slots = torch.tensor([3, 0, 4])
    seqs = [make(1, c, n, k, seed=n)[0] for n in (9, 2, 30)]
    w = make(1, c, 1, k, seed=99)[1]
    pool = torch.randn(5, c, k - 1)
    untouched = pool[[1, 2]].clone()
    for x, sl, p in zip(seqs, slots.tolist(), (5, 0, 20)):
        _, pool[sl] = gdn.causal_conv1d_prefill(x[..., :p], w, None)
    for j in range(2):
        xb = torch.stack([x[0, :, p + j] for x, p in zip(seqs, (5, 0, 20))])
        o = gdn.causal_conv1d_step(xb, w, pool, slots=slots)
        for lane, (x, p) in enumerate(zip(seqs, (5, 0, 20))):
            assert rel_err(o[lane], whole(x[..., :p + j + 1], w)[0, :, -1]) <= TOL
            assert torch.equal(pool[slots[lane]], F.pad(x, (k - 1, 0))[0, :, p + j + 1:p + j + k])
    assert torch.equal(pool[[1, 2]], untouched)


def test_kernel_size_one_has_empty_state():
    x, w = make(1, 8, 5, 1)
    out, state = gdn.causal_conv1d_prefill(x, w)
    assert state.shape == (1, 8, 0) and rel_err(out, F.silu(x * w.view(1, 8, 1))) <= TOL
    o = gdn.causal_conv1d_step(x[..., 0], w, state)
    assert rel_err(o, F.silu(x[..., 0] * w[:, 0, 0])) <= TOL


def test_bf16_activations():
    x, w = make(1, 8, 20, 4, seed=2)
    out, state = gdn.causal_conv1d_prefill(x.bfloat16(), w, torch.zeros(1, 8, 3, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16 and state.dtype == torch.bfloat16
    assert rel_err(out, whole(x.bfloat16().float(), w)) <= 1e-2


def test_dispatcher_rejects_bad_shapes():
    x, w = make(2, 8, 5, 4)
    with pytest.raises(ValueError):
        gdn.causal_conv1d_prefill(x, w, torch.zeros(2, 8, 4))            # K columns, not K-1
    with pytest.raises(ValueError):
        gdn.causal_conv1d_prefill(x, w[:4])
    with pytest.raises(ValueError):
        gdn.causal_conv1d_step(x, w, torch.zeros(2, 8, 3))               # x must be [B, C]
    with pytest.raises(ValueError):
        gdn.causal_conv1d_step(x[..., 0], w, torch.zeros(3, 8, 3))        # 3 rows, 2 lanes, no slots
    with pytest.raises(ValueError):
        gdn.causal_conv1d_prefill(x, w, activation="gelu")

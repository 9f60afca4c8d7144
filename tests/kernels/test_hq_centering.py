"""Key/value centering of hq-e8-2b (HQ_E8_2B.md §4.3, HQFormat.centering) through KVStore.write_exact and the
attention dispatcher, against the float64 oracle of hq_support in the original domain. The oracle's centre is
computed here independently: the mean of the original keys/values at positions [S, pt) (the rotation is linear, so
this is the unrotated mean of the rotated page 0); compressed keys/values are the pool's decoded copies plus that
centre, exact ones the originals. Also: the chunking invariance of every stored byte (the page key centre's error
on offset keys: test_hq_page_center.py)."""
from __future__ import annotations

import pytest
import torch

from hq_support import oracle, run_pieces, write_pieces
from ignisd.cache.kv_format import HQFormat, KVGeometry
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore

torch.set_num_threads(1)


def pool(hkv=2, d=16, pt=8, window=8, sinks=2, centering="kv", pages=40, slots=4, dims=None):
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=window, exact_sinks=sinks, page_tokens=pt,
                   centering=centering)
    geom = KVGeometry(1, hkv, d)
    return (KVStore(fmt, geom, pages, page_tokens=pt, center_dims=dims), StateStore(fmt.seq_state_buffers(geom), slots),
            fmt)


# a key centre kept on some dims only (KVStore.center_dims, the RoPE-stable dims of a model)
SOME_DIMS = torch.tensor([1.0 if i in (0, 3, 5, 6, 7, 8, 9, 15) else 0.0 for i in range(16)])


def data(ctx, hkv, d, hq, seed, offset=3.0):
    g = torch.Generator().manual_seed(seed)
    mk, mv = torch.randn(hkv, d, generator=g) * offset, torch.randn(hkv, d, generator=g) * offset
    xk = torch.randn(ctx, hkv, d, generator=g) + mk
    xv = torch.randn(ctx, hkv, d, generator=g) + mv
    return xk, xv, torch.randn(ctx, hq, d, generator=g), g


def rel(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


@pytest.mark.parametrize("hq, hkv, window, sinks, pieces", [
    (6, 2, 8, 2, [13, 1, 1, 20, 1, 7, 1, 1, 1]),      # page 0 leaves inside a prefill chunk (at position 16)
    (4, 2, 8, 1, [15, 1, 1, 1, 1, 12, 1]),            # ... at a decode step (position 16)
    (2, 1, 0, 0, [3, 1, 1, 1, 1, 1, 1, 30, 1]),      # Wp 0, no sinks: page 0 leaves at position 8 (a decode step)
    (2, 1, 8, 9, [40, 1]),                            # S >= pt: the centre is the mean of all of page 0
])
@pytest.mark.parametrize("mode, dims", [("kv", None), ("k", None), ("k", SOME_DIMS), ("kv", SOME_DIMS)])
def test_centered_attention_matches_the_oracle(hq, hkv, window, sinks, pieces, mode, dims):
    d, pt = 16, 8
    kv, st, fmt = pool(hkv=hkv, d=d, window=window, sinks=sinks, centering=mode, dims=dims)
    wp = fmt.exact_window_pages
    ctx = sum(pieces)
    xk, xv, q, g = data(ctx, hkv, d, hq, seed=hq * 10 + window + sinks)
    pages = torch.randperm(kv.num_pages, generator=g)[:-(-ctx // pt)].tolist()
    lo = sinks if sinks < pt else 0
    mu_k, mu_v = xk[lo:pt].double().mean(0), xv[lo:pt].double().mean(0)
    if mode == "k":                                      # keys only: values stored as they are
        mu_v = torch.zeros_like(mu_v)
    if dims is not None:                                 # the key centre on those dims only (values: all)
        mu_k = mu_k * dims.double()
    for start, end, got, kh, vh, rk in run_pieces(kv, st, xk, xv, q, pages, pieces):
        n_enc = fmt.encoded_pages(end) * pt
        centred = n_enc > 0
        assert bool(st.buffer("kv_center").any()) == centred
        kh, vh = kh.double(), vh.double()
        if centred:
            kh[:n_enc] += mu_k
            vh[:n_enc] += mu_v
        want = oracle(q[start:end], xk[:end], xv[:end], kh, vh, rk, start, wp, pt, sinks, fmt.variance_correction)
        assert rel(got, want) < 2e-5, (start, end)


def _write_all(pieces, centering="kv", seed=9):
    kv, st, fmt = pool(centering=centering)
    ctx = sum(pieces)
    xk, xv, _, _ = data(ctx, 2, 16, 4, seed)
    return kv, st, xk, write_pieces(kv, st, xk, xv, pieces)


def test_centered_bytes_do_not_depend_on_the_chunking():
    a_kv, a_st, _, _ = _write_all([50])
    b_kv, b_st, _, _ = _write_all([3, 1, 1, 20, 17, 1, 1, 6])
    c_kv, c_st, _, _ = _write_all([1] * 50)
    for name in a_kv.buffer_names:
        assert torch.equal(a_kv.buffer(name), b_kv.buffer(name)) and torch.equal(a_kv.buffer(name),
                                                                                  c_kv.buffer(name)), name
    for name in ("kv_window", "kv_sinks", "kv_center"):
        assert torch.equal(a_st.buffer(name), b_st.buffer(name)) and torch.equal(a_st.buffer(name),
                                                                                  c_st.buffer(name)), name


def test_format_fields():
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", centering=True)
    geom = KVGeometry(30, 3, 64)
    bufs = {b.name: b for b in fmt.seq_state_buffers(geom)}
    assert bufs["kv_center"].shape == (30, 2, 3, 64) and bufs["kv_center"].dtype == "float32"
    assert fmt.stamp == "hq-e8-2b/w2/s1/cr/pc/float32/seed6871653832620001"
    default = HQFormat("hq-e8-2b", "hq-e8-2b", "float32")                 # keys and values centred by default
    assert default.centering == "kv" and default.centers_values and "kv_center" in {
        b.name for b in default.seq_state_buffers(geom)}
    assert default.stamp == "hq-e8-2b/w2/s1/cr/pc/float32/seed6871653832620001"
    keys = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", centering="k")
    assert not keys.centers_values and keys.stamp == "hq-e8-2b/w2/s1/ckr/pc/float32/seed6871653832620001"
    off = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", centering=False)
    assert off.centering == "" and off.stamp == "hq-e8-2b/w2/s1/pc/float32/seed6871653832620001"
    assert "kv_center" not in {b.name for b in off.seq_state_buffers(geom)}
    with pytest.raises(ValueError, match="centering 'v'"):
        HQFormat("hq-e8-2b", "hq-e8-2b", "float32", centering="v")


def test_key_centering_stores_the_values_as_they_are():
    """Under "k" the value records and the window's values are those of the uncentred format, byte for byte, and
    the keys differ (they are stored minus μ_K)."""
    k_kv, k_st, _, _ = _write_all([50], centering="k")
    o_kv, o_st, _, _ = _write_all([50], centering="")
    for name in ("codes", "scale", "resid"):                  # ("center": the page key centres, keys only)
        assert torch.equal(k_kv.buffer(name)[:, :, 1], o_kv.buffer(name)[:, :, 1]), name
    # the keys are stored minus μ_K: their page centres move by μ_K (their codes, relative to the page centre, do
    # not: (k − μ_K) − mean(k − μ_K) = k − mean(k))
    ck, co = (kv.buffer("center")[0].view(kv.num_pages, 8, 2, 4) for kv in (k_kv, o_kv))
    assert not torch.equal(ck, co)
    assert torch.equal(k_st.buffer("kv_window")[:, :, 1], o_st.buffer("kv_window")[:, :, 1])
    assert not k_st.buffer("kv_center")[:, :, 1].any() and k_st.buffer("kv_center")[:, :, 0].any()


def test_center_dims_shape_is_checked():
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=8, page_tokens=8)
    with pytest.raises(ValueError, match=r"center_dims must be \[16\]"):
        KVStore(fmt, KVGeometry(1, 2, 16), 4, page_tokens=8, center_dims=torch.ones(8))
    assert KVStore(fmt, KVGeometry(1, 2, 16), 4, page_tokens=8, center_dims=torch.ones(16)).center_dims is None

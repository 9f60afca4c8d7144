"""The page key centre of hq-e8-2b (ignis_kernels.kvq.page_center): its byte layout against values packed here by
struct (float32, float16) and against hand-checked float8 e4m3 bytes; the mean each encoded page stores, written
through KVStore.write_exact, against the mean of the rotated keys computed here (page 0 without its sinks); and the
key error it saves on keys with a shared offset against E8P of the same keys without it (kvq.encode_rotated)."""
from __future__ import annotations

import struct

import pytest
import torch

import ignis_kernels.kvq as kvq
from hq_support import decoded, hq_pool, write_chunks
from ignis_kernels.kvq import page_center as pc

torch.set_num_threads(1)


@pytest.mark.parametrize("d, pt, fmt, size", [(8, 8, "<f", 4), (16, 8, "<e", 2)])
def test_float_layouts_match_struct(d, pt, fmt, size):
    g = torch.Generator().manual_seed(d)
    mu = pc.round_center(torch.randn(2, 3, d, generator=g) * 4, pt)            # 2 pages, 3 heads
    block = pc.pack(mu, pt)
    assert block.shape == (2, pt, 3, 4) and block.dtype == torch.uint8
    for p in range(2):
        for h in range(3):
            want = b"".join(struct.pack(fmt, float(x)) for x in mu[p, h]).ljust(4 * pt, b"\0")
            assert bytes(block[p, :, h, :].reshape(-1).tolist()) == want           # token-major, 4 bytes a token
    assert torch.equal(pc.unpack(block, d), mu)


def test_float8_bytes_are_e4m3_and_saturate():
    # e4m3 (bias 7): 1.0 = 0 0111 000, -0.5 = 1 0110 000, 448 = 0 1111 110 (largest finite), 2^-9 = smallest
    # subnormal 0 0000 001; 1000 saturates to 448; 0.3 rounds to 0.3125 = 1.25·2^-2 = 0 0101 010
    vals = torch.tensor([1.0, -0.5, 448.0, 2.0 ** -9, 1000.0, 0.3] + [0.0] * 58).view(1, 1, 64)
    block = pc.pack(vals, 16)                                                   # d 64 > 2·16: float8
    got = bytes(block[0, :, 0, :].reshape(-1).tolist())[:6]
    assert got == bytes([0x38, 0xB0, 0x7E, 0x01, 0x7E, 0x2A])
    back = pc.unpack(block, 64)[0, 0, :6].tolist()
    assert back == [1.0, -0.5, 448.0, 2.0 ** -9, 448.0, 0.3125]


def test_head_dim_beyond_four_bytes_a_token_is_refused():
    with pytest.raises(ValueError, match="head_dim 128 needs pages of at least 32 tokens"):
        pc.center_dtype(128, 16)
    with pytest.raises(ValueError, match="head_dim 64 needs pages of at least 16 tokens"):
        hq_pool(d=64, pt=8)


def test_each_page_stores_the_mean_of_its_rotated_keys_without_the_sinks():
    kv, st, fmt = hq_pool(hkv=2, d=16, pt=8, window=8, sinks=3, pages=10)     # float16 centre
    g = torch.Generator().manual_seed(3)
    n = 41                                                                      # pages 0..3 encoded (Wp 1)
    xk, xv = torch.randn(n, 2, 16, generator=g) + 2.0, torch.randn(n, 2, 16, generator=g)
    st.zero(0)
    pages = [4, 7, 1, 9, 0, 2]
    write_chunks(kv, st, 0, [(xk[:30], xv[:30], 0, pages, 0)])
    write_chunks(kv, st, 0, [(xk[30:], xv[30:], 30, pages, 0)])
    u = kvq.rotate(xk, kv.signs[0, 0]).double()                                 # the rotated keys
    block = kv.buffer("center")[0].view(kv.num_pages, 8, 2, 4)
    for i, page in enumerate(pages[:4]):
        lo = 3 if i == 0 else 0                                                 # page 0 without its 3 sinks
        want = u[i * 8 + lo:(i + 1) * 8].mean(0).half().double()
        got = pc.unpack(block[page], 16).double()
        assert torch.allclose(got, want, atol=2e-3), i
    assert not block[pages[4]].any() and not block[pages[5]].any()             # not encoded yet


def test_the_page_centre_lowers_the_key_error_on_offset_keys():
    kv, st, fmt = hq_pool(hkv=2, d=16, pt=8, window=8, sinks=1, pages=10)
    g = torch.Generator().manual_seed(11)
    n = 60
    off = torch.randn(2, 16, generator=g) * 3
    xk, xv = torch.randn(n, 2, 16, generator=g) + off, torch.randn(n, 2, 16, generator=g)
    st.zero(0)
    pages = list(range(8))
    write_chunks(kv, st, 0, [(xk, xv, 0, pages, 0)])
    m = 8 * 6                                                                   # pages 0..5 encoded at 60 (Wp 1)
    kh, _, _ = decoded(kv, 0, pages, m)
    sg = kv.signs[0, 0]
    codes, scale, _, _ = kvq.encode_rotated(kvq.rotate(xk[:m], sg))             # E8P of the keys as they are
    plain = kvq.unrotate(kvq.decode_rotated(codes, scale), sg)

    def err(x):
        return float(((x[1:] - xk[1:m]) ** 2).sum() / (xk[1:m] ** 2).sum())   # position 0: a sink
    assert err(kh) < 0.35 * err(plain), (err(kh), err(plain))


def test_page_centre_dims_keep_the_centre_on_those_dims_only():
    """page_center_dims (the daemon passes the dims RoPE turns fast): the stored centre, un-rotated, is the page's
    mean key on those dims and zero on the others."""
    from ignisd.cache.kv_format import HQFormat, KVGeometry
    from ignisd.cache.kv_store import KVStore
    from ignisd.cache.state_store import StateStore
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=8, exact_sinks=1, page_tokens=8, centering="")
    geom = KVGeometry(1, 2, 8)                                                  # d 8 <= pt: float32 centre
    dims = torch.tensor([1.0, 0, 0, 1, 1, 0, 1, 0])
    kv = KVStore(fmt, geom, 6, page_tokens=8, page_center_dims=dims)
    st = StateStore(fmt.seq_state_buffers(geom), 1)
    g = torch.Generator().manual_seed(5)
    xk, xv = torch.randn(33, 2, 8, generator=g) + 2.0, torch.randn(33, 2, 8, generator=g)
    st.zero(0)
    write_chunks(kv, st, 0, [(xk, xv, 0, [0, 1, 2, 3, 4], 0)])              # pages 0..2 encoded at 33
    block = kv.buffer("center")[0].view(6, 8, 2, 4)
    for p in range(3):
        lo = 1 if p == 0 else 0
        got = kvq.unrotate(pc.unpack(block[p], 8), kv.signs[0, 0])           # original domain [Hkv, d]
        want = xk[p * 8 + lo:(p + 1) * 8].mean(0) * dims
        assert torch.allclose(got, want, atol=1e-5), p
    with pytest.raises(ValueError, match=r"page_center_dims must be \[8\]"):
        KVStore(fmt, geom, 2, page_tokens=8, page_center_dims=torch.ones(4))


def test_encoding_several_layers_at_once_writes_the_bytes_of_one_layer_at_a_time():
    """KVStore.encode_layers (a decode step's pages of every layer in one pass, exact_window.prepare_decode) against
    encode_into per layer: every page buffer byte for byte, page 0 (sinks out of its centre) and a later page, with
    page_center_dims set."""
    from ignisd.cache.kv_format import HQFormat, KVGeometry
    from ignisd.cache.kv_store import KVStore
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=8, exact_sinks=2, page_tokens=8)
    geom = KVGeometry(3, 2, 16)                                                 # d 16: a float16 centre
    dims = torch.tensor([1.0, 0] * 8)
    one, many = (KVStore(fmt, geom, 6, page_tokens=8, page_center_dims=dims) for _ in range(2))
    g = torch.Generator().manual_seed(9)
    u = torch.randn(3, 16, 2, 2, 16, generator=g) + torch.randn(3, 1, 2, 2, 16, generator=g)   # 2 pages a layer
    slots = torch.cat((torch.arange(8) + 8 * 4, torch.arange(8) + 8 * 1))     # pages 4 and 1 of the pool
    first = torch.tensor([True, False])
    for layer in range(3):
        one.encode_into(layer, slots, u[layer], first)
    many.encode_layers([0, 1, 2], slots, u, first)
    for name in one.buffer_names:
        assert torch.equal(one.buffer(name), many.buffer(name)), name
    assert one.buffer("codes")[2, 8:16].any() and not one.buffer("codes")[:, 16:32].any()

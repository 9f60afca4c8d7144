"""The dense-page CPU decode attention kernel (ignis_kernels.attention.dense_cpu): against softmax attention written out
in float64 over the gathered context (an independent route) on fp32 and bf16 pages, shuffled page tables, contexts
across chunk and page edges and grouped-query geometries; a row's output alone, batched and at any thread count; the
dispatcher taking it; what it does not take; the switch-off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ignis_kernels.attention as kattn
from ignis_kernels.attention import PagedView, dense_cpu

torch.set_num_threads(1)


def _oracle(q, k_pages, v_pages, table, lens, scale=None):
    """float64 softmax(scale·q·Kᵀ)·V per row and query head, over the row's first lens[b] positions."""
    b, hq, d = q.shape
    pt, hkv = k_pages.shape[1], k_pages.shape[2]
    g = hq // hkv
    tau = d ** -0.5 if scale is None else scale
    out = torch.empty(b, hq, d, dtype=torch.float64)
    for r in range(b):
        n = int(lens[r])
        pos = torch.arange(n)
        k = k_pages[table[r, pos // pt], pos % pt].double()                # [n, Hkv, d]
        v = v_pages[table[r, pos // pt], pos % pt].double()
        for i in range(hq):
            w = torch.softmax(tau * (k[:, i // g] @ q[r, i].double()), 0)
            out[r, i] = w @ v[:, i // g]
    return out


def _case(seed, hkv, g, d, pages=12, pt=64, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    k = (torch.randn(pages, pt, hkv, d, generator=gen) * 2).to(dtype)
    v = torch.randn(pages, pt, hkv, d, generator=gen).to(dtype)
    q = torch.randn(4, hkv * g, d, generator=gen)
    table = torch.stack([torch.randperm(pages, generator=gen)[:6] for _ in range(4)])
    return q, k, v, table


def test_the_kernel_serves_here():
    assert dense_cpu.available(), dense_cpu.error()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hkv, g, d", [(3, 3, 64), (1, 1, 8), (2, 4, 128), (1, 16, 256), (4, 2, 24)])
def test_equals_softmax_attention_in_float64(dtype, hkv, g, d):
    q, k, v, table = _case(hkv * g + d, hkv, g, d, dtype=dtype)
    lens = torch.tensor([1, 64, 257, 6 * 64])                                   # one token, a page, past a chunk, all
    got = dense_cpu.decode_attention(q, k, v, table, lens)
    torch.testing.assert_close(got.double(), _oracle(q, k, v, table, lens), rtol=1e-5, atol=1e-5)
    got = dense_cpu.decode_attention(q, k, v, table, lens, scale=0.3)
    torch.testing.assert_close(got.double(), _oracle(q, k, v, table, lens, 0.3), rtol=1e-5, atol=1e-5)


def test_a_row_does_not_depend_on_its_batch_or_the_thread_count():
    q, k, v, table = _case(1, 3, 3, 64)
    lens = torch.tensor([300, 5, 384, 129])
    full = dense_cpu.decode_attention(q, k, v, table, lens)
    for r in range(4):
        alone = dense_cpu.decode_attention(q[r:r + 1].contiguous(), k, v, table[r:r + 1], lens[r:r + 1])
        assert torch.equal(alone, full[r:r + 1]), r
    torch.set_num_threads(2)
    try:
        assert torch.equal(dense_cpu.decode_attention(q, k, v, table, lens), full)
    finally:
        torch.set_num_threads(1)


def test_the_dispatcher_reads_dense_pages_with_it(monkeypatch):
    q, k, v, table = _case(2, 3, 3, 64)
    lens = torch.tensor([100, 200, 3, 384])
    view = PagedView("dense", {"k": k, "v": v}, 64)
    want = dense_cpu.decode_attention(q, k, v, table, lens)
    assert torch.equal(kattn.paged_decode_attention(q, view, table, lens), want)
    assert kattn.decode_kernel("dense", torch.device("cpu")) == "cpu (C kernel)"
    calls = []
    monkeypatch.setattr(dense_cpu, "decode_attention", lambda *a, **kw: calls.append(1))
    kattn.paged_decode_attention(q[:, :, :60].contiguous(), PagedView("dense", {"k": k[..., :60].contiguous(),
                                 "v": v[..., :60].contiguous()}, 64), table, lens)       # d 60: the torch path
    kattn.paged_decode_attention(q.double(), view, table, lens)                         # float64 q: the torch path
    assert calls == []


def test_out_of_range_lengths_are_refused():
    q, k, v, table = _case(3, 3, 3, 64)
    with pytest.raises(RuntimeError, match="context lengths outside"):
        dense_cpu.decode_attention(q, k, v, table, torch.tensor([1, 2, 6 * 64 + 1, 4]))
    with pytest.raises(RuntimeError, match="context lengths outside"):
        dense_cpu.decode_attention(q, k, v, table, torch.tensor([0, 2, 3, 4]))


def test_the_switch_turns_it_off():
    code = ("import torch; from ignis_kernels.attention import dense_cpu, decode_kernel; "
            "print(dense_cpu.available(), '|', decode_kernel('dense', torch.device('cpu')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "IGNIS_DENSE_CPU_KERNEL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == \
        "False | dense (torch; disabled by IGNIS_DENSE_CPU_KERNEL=0)", r.stdout + r.stderr

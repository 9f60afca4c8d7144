"""The exact-window decode write on the CPU (ignis_kernels.kvq.window_cpu, window_cpu.c): one row's rotated,
re-centred keys and values written into its ring slot and sink row, bit-identical to rotation.rotate and
exact_window._recenter (the torch path); KVStore.write_exact taking it for one-row decode steps and giving every stored
byte the torch path gives; its switch-off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from hq_support import write_chunks
from ignis_kernels.kvq import window_cpu
from ignis_kernels.kvq.rotation import layer_signs, rotate
from ignisd.cache.kv_format import HQFormat, KVGeometry
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore

torch.set_num_threads(1)


@pytest.mark.parametrize("hkv, d", [(1, 8), (3, 64), (2, 128), (4, 256)])
def test_write_row_is_the_torch_rotation_bit_for_bit(hkv, d):
    assert window_cpu.available(), window_cpu.error()
    g = torch.Generator().manual_seed(d + hkv)
    for trial in range(40):
        k = torch.randn(1, hkv, d, generator=g) * 10.0 ** (trial % 7 - 3)     # magnitudes 1e-3 .. 1e3
        v = torch.randn(1, hkv, d, generator=g)
        signs = layer_signs(trial, hkv, d)
        mu = torch.randn(2, hkv, d, generator=g)
        want = torch.stack((rotate(k, signs[0]), rotate(v, signs[1])), dim=1)[0]    # [2, Hkv, d]
        ring = torch.full((2, 7, hkv, d), float("nan"))                          # a ring of 7 slots
        sinks = torch.full((2, 3, hkv, d), float("nan"))
        window_cpu.write_row(k, v, signs, None, ring[:, 5], None)
        assert torch.equal(ring[:, 5], want)
        assert ring[:, :5].isnan().all() and ring[:, 6].isnan().all() and sinks.isnan().all()   # nothing else
        window_cpu.write_row(k, v, signs, mu, ring[:, 2], sinks[:, 1])
        centred = (want - mu).to(torch.float32)                                  # exact_window._recenter's rounding
        assert torch.equal(ring[:, 2], centred) and torch.equal(sinks[:, 1], centred)
        assert sinks[:, 0].isnan().all() and sinks[:, 2].isnan().all()


def _decode_run(hkv, d, pt, window, sinks, centering, n, value_dtype, monkeypatch, kernel):
    """A sequence of n tokens written by one 5-token prefill chunk then one decode step a token -> (store, states,
    kernel calls)."""
    fmt = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=window, exact_sinks=sinks, page_tokens=pt,
                   centering=centering)
    geom = KVGeometry(1, hkv, d)
    kv, st = KVStore(fmt, geom, -(-n // pt) + 1, page_tokens=pt), StateStore(fmt.seq_state_buffers(geom), 3)
    calls = []
    real = window_cpu.write_row
    monkeypatch.setattr(window_cpu, "available", (lambda: True) if kernel else (lambda: False))
    monkeypatch.setattr(window_cpu, "write_row", lambda *a: (calls.append(1), real(*a)))
    g = torch.Generator().manual_seed(d)
    xk = torch.randn(n, hkv, d, generator=g) + 2.0
    xv = (torch.randn(n, hkv, d, generator=g) - 1.0).to(value_dtype)
    pages = list(range(-(-n // pt)))
    st.zero(1)
    write_chunks(kv, st, 0, [(xk[:5], xv[:5], 0, pages, 1)])
    for p in range(5, n):
        write_chunks(kv, st, 0, [(xk[p:p + 1], xv[p:p + 1], p, pages, 1)])
    return kv, st, len(calls)


@pytest.mark.parametrize("hkv, d, pt, window, sinks, centering, n, value_dtype", [
    (3, 64, 16, 32, 1, "kv", 150, torch.bfloat16),   # SmolLM2's heads (its values arrive in bf16), small pages
    (2, 128, 32, 32, 40, "k", 140, torch.float32),   # keys centred only, sinks past the first page
    (1, 256, 64, 64, 0, "", 200, torch.float32),     # no centre, no sinks
])
def test_write_exact_stores_what_the_torch_path_stores(hkv, d, pt, window, sinks, centering, n, value_dtype,
                                                        monkeypatch):
    a_kv, a_st, a_calls = _decode_run(hkv, d, pt, window, sinks, centering, n, value_dtype, monkeypatch, True)
    b_kv, b_st, b_calls = _decode_run(hkv, d, pt, window, sinks, centering, n, value_dtype, monkeypatch, False)
    wp = -(-window // pt)
    # every decode step but those where a page leaves the window (p % pt == 0 past the first Wp + 1 pages) and the
    # one where the centre is fixed (p == (Wp + 1)·pt, one of those) takes the kernel
    events = sum(1 for p in range(5, n) if p % pt == 0 and p // pt - wp - 1 >= 0)
    assert a_calls == n - 5 - events and b_calls == 0
    for name in a_kv.buffer_names:
        assert torch.equal(a_kv.buffer(name), b_kv.buffer(name)), name
    names = ["kv_window"] + (["kv_sinks"] if sinks else []) + (["kv_center"] if centering else [])
    for name in names:
        assert torch.equal(a_st.buffer(name), b_st.buffer(name)), name


def test_the_switch_turns_it_off():
    code = "from ignis_kernels.kvq import window_cpu; print(window_cpu.available(), window_cpu.error())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "IGNIS_WINDOW_CPU_KERNEL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False disabled by IGNIS_WINDOW_CPU_KERNEL=0", r.stdout + r.stderr

"""The fused CPU decode kernel over hq-e8-2b pages (ignis_kernels.attention.hq_cpu, hq_cpu.c) at the geometries it
specialises (SmolLM2's head_dim 64 with GQA 3; Qwen3.5's head_dim 256 with GQA 4 and 6) and generic ones, against
the float64 oracle of HQ_E8_2B.md §4 (hq_support.oracle) and the torch decode path (hq_decode.py), with the page key
centre (kvq/page_center.py) in each of its storage dtypes (float32, float16, float8 e4m3) and shown to count; each row's
output bit-identical alone and in a batch and at 1 and 2 threads; and the build (ignis_kernels.cbuild) of both C
kernels (this one and kvq/e8p_cpu.c), its cache and its fallback to the torch paths."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

import ignis_kernels.attention as kattn
from hq_support import decoded, hq_pool, oracle, write_chunks
from ignis_kernels.attention import hq_cpu, hq_decode
from ignis_kernels.kvq import page_center

torch.set_num_threads(1)


def rel(got, ref):
    return float((got.double() - ref).abs().max() / ref.abs().max())


def _sequences(hkv, d, pt, window, sinks, lens, seed, slots=4, vc=None):
    """A pool holding len(lens) sequences on scrambled pages, each written by prefill chunks of up to 70 tokens
    plus one decode step -> (kv, fmt, plan, ring, [(k, v, pages)]). The keys have mean 1.5 on every dim, so the page
    key centres are far from zero."""
    kv, st, fmt = hq_pool(hkv=hkv, d=d, pt=pt, window=window, sinks=sinks, pages=sum(-(-n // pt) for n in lens) + 2,
                          slots=slots, vc=vc)
    g = torch.Generator().manual_seed(seed)
    pool = torch.randperm(kv.num_pages, generator=g).tolist()
    seqs = []
    for i, n in enumerate(lens):
        pages = [pool.pop() for _ in range(-(-n // pt))]
        k, v = torch.randn(n, hkv, d, generator=g) + 1.5, torch.randn(n, hkv, d, generator=g)
        st.zero(i)
        for s in range(0, n - 1, 70):
            e = min(n - 1, s + 70)
            write_chunks(kv, st, 0, [(k[s:e], v[s:e], s, pages, i)])
        seqs.append((k, v, pages))
    plan, _, ring = write_chunks(kv, st, 0, [(k[n - 1:n], v[n - 1:n], n - 1, pages, i)
                                             for i, ((k, v, pages), n) in enumerate(zip(seqs, lens))])
    return kv, fmt, plan, ring, seqs


def _without_centre(view):
    """The view with its "center" bytes zeroed (a copy): what the scores would be without q̃·μ_K."""
    return kattn.PagedView(view.tag, {**view.buffers, "center": torch.zeros_like(view.buffers["center"])},
                           view.page_tokens, view.params)


@pytest.mark.parametrize("hkv, g, d, pt, window, sinks, lens, vc", [
    (3, 3, 64, 64, 128, 1, [1, 64, 200, 700], None),  # SmolLM2: specialised (g 3, d 64), centre float32
    (2, 4, 256, 64, 64, 4, [5, 200, 330], 1.0),       # Qwen3.5-like head_dim 256, GQA 4, four sinks, centre e4m3
    (1, 6, 256, 64, 64, 0, [40, 300], 0.0),           # GQA 6, no sinks, Wp 1, centre e4m3
    (2, 2, 64, 16, 16, 1, [30, 130], 0.25),           # d 64 on 16-token pages: centre e4m3, pages cross a task
    (2, 5, 16, 8, 8, 2, [3, 17, 300], 1.0),           # generic (g 5, d 16): the unspecialised loop, centre float16
])
def test_matches_the_oracle_and_the_torch_path(hkv, g, d, pt, window, sinks, lens, vc):
    """vc: the variance correction's strength (None: the shipped default)."""
    assert hq_cpu.available(), hq_cpu.error()
    kv, fmt, plan, ring, seqs = _sequences(hkv, d, pt, window, sinks, lens, seed=hkv * 31 + d, vc=vc)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(len(lens), hkv * g, d, generator=gen) * 2
    view = kv.view(0)
    assert hq_cpu.supports(q, view, ring)
    got = hq_cpu.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, ring)
    torch_path = hq_decode.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, ring)
    for b, ((k, v, pages), n) in enumerate(zip(seqs, lens)):
        kh, vh, rk = decoded(kv, 0, pages, n)
        want = oracle(q[b:b + 1], k, v, kh, vh, rk, n - 1, fmt.exact_window_pages, pt, sinks, fmt.variance_correction)
        assert rel(got[b:b + 1], want) < 2e-5, (b, n)
        assert rel(torch_path[b:b + 1], want) < 2e-5, (b, n)
    # the centre is there (the keys' mean, 1.5 on every dim, is rotated: its RMS over the dims stays 1.5, rounded to
    # any of the three dtypes) and it counts: without it the rows that read compressed keys change by far more than
    # the tolerance, the others not at all
    n_enc = [max(0, (n - 1) // pt - fmt.exact_window_pages) for n in lens]
    for (_, _, pages), e in zip(seqs, n_enc):
        if e:
            mu = page_center.unpack(view.buffers["center"][pages[:e]], d)       # [e, Hkv, d]
            rms = mu.pow(2).mean(-1).sqrt()
            assert (rms - 1.5).abs().max() < 0.3, rms
    bare = hq_cpu.hq_decode_attention(q, _without_centre(view), plan.decode_pages, plan.decode_lens, ring)
    for b, e in enumerate(n_enc):
        if e * pt > sinks:
            assert rel(bare[b:b + 1], got[b:b + 1].double()) > 1e-2, b
        else:
            assert torch.equal(bare[b:b + 1], got[b:b + 1]), b


@pytest.mark.parametrize("hkv, g, d, one", [(3, 3, 64, False), (2, 4, 256, False), (3, 3, 64, True)])
def test_the_value_centre_is_added_back_in_the_kernel(hkv, g, d, one):
    """ExactRing.center_v (rotated μ_V, one row per batch row, or [1, Hkv, d] for one row): the kernel's output
    equals the torch path's plus the centre un-rotated by hand, s_V ⊙ H·μ_V/√d with H the dense Sylvester matrix
    (independent of either path), and the dispatcher returns exactly the kernel's output (nothing added twice)."""
    lens = [300] if one else [70, 300]
    kv, fmt, plan, ring, seqs = _sequences(hkv, d, 64, 64, 1, lens, seed=d + hkv)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(len(lens), hkv * g, d, generator=gen)
    mu = torch.randn(len(lens), hkv, d, generator=gen) * 3
    centred = kattn.ExactRing(ring.k, ring.v, ring.sink_k, ring.sink_v, ring.window_pages, mu)
    view = kv.view(0)
    got = hq_cpu.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, centred)
    plain = hq_decode.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, ring)
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:                                           # Sylvester: H_2n = [[H, H], [H, -H]]
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    sv = view.params["signs"][1].double()                                      # [Hkv, d]
    back = (mu.double() @ h) / d ** 0.5 * sv                                   # [B, Hkv, d]
    want = plain.double() + back.repeat_interleave(g, dim=1)
    assert rel(got, want) < 2e-5
    assert torch.equal(kattn.paged_decode_attention(q, view, plan.decode_pages, plan.decode_lens, exact=centred), got)


def test_a_row_is_bit_identical_alone_batched_and_at_any_thread_count():
    """Each row is computed alone, its split-K partials merged in a fixed order: the same bits in a batch of 3 as
    alone, and at 1 as at 2 threads."""
    kv, fmt, plan, ring, seqs = _sequences(3, 64, 64, 128, 1, [150, 900, 1300], seed=2)
    q = torch.randn(3, 9, 64, generator=torch.Generator().manual_seed(1))
    view = kv.view(0)
    batched = hq_cpu.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, ring)
    for b in range(3):
        one = kattn.ExactRing(ring.k[b:b + 1], ring.v[b:b + 1], ring.sink_k[b:b + 1], ring.sink_v[b:b + 1],
                              ring.window_pages)
        alone = hq_cpu.hq_decode_attention(q[b:b + 1], view, plan.decode_pages[b:b + 1],
                                           plan.decode_lens[b:b + 1], one)
        assert torch.equal(alone, batched[b:b + 1]), b
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        two = hq_cpu.hq_decode_attention(q, view, plan.decode_pages, plan.decode_lens, ring)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(two, batched)


def test_the_dispatcher_takes_the_kernel_on_the_cpu(monkeypatch):
    monkeypatch.delenv("IGNIS_HQ_ATTENTION", raising=False)
    assert kattn.hq_backend(torch.device("cpu")) == "cpu"
    monkeypatch.setenv("IGNIS_HQ_ATTENTION", "reference")
    assert kattn.hq_backend(torch.device("cpu")) == "reference"


def _fresh(env: dict, tmp_path) -> subprocess.CompletedProcess:
    code = textwrap.dedent("""
        import logging, torch
        logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
        import ignis_kernels.attention as kattn
        import ignis_kernels.kvq as kvq
        from ignis_kernels.attention import hq_cpu
        from ignis_kernels.kvq import e8p_cpu
        print("backend", kattn.hq_backend(torch.device("cpu")))
        print("error", hq_cpu.error())
        codes = kvq.encode_rotated(torch.ones(2, 64))[0]               # the torch search when the C one is off
        print("encoder", e8p_cpu.available(), e8p_cpu.error(), codes.shape)
    """)
    full = {**os.environ, "IGNIS_KERNEL_CACHE": str(tmp_path / "cache"), **env}
    full.pop("IGNIS_HQ_ATTENTION", None)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=120)


def test_without_a_compiler_the_torch_path_serves_and_says_why(tmp_path):
    r = _fresh({"CC": "/bin/false"}, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "backend reference" in r.stdout and "encoder False" in r.stdout and "torch.Size([2, 8])" in r.stdout
    assert "could not be built" in r.stdout and r.stderr.count("ignis.kernels WARNING") == 2, r.stderr
    assert "could not be built: no working C compiler: `/bin/false --version` exited with status 1" in r.stdout
    r = _fresh({"IGNIS_HQ_CPU_KERNEL": "0"}, tmp_path)
    assert "backend reference" in r.stdout and "disabled by IGNIS_HQ_CPU_KERNEL=0" in r.stdout
    assert "encoder True" in r.stdout
    r = _fresh({"IGNIS_CPU_KERNELS": "0"}, tmp_path)
    assert "backend reference" in r.stdout and "encoder False disabled by IGNIS_CPU_KERNELS=0" in r.stdout


def test_a_build_lands_in_the_cache_once(tmp_path):
    r = _fresh({}, tmp_path)
    assert r.returncode == 0 and "backend cpu" in r.stdout, r.stdout + r.stderr
    cache = tmp_path / "cache"
    built = sorted(p.name for p in cache.iterdir())
    assert [b.split("-")[0] for b in built] == ["e8p_cpu", "hq_cpu"] and all(b.endswith(".so") for b in built), built
    mtimes = [(cache / b).stat().st_mtime_ns for b in built]
    r = _fresh({}, tmp_path)                       # a second process loads the same files, compiles nothing
    assert "backend cpu" in r.stdout
    assert sorted(p.name for p in cache.iterdir()) == built
    assert [(cache / b).stat().st_mtime_ns for b in built] == mtimes


def test_an_edited_header_rebuilds_the_kernels_that_include_it(tmp_path, monkeypatch):
    from ignis_kernels import cbuild
    monkeypatch.setenv("IGNIS_KERNEL_CACHE", str(tmp_path / "cache"))
    (tmp_path / "inc").mkdir()
    (tmp_path / "src").mkdir()
    head = tmp_path / "inc" / "value.h"
    (tmp_path / "inc" / "twice.h").write_text('#pragma once\n#include "value.h"\n'
                                           'static inline int twice(void) { return 2 * VALUE; }\n')
    src = tmp_path / "src" / "probe.c"
    src.write_text('#include "../inc/twice.h"\n#include "../inc/twice.h"\nint probe(void) { return twice(); }\n')
    head.write_text("#define VALUE 21\n")
    assert cbuild.sources(src) == [src.resolve(), (tmp_path / "inc" / "twice.h").resolve(), head.resolve()]
    assert cbuild.build(src).probe() == 42
    head.write_text("#define VALUE 50\n")                 # only the header changes: a new build, not the cached one
    assert cbuild.build(src).probe() == 100
    assert len(list((tmp_path / "cache").glob("probe-*.so"))) == 2
    head.unlink()
    with pytest.raises(OSError):
        cbuild.sources(src)

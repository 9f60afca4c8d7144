"""KV formats (page buffers + per-sequence state over a KV geometry), KVStore (pages of one format) and StateStore
(per-slot named buffers), against hand-computed sizes; and the import boundary between ignisd.model and
ignisd.cache (neither imports the other)."""
from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from ignis_kernels.attention import PagedView
from ignisd.buffers import BufferSpec
from ignisd.cache.kv_format import KV_FORMATS, KVFormat, KVGeometry, get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.model.batch import ForwardBatch, SeqChunk

ROOT = Path(__file__).resolve().parents[2]
GEOM = KVGeometry(n_attention_layers=3, num_kv_heads=2, head_dim=8)


def test_dense_formats_sizes():
    fp32, bf16 = get_kv_format("fp32"), get_kv_format("bf16")
    assert (fp32.name, fp32.tag, bf16.name, bf16.tag) == ("fp32", "dense", "bf16", "dense")
    assert fp32.page_buffers(GEOM) == [BufferSpec("k", (2, 8), "float32"), BufferSpec("v", (2, 8), "float32")]
    assert [b.dtype for b in bf16.page_buffers(GEOM)] == ["bfloat16", "bfloat16"]
    assert fp32.seq_state_buffers(GEOM) == [] == bf16.seq_state_buffers(GEOM)
    assert fp32.bytes_per_token(GEOM) == 3 * 2 * (2 * 8 * 4) == 384
    assert bf16.bytes_per_token(GEOM) == 192 and bf16.page_bytes(GEOM, 64) == 64 * 192
    assert set(KV_FORMATS) == {"fp32", "bf16", "hq-e8-2b"}
    with pytest.raises(ValueError, match="allowed: fp32, bf16, hq-e8-2b"):
        get_kv_format("q4_0")
    assert fp32.retained_pages(130, 64) == (2, True) and fp32.exact_window_pages is None and fp32.stamp == "fp32"


def test_geometry_is_duck_typed(tiny_ours):
    """A ModelSpec is read wherever a geometry is: same sizes as its KVGeometry."""
    spec = tiny_ours.spec
    geom = KVGeometry.of(spec)
    assert (geom.n_attention_layers, geom.num_kv_heads, geom.head_dim) == \
        (spec.n_attention_layers, spec.num_kv_heads, spec.head_dim)
    fmt = get_kv_format("fp32")
    assert fmt.bytes_per_token(spec) == fmt.bytes_per_token(geom)
    assert KVStore(fmt, spec, 2).geometry == geom
    with pytest.raises(ValueError, match="num_kv_heads"):
        KVGeometry(2, 0, 8)


def test_kv_store_buffers_views_and_copies():
    kv = KVStore(get_kv_format("fp32"), GEOM, num_pages=4, page_tokens=4)
    assert (kv.kv_format, kv.num_pages, kv.page_tokens, kv.num_slots, kv.n_attention_layers) == ("fp32", 4, 4, 16, 3)
    assert kv.buffer_names == ["k", "v"] and kv.buffer("k").shape == (3, 16, 2, 8)
    assert kv.page_bytes == 4 * 384 and kv.nbytes == 4 * kv.page_bytes
    g = torch.Generator().manual_seed(0)
    for layer in range(3):
        x = torch.randn(16, 2, 8, generator=g)
        kv.write(layer, torch.arange(16), x, 2 * x)
    view = kv.view(1)
    assert isinstance(view, PagedView) and view.tag == "dense" and view.page_tokens == 4
    assert view.buffers["k"].shape == (4, 4, 2, 8)
    assert view.buffers["k"].data_ptr() == kv.buffer("k")[1].data_ptr()          # a view of the storage
    assert torch.equal(view.buffers["v"][2, 3], kv.buffer("v")[1, 11])
    before = {n: kv.buffer(n).clone() for n in kv.buffer_names}
    kv.copy_pages([3, 0], [1, 2])
    for n in kv.buffer_names:            # every buffer, every layer: pages 1, 2 <- 3, 0; pages 0, 3 untouched
        t, b = kv.buffer(n), before[n]
        assert torch.equal(t[:, 4:8], b[:, 12:16]) and torch.equal(t[:, 8:12], b[:, 0:4])
        assert torch.equal(t[:, 0:4], b[:, 0:4]) and torch.equal(t[:, 12:16], b[:, 12:16])
    with pytest.raises(ValueError, match="length"):
        kv.copy_pages([1], [])
    with pytest.raises(KeyError, match="k.*v"):
        kv.buffer("codes")
    with pytest.raises(IndexError):
        kv.view(3)
    with pytest.raises(ValueError, match="num_pages"):
        KVStore(get_kv_format("fp32"), GEOM, 0)


def test_kv_store_refuses_a_format_it_cannot_write():
    odd = dataclasses.replace(get_kv_format("bf16"), name="q2", tag="lattice")
    assert isinstance(odd, KVFormat)
    with pytest.raises(ValueError, match="'q2'.*'lattice'"):
        KVStore(odd, GEOM, 2)


def test_decoder_refuses_a_store_of_another_model(tiny_ours):
    spec = tiny_ours.spec
    other = KVGeometry(spec.n_attention_layers + 1, spec.num_kv_heads, spec.head_dim)
    kv = KVStore(get_kv_format("fp32"), other, 2, page_tokens=16)
    with pytest.raises(ValueError, match="different model"):
        tiny_ours.model.forward(ForwardBatch.build([SeqChunk([1, 2, 3], 0, [0])], 16), kv)


def _mixed_buffers() -> list[BufferSpec]:
    """A model's GDN state plus what a format would add (an exact window and a position)."""
    return [BufferSpec("recurrent", (2, 3, 4, 4), "float32"), BufferSpec("conv", (2, 5, 3), "float32"),
            BufferSpec("window_k", (4, 2, 8), "bfloat16"), BufferSpec("pos", (), "int64")]


def test_state_store_generic_buffers():
    st = StateStore(_mixed_buffers(), 3)
    assert st.num_slots == 3 and st.buffer("window_k").shape == (3, 4, 2, 8) and st.buffer("pos").shape == (3,)
    assert st.slot_bytes == 2 * 3 * 4 * 4 * 4 + 2 * 5 * 3 * 4 + 4 * 2 * 8 * 2 + 8 and st.nbytes == 3 * st.slot_bytes
    assert StateStore(_mixed_buffers(), 0).slot_bytes == st.slot_bytes
    g = torch.Generator().manual_seed(1)
    for b in st.buffers:
        t = st.buffer(b.name)
        t.copy_((torch.randn(t.shape, generator=g) * 100).to(t.dtype))
    image = st.image(1)
    assert [n for n, _ in image] == ["recurrent", "conv", "window_k", "pos"]
    st.zero(1)
    assert all(not st.buffer(b.name)[1].any() for b in st.buffers)
    st.restore(0, image)
    assert all(torch.equal(st.buffer(n)[0], t) for n, t in image)
    st.copy_slot(0, 2)
    assert all(torch.equal(st.buffer(n)[2], t) for n, t in image)
    with pytest.raises(KeyError, match="recurrent"):
        st.buffer("codes")
    with pytest.raises(ValueError, match="twice"):
        StateStore([BufferSpec("a", (1,), "float32")] * 2, 1)
    with pytest.raises(ValueError, match=">= 0"):
        StateStore([], -1)


def test_state_store_restore_writes_nothing_on_mismatch():
    st = StateStore(_mixed_buffers(), 2)
    st.buffer("recurrent")[1].fill_(7.0)
    good = st.image(0)
    bad = [(n, t.float() if n == "window_k" else t) for n, t in good]       # the third buffer's dtype is wrong
    with pytest.raises(ValueError, match="window_k"):
        st.restore(1, bad)
    assert bool((st.buffer("recurrent")[1] == 7.0).all())                   # the first buffer was not written
    with pytest.raises(ValueError, match="buffers"):
        st.restore(1, good[:3])
    with pytest.raises(ValueError, match="buffers"):
        st.restore(1, good + [good[0]])
    with pytest.raises(IndexError):
        st.image(2)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_model_and_cache_do_not_import_each_other():
    for path in sorted((ROOT / "ignisd" / "cache").glob("*.py")):
        assert not {m for m in _imports(path) if m.startswith("ignisd.model")}, path.name
    for path in sorted((ROOT / "ignisd" / "model").glob("*.py")):
        assert not {m for m in _imports(path) if m.startswith("ignisd.cache")}, path.name
    # ModelSpec's module imports nothing of ignisd but the buffer vocabulary (no circle through a lazy import)
    assert {m for m in _imports(ROOT / "ignisd" / "model" / "spec.py") if m.startswith("ignisd")} == {"ignisd.buffers"}

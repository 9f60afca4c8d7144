"""The hq-e8-2b KV format's sizes, state buffers and control-plane rules (HQ_E8_2B.md §0-§1, §4.3; DESIGN §4.6):
page bytes against the formula for SmolLM2 and the published Qwen3.5-27B config, the exact window in the state
image, the default-format rule and its reason, and what a retained state holds (only encoded pages) through the
cache manager with plain ints."""
from __future__ import annotations

import pytest

from ignis_kernels.attention import encoded_pages as kernel_encoded_pages
from ignisd.buffers import BufferSpec, total_bytes
from ignisd.cache.kv_format import HQFormat, KVGeometry, get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.manager import CacheManager
from ignisd.cache.page_pool import PagePool
from ignisd.cache.retained import RetainedStore
from ignisd.cache.retained_state import Stamp
from ignisd.cache.state_slots import StateSlots
from ignisd.config import Config, ModelConfig
from ignisd.model.spec import ModelSpec
from ignisd.preflight import StartupError, choose_kv_format
from test_hybrid_spec import QWEN3_5_27B

SMOLLM2 = KVGeometry(n_attention_layers=30, num_kv_heads=3, head_dim=64)


def test_smollm2_page_bytes():
    """head_dim 64: 8 codewords (16 B) + 8 B metadata = 24 B a head-token; 30 layers × 3 heads × 2 = 180 records =
    4,320 B a token against fp32's 46,080 and bf16's 23,040."""
    hq, fp32, bf16 = (get_kv_format(n) for n in ("hq-e8-2b", "fp32", "bf16"))
    per_head_token = total_bytes(hq.page_buffers(SMOLLM2)) // (2 * SMOLLM2.num_kv_heads)
    assert per_head_token == 16 + 8 == 24
    assert hq.bytes_per_token(SMOLLM2) == 30 * 3 * 2 * 24 == 4320
    assert fp32.bytes_per_token(SMOLLM2) == 46080 and bf16.bytes_per_token(SMOLLM2) == 23040
    assert hq.page_bytes(SMOLLM2, 64) == 64 * 4320
    assert hq.page_buffers(SMOLLM2) == [BufferSpec("codes", (2, 3, 8), "int16"), BufferSpec("scale", (2, 3), "float32"),
                                        BufferSpec("resid", (2, 3), "float16"), BufferSpec("center", (3, 4), "uint8")]


def test_qwen3_5_27b_page_bytes():
    """16 full-attention layers × 4 KV heads × head_dim 256: 72-B records, 9,216 B a token, 7.11× bf16."""
    spec = ModelSpec.from_hf_config(QWEN3_5_27B, "Qwen3.5-27B")
    assert (spec.n_attention_layers, spec.num_kv_heads, spec.head_dim) == (16, 4, 256)
    hq, bf16 = get_kv_format("hq-e8-2b"), get_kv_format("bf16")
    assert total_bytes(hq.page_buffers(spec)) // 8 == 64 + 8 == 72
    assert hq.bytes_per_token(spec) == 9216 and bf16.bytes_per_token(spec) == 65536
    assert round(bf16.bytes_per_token(spec) / hq.bytes_per_token(spec), 2) == 7.11
    # 36,864 B per (layer, page) as in §1.3, 4,608 B per (kind, head) sub-block
    assert hq.page_bytes(spec, 64) // 16 == 36864 and 36864 // 8 == 4608
    # the exact window at the default (current page + 2 pages = 192 tokens) is 12 MiB in bf16, 24 MiB in fp32
    win = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_dtype="bfloat16").seq_state_buffers(spec)
    assert win[0] == BufferSpec("kv_window", (16, 2, 192, 4, 256), "bfloat16") and win[0].nbytes == 12 << 20
    assert win[1] == BufferSpec("kv_sinks", (16, 2, 1, 4, 256), "bfloat16")


def test_window_parameters():
    f = get_kv_format("hq-e8-2b", exact_window=64, exact_sinks=4)
    assert (f.exact_window_pages, f.ring_tokens, f.exact_sinks) == (1, 128, 4)
    assert get_kv_format("hq-e8-2b").exact_window_pages == 2                 # default 128 tokens
    assert get_kv_format("hq-e8-2b", exact_window=65).exact_window_pages == 2   # page-granular: rounded up
    assert [b.name for b in get_kv_format("hq-e8-2b", exact_sinks=0).seq_state_buffers(SMOLLM2)] == ["kv_window",
                                                                                                     "kv_center"]
    assert [b.name for b in get_kv_format("hq-e8-2b", exact_sinks=0, centering="").seq_state_buffers(SMOLLM2)] == [
        "kv_window"]
    assert f.stamp != get_kv_format("hq-e8-2b").stamp
    with pytest.raises(ValueError, match=">= 0"):
        get_kv_format("hq-e8-2b", exact_window=-1)
    with pytest.raises(ValueError, match="power-of-two"):
        f.page_buffers(KVGeometry(1, 1, 48))
    for wp in (0, 1, 2):                                           # the cache's rule is the kernels' rule
        g = HQFormat("hq-e8-2b", "hq-e8-2b", "float32", exact_window=64 * wp)
        for ctx in range(0, 400, 7):
            assert g.encoded_pages(ctx) == kernel_encoded_pages(ctx, wp, 64)
            assert g.retained_pages(ctx, 64) == (g.encoded_pages(ctx), False)


def test_variance_correction_is_a_read_parameter_from_0_to_1():
    """The correction's strength α reaches every layer's view and changes no stored byte: the page buffers and the
    stamp (what retained state and KV-disk files are matched by) stay those of the default."""
    base = get_kv_format("hq-e8-2b")
    assert base.variance_correction == 0.6
    for vc in (0, 0.25, 1):
        f = get_kv_format("hq-e8-2b", variance_correction=vc)
        assert f.variance_correction == float(vc)
        assert f.stamp == base.stamp and f.page_buffers(SMOLLM2) == base.page_buffers(SMOLLM2)
        kv = KVStore(f, KVGeometry(2, 1, 64), 2)
        assert [kv.view(i).params["variance_correction"] for i in range(2)] == [float(vc)] * 2
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValueError, match="variance_correction .* must be a number from 0 to 1"):
            get_kv_format("hq-e8-2b", variance_correction=bad)
    assert get_kv_format("fp32", variance_correction=0.3) == get_kv_format("fp32")   # dense formats ignore it


@pytest.mark.parametrize("kv_format, head_dim, want, why", [
    (None, 64, "fp32", "default: head_dim 64 < 128, fp32 on cpu"),
    (None, 128, "hq-e8-2b", "default: head_dim 128 >= 128"),
    (None, 256, "hq-e8-2b", "default: head_dim 256 >= 128"),
    ("hq-e8-2b", 64, "hq-e8-2b", "model.kv_format"),
    ("bf16", 256, "bf16", "model.kv_format"),
])
def test_default_format_rule(kv_format, head_dim, want, why):
    assert choose_kv_format(Config(model=ModelConfig(kv_format=kv_format)), head_dim) == (want, why)
    if kv_format is None and head_dim < 128:
        assert choose_kv_format(Config(), head_dim, device="cuda")[0] == "bf16"


def test_hq_needs_a_power_of_two_head_dim():
    with pytest.raises(StartupError) as e:
        choose_kv_format(Config(model=ModelConfig(kv_format="hq-e8-2b")), 80)
    assert e.value.exit_code == 2 and "power-of-two" in str(e.value)


def _cache(fmt):
    store = RetainedStore(Stamp("h", fmt.stamp), page_tokens=64, device_slots=StateSlots(0),
                          host_slots=StateSlots(4), needs_slot=True, kv_format=fmt)
    return CacheManager(PagePool(64, 64), 1, slots=StateSlots(2), retained=store, kv_format=fmt)


@pytest.mark.parametrize("pos", [64, 200, 256, 320, 449])
def test_a_retained_state_holds_only_encoded_pages(pos):
    """Capture at `pos`, resume from it: the state holds encoded_pages(pos) pages and no partial-page copy; the
    resumer shares exactly those and owns every later page (so the window pages it encodes are its own)."""
    fmt = get_kv_format("hq-e8-2b")
    cm = _cache(fmt)
    prompt = list(range(1000, 1000 + pos + 40))
    a = cm.admit("a", prompt, len(prompt) + 8, reuse=True)
    cap = cm.plan_capture("a", "prefix", prompt[:pos], priority="interactive", after_user=False)
    assert cap.copy_page is None and cap.src_page is None and cap.slot is not None
    from ignisd.plan import PlanItem, RoundPlan
    item = PlanItem("a", 0, tuple(prompt[:pos]), a.pages, a.slot, "prefill", "none", False, None, captures=(cap,))
    (commit,) = cm.finish_round(RoundPlan((item,), (), ()))
    n_enc = fmt.encoded_pages(pos)
    assert list(commit.state.pages) == list(a.pages[:n_enc])
    b = cm.admit("b", prompt[:pos] + [5, 6, 7], pos + 3 + 8, reuse=True)
    assert b.resumed == pos and b.pages[:n_enc] == a.pages[:n_enc]
    assert not set(b.pages[n_enc:]) & set(a.pages)
    assert b.restore.src_page is None and b.restore.dst_page is None and b.restore.slot == cap.slot
    cm.check_integrity()
    cm.release("a")
    cm.release("b")
    cm.check_integrity()

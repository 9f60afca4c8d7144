"""The passkey bench's fork (tools/kvformat_passkey.py) against the independent route it shortcuts: a fresh
teacher-forced prefill of the whole prompt (prefix + needle + filler + question + answer) in its own store, in fp32
and hq-e8-2b on the real SmolLM2. The forked trial's logits at the answer positions must match the fresh ones to
float rounding, for two keys in a row on one fork (the second trial reads pages the first one wrote past the fork
point, which must not matter). The fresh prefill cuts its chunks where the forked trial does (prefix, the suffix's
chunks, the answer): under other cuts the keys differ in their last bits, and in hq-e8-2b such a difference can move a
key to the neighbouring E8 codeword (a change far above float rounding; chunking invariance of the stored bytes for
given keys is test_hq_centering's)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from kvformat_eval import make_store  # noqa: E402
from kvformat_passkey import Layout, _forward, fork_prefix, trial_logits  # noqa: E402

pytestmark = pytest.mark.smollm


@pytest.mark.parametrize("fmt", ["fp32", "hq-e8-2b"])
def test_forked_trial_equals_a_fresh_prefill(smollm_ours, fmt, monkeypatch):
    import kvformat_passkey
    from ignisd.text.tokenizer import Tokenizer
    monkeypatch.setattr(kvformat_passkey, "CHUNK", 100)   # a trial's suffix prefilled in chunks, the last apart
    torch.set_num_threads(1)
    tk = Tokenizer.from_gguf(smollm_ours.source)
    lay = Layout(tk, 520, 0.6)                     # prefix past the window: hq has encoded pages at the fork
    assert 3 * 64 < len(lay.prefix) <= 512          # ... and one chunk of fork_prefix's (its default, 512)
    fork = fork_prefix(smollm_ours.model, smollm_ours.spec, fmt, lay)
    for key in (31415, 27182):
        got, answer = trial_logits(smollm_ours.model, fork, lay, key)
        suffix, _ = lay.trial(key)
        ids = lay.prefix + suffix + answer
        kv, st = make_store(smollm_ours.spec, fmt, len(ids) + 8, 128, 1)
        if st is not None:
            st.zero(0)
        cut = (len(suffix) - 1) // 100 * 100                  # trial_logits' cuts at CHUNK 100
        bounds = [0, len(lay.prefix), *(len(lay.prefix) + c for c in range(100, cut + 1, 100)),
                  len(lay.prefix) + len(suffix), len(ids)]
        out = [_forward(smollm_ours.model, kv, st, ids[a:b], a, "all") for a, b in zip(bounds, bounds[1:]) if b > a]
        want = torch.cat(out)[len(ids) - len(answer) - 1:-1]
        assert len(answer) == 6 and got.shape == want.shape
        assert float((got - want).abs().max()) < 2e-3 * float(want.abs().max()), key

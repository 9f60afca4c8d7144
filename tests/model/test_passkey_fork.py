"""The passkey bench's fork (tools/kvformat_passkey.py) against the independent route it shortcuts: a fresh
teacher-forced prefill of the whole prompt (prefix + needle + filler + question + answer) in its own store, in fp32
and hq-e8-2b on the real SmolLM2. The forked trial's logits at the answer positions must match the fresh ones to
float rounding (other chunk boundaries), for two keys in a row on one fork (the second trial reads pages the first
one wrote past the fork point, which must not matter)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
from kvformat_eval import make_store, teacher_forced_logits  # noqa: E402
from kvformat_passkey import Layout, fork_prefix, trial_logits  # noqa: E402

pytestmark = pytest.mark.smollm


@pytest.mark.parametrize("fmt", ["fp32", "hq-e8-2b"])
def test_forked_trial_equals_a_fresh_prefill(smollm_ours, fmt, monkeypatch):
    import kvformat_passkey
    from ignisd.text.tokenizer import Tokenizer
    monkeypatch.setattr(kvformat_passkey, "CHUNK", 100)   # a trial's suffix prefilled in chunks, the last apart
    torch.set_num_threads(1)
    tk = Tokenizer.from_gguf(smollm_ours.source)
    lay = Layout(tk, 520, 0.6)                     # prefix past the window: hq has encoded pages at the fork
    assert len(lay.prefix) > 3 * 64
    fork = fork_prefix(smollm_ours.model, smollm_ours.spec, fmt, lay)
    for key in (31415, 27182):
        got, answer = trial_logits(smollm_ours.model, fork, lay, key)
        suffix, _ = lay.trial(key)
        ids = lay.prefix + suffix + answer
        kv, st = make_store(smollm_ours.spec, fmt, len(ids) + 8, 128, 1)
        want = teacher_forced_logits(smollm_ours.model, ids, kv, st, chunk=128)[len(ids) - len(answer) - 1:-1]
        assert len(answer) == 6 and got.shape == want.shape
        assert float((got - want).abs().max()) < 2e-3 * float(want.abs().max()), key

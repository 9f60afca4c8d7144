"""rope_stable_dims (ignisd/model/layers.py): the head dims that keep hq-e8-2b's key centre. The expected dims are
worked out by hand from each model's published RoPE numbers: a rotate-half pair i (dims i and i + rotary_dim/2)
turns at θ^(−2i/rotary_dim) rad/token and is kept when that times the context is at most π/3 (1.0472)."""
from __future__ import annotations

import pytest
import torch

from ignisd.model.layers import rope_stable_dims
from ignisd.model.spec import ModelSpec
from test_hybrid_spec import QWEN3_5_27B


def _dims(mask: torch.Tensor) -> list[int]:
    return [int(i) for i in torch.nonzero(mask).flatten()]


def test_smollm2_keeps_the_seven_slowest_pairs(smollm_reader):
    # θ 1e5, head_dim 64, context 8192: pair 25 turns 1e5^(-50/64) = 1.241e-4 rad/token, 1.017 rad over 8192
    # (kept); pair 24 1.778e-4, 1.457 rad (dropped)
    spec = ModelSpec.from_gguf_metadata(smollm_reader, "SmolLM2-135M-Instruct.Q4_1")
    m = rope_stable_dims(spec)
    assert m.dtype == torch.float32 and m.shape == (64,)
    assert _dims(m) == list(range(25, 32)) + list(range(57, 64))
    assert set(m.tolist()) == {0.0, 1.0}


def test_qwen3_5_keeps_its_unrotated_dims_and_the_slowest_pairs():
    # partial rotary: 64 of 256 dims rotated, θ 1e7, context 262144: pair 25 turns 10^(-7·25/32) = 3.40e-6
    # rad/token, 0.891 rad over the context (kept); pair 24 5.62e-6, 1.474 rad (dropped); dims 64..255 never turn
    spec = ModelSpec.from_hf_config(QWEN3_5_27B, "Qwen3.5-27B")
    assert _dims(rope_stable_dims(spec)) == list(range(25, 32)) + list(range(57, 256))


def test_span_argument(smollm_reader):
    spec = ModelSpec.from_gguf_metadata(smollm_reader, "SmolLM2-135M-Instruct.Q4_1")
    # span 1: every pair turning at most π/3 rad per token: θ^(−2i/64) <= 1.0472 for every i >= 0 (pair 0: 1 rad)
    assert _dims(rope_stable_dims(spec, span=1)) == list(range(64))
    with pytest.raises(ValueError, match="span must be >= 1"):
        rope_stable_dims(spec, span=0)

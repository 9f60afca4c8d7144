"""The Triton hq-e8-2b encoder (kernels/kvq/triton_codec.py) against the torch reference, on the CPU under
TRITON_INTERPRET=1 (set before Triton is imported; the interpreter runs a program as numpy, so the sizes stay at
about 2,000 chunks): identical codes except at float32 distance ties (each mismatch is proved a tie: its chunk
distance equals the reference's to 1e-5 relative), the same metadata fields, and the dispatcher's routing.
Skipped where Triton is not installed (it is an optional dependency: pip install -e '.[triton]')."""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

pytest.importorskip("triton")

import ignis_kernels.kvq as kvq  # noqa: E402
from ignis_kernels.kvq import reference as R  # noqa: E402
from ignis_kernels.kvq import triton_codec as T  # noqa: E402

torch.set_num_threads(1)


def _check(u: torch.Tensor) -> int:
    """Compare both encoders on u [N, d]; returns the number of tie mismatches."""
    got, want = T.encode_rotated(u), R.encode_rotated(u)
    d = u.shape[-1]
    n2 = (u.double() ** 2).sum(-1)
    gain = (1.04 / torch.sqrt(n2 / d)).float()
    z = (u * gain[:, None]).view(u.shape[0], d // 8, 8)
    mism = got[0] != want[0]
    if mism.any():
        dg = R.chunk_distance(z[mism], got[0][mism])
        dw = R.chunk_distance(z[mism], want[0][mism])
        assert bool(((dg - dw).abs() <= 1e-5 * dw.abs().clamp_min(1e-3)).all()), "a mismatch that is not a tie"
    same = ~mism.any(-1)
    assert torch.allclose(got[1][same], want[1][same], rtol=2e-6)
    assert torch.allclose(got[2][same].float(), want[2][same].float(), rtol=2e-3)
    assert torch.equal(got[3], want[3])
    return int(mism.sum())


def test_triton_encoder_matches_the_reference():
    g = torch.Generator().manual_seed(0)
    ties = _check(torch.randn(48, 256, generator=g))              # 1,536 chunks at the target's head_dim
    ties += _check(torch.randn(40, 64, generator=g) * 3)           # 320 chunks at SmolLM2's
    ties += _check(torch.randint(-3, 4, (8, 64), generator=g).float() / 2)   # a coarse grid: many exact ties
    assert ties <= 40


def test_triton_encoder_edge_cases():
    u = torch.randn(4, 64, generator=torch.Generator().manual_seed(1))
    u[1] = 0
    u[2, 5] = float("nan")
    codes, scale, resid, norm = T.encode_rotated(u)
    assert not codes[1].any() and float(scale[1]) == 0 and float(resid[1]) == 0 and float(norm[1]) == 0
    assert bool(scale[2].isnan()) and not scale[[0, 1, 3]].isnan().any()


def test_dispatcher_routes_to_triton_when_asked(monkeypatch):
    u = torch.randn(3, 64, generator=torch.Generator().manual_seed(2))
    monkeypatch.setenv("IGNIS_KVQ", "triton")
    assert kvq.backend(u.device) == "triton"
    got = kvq.encode_rotated(u)
    monkeypatch.setenv("IGNIS_KVQ", "reference")
    assert kvq.backend(u.device) == "reference"
    assert torch.equal(got[0], kvq.encode_rotated(u)[0])
    monkeypatch.delenv("IGNIS_KVQ")
    assert kvq.backend(torch.device("cpu")) == "reference"

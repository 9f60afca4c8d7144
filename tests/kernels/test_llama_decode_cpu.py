"""The fused llama decode kernel (ignis_kernels.decode.llama_cpu) against its torch reference (decode/reference.py,
built from the norm, int4 and attention references and transformers' rotate-half RoPE) on random operands: several
geometries, 1 to 8 rows, shuffled page tables, two layers; the residual stream and the pages written."""
from __future__ import annotations

import pytest
import torch

from ignis_kernels.decode import llama_cpu, reference
from ignisd.model.linear import pack_int4

torch.set_num_threads(1)
PT = 16


def _int4(n: int, k: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random 4-bit weight [n, k] as (codes, kernel scales)."""
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 2e-3).half().float()
    m = (torch.randn(n, k // 32, generator=g) * 0.05).half().float()
    packed, _, dm = pack_int4(q, d, m)
    return packed, dm


def _layer(h: int, hq: int, hkv: int, d: int, inter: int, slots: int, g: torch.Generator) -> dict:
    ops = {"w_in": 1 + 0.1 * torch.randn(h, generator=g), "w_post": 1 + 0.1 * torch.randn(h, generator=g)}
    for name, (n, k) in {"qkv": ((hq + 2 * hkv) * d, h), "o": (h, hq * d), "gate_up": (2 * inter, h),
                         "down": (h, inter)}.items():
        ops[name], ops[name + "_dm"] = _int4(n, k, g)
    ops["k_pages"] = torch.randn(slots, hkv, d, generator=g)
    ops["v_pages"] = torch.randn(slots, hkv, d, generator=g)
    return ops


def _tables(layers: list[dict]) -> tuple:
    """(llama_cpu.layer_table of the weights, llama_cpu.dense_table of the pages) of `layers`."""
    weights = [{k: v for k, v in lay.items() if not k.endswith("_pages")} for lay in layers]
    return llama_cpu.layer_table(weights), llama_cpu.dense_table([(lay["k_pages"], lay["v_pages"]) for lay in layers])


@pytest.mark.parametrize("h, hq, hkv, d, inter", [(64, 4, 2, 16, 96), (128, 9, 3, 32, 160), (64, 4, 1, 64, 64)])
@pytest.mark.parametrize("rows", [1, 2, 5, 8])
def test_kernel_matches_the_reference(h, hq, hkv, d, inter, rows):
    assert llama_cpu.available(), llama_cpu.error()
    g = torch.Generator().manual_seed(rows * 100 + d)
    n_pages = 3 * rows
    layers = [_layer(h, hq, hkv, d, inter, n_pages * PT, g) for _ in range(2)]
    pages = torch.randperm(n_pages, generator=g).view(rows, 3)            # three pages each, interleaved in the pool
    ctx = torch.randint(1, 3 * PT + 1, (rows,), generator=g)
    pos = ctx - 1
    slots = pages.gather(1, (pos // PT)[:, None])[:, 0] * PT + pos % PT
    inv = 1.0 / 1e4 ** (torch.arange(0, d, 2).float() / d)
    f = pos.float()[:, None] * inv[None]
    cos, sin = torch.cat((f, f), -1).cos(), torch.cat((f, f), -1).sin()
    sin_rot = torch.cat((-sin[:, :d // 2], sin[:, d // 2:]), -1)          # layers.Rotary's signed form
    x = torch.randn(rows, h, generator=g)
    ref_layers = [{k: v.clone() for k, v in lay.items()} for lay in layers]
    want = reference.llama_decode(ref_layers, x.clone(), (hq, hkv, d, inter, 1e-5), cos, sin, slots, ctx, pages, PT)
    got = x.clone()
    llama_cpu.decode(*_tables(layers), got, (hq, hkv, d, inter, 1e-5), cos, sin_rot.contiguous(), slots, ctx, pages, PT)
    assert (got - want).norm() <= 1e-5 * want.norm()
    for a, b in zip(layers, ref_layers):                                   # the new keys (RoPE'd) and values
        for name in ("k_pages", "v_pages"):
            new_a, new_b = a[name][slots], b[name][slots]
            assert (new_a - new_b).norm() <= 1e-5 * new_b.norm()
            a[name][slots] = b[name][slots] = 0                             # nothing else written
            assert torch.equal(a[name], b[name])


def test_a_geometry_outside_the_kernel_is_refused():
    g = torch.Generator().manual_seed(0)
    layers = [_layer(64, 4, 2, 16, 96, 3 * PT, g)]
    x = torch.randn(1, 64, generator=g)
    one = torch.tensor([1])
    with pytest.raises(RuntimeError, match="refused its operands"):           # 4 query heads on 3 KV heads
        llama_cpu.decode(*_tables(layers), x, (4, 3, 16, 96, 1e-5), torch.ones(1, 16), torch.zeros(1, 16), one, one,
                         torch.tensor([[0, 1, 2]]), PT)

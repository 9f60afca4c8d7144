"""The Q8_0 table kernels (ignis_kernels.linear.q8_cpu): the few-row product and the dequantized tiles against a float64
product of GroupQuant.dequantize (an independent route), a row's result independent of its batch, the dispatcher's
many-row GEMM, what it does not take, and the switch-off. The LM head over the real table: test_weight_formats.py."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ignis_kernels.linear as klinear
from ignis_kernels.linear import q8_cpu
from ignisd.model.quant import GroupQuant

torch.set_num_threads(1)


def _q8(n: int, k: int, seed: int) -> GroupQuant:
    g = torch.Generator().manual_seed(seed)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 1e-4).half().float()
    return GroupQuant("Q8_0", torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g), d, torch.zeros_like(d))


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_the_kernels_serve_here():
    assert q8_cpu.available(), q8_cpu.error()


@pytest.mark.parametrize("n, k", [(1, 32), (37, 64), (1000, 576)])
def test_few_row_product_is_the_tables_weights_in_fp32(n, k):
    w = _q8(n, k, n + k)
    g = torch.Generator().manual_seed(1)
    for t in range(1, klinear.MAX_KERNEL_ROWS + 1):
        x = torch.randn(t, k, generator=g)
        y = klinear.q8_mm(x, w.q, w.d)
        assert y.shape == (t, n) and y.dtype == torch.float32
        assert _rel(y, x.double() @ w.dequantize().double().t()) < 2e-6


def test_a_rows_logits_do_not_depend_on_its_batch():
    w = _q8(300, 576, 2)
    x = torch.randn(klinear.MAX_KERNEL_ROWS, 576, generator=torch.Generator().manual_seed(3))
    alone = [q8_cpu.q8_mm(x[i:i + 1].contiguous(), w.q, w.d) for i in range(x.shape[0])]
    for t in range(2, x.shape[0] + 1):
        batch = q8_cpu.q8_mm(x[:t].contiguous(), w.q, w.d)
        assert all(torch.equal(batch[i:i + 1], alone[i]) for i in range(t)), t


def test_dequantized_rows_equal_groupquant_bit_for_bit():
    w = _q8(100, 96, 4)
    buf = torch.full((60 * 96 + 5,), float("nan"))
    rows = q8_cpu.dequant(w.q, w.d, 30, 90, buf)
    assert torch.equal(rows, w.dequantize()[30:90]) and buf[60 * 96:].isnan().all()
    with pytest.raises(ValueError, match=r"rows \[90, 101\) of 100"):
        q8_cpu.dequant(w.q, w.d, 90, 101, buf)
    with pytest.raises(ValueError, match="at least 5760 values"):
        q8_cpu.dequant(w.q, w.d, 0, 60, buf[:100])


@pytest.mark.parametrize("tile", [None, 64 * 50])
def test_many_rows_run_as_a_gemm_over_dequantized_tiles(tile, monkeypatch):
    if tile:
        monkeypatch.setattr(klinear, "TILE_VALUES", tile)                     # tiles of 50 rows, the last of 23
    w = _q8(123, 64, 5)
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(6))
    y = klinear.q8_mm(x, w.q, w.d)
    assert y.shape == (20, 123) and _rel(y, x.double() @ w.dequantize().double().t()) < 2e-6


def test_what_the_kernels_do_not_take():
    w = _q8(10, 64, 7)
    assert not klinear.q8_serves(w.q.t(), w.d)                                  # not row-major
    assert not klinear.q8_serves(w.q, w.d.double())
    assert klinear.q8_mm(torch.randn(2, 64).to(torch.int32), w.q, w.d) is None  # not a float x
    with pytest.raises(ValueError, match="against a table of 64 columns"):
        q8_cpu.q8_mm(torch.randn(2, 32), w.q, w.d)


def test_the_switch_turns_it_off():
    code = ("import torch; from ignis_kernels.linear import q8_cpu; from ignisd.model.lm_head import QuantTable; "
            "from ignisd.model.quant import GroupQuant; "
            "t = QuantTable(GroupQuant('Q8_0', torch.ones(8, 32, dtype=torch.int8), torch.ones(8, 1), "
            "torch.zeros(8, 1))); "
            "print(q8_cpu.available(), q8_cpu.error(), type(t.head).__name__)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "IGNIS_Q8_CPU_KERNEL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False disabled by IGNIS_Q8_CPU_KERNEL=0 Int8RowLinear", \
        r.stdout + r.stderr

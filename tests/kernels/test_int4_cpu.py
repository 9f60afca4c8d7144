"""The int4 matmul kernels (ignis_kernels.linear): torch's packer read back by the reference, the C product and the
dequantized-tile GEMM against a float64 product of GroupQuant.dequantize (the file's weights, an independent route),
a row's result independent of its batch, the Int4Linear / Int8x2Linear routing, the fall-backs and the switch-off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ignis_kernels.linear as klinear
from ignis_kernels.linear import int4_cpu, reference
from ignisd.model.linear import Int4Linear, Int8x2Linear, int4_mm, pack_int4
from ignisd.model.quant import GroupQuant

torch.set_num_threads(1)


def _q4(kind: str, n: int, k: int, seed: int) -> GroupQuant:
    """A random Q4_0 / Q4_1 weight whose d and m are fp16 values, as a GGUF block holds them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), dtype=torch.uint8, generator=g)
    d = (torch.rand(n, k // 32, generator=g) * 0.02 + 1e-3).half().float()
    m = -8.0 * d if kind == "Q4_0" else (torch.randn(n, k // 32, generator=g) * 0.05).half().float()
    return GroupQuant(kind, q, d, m)


def _ref(x: torch.Tensor, w: GroupQuant) -> torch.Tensor:
    return (x.double() @ w.dequantize().double().t()).float()


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.mark.parametrize("n, k", [(32, 32), (96, 64), (960, 576), (576, 1536)])
def test_torch_packer_is_read_back_by_the_reference(n, k):
    codes = torch.randint(0, 16, (n, k), dtype=torch.int32, generator=torch.Generator().manual_seed(n + k))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert torch.equal(reference.unpack_codes(packed, n, k).int(), codes)


def test_the_kernel_serves_here():
    assert int4_cpu.available(), int4_cpu.error()


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1"])
@pytest.mark.parametrize("n, k", [(32, 32), (192, 576), (960, 576), (576, 1536)])
def test_few_row_product_is_the_files_weights_in_fp32(kind, n, k):
    w = _q4(kind, n, k, n * k)
    packed, _, dm = pack_int4(w.q, w.d, w.m)
    g = torch.Generator().manual_seed(1)
    for t in range(1, klinear.MAX_KERNEL_ROWS + 1):
        x = torch.randn(t, k, generator=g) * 3
        y = int4_cpu.int4_mm(x, packed, dm)
        assert y is not None and y.dtype == torch.float32 and y.shape == (t, n)
        assert _rel(y, _ref(x, w)) < 2e-6
        # torch's int4 kernel, for scale: its bf16 activations, scales and output are ~1e-3 off
        assert _rel(int4_mm(x, packed, pack_int4(w.q, w.d, w.m)[1]).float(), _ref(x, w)) > 1e-4


def test_a_rows_result_does_not_depend_on_its_batch():
    w = _q4("Q4_1", 960, 576, 3)
    packed, _, dm = pack_int4(w.q, w.d, w.m)
    x = torch.randn(klinear.MAX_KERNEL_ROWS, 576, generator=torch.Generator().manual_seed(4))
    alone = [int4_cpu.int4_mm(x[i:i + 1].contiguous(), packed, dm) for i in range(x.shape[0])]
    for t in range(2, x.shape[0] + 1):
        batch = int4_cpu.int4_mm(x[:t].contiguous(), packed, dm)
        for i in range(t):
            assert torch.equal(batch[i:i + 1], alone[i]), (t, i)


@pytest.mark.parametrize("n0, n1", [(0, 960), (32, 64), (512, 960)])
def test_dequantized_tile_equals_groupquant_bit_for_bit(n0, n1):
    w = _q4("Q4_1", 960, 576, 5)
    packed, _, dm = pack_int4(w.q, w.d, w.m)
    buf = torch.full((576 * (n1 - n0) + 7,), float("nan"))
    w_t = int4_cpu.dequant_t(packed, dm, n0, n1, buf)
    assert w_t.shape == (576, n1 - n0) and torch.equal(w_t, w.dequantize()[n0:n1].t())
    assert buf[576 * (n1 - n0):].isnan().all()                                  # nothing written past the tile
    with pytest.raises(ValueError, match=r"rows \[16, 64\)"):
        int4_cpu.dequant_t(packed, dm, 16, 64, buf)


@pytest.mark.parametrize("whole", [True, False])
def test_many_rows_run_as_a_gemm_over_dequantized_tiles(whole, monkeypatch):
    if not whole:
        monkeypatch.setattr(klinear, "TILE_VALUES", 576 * 64)                 # tiles of 64 output rows
    w = _q4("Q4_0", 960, 576, 6)
    packed, _, dm = pack_int4(w.q, w.d, w.m)
    x = torch.randn(37, 576, generator=torch.Generator().manual_seed(7))
    y = klinear.int4_mm(x, packed, dm)
    assert y.dtype == torch.float32 and y.shape == (37, 960)
    assert _rel(y, _ref(x, w)) < 2e-6
    if whole:                    # one tile: the fp32 format's arithmetic, the same GEMM over the same fp32 weights
        assert torch.equal(y, torch.mm(x, w.dequantize().t().contiguous()))


def test_linear_layers_take_the_kernels_for_every_row_count():
    w = _q4("Q4_1", 192, 576, 8)
    lin = Int4Linear(w, b=torch.randn(192))
    g = torch.Generator().manual_seed(9)
    for t in (1, 5, 8, 9, 300):
        x = torch.randn(t, 576, generator=g)
        y = lin(x)
        assert y.dtype == torch.float32 and _rel(y, _ref(x, w) + lin.b) < 2e-6, t
    c = torch.randint(-128, 128, (64, 576), dtype=torch.int8, generator=g)
    d = (torch.rand(64, 18, generator=g) * 0.01).half().float()
    q8 = GroupQuant("Q8_0", c, d, torch.zeros_like(d))
    for t in (1, 12):
        x = torch.randn(t, 576, generator=g)
        assert _rel(Int8x2Linear(q8)(x), _ref(x, q8)) < 2e-6, t


def test_what_the_kernels_do_not_take_falls_back_to_torch():
    w = _q4("Q4_1", 48, 64, 10)                                                 # 48 rows: not blocks of 32
    packed, sz, dm = pack_int4(w.q, w.d, w.m)
    assert dm is None                                                           # nothing held for the kernel
    x = torch.randn(3, 64)
    assert _rel(Int4Linear(w)(x).float(), _ref(x, w)) < 1e-2                    # torch's bf16 kernel
    w = _q4("Q4_1", 64, 64, 11)
    packed, sz, dm = pack_int4(w.q, w.d, w.m)
    assert klinear.int4_mm(x.double(), packed, dm) is None                      # not fp32
    assert klinear.int4_mm(x[:, :32].contiguous(), packed, dm) is None         # K does not match the weight
    assert pack_int4(w.q, w.d, w.m, torch.float32)[2] is None                   # the exact slow path: torch's
    assert int4_mm(x.bfloat16(), packed, sz, dm).dtype == torch.bfloat16


def test_the_switch_turns_it_off():
    code = ("import torch; from ignis_kernels.linear import int4_cpu; from ignisd.model.linear import pack_int4; "
            "print(int4_cpu.available(), int4_cpu.error(), "
            "pack_int4(torch.zeros(32, 32, dtype=torch.uint8), torch.ones(32, 1), torch.zeros(32, 1))[2])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "IGNIS_INT4_CPU_KERNEL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False disabled by IGNIS_INT4_CPU_KERNEL=0 None", \
        r.stdout + r.stderr


def test_a_failed_check_keeps_a_built_kernel_off(tmp_path, monkeypatch, caplog):
    """cbuild.Kernel's check (the int4 layout probe's hook): a reason turns the kernel off and is logged."""
    from pathlib import Path

    from ignis_kernels.cbuild import Kernel
    monkeypatch.setenv("IGNIS_KERNEL_CACHE", str(tmp_path))
    src = Path(int4_cpu.__file__).with_name("int4_cpu.c")
    seen = []
    off = Kernel(src, "the probe kernel", {}, "IGNIS_TEST_NO_SUCH_SWITCH",
                 check=lambda lib: seen.append(lib) or "the layout moved")
    with caplog.at_level("WARNING", logger="ignis.kernels"):
        assert not off.available() and not off.available()
    assert off.error() == "the probe kernel is off: the layout moved" and len(seen) == 1        # checked once
    assert "the layout moved; the torch path serves instead" in caplog.text
    on = Kernel(src, "the probe kernel", {}, "IGNIS_TEST_NO_SUCH_SWITCH", check=lambda lib: "")
    assert on.available() and on.error() is None

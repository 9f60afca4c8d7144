"""The one-call RMSNorm (ignis_kernels.norm): the C kernel against transformers' own RMSNorm modules (LlamaRMSNorm;
Qwen3NextRMSNorm for the zero-centred form the hybrids use, through ignisd.model.layers.RMSNorm), the fall-back for
what it does not take, and the switch-off."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaRMSNorm
from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextRMSNorm

from ignis_kernels.norm import reference, rms_cpu, rms_norm
from ignisd.model.layers import RMSNorm

torch.set_num_threads(1)


def test_the_kernel_serves_here():
    assert rms_cpu.available(), rms_cpu.error()


@pytest.mark.parametrize("h", [1, 7, 8, 64, 576, 2049])
@pytest.mark.parametrize("rows", [1, 3, 40])
def test_equals_transformers_llama_rmsnorm(h, rows):
    g = torch.Generator().manual_seed(h * rows)
    x = torch.randn(rows, h, generator=g) * 10.0 ** torch.randint(-3, 4, (rows, 1), generator=g)   # 1e-3 .. 1e3
    oracle = LlamaRMSNorm(h, eps=1e-5)
    with torch.no_grad():
        oracle.weight.copy_(torch.randn(h, generator=g))
        want = oracle(x)
    got = rms_cpu.rms_norm(x, oracle.weight.detach(), 1e-5)
    assert got is not None and got.shape == x.shape
    torch.testing.assert_close(got, want, rtol=2e-6, atol=1e-7)
    torch.testing.assert_close(RMSNorm(oracle.weight.detach(), 1e-5)(x.view(rows, 1, h)), want.view(rows, 1, h),
                               rtol=2e-6, atol=1e-7)


def test_the_zero_centred_form_equals_transformers_qwen3_next():
    g = torch.Generator().manual_seed(5)
    oracle = Qwen3NextRMSNorm(256, eps=1e-6)
    with torch.no_grad():
        oracle.weight.copy_(torch.randn(256, generator=g) * 0.1)           # stored centred on 0; multiplier 1 + w
        x = torch.randn(4, 256, generator=g)
        want = oracle(x)
    torch.testing.assert_close(RMSNorm(oracle.weight.detach(), 1e-6, zero_centred=True)(x), want, rtol=2e-6,
                               atol=1e-7)


def test_what_the_kernel_does_not_take_runs_in_torch():
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(8, 64, generator=g), torch.randn(64, generator=g)
    strided = x[:, ::2]
    assert rms_cpu.rms_norm(strided, w[:32], 1e-5) is None                      # not contiguous
    torch.testing.assert_close(rms_norm(strided, w[:32], 1e-5), reference.rms_norm(strided, w[:32], 1e-5))
    xd = x.double()
    assert rms_cpu.rms_norm(xd, w.double(), 1e-5) is None and rms_norm(xd, w.double(), 1e-5).dtype == torch.float64
    assert rms_cpu.rms_norm(x, w[:32], 1e-5) is None                            # weight of another width


def test_the_switch_turns_it_off():
    code = "from ignis_kernels.norm import rms_cpu; print(rms_cpu.available(), rms_cpu.error())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "IGNIS_RMS_CPU_KERNEL": "0"})
    assert r.returncode == 0 and r.stdout.strip() == "False disabled by IGNIS_RMS_CPU_KERNEL=0", r.stdout + r.stderr

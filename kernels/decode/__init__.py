"""Fused decode steps (DESIGN §3 kernels/): llama_cpu.py runs a llama model's layers for a step of decode rows in one
C call (llama_cpu.c) over the same C products, norms and attention the per-operator path calls, without its per-layer
torch and ctypes glue; reference.py is its torch definition, from the other kernels' references."""
from __future__ import annotations

from ignis_kernels.decode import llama_cpu, reference

__all__ = ["llama_cpu", "reference"]

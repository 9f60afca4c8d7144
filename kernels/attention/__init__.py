"""Paged attention dispatcher (DESIGN §3 kernels/): checks arguments, then runs the implementation for the KV
format (the view's tag) and device. "dense" (fp32, bf16 pages): decode on the CPU by the C kernel of dense_cpu.py
(built on first use; where it cannot be built, or with IGNIS_DENSE_CPU_KERNEL=0, and for prefill and on CUDA, the
pure-torch reference through torch SDPA). "hq-e8-2b" (HQ_E8_2B.md §4): on the CPU, prefill by the torch reference
hq_reference.py and decode by the fused C kernel of hq_cpu.py (backend "cpu", built on first use; where it cannot be
built, or with IGNIS_HQ_ATTENTION=reference, by the torch form hq_decode.py); the Triton kernels of hq_triton.py on
CUDA (or anywhere with IGNIS_HQ_ATTENTION=triton, e.g. under TRITON_INTERPRET=1 in the tests);
"hq-sim": the same reference over decoded vectors of another quantizer (the research baselines of
tools/bench_kvformat.py).

The protocol between a KV store and the attention layers is defined here, on the model/kernel side, so that the
storage (ignisd.cache.kv_store) and the layers (ignisd.model) never import each other:
- `PagedView`: one attention layer's pages, tagged with the format's dispatch tag ("dense": buffers "k" and "v",
  each [P, page_tokens, Hkv, d] in the storage dtype, fp32 or bf16; "hq-e8-2b": see hq_reference.py);
- `ExactSpan` / `ExactRing` (exact.py): the exact window and sinks a compressed format's attention reads;
- `PagedKV`: what an attention layer may call on a KV store (write its new keys/values, get its layer's view).
A page table lists one sequence's pages in position order (position p: page_table[p // page_tokens], offset
p % page_tokens).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

import torch

from ignis_kernels.attention import dense_cpu, hq_cpu, hq_decode, hq_reference, reference
from ignis_kernels.attention.exact import ExactRing, ExactSpan, encoded_pages, window_start

__all__ = ["PagedView", "PagedKV", "VIEW_TAGS", "COMPRESSED_TAGS", "ExactSpan", "ExactRing", "encoded_pages",
           "window_start", "paged_attention", "paged_decode_attention", "causal_mask", "gather_pages",
           "hq_backend", "decode_kernel"]

causal_mask = reference.causal_mask
gather_pages = reference.gather_pages

VIEW_TAGS = ("dense", "hq-e8-2b", "hq-sim")
"""The view tags this build has kernels for."""
COMPRESSED_TAGS = ("hq-e8-2b", "hq-sim")
"""Tags whose attention also reads an exact window (ExactSpan / ExactRing)."""


@dataclass(frozen=True)
class PagedView:
    """One attention layer's KV pages as the kernels read them.

    tag: the KV format's dispatch tag (one of VIEW_TAGS to be readable here). buffers: the format's page buffers
    by name, each [P, page_tokens, *per-token shape] in its storage dtype; "dense": "k" and "v", each
    [P, page_tokens, Hkv, d] (fp32 or bf16, upcast on read). page_tokens: tokens per page. params: per-layer
    constants of the format ("hq-e8-2b": "signs" float32 [2, Hkv, d] and "variance_correction", the float α of the
    logit-variance correction, 1 where absent: hq_reference.variance_correction); empty for dense.
    """

    tag: str
    buffers: dict[str, torch.Tensor]
    page_tokens: int
    params: dict[str, torch.Tensor] = field(default_factory=dict)


class PagedKV(Protocol):
    """What the attention layers of a model may call on a KV store (ignisd.cache.kv_store.KVStore is one).

    n_attention_layers: layers the store holds (the decoder checks it against its spec). exact_window_pages: None
    for a format that keeps no exact window (dense: attention layers call `write`); an int Wp for one that does
    (hq-e8-2b: the layers call the store's `write_exact` with the per-sequence state instead, which returns the
    ExactSpan / ExactRing attention reads; the fused CPU decode step calls its `prepare_decode` once a step, then
    writes the window itself).
    """

    n_attention_layers: int
    exact_window_pages: int | None

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store the keys/values of T tokens of attention layer `layer` (index among the attention layers) at
        slot_mapping (LongTensor [T], slot = page * page_tokens + offset); k, v: [T, Hkv, d], any float dtype."""
        ...

    def view(self, layer: int) -> PagedView:
        """Attention layer `layer`'s pages (a view of the storage, not a copy)."""
        ...


def hq_backend(device: torch.device) -> str:
    """Which implementation reads hq-e8-2b pages: "triton" on CUDA (when Triton imports) or when
    IGNIS_HQ_ATTENTION=triton; on the CPU "cpu" (decode by the fused C kernel, hq_cpu.py) when it builds here,
    else, or with IGNIS_HQ_ATTENTION=reference, "reference" (the torch path). IGNIS_HQ_ATTENTION=cpu forces the
    kernel: RuntimeError when it cannot be built."""
    want = os.environ.get("IGNIS_HQ_ATTENTION", "")
    if want in ("reference", "triton"):
        return want
    if want == "cpu":                                     # forced (the tests): the kernel must build
        if not hq_cpu.available():
            raise RuntimeError(f"IGNIS_HQ_ATTENTION=cpu: {hq_cpu.error()}")
        return want
    if device.type == "cuda":
        from ignis_kernels.attention import hq_triton
        return "triton" if hq_triton.AVAILABLE else "reference"
    return "cpu" if hq_cpu.available() else "reference"


def decode_kernel(tag: str, device: torch.device) -> str:
    """What reads a KV format's pages at decode, for the vram_plan line: for dense pages "cpu (C kernel)" (dense_cpu),
    "dense (torch; <why the kernel is not used>)" on the CPU or "dense" (torch SDPA) elsewhere; for hq-e8-2b
    "triton", "cpu (fused C kernel)" or "reference (torch; <why the kernel is not used>)". Builds the CPU kernel
    when it is not built yet (about a second, once per machine)."""
    if tag == "dense":
        if device.type == "cpu" and dense_cpu.available():
            return "cpu (C kernel)"
        return "dense" if device.type != "cpu" else f"dense (torch; {dense_cpu.error()})"
    if tag != "hq-e8-2b":
        return tag
    backend = hq_backend(device)
    if backend == "cpu":
        return "cpu (fused C kernel)"
    if backend == "reference" and device.type == "cpu":
        why = hq_cpu.error() or "IGNIS_HQ_ATTENTION=reference"
        return f"reference (torch; {why})"
    return backend


def _dense(name: str, q: torch.Tensor, view: PagedView) -> tuple[torch.Tensor, torch.Tensor]:
    """The k, v pages of a dense view, checked against q [*, Hq, d]. Raises ValueError on an unknown tag or
    inconsistent shapes."""
    if view.tag not in VIEW_TAGS:
        raise ValueError(f"{name}: no kernel for KV view tag {view.tag!r}; known: {', '.join(VIEW_TAGS)}")
    k_pages, v_pages = view.buffers["k"], view.buffers["v"]
    if q.dim() != 3 or k_pages.dim() != 4 or v_pages.shape != k_pages.shape or k_pages.shape[1] != view.page_tokens:
        raise ValueError(f"{name}: bad shapes q {tuple(q.shape)} k {tuple(k_pages.shape)} v {tuple(v_pages.shape)} "
                         f"(page_tokens {view.page_tokens})")
    if q.shape[1] % k_pages.shape[2] or q.shape[2] != k_pages.shape[3]:
        raise ValueError(f"{name}: q heads/dim {tuple(q.shape[1:])} vs kv heads/dim {tuple(k_pages.shape[2:])}")
    return k_pages, v_pages


def _check_hq(name: str, q: torch.Tensor, view: PagedView, exact, want) -> None:
    """An hq view against q [*, Hq, d] and its exact part. Raises ValueError."""
    signs = view.params.get("signs")
    if not isinstance(exact, want):
        raise ValueError(f"{name}: KV view {view.tag!r} needs exact= a {want.__name__}, got {type(exact).__name__}")
    if signs is None or signs.dim() != 3 or q.dim() != 3 or q.shape[1] % signs.shape[1] or q.shape[2] != signs.shape[2]:
        raise ValueError(f"{name}: q {tuple(q.shape)} against signs {None if signs is None else tuple(signs.shape)}")
    if exact.k.shape[-2:] != signs.shape[1:] or exact.v.shape != exact.k.shape:
        raise ValueError(f"{name}: exact k {tuple(exact.k.shape)} v {tuple(exact.v.shape)} vs heads/dim "
                         f"{tuple(signs.shape[1:])}")


def paged_attention(q: torch.Tensor, view: PagedView, page_table: torch.Tensor, start: int,
                    scale: float | None = None, exact: ExactSpan | None = None) -> torch.Tensor:
    """Causal attention of n new queries of one sequence over its paged context; see reference.paged_attention
    (dense) and hq_reference.hq_paged_attention (hq-e8-2b, hq-sim).

    q: [n, Hq, d] at positions start .. start+n-1; view: the layer's PagedView (the n new keys/values already
    written; hq: every page encoded at context start+n); page_table: LongTensor [>= ceil((start+n)/page_tokens)].
    scale: default 1/sqrt(d). exact: the chunk's ExactSpan (required for hq views, ignored for dense); its
    center_v (key/value centering) is added back to the output here, for every backend.
    Returns [n, Hq, d] (q's dtype for dense, float32 for hq). Raises ValueError for a view tag without a kernel or
    inconsistent shapes (heads not a multiple, head_dim mismatch, too few pages, a missing exact part).
    """
    if page_table.dim() != 1 or page_table.shape[0] * view.page_tokens < start + q.shape[0] or start < 0:
        raise ValueError(f"paged_attention: {page_table.shape[0]} pages for start {start} + {q.shape[0]} queries")
    if view.tag in COMPRESSED_TAGS:
        _check_hq("paged_attention", q, view, exact, ExactSpan)
        if exact.first + exact.k.shape[0] != start + q.shape[0] or \
                exact.first > window_start(start, exact.window_pages, view.page_tokens):
            raise ValueError(f"paged_attention: exact span [{exact.first}, {exact.first + exact.k.shape[0]}) does "
                             f"not cover the window of queries {start} .. {start + q.shape[0] - 1}")
        if view.tag == "hq-e8-2b" and hq_backend(q.device) == "triton":
            from ignis_kernels.attention import hq_triton
            out = hq_triton.hq_paged_attention(q, view, page_table, start, exact, scale)
        else:
            out = hq_reference.hq_paged_attention(q, view, page_table, start, exact, scale)
        return hq_reference.add_center(out, exact.center_v, view.params["signs"][1])
    k_pages, v_pages = _dense("paged_attention", q, view)
    return reference.paged_attention(q, k_pages, v_pages, page_table, start, scale)


def paged_decode_attention(q: torch.Tensor, view: PagedView, page_table: torch.Tensor, context_lens: torch.Tensor,
                           scale: float | None = None, exact: ExactRing | None = None,
                           single: tuple[int, int | None] | None = None) -> torch.Tensor:
    """Batched single-query attention of B sequences; see reference.paged_decode_attention (dense) and
    hq_reference.hq_paged_decode_attention (hq-e8-2b, hq-sim).

    q: [B, Hq, d]; view: the layer's PagedView; page_table: LongTensor [B, W] (padded with any valid page);
    context_lens: LongTensor [B], 1 <= context_lens <= W * page_tokens. exact: the batch's ExactRing (hq views).
    single: B == 1's (context length, first page of a consecutive page run or None) as ints, the shortcut of the
    dense path (reference.paged_decode_attention) and of hq-e8-2b's CPU path (hq_decode.py: the run read as a slice);
    the caller vouches that they match page_table and context_lens.
    Returns [B, Hq, d]. Raises ValueError for a view tag without a kernel or inconsistent shapes.
    """
    if page_table.dim() != 2 or page_table.shape[0] != q.shape[0] or context_lens.shape != (q.shape[0],):
        raise ValueError("paged_decode_attention: page_table [B, W] and context_lens [B] must match q's B")
    if view.tag in COMPRESSED_TAGS:
        _check_hq("paged_decode_attention", q, view, exact, ExactRing)
        if exact.k.shape[0] != q.shape[0] or exact.k.shape[1] != (exact.window_pages + 1) * view.page_tokens:
            raise ValueError(f"paged_decode_attention: ring {tuple(exact.k.shape)} for {q.shape[0]} rows and "
                             f"{exact.window_pages} window pages")
        backend = hq_backend(q.device) if view.tag == "hq-e8-2b" else ""
        if backend == "triton":
            from ignis_kernels.attention import hq_triton
            out = hq_triton.hq_paged_decode_attention(q, view, page_table, context_lens, exact, scale)
        elif backend == "cpu" and hq_cpu.supports(q, view, exact):
            return hq_cpu.hq_decode_attention(q, view, page_table, context_lens, exact, scale)   # μ_V added in it
        elif view.tag == "hq-e8-2b":
            out = hq_decode.hq_decode_attention(q, view, page_table, context_lens, exact, scale, single)
        else:
            out = hq_reference.hq_paged_decode_attention(q, view, page_table, context_lens, exact, scale)
        return hq_reference.add_center(out, exact.center_v, view.params["signs"][1])
    k_pages, v_pages = _dense("paged_decode_attention", q, view)
    if dense_cpu.supports(q, k_pages, v_pages):
        return dense_cpu.decode_attention(q, k_pages, v_pages, page_table, context_lens, scale)
    return reference.paged_decode_attention(q, k_pages, v_pages, page_table, context_lens, scale, single)

"""Bytes of pages and state images, moved between the tiers (DESIGN §4.5): device ↔ KV-RAM arena ↔ KV-disk payload.

Every kind of state travels through the same two layouts, so a tier move is a byte copy and nothing is re-encoded
or rounded (a restored image is bit-identical to the one captured: the fp32 recurrent state stays fp32).

Pages layout of n pages [p0 … pn-1] of a KVStore (n × page_bytes bytes), page-major so that a prefix of the bytes is
a prefix of the pages: for each page in order, for each page buffer of the format in the format's order, that
buffer's storage of the page as [layers, page_tokens × per-token elements] in the buffer's dtype, C order. Image
layout of one state slot (slot_bytes bytes): each state buffer of the slot in the store's order, C order. Both are
what `pages_nbytes` / `StateStore.slot_bytes` count.
"""
from __future__ import annotations

import torch


def pages_nbytes(kv, n: int) -> int:
    """Bytes of `n` pages of `kv` in the pages layout (n × kv.page_bytes)."""
    return n * kv.page_bytes


def _page_blocks(kv):
    """(tensor viewed as [layers, num_pages, per-page elements], byte offset within a page, bytes per page) per page
    buffer of kv's format."""
    out, off = [], 0
    for spec in kv.format.page_buffers(kv.geometry):
        t = kv.buffer(spec.name)
        blk = t.view(t.shape[0], kv.num_pages, -1)
        n = blk.shape[0] * blk.shape[2] * blk.element_size()
        out.append((blk, off, n))
        off += n
    return out


def _as(raw: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """uint8 bytes viewed as `dtype` (copied first when their offset is not a multiple of the element size)."""
    if raw.storage_offset() % dtype.itemsize or not raw.is_contiguous():
        raw = raw.clone()
    return raw.view(dtype)


def read_pages(kv, pages: list[int], out: torch.Tensor) -> None:
    """Copy pages `pages` of `kv` into `out` (uint8 [>= pages_nbytes(kv, len(pages))]) in the pages layout."""
    if not pages:
        return
    rows = out[:len(pages) * kv.page_bytes].view(len(pages), kv.page_bytes)
    for blk, off, n in _page_blocks(kv):
        for i, p in enumerate(pages):      # one copy a page: plain memcpy speed (a gather would copy twice)
            dst = rows[i, off:off + n]
            if dst.storage_offset() % blk.element_size():      # a misaligned destination: copy through bytes
                dst.copy_(blk[:, p].contiguous().view(-1).view(torch.uint8))
            else:
                dst.view(blk.dtype).view(blk.shape[0], -1).copy_(blk[:, p])


def write_pages(kv, pages: list[int], src: torch.Tensor) -> None:
    """Write pages `pages` of `kv` from `src` (uint8, pages layout, as `read_pages` produced; a prefix of a longer
    layout is fine)."""
    if not pages:
        return
    rows = src[:len(pages) * kv.page_bytes].view(len(pages), kv.page_bytes)
    for blk, off, n in _page_blocks(kv):
        for i, p in enumerate(pages):
            blk[:, p].copy_(_as(rows[i, off:off + n], blk.dtype).view(blk.shape[0], -1))


def read_image(states, slot: int, out: torch.Tensor) -> None:
    """Copy state slot `slot` of `states` (a StateStore) into `out` (uint8 [>= slot_bytes]) in the image layout."""
    pos = 0
    for spec in states.buffers:
        raw = states.buffer(spec.name)[slot].reshape(-1).view(torch.uint8)
        out[pos:pos + raw.numel()].copy_(raw)
        pos += raw.numel()


def write_image(states, slot: int, src: torch.Tensor) -> None:
    """Write state slot `slot` of `states` from `src` (uint8, image layout)."""
    pos = 0
    for spec in states.buffers:
        dst = states.buffer(spec.name)[slot]
        n = dst.numel() * dst.element_size()
        dst.copy_(_as(src[pos:pos + n], dst.dtype).view(dst.shape))
        pos += n


def image_layout(states) -> tuple[tuple[str, str, tuple[int, ...], int], ...]:
    """(name, dtype, shape, bytes) of each buffer of one slot of `states`, in the image layout's order."""
    return tuple((b.name, b.dtype, tuple(b.shape), b.nbytes) for b in states.buffers)

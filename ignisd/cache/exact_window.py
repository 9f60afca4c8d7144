"""Writes of a format with an exact window (hq-e8-2b, HQ_E8_2B.md §4.3): rotate, keep exact, encode on leaving.

For one attention layer and one forward batch (the chunks of several sequences, each with its state slot):
1. rotate the new keys and values into the format's domain, u = H·(s ⊙ x)/√d (§2.1, the layer's sign vectors),
   rounded to the window's storage dtype (what every exact read and the encoder then see);
2. gather, per prefill chunk, the exact tokens its sequence's ring holds before the chunk (the window's start
   through the chunk's start) — before step 4 overwrites them;
3. encode every page that leaves the window during the chunk (pages [encoded_pages(start), encoded_pages(end)),
   their 64 exact tokens from the ring and the chunk) into the pool, all pages of the layer in one encoder call;
4. write the chunk's tokens into the ring (slot = position % R) and its sink positions (< S) into the sinks;
5. return what attention reads: an ExactSpan per prefill chunk (window start .. chunk end, exact), and one
   ExactRing for the batch's decode rows (each ring after the write).
The window rule (ignis_kernels.attention.exact) depends only on positions, so the pages a sequence encodes and the
bytes it writes are the same whatever the chunking, and a resumed request (ring restored from its image) encodes
the pages that leave its window into its own pages.
"""
from __future__ import annotations

import torch

from ignis_kernels.attention import ExactRing, ExactSpan, window_start
from ignis_kernels.kvq.rotation import rotate


def _take_ring(win: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, ring: int) -> torch.Tensor:
    """Ring rows of `positions` ([N, m]) in state slots `slots` ([N]) of one layer's window win [slots, 2, R, Hkv, d]
    -> a copy [N, m, 2, Hkv, d]."""
    return win.permute(0, 2, 1, 3, 4)[slots[:, None], positions % ring]


def write_exact(store, layer: int, k: torch.Tensor, v: torch.Tensor, plan, states) -> tuple[list, ExactRing | None]:
    """Steps 1-5 above for attention layer `layer` of `store` (a KVStore of an exact-window format).

    k, v: [T, Hkv, d] float, the batch's new keys (post-RoPE) and values, rows in batch order. plan: the forward's
    AttentionPlan (duck-typed: prefill = [(row, n, start, page_table, slot)], decode_rows / decode_pages /
    decode_lens / decode_slots). states: the state store holding "kv_window" (and "kv_sinks") for every slot.
    Returns ([ExactSpan per prefill chunk, in plan order], ExactRing of the decode rows or None).
    Raises ValueError for a chunk without a state slot, KeyError for a state store without the window buffers.
    """
    fmt, pt = store.format, store.page_tokens
    wp, ring, n_sinks = fmt.exact_window_pages, fmt.ring_tokens, fmt.exact_sinks
    signs = store.signs[layer]
    win = states.buffer("kv_window")[:, layer]                               # [slots, 2, R, Hkv, d]
    sinks = states.buffer("kv_sinks")[:, layer] if n_sinks else None         # [slots, 2, S, Hkv, d]
    u = torch.stack((rotate(k, signs[0]), rotate(v, signs[1])), dim=1).to(win.dtype)   # [T, 2, Hkv, d]
    dev = u.device
    enc_rows: list[torch.Tensor] = []
    enc_slots: list[torch.Tensor] = []
    offs = torch.arange(pt, device=dev)
    spans = []
    for row, n, start, pages, slot in plan.prefill:
        if slot is None:
            raise ValueError("hq-e8-2b: a chunk without a state slot (the exact window lives in the slot)")
        end = start + n
        e0, e1 = fmt.encoded_pages(start), fmt.encoded_pages(end)
        lo = e0 * pt
        sl = torch.tensor([slot], device=dev)
        before = _take_ring(win, sl, torch.arange(lo, start, device=dev)[None], ring)[0]
        full = torch.cat((before, u[row:row + n]), dim=0)                    # positions lo .. end-1
        if e1 > e0:
            enc_rows.append(full[e0 * pt - lo:e1 * pt - lo])
            enc_slots.append((pages[e0:e1].to(dev)[:, None] * pt + offs).reshape(-1))
        w0 = max(start, end - ring)
        win.permute(0, 2, 1, 3, 4)[slot, torch.arange(w0, end, device=dev) % ring] = u[row + w0 - start:row + n]
        if sinks is not None and start < n_sinks:
            s1 = min(end, n_sinks)
            sinks.permute(0, 2, 1, 3, 4)[slot, start:s1] = u[row:row + s1 - start]
        first = window_start(start, wp, pt)
        part = full[first - lo:].float()
        sk = sinks[slot, :, :min(n_sinks, end)].float() if sinks is not None else u.new_zeros(2, 0, *u.shape[2:])
        spans.append(ExactSpan(part[:, 0], part[:, 1], first, sk[0], sk[1], n_sinks, wp))
    ring_out = None
    if plan.decode_rows is not None:
        if plan.decode_slots is None:
            raise ValueError("hq-e8-2b: decode rows without state slots (the exact window lives in the slot)")
        rows, slots, pos = plan.decode_rows, plan.decode_slots, plan.decode_lens - 1
        leaving = pos // pt - wp - 1                                          # page leaving at a page start
        sel = ((pos % pt == 0) & (leaving >= 0)).nonzero()[:, 0]
        if sel.numel():
            q = leaving[sel]
            enc_rows.append(_take_ring(win, slots[sel], q[:, None] * pt + offs, ring).reshape(-1, *u.shape[1:]))
            page = plan.decode_pages[sel, q]
            enc_slots.append((page[:, None] * pt + offs).reshape(-1))
        win.permute(0, 2, 1, 3, 4)[slots, pos % ring] = u.index_select(0, rows)
        if sinks is not None:
            m = (pos < n_sinks).nonzero()[:, 0]
            if m.numel():
                sinks.permute(0, 2, 1, 3, 4)[slots[m], pos[m]] = u.index_select(0, rows[m])
        sk = sinks[slots].float() if sinks is not None else u.new_zeros(slots.shape[0], 2, 0, *u.shape[2:])
        w = win[slots].float()                                                # [B, 2, R, Hkv, d]
        ring_out = ExactRing(w[:, 0], w[:, 1], sk[:, 0], sk[:, 1], wp)
    if enc_rows:
        store.encode_into(layer, torch.cat(enc_slots), torch.cat(enc_rows))
    return spans, ring_out

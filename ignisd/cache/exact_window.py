"""The exact recent window and sinks of a compressed KV format on the write side (HQ_E8_2B.md §4.3): `write_exact`,
which KVStore.write_exact runs for an attention layer of a format with an exact window.

write_exact (a format with an exact window, HQ_E8_2B.md §4.3), for one attention layer and one forward batch (the
chunks of several sequences, each with its state slot):
1. rotate the new keys and values into the format's domain, u = H·(s ⊙ x)/√d (§2.1, the layer's sign vectors),
   rounded to the window's storage dtype (what every exact read and the encoder then see);
2. gather, per prefill chunk, the exact tokens its sequence's ring holds before the chunk (the window's start
   through the chunk's start) — before step 4 overwrites them;
3. encode every page that leaves the window during the chunk (pages [encoded_pages(start), encoded_pages(end)),
   their 64 exact tokens from the ring and the chunk) into the pool, all pages of the layer in one encoder call,
   each page's keys relative to its key centre (ignis_kernels.kvq.page_center);
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
from ignis_kernels.kvq import window_cpu
from ignis_kernels.kvq.rotation import rotate, unrotate


def _leaves_window(p: int, pt: int, wp: int) -> bool:
    """Whether writing position p makes a page leave the window (page p // pt − Wp − 1 >= 0, at its first token)."""
    return p % pt == 0 and p // pt - wp - 1 >= 0


def _take_ring(win: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor, ring: int) -> torch.Tensor:
    """Ring rows of `positions` ([N, m]) in state slots `slots` ([N]) of one layer's window win [slots, 2, R, Hkv, d]
    -> a copy [N, m, 2, Hkv, d]."""
    return win.permute(0, 2, 1, 3, 4)[slots[:, None], positions % ring]


def _center_mean(x: torch.Tensor, n_sinks: int, pt: int, values: bool, dims: torch.Tensor | None,
                 signs: torch.Tensor) -> torch.Tensor:
    """μ of page 0 (HQFormat.centering): x [pt, 2, Hkv, d] its exact rotated keys/values (window dtype); the float32
    mean over positions [S, pt) (all pt when S >= pt) -> [2, Hkv, d], μ_V zero unless `values`; μ_K kept only on the
    original-domain dims where `dims` ([d] 0/1, KVStore.center_dims; None: all) is 1: rotate(unrotate(μ_K)·dims),
    with the layer's signs [2, Hkv, d]."""
    lo = n_sinks if n_sinks < pt else 0
    mu = x[lo:pt].float().mean(0)
    if not values:
        mu[1] = 0
    if dims is not None:
        mu[0] = rotate(unrotate(mu[0], signs[0]) * dims, signs[0])
    return mu


def _recenter(t: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """(t − μ) rounded to t's dtype; t [..., 2, m, Hkv, d], μ [..., 2, Hkv, d] float32."""
    return (t.float() - mu.unsqueeze(-3)).to(t.dtype)


def _write_decode_row(store, layer: int, k: torch.Tensor, v: torch.Tensor, plan, win: torch.Tensor,
                      sinks: torch.Tensor | None, center: torch.Tensor | None, cvals: bool) -> ExactRing | None:
    """write_exact for a batch of one decode row on a step where no page leaves the window and no centre is fixed
    (63 steps of 64), by one C call (ignis_kernels.kvq.window_cpu: steps 1 and 4, the same float32 bytes as the
    torch path) -> the row's ExactRing (step 5), or None where this does not apply (more rows, the kernel
    unavailable, a page or centre event, another dtype or device), for the torch path to run. win, sinks, center:
    the layer's state buffers as write_exact takes them."""
    if (k.device.type != "cpu" or plan.decode_rows is None or plan.decode_slots is None
            or plan.decode_lens.shape[0] != 1 or not window_cpu.available()):   # (no device syncs below on CUDA)
        return None
    fmt, pt = store.format, store.page_tokens
    wp, n_sinks = fmt.exact_window_pages, fmt.exact_sinks
    p, s0 = int(plan.decode_lens[0]) - 1, int(plan.decode_slots[0])
    c0 = (wp + 1) * pt                                                        # page 0 leaves the window at c0
    if (center is not None and p == c0) or _leaves_window(p, pt, wp):
        return None
    k, v, signs = k.float().contiguous(), v.float().contiguous(), store.signs[layer]   # (v may be bf16: exact)
    if not window_cpu.supports(k, v, signs, win):
        return None
    on = center is not None and p >= c0
    window_cpu.write_row(k, v, signs, center[s0] if on else None, win[s0, :, p % fmt.ring_tokens],
                         sinks[s0, :, p] if sinks is not None and p < n_sinks else None)
    cv = (center[s0:s0 + 1, 1] if on else torch.zeros_like(center[:1, 1])) if cvals else None
    sk = sinks[s0:s0 + 1] if sinks is not None else win.new_zeros(1, 2, 0, *win.shape[3:])
    w = win[s0:s0 + 1]                                                        # [1, 2, R, Hkv, d]
    return ExactRing(w[:, 0], w[:, 1], sk[:, 0], sk[:, 1], wp, cv)


def _decode_events(store, layer: int, plan, pl: list[int], win: torch.Tensor, sinks: torch.Tensor | None,
                   center: torch.Tensor | None, cvals: bool, enc: tuple[list, list, list]) -> None:
    """The window events of a batch's decode rows (positions pl) at attention layer `layer`, before their tokens are
    written: the centre of each row at position (Wp + 1)·pt fixed from page 0 (its ring and sinks re-centred), then
    each page that leaves the window queued for the encoder into enc = (rows, pool slots, page-0 flags), read from
    the (re-centred) ring. win, sinks, center: the layer's state buffers as write_exact takes them."""
    fmt, pt = store.format, store.page_tokens
    wp, n_sinks = fmt.exact_window_pages, fmt.exact_sinks
    signs, slots = store.signs[layer], plan.decode_slots
    if center is not None:
        for i in (i for i, p in enumerate(pl) if p == (wp + 1) * pt):     # page 0 leaves the window
            s = int(slots[i])
            center[s] = _center_mean(win[s].transpose(0, 1)[:pt], n_sinks, pt, cvals, store.center_dims, signs)
            win[s] = _recenter(win[s], center[s])
            if sinks is not None:
                sinks[s] = _recenter(sinks[s], center[s])
    sel = [i for i, p in enumerate(pl) if _leaves_window(p, pt, wp)]
    if sel:
        dev = win.device
        si = torch.tensor(sel, device=dev)
        q = (plan.decode_lens[si] - 1) // pt - wp - 1
        offs = torch.arange(pt, device=dev)
        rows = _take_ring(win, slots[si], q[:, None] * pt + offs, fmt.ring_tokens)   # [N, pt, 2, Hkv, d]
        enc[0].append(rows.reshape(-1, *rows.shape[2:]))
        enc[1].append((plan.decode_pages[si, q][:, None] * pt + offs).reshape(-1))
        enc[2].append(q == 0)


def prepare_decode(store, plan, states) -> None:
    """The window events of a batch of only decode rows (plan: its AttentionPlan, decode_slots set), for every
    attention layer of `store`, run before a step that writes the rows' tokens and attends in one C call (the fused
    decode step, ignis_kernels.decode.llama_cpu.decode_hq): the centre fixed and the pages that leave the window
    encoded (all layers in one KVStore.encode_layers call), as write_exact does at the start of its decode rows.
    Nothing happens on 63 steps of 64 of a row.
    Raises KeyError for a state store without the window buffers."""
    fmt, pt = store.format, store.page_tokens
    wp = fmt.exact_window_pages
    pl = (plan.decode_lens - 1).tolist()
    centre = getattr(fmt, "centering", "") and any(p == (wp + 1) * pt for p in pl)
    if not centre and not any(_leaves_window(p, pt, wp) for p in pl):
        return
    rows, slots, first = [], None, None
    for layer in range(store.n_attention_layers):
        win = states.buffer("kv_window")[:, layer]
        sinks = states.buffer("kv_sinks")[:, layer] if fmt.exact_sinks else None
        center = states.buffer("kv_center")[:, layer] if getattr(fmt, "centering", "") else None
        enc = ([], [], [])
        _decode_events(store, layer, plan, pl, win, sinks, center, center is not None and fmt.centers_values, enc)
        if enc[0]:                                 # the same pool slots in every layer
            rows.append(torch.cat(enc[0]))
            slots, first = torch.cat(enc[1]), torch.cat(enc[2])
    if rows:                                       # one pass of the encoder for all layers
        store.encode_layers(list(range(len(rows))), slots, torch.stack(rows), first)


def write_exact(store, layer: int, k: torch.Tensor, v: torch.Tensor, plan, states) -> tuple[list, ExactRing | None]:
    """Steps 1-5 above for attention layer `layer` of `store` (a KVStore of an exact-window format).

    k, v: [T, Hkv, d] float, the batch's new keys (post-RoPE) and values, rows in batch order. plan: the forward's
    AttentionPlan (duck-typed: prefill = [(row, n, start, page_table, slot)], decode_rows / decode_pages /
    decode_lens / decode_slots). states: the state store holding "kv_window" (and "kv_sinks", "kv_center") for
    every slot. Under centering (HQFormat.centering) a sequence is centred from the write of position (Wp + 1)·pt
    on (when page 0 leaves the window): μ is fixed from page 0's exact tokens, the ring and sinks are re-centred
    once, and every later token is stored as u − μ; a function of positions only, like the window rule.
    Returns ([ExactSpan per prefill chunk, in plan order], ExactRing of the decode rows or None).
    Raises ValueError for a chunk without a state slot, KeyError for a state store without the window buffers.
    """
    fmt, pt = store.format, store.page_tokens
    wp, ring, n_sinks = fmt.exact_window_pages, fmt.ring_tokens, fmt.exact_sinks
    signs = store.signs[layer]
    win = states.buffer("kv_window")[:, layer]                               # [slots, 2, R, Hkv, d]
    sinks = states.buffer("kv_sinks")[:, layer] if n_sinks else None         # [slots, 2, S, Hkv, d]
    center = states.buffer("kv_center")[:, layer] if getattr(fmt, "centering", "") else None  # [slots, 2, Hkv, d]
    cvals = center is not None and fmt.centers_values                         # μ_V added back by attention
    if not plan.prefill:
        ring_out = _write_decode_row(store, layer, k, v, plan, win, sinks, center, cvals)
        if ring_out is not None:
            return [], ring_out
    u = rotate(torch.stack((k, v), dim=1), signs).to(win.dtype)             # [T, 2, Hkv, d], one FWHT for both
    dev = u.device
    enc_rows: list[torch.Tensor] = []
    enc_slots: list[torch.Tensor] = []
    enc_first: list[torch.Tensor] = []                                      # per encoded page: a page 0?
    offs = torch.arange(pt, device=dev)
    spans = []
    for row, n, start, pages, slot in plan.prefill:
        if slot is None:
            raise ValueError("hq-e8-2b: a chunk without a state slot (the exact window lives in the slot)")
        end = start + n
        e0, e1 = fmt.encoded_pages(start), fmt.encoded_pages(end)
        lo = e0 * pt
        sl = torch.tensor([slot], device=dev)
        un = u[row:row + n]
        cv = None
        if center is not None and e1 > 0:
            if e0 == 0:                                                       # page 0 leaves the window now
                page0 = torch.cat((_take_ring(win, sl, torch.arange(0, min(start, pt), device=dev)[None], ring)[0],
                                   un[:max(0, pt - start)]), dim=0)
                center[slot] = _center_mean(page0, n_sinks, pt, cvals, store.center_dims, signs)
                win[slot] = _recenter(win[slot], center[slot])
                if sinks is not None:
                    sinks[slot] = _recenter(sinks[slot], center[slot])
            un = _recenter(un.transpose(0, 1), center[slot]).transpose(0, 1)
            cv = center[slot, 1].clone() if cvals else None
        before = _take_ring(win, sl, torch.arange(lo, start, device=dev)[None], ring)[0]
        full = torch.cat((before, un), dim=0)                                 # positions lo .. end-1
        if e1 > e0:
            enc_rows.append(full[e0 * pt - lo:e1 * pt - lo])
            enc_slots.append((pages[e0:e1].to(dev)[:, None] * pt + offs).reshape(-1))
            enc_first.append(torch.arange(e0, e1, device=dev) == 0)
        w0 = max(start, end - ring)
        win.permute(0, 2, 1, 3, 4)[slot, torch.arange(w0, end, device=dev) % ring] = un[w0 - start:]
        if sinks is not None and start < n_sinks:
            s1 = min(end, n_sinks)
            sinks.permute(0, 2, 1, 3, 4)[slot, start:s1] = un[:s1 - start]
        first = window_start(start, wp, pt)
        part = full[first - lo:].float()
        sk = sinks[slot, :, :min(n_sinks, end)].float() if sinks is not None else u.new_zeros(2, 0, *u.shape[2:])
        spans.append(ExactSpan(part[:, 0], part[:, 1], first, sk[0], sk[1], n_sinks, wp, cv))
    ring_out = None
    if plan.decode_rows is not None:
        if plan.decode_slots is None:
            raise ValueError("hq-e8-2b: decode rows without state slots (the exact window lives in the slot)")
        rows, slots, pos = plan.decode_rows, plan.decode_slots, plan.decode_lens - 1
        ud = u if not plan.prefill else u.index_select(0, rows)              # all decode: rows are 0 .. B-1
        cv = None
        pl, sl_ = pos.tolist(), slots.tolist()                               # decisions on ints (B is small)
        one = len(pl) == 1                                                    # one row: views, no copies
        _decode_events(store, layer, plan, pl, win, sinks, center, cvals, (enc_rows, enc_slots, enc_first))
        if center is not None:
            c0 = (wp + 1) * pt                                                # page 0 leaves the window at c0
            if one:                                                           # Python-int decisions, one op
                on1 = pl[0] >= c0
                if on1:
                    ud = _recenter(ud[:, :, None], center[sl_[0]])[:, :, 0]
                if cvals:
                    cv = center[sl_[0]:sl_[0] + 1, 1] if on1 else torch.zeros_like(center[:1, 1])
            else:
                on = (pos >= c0)[:, None, None, None]
                cen = center[slots]                                           # [B, 2, Hkv, d]
                ud = torch.where(on, _recenter(ud[:, :, None], cen)[:, :, 0], ud)
                cv = torch.where(on[:, 0], cen[:, 1], torch.zeros_like(cen[:, 1])) if cvals else None
        s0 = sl_[0] if one else 0
        if one:
            win[s0, :, pl[0] % ring] = ud[0]
        else:
            win.permute(0, 2, 1, 3, 4)[slots, pos % ring] = ud
        if sinks is not None:
            for i in (i for i, p in enumerate(pl) if p < n_sinks):
                sinks[sl_[i], :, pl[i]] = ud[i]
        sk = (sinks[s0:s0 + 1] if one else sinks[slots]).float() if sinks is not None else \
            u.new_zeros(slots.shape[0], 2, 0, *u.shape[2:])
        w = (win[s0:s0 + 1] if one else win[slots]).float()                 # [B, 2, R, Hkv, d]
        ring_out = ExactRing(w[:, 0], w[:, 1], sk[:, 0], sk[:, 1], wp, cv)
    if enc_rows:
        store.encode_into(layer, torch.cat(enc_slots), torch.cat(enc_rows), torch.cat(enc_first))
    return spans, ring_out

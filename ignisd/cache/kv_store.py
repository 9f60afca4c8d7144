"""KVStore: the KV pool's page storage on the compute device, in one KV format (DESIGN §4.1, §4.6).

Built from a format (cache/kv_format.py) and a KV geometry (a KVGeometry or a ModelSpec, duck-typed: cache/ never
imports model/). One tensor per page buffer of the format, [n_attention_layers, num_pages * page_tokens, *per-token
shape]; slot = page * page_tokens + offset. Which pages belong to whom is the page pool's business
(cache/page_pool.py); this class only stores bytes. The attention layers reach it through the PagedKV protocol of
ignis_kernels.attention (write, view; write_exact for a format with an exact window).

hq-e8-2b (HQ_E8_2B.md): the store also holds each attention layer's rotation signs (kernels/kvq/rotation.py) and
encodes pages as they leave the exact window (`write_exact`; the window itself lives in the sequences' state
slots). "hq-sim" is the same with a research quantizer (tools/bench_kvformat.py) in place of E8P.

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

from collections.abc import Callable

import torch

import ignis_kernels.kvq as kvq
from ignis_kernels.attention import ExactRing, ExactSpan, PagedView, window_start
from ignis_kernels.kvq import page_center, window_cpu
from ignis_kernels.kvq.rotation import layer_signs, rotate, unrotate
from ignisd.cache.kv_format import Geometry, KVFormat, KVGeometry
from ignisd.vocab import PAGE_TOKENS

_WRITE_TAGS = ("dense", "hq-e8-2b", "hq-sim")
"""The view tags this store can write (encode) into."""


class KVStore:
    """Page storage of one KV format.

    fmt: the KVFormat (its tag must be writable here: "dense", "hq-e8-2b", "hq-sim"; ValueError otherwise). geom:
    the model's KV geometry (n_attention_layers, num_kv_heads, head_dim). num_pages: pages in the pool (>= 1).
    page_tokens: tokens per page (>= 1; an exact-window format's own page_tokens). device: torch device.
    quantizer: "hq-sim" only: (u [N, 2, Hkv, d] float32 rotated, the layer's signs [2, Hkv, d]) -> {page buffer
    name: [N, 2, Hkv, ...]} (a research codec, tools/kvq_baselines.py). center_dims: float32 [d] of 0/1, the
    original-domain dims that keep the key centre under centering (the model's RoPE-stable dims,
    ignisd.model.layers.rope_stable_dims; the daemon always passes them); None: every dim. page_center_dims:
    hq-e8-2b, the same for the page key centre (ignis_kernels.kvq.page_center; the daemon passes the dims RoPE
    turns faster, 1 − rope_stable_dims, where the sequence centre is not kept); None: every dim.
    Every buffer is zero-initialised. Raises ValueError on a bad count or a center_dims / page_center_dims of
    another length.
    Attributes: format (the KVFormat), kv_format (its name), geometry (KVGeometry), num_pages, page_tokens,
    n_attention_layers, device, exact_window_pages (None for dense), signs (hq: float32 [L, 2, Hkv, d]).
    """

    def __init__(self, fmt: KVFormat, geom: Geometry, num_pages: int, page_tokens: int = PAGE_TOKENS,
                 device: str | torch.device = "cpu",
                 quantizer: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]] | None = None,
                 center_dims: torch.Tensor | None = None, page_center_dims: torch.Tensor | None = None) -> None:
        if num_pages < 1 or page_tokens < 1:
            raise ValueError(f"KVStore needs num_pages >= 1 and page_tokens >= 1, got {num_pages}, {page_tokens}")
        if fmt.tag not in _WRITE_TAGS:
            raise ValueError(f"KVStore: no writer for KV format {fmt.name!r} (tag {fmt.tag!r}); "
                             f"writable tags: {', '.join(_WRITE_TAGS)}")
        self.exact_window_pages = fmt.exact_window_pages
        if self.exact_window_pages is not None and getattr(fmt, "page_tokens", page_tokens) != page_tokens:
            raise ValueError(f"KVStore: format {fmt.name!r} counts its window in {fmt.page_tokens}-token pages, "
                             f"the pool has {page_tokens}")
        if fmt.tag == "hq-sim" and quantizer is None:
            raise ValueError("KVStore: an hq-sim format needs a quantizer")
        self.format = fmt
        self.kv_format = fmt.name
        self.geometry = KVGeometry.of(geom)
        self.n_attention_layers = self.geometry.n_attention_layers
        self.num_pages = num_pages
        self.page_tokens = page_tokens
        self.device = torch.device(device)
        slots = num_pages * page_tokens
        self._specs = fmt.page_buffers(self.geometry)
        self._buffers: dict[str, torch.Tensor] = {
            b.name: torch.zeros((self.n_attention_layers, slots, *b.shape), dtype=getattr(torch, b.dtype),
                                device=self.device)
            for b in self._specs}
        self.signs = None
        if self.exact_window_pages is not None:
            g = self.geometry
            self.signs = torch.stack([layer_signs(i, g.num_kv_heads, g.head_dim) for i in range(g.n_attention_layers)]
                                     ).to(self.device) if g.n_attention_layers else None
        self.center_dims = self._dims("center_dims", center_dims)
        self.page_center_dims = self._dims("page_center_dims", page_center_dims)   # hq-e8-2b: None = every dim
        self._quantize = quantizer or _e8p_fields
        self._views = [PagedView(fmt.tag, {name: t[layer].view(num_pages, page_tokens, *t.shape[2:])
                                           for name, t in self._buffers.items()}, page_tokens,
                                 {"signs": self.signs[layer],
                                  "variance_correction": fmt.variance_correction}
                                 if self.signs is not None else {})
                       for layer in range(self.n_attention_layers)]
        if fmt.tag == "dense":
            self._k, self._v = self._buffers["k"], self._buffers["v"]

    def _dims(self, name: str, dims: torch.Tensor | None) -> torch.Tensor | None:
        """A dims mask argument (float [d] of 0/1) checked and on the device; None when absent or all ones (every
        dim). Raises ValueError for another length."""
        if dims is None:
            return None
        if tuple(dims.shape) != (self.geometry.head_dim,):
            raise ValueError(f"KVStore: {name} must be [{self.geometry.head_dim}], got {list(dims.shape)}")
        return None if bool((dims == 1).all()) else dims.float().to(self.device)

    @property
    def num_slots(self) -> int:
        """Token slots in the pool (num_pages * page_tokens)."""
        return self.num_pages * self.page_tokens

    @property
    def page_bytes(self) -> int:
        """Bytes of one page across all attention layers and buffers (= format.page_bytes(geometry, page_tokens))."""
        return self.format.page_bytes(self.geometry, self.page_tokens)

    @property
    def nbytes(self) -> int:
        """Bytes held by all buffers (= num_pages * page_bytes)."""
        return sum(t.numel() * t.element_size() for t in self._buffers.values())

    @property
    def buffer_names(self) -> list[str]:
        """The page buffers' names, in the format's order (dense: ["k", "v"])."""
        return [b.name for b in self._specs]

    def buffer(self, name: str) -> torch.Tensor:
        """Page buffer `name` of every layer: [n_attention_layers, num_slots, *per-token shape] in its storage dtype
        (the storage itself, not a copy). Raises KeyError naming the buffers for an unknown name."""
        try:
            return self._buffers[name]
        except KeyError:
            raise KeyError(f"KV buffer {name!r} not in {self.buffer_names}") from None

    def write(self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store keys/values of T tokens of attention layer `layer` (index among the attention layers).

        slot_mapping: LongTensor [T]; k, v: [T, num_kv_heads, head_dim], any float dtype (dense: cast to the storage
        dtype, round-to-nearest for bf16).
        """
        kb, vb = self._k[layer], self._v[layer]
        kb.index_copy_(0, slot_mapping, k if k.dtype == kb.dtype else k.to(kb.dtype))
        vb.index_copy_(0, slot_mapping, v if v.dtype == vb.dtype else v.to(vb.dtype))

    def write_exact(self, layer: int, k: torch.Tensor, v: torch.Tensor, plan, states) -> tuple[list, object]:
        """A format with an exact window: keep the batch's keys/values exact in their sequences' state slots and
        encode the pages that leave the window (cache/exact_window.write_exact, which documents plan, states and the
        returned (ExactSpans, ExactRing)). k, v: [T, Hkv, d] float. Raises ValueError on a dense store."""
        if self.exact_window_pages is None:
            raise ValueError(f"KVStore: format {self.kv_format!r} keeps no exact window; use write()")
        return write_exact(self, layer, k, v, plan, states)

    def encode_into(self, layer: int, slots: torch.Tensor, u: torch.Tensor, first: torch.Tensor | None = None
                    ) -> None:
        """Encode exact rotated tokens into the pool: u [N, 2, Hkv, d] (N tokens, kind 0 keys, 1 values) at pool
        slots `slots` (LongTensor [N]) of attention layer `layer`, every page buffer at once. hq-e8-2b: N is whole
        pages (their slots in position order), each page's keys encoded relative to its key centre, which its
        "center" bytes keep (ignis_kernels.kvq.page_center); first: BoolTensor [N / pt] marking a sequence's page
        0, whose sink positions stay out of its centre (None: no page 0)."""
        u = u.float()
        if self.format.tag == "hq-e8-2b":
            pt = self.page_tokens
            mu = page_center.page_means(u, pt, first, self.format.exact_sinks)                  # [n, Hkv, d]
            if self.page_center_dims is not None:                            # kept on those dims only
                sk = self.signs[layer][0]
                mu = rotate(unrotate(mu, sk) * self.page_center_dims, sk)
            mu = page_center.round_center(mu, pt)
            u = u.clone()
            u[:, 0] -= mu.repeat_interleave(pt, dim=0)
            fields = self._quantize(u, self.signs[layer])
            fields["center"] = page_center.pack(mu, pt)                      # [n, pt, Hkv, 4]
        else:
            fields = self._quantize(u, self.signs[layer])
        for name, t in fields.items():
            buf = self._buffers[name][layer]
            buf.index_copy_(0, slots, t.reshape(u.shape[0], *buf.shape[1:]).to(buf.dtype))

    def view(self, layer: int) -> PagedView:
        """Attention layer `layer`'s pages as the kernels read them: PagedView(tag, {name: [num_pages, page_tokens,
        *per-token shape]}, page_tokens), views of the storage. Raises IndexError for a bad layer."""
        if not 0 <= layer < self.n_attention_layers:
            raise IndexError(f"attention layer {layer} out of range [0, {self.n_attention_layers})")
        return self._views[layer]

    def decode(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hq-e8-2b: the decoded keys and values of pool `slots` (LongTensor [S]) of layer `layer` in the original
        domain, x̂ = s ⊙ H·(ŝ c)/√d (§2.5; tests and debugging only): float32 [S, Hkv, d] each."""
        b = self._buffers
        u = kvq.decode_rotated(b["codes"][layer].index_select(0, slots), b["scale"][layer].index_select(0, slots))
        pt, d = self.page_tokens, self.geometry.head_dim
        block = b["center"][layer].view(self.num_pages, pt, -1, 4).index_select(0, slots // pt)
        u[:, 0] += page_center.unpack(block, d)                                # μ_K of each slot's page
        sg = self.signs[layer]
        return kvq.unrotate(u[:, 0], sg[0]), kvq.unrotate(u[:, 1], sg[1])

    def gather(self, layer: int, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Read K and V of `slots` (LongTensor [S]) of attention layer `layer` (dense formats).

        Returns (k, v), each float32 [S, num_kv_heads, head_dim] (bf16 storage is upcast exactly).
        """
        return self._k[layer].index_select(0, slots).float(), self._v[layer].index_select(0, slots).float()

    def copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Copy whole pages src[i] -> dst[i] of every buffer in every attention layer (copy-on-write of a partial
        last page). Raises ValueError when src and dst differ in length."""
        if len(src) != len(dst):
            raise ValueError("copy_pages: src and dst differ in length")
        if not src:
            return
        pt = self.page_tokens
        offs = torch.arange(pt, device=self.device)
        s = (torch.tensor(src, device=self.device)[:, None] * pt + offs).reshape(-1)
        d = (torch.tensor(dst, device=self.device)[:, None] * pt + offs).reshape(-1)
        for t in self._buffers.values():
            t.index_copy_(1, d, t.index_select(1, s))


def _e8p_fields(u: torch.Tensor, signs: torch.Tensor) -> dict[str, torch.Tensor]:
    """hq-e8-2b's code, scale and resid of rotated vectors u [N, 2, Hkv, d] (ignis_kernels.kvq.encode_rotated; the
    signs are not needed: the record codes the rotated vector; its norm is not stored, see page_center)."""
    codes, scale, resid, _ = kvq.encode_rotated(u)
    return {"codes": codes, "scale": scale, "resid": resid}


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
    if (center is not None and p == c0) or (p % pt == 0 and p // pt - wp - 1 >= 0):
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
        if center is not None:
            c0 = (wp + 1) * pt                                                # page 0 leaves the window at c0
            for i in (i for i, p in enumerate(pl) if p == c0):
                s = sl_[i]
                center[s] = _center_mean(win[s].transpose(0, 1)[:pt], n_sinks, pt, cvals,
                                         store.center_dims, signs)
                win[s] = _recenter(win[s], center[s])
                if sinks is not None:
                    sinks[s] = _recenter(sinks[s], center[s])
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
        sel = [i for i, p in enumerate(pl) if p % pt == 0 and p // pt - wp - 1 >= 0]   # a page leaves the window
        if sel:
            si = torch.tensor(sel, device=dev)
            q = pos[si] // pt - wp - 1
            enc_rows.append(_take_ring(win, slots[si], q[:, None] * pt + offs, ring).reshape(-1, *u.shape[1:]))
            page = plan.decode_pages[si, q]
            enc_slots.append((page[:, None] * pt + offs).reshape(-1))
            enc_first.append(q == 0)
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

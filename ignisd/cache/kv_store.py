"""KVStore: the KV pool's page storage on the compute device, in one KV format (DESIGN §4.1, §4.6).

Built from a format (cache/kv_format.py) and a KV geometry (a KVGeometry or a ModelSpec, duck-typed: cache/ never
imports model/). One tensor per page buffer of the format, [n_attention_layers, num_pages * page_tokens, *per-token
shape]; slot = page * page_tokens + offset. Which pages belong to whom is the page pool's business
(cache/page_pool.py); this class only stores bytes. The attention layers reach it through the PagedKV protocol of
ignis_kernels.attention (write, view; write_exact for a format with an exact window).

hq-e8-2b (HQ_E8_2B.md): the store also holds each attention layer's rotation signs (kernels/kvq/rotation.py) and
encodes pages as they leave the exact window (`write_exact`; the window itself lives in the sequences' state
slots). "hq-sim" is the same with a research quantizer (tools/bench_kvformat.py) in place of E8P.

write_exact, which keeps the exact window and sinks and encodes the pages that leave it, is cache/exact_window.py's.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

import ignis_kernels.kvq as kvq
from ignis_kernels.attention import PagedView
from ignis_kernels.kvq import page_center
from ignis_kernels.kvq.rotation import layer_signs, rotate, unrotate
from ignisd.cache.exact_window import prepare_decode, write_exact
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

    def prepare_decode(self, plan, states) -> None:
        """A format with an exact window, before a decode step that writes and attends outside write_exact (the
        fused CPU step): run the step's window events for every layer (cache/exact_window.prepare_decode). Raises
        ValueError on a dense store."""
        if self.exact_window_pages is None:
            raise ValueError(f"KVStore: format {self.kv_format!r} keeps no exact window")
        prepare_decode(self, plan, states)

    def encode_into(self, layer: int, slots: torch.Tensor, u: torch.Tensor, first: torch.Tensor | None = None
                    ) -> None:
        """Encode exact rotated tokens into the pool: u [N, 2, Hkv, d] (N tokens, kind 0 keys, 1 values) at pool
        slots `slots` (LongTensor [N]) of attention layer `layer`, every page buffer at once. hq-e8-2b: N is whole
        pages (their slots in position order), each page's keys encoded relative to its key centre, which its
        "center" bytes keep (ignis_kernels.kvq.page_center); first: BoolTensor [N / pt] marking a sequence's page
        0, whose sink positions stay out of its centre (None: no page 0)."""
        self.encode_layers([layer], slots, u[None], first)

    def encode_layers(self, layers: list[int], slots: torch.Tensor, u: torch.Tensor,
                      first: torch.Tensor | None = None) -> None:
        """`encode_into` for several attention layers at the same pool slots in one pass of the codec: u [len(layers),
        N, 2, Hkv, d]; layer i's tokens u[i] go to slots `slots` of layers[i]. The same bytes as one encode_into a
        layer (every step of the codec is per vector, or per page for the centre), at the cost of one call: what a
        decode step pays when a page of every layer leaves the window at once."""
        u = u.float()
        n = u.shape[1]
        hq = self.format.tag == "hq-e8-2b"
        if hq and self._quantize is _e8p_fields:                             # E8P reads no signs: one pass
            self._write_fields(layers, slots, self._centred_fields(layers, u, first), n)
            return
        for i, layer in enumerate(layers):                                   # a quantizer reading each layer's signs
            fields = self._centred_fields([layer], u[i:i + 1], first) if hq else self._quantize(u[i], self.signs[layer])
            self._write_fields([layer], slots, fields, n)

    def _centred_fields(self, layers: list[int], u: torch.Tensor, first: torch.Tensor | None) -> dict:
        """hq-e8-2b's page buffer values of u [len(layers), N, 2, Hkv, d] (whole pages): each page's keys relative
        to its key centre, the centre in its "center" bytes -> {name: [len(layers)·N, ...]}."""
        nl, pt = u.shape[0], self.page_tokens
        flat = u.reshape(-1, *u.shape[2:])
        firsts = first.repeat(nl) if first is not None else None
        mu = page_center.page_means(flat, pt, firsts, self.format.exact_sinks)                 # [nl·N/pt, Hkv, d]
        if self.page_center_dims is not None:                                # kept on those dims only
            sk = self.signs[layers][:, 0, None]                              # [nl, 1, Hkv, d]
            mu = mu.view(nl, -1, *mu.shape[1:])
            mu = rotate(unrotate(mu, sk) * self.page_center_dims, sk).reshape(-1, *mu.shape[2:])
        mu = page_center.round_center(mu, pt)
        flat = flat.clone()
        flat[:, 0] -= mu.repeat_interleave(pt, dim=0)
        fields = self._quantize(flat, self.signs[layers[0]])
        fields["center"] = page_center.pack(mu, pt)                          # [nl·N/pt, pt, Hkv, 4]
        return fields

    def _write_fields(self, layers: list[int], slots: torch.Tensor, fields: dict[str, torch.Tensor], n: int) -> None:
        """Each page buffer's values of n tokens a layer (fields: name -> [len(layers)·n, ...]) into `slots` of
        `layers`."""
        rows = (torch.tensor(layers, device=slots.device)[:, None] * self.num_slots + slots).reshape(-1)
        for name, t in fields.items():
            buf = self._buffers[name]
            flat = buf.view(-1, *buf.shape[2:])
            flat.index_copy_(0, rows, t.reshape(rows.shape[0], *buf.shape[2:]).to(buf.dtype))

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

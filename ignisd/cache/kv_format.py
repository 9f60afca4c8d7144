"""KV formats (DESIGN §4.6): a format is the list of page buffers it stores per token and attention layer, plus the
per-sequence state it needs beside the pages. †: imports no torch.

A format is sized against a KV geometry: the number of full-attention layers, KV heads and head dim. `KVGeometry`
holds those three numbers; a ModelSpec has attributes of the same names and may be passed wherever a geometry is
read (duck-typed: cache/ never imports model/).

The dense formats (fp32, bf16) store K and V as they are: page buffers "k" and "v", each [Hkv, d] per token and
layer in the format's dtype, and no per-sequence state. hq-e8-2b (HQ_E8_2B.md, `HQFormat`) stores per token and
layer a 2-bit E8P record per (kind, KV head): "codes" int16 [2, Hkv, d/8], "scale" float32 [2, Hkv], "resid"
float16 [2, Hkv] (index 0 keys, 1 values) and "center" uint8 [Hkv, 4] (the page's key centre, spread over its token
rows in the bytes of the spec's "norm": ignis_kernels.kvq.page_center; 16·d/8 + 8 bytes a head-token, §1.2), and as
per-sequence state
its exact recent window ("kv_window") and exact sinks ("kv_sinks") in the rotated domain (§4.3), and with key (or
key/value) centering on (§4.3 "Key centering"; keys by default) the sequence's centre ("kv_center").

Layout, where it differs from HQ_E8_2B.md §1.3: the spec packs each (layer, page) as one 36,864-byte block of
per-(kind, head) struct-of-arrays sub-blocks; here every field is one pool-wide array [layers, slots, 2, Hkv, ...]
(KVStore's one tensor per page buffer), token-major inside a page. Same bytes per page (a page of a layer is still
64 × 576 B on the target) and every field of a page still starts 128-B aligned; the GPU kernels read a (kind, head)
token row with a stride of 2·Hkv records instead of 1. A persisted cache names the layout with the format's stamp.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ignis_kernels import hq_seed
from ignisd.buffers import BufferSpec, total_bytes


class Geometry(Protocol):
    """Anything with the three KV-geometry attributes (a KVGeometry, a ModelSpec)."""

    n_attention_layers: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class KVGeometry:
    """The shape of a model's KV cache: n_attention_layers (layers that keep K/V), num_kv_heads (Hkv), head_dim (d).
    Raises ValueError for a negative layer count or a head count / dim below 1."""

    n_attention_layers: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        if self.n_attention_layers < 0 or self.num_kv_heads < 1 or self.head_dim < 1:
            raise ValueError(f"KV geometry needs n_attention_layers >= 0, num_kv_heads >= 1 and head_dim >= 1, got "
                             f"{self.n_attention_layers}, {self.num_kv_heads}, {self.head_dim}")

    @classmethod
    def of(cls, geom: Geometry) -> "KVGeometry":
        """The geometry of `geom` (a KVGeometry or anything with the same attributes, e.g. a ModelSpec)."""
        return cls(int(geom.n_attention_layers), int(geom.num_kv_heads), int(geom.head_dim))


@dataclass(frozen=True)
class KVFormat:
    """One KV storage format.

    name: the config / wire literal ("fp32", "bf16"). tag: the attention dispatch tag of its pages
    (ignis_kernels.attention.PagedView.tag; "dense" for fp32 and bf16). dtype: the storage dtype of the dense K and
    V buffers (a torch dtype name: "float32", "bfloat16").
    """

    name: str
    tag: str
    dtype: str

    def page_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """The buffers of one token of one attention layer in a page: dense [BufferSpec("k", (Hkv, d), dtype),
        BufferSpec("v", (Hkv, d), dtype)]. A page of one layer holds page_tokens of each."""
        shape = (int(geom.num_kv_heads), int(geom.head_dim))
        return [BufferSpec("k", shape, self.dtype), BufferSpec("v", shape, self.dtype)]

    def seq_state_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """The per-sequence state this format keeps beside the pages (one instance per state slot): [] for the dense
        formats (hq-e8-2b: its exact window and sinks)."""
        return []

    def bytes_per_token(self, geom: Geometry) -> int:
        """Bytes one token occupies in the pages across all attention layers: n_attention_layers × Σ page buffer
        bytes (dense: 2 · L · Hkv · d · element size)."""
        return int(geom.n_attention_layers) * total_bytes(self.page_buffers(geom))

    def page_bytes(self, geom: Geometry, page_tokens: int) -> int:
        """Bytes of one page of `page_tokens` tokens across all attention layers."""
        return page_tokens * self.bytes_per_token(geom)

    @property
    def exact_window_pages(self) -> int | None:
        """Pages kept exact before the current one (hq-e8-2b's Wp), or None for a format without an exact window."""
        return None

    def retained_pages(self, pos: int, page_tokens: int) -> tuple[int, bool]:
        """What a retained state captured at `pos` tokens holds in the pool: (n, copy) = its first n pages shared in
        place, and whether it also takes a private copy of the partial page at pos. Dense: (pos // pt, pos % pt != 0).
        A resumed request shares the same n pages."""
        return pos // page_tokens, pos % page_tokens != 0

    @property
    def stamp(self) -> str:
        """The format's identity in retained-state stamps and persisted caches (DESIGN §4.4): the name for dense."""
        return self.name


CENTERING = ("", "k", "kv")
"""HQFormat.centering's values: off, keys, keys and values (the default)."""

HQ_DEFAULT_WINDOW = 128
"""kv.exact_window's default (tokens): the current page plus the two before it stay exact (HQ_E8_2B.md §4.3)."""

HQ_DEFAULT_VARIANCE_CORRECTION = 0.6
"""The strength α of hq-e8-2b's logit-variance correction (HQFormat.variance_correction; HQ_E8_2B.md §4.1 has 1). A
format parameter, not a configuration key (DESIGN §6 has none): tools/bench_kvformat.py measures others."""


@dataclass(frozen=True)
class HQFormat(KVFormat):
    """hq-e8-2b (HQ_E8_2B.md): 2-bit E8P pages read directly by attention, with an exact window and sinks.

    exact_window: tokens kept exact besides the current page, page-granular: Wp = ceil(exact_window / pt) whole
    pages before the current one (so between Wp·pt + 1 and (Wp + 1)·pt recent tokens are exact). exact_sinks: the
    first S positions, kept exact for the whole sequence. exact_dtype: the window's storage dtype (float32 on the
    CPU, where activations are fp32; bfloat16 on CUDA, §4.3). page_tokens: tokens per page (the window's unit).
    centering (§4.3): "kv" (the default), "k" or "" (off). Once page 0 leaves the window, the mean μ of its rotated
    keys and values (under "k" keys only) at positions [S, pt) (all of page 0 when S >= pt) is the sequence's centre;
    from then on every stored key and value — encoded pages, the window and the sinks — is x − μ. The key centre
    is kept only on the dims where RoPE turns it by at most π/3 over the model's context (KVStore.center_dims,
    ignisd.model.layers.rope_stable_dims: on SmolLM2 14 of 64 dims, on Qwen3.5 the 192 unrotated dims and 14 of the
    64 rotated ones): elsewhere the mean of post-RoPE keys turns with the position, and a centre from page 0
    added error to every key far from it. Keys need nothing back (q·μ_K is the same for every key of a query, and
    softmax ignores it); attention adds μ_V back to its output. Measured (tools/bench_kvformat.py, SmolLM2, W:S
    128:1, KL / top-1 against the fp32 cache at 1K, 4K): "kv" 0.0192 / 0.939, 0.0453 / 0.902; "k" 0.0156 / 0.942,
    0.0388 / 0.909; uncentred 0.0205 / 0.924, 0.0531 / 0.881; the centre on every dim ("k") 0.0210 / 0.927,
    0.0453 / 0.889. "kv" is the default for retrieval: passkey probes (trials of tools/kvformat_passkey.py) found
    4/4 at 50 % depth of 8K under "kv" against 0/4 under "k"; the full check (20 trials at 10 / 50 / 90 % depth)
    found 20 / 19 / 16 at 4K and 19 / 16 / 20 at 8K, against 17 / 19 / 19 and 20 / 16 / 7 with the centre on every
    key dim (fp32: 20 / 20 / 20 and 19 / 20 / 20). On the other key dims every encoded page keeps its own key
    centre (ignis_kernels.kvq.page_center, whatever the centering): with it, at variance_correction 1, KL / top-1
    at 1K, 4K, 8K are 0.0181 / 0.932, 0.0292 / 0.913, 0.0400 / 0.901 and the passkey check finds 18 / 20 / 19 at 4K
    and 19 / 18 / 16 at 8K (110 of 120, as without it). True / False are read as "kv" / "".
    variance_correction: the strength α of the logit-variance correction of compressed keys (HQ_E8_2B.md §4.1),
    z_t = τŝ_t(q̃·c_t) − α·½τ²‖q‖²resid_t²/d; it changes no stored byte. α = 1, the spec's, makes each weight's mean
    exact (E[e^(z+ε)] = e^(z+σ²/2)), which is right for the mass of many keys but lowers the median weight of one
    key that stands out (a needle) by e^(−σ²/2); α = 0 leaves the median right and lets noisy keys gain mass. Measured
    (tools/bench_kvformat.py, SmolLM2, W:S 128:1): KL / top-1 at 1K for α 1, 0.75, 0.6, 0.5, 0: 0.0181 / 0.932,
    0.0190 / 0.932, 0.0199 / 0.928, 0.0204 / 0.9199, 0.0258 / 0.910; passkey at 90 % depth of 8K 16, 18, 20 of 20 for
    α 1, 0.5, 0 (fp32 20). The default, 0.6, is the weakest that keeps issue 10's 1K aim (top-1 >= 0.92; 0.5 misses
    it by one token in 1,024): KL / top-1 at 1K, 2K, 4K, 8K 0.0199 / 0.928, 0.0239 / 0.916, 0.0324 / 0.907, 0.0416 /
    0.897; passkey 4K 19 / 20 / 20, 8K 19 / 19 / 18 (115 of 120; fp32 119). Raises ValueError for a negative window or
    sink count, another centering or a variance_correction outside [0, 1].
    """

    exact_window: int = HQ_DEFAULT_WINDOW
    exact_sinks: int = 1
    exact_dtype: str = "float32"
    page_tokens: int = 64
    centering: str = "kv"
    variance_correction: float = HQ_DEFAULT_VARIANCE_CORRECTION

    def __post_init__(self) -> None:
        if self.exact_window < 0 or self.exact_sinks < 0 or self.page_tokens < 1:
            raise ValueError(f"hq-e8-2b: exact_window {self.exact_window} and exact_sinks {self.exact_sinks} must be "
                             f">= 0")
        vc = self.variance_correction
        if isinstance(vc, bool) or not isinstance(vc, (int, float)) or not 0.0 <= vc <= 1.0:
            raise ValueError(f"hq-e8-2b: variance_correction {vc!r} must be a number from 0 to 1")
        object.__setattr__(self, "variance_correction", float(vc))
        if isinstance(self.centering, bool):
            object.__setattr__(self, "centering", "kv" if self.centering else "")
        if self.centering not in CENTERING:
            raise ValueError(f"hq-e8-2b: centering {self.centering!r}; allowed: {', '.join(map(repr, CENTERING))}")

    @property
    def centers_values(self) -> bool:
        """Whether the values are centred too (centering "kv"): attention then adds μ_V back."""
        return self.centering == "kv"

    @property
    def exact_window_pages(self) -> int:
        """Wp = ceil(exact_window / page_tokens)."""
        return math.ceil(self.exact_window / self.page_tokens)

    @property
    def ring_tokens(self) -> int:
        """R = (Wp + 1) · page_tokens: the per-layer ring of exact tokens in a state slot."""
        return (self.exact_window_pages + 1) * self.page_tokens

    def page_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """Per token and layer: codes int16 [2, Hkv, d/8], scale float32 [2, Hkv], resid float16 [2, Hkv] (HQ_E8_2B.md
        §1.2; kind 0 keys, 1 values) and center uint8 [Hkv, 4]: the page key centre (ignis_kernels.kvq.page_center)
        in the 4 bytes a head-token of the spec's key and value "norm" (derivable, never read: N² = ŝ²‖c‖² − R²).
        Raises ValueError unless d is a power of two >= 8 and at most 4·page_tokens (the centre's d values fit in a
        page's 4·pt bytes a head)."""
        h, d = int(geom.num_kv_heads), int(geom.head_dim)
        if d < 8 or d & (d - 1):
            raise ValueError(f"hq-e8-2b needs a power-of-two head_dim >= 8, got {d}")
        if d > 4 * self.page_tokens:
            raise ValueError(f"hq-e8-2b: head_dim {d} needs pages of at least {d // 4} tokens for the page key "
                             f"centre, got {self.page_tokens}")
        return [BufferSpec("codes", (2, h, d // 8), "int16"), BufferSpec("scale", (2, h), "float32"),
                BufferSpec("resid", (2, h), "float16"), BufferSpec("center", (h, 4), "uint8")]

    def seq_state_buffers(self, geom: Geometry) -> list[BufferSpec]:
        """Per state slot: "kv_window" [L, 2, R, Hkv, d] (ring, slot = position % R) and, when exact_sinks > 0,
        "kv_sinks" [L, 2, S, Hkv, d], both rotated, in exact_dtype; with centering, "kv_center" [L, 2, Hkv, d]
        float32 (the rotated μ_K, μ_V; zero until page 0 leaves the window, μ_V zero unless centering is "kv")."""
        n, h, d = int(geom.n_attention_layers), int(geom.num_kv_heads), int(geom.head_dim)
        out = [BufferSpec("kv_window", (n, 2, self.ring_tokens, h, d), self.exact_dtype)]
        if self.exact_sinks:
            out.append(BufferSpec("kv_sinks", (n, 2, self.exact_sinks, h, d), self.exact_dtype))
        if self.centering:
            out.append(BufferSpec("kv_center", (n, 2, h, d), "float32"))
        return out

    def encoded_pages(self, ctx: int) -> int:
        """Pages [0, n) encoded once positions 0 .. ctx−1 are written: max(0, (ctx − 1) // pt − Wp); 0 for ctx 0
        (the window rule of ignis_kernels.attention.exact)."""
        return 0 if ctx <= 0 else max(0, (ctx - 1) // self.page_tokens - self.exact_window_pages)

    def retained_pages(self, pos: int, page_tokens: int) -> tuple[int, bool]:
        """(encoded_pages(pos), False): a retained state holds only pages already encoded; the window and its
        partial page travel in its image (DESIGN §4.6), so no page is copied and a resumed request encodes the
        rest into its own pages."""
        if page_tokens != self.page_tokens:
            raise ValueError(f"hq-e8-2b built for {self.page_tokens}-token pages, asked about {page_tokens}")
        return self.encoded_pages(pos), False

    @property
    def stamp(self) -> str:
        """name/w<Wp pages>/s<sinks>[/ckr | /cr]/pc/<exact dtype>/seed<FORMAT_SEED hex> ("/ckr": key centering,
        "/cr": key/value centering, the key centre on the RoPE-stable dims; "/ck" and "/c" were the centre on every
        dim; "/pc": pages carry their key centre, ignis_kernels.kvq.page_center, where earlier pages carried the
        norm): two daemons with another window, sink count, centering, page layout or seed keep incompatible images
        and pages."""
        c = {"": "", "k": "/ckr", "kv": "/cr"}[self.centering]
        return (f"{self.name}/w{self.exact_window_pages}/s{self.exact_sinks}{c}/pc/{self.exact_dtype}"
                f"/{hq_seed.stamp_part()}")


KV_FORMATS: dict[str, KVFormat] = {
    "fp32": KVFormat("fp32", "dense", "float32"),
    "bf16": KVFormat("bf16", "dense", "bfloat16"),
    "hq-e8-2b": HQFormat("hq-e8-2b", "hq-e8-2b", "float32"),
}
"""The formats this build stores, by name (hq-e8-2b with its default window and sinks; see get_kv_format)."""


def get_kv_format(name: str, exact_window: int | None = None, exact_sinks: int | None = None,
                  centering: str | bool | None = None, variance_correction: float | None = None) -> KVFormat:
    """Return the KVFormat called `name`; for hq-e8-2b with kv.exact_window (None: HQ_DEFAULT_WINDOW), kv.exact_sinks,
    centering (HQFormat.centering) and variance_correction (HQFormat.variance_correction) applied (None: the
    format's defaults); the dense formats ignore them. Raises ValueError naming the allowed formats when `name` is
    unknown, or for a negative window / sink count, another centering or a variance_correction outside [0, 1]."""
    try:
        fmt = KV_FORMATS[name]
    except KeyError:
        raise ValueError(f"kv_format {name!r} is not supported; allowed: {', '.join(KV_FORMATS)}") from None
    if isinstance(fmt, HQFormat):
        fmt = HQFormat(fmt.name, fmt.tag, fmt.dtype,
                       exact_window=HQ_DEFAULT_WINDOW if exact_window is None else exact_window,
                       exact_sinks=fmt.exact_sinks if exact_sinks is None else exact_sinks,
                       centering=fmt.centering if centering is None else centering,
                       variance_correction=(fmt.variance_correction if variance_correction is None
                                            else variance_correction))
    return fmt

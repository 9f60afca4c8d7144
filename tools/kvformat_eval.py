"""Teacher-forced quality of a KV format on a real model (HQ_E8_2B.md §5.4), shared by tools/bench_kvformat.py and
the CI-proxy test (tests/model/test_hq_quality.py).

Protocol: the text's token ids are prefilled in chunks through ignis's own paged forward and KV store in the format
under test, with logits for every position; the window rule of the exact window is positional, so a chunked
prefill reads every key exactly as a token-by-token decode would (compressed once outside the window). Each
position's next-token distribution is compared with the fp32 cache's: KL(p_fp32 ‖ p_fmt) in nats and top-1
agreement, overall and by context-position bucket.

Variants: "fp32", "bf16", "hq-e8-2b" (the real format), and the research baselines of kvq_baselines ("lloyd2",
"q4_0", "q8_0") under the same window, sinks, centering and variance correction (by default hq-e8-2b's). A suffix
sets the centering (HQFormat.centering, HQ_E8_2B.md §4.3): "+c" keys and values ("hq-e8-2b+c", "lloyd2+c"), "+ck"
keys, "+c0" none; a last "@vc<α>" the variance correction's strength (HQFormat.variance_correction): "hq-e8-2b@vc1"
(the spec's), "lloyd2+c0@vc0".
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from ignis_kernels import hq_seed
from ignisd.cache.kv_format import get_kv_format
from ignisd.cache.kv_store import KVStore
from ignisd.cache.state_store import StateStore
from ignisd.model.batch import ForwardBatch, SeqChunk
from ignisd.model.layers import rope_stable_dims
from kvq_baselines import QUANTIZERS, sim_format

LICENSES = Path("/usr/share/common-licenses")
BUCKETS = (0, 256, 1024, 2048, 4096, 8192, 1 << 30)


def parse_format_seed(text: str) -> int:
    """The rotation seed of a `--format-seed` flag: hexadecimal, "0x" optional, 0 to 2^64 - 1 (HQ_E8_2B.md §2.1).
    Raises ValueError naming the flag and the limit."""
    try:
        seed = int(text, 16)                      # int() itself takes the "0x", either case and outer blanks
    except ValueError:
        raise ValueError(f"--format-seed: a hexadecimal number, got {text!r}") from None
    if not 0 <= seed < 1 << 64:
        raise ValueError(f"--format-seed: must be below 2^64 (16 hex digits), got {text!r}")
    return seed


@contextmanager
def format_seed(seed: int | None) -> Iterator[int]:
    """Research only: within the block, KV stores built with hq-e8-2b draw their sign vectors (§2.1) from `seed`
    instead of the format's FORMAT_SEED; None keeps the format's. Yields the seed in effect and restores the format's
    on exit. A cache built inside the block carries the seed in its stamp (hq_seed.stamp_part), so a daemon of the
    format's seed refuses it."""
    saved = hq_seed.FORMAT_SEED
    if seed is not None:
        hq_seed.FORMAT_SEED = seed
    try:
        yield hq_seed.FORMAT_SEED
    finally:
        hq_seed.FORMAT_SEED = saved


def license_text(tokens_wanted: int, tokenizer) -> list[int]:
    """Token ids of real prose: GPL-3, then GPL-2, LGPL-2.1 and Apache-2.0 joined (Debian's common-licenses) until
    `tokens_wanted` ids. Raises FileNotFoundError when the texts are missing or too short."""
    ids: list[int] = []
    for name in ("GPL-3", "GPL-2", "LGPL-2.1", "Apache-2.0", "MPL-2.0", "GFDL-1.3"):
        p = LICENSES / name
        if p.exists():
            ids += tokenizer.encode(p.read_text() + "\n\n")
        if len(ids) >= tokens_wanted:
            return ids[:tokens_wanted]
    raise FileNotFoundError(f"{LICENSES}: only {len(ids)} tokens of licence text, {tokens_wanted} wanted")


def make_store(spec, variant: str, tokens: int, exact_window: int = 64, exact_sinks: int = 1):
    """(KVStore, StateStore or None) for one sequence of up to `tokens` tokens in `variant` (a name of the module
    docstring; a suffix sets the centering (HQFormat.centering): "+c" keys and values, "+ck" keys, "+c0" none; without
    one, hq-e8-2b's default; then "@vc<α>" the variance correction's strength). Raises ValueError for an unknown
    name or a bad α."""
    pages = -(-tokens // 64) + 1
    base, vc = variant, None
    if "@vc" in variant:
        base, _, a = variant.rpartition("@vc")
        try:
            vc = float(a)
        except ValueError:
            raise ValueError(f"variant {variant!r}: @vc needs a number from 0 to 1, got {a!r}") from None
    centering = None
    for suffix, mode in (("+ck", "k"), ("+c0", ""), ("+c", "kv")):
        if base.endswith(suffix):
            base, centering = base[:-len(suffix)], mode
            break
    if base in QUANTIZERS:
        fmt = sim_format(base, exact_window, exact_sinks, centering, vc)
        kv = KVStore(fmt, spec, pages, quantizer=QUANTIZERS[base], center_dims=rope_stable_dims(spec))
    else:
        fmt = get_kv_format(base, exact_window, exact_sinks, centering, vc)
        stable = rope_stable_dims(spec)
        kv = KVStore(fmt, spec, pages, center_dims=stable, page_center_dims=1 - stable)
    buffers = spec.state_buffers() + fmt.seq_state_buffers(spec)      # a hybrid's GDN state + the window
    return kv, (StateStore(buffers, 1) if buffers else None)


@torch.inference_mode()
def teacher_forced_logits(model, ids: list[int], kv, states, chunk: int = 256) -> torch.Tensor:
    """float32 logits [len(ids), vocab]: row i predicts ids[i + 1], prefilled in chunks of `chunk` tokens."""
    pages = list(range(kv.num_pages))
    slot = 0 if states is not None else None
    if states is not None:
        states.zero(0)
    out = []
    for s in range(0, len(ids), chunk):
        part = ids[s:s + chunk]
        batch = ForwardBatch.build([SeqChunk(part, s, pages, "all", slot)], kv.page_tokens)
        out.append(model.forward(batch, kv, states))
    return torch.cat(out)


def _kl_rows(ref: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """KL(softmax ref ‖ softmax got) per row in float64 (rows [m, vocab] -> [m]); compare() feeds it 256 rows at a
    time so an 8K × 49K vocabulary never exists in float64."""
    lp, lq = ref.double().log_softmax(-1), got.double().log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)


def compare(ref: torch.Tensor, got: torch.Tensor) -> dict:
    """KL(p_ref ‖ p_got) and top-1 agreement per position, with their means overall and per BUCKETS range.
    ref, got: logits [T, vocab]. Returns {"kl", "top1", "buckets": [(lo, hi, kl, top1, n)], "kl_pos", "top1_pos"}."""
    kl = torch.cat([_kl_rows(ref[i:i + 256], got[i:i + 256]) for i in range(0, ref.shape[0], 256)])
    agree = (ref.argmax(-1) == got.argmax(-1)).double()
    rows = []
    for lo, hi in zip(BUCKETS, BUCKETS[1:]):
        if lo >= kl.shape[0]:
            break
        sel = slice(lo, min(hi, kl.shape[0]))
        rows.append((lo, min(hi, kl.shape[0]), float(kl[sel].mean()), float(agree[sel].mean()),
                     kl[sel].numel()))
    return {"kl": float(kl.mean()), "top1": float(agree.mean()), "buckets": rows, "kl_pos": kl, "top1_pos": agree}


def evaluate(model, spec, ids: list[int], variants: list[str], exact_window: int = 64, exact_sinks: int = 1,
             chunk: int = 256, ref: torch.Tensor | None = None) -> tuple[torch.Tensor, dict]:
    """fp32 reference logits (or `ref`) and compare() of every variant: (ref, {variant: result})."""
    if ref is None:
        kv, st = make_store(spec, "fp32", len(ids))
        ref = teacher_forced_logits(model, ids, kv, st, chunk)
    out = {}
    for v in variants:
        kv, st = make_store(spec, v, len(ids), exact_window, exact_sinks)
        out[v] = compare(ref, teacher_forced_logits(model, ids, kv, st, chunk))
    return ref, out

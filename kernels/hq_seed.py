"""The hq-e8-2b format's seed (HQ_E8_2B.md §2.1), in a module that imports no torch: the sign vectors of the
rotation (ignis_kernels.kvq.rotation) and the cache stamp (ignisd.cache.kv_format, †: torch-free) both read
`FORMAT_SEED` here, at call time, so there is one place that names it.

Two caches built under two seeds are incompatible: the stamp that persisted and transferred state carries spells the
seed as 16 hex digits (`stamp_part`).
"""
from __future__ import annotations

SHIPPED_SEED = 0x6871653832620001
"""The format's seed as §2.1 fixes it: a 64-bit unsigned integer."""
FORMAT_SEED = SHIPPED_SEED
"""The seed in effect: the splitmix64 seed of the sign vectors. Only research tools change it
(tools/kvformat_eval.format_seed), for a run and back; the stamp then names the seed in effect."""


def stamp_part() -> str:
    """"seed" + the seed in effect as 16 lower-case hex digits, e.g. "seed6871653832620001" (the last part of an
    hq-e8-2b stamp)."""
    return f"seed{FORMAT_SEED:016x}"

"""What an admission answers (DESIGN §4.1): the reuse match its lookup found and the pages, slot and restore it
reserved. Plain records the cache manager (``cache/manager.py``) returns and the scheduler reads; they are reached
through the manager's module (``ignisd.cache.manager.Admission`` / ``ReuseMatch``). †: imports no torch.
"""
from __future__ import annotations

from dataclasses import dataclass

from ignisd.cache.retained_state import LookupResult
from ignisd.plan import RestoreOp


@dataclass(frozen=True)
class ReuseMatch:
    """What an admission's lookup found (plain data for ``ignis.reuse``).

    state_id / kind / tier / tokens: the matched retained state and the prompt tokens it restores (None / 0 on a
    miss). reason: None on a hit, "miss" or "stamp_mismatch". candidate_*: the diverging state that shares the most
    with the prompt (its tokens, kind, tier and the common-prefix length), or None.
    """

    state_id: str | None
    kind: str | None
    tier: str | None
    tokens: int
    reason: str | None
    candidate_tokens: tuple[int, ...] | None = None
    candidate_kind: str | None = None
    candidate_tier: str | None = None
    candidate_common: int = 0

    @classmethod
    def of(cls, lk: LookupResult) -> "ReuseMatch":
        """From the store's LookupResult."""
        cand = lk.candidate_state
        extra = {}
        if cand is not None:
            extra = dict(candidate_tokens=tuple(cand.tokens), candidate_kind=cand.kind, candidate_tier=cand.tier,
                         candidate_common=lk.candidate.common_tokens)
        s = lk.state
        return cls(s.id if s else None, s.kind if s else None, s.tier if s else None,
                   lk.matched_tokens if s else 0, lk.reason, **extra)


@dataclass(frozen=True)
class Admission:
    """The answer of ``admit``: pages (the whole bound, position order; the first ``resumed // page_tokens`` shared
    with the matched state), slot (live state slot or None), resumed (prompt tokens restored), match (None when the
    request looked nothing up), restore (the op the next round runs first, None on a miss). wait_for: the KV-disk
    state whose bytes are being read for this request (then nothing was reserved: try again after the read)."""

    pages: tuple[int, ...]
    slot: int | None
    resumed: int
    match: ReuseMatch | None
    restore: RestoreOp | None
    wait_for: str | None = None
